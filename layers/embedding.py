"""
The paper's input: the token embedding times sqrt(h) (Vaswani et al.) plus fixed sinusoidal positions, then dropout;
the adaptive input of its WikiText-103 model in place of the token table where the config has cutoffs.

    python -m pytest -q test_t2r.py tests/test_paper_models.py
"""

import math

import torch
import torch.nn as nn

from layers.adaptive import AdaptiveInput


def sinusoidal_positions(positions, d_model: int):
    """Vaswani et al.'s fixed positions: defined at any position, so the RNN runs past the training length."""
    inv_freq = torch.exp(torch.arange(0, d_model, 2, device=positions.device) * (-math.log(10000.0) / d_model))
    angles = positions.float()[:, None] * inv_freq  # (T, h/2)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).view(len(positions), d_model)  # (T, h)


class Embedding(nn.Module):
    """Token embedding times sqrt(h) plus sinusoidal positions, then dropout."""

    def __init__(self, config):
        super().__init__()
        self.tok = AdaptiveInput(config) if config.adaptive_cutoffs else nn.Embedding(config.vocab_size, config.d_model)
        self.d_model, self.scale, self.drop = config.d_model, math.sqrt(config.d_model), nn.Dropout(config.dropout)

    def forward(self, tokens, start=0):  # tokens: (B, T) from position start (an int or a 0-dim tensor) -> (B, T, h)
        embedded = self.tok(tokens)  # in the table's dtype (the float32 positions would promote bf16)
        positions = sinusoidal_positions(torch.arange(tokens.shape[1], device=tokens.device) + start, self.d_model)
        return self.drop((embedded * self.scale + positions).to(embedded.dtype))
