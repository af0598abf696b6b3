"""
A transformer's input: the token embedding (times sqrt(h), Vaswani et al.) plus its positions, then dropout. The paper's
models add fixed sinusoids; GPT-2 adds a learned table and does not scale; a Llama adds nothing here and turns q and k
in every attention by its positions' rotary angles, which `Embedding.rotation` gives t2r.py's layers.

    python -m pytest -q test_t2r.py tests/test_hf.py tests/test_model_switches.py
"""

import math

import torch
import torch.nn as nn

from support.adaptive import AdaptiveInput
from support.llama_layers import rope_frequencies, rotary_angles


def sinusoidal_positions(positions, d_model: int):
    """Vaswani et al.'s fixed positions: defined at any position, so the RNN runs past the training length."""
    inv_freq = torch.exp(torch.arange(0, d_model, 2, device=positions.device) * (-math.log(10000.0) / d_model))
    angles = positions.float()[:, None] * inv_freq  # (T, h/2)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).view(len(positions), d_model)  # (T, h)


class Embedding(nn.Module):
    """Token embedding times sqrt(h) plus sinusoidal positions, then dropout; GPT-2's: unscaled, learned positions;
    a Llama's: unscaled, nothing added (rotation gives its attention layers the rotary angles)."""

    def __init__(self, config):  # a t2r.Config
        super().__init__()
        self.tok = AdaptiveInput(config) if config.adaptive_cutoffs else nn.Embedding(config.vocab_size, config.d_model)
        # (max_positions, h), GPT-2's wpe; None registers nothing, so sinusoidal models keep their state_dict keys
        self.pos = nn.Embedding(config.max_positions, config.d_model) if config.max_positions else None
        self.d_model, self.scale = config.d_model, math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.drop = nn.Dropout(config.dropout)
        self.rotary = config.rope_theta > 0  # rotary positions turn q and k in every attention instead
        if self.rotary:  # (d / 2,) angles per position; not saved (persistent=False): the config says them
            self.register_buffer("inv_freq", rope_frequencies(config), persistent=False)

    def check_end(self, end: int):  # positions 0 .. end - 1 exist: a learned table has no row past its end
        if self.pos is not None and end > self.pos.num_embeddings:
            raise ValueError(f"position {end - 1} is past the {self.pos.num_embeddings} learned positions")

    def forward(self, tokens, start=0):  # tokens: (B, T) from position start (an int or a 0-dim tensor) -> (B, T, h)
        embedded = self.tok(tokens)  # in the table's dtype (the float32 positions would promote bf16)
        if self.rotary:
            return self.drop(embedded * self.scale)
        positions = torch.arange(tokens.shape[1], device=tokens.device) + start
        if self.pos is None:
            return self.drop((embedded * self.scale + sinusoidal_positions(positions, self.d_model)).to(embedded.dtype))
        if isinstance(start, int):  # a tensor start is checked by its caller (a CUDA graph, once for all its steps)
            self.check_end(start + tokens.shape[1])
        return self.drop(embedded * self.scale + self.pos(positions).to(embedded.dtype))

    def rotation(self, length: int, start=0, dtype=torch.float32):
        """(cos, sin), each (length, d), of positions start .. start + length - 1; None without rotary positions."""
        if not self.rotary:
            return None
        positions = torch.arange(length, device=self.inv_freq.device) + start
        return rotary_angles(positions, self.inv_freq, dtype)
