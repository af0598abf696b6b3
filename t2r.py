"""
T2R: Finetuning Pretrained Transformers into RNNs (Kasai et al., EMNLP 2021), in one file.

A transformer language model and an encoder-decoder translator whose attention can be
    softmax : exp(q.k / sqrt(d))                            (Eq. 2, the pretrained teacher)
    t2r     : relu(W_phi q + b_phi) . relu(W_phi k + b_phi) (Eq. 3, learned ReLU-MLP feature map)
    elu     : (elu(q) + 1) . (elu(k) + 1)                   (Katharopoulos et al., 2020)
    rfa     : random Fourier features of l2-normalised q, k (Peng et al., 2021)
Every kind has a parallel form for training and a recurrent form for generation:
the linear kinds keep a state S (k x d) and z (k) per head (Eqs. 5-7), softmax keeps a KV cache.
`convert` is the swap of section 2.2, `fold` merges the feature map into W_q, W_k (Eq. 8). Two steps added since:
`attention_transfer` (train the feature maps to imitate softmax first) and `convert(window=W)` (softmax kept on the
last W tokens).

    python train_lm.py --init pretrained      # pretrain softmax, swap to T2R, finetune
    python generate.py                        # sample with the recurrent form
    python train_mt.py --init pretrained      # the same for a translator's decoder (causal k=4, cross k=32)
    python -m pytest -q                       # the forms agree; see test_t2r.py

Shapes: B batch, T target length, S source length, H heads (r in the paper),
d head size, k feature size, h = H * d model size, V vocabulary.
"""

import copy
import math
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

ATTENTION_KINDS = ("softmax", "t2r", "elu", "rfa")
POSITIONS = ("sinusoidal", "learned")
ACTIVATIONS = {"relu": nn.ReLU, "gelu_tanh": partial(nn.GELU, approximate="tanh")}  # of the feed-forward layer

# The one epsilon rule of every linear form (quadratic, chunked, non-causal, recurrent):
# ReLU features can all be zero, so the normaliser phi(q).z of Eq. 7 can be zero.
EPS = 1e-6


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
    window: int = 0                 # causal linear layers attend with softmax to the last W tokens (0: none)
    n_encoder_layer: int = 0        # encoder layers of Seq2SeqTransformer (its encoder is always softmax)
    cross_attn: str = "softmax"     # the decoder's cross attention kind (Seq2SeqTransformer)
    cross_feature_size: int = 32    # k of the cross attention
    pad_id: int = 0                 # padding token of the source (masked out of the cross attention)
    adaptive_cutoffs: list = field(default_factory=list)  # adaptive input and softmax: vocabulary bands [0, c1),
    #                                 [c1, c2), ... of ids in order of frequency (Baevski & Auli 2019); [] for none
    adaptive_factor: int = 4        # band i embeds in d_model / factor^i dimensions
    positions: str = "sinusoidal"   # or "learned": a trained table of max_positions rows (GPT-2)
    max_positions: int = 0          # rows of the learned table, the longest sequence (GPT-2's n_positions)
    activation: str = "relu"        # of the feed-forward hidden layer, or "gelu_tanh" (GPT-2's tanh approximation)
    scale_embedding: bool = True    # token embedding times sqrt(h) (Vaswani et al.); GPT-2 does not scale it

    def __post_init__(self):
        for name, least in (("vocab_size", 1), ("n_layer", 1), ("n_head", 1), ("d_model", 1), ("d_ff", 1),
                            ("n_encoder_layer", 0), ("chunk_size", 0), ("window", 0), ("max_positions", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < least:
                raise ValueError(f"{name}={value!r} must be an integer >= {least}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_head={self.n_head}")
        if isinstance(self.attn, (list, tuple)):
            self.attn = list(self.attn)
            if len(self.attn) != self.n_layer:
                raise ValueError(f"attn lists {len(self.attn)} kinds for n_layer={self.n_layer} layers")
        for kind in self.layer_kinds() + [self.cross_attn]:
            if kind not in ATTENTION_KINDS:
                raise ValueError(f"unknown attention kind {kind!r}: choose one of {', '.join(ATTENTION_KINDS)}")
        for name in ("feature_size", "cross_feature_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if "rfa" in self.layer_kinds() and self.feature_size % 2:
            raise ValueError("rfa uses sin and cos features: feature_size must be even")
        if self.cross_attn == "rfa" and self.cross_feature_size % 2:
            raise ValueError("rfa uses sin and cos features: cross_feature_size must be even")
        self.check_adaptive()
        self.check_gpt2_switches()

    def check_gpt2_switches(self):
        """The switches GPT-2 needs: learned positions and their number, the GELU, the unscaled embedding."""
        if self.positions not in POSITIONS:
            raise ValueError(f"positions={self.positions!r}: choose one of {', '.join(POSITIONS)}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation={self.activation!r}: choose one of {', '.join(ACTIVATIONS)}")
        if (self.positions == "learned") != (self.max_positions > 0):
            raise ValueError(f"max_positions={self.max_positions} with {self.positions} positions: a learned table "
                             f"needs its length (> 0), sinusoidal positions take 0 (they have no end)")
        if not isinstance(self.scale_embedding, bool):
            raise ValueError(f"scale_embedding={self.scale_embedding!r} must be True or False")

    def check_adaptive(self):
        self.adaptive_cutoffs = list(self.adaptive_cutoffs)
        if not self.adaptive_cutoffs:
            return
        edges = [0, *self.adaptive_cutoffs, self.vocab_size]
        if any(not isinstance(c, int) for c in self.adaptive_cutoffs) or edges != sorted(set(edges)):
            raise ValueError(f"adaptive_cutoffs={self.adaptive_cutoffs} must increase strictly inside (0, "
                             f"vocab_size={self.vocab_size})")
        if self.adaptive_factor < 1 or self.d_model // self.adaptive_factor ** len(self.adaptive_cutoffs) < 1:
            raise ValueError(f"adaptive_factor={self.adaptive_factor} leaves the last band no dimension of "
                             f"d_model={self.d_model}")
        if self.n_encoder_layer or not self.tie_embeddings:
            raise ValueError("the adaptive input and softmax are a tied language model's: set tie_embeddings, "
                             "and no encoder")

    def layer_kinds(self) -> list:
        """The causal self-attention kind of each decoder layer, bottom to top."""
        return list(self.attn) if isinstance(self.attn, list) else [self.attn] * self.n_layer

    def to_dict(self) -> dict:
        """A plain dict, so checkpoints load with torch.load(weights_only=True)."""
        return asdict(self)


# -----------------------------------------------------------------------------
# Feature maps phi: (B, H, T, d) -> (B, H, T, k). One module per attention layer.
# Called as fq, fk = phi(q, k) so that both sides of a head see the same map.

class T2RFeatureMap(nn.Module):
    """The learned single-layer MLP of T2R, one k x d matrix per head."""

    def __init__(self, n_head: int, d_head: int, feature_size: int):
        super().__init__()
        bound = 1 / math.sqrt(d_head)  # nn.Linear's default initialisation, per head
        self.weight = nn.Parameter(torch.empty(n_head, feature_size, d_head).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(n_head, feature_size).uniform_(-bound, bound))

    def phi(self, x):
        # in x's precision: a recurrent step feeds float32 (the state's) to a model whose weights may be bf16
        weight, bias = self.weight.to(x.dtype), self.bias.to(x.dtype)
        # Eq. 3b: phi(x) = relu(W_phi x + b_phi), the same MLP for the queries and keys of a head
        return F.relu(torch.einsum("bhtd,hkd->bhtk", x, weight) + bias[:, None, :])

    def forward(self, *xs):
        return tuple(self.phi(x) for x in xs)


class FoldedT2RFeatureMap(nn.Module):
    """What is left of the T2R feature map after `fold`: W_phi now lives inside W_q and W_k (Eq. 8)."""

    def forward(self, *xs):
        # Eqs. 8a-8b: phi(q_i) = relu(W~_q x_i + b~_q); the projection already produced W~_q x_i + b~_q
        return tuple(F.relu(x) for x in xs)


class EluFeatureMap(nn.Module):
    """phi(x) = elu(x) + 1 (Katharopoulos et al., 2020): positive, no parameters, k = d."""

    def forward(self, *xs):
        return tuple(F.elu(x) + 1 for x in xs)


class RFAFeatureMap(nn.Module):
    """Random feature attention (Peng et al., 2021) with a learned temperature per head.

    For unit vectors x, y: exp(x.y / tau^2) is proportional to exp(-|x - y|^2 / (2 tau^2)), a Gaussian
    kernel, whose random Fourier features are sqrt(1/D) [sin(W x / tau), cos(W x / tau)], W ~ N(0, I),
    D = k / 2 rows. W is redrawn at every training forward pass and fixed (a saved buffer) in eval.
    """

    def __init__(self, n_head: int, d_head: int, feature_size: int):
        super().__init__()
        self.n_random = feature_size // 2
        self.log_tau = nn.Parameter(torch.zeros(n_head))  # tau = 1 at the start
        self.register_buffer("omega", torch.randn(n_head, self.n_random, d_head))  # (H, D, d)

    def phi(self, x, omega):
        x = F.normalize(x, dim=-1, eps=EPS) / self.log_tau.to(x.dtype).exp()[:, None, None]
        wx = torch.einsum("bhtd,hnd->bhtn", x, omega.to(x.dtype))  # in x's precision, as T2R's
        return torch.cat([wx.sin(), wx.cos()], dim=-1) / math.sqrt(self.n_random)  # (B, H, T, k)

    def forward(self, *xs):
        omega = torch.randn_like(self.omega) if self.training else self.omega
        return tuple(self.phi(x, omega) for x in xs)


def make_feature_map(kind: str, n_head: int, d_head: int, feature_size: int) -> nn.Module:
    if kind == "t2r":
        return T2RFeatureMap(n_head, d_head, feature_size)
    if kind == "elu":
        return EluFeatureMap()
    if kind == "rfa":
        return RFAFeatureMap(n_head, d_head, feature_size)
    raise ValueError(f"{kind!r} has no feature map")


# -----------------------------------------------------------------------------
# Linear attention, Eq. 4: out_i = phi(q_i) . sum_j phi(k_j) (x) v_j  /  phi(q_i) . sum_l phi(k_l)
# All forms take features fq (B, H, T, k), fk (B, H, S, k) and values v (B, H, S, d).
# They run in float32 (float64 when given float64) even under autocast: S and z are sums over
# thousands of positions, and bf16 keeps only 8 significant bits.

def state_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def full_precision(device: torch.device):
    """Switch autocast off, so the sums below are not silently cast back to bf16/fp16."""
    if torch.is_autocast_enabled(device.type):
        return torch.autocast(device.type, enabled=False)
    return nullcontext()


def normalize(numerator, denominator):
    """The shared epsilon rule: numerator / max(|denominator|, EPS).

    For t2r and elu features the denominator is >= 0 and abs() changes nothing; rfa's sin/cos
    features can make it negative, and abs() keeps the weights bounded instead of exploding.
    """
    return numerator / denominator.abs().clamp_min(EPS).unsqueeze(-1)


def masked_similarity(fq, fk, causal: bool, key_mask=None):
    """The (T, S) similarity matrix of Eq. 4, zero where a query may not look."""
    sim = fq @ fk.transpose(-1, -2)  # (B, H, T, S), sim~(q_i, k_j) = phi(q_i) . phi(k_j)  (Eq. 3a)
    if causal:
        T, S = sim.shape[-2:]
        sim = sim * torch.ones(T, S, dtype=torch.bool, device=sim.device).tril()
    if key_mask is not None:  # (B, S), True at real (not padded) source positions
        sim = sim * key_mask[:, None, None, :]
    return sim


def linear_attention_quadratic(fq, fk, v, causal: bool, key_mask=None):
    """The readable reference: form the similarity matrix and normalise it, O(T S) time and memory."""
    sim = masked_similarity(fq, fk, causal, key_mask)
    # Eq. 4, first line: out_i = sum_j sim~(q_i, k_j) v_j / sum_l sim~(q_i, k_l)
    return normalize(sim @ v, sim.sum(-1))


def source_state(fk, v, key_mask=None):
    """Eq. 5 summed over a whole source: S (B, H, k, d) and z (B, H, k); padded positions add nothing."""
    if key_mask is not None:
        fk = fk * key_mask[:, None, :, None]
    return fk.transpose(-1, -2) @ v, fk.sum(-2)


def linear_attention_noncausal(fq, fk, v, key_mask=None):
    """Cross attention: one state (S, z) over the whole source, O(S + T) instead of O(S T)."""
    S, z = source_state(fk, v, key_mask)
    # Eq. 7, for every query at once
    return normalize(fq @ S, (fq * z[:, :, None, :]).sum(-1))


def linear_attention_chunked(fq, fk, v, chunk_size: int):
    """Causal linear attention with memory linear in T: the masked quadratic form inside each chunk
    of C positions, plus the running state (S, z) of Eq. 5 of every earlier chunk."""
    return normalize(*linear_attention_chunked_sums(fq, fk, v, chunk_size))


def linear_attention_chunked_sums(fq, fk, v, chunk_size: int):
    """The numerator (B, H, T, d) and denominator (B, H, T) of Eq. 4 in the chunked form, not yet divided."""
    B, H, T, k = fq.shape
    d = v.shape[-1]
    C = chunk_size
    pad = -T % C  # zero features at padded positions add nothing; their outputs are dropped
    if pad:
        fq, fk, v = (F.pad(t, (0, 0, 0, pad)) for t in (fq, fk, v))
    n = (T + pad) // C
    fq, fk = fq.view(B, H, n, C, k), fk.view(B, H, n, C, k)  # (B, H, n, C, k)
    v = v.view(B, H, n, C, d)  # (B, H, n, C, d)

    sim = fq @ fk.transpose(-1, -2)  # (B, H, n, C, C), within a chunk
    sim = sim * torch.ones(C, C, dtype=torch.bool, device=sim.device).tril()
    numerator = sim @ v  # (B, H, n, C, d)
    denominator = sim.sum(-1)  # (B, H, n, C)

    # Eq. 5 per chunk, then an exclusive prefix sum: the state before each chunk starts
    S = F.pad((fk.transpose(-1, -2) @ v).cumsum(2), (0, 0, 0, 0, 1, -1))  # (B, H, n, k, d)
    z = F.pad(fk.sum(-2).cumsum(2), (0, 0, 1, -1))  # (B, H, n, k)
    numerator = numerator + fq @ S
    denominator = denominator + (fq * z[:, :, :, None, :]).sum(-1)
    return numerator.view(B, H, n * C, d)[:, :, :T], denominator.view(B, H, n * C)[:, :, :T]


def linear_attention_step(fq, fk, v1, Sz):
    """One recurrent step, Eqs. 6-7. fq, fk (B, H, 1, k); v1 = [v | 1] (B, H, 1, d + 1); Sz = [S | z] (B, H, k, d + 1):
    S and z side by side, so that each equation is one batched product. Updates Sz in place; returns (B, H, d)."""
    add_to_state(fk, v1, Sz)
    return read_state(fq, Sz)


def add_to_state(fk, v1, Sz):
    B, H, k, d1 = Sz.shape
    # Eq. 6: S_i = S_{i-1} + phi(k_i) (x) v_i and z_i = z_{i-1} + phi(k_i), as one: [S | z] += phi(k_i) (x) [v_i | 1]
    Sz.addcmul_(fk.view(B, H, k, 1), v1.view(B, H, 1, d1))


def read_state(fq, Sz):
    B, H, k, d1 = Sz.shape
    # Eq. 7: out_i = phi(q_i)^T S_i / phi(q_i)^T z_i, as one: phi(q_i)^T [S | z] = [numerator | denominator]
    both = torch.bmm(fq.reshape(B * H, 1, k), Sz.view(B * H, k, d1)).view(B, H, d1)
    return normalize(both[..., :-1], both[..., -1])


# -----------------------------------------------------------------------------
# The sliding-window hybrid (LoLCATs, Zhang et al. 2025; Liger, Lan et al. 2025): softmax over the last W
# tokens, the linear feature map over everything before them, in one normalisation:
#   out_i = ( sum_{i-W<j<=i} g exp(s_ij - m_i) v_j + sum_{j<=i-W} phi(q_i).phi(k_j) v_j )
#           / ( sum_{i-W<j<=i} g exp(s_ij - m_i)     + sum_{j<=i-W} phi(q_i).phi(k_j) )
#   s_ij = q_i.k_j / sqrt(d),  m_i = max over the window,  g > 0 learned per head
# W >= T is softmax attention; W = 0 is plain linear attention. Shapes as above, q and k (B, H, T, d) too;
# gate (H,) is g.

def window_weights(q, k, fq, fk, window: int, gate):
    """The (B, H, T, T) unnormalised weights of the hybrid: the readable reference, O(T^2)."""
    T = q.shape[2]
    i, j = torch.arange(T, device=q.device)[:, None], torch.arange(T, device=q.device)[None, :]
    in_window, before = (j <= i) & (j > i - window), j <= i - window  # (T, T)
    s = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~in_window, float("-inf"))
    m = s.amax(-1, keepdim=True).clamp_min(torch.finfo(s.dtype).min)  # finite also when W = 0
    # the two sums of the numerator and denominator, term by term: g exp(s_ij - m_i) and phi(q_i).phi(k_j)
    return gate[:, None, None] * torch.exp(s - m) + (fq @ fk.transpose(-1, -2)) * before


def window_attention_quadratic(q, k, fq, fk, v, window: int, gate):
    weights = window_weights(q, k, fq, fk, window, gate)
    return normalize(weights @ v, weights.sum(-1))


def window_attention_chunked(q, k, fq, fk, v, window: int, gate, chunk_size: int):
    """The same with memory linear in T: each chunk of C queries against the C + W - 1 keys that can be in
    their windows, and the linear part as causal linear attention on keys and values W positions late."""
    B, H, T, d = v.shape
    C, W = chunk_size, window
    # sum_{j<=i-W} phi(q_i).phi(k_j) v_j: key j counts from query j + W on
    late = (F.pad(t, (0, 0, W, 0))[:, :, :T] for t in (fk, v))
    numerator, denominator = linear_attention_chunked_sums(fq, *late, C)
    if W == 0:
        return normalize(numerator, denominator)
    pad = -T % C
    n = (T + pad) // C
    qc = F.pad(q, (0, 0, 0, pad)).view(B, H, n, C, d)  # (B, H, n, C, d)
    kc, vc = (F.pad(t, (0, 0, W - 1, pad)).unfold(2, C + W - 1, C).transpose(-1, -2) for t in (k, v))
    a, b = torch.arange(C, device=q.device)[:, None], torch.arange(C + W - 1, device=q.device)[None, :]
    start = torch.arange(n, device=q.device)[:, None, None] * C - (W - 1)  # position of each block's key 0
    mask = (b >= a) & (b <= a + W - 1) & (start + b >= 0)  # (n, C, C + W - 1): in the window, not padding
    s = (qc @ kc.transpose(-1, -2) / math.sqrt(d)).masked_fill(~mask, float("-inf"))  # (B, H, n, C, C+W-1)
    e = gate[:, None, None, None] * torch.exp(s - s.amax(-1, keepdim=True))  # g exp(s_ij - m_i)
    numerator = numerator + (e @ vc).view(B, H, n * C, d)[:, :, :T]
    denominator = denominator + e.sum(-1).view(B, H, n * C)[:, :, :T]
    return normalize(numerator, denominator)


def window_attention_step(q, k, fq, v, state, window: int, gate, feature_map):
    """One recurrent step (q, k, fq, v: (B, H, .)). The state keeps the last W keys and values in a ring
    buffer and [S | z] of the tokens that have left it: O(W d + k d) per head at every length."""
    t, slot, Sz = state["length"], state["length"] % window, state["Sz"]
    if t >= window:  # token t - W leaves the window: Eq. 6 adds it to S and z
        fk_old = feature_map(state["k"][:, :, slot, None])[0]  # (B, H, 1, k)
        add_to_state(fk_old, F.pad(state["v"][:, :, slot], (0, 1), value=1.0), Sz)
    state["k"][:, :, slot], state["v"][:, :, slot] = k, v
    state["length"] = t + 1
    keys, values = state["k"][:, :, : t + 1], state["v"][:, :, : t + 1]  # the window (all W slots once full)
    s = (keys @ q[..., None])[..., 0] / math.sqrt(q.shape[-1])  # (B, H, min(t + 1, W))
    e = gate[:, None] * torch.exp(s - s.amax(-1, keepdim=True))  # g exp(s_ij - m_i)
    both = (fq[:, :, None] @ Sz)[:, :, 0]  # [numerator | denominator] of the tokens before the window
    return normalize((e[:, :, None] @ values)[:, :, 0] + both[..., :-1], e.sum(-1) + both[..., -1])


# -----------------------------------------------------------------------------
# Multi-head attention modules

class Attention(nn.Module):
    """The affine maps of Eq. 1 (q, k, v) and the output projection, shared by every kind."""

    def __init__(self, d_model: int, n_head: int, causal: bool):
        super().__init__()
        self.n_head, self.d_head, self.causal = n_head, d_model // n_head, causal
        self.q_proj = nn.Linear(d_model, d_model)  # Eq. 1a
        self.k_proj = nn.Linear(d_model, d_model)  # Eq. 1b
        self.v_proj = nn.Linear(d_model, d_model)  # Eq. 1b
        self.out_proj = nn.Linear(d_model, d_model)

    def heads(self, x):
        """(B, T, H * w) -> (B, H, T, w); w is d, or k once `fold` has merged W_phi into W_q, W_k."""
        B, T, _ = x.shape
        return x.view(B, T, self.n_head, -1).transpose(1, 2)

    def project(self, x, source):
        return self.heads(self.q_proj(x)), self.heads(self.k_proj(source)), self.heads(self.v_proj(source))

    def merge(self, out):
        B, H, T, d = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(B, T, H * d))  # (B, T, h)

    # The recurrent form projects one position at a time, with W_q, W_k and W_v stacked head by head: one product
    # gives [q | k | v] of every head, and with append_one a 1 after each v (a row of zero weights, bias 1) for Eq. 6
    # in one product. Stacked by init_state, and again at a step whenever a weight has changed (an optimizer step,
    # load_state_dict, .to(), fold): the tensors' identities, version counters, dtypes and devices say so.
    def stack_projections(self, append_one: bool) -> tuple:
        parts = [self.q_proj, self.k_proj, self.v_proj]
        key = [(id(t), t._version, t.dtype, t.device) for p in parts for t in (p.weight, p.bias)] + [append_one]
        if getattr(self, "stacked_key", None) != key:
            H, h = self.n_head, self.q_proj.in_features
            weights = [p.weight.detach().view(H, -1, h) for p in parts]  # (H, w, h); w is d, or k once folded
            biases = [p.bias.detach().view(H, -1) for p in parts]  # (H, w)
            if append_one:
                weights.append(weights[0].new_zeros(H, 1, h))
                biases.append(biases[0].new_ones(H, 1))
            self.stacked = torch.cat(weights, 1).reshape(-1, h), torch.cat(biases, 1).reshape(-1)
            self.stacked_key = key
        return self.stacked

    def project_step(self, x, append_one: bool):
        """x (B, h) -> [q | k | v (| 1)] per head, (B, H, 2 w + d (+ 1))."""
        # torch.compile cannot trace the check: a compiled step uses the weights as init_state stacked them
        stacked = self.stacked if torch.compiler.is_compiling() else self.stack_projections(append_one)
        return F.linear(x, *stacked).view(x.shape[0], self.n_head, -1)

    def merge_step(self, out):
        """(B, H, d) -> (B, h)"""
        return self.out_proj(out.reshape(out.shape[0], -1))


def softmax_attention(q, k, v, causal: bool, key_mask=None):
    """q (B, H, T, d), k and v (B, H, S, d); key_mask (B, S), True at real (not padded) source positions."""
    mask = None if key_mask is None else key_mask[:, None, None, :]  # (B, 1, 1, S)
    # Eq. 2: out_i = sum_j exp(q_i.k_j / sqrt(d)) v_j / sum_l exp(q_i.k_l / sqrt(d)), one fused kernel
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)


def append_to_cache(state, k, v):
    """Write k, v (B, H, 1, d) at position state['length'] of the KV cache; returns the keys and values so far.
    A full cache doubles its capacity: amortised O(1) per token instead of a copy of the whole cache each step."""
    t = state["length"]
    if t == state["k"].shape[2]:
        for name in ("k", "v"):
            cache = state[name]
            grown = cache.new_zeros(*cache.shape[:2], max(16, 2 * t), cache.shape[3], dtype=k.dtype)
            grown[:, :, :t] = cache
            state[name] = grown
    state["k"][:, :, t], state["v"][:, :, t] = k[:, :, 0], v[:, :, 0]
    state["length"] = t + 1
    return state["k"][:, :, : t + 1], state["v"][:, :, : t + 1]


class SoftmaxAttention(Attention):
    """exp(q.k / sqrt(d)) attention (Eq. 2): the pretrained teacher."""

    def forward(self, x, source=None, key_mask=None):
        q, k, v = self.project(x, x if source is None else source)
        return self.merge(softmax_attention(q, k, v, self.causal and source is None, key_mask))

    def attention_weights(self, x):
        """The causal distributions of Eq. 2 as a (B, H, T, T) matrix, for the analysis of section 4."""
        q, k, _ = self.project(x, x)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.d_head)  # (B, H, T, T)
        T = x.shape[1]
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        return scores.masked_fill(future, float("-inf")).softmax(-1)

    # Recurrent form: a key/value cache that grows with t (append_to_cache).
    def init_state(self, batch_size: int, device, dtype):
        self.stack_projections(append_one=False)
        empty = torch.zeros(batch_size, self.n_head, 0, self.d_head, device=device, dtype=dtype)
        return {"k": empty, "v": empty.clone(), "length": 0}

    def step(self, x, state):  # x (B, h) -> (B, h)
        q, k, v = self.project_step(x, append_one=False)[:, :, None].split(self.d_head, -1)  # (B, H, 1, d)
        keys, values = append_to_cache(state, k, v)
        return self.merge_step(F.scaled_dot_product_attention(q, keys, values))

    def init_cross_state(self, source, key_mask):
        k, v = self.heads(self.k_proj(source)), self.heads(self.v_proj(source))
        return {"k": k, "v": v, "mask": key_mask[:, None, None, :]}

    def step_cross(self, x, state):
        q = self.q_proj(x).view(x.shape[0], self.n_head, 1, -1)  # (B, H, 1, d)
        return self.merge_step(F.scaled_dot_product_attention(q, state["k"], state["v"], attn_mask=state["mask"]))


class LinearAttention(Attention):
    """phi(q).phi(k) attention (Eqs. 3-7) for the t2r, elu and rfa feature maps."""

    def __init__(self, d_model, n_head, causal, kind, feature_size, chunk_size=0, window=0):
        super().__init__(d_model, n_head, causal)
        self.kind, self.chunk_size, self.window = kind, chunk_size, window
        self.feature_size = self.d_head if kind == "elu" else feature_size
        self.feature_map = make_feature_map(kind, n_head, self.d_head, feature_size)
        if window:  # log g of the hybrid, per head: g = 1 at the start
            self.window_gate = nn.Parameter(torch.zeros(n_head))
        self.transfer, self.transfer_error = False, None  # set by attention_transfer

    def forward(self, x, source=None, key_mask=None):
        q, k, v = self.project(x, x if source is None else source)
        if self.transfer:
            return self.transfer_forward(q, k, v, source is not None, key_mask)
        return self.merge(self.attend(q, k, v, source is not None, key_mask).to(x.dtype))

    def attend(self, q, k, v, cross: bool, key_mask=None):
        """The parallel forms: q (B, H, T, d), k and v (B, H, S, d) -> (B, H, T, d), in float32 (float64 for a
        float64 model). d is k for q and k once `fold` has merged W_phi into W_q, W_k."""
        dtype = state_dtype(v.dtype)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        with full_precision(q.device):
            fq, fk = self.feature_map(q, k)
            if cross or not self.causal:
                return linear_attention_noncausal(fq, fk, v, key_mask)
            if self.window:
                gate = self.window_gate.to(dtype).exp()
                if self.chunk_size:
                    return window_attention_chunked(q, k, fq, fk, v, self.window, gate, self.chunk_size)
                return window_attention_quadratic(q, k, fq, fk, v, self.window, gate)
            if self.chunk_size:
                return linear_attention_chunked(fq, fk, v, self.chunk_size)
            return linear_attention_quadratic(fq, fk, v, causal=True)

    def transfer_forward(self, q, k, v, cross: bool, key_mask):
        """The attention-transfer run (see `attention_transfer`): pass on the softmax attention of this layer's own
        q, k, v, the teacher's output exactly, and keep the squared error of the linear attention against it."""
        q, k, v = q.detach(), k.detach(), v.detach()  # the teacher's projections: only phi (and g) learn
        target = softmax_attention(q, k, v, self.causal and not cross, key_mask)  # Eq. 2
        own = self.attend(q, k, v, cross, key_mask)
        self.transfer_error = (own - target.to(own.dtype)).pow(2).mean((1, 3))  # (B, T), mean over heads and d
        return self.merge(target)

    def attention_weights(self, x):
        """The causal weights sim~(q_i, k_j) / sum_l sim~(q_i, k_l) of Eq. 4 (of the hybrid, for window layers)
        as a (B, H, T, T) matrix (float32), for the analysis of section 4. The forms above never build it."""
        if self.window:
            q, k, _ = (t.to(state_dtype(t.dtype)) for t in self.project(x, x))
            with full_precision(x.device):
                fq, fk = self.feature_map(q, k)
                weights = window_weights(q, k, fq, fk, self.window, self.window_gate.to(q.dtype).exp())
                return normalize(weights, weights.sum(-1))
        q, k, _ = (t.to(state_dtype(t.dtype)) for t in self.project(x, x))
        with full_precision(x.device):
            fq, fk = self.feature_map(q, k)
            sim = masked_similarity(fq, fk, causal=True)  # (B, H, T, T)
            return normalize(sim, sim.sum(-1))  # the same epsilon rule as every form

    # Recurrent form: S (k x d) and z (k) per head side by side, [S | z], the same size at every position.
    def init_state(self, batch_size: int, device, dtype):
        self.stack_projections(append_one=True)
        Sz = torch.zeros(batch_size, self.n_head, self.feature_size, self.d_head + 1, device=device,
                         dtype=state_dtype(dtype))  # (B, H, k, d + 1)
        if not self.window:
            return {"Sz": Sz}
        ring = torch.zeros(batch_size, self.n_head, self.window, self.d_head, device=device, dtype=Sz.dtype)
        return {"Sz": Sz, "k": ring, "v": ring.clone(), "length": 0}  # the last W keys and values

    def step(self, x, state):  # x (B, h) -> (B, h)
        Sz, w = state["Sz"], self.q_proj.out_features // self.n_head  # w: d, or k once folded
        qkv1 = self.project_step(x, append_one=True).to(Sz.dtype)[:, :, None]  # (B, H, 1, 2 w + d + 1)
        q, k, v1 = qkv1[..., :w], qkv1[..., w:2 * w], qkv1[..., 2 * w:]
        with full_precision(x.device):
            if self.window:
                (fq,) = self.feature_map(q)
                out = window_attention_step(q[:, :, 0], k[:, :, 0], fq[:, :, 0], v1[:, :, 0, :-1], state,
                                            self.window, self.window_gate.to(q.dtype).exp(), self.feature_map)
            else:
                fq, fk = self.feature_map(q, k)  # (B, H, 1, k)
                out = linear_attention_step(fq, fk, v1, Sz)  # Eqs. 6-7
        return self.merge_step(out.to(x.dtype))

    def init_cross_state(self, source, key_mask):
        """[S | z] of the whole (masked) source, computed once per sentence."""
        k, v = self.heads(self.k_proj(source)), self.heads(self.v_proj(source))
        dtype = state_dtype(v.dtype)
        with full_precision(source.device):
            (fk,) = self.feature_map(k.to(dtype))
            S, z = source_state(fk, v.to(dtype), key_mask)
        return {"Sz": torch.cat([S, z[..., None]], -1)}  # (B, H, k, d + 1)

    def step_cross(self, x, state):
        q = self.q_proj(x).view(x.shape[0], self.n_head, 1, -1)  # (B, H, 1, w)
        with full_precision(x.device):
            (fq,) = self.feature_map(q.to(state["Sz"].dtype))
            out = read_state(fq, state["Sz"])  # Eq. 7
        return self.merge_step(out.to(x.dtype))

    @torch.no_grad()
    def fold_(self):
        """Eq. 8: W~ = W_phi W and b~ = b_phi + W_phi b for queries and keys; phi becomes a plain relu."""
        W_phi, b_phi = self.feature_map.weight, self.feature_map.bias  # (H, k, d), (H, k)
        H, k, d = W_phi.shape
        for name in ("q_proj", "k_proj"):
            proj = getattr(self, name)
            W = proj.weight.view(H, d, -1)  # (H, d, h)
            b = proj.bias.view(H, d, 1)  # (H, d, 1)
            folded = nn.Linear(W.shape[-1], H * k, device=W.device, dtype=W.dtype)
            folded.weight.copy_((W_phi @ W).reshape(H * k, -1))  # Eq. 8c
            folded.bias.copy_((b_phi + (W_phi @ b).squeeze(-1)).reshape(H * k))  # Eq. 8d
            setattr(self, name, folded)
        self.feature_map = FoldedT2RFeatureMap()


def make_attention(kind: str, config: Config, causal: bool, feature_size: int) -> Attention:
    if kind == "softmax":
        return SoftmaxAttention(config.d_model, config.n_head, causal)
    chunk, window = (config.chunk_size, config.window) if causal else (0, 0)
    return LinearAttention(config.d_model, config.n_head, causal, kind, feature_size, chunk, window)


# -----------------------------------------------------------------------------
# Transformer layers

class Block(nn.Module):
    """Self-attention, optional cross attention, feed-forward; each with a residual and a LayerNorm."""

    def __init__(self, config: Config, self_kind: str, causal: bool, cross_kind: str | None = None):
        super().__init__()
        self.pre_norm = config.pre_norm
        self.self_attn = make_attention(self_kind, config, causal, config.feature_size)
        self.norm1 = nn.LayerNorm(config.d_model)
        self.cross_attn = None
        if cross_kind is not None:
            self.cross_attn = make_attention(cross_kind, config, False, config.cross_feature_size)
            self.norm_cross = nn.LayerNorm(config.d_model)
        self.ffn = nn.Sequential(
            nn.Linear(config.d_model, config.d_ff), ACTIVATIONS[config.activation](), nn.Dropout(config.dropout),
            nn.Linear(config.d_ff, config.d_model),
        )
        self.norm2 = nn.LayerNorm(config.d_model)
        self.drop = nn.Dropout(config.dropout)

    def residual(self, x, norm, sublayer):
        if self.pre_norm:
            return x + self.drop(sublayer(norm(x)))
        return norm(x + self.drop(sublayer(x)))

    def forward(self, x, self_mask=None, source=None, source_mask=None):
        """self_mask (B, T): real positions of x (the encoder's padding); source_mask (B, S): of the source."""
        x = self.residual(x, self.norm1, lambda y: self.self_attn(y, key_mask=self_mask))
        if self.cross_attn is not None:
            x = self.residual(x, self.norm_cross, lambda y: self.cross_attn(y, source, source_mask))
        return self.residual(x, self.norm2, self.ffn)

    def step(self, x, state):
        """x: (B, h), one position. The same computation as forward, with the recurrent attention."""
        x = self.residual(x, self.norm1, lambda y: self.self_attn.step(y, state["self"]))
        if self.cross_attn is not None:
            x = self.residual(x, self.norm_cross, lambda y: self.cross_attn.step_cross(y, state["cross"]))
        return self.residual(x, self.norm2, self.ffn)


def sinusoidal_positions(positions, d_model: int):
    """Vaswani et al.'s fixed positions: defined at any position, so the RNN runs past the training length."""
    inv_freq = torch.exp(torch.arange(0, d_model, 2, device=positions.device) * (-math.log(10000.0) / d_model))
    angles = positions.float()[:, None] * inv_freq  # (T, h/2)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).view(len(positions), d_model)  # (T, h)


class Embedding(nn.Module):
    """Token embedding scaled by sqrt(h), plus sinusoidal positions, then dropout. GPT-2's instead: the token
    embedding unscaled, plus a learned table of positions."""

    def __init__(self, config: Config):
        super().__init__()
        self.tok = AdaptiveInput(config) if config.adaptive_cutoffs else nn.Embedding(config.vocab_size, config.d_model)
        # (max_positions, h), GPT-2's wpe; None registers nothing, so sinusoidal models keep their state_dict keys
        self.pos = nn.Embedding(config.max_positions, config.d_model) if config.positions == "learned" else None
        self.d_model, self.scale = config.d_model, math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.drop = nn.Dropout(config.dropout)

    def check_end(self, end: int):
        """Positions 0 .. end - 1 exist: a learned table has no row past its end (sinusoids have no end)."""
        if self.pos is not None and end > self.pos.num_embeddings:
            raise ValueError(f"position {end - 1} is past the {self.pos.num_embeddings} learned positions")

    def forward(self, tokens, start=0):  # tokens: (B, T) from position start (an int or a 0-dim tensor) -> (B, T, h)
        positions = torch.arange(tokens.shape[1], device=tokens.device) + start
        embedded = self.tok(tokens)  # in the table's dtype (the float32 positions would promote bf16)
        if self.pos is None:
            return self.drop((embedded * self.scale + sinusoidal_positions(positions, self.d_model)).to(embedded.dtype))
        if isinstance(start, int):  # a tensor start is checked by its caller (a CUDA graph, once for all its steps)
            self.check_end(start + tokens.shape[1])
        return self.drop(embedded * self.scale + self.pos(positions).to(embedded.dtype))


# -----------------------------------------------------------------------------
# Adaptive input and adaptive softmax (Baevski & Auli, 2019): the paper's WikiText-103 model (section 3.2.1,
# cutoffs 20000 and 60000). The vocabulary, in order of frequency, is cut into bands; band i embeds in
# h / factor^i dimensions and projects them to h, so that rare words cost few parameters. The softmax mirrors it,
# with the same (tied) weights: the head scores the first band's words and one entry per other band,
#   log p(w | x) = log p(band(w) | x) + log p(w | band(w), x)       (a two-level softmax)

def band_edges(config: Config) -> list:
    return list(zip([0, *config.adaptive_cutoffs], [*config.adaptive_cutoffs, config.vocab_size]))


class AdaptiveInput(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.edges = band_edges(config)
        dims = [config.d_model // config.adaptive_factor ** i for i in range(len(self.edges))]
        self.bands = nn.ModuleList(nn.Embedding(hi - lo, d) for (lo, hi), d in zip(self.edges, dims))
        self.projections = nn.ModuleList(nn.Linear(d, config.d_model, bias=False) for d in dims)  # (h, d_i) each

    def forward(self, tokens):  # (B, T) -> (B, T, h)
        out = self.projections[0].weight.new_zeros(*tokens.shape, self.projections[0].out_features)
        for (lo, hi), band, projection in zip(self.edges, self.bands, self.projections):
            inside = (tokens >= lo) & (tokens < hi)
            out = out.index_put((inside,), projection(band(tokens[inside] - lo)).to(out.dtype))
        return out


class AdaptiveSoftmax(nn.Module):
    """Log-probabilities (B, T, V), normalised in float32: what a model's logits are for, since
    softmax(log p) = p, so the loss, sampling and beam search take them unchanged."""

    def __init__(self, config: Config, tied: AdaptiveInput):
        super().__init__()
        self.tied = tied  # the input's embeddings and projections, shared (registered twice, stored once)
        self.band_entries = nn.Linear(config.d_model, len(tied.bands) - 1, bias=False)  # the head's other bands

    def forward(self, x):  # (B, T, h) -> (B, T, V)
        # each band's scores: x projected down to the band's size, against its embeddings: (x W_i) E_i^T
        wide = lambda t: t.to(torch.promote_types(t.dtype, torch.float32))  # float32 at least, under autocast too
        scores = [wide(F.linear(x @ p.weight, e.weight)) for e, p in zip(self.tied.bands, self.tied.projections)]
        head = torch.log_softmax(torch.cat([scores[0], wide(self.band_entries(x))], dim=-1), dim=-1)
        n0 = scores[0].shape[-1]
        tails = [head[..., n0 + i: n0 + i + 1] + torch.log_softmax(s, dim=-1) for i, s in enumerate(scores[1:])]
        return torch.cat([head[..., :n0], *tails], dim=-1)


class TransformerBase(nn.Module):
    """Weight init, the output head and the recurrent state shared by both models."""

    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        self.embed = Embedding(config)
        self.final_norm = nn.LayerNorm(config.d_model) if config.pre_norm else nn.Identity()
        self.lm_head = (AdaptiveSoftmax(config, self.embed.tok) if config.adaptive_cutoffs else
                        nn.Linear(config.d_model, config.vocab_size, bias=False))

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

    def run_layers(self, layers, x, *args):
        for layer in layers:
            if self.training and self.config.layer_dropout > 0 and torch.rand(()) < self.config.layer_dropout:
                continue  # LayerDrop (Fan et al., 2020), as in the paper's WikiText-103 model
            x = layer(x, *args)
        return x

    def output(self, x):
        return self.lm_head(self.final_norm(x))

    @torch.no_grad()
    def step(self, tokens, state):
        """tokens: (B,) at position state['pos'] -> logits (B, V). Updates state in place and returns it.
        state['pos'] is an int, or a 0-dim tensor (a CUDA graph reads it on the device)."""
        x = self.embed(tokens[:, None], start=state["pos"])[:, 0]
        logits = self.step_layers(x, state["layers"])
        state["pos"] += 1
        return logits, state

    def step_layers(self, x, layer_states):
        """x (B, h) of one position through every layer's recurrent form, then the output head: what
        generate.py --compile compiles."""
        for layer, layer_state in zip(self.layers, layer_states):
            x = layer.step(x, layer_state)
        return self.output(x)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


class TransformerLM(TransformerBase):
    """Decoder-only language model: model(tokens) -> logits; init_state / step for generation."""

    def __init__(self, config: Config):
        super().__init__(config)
        self.layers = nn.ModuleList(Block(config, kind, causal=True) for kind in config.layer_kinds())
        self.init_weights()

    def forward(self, tokens):  # (B, T) -> (B, T, V)
        return self.output(self.run_layers(self.layers, self.embed(tokens)))

    @torch.no_grad()
    def init_state(self, batch_size: int):
        p = next(self.parameters())
        return {"pos": 0, "layers": [{"self": layer.self_attn.init_state(batch_size, p.device, p.dtype)}
                                     for layer in self.layers]}



class Seq2SeqTransformer(TransformerBase):
    """Encoder-decoder translator, embeddings shared by source, target and output (joint BPE).
    model(src, tgt_in) -> logits; init_state(src) encodes; step decodes one token."""

    def __init__(self, config: Config):
        super().__init__(config)
        if config.n_encoder_layer < 1:
            raise ValueError("Seq2SeqTransformer needs n_encoder_layer >= 1")
        self.encoder = nn.ModuleList(Block(config, "softmax", causal=False) for _ in range(config.n_encoder_layer))
        self.encoder_norm = nn.LayerNorm(config.d_model) if config.pre_norm else nn.Identity()
        self.layers = nn.ModuleList(Block(config, kind, causal=True, cross_kind=config.cross_attn)
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
        memory, key_mask = self.encode(src)
        p = next(self.parameters())
        return {"pos": 0, "layers": [
            {"self": layer.self_attn.init_state(src.shape[0], p.device, p.dtype),
             "cross": layer.cross_attn.init_cross_state(memory, key_mask)}
            for layer in self.layers]}


def reorder_state(state, index):
    """Select batch rows of a recurrent state (beam search reorders hypotheses)."""
    if torch.is_tensor(state):
        return state.index_select(0, index)
    if isinstance(state, dict):
        return {key: reorder_state(value, index) for key, value in state.items()}
    if isinstance(state, list):
        return [reorder_state(value, index) for value in state]
    return state  # positions and lengths are shared by the whole batch


def state_bytes(state) -> int:
    """Bytes held by the tensors of a recurrent state (a KV cache counts its allocated capacity)."""
    if torch.is_tensor(state):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(value) for value in state.values())
    if isinstance(state, list):
        return sum(state_bytes(value) for value in state)
    return 0


def feature_sizes(config: Config) -> tuple:
    """(k of the converted causal attention, k of the cross attention) as the tables report them, None where
    the attention is softmax (a translator's cross attention; a language model has none). elu has k = d."""
    def k(kinds, size):
        kinds = set(kinds) - {"softmax"}
        return None if not kinds else config.d_model // config.n_head if kinds == {"elu"} else size
    cross = k([config.cross_attn], config.cross_feature_size) if config.n_encoder_layer else None
    return k(config.layer_kinds(), config.feature_size), cross


def build_model(config: Config | dict) -> TransformerBase:
    """The model a config describes: a translator when it has an encoder, else a language model."""
    config = Config(**config) if isinstance(config, dict) else config
    return Seq2SeqTransformer(config) if config.n_encoder_layer else TransformerLM(config)


# -----------------------------------------------------------------------------
# Swap then finetune (section 2.2) and folding (Eq. 8)

KEEP_SOFTMAX_FROM = ("nth", "top")  # the two readings of "every fourth layer from the top is kept"


def converted_kinds(n_layer: int, attn: str, keep_softmax_every: int, keep_softmax_from: str = "nth") -> list:
    """Layer kinds, bottom to top. keep_softmax_every=4 keeps every 4th layer counted from the top as softmax
    (the paper's "T2R 75%"): from "nth", the 4th, 8th, ... from the top; from "top", the top one, the 5th, 9th, ...
    0 converts every layer."""
    if keep_softmax_from not in KEEP_SOFTMAX_FROM:
        raise ValueError(f"keep_softmax_from is one of {KEEP_SOFTMAX_FROM}, not {keep_softmax_from!r}")
    first = keep_softmax_every if keep_softmax_from == "nth" else 1  # the first kept layer, counted from the top

    def keep(i):  # i counts from the bottom; n_layer - i counts from the top, starting at 1
        return keep_softmax_every > 0 and (n_layer - i - first) % keep_softmax_every == 0 and n_layer - i >= first
    kinds = ["softmax" if keep(i) else attn for i in range(n_layer)]
    if keep_softmax_every and "softmax" not in kinds:
        raise ValueError(f"keep_softmax_every={keep_softmax_every} counts past the {n_layer} layers: none stays "
                         f"softmax (use at most {n_layer}, or keep_softmax_from top)")
    return kinds


def is_feature_map_parameter(name: str) -> bool:
    """The parameters a conversion adds: the feature maps, and the window layers' gates."""
    return ".feature_map." in name or name.endswith(".window_gate")


def convert(model: TransformerBase, attn: str = "t2r", feature_size: int | None = None, keep_softmax_every: int = 0,
            cross_feature_size: int = 32, window: int = 0, keep_softmax_from: str = "nth") -> TransformerBase:
    """Swap: a copy of a trained softmax model with its (decoder) attention replaced by `attn`.

    Every pretrained weight is copied; only the feature-map parameters are new. The encoder of a
    translator is left alone; its decoder's causal attention defaults to k=4 and its cross attention to
    k=32, the language model's attention to k=32 (section 3.2). Finetune the result on the task.
    window=W makes every converted causal layer the sliding-window hybrid (softmax over the last W tokens).
    """
    config = model.config
    is_seq2seq = isinstance(model, Seq2SeqTransformer)
    if attn not in ATTENTION_KINDS or attn == "softmax":
        raise ValueError(f"convert to one of t2r, elu, rfa, not {attn!r}")
    if set(config.layer_kinds()) != {"softmax"} or (is_seq2seq and config.cross_attn != "softmax"):
        raise ValueError("this model is already converted: convert starts from a softmax transformer")
    if getattr(model, "folded", False):
        raise ValueError("this model is folded for inference: convert the unfolded model")
    if feature_size is None:
        feature_size = 4 if is_seq2seq else 32
    new_config = replace(
        config, attn=converted_kinds(config.n_layer, attn, keep_softmax_every, keep_softmax_from),
        feature_size=feature_size,
        cross_attn=attn if is_seq2seq else config.cross_attn, cross_feature_size=cross_feature_size, window=window)
    student = type(model)(new_config)
    copy_pretrained(model, student)
    p = next(model.parameters())
    return student.to(device=p.device, dtype=p.dtype).train(model.training)


# -----------------------------------------------------------------------------
# Attention transfer (Hedgehog, Zhang et al. 2024; LoLCATs, Zhang et al. 2025): before finetuning, train only the
# new feature maps so that each converted layer's linear attention reproduces the softmax attention it replaced.
# The swap kept W_q, W_k, W_v, so the target is free: softmax attention on the layer's own q, k, v. Every layer
# passes the target on, so the model runs exactly as the teacher did and each layer learns on the teacher's inputs:
#   loss_l = mean_i || linear_attention_l(q_i, K, V) - softmax_attention_l(q_i, K, V) ||^2 / (H d)

def linear_attention_layers(model: nn.Module) -> list:
    """(name, module) of every linear attention layer, bottom to top (a translator's self, then cross)."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, LinearAttention)]


def attention_transfer(model: nn.Module, *inputs, mask=None):
    """Run a converted model (or its DDP / compiled wrapper) on `inputs` with every linear attention layer passing on
    softmax attention. Returns (errors (L,): each layer's mean squared error, logits: the teacher's exactly).
    mask (B, T): the query positions that count (a translator's real target tokens); None: all of them."""
    layers = [m for _, m in linear_attention_layers(model)]
    if not layers:
        raise ValueError("attention transfer needs a converted model: this one has no linear attention")
    for layer in layers:
        layer.transfer, layer.transfer_error = True, None
    try:
        logits = model(*inputs)
    finally:
        for layer in layers:
            layer.transfer = False
    errors = []
    for layer in layers:
        e, layer.transfer_error = layer.transfer_error, None  # (B, T); None where LayerDrop skipped the layer
        if e is None:
            errors.append(logits.new_zeros((), dtype=torch.float32))
        else:
            errors.append(e.mean() if mask is None else (e * mask).sum() / mask.sum().clamp_min(1))
    return torch.stack(errors), logits


@torch.no_grad()
def copy_pretrained(teacher: nn.Module, student: nn.Module):
    """Copy every teacher tensor into the student, and check that the student's only other tensors
    are feature maps. A mismatch raises instead of silently leaving random weights."""
    source, target = teacher.state_dict(), student.state_dict()
    unused = sorted(set(source) - set(target))
    uncovered = sorted(k for k in set(target) - set(source) if not is_feature_map_parameter(k))
    if unused or uncovered:
        raise ValueError(f"teacher and student do not match: unused {unused[:3]}, not pretrained {uncovered[:3]}")
    for name, tensor in source.items():
        if target[name].shape != tensor.shape:
            raise ValueError(f"{name}: teacher shape {tuple(tensor.shape)}, student {tuple(target[name].shape)}")
        target[name].copy_(tensor)


def fold(model: TransformerBase) -> TransformerBase:
    """A copy for inference with every T2R feature map merged into W_q and W_k (Eq. 8):
    q and k are never formed, and the outputs are unchanged."""
    folded = copy.deepcopy(model).eval()
    for module in folded.modules():
        # a window layer stays as it is: its softmax needs q and k themselves, which folding would not form
        if isinstance(module, LinearAttention) and module.kind == "t2r" and not module.window:
            module.fold_()
    folded.folded = any(isinstance(m, FoldedT2RFeatureMap) for m in folded.modules())
    return folded
