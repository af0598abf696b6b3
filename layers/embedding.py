"""
The paper's input: the token embedding times sqrt(h) (Vaswani et al.) plus fixed sinusoidal positions, then dropout;
the adaptive input of its WikiText-103 model in place of the token table where the config has cutoffs.

    python -m pytest -q test_t2r.py tests/test_paper_models.py
"""

import math

import torch
import torch.nn as nn

from layers.adaptive import AdaptiveInput

BLOCK = 1024  # positions whose sinusoids generation makes at once


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
        self.block, self.block_start = None, 0  # the sinusoids of BLOCK positions, for generation's steps

    def forward(self, tokens, start=0):  # tokens: (B, T) from position start (an int or a 0-dim tensor) -> (B, T, h)
        embedded = self.tok(tokens)  # in the table's dtype (the float32 positions would promote bf16)
        x = (embedded * self.scale + self.positions(start, tokens.shape[1], tokens.device)).to(embedded.dtype)
        return self.drop(x) if self.training else x

    def positions(self, start, length: int, device):
        """The sinusoids of positions start .. start + length - 1. A step's one position is a row of a block made for
        BLOCK positions at once (memory stays flat at any length; at batch 1 each operation costs)."""
        if not (isinstance(start, int) and length == 1):  # a window, or a step a CUDA graph reads (tensor start)
            return sinusoidal_positions(torch.arange(length, device=device) + start, self.d_model)
        if self.block is None or self.block.device != device or not 0 <= start - self.block_start < BLOCK:
            self.block_start = start
            self.block = sinusoidal_positions(torch.arange(start, start + BLOCK, device=device), self.d_model)
        return self.block[start - self.block_start][None]
