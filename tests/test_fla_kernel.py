"""The optional CUDA path (support/fla_kernel.py): fla's chunk kernel against the PyTorch chunked form."""

import pytest
import torch

from support.runtime import UserError
from support.fla_kernel import FlaLinearAttention, fla_available, fla_chunked_sums, use_fla
from t2r import Config, LinearAttention, TransformerLM, linear_attention_chunked_sums, normalize

needs_fla = pytest.mark.skipif(not fla_available(), reason="needs CUDA and flash-linear-attention")


def features(B=2, H=3, T=300, k=32, d=64, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(0)
    fq, fk = (torch.rand(B, H, T, k, generator=g, dtype=torch.float64) for _ in range(2))  # >= 0, as t2r's ReLU
    v = torch.randn(B, H, T, d, generator=g, dtype=torch.float64)
    return [t.to(device, dtype).requires_grad_() for t in (fq, fk, v)]


@needs_fla
@pytest.mark.parametrize("T", [64, 300, 4096])
def test_fla_kernel_equals_the_pytorch_chunked_form_and_its_gradients(T):
    inputs = features(T=T, device="cuda")
    exact = features(T=T, device="cuda", dtype=torch.float64)  # the same numbers, the reference in float64
    grad_out = torch.randn(2, 3, T, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    out = normalize(*fla_chunked_sums(*inputs))
    ref = normalize(*linear_attention_chunked_sums(*exact, 64))
    (out * grad_out).sum().backward()
    (ref * grad_out.double()).sum().backward()
    scale = ref.abs().max().item()
    relative = lambda a, b: ((a.double() - b).abs().max() / b.abs().max()).item()
    diffs = [(out.double() - ref).abs().max().item()] + [relative(a.grad, b.grad) for a, b in zip(inputs, exact)]
    print(f"T={T}: fla vs float64 chunked form: output {diffs[0]:.2e} (of {scale:.2f}), gradients (relative) "
          + ", ".join(f"{d:.2e}" for d in diffs[1:]))
    assert diffs[0] < 5e-3 * scale and max(diffs[1:]) < 5e-3  # float32 in, TF32 products (10-bit mantissas) inside


@needs_fla
def test_use_fla_trains_a_model_as_the_pytorch_form_does():
    torch.manual_seed(0)
    model = TransformerLM(Config(vocab_size=50, n_layer=2, n_head=2, d_model=64, d_ff=128, attn="t2r",
                                 feature_size=16, dropout=0.0)).cuda()
    tokens = torch.randint(0, 50, (2, 200), device="cuda")
    before = model(tokens).double()
    after = use_fla(model)(tokens).double()
    assert all(type(m) is not LinearAttention for m in model.modules())
    print(f"logits, fla vs PyTorch: {(after - before).abs().max().item():.2e}")
    assert (after - before).abs().max().item() < 1e-2


def test_the_fla_layer_runs_the_pytorch_form_off_cuda():
    config = Config(vocab_size=50, n_layer=1, n_head=2, d_model=32, d_ff=64, attn="t2r", feature_size=8)
    torch.manual_seed(0)
    plain = LinearAttention(config, True, "t2r", 8)
    fla = FlaLinearAttention(config, True, "t2r", 8)
    fla.load_state_dict(plain.state_dict())
    x = torch.randn(2, 70, 32)
    assert torch.equal(fla(x), plain(x))


@pytest.mark.skipif(fla_available(), reason="checks the refusal where the kernel cannot run")
def test_use_fla_refuses_where_the_kernel_cannot_run():
    model = TransformerLM(Config(vocab_size=50, n_layer=1, n_head=2, d_model=32, d_ff=64, attn="t2r", feature_size=8))
    with pytest.raises(UserError, match="^fla's chunk kernel needs a CUDA GPU and `pip install flash-linear-attention`"):
        use_fla(model)
