"""Tests of the sliding-window hybrid (softmax over the last W tokens, linear attention before them): the
linear-memory form against the quadratic reference, the recurrent step against both, the limits W >= T
(softmax, against scaled_dot_product_attention) and W = 0 (plain linear attention), in float64 with gradients.

    python -m pytest -q -s tests/test_window.py
"""

import pytest
import torch
import torch.nn.functional as F

import after_t2r
import t2r
from conftest import lm_config, make, mt_config, report, step_all
from layers.states import state_bytes
from support.inference import is_folded
from t2r import Seq2SeqTransformer, TransformerLM


def is_new(name: str) -> bool:  # what a conversion adds: feature maps, window gates
    return ".feature_map." in name or name.endswith(".window_gate")


T = 11  # not a multiple of the chunk sizes below


def inputs(seed=0, B=2, H=3, d=4, features=5):
    """q, k, phi(q), phi(k), v, g: float64 leaves that record gradients."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, d, generator=g, dtype=torch.float64) for _ in range(3))
    fq, fk = (torch.rand(B, H, T, features, generator=g, dtype=torch.float64) for _ in range(2))
    gate = torch.rand(H, generator=g, dtype=torch.float64) + 0.5
    return [t.requires_grad_() for t in (q, k, fq, fk, v, gate)]


def outputs_and_grads(fn, tensors):
    out = fn(*tensors)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=out.dtype)
    grads = torch.autograd.grad((out * weight).sum(), tensors, allow_unused=True)  # W = 0 never uses q, k, g
    return out, [torch.zeros_like(t) if g is None else g for t, g in zip(tensors, grads)]


@pytest.mark.parametrize("chunk_size", [4, 5, 16])
@pytest.mark.parametrize("window", [0, 1, 3, T - 1, T, T + 3])
def test_chunked_equals_quadratic_with_gradients(window, chunk_size):
    x = inputs()
    ref, ref_grads = outputs_and_grads(lambda q, k, fq, fk, v, g: after_t2r.window_attention_quadratic(
        q, k, fq, fk, v, window, g), x)
    out, grads = outputs_and_grads(lambda q, k, fq, fk, v, g: after_t2r.window_attention_chunked(
        q, k, fq, fk, v, window, g, chunk_size), x)
    assert report(f"W={window} C={chunk_size}: chunked vs quadratic", (out - ref).abs().max()) < 1e-12
    diff = max((a - b).abs().max() for a, b in zip(grads, ref_grads))
    assert report(f"W={window} C={chunk_size}: gradients", diff) < 1e-12


@pytest.mark.parametrize("window", [T, T + 3])
def test_a_window_as_long_as_the_text_is_softmax(window):
    q, k, fq, fk, v, gate = inputs()
    out = after_t2r.window_attention_quadratic(q, k, fq, fk, v, window, gate)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert report(f"W={window} vs scaled_dot_product_attention", (out - sdpa).abs().max()) < 1e-12


def test_no_window_is_linear_attention():
    q, k, fq, fk, v, gate = inputs()
    out = after_t2r.window_attention_quadratic(q, k, fq, fk, v, 0, gate)
    linear = t2r.linear_attention_quadratic(fq, fk, v, causal=True)
    assert report("W=0 vs linear attention", (out - linear).abs().max()) == 0


@pytest.mark.parametrize("window", [1, 3, T + 2])
def test_step_equals_the_quadratic_form(window):
    q, k, _, _, v, gate = (t.detach() for t in inputs())
    W_phi = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)

    def phi(*xs):  # a feature map, as the modules call it: (B, H, T, d) -> (B, H, T, k)
        return tuple(F.relu(torch.einsum("bhtd,hkd->bhtk", x, W_phi)) for x in xs)
    fq, fk = phi(q, k)
    ref = after_t2r.window_attention_quadratic(q, k, fq, fk, v, window, gate)
    B, H, _, d = v.shape
    state = {"S": torch.zeros(B, H, 5, d, dtype=torch.float64), "z": torch.zeros(B, H, 5, dtype=torch.float64),
             "k": torch.zeros(B, H, window, d, dtype=torch.float64),
             "v": torch.zeros(B, H, window, d, dtype=torch.float64), "length": 0}
    steps = [after_t2r.window_attention_step(q[:, :, i], k[:, :, i], fq[:, :, i], v[:, :, i], state, window, gate, phi)
             for i in range(T)]
    assert report(f"W={window}: step vs quadratic", (torch.stack(steps, 2) - ref).abs().max()) < 1e-12


# -----------------------------------------------------------------------------
# Window models: recurrent == parallel, conversion, folding, state size

@pytest.mark.parametrize("chunk_size", [0, 4])
@pytest.mark.parametrize("window", [1, 3, 7])
@pytest.mark.parametrize("kind", ["t2r", "elu", "rfa"])
def test_lm_recurrent_equals_parallel(kind, window, chunk_size):
    model = make(TransformerLM, lm_config(kind, window=window, chunk_size=chunk_size))
    with torch.no_grad():
        for layer in model.layers:
            layer.self_attn.window_gate.normal_()  # g away from 1
    tokens = torch.randint(0, 37, (3, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        parallel = model(tokens)
    recurrent = step_all(model, model.init_state(3), tokens)
    assert report(f"{kind} W={window} C={chunk_size}: recurrent vs parallel", (recurrent - parallel).abs().max()) < 1e-9


def test_seq2seq_decoder_with_a_window_recurrent_equals_parallel():
    model = make(Seq2SeqTransformer, mt_config("t2r", window=3))
    g = torch.Generator().manual_seed(3)
    src, tgt = torch.randint(1, 37, (2, 6), generator=g), torch.randint(1, 37, (2, 9), generator=g)
    with torch.no_grad():
        parallel = model(src, tgt)
    recurrent = step_all(model, model.init_state(src), tgt)
    assert report("seq2seq W=3: recurrent vs parallel", (recurrent - parallel).abs().max()) < 1e-9


def test_convert_with_a_window_adds_only_feature_maps_and_gates():
    teacher = make(TransformerLM, lm_config("softmax"))
    student = after_t2r.convert_to_window(teacher, 3, "t2r", feature_size=6)
    new = [name for name in student.state_dict() if name not in teacher.state_dict()]
    assert new and all(is_new(name) for name in new)
    assert sum(name.endswith("window_gate") for name in new) == 2  # one per converted layer
    assert student.config.window == 3 and not hasattr(teacher.config, "window")


def test_fold_leaves_window_layers_as_they_are():
    """Eq. 8 would merge W_phi into W_q and W_k, but the window's softmax needs q and k themselves: fold keeps every
    window layer's weights (a folded layer would have no feature_map.weight and a k-wide q_proj)."""
    model = make(TransformerLM, lm_config("t2r", window=3))
    folded, original = t2r.fold(model).state_dict(), model.state_dict()
    assert folded.keys() == original.keys() and all(torch.equal(folded[k], original[k]) for k in original)
    assert not is_folded(t2r.fold(model)) and is_folded(t2r.fold(make(TransformerLM, lm_config("t2r"))))


def test_state_size_is_constant_in_length():
    model = make(TransformerLM, lm_config("t2r", window=3))
    state, sizes = model.init_state(2), []
    for t in range(12):
        model.step(torch.full((2,), t % 37), state)
        sizes.append(state_bytes(state))
    print(f"state bytes after steps 1 and 12: {sizes[0]}, {sizes[-1]}")
    assert len(set(sizes)) == 1  # S, z and the ring buffer of W keys and values: allocated once
