"""
The recurrent step's one product: a position's q, k and v (and Eq. 6's [v | 1]) from W_q, W_k, W_v stacked by head,
instead of three products and a concatenation, because at batch 1 each operation costs more than its arithmetic.

    python -m pytest -q tests/test_step.py
"""

import torch


def stacked_by_head(maps, n: int, append_one: bool) -> tuple:
    """(weight, bias) of [q | k | v (| 1)] for each of n heads (the key/value heads where query heads share them):
    maps are the nn.Linear of q, k and v; append_one adds a zero row of bias 1, whose output is Eq. 6's 1. A map
    without a bias counts zeros."""
    h = maps[0].in_features
    weights = [m.weight.detach().view(n, -1, h) for m in maps]  # (n, w, h) each
    biases = [(m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.out_features)).view(n, -1) for m in maps]
    if append_one:
        weights, biases = weights + [weights[0].new_zeros(n, 1, h)], biases + [biases[0].new_ones(n, 1)]
    return torch.cat(weights, 1).reshape(-1, h), torch.cat(biases, 1).reshape(-1)
