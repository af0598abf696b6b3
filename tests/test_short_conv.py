"""The short convolution before attention (after_t2r.py; MQAR's Zoology baselines): its recurrent step against its
parallel form, in float64, alone and in a model, converted to T2R too."""

import pytest
import torch

from after_t2r import ConvConfig, ConvLM, ShortConv
from conftest import report
from support.configs import build_model
from t2r import convert


def random_conv(kernel: int):
    """A convolution of 6 channels off its initialisation (the identity), its input (2, 9, 6), its empty state."""
    torch.manual_seed(0)
    conv = ShortConv(6, kernel).double()
    torch.nn.init.normal_(conv.weight)
    torch.nn.init.normal_(conv.bias)
    return conv, torch.randn(2, 9, 6, dtype=torch.float64), conv.init_state(2, "cpu", torch.float64)


@pytest.mark.parametrize("kernel", [1, 2, 3, 5])
def test_the_short_convolution_s_step_equals_its_parallel_form(kernel):
    conv, x, last = random_conv(kernel)
    stepped = torch.stack([conv.step(x[:, t], last) for t in range(9)], 1)
    assert last.shape == (2, kernel - 1, 6)  # the last K - 1 inputs, whatever the length
    assert report(f"K={kernel}: step - parallel", (stepped - conv(x)).abs().max().item()) < 1e-12


@pytest.mark.parametrize("kernel", [1, 2, 3, 5])
def test_the_short_convolution_s_prefill_in_pieces_equals_its_parallel_form(kernel):
    """Pieces of 1, 3 and 5 positions: each reads the last K - 1 inputs the one before left (fewer than K - 1 at
    first: zeros, as the parallel form pads)."""
    conv, x, last = random_conv(kernel)
    pieces = torch.cat([conv.prefill(x[:, a:b], last) for a, b in ((0, 1), (1, 4), (4, 9))], 1)
    assert torch.equal(last, x[:, 9 - (kernel - 1):]) if kernel > 1 else last.shape == (2, 0, 6)
    assert report(f"K={kernel}: prefill in pieces - parallel", (pieces - conv(x)).abs().max().item()) < 1e-12


def test_a_causal_convolution_does_not_see_the_future():
    conv = ShortConv(4, 3).double()
    torch.nn.init.normal_(conv.weight)
    x = torch.randn(1, 8, 4, dtype=torch.float64)
    changed = x.clone()
    changed[:, 5:] += 1.0
    assert torch.equal(conv(x)[:, :5], conv(changed)[:, :5]) and not torch.equal(conv(x)[:, 5:], conv(changed)[:, 5:])


def tiny(attn="softmax"):
    torch.manual_seed(0)
    model = ConvLM(ConvConfig(vocab_size=30, n_layer=2, n_head=2, d_model=16, d_ff=32, attn=attn, feature_size=8,
                              dropout=0.0)).double().eval()
    for conv in (m for m in model.modules() if isinstance(m, ShortConv)):
        torch.nn.init.normal_(conv.weight, std=0.5)  # not the identity it starts as
    return model


@pytest.mark.parametrize("converted", [False, True])
def test_a_conv_model_generates_with_its_recurrent_step_as_it_runs_in_parallel(converted):
    model = convert(tiny(), "t2r", feature_size=8).double().eval() if converted else tiny()
    assert type(model) is ConvLM  # convert keeps the teacher's class, its convolutions copied
    tokens = torch.randint(0, 30, (2, 12))
    state, logits = model.init_state(2), []
    for t in range(12):
        out, state = model.step(tokens[:, t], state)
        logits.append(out)
    diff = (torch.stack(logits, 1) - model(tokens)).abs().max().item()
    assert report(f"{'T2R' if converted else 'softmax'} with short convolutions: step - parallel", diff) < 1e-10


def test_a_saved_conv_config_builds_the_conv_model():
    model = tiny()
    rebuilt = build_model(model.config.to_dict())
    assert type(rebuilt) is ConvLM and rebuilt.config.short_conv == 3
    rebuilt.load_state_dict(model.state_dict())  # the same tensors, the convolutions included
