"""
An optional CUDA path for the chunked causal form: flash-linear-attention's chunk kernel (package
`flash-linear-attention`, Triton, CUDA only) computes Eq. 4's numerator, the denominator and the division stay
t2r.py's (one epsilon rule for every form). Nothing in t2r.py changes: `FlaLinearAttention` is a LinearAttention
whose `causal_form` hands the numerator to the kernel on a CUDA device, and `use_fla(model)` turns a model's T2R,
ELU and RFA layers into it (the same parameters, so its checkpoints stay the paper model's).

    pip install flash-linear-attention        # optional; needs a CUDA GPU and Triton
    python -m pytest -q tests/test_fla_kernel.py   # equal to the PyTorch chunked form, on the GPU
"""

import importlib.util
import inspect

import torch

from support.runtime import UserError
from t2r import LinearAttention, normalize


def fla_available() -> bool:
    return importlib.util.find_spec("fla") is not None and torch.cuda.is_available()


def fla_chunked_sums(fq, fk, v):
    """The numerator (B, H, T, d) and denominator (B, H, T) of Eq. 4, as linear_attention_chunked_sums gives them."""
    from fla.ops.linear_attn import chunk_linear_attn  # imported here: the package is optional

    # fla's layout is (B, T, H, .), said where a release still takes head_first; scale 1: phi(q) . phi(k), Eq. 3
    layout = {"head_first": False} if "head_first" in inspect.signature(chunk_linear_attn).parameters else {}
    numerator, _ = chunk_linear_attn(fq.transpose(1, 2), fk.transpose(1, 2), v.transpose(1, 2), scale=1.0,
                                     normalize=False, **layout)
    denominator = (fq * fk.cumsum(2)).sum(-1)  # phi(q_i) . z_i, z_i = sum_{j <= i} phi(k_j)  (Eqs. 5-7)
    return numerator.transpose(1, 2), denominator


class FlaLinearAttention(LinearAttention):
    """LinearAttention whose causal chunked form runs fla's kernel on CUDA (the PyTorch form elsewhere)."""

    def causal_form(self, q, k, fq, fk, v):
        if self.chunk_size and fq.is_cuda:
            return normalize(*fla_chunked_sums(fq, fk, v))
        return super().causal_form(q, k, fq, fk, v)


def use_fla(model):
    """Every causal LinearAttention of `model` (exactly that class, not a subclass such as a window layer's) runs
    fla's kernel in training. Returns the model; refuses where the kernel cannot run."""
    if not fla_available():
        raise UserError("fla's chunk kernel needs a CUDA GPU and `pip install flash-linear-attention`")
    for module in model.modules():
        if type(module) is LinearAttention:
            module.__class__ = FlaLinearAttention
    return model

