"""
The bookkeeping of the recurrent states (t2r.py's and sru.py's): their precision (sums over thousands of positions
in float32 at least, even under autocast), the KV cache a softmax layer grows by one key and value a token (and the
causal mask of a prompt read after it, in pieces of prefill_piece positions), and the bytes a state holds, which
bench.py and generate.py report; and the fused layout the fast steps share
(support/fast_step.py, families.py's and decay.py's grouped steps): S and z side by side, Sz = [S | z] (B, H, k, d + 1),
read and written with v1 = [v | 1], and q, k, v from one stacked product.

    python -m pytest -q tests/test_step.py tests/test_prefill.py
"""

from contextlib import nullcontext

import torch


def state_dtype(dtype: torch.dtype) -> torch.dtype:  # float32, or float64 for a float64 model
    return torch.promote_types(dtype, torch.float32)


def widened(*tensors) -> tuple:  # each in float32 at least
    return tuple(t.to(state_dtype(t.dtype)) for t in tensors)


def full_precision(device: torch.device):
    """Switch autocast off, so that a state's sums are not silently cast back to bf16/fp16."""
    return torch.autocast(device.type, enabled=False) if torch.is_autocast_enabled(device.type) else NOTHING


NOTHING = nullcontext()  # reusable: a step at batch 1 need not make a new one


def append_to_cache(state, k, v):
    """Write k, v (..., n, d) (a step's one position, or a prompt's n) at position state['length'] of the cache's time
    axis (-2); return the keys and values so far (..., t + n, d). A full cache doubles its capacity: amortised O(1) a
    token, not a copy of it every step."""
    t, n = state["length"], k.shape[-2]
    if t + n > state["k"].shape[-2]:
        for name, cache in (("k", state["k"]), ("v", state["v"])):
            capacity = max(16, 2 * cache.shape[-2], t + n)
            state[name] = cache.new_zeros(*cache.shape[:-2], capacity, cache.shape[-1], dtype=k.dtype)
            state[name][..., :t, :] = cache[..., :t, :]
    state["k"][..., t:t + n, :], state["v"][..., t:t + n, :] = k, v
    state["length"] = t + n
    keys, values = state["k"][..., : t + n, :], state["v"][..., : t + n, :]
    if torch.is_grad_enabled():  # autograd keeps them: the next token's write into the cache must not change them
        keys, values = keys.clone(), values.clone()
    return keys, values


def causal_after(before: int, T: int, device) -> dict:
    """SDPA's mask for T queries after `before` cached positions: query i sees keys j <= before + i (with nothing
    before, the fused causal kernel's own)."""
    if not before:
        return {"is_causal": True}
    return {"attn_mask": torch.ones(T, before + T, dtype=torch.bool, device=device).tril(before)}


def prefill_piece(config, length: int, chunk: int) -> int:
    """The positions a prefill reads at once: `chunk`, where a state of fixed size holds the past; the whole prompt
    where a softmax layer keeps a KV cache of every position anyway (SDPA's fused causal kernel, faster than a masked
    piece after cached positions, whose scores would be chunk x length)."""
    return max(chunk, length) if "softmax" in config.layer_kinds() else chunk


def state_bytes(state) -> int:
    """Bytes held by the tensors of a recurrent state (a KV cache counts its allocated capacity); a view of another of
    its tensors holds none of its own (support/fast_step.py's S and z, views of its [S | z])."""
    tensors = list(tensors_of(state))
    held = {id(t) for t in tensors}
    return sum(t.numel() * t.element_size() for t in tensors if t._base is None or id(t._base) not in held)


def tensors_of(state):
    if torch.is_tensor(state):
        yield state
    for part in state.values() if isinstance(state, dict) else state if isinstance(state, list) else []:
        yield from tensors_of(part)


# -----------------------------------------------------------------------------
# The fused state [S | z]: Eqs. 6-7 of t2r.py on S and z side by side

def add_to_state(fk, v1, Sz):  # fk (B, H, 1, k), v1 (B, H, 1, d + 1)
    Sz.addcmul_(fk.transpose(-1, -2), v1)  # Eq. 6, as one: [S | z] += phi(k_i)^T [v_i | 1]


def read_sums(fq, Sz) -> tuple:  # fq (B, H, Q, k): Q queries read each head's state -> (B, H, Q, d), (B, H, Q)
    both = fq @ Sz  # phi(q)^T [S | z] = [numerator | denominator] of Eq. 7 (t2r.normalize divides them)
    return both[..., :-1], both[..., -1]


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
