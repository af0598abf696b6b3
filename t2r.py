"""
T2R: Finetuning Pretrained Transformers into RNNs (Kasai et al., EMNLP 2021), in one file, in the paper's order.

A transformer whose attention can be
    softmax : exp(q.k / sqrt(d))                            (Eq. 2, the pretrained teacher)
    t2r     : relu(W_phi q + b_phi) . relu(W_phi k + b_phi) (Eq. 3, a learned ReLU-MLP feature map)
    elu     : (elu(q) + 1) . (elu(k) + 1)                   (Katharopoulos et al., 2020)
    rfa     : random Fourier features of l2-normalised q, k (Peng et al., 2021)
Every kind has a parallel form for training and a recurrent one for generation: the linear kinds keep a state
S (k x d) and z (k) per head (Eqs. 5-7), softmax a KV cache. `convert` is the swap of section 2.2, `fold` merges
the feature map into W_q and W_k (Eq. 8). Beside this file: the checkpoint families people bring (families.py) and
what came after T2R (after_t2r.py), both subclasses of the classes here.

    python train_lm.py --init pretrained      # pretrain softmax, swap to T2R, finetune; python generate.py samples
    python train_mt.py --init pretrained      # the same for a translator's decoder (causal k=4, cross k=32)
    python -m pytest -q test_t2r.py           # the forms agree
Shapes: B batch, T target length, S source length, H heads (r), d head size, k feature size, h = H d, V vocabulary.
"""

import copy
import math
from dataclasses import asdict, dataclass, field, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from layers.adaptive import AdaptiveSoftmax
from layers.config_rules import check_config, converted_kinds  # converted_kinds: every k-th layer kept softmax
from layers.embedding import Embedding  # the token embedding times sqrt(h) plus sinusoidal positions
from layers.states import append_to_cache, causal_after, full_precision, prefill_piece, state_dtype, widened

ATTENTION_KINDS = ("softmax", "t2r", "elu", "rfa")
# The one epsilon rule of every linear form: ReLU features can all be zero, and so the normaliser phi(q).z of Eq. 7
EPS = 1e-6
PREFILL_CHUNK = 2048  # positions a prefill reads in one parallel pass (a longer prompt goes in pieces of this size)


@dataclass
class Config:
    vocab_size: int = 10_000        # tokens in the (shared source/target) vocabulary
    n_layer: int = 4                # decoder layers (all the layers of the language model)
    n_head: int = 4                 # attention heads r
    d_model: int = 256              # model width h = r * d
    d_ff: int = 1024                # hidden width of the feed-forward sublayer
    dropout: float = 0.1            # on embeddings, sublayer outputs and the feed-forward hidden layer
    layer_dropout: float = 0.0      # LayerDrop: probability of skipping a whole layer in training
    pre_norm: bool = True           # LayerNorm before each sublayer (Baevski & Auli LM) or after (Vaswani MT)
    tie_embeddings: bool = True     # output projection shares the token embedding (Press & Wolf 2017)
    attn: str | list = "softmax"    # causal self-attention kind: one for all layers, or a list, one per layer
    feature_size: int = 32          # k of the causal self-attention (t2r, rfa); elu always has k = d
    chunk_size: int = 64            # chunk length of the causal linear attention in training; 0: quadratic form
    n_encoder_layer: int = 0        # encoder layers of Seq2SeqTransformer (its encoder is always softmax)
    cross_attn: str = "softmax"     # the decoder's cross attention kind (Seq2SeqTransformer)
    cross_feature_size: int = 32    # k of the cross attention
    pad_id: int = 0                 # padding token of the source (masked out of the cross attention)
    adaptive_cutoffs: list = field(default_factory=list)  # adaptive input, softmax: bands [0, c1), [c1, c2), ...
    adaptive_factor: int = 4        # band i embeds in d_model / factor^i dimensions

    def __post_init__(self):  # one-line errors for what cannot be built (layers/config_rules.py)
        self.attn = list(self.attn) if isinstance(self.attn, (list, tuple)) else self.attn
        self.adaptive_cutoffs = list(self.adaptive_cutoffs)
        check_config(self, ATTENTION_KINDS)

    def layer_kinds(self) -> list:  # the causal self-attention kind of each decoder layer, bottom to top
        return list(self.attn) if isinstance(self.attn, list) else [self.attn] * self.n_layer

    def to_dict(self) -> dict:  # a plain dict, so that checkpoints load with torch.load(weights_only=True)
        return asdict(self)


# -----------------------------------------------------------------------------
# Feature maps phi (Eq. 3): (B, H, T, d) -> (B, H, T, k). One module per attention layer, in the model's precision.
# Called as fq, fk = phi(q, k) so that both sides of a head see the same map.

class T2RFeatureMap(nn.Module):
    """The learned single-layer MLP of T2R, one k x d matrix per head."""

    def __init__(self, n_head: int, d_head: int, feature_size: int):
        super().__init__()
        bound = 1 / math.sqrt(d_head)  # nn.Linear's default initialisation, per head
        self.weight = nn.Parameter(torch.empty(n_head, feature_size, d_head).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(n_head, feature_size).uniform_(-bound, bound))

    def phi(self, x):
        # Eq. 3b: phi(x) = relu(W_phi x + b_phi), the same MLP for the queries and keys of a head
        return F.relu(torch.einsum("bhtd,hkd->bhtk", x, self.weight) + self.bias[:, None, :])

    def forward(self, *xs):
        return tuple(self.phi(x) for x in xs)


class FoldedT2RFeatureMap(nn.Module):
    """What is left of the T2R feature map after `fold`: W_phi now lives inside W_q and W_k (Eq. 8)."""

    def forward(self, *xs):  # Eqs. 8a-8b: phi(q_i) = relu(W~_q x_i + b~_q), the projection gave W~_q x_i + b~_q
        return tuple(map(torch.relu, xs))


class EluFeatureMap(nn.Module):
    """phi(x) = elu(x) + 1 (Katharopoulos et al., 2020): positive, no parameters, k = d."""

    def forward(self, *xs):
        return tuple(F.elu(x) + 1 for x in xs)


class RFAFeatureMap(nn.Module):
    """Random feature attention (Peng et al., 2021), a learned temperature per head. For unit x, y, exp(x.y / tau^2) is
    a Gaussian kernel's multiple, whose random Fourier features are sqrt(1/D) [sin(W x / tau), cos(W x / tau)],
    W ~ N(0, I) of D = k / 2 rows: redrawn at every training forward pass, fixed (a buffer) in eval."""

    def __init__(self, n_head: int, d_head: int, feature_size: int):
        super().__init__()
        self.n_random = feature_size // 2
        self.log_tau = nn.Parameter(torch.zeros(n_head))  # tau = 1 at the start
        self.register_buffer("omega", torch.randn(n_head, self.n_random, d_head))  # (H, D, d)

    def phi(self, x, omega):
        x = F.normalize(x, dim=-1, eps=EPS) / self.log_tau.exp()[:, None, None]
        wx = torch.einsum("bhtd,hnd->bhtn", x, omega)
        return torch.cat([wx.sin(), wx.cos()], dim=-1) / math.sqrt(self.n_random)  # (B, H, T, k)

    def forward(self, *xs):
        omega = torch.randn_like(self.omega) if self.training else self.omega
        return tuple(self.phi(x, omega) for x in xs)


FEATURE_MAPS = {"t2r": T2RFeatureMap, "elu": lambda *sizes: EluFeatureMap(), "rfa": RFAFeatureMap}  # (H, d, k) -> phi


# -----------------------------------------------------------------------------
# Linear attention, Eq. 4: out_i = phi(q_i) . sum_j phi(k_j) (x) v_j  /  phi(q_i) . sum_l phi(k_l)
# Every form takes features fq (B, H, T, k), fk (B, H, S, k), values v (B, H, S, d).

def normalize(numerator, denominator):
    """The shared epsilon rule: numerator / max(|denominator|, EPS). For t2r and elu features the denominator is
    >= 0 and abs() changes nothing; rfa's sin/cos features can make it negative, and abs() keeps the weights bounded."""
    return numerator / denominator.abs().clamp_min(EPS).unsqueeze(-1)


def linear_attention_quadratic(fq, fk, v, causal: bool, key_mask=None):
    """The readable reference: form the (T, S) similarity matrix, zero where a query may not look, and normalise it."""
    sim = fq @ fk.transpose(-1, -2)  # (B, H, T, S), sim~(q_i, k_j) = phi(q_i) . phi(k_j)  (Eq. 3a)
    if causal:
        sim = sim * torch.ones(sim.shape[-2:], dtype=torch.bool, device=sim.device).tril()
    if key_mask is not None:  # (B, S), True at real (not padded) source positions
        sim = sim * key_mask[:, None, None, :]
    # Eq. 4, first line: out_i = sum_j sim~(q_i, k_j) v_j / sum_l sim~(q_i, k_l)
    return normalize(sim @ v, sim.sum(-1))


# Why it is an RNN. The sums of Eq. 4 do not depend on the query, so they can be taken before it (associativity):
#   sum_j (phi(q_i) . phi(k_j)) v_j  =  phi(q_i)^T sum_j phi(k_j) v_j^T  =  phi(q_i)^T S_i     (Eq. 5: S, k x d)
#   sum_l  phi(q_i) . phi(k_l)       =  phi(q_i)^T sum_l phi(k_l)        =  phi(q_i)^T z_i     (Eq. 5: z, k)
# and the causal sums over j <= i grow by one term a position:
#   S_i = S_{i-1} + phi(k_i) v_i^T,   z_i = z_{i-1} + phi(k_i)                                    (Eq. 6)
#   out_i = phi(q_i)^T S_i / phi(q_i)^T z_i                                                       (Eq. 7)
# A state of k (d + 1) numbers per head replaces the i keys and values a softmax layer keeps.

def linear_attention_step(fq, fk, v, S, z):
    """The reference step: fq, fk (B, H, k), v (B, H, d); S (B, H, k, d), z (B, H, k), in place -> (B, H, d)"""
    S += fk[..., :, None] * v[..., None, :]  # Eq. 6: S_i = S_{i-1} + phi(k_i) v_i^T
    z += fk  # Eq. 6: z_i = z_{i-1} + phi(k_i)
    return normalize((fq[..., None, :] @ S)[..., 0, :], (fq * z).sum(-1))  # Eq. 7: phi(q_i)^T S_i / phi(q_i)^T z_i


def source_state(fk, v, key_mask=None):
    """Eq. 5 summed over a whole source: S (B, H, k, d) and z (B, H, k); padded positions add nothing."""
    if key_mask is not None:
        fk = fk * key_mask[:, None, :, None]
    return fk.transpose(-1, -2) @ v, fk.sum(-2)


def linear_attention_noncausal(fq, fk, v, key_mask=None):
    """Cross attention: one state (S, z) over the whole source, O(S + T) instead of O(S T)."""
    S, z = source_state(fk, v, key_mask)
    return normalize(fq @ S, (fq * z[:, :, None, :]).sum(-1))  # Eq. 7, for every query at once


def linear_attention_chunked(fq, fk, v, chunk_size: int):
    """Causal, memory linear in T: the quadratic form inside each chunk of C positions, plus the state of Eq. 5."""
    return normalize(*linear_attention_chunked_sums(fq, fk, v, chunk_size))


def linear_attention_chunked_sums(fq, fk, v, chunk_size: int):
    """The numerator (B, H, T, d) and denominator (B, H, T) of Eq. 4 in the chunked form, not yet divided."""
    (B, H, T, k), d, C = fq.shape, v.shape[-1], chunk_size
    pad = -T % C  # zero features at padded positions add nothing; their outputs are dropped
    if pad:
        fq, fk, v = (F.pad(t, (0, 0, 0, pad)) for t in (fq, fk, v))
    n = (T + pad) // C
    fq, fk, v = fq.view(B, H, n, C, k), fk.view(B, H, n, C, k), v.view(B, H, n, C, d)  # (B, H, n, C, .)

    sim = fq @ fk.transpose(-1, -2)  # (B, H, n, C, C), within a chunk
    sim = sim * torch.ones(C, C, dtype=torch.bool, device=sim.device).tril()
    numerator, denominator = sim @ v, sim.sum(-1)  # (B, H, n, C, d), (B, H, n, C)

    # Eq. 5 per chunk, then an exclusive prefix sum: the state before each chunk starts
    S = F.pad((fk.transpose(-1, -2) @ v).cumsum(2), (0, 0, 0, 0, 1, -1))  # (B, H, n, k, d)
    z = F.pad(fk.sum(-2).cumsum(2), (0, 0, 1, -1))  # (B, H, n, k)
    numerator = numerator + fq @ S
    denominator = denominator + (fq * z[:, :, :, None, :]).sum(-1)
    return numerator.view(B, H, n * C, d)[:, :, :T], denominator.view(B, H, n * C)[:, :, :T]


# Prefill: a prompt's T positions in one parallel pass, from the state before them and into it, as a transformer reads
# a prompt. Eq. 4's causal sums over the prompt's own pairs (chunked) plus what the state before it adds (Eq. 7, every
# query at once); then the state moves on by the prompt's Eq. 5 sums. T steps of Eqs. 6-7 give the same (tests).

def linear_attention_prefill(fq, fk, v, S, z, chunk_size: int):  # fq, fk (B, H, T, k), v (B, H, T, d) -> (B, H, T, d)
    numerator, denominator = linear_attention_chunked_sums(fq, fk, v, chunk_size)  # Eq. 4 within the prompt
    numerator = numerator + fq @ S  # phi(q_i)^T S_0: the positions before the prompt (Eq. 7)
    denominator = denominator + (fq * z[:, :, None, :]).sum(-1)  # phi(q_i)^T z_0
    S_prompt, z_prompt = source_state(fk, v)  # Eq. 5 over the prompt
    S += S_prompt  # in place, as a step's: S_T = S_0 + sum_j phi(k_j) v_j^T
    z += z_prompt  # z_T = z_0 + sum_j phi(k_j)
    return normalize(numerator, denominator)


# -----------------------------------------------------------------------------
# Multi-head attention modules. Precision, stated once, at their boundary: the linear forms sum thousands of positions
# into S and z, in float32 (float64 for a float64 model) even under autocast, whose bf16 keeps 8 significant bits.

class Attention(nn.Module):
    """The affine maps of Eq. 1 (q, k, v) and the output projection, shared by every kind."""

    def __init__(self, config: Config, causal: bool):
        super().__init__()
        self.n_head, self.d_head, self.causal = config.n_head, config.d_model // config.n_head, causal
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = self.projections(config)

    def projections(self, config) -> list:  # Eq. 1a-1b: W_q, W_k, W_v, then the output's W_o, each h x h + bias
        return [nn.Linear(config.d_model, config.d_model) for _ in range(4)]

    def heads(self, x):  # (B, T, H w) -> (B, H, T, w): w is d, or k once `fold` merged W_phi into W_q, W_k
        return x.view(*x.shape[:2], self.n_head, -1).transpose(1, 2)

    def project(self, x, source):  # -> q (B, H, T, w), k (B, H, S, w), v (B, H, S, d)
        return self.heads(self.q_proj(x)), self.heads(self.k_proj(source)), self.heads(self.v_proj(source))

    def merge(self, out):  # (B, H, T, d) -> (B, T, h)
        return self.out_proj(out.transpose(1, 2).flatten(2))

    def step_cross(self, x, state):  # x (B, h) -> (B, h): a cross attention's step is its prefill of one query
        return self.prefill_cross(x[:, None], state)[:, 0]


class SoftmaxAttention(Attention):
    """exp(q.k / sqrt(d)) attention (Eq. 2): the pretrained teacher."""

    def forward(self, x, source=None, key_mask=None):
        q, k, v = self.project(x, x if source is None else source)
        return self.merge(softmax_attention(q, k, v, self.causal and source is None, key_mask))

    # Recurrent form: a key/value cache that grows with t (append_to_cache).
    def init_state(self, batch_size: int, device, dtype):
        empty = torch.zeros(batch_size, self.n_head, 0, self.d_head, device=device, dtype=dtype)
        return {"k": empty, "v": empty.clone(), "length": 0}

    def step(self, x, state):  # x (B, h), one position -> (B, h)
        q, k, v = self.project(x[:, None], x[:, None])  # (B, H, 1, d)
        return self.merge(F.scaled_dot_product_attention(q, *append_to_cache(state, k, v)))[:, 0]

    def prefill(self, x, state):  # x (B, T, h): the prompt's keys and values join the cache at once -> (B, T, h)
        (q, k, v), mask = self.project(x, x), causal_after(state["length"], x.shape[1], x.device)  # after the cache's
        return self.merge(F.scaled_dot_product_attention(q, *append_to_cache(state, k, v), **mask))

    def init_cross_state(self, source, key_mask):
        k, v = self.heads(self.k_proj(source)), self.heads(self.v_proj(source))
        return {"k": k, "v": v, "mask": key_mask[:, None, None, :]}

    def prefill_cross(self, x, state):  # x (B, T, h): T queries read the source's keys and values
        q = self.heads(self.q_proj(x))
        return self.merge(F.scaled_dot_product_attention(q, state["k"], state["v"], attn_mask=state["mask"]))


def softmax_attention(q, k, v, causal: bool, key_mask=None):
    """q (B, H, T, d), k and v (B, H, S, d); key_mask (B, S), True at real (not padded) source positions."""
    mask = None if key_mask is None else key_mask[:, None, None, :]  # (B, 1, 1, S)
    # Eq. 2: out_i = sum_j exp(q_i.k_j / sqrt(d)) v_j / sum_l exp(q_i.k_l / sqrt(d)), one fused kernel
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)


class LinearAttention(Attention):
    """phi(q).phi(k) attention (Eqs. 3-7) for the t2r, elu and rfa feature maps."""

    def __init__(self, config: Config, causal: bool, kind: str, feature_size: int):
        super().__init__(config, causal)
        self.kind, self.chunk_size = kind, config.chunk_size if causal else 0
        self.feature_size = self.d_head if kind == "elu" else feature_size
        heads = self.k_proj.out_features // self.d_head  # one map per head of keys (H here; fewer in families.py)
        self.feature_map = FEATURE_MAPS[kind](heads, self.d_head, feature_size)

    def forward(self, x, source=None, key_mask=None):
        q, k, v = self.project(x, x if source is None else source)
        return self.merge(self.attend(q, k, v, source is not None, key_mask).to(x.dtype))

    def attend(self, q, k, v, cross: bool, key_mask=None):
        """The parallel forms: q, k (B, H, T, w), v (B, H, S, d) -> (B, H, T, d), in float32 at least."""
        fq, fk = self.feature_map(q, k)
        with full_precision(q.device):
            if cross or not self.causal:
                return linear_attention_noncausal(*widened(fq, fk, v), key_mask)
            return self.causal_form(q, k, *widened(fq, fk, v))

    def causal_form(self, q, k, fq, fk, v):
        if self.chunk_size:
            return linear_attention_chunked(fq, fk, v, self.chunk_size)
        return linear_attention_quadratic(fq, fk, v, causal=True)

    # Recurrent form: S (k x d) and z (k) per head, one size at every position, float32 at least (widened, as in attend)
    def init_state(self, batch_size: int, device, dtype):
        S = torch.zeros(batch_size, self.n_head, self.feature_size, self.d_head, device=device,
                        dtype=state_dtype(dtype))  # (B, H, k, d)
        return {"S": S, "z": S.new_zeros(S.shape[:-1])}  # z (B, H, k)

    def step(self, x, state):  # x (B, h), one position -> (B, h)
        q, k, v = self.project(x[:, None], x[:, None])  # (B, H, 1, w)
        (fq, fk), S, z = self.feature_map(q, k), state["S"], state["z"]
        with full_precision(x.device):
            fq, fk, v = (t[:, :, 0].to(S.dtype) for t in (fq, fk, v))  # (B, H, k), (B, H, k), (B, H, d)
            out = linear_attention_step(fq, fk, v, S, z)  # Eqs. 6-7, S and z in place
        return self.merge(out[:, :, None].to(x.dtype))[:, 0]

    def prefill(self, x, state):  # x (B, T, h): the prompt, after the state's positions -> (B, T, h)
        q, k, v = self.project(x, x)
        (fq, fk), S, z = self.feature_map(q, k), state["S"], state["z"]
        with full_precision(x.device):
            fq, fk, v = (t.to(S.dtype) for t in (fq, fk, v))
            out = linear_attention_prefill(fq, fk, v, S, z, self.chunk_size or x.shape[1])  # Eqs. 4-5, 7
        return self.merge(out.to(x.dtype))

    def init_cross_state(self, source, key_mask):  # S and z of the whole (masked) source, once per sentence
        (fk,) = self.feature_map(self.heads(self.k_proj(source)))
        with full_precision(source.device):
            S, z = source_state(*widened(fk, self.heads(self.v_proj(source))), key_mask)
        return {"S": S, "z": z}  # (B, H, k, d), (B, H, k)

    def prefill_cross(self, x, state):  # x (B, T, h): T queries read the source's S and z
        (fq,) = widened(*self.feature_map(self.heads(self.q_proj(x))))
        with full_precision(x.device):
            out = normalize(fq @ state["S"], (fq * state["z"][:, :, None, :]).sum(-1))  # Eq. 7, every query at once
        return self.merge(out.to(x.dtype))

    def fold(self):  # Eq. 8, below
        fold_feature_map(self)

    def new_tensors(self) -> list:  # what a conversion adds to the teacher's weights: the feature map's
        return [f"feature_map.{name}" for name in self.feature_map.state_dict()]


# -----------------------------------------------------------------------------
# The transformer: layers, the language model and the translator

class Block(nn.Module):
    """Self-attention, optional cross attention, feed-forward, each with a residual and a norm, made by `parts`."""

    def __init__(self, config: Config, parts, self_kind: str, causal: bool, cross_kind: str | None = None):
        super().__init__()
        self.pre_norm = config.pre_norm
        self.self_attn = parts.make_attention(self_kind, causal, config.feature_size)
        self.norm1 = parts.make_norm()
        self.cross_attn = cross_kind and parts.make_attention(cross_kind, False, config.cross_feature_size)
        self.norm_cross = parts.make_norm() if cross_kind else None
        self.ffn = parts.make_ffn()
        self.norm2 = parts.make_norm()
        self.drop = nn.Dropout(config.dropout)

    def residual(self, x, norm, sublayer):  # dropout in training only: at batch 1 a module call costs
        drop = self.drop if self.training else (lambda y: y)
        return self.added(x, drop(sublayer(self.normed(x, norm))), norm)

    def normed(self, x, norm):  # a sublayer's input: normed first (pre-norm), or as it is (post-norm)
        return norm(x) if self.pre_norm else x

    def added(self, x, out, norm):  # the residual sum, normed after it in post-norm
        return x + out if self.pre_norm else norm(x + out)

    def forward(self, x, self_mask=None, source=None, source_mask=None):
        """self_mask (B, T): real positions of x (the encoder's padding); source_mask (B, S): of the source."""
        x = self.residual(x, self.norm1, lambda y: self.self_attn(y, key_mask=self_mask))
        if self.cross_attn is not None:
            x = self.residual(x, self.norm_cross, lambda y: self.cross_attn(y, source, source_mask))
        return self.residual(x, self.norm2, self.ffn)

    def step(self, x, state):
        """x: (B, h), one position. The same computation as forward (in eval mode), with the recurrent attention."""
        x = self.added(x, self.self_attn.step(self.normed(x, self.norm1), state["self"]), self.norm1)
        if self.cross_attn is not None:
            out = self.cross_attn.step_cross(self.normed(x, self.norm_cross), state["cross"])
            x = self.added(x, out, self.norm_cross)
        return self.residual(x, self.norm2, self.ffn)

    def prefill(self, x, state):
        """x: (B, T, h), the T positions after the state's, in one parallel pass; the state moves past them."""
        x = self.residual(x, self.norm1, lambda y: self.self_attn.prefill(y, state["self"]))
        if self.cross_attn is not None:
            x = self.residual(x, self.norm_cross, lambda y: self.cross_attn.prefill_cross(y, state["cross"]))
        return self.residual(x, self.norm2, self.ffn)


class TransformerBase(nn.Module):
    """The parts every layer is made of, weight init, the output head and the recurrent state of both models."""

    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        self.embed = self.make_embedding()
        self.final_norm = self.make_norm() if config.pre_norm else nn.Identity()
        self.lm_head = (AdaptiveSoftmax(config, self.embed.tok) if config.adaptive_cutoffs else
                        nn.Linear(config.d_model, config.vocab_size, bias=False))

    # The parts, one method each: the seam where the models beside the paper's (families.py, after_t2r.py) differ
    def make_embedding(self) -> nn.Module:
        return Embedding(self.config)

    def make_attention(self, kind: str, causal: bool, feature_size: int) -> Attention:
        if kind == "softmax":
            return SoftmaxAttention(self.config, causal)
        return LinearAttention(self.config, causal, kind, feature_size)

    def make_norm(self) -> nn.Module:
        return nn.LayerNorm(self.config.d_model)

    def make_ffn(self) -> nn.Module:  # the ReLU MLP
        h, d_ff = self.config.d_model, self.config.d_ff
        return nn.Sequential(nn.Linear(h, d_ff), nn.ReLU(), nn.Dropout(self.config.dropout), nn.Linear(d_ff, h))

    def init_weights(self):
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for table in self.embed.tok.modules():
            if isinstance(table, nn.Embedding):
                nn.init.normal_(table.weight, std=table.embedding_dim ** -0.5)
        if self.config.tie_embeddings and not self.config.adaptive_cutoffs:  # the adaptive softmax is tied by design
            self.lm_head.weight = self.embed.tok.weight

    def run_layers(self, layers, x, *args, **kwargs):
        for layer in layers:
            if self.training and self.config.layer_dropout > 0 and torch.rand(()) < self.config.layer_dropout:
                continue  # LayerDrop (Fan et al., 2020), as in the paper's WikiText-103 model
            x = layer(x, *args, **kwargs)
        return x

    def output(self, x):
        return self.lm_head(self.final_norm(x))

    def step(self, tokens, state):
        """tokens (B,) at state['pos'] (an int, or a 0-dim tensor a CUDA graph reads) -> logits (B, V), in place."""
        if self.training:
            raise ValueError("step generates: call model.eval() first (in training mode dropout would apply)")
        with torch.no_grad():  # a reader follows main -> generate -> this -> a layer's step -> Eq. 6 (tests)
            x = self.embed(tokens[:, None], start=state["pos"])[:, 0]
            for layer, layer_state in zip(self.layers, state["layers"]):
                x = layer.step(x, layer_state)  # each layer's recurrent form: Eqs. 6-7 in a linear one
            state["pos"] += 1
            return self.output(x), state

    def step_layers(self, x, layer_states):  # step's loop and head, as support/fast_step.py's compile_step compiles it
        for layer, layer_state in zip(self.layers, layer_states):
            x = layer.step(x, layer_state)
        return self.output(x)

    @torch.no_grad()
    def prefill(self, tokens, state, chunk: int = PREFILL_CHUNK):
        """tokens (B, T) from state['pos'] -> the last one's logits (B, V), the state moved on: T steps' result, read in
        parallel passes of `chunk` positions (memory bounded at any T but a KV cache's)."""
        if self.training:
            raise ValueError("prefill generates: call model.eval() first (in training mode dropout would apply)")
        size = prefill_piece(self.config, tokens.shape[1], chunk)
        for start in range(0, tokens.shape[1], size):
            piece = tokens[:, start:start + size]
            x = self.embed(piece, start=state["pos"])
            for layer, layer_state in zip(self.layers, state["layers"]):
                x = layer.prefill(x, layer_state)
            state["pos"] += piece.shape[1]
        return self.output(x[:, -1]), state


class TransformerLM(TransformerBase):
    """Decoder-only language model: model(tokens) -> logits; init_state / step for generation."""

    def __init__(self, config: Config):
        super().__init__(config)
        self.layers = nn.ModuleList(Block(config, self, kind, causal=True) for kind in config.layer_kinds())
        self.init_weights()

    def forward(self, tokens):  # (B, T) -> (B, T, V)
        return self.output(self.run_layers(self.layers, self.embed(tokens)))

    @torch.no_grad()
    def init_state(self, batch_size: int):
        p = next(self.parameters())
        return {"pos": 0, "layers": [{"self": layer.self_attn.init_state(batch_size, p.device, p.dtype)}
                                     for layer in self.layers]}


class Seq2SeqTransformer(TransformerBase):
    """Encoder-decoder translator, embeddings shared (joint BPE): model(src, tgt_in) -> logits; init_state encodes."""

    def __init__(self, config: Config):
        super().__init__(config)
        if config.n_encoder_layer < 1:
            raise ValueError("Seq2SeqTransformer needs n_encoder_layer >= 1")
        self.encoder = nn.ModuleList(Block(config, self, "softmax", False) for _ in range(config.n_encoder_layer))
        self.encoder_norm = self.make_norm() if config.pre_norm else nn.Identity()
        self.layers = nn.ModuleList(Block(config, self, kind, causal=True, cross_kind=config.cross_attn)
                                    for kind in config.layer_kinds())
        self.init_weights()

    def encode(self, src):  # (B, S) -> memory (B, S, h), key_mask (B, S)
        key_mask = src != self.config.pad_id
        memory = self.run_layers(self.encoder, self.embed(src), key_mask)
        return self.encoder_norm(memory), key_mask

    def forward(self, src, tgt_in):  # (B, S), (B, T) -> (B, T, V)
        memory, key_mask = self.encode(src)
        return self.output(self.run_layers(self.layers, self.embed(tgt_in), None, memory, key_mask))

    @torch.no_grad()
    def init_state(self, src):
        (memory, key_mask), p = self.encode(src), next(self.parameters())
        return {"pos": 0, "layers": [{"self": layer.self_attn.init_state(src.shape[0], p.device, p.dtype),
                                      "cross": layer.cross_attn.init_cross_state(memory, key_mask)}
                                     for layer in self.layers]}


# -----------------------------------------------------------------------------
# Swap then finetune (section 2.2)

def convert(model: TransformerBase, attn: str = "t2r", feature_size: int | None = None, keep_softmax_every: int = 0,
            cross_feature_size: int = 32, keep_softmax_from: str = "nth", build=None, keep_softmax_layers=(),
            **changes) -> TransformerBase:
    """Swap: a trained softmax model's copy, its (decoder) attention replaced by `attn` with new feature maps; finetune
    it. Causal k: 4 in a translator (its encoder stays), 32 in an LM; cross k 32 (section 3.2). changes: other config
    fields. Seams for what came after T2R: build (config -> student) and keep_softmax_layers (0 the bottom)."""
    config, is_seq2seq = model.config, isinstance(model, Seq2SeqTransformer)
    if attn not in ATTENTION_KINDS or attn == "softmax":
        raise ValueError(f"convert to one of t2r, elu, rfa, not {attn!r}")
    if set(config.layer_kinds()) != {"softmax"} or (is_seq2seq and config.cross_attn != "softmax"):
        raise ValueError("this model is already converted: convert starts from a softmax transformer")
    if not set(keep_softmax_layers) <= set(range(config.n_layer)):
        raise ValueError(f"keep_softmax_layers={sorted(keep_softmax_layers)}: the layers are 0 to {config.n_layer - 1}")
    kinds = converted_kinds(config.n_layer, attn, keep_softmax_every, keep_softmax_from)
    kinds = ["softmax" if i in keep_softmax_layers else kind for i, kind in enumerate(kinds)]
    new_config = replace(config, attn=kinds,
                         feature_size=feature_size or (4 if is_seq2seq else 32), cross_feature_size=cross_feature_size,
                         cross_attn=attn if is_seq2seq else config.cross_attn, **changes)
    student = (build or type(model))(new_config)
    copy_pretrained(model, student)
    p = next(model.parameters())
    return student.to(device=p.device, dtype=p.dtype).train(model.training)


def new_tensors(model: nn.Module) -> set:
    """The names of what a conversion adds, as each module names its own (new_tensors()): here the feature maps."""
    return {f"{name}.{new}" for name, m in model.named_modules() if hasattr(m, "new_tensors")
            for new in m.new_tensors()}


@torch.no_grad()
def copy_pretrained(teacher: nn.Module, student: nn.Module):
    """Copy every teacher tensor into the student, whose only other tensors may be new_tensors (else ValueError)."""
    source, target = teacher.state_dict(), student.state_dict()
    unused, uncovered = sorted(set(source) - set(target)), sorted(set(target) - set(source) - new_tensors(student))
    if unused or uncovered:
        raise ValueError(f"teacher and student do not match: unused {unused[:3]}, not pretrained {uncovered[:3]}")
    for name, tensor in source.items():
        if target[name].shape != tensor.shape:
            raise ValueError(f"{name}: teacher shape {tuple(tensor.shape)}, student {tuple(target[name].shape)}")
        target[name].copy_(tensor)


# -----------------------------------------------------------------------------
# Folding (Eq. 8): for inference, W_phi merges into W_q and W_k, so q and k are never formed

@torch.no_grad()
def fold_feature_map(attn: LinearAttention):
    """Eq. 8: W~ = W_phi W and b~ = b_phi + W_phi b for queries and keys; phi becomes a plain relu."""
    W_phi, b_phi = attn.feature_map.weight, attn.feature_map.bias  # (H, k, d), (H, k)
    for name in ("q_proj", "k_proj"):
        proj, (H, k, d) = getattr(attn, name), W_phi.shape
        W, b = proj.weight.view(H, d, -1), proj.bias.view(H, d, 1)  # (H, d, h), (H, d, 1)
        folded = nn.Linear(W.shape[-1], H * k, device=W.device, dtype=W.dtype)
        folded.weight.copy_((W_phi @ W).reshape(H * k, -1))  # Eq. 8c
        folded.bias.copy_((b_phi + (W_phi @ b).squeeze(-1)).reshape(H * k))  # Eq. 8d
        setattr(attn, name, folded)
    attn.feature_map = FoldedT2RFeatureMap()


def fold(model: TransformerBase) -> TransformerBase:
    """A copy for inference with every T2R feature map merged into W_q and W_k: the outputs are unchanged."""
    folded = copy.deepcopy(model).eval()
    for module in folded.modules():
        if isinstance(module, LinearAttention) and module.kind == "t2r":
            module.fold()  # fold_feature_map, or a subclass's own (a window layer's: none)
    return folded
