"""
What Llama-family checkpoints (Llama, Qwen2, Mistral, SmolLM2) compute besides the paper's transformer, switched on by
t2r.Config's last fields: RMSNorm, the SwiGLU feed-forward layer, rotary positions. t2r.py and support/embedding.py
build them; support/hf.py reads their weights.

    python -m pytest -q tests/test_model_switches.py tests/test_hf_llama.py
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from support.states import state_dtype


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) times a learned gain (Zhang & Sennrich, 2019), in float32 at least."""

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d_model)), eps

    def forward(self, x):
        y = x.to(state_dtype(x.dtype))  # float32 at least: a norm in bf16 is off
        return self.weight * (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class SwiGLU(nn.Module):
    """The gated feed-forward layer (Shazeer, 2020): down(silu(gate x) * up x)."""

    def __init__(self, config):
        super().__init__()
        self.gate, self.up = (nn.Linear(config.d_model, config.d_ff, bias=False) for _ in range(2))
        self.down = nn.Linear(config.d_ff, config.d_model, bias=False)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.down(self.drop(F.silu(self.gate(x)) * self.up(x)))


def rope_frequencies(config) -> torch.Tensor:
    """The rotary angle per position of each pair of dimensions, theta^(-2i/d), as the checkpoint stretches them."""
    d = config.d_model // config.n_head
    inv_freq = config.rope_theta ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d / 2,)
    scaling = config.rope_scaling or {}
    if scaling.get("rope_type") == "linear":  # positions divided by the factor
        return (inv_freq / scaling["factor"]).float()
    if scaling.get("rope_type") == "llama3":  # low frequencies divided by the factor, high ones kept, a blend between
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        cycles = scaling["original_max_position_embeddings"] * inv_freq / (2 * math.pi)  # waves in the old context
        blend = ((cycles - low) / (high - low)).clamp(0, 1)  # 0: long waves (stretched), 1: short ones (kept)
        return ((1 - blend) * inv_freq / factor + blend * inv_freq).float()
    return inv_freq.float()


def rotary_angles(positions, inv_freq, dtype):  # (cos, sin) of positions x frequencies, each (T, d)
    wide = state_dtype(dtype)  # the angles in float32 at least: a bf16 position count is off past 256
    angles = positions.to(wide)[:, None] * inv_freq.to(wide)  # (T, d / 2)
    angles = torch.cat([angles, angles], -1)  # the halves of a head pair up: dimension i with i + d / 2
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x, cos, sin):
    """Rotary positions (Su et al., 2021): each pair (x_i, x_{i + d/2}) of a head turned by its position's angle,
    so that q_i.k_j depends on i - j alone. x (..., T, d), cos and sin (T, d)."""
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin
