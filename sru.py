"""
SRU++: When Attention Meets Fast Recurrence (Lei, EMNLP 2021), a language model in one file.

The other answer to T2R's question: instead of converting a trained transformer into an RNN, train a fast RNN
with a little attention from scratch. Each layer is a Simple Recurrent Unit (SRU, Eqs. 1-5) whose input
projection U is computed by a small single-head attention (section 3) in the layers that have one, and by a
low-rank projection (Fig. 2b) in the others.

    python -m pytest -q tests/test_sru.py      # the recurrent step equals the training form; Eqs. 1-5 written out

Shapes: B batch, T length, d hidden size, d' attention size (d : d' = 4 : 1 by default), V vocabulary.
"""

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from layers.states import append_to_cache, causal_after, full_precision, state_dtype  # as t2r.py's: a KV cache


@dataclass
class SRUConfig:
    vocab_size: int = 10_000    # tokens in the vocabulary
    n_layer: int = 4            # SRU++ layers
    d_model: int = 256          # hidden size d
    d_attn: int = 0             # attention size d' (0: d // 4, the paper's d : d' = 4 : 1)
    attn_every: int = 1         # attention in every k-th layer (Table 2), counted from the bottom; 0: none
    dropout: float = 0.1        # on the embeddings and on every layer's output
    tie_embeddings: bool = True  # the output projection shares the token embedding
    arch: str = "sru++"         # what a checkpoint holds (t2r.Config has no such field)

    def __post_init__(self):
        for name, least in (("vocab_size", 1), ("n_layer", 1), ("d_model", 1), ("d_attn", 0), ("attn_every", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < least:
                raise ValueError(f"{name}={value!r} must be an integer >= {least}")
        if self.attn_every > self.n_layer:
            raise ValueError(f"attn_every={self.attn_every} is larger than n_layer={self.n_layer}: no layer would "
                             f"have attention (0 says so)")
        self.d_attn = self.d_attn or max(1, self.d_model // 4)

    def has_attention(self, layer: int) -> bool:
        """Whether layer `layer` (0 = bottom) attends: every attn_every-th, the top one when attn_every = n_layer."""
        return self.attn_every > 0 and (layer + 1) % self.attn_every == 0

    def to_dict(self) -> dict:
        return asdict(self)


# -----------------------------------------------------------------------------
# The SRU recurrence (section 2). U (B, T, 3, d) holds W x, W' x and W'' x of Eq. 1 for every position.
# The elementwise part runs in float32 (float64 for a float64 model) even under autocast: c sums over time.
# torch.lerp(a, b, w) = a + w (b - a) = w . b + (1 - w) . a, the form of Eqs. 4 and 5.

def sru_cell(u, x, c, v, b):
    """One time step: u (B, 3, d), x (B, d) the layer's input, c (B, d) the previous state; v, b (2, d).
    Returns (h, c), both (B, d)."""
    f = torch.sigmoid(torch.addcmul(u[:, 0] + b[0], v[0], c))  # Eq. 2: f[t] = sigma(U[t, 0] + v . c[t-1] + b)
    r = torch.sigmoid(torch.addcmul(u[:, 1] + b[1], v[1], c))  # Eq. 3: r[t] = sigma(U[t, 1] + v' . c[t-1] + b')
    c = torch.lerp(u[:, 2], c, f)  # Eq. 4: c[t] = f[t] . c[t-1] + (1 - f[t]) . U[t, 2]
    h = torch.lerp(x, c, r)  # Eq. 5: h[t] = r[t] . c[t] + (1 - r[t]) . x[t]  (the highway)
    return h, c


def sru_recurrence(U, x, c, v, b):
    """The training form of Eqs. 2-5 over all T positions: U (B, T, 3, d), x (B, T, d), c (B, d) the state
    before the first -> h (B, T, d) and the last c. Only Eqs. 2 and 4 need a loop over time (f[t] reads
    c[t-1]); r and h of every position are batched once the c's are known. sru_cell is the same, step by step."""
    cs = StateRecurrence.apply(U[:, :, 0] + b[0], U[:, :, 2], v[0], c)  # Eqs. 2 and 4: c[0..T-1] (B, T, d)
    previous = torch.cat([c[:, None], cs[:, :-1]], dim=1)  # c[t-1]
    r = torch.sigmoid(U[:, :, 1] + v[1] * previous + b[1])  # Eq. 3, every position at once
    return torch.lerp(x, cs, r), cs[:, -1]  # Eq. 5: r . c + (1 - r) . x


class StateRecurrence(torch.autograd.Function):
    """c[t] = f[t] . c[t-1] + (1 - f[t]) . z[t] with f[t] = sigma(F[t] + v . c[t-1]) (Eqs. 2 and 4), and its
    gradient written out. Autograd through the loop would record ~10 operations per position, and PyTorch's
    per-operation overhead, not arithmetic, is the cost of an RNN on a CPU; here the forward loop runs 2
    operations per position, the backward loop 1, and everything else is batched over time."""

    @staticmethod
    def forward(ctx, forget, z, v, c):  # forget = U[:, :, 0] + b and z = U[:, :, 2]: (B, T, d); v (d,); c (B, d)
        cs, fs = [c], []
        for forget_t, z_t in zip(forget.unbind(1), z.unbind(1)):
            fs.append(torch.sigmoid(torch.addcmul(forget_t, v, cs[-1])))  # Eq. 2
            cs.append(torch.lerp(z_t, cs[-1], fs[-1]))  # Eq. 4: z + f . (c[t-1] - z)
        cs, f = torch.stack(cs, dim=1), torch.stack(fs, dim=1)  # (B, T + 1, d), (B, T, d)
        ctx.save_for_backward(cs, f, z, v)
        return cs[:, 1:]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):  # grad (B, T, d): dL/dc[t] from Eqs. 3 and 5, not through c[t+1]
        cs, f, z, v = ctx.saved_tensors
        previous = cs[:, :-1]
        d_forget = f * (1 - f) * (previous - z)  # dc[t]/dF[t]
        d_previous = f + d_forget * v  # dc[t]/dc[t-1]
        # total[t] = grad[t] + total[t+1] . dc[t+1]/dc[t], from the last position back
        after = d_previous.roll(-1, dims=1)  # dc[t+1]/dc[t]; at t = T-1 it multiplies a zero total
        totals, total = [], torch.zeros_like(grad[:, 0])
        for grad_t, after_t in zip(reversed(grad.unbind(1)), reversed(after.unbind(1))):
            total = torch.addcmul(grad_t, total, after_t)
            totals.append(total)
        total = torch.stack(totals[::-1], dim=1)  # dL/dc[t], every path (B, T, d)
        grad_forget = total * d_forget
        return grad_forget, total * (1 - f), (grad_forget * previous).sum((0, 1)), total[:, 0] * d_previous[:, 0]


# -----------------------------------------------------------------------------
# The SRU++ layer (section 3)

class SRUppLayer(nn.Module):
    """U from attention (section 3) or, without it, from the projection W^o layernorm(W^q x) (Fig. 2b); then the
    recurrence. With alpha = 0 an attention layer computes exactly what the projection variant does."""

    def __init__(self, d_model: int, d_attn: int, attention: bool):
        super().__init__()
        self.d_model, self.d_attn, self.attention = d_model, d_attn, attention
        self.q_proj = nn.Linear(d_model, d_attn, bias=False)  # W^q (d' x d)
        if attention:
            self.k_proj = nn.Linear(d_attn, d_attn, bias=False)  # W^k (d' x d'), applied to Q, not to X
            self.v_proj = nn.Linear(d_attn, d_attn, bias=False)  # W^v (d' x d')
            self.alpha = nn.Parameter(torch.zeros(()))  # zero at the start: U = W^o layernorm(Q)
        self.norm = nn.LayerNorm(d_attn)
        self.out_proj = nn.Linear(d_attn, 3 * d_model, bias=False)  # W^o (3d x d')
        self.v = nn.Parameter(torch.zeros(2, d_model))  # v, v' of Eqs. 2-3
        self.b = nn.Parameter(torch.zeros(2, d_model))  # b, b'

    def project(self, x):
        """U (B, T, 3, d) of the whole sequence: x (B, T, d)."""
        q = self.q_proj(x)  # Q = W^q X  (B, T, d')
        if self.attention:
            k, v = self.k_proj(q), self.v_proj(q)  # K = W^k Q, V = W^v Q
            # A = softmax(Q K^T / sqrt(d')) V, causal, one head
            a = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], is_causal=True)[:, 0]
            q = q + self.alpha * a
        # U = W^o layernorm(Q + alpha A)
        return self.out_proj(self.norm(q)).view(*x.shape[:2], 3, self.d_model)

    def forward(self, x):  # (B, T, d) -> (B, T, d)
        U = self.project(x)
        dtype = state_dtype(x.dtype)
        with full_precision(x.device):
            c = x.new_zeros(x.shape[0], self.d_model, dtype=dtype)
            h, _ = sru_recurrence(U.to(dtype), x.to(dtype), c, self.v.to(dtype), self.b.to(dtype))
        return h.to(x.dtype)

    # Recurrent form: c (B, d), and the keys and values of the attention layers (a cache of d' numbers each)
    def init_state(self, batch_size: int, device, dtype):
        state = {"c": torch.zeros(batch_size, self.d_model, device=device, dtype=state_dtype(dtype))}
        if self.attention:
            empty = torch.zeros(batch_size, 0, self.d_attn, device=device, dtype=dtype)
            state.update(k=empty, v=empty.clone(), length=0)
        return state

    def step(self, x, state):
        """x (B, d), one position: the same computation as forward, updating state in place."""
        q = self.q_proj(x)  # (B, d')
        if self.attention:
            keys, values = append_to_cache(state, self.k_proj(q)[:, None], self.v_proj(q)[:, None])  # (B, t + 1, d')
            a = F.scaled_dot_product_attention(q[:, None, None], keys[:, None], values[:, None])[:, 0, 0]
            q = q + self.alpha * a
        u = self.out_proj(self.norm(q)).view(x.shape[0], 3, self.d_model)
        c = state["c"]
        with full_precision(x.device):
            h, state["c"] = sru_cell(u.to(c.dtype), x.to(c.dtype), c, self.v.to(c.dtype), self.b.to(c.dtype))
        return h.to(x.dtype)

    def prefill(self, x, state):
        """x (B, T, d), the positions after the state's: forward's computation from the state, which moves on."""
        q = self.q_proj(x)  # (B, T, d')
        if self.attention:
            before = state["length"]
            keys, values = append_to_cache(state, self.k_proj(q), self.v_proj(q))  # (B, before + T, d')
            a = F.scaled_dot_product_attention(q[:, None], keys[:, None], values[:, None],
                                               **causal_after(before, x.shape[1], x.device))[:, 0]
            q = q + self.alpha * a
        U = self.out_proj(self.norm(q)).view(*x.shape[:2], 3, self.d_model)
        c = state["c"]
        with full_precision(x.device):  # Eqs. 2-5, the loop over time only where c[t] reads c[t-1]
            h, state["c"] = sru_recurrence(U.to(c.dtype), x.to(c.dtype), c, self.v.to(c.dtype), self.b.to(c.dtype))
        return h.to(x.dtype)


# -----------------------------------------------------------------------------
# The language model: embedding, SRU++ layers, output (section 4, "Models")

class SRUppLM(nn.Module):
    """model(tokens) -> logits (B, T, V); init_state / step for generation, as t2r.TransformerLM."""

    def describe(self) -> tuple[str, str]:
        """What generates, and the state its recurrent form keeps (generate.py's first line)."""
        c, attending = self.config, sum(self.config.has_attention(i) for i in range(self.config.n_layer))
        return (f"SRU++ with attention in {attending} of {c.n_layer} layers",
                "recurrent state (c per layer" + (", keys and values in the attention layers)" if attending else ")"))

    def __init__(self, config: SRUConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(SRUppLayer(config.d_model, config.d_attn, config.has_attention(i))
                                    for i in range(config.n_layer))
        self.drop = nn.Dropout(config.dropout)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
        nn.init.normal_(self.embed.weight, std=config.d_model ** -0.5)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(self, tokens):  # (B, T) -> (B, T, V)
        x = self.drop(self.embed(tokens) * math.sqrt(self.config.d_model))  # no positions: the recurrence orders
        for layer in self.layers:
            x = self.drop(layer(x))
        return self.lm_head(x)

    @torch.no_grad()
    def init_state(self, batch_size: int):
        p = self.embed.weight
        return {"pos": 0, "layers": [layer.init_state(batch_size, p.device, p.dtype) for layer in self.layers]}

    @torch.no_grad()
    def step(self, tokens, state):
        """tokens (B,) -> logits (B, V); updates state in place and returns it."""
        x = self.embed(tokens) * math.sqrt(self.config.d_model)
        for layer, layer_state in zip(self.layers, state["layers"]):
            x = layer.step(x, layer_state)
        state["pos"] += 1
        return self.lm_head(x), state

    @torch.no_grad()
    def prefill(self, tokens, state, chunk: int = 0):
        """tokens (B, T) -> the last one's logits (B, V), as t2r.TransformerBase.prefill: the prompt in one pass
        (chunk: unused, the attention layers' KV cache holds every position anyway)."""
        if self.training:
            raise ValueError("prefill generates: call model.eval() first (in training mode dropout would apply)")
        x = self.embed(tokens) * math.sqrt(self.config.d_model)
        for layer, layer_state in zip(self.layers, state["layers"]):
            x = layer.prefill(x, layer_state)
        state["pos"] += tokens.shape[1]
        return self.lm_head(x[:, -1]), state
