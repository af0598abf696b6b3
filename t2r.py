"""
T2R: Finetuning Pretrained Transformers into RNNs (Kasai et al., EMNLP 2021), in one file, in the paper's order.

A transformer whose attention can be
    softmax : exp(q.k / sqrt(d))                            (Eq. 2, the pretrained teacher)
    t2r     : relu(W_phi q + b_phi) . relu(W_phi k + b_phi) (Eq. 3, a learned ReLU-MLP feature map)
    elu     : (elu(q) + 1) . (elu(k) + 1)                   (Katharopoulos et al., 2020)
    rfa     : random Fourier features of l2-normalised q, k (Peng et al., 2021)
Every kind has a parallel form for training and a recurrent one for generation: the linear kinds keep a state
S (k x d) and z (k) per head (Eqs. 5-7), softmax a KV cache. `convert` is the swap of section 2.2, `fold` merges
the feature map into W_q and W_k (Eq. 8). What came after T2R is in after_t2r.py.

    python train_lm.py --init pretrained      # pretrain softmax, swap to T2R, finetune; python generate.py samples
    python train_mt.py --init pretrained      # the same for a translator's decoder (causal k=4, cross k=32)
    python -m pytest -q test_t2r.py           # the forms agree
Shapes: B batch, T target length, S source length, H heads (r), d head size, k feature size, h = H d, V vocabulary.
"""

import copy
import math
from dataclasses import InitVar, asdict, dataclass, field, replace
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

from support.adaptive import AdaptiveSoftmax
from support.configs import check_config, check_convertible, converted_kinds
from support.embedding import Embedding  # tokens and positions: sinusoids (the paper), learned (GPT-2), rotary (Llama)
from support.llama_layers import RMSNorm, SwiGLU, rotate
from support.states import append_to_cache, full_precision, state_dtype  # a KV cache's growth; float32 sums

ATTENTION_KINDS = ("softmax", "t2r", "elu", "rfa")
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
    window: int = 0                 # causal linear layers attend with softmax to the last W tokens (after_t2r.py)
    n_encoder_layer: int = 0        # encoder layers of Seq2SeqTransformer (its encoder is always softmax)
    cross_attn: str = "softmax"     # the decoder's cross attention kind (Seq2SeqTransformer)
    cross_feature_size: int = 32    # k of the cross attention
    pad_id: int = 0                 # padding token of the source (masked out of the cross attention)
    adaptive_cutoffs: list = field(default_factory=list)  # adaptive input and softmax (support/adaptive.py): the
    #                                 vocabulary bands [0, c1), [c1, c2), ... by frequency; [] for none
    adaptive_factor: int = 4        # band i embeds in d_model / factor^i dimensions
    max_positions: int = 0          # > 0: a learned table of positions, the longest sequence (GPT-2); 0: sinusoids
    activation: str = "relu"        # of the feed-forward hidden layer, or "gelu_tanh" (GPT-2's tanh approximation)
    scale_embedding: bool = True    # token embedding times sqrt(h) (Vaswani et al.); GPT-2 does not scale it
    # The switches of Llama-family checkpoints (the last section; support/hf.py): the defaults are the paper's model
    norm: str = "layernorm"         # or "rmsnorm": x / rms(x) times a gain, no mean, no bias (Zhang & Sennrich 2019)
    norm_eps: float = 1e-5          # the epsilon of every norm
    ffn: str = "mlp"                # or "swiglu": down(silu(gate x) * up x), three maps, no bias (Shazeer 2020)
    bias: str = "all"               # the linear maps with a bias: all; none (Llama); qkv: q, k, v only (Qwen2)
    n_kv_head: int = 0              # key/value heads, each shared by n_head / n_kv_head query heads; 0: n_head
    rope_theta: float = 0.0         # > 0: rotary positions with this base (Su et al. 2021), none added to the input
    rope_scaling: dict | None = None  # the checkpoint's stretch of the rotary frequencies: linear or llama3

    positions: InitVar[str | None] = None  # not kept: "learned" or "sinusoidal", as checkpoints before said it

    def __post_init__(self, positions):
        check_config(self, ATTENTION_KINDS, ACTIVATIONS, positions)  # one-line errors for what cannot be

    def layer_kinds(self) -> list:  # the causal self-attention kind of each decoder layer, bottom to top
        return list(self.attn) if isinstance(self.attn, list) else [self.attn] * self.n_layer

    def kv_width(self) -> int:  # the width of a layer's keys (and of its values): n_kv_head heads of d
        return (self.n_kv_head or self.n_head) * (self.d_model // self.n_head)

    def to_dict(self) -> dict:  # a plain dict, so that checkpoints load with torch.load(weights_only=True)
        return asdict(self)


# -----------------------------------------------------------------------------
# Feature maps phi (Eq. 3): (B, H, T, d) -> (B, H, T, k). One module per attention layer.
# Called as fq, fk = phi(q, k) so that both sides of a head see the same map.

class T2RFeatureMap(nn.Module):
    """The learned single-layer MLP of T2R, one k x d matrix per head."""

    def __init__(self, n_head: int, d_head: int, feature_size: int):
        super().__init__()
        bound = 1 / math.sqrt(d_head)  # nn.Linear's default initialisation, per head
        self.weight = nn.Parameter(torch.empty(n_head, feature_size, d_head).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(n_head, feature_size).uniform_(-bound, bound))

    def phi(self, x):
        weight, bias = self.weight.to(x.dtype), self.bias.to(x.dtype)  # in x's: a bf16 model's step feeds float32
        # Eq. 3b: phi(x) = relu(W_phi x + b_phi), the same MLP for the queries and keys of a head
        return F.relu(torch.einsum("bhtd,hkd->bhtk", x, weight) + bias[:, None, :])

    def forward(self, *xs):
        return tuple(self.phi(x) for x in xs)


class FoldedT2RFeatureMap(nn.Module):
    """What is left of the T2R feature map after `fold`: W_phi now lives inside W_q and W_k (Eq. 8)."""

    def forward(self, *xs):  # Eqs. 8a-8b: phi(q_i) = relu(W~_q x_i + b~_q), the projection gave W~_q x_i + b~_q
        return tuple(F.relu(x) for x in xs)


class EluFeatureMap(nn.Module):
    """phi(x) = elu(x) + 1 (Katharopoulos et al., 2020): positive, no parameters, k = d."""

    def forward(self, *xs):
        return tuple(F.elu(x) + 1 for x in xs)


class RFAFeatureMap(nn.Module):
    """Random feature attention (Peng et al., 2021) with a learned temperature per head. For unit vectors x, y,
    exp(x.y / tau^2) is proportional to a Gaussian kernel, whose random Fourier features are sqrt(1/D) [sin(W x / tau),
    cos(W x / tau)], W ~ N(0, I) of D = k / 2 rows: redrawn at every training forward pass, fixed (a buffer) in eval."""

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


FEATURE_MAPS = {"t2r": T2RFeatureMap, "elu": lambda *sizes: EluFeatureMap(), "rfa": RFAFeatureMap}  # (H, d, k) -> phi


# -----------------------------------------------------------------------------
# Linear attention, Eq. 4: out_i = phi(q_i) . sum_j phi(k_j) (x) v_j  /  phi(q_i) . sum_l phi(k_l)
# Every form takes features fq (B, H, T, k), fk (B, H, S, k), values v (B, H, S, d), in float32 (float64 when given
# float64) even under autocast: S and z sum thousands of positions, and bf16 keeps only 8 significant bits.

def normalize(numerator, denominator):
    """The shared epsilon rule: numerator / max(|denominator|, EPS). For t2r and elu features the denominator is
    >= 0 and abs() changes nothing; rfa's sin/cos features can make it negative, and abs() keeps the weights bounded."""
    return numerator / denominator.abs().clamp_min(EPS).unsqueeze(-1)


def masked_similarity(fq, fk, causal: bool, key_mask=None):
    """The (T, S) similarity matrix of Eq. 4, zero where a query may not look."""
    sim = fq @ fk.transpose(-1, -2)  # (B, H, T, S), sim~(q_i, k_j) = phi(q_i) . phi(k_j)  (Eq. 3a)
    if causal:
        sim = sim * torch.ones(sim.shape[-2:], dtype=torch.bool, device=sim.device).tril()
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


def linear_attention_step(fq, fk, v1, Sz):
    """One recurrent step, Eqs. 6-7, each one product: fq (B, H, G, k), the G queries of each (key/value) head; fk
    (B, H, 1, k); v1 = [v | 1] (B, H, 1, d + 1); Sz = [S | z] (B, H, k, d + 1), updated in place. -> (B, H, G, d)"""
    add_to_state(fk, v1, Sz)
    return read_state(fq, Sz)


def add_to_state(fk, v1, Sz):
    B, H, k, d1 = Sz.shape
    # Eq. 6: S_i = S_{i-1} + phi(k_i) (x) v_i and z_i = z_{i-1} + phi(k_i), as one: [S | z] += phi(k_i) (x) [v_i | 1]
    Sz.addcmul_(fk.view(B, H, k, 1), v1.view(B, H, 1, d1))


def read_state(fq, Sz):
    B, H, k, d1 = Sz.shape
    # Eq. 7: out_i = phi(q_i)^T S_i / phi(q_i)^T z_i, as one: phi(q_i)^T [S | z] = [numerator | denominator]
    both = torch.bmm(fq.reshape(B * H, -1, k), Sz.view(B * H, k, d1)).view(B, H, -1, d1)
    return normalize(both[..., :-1], both[..., -1])


# -----------------------------------------------------------------------------
# Multi-head attention modules

class Attention(nn.Module):
    """The affine maps of Eq. 1 (q, k, v) and the output projection, shared by every kind. n_kv_head < n_head:
    grouped-query attention (Ainslie et al., 2023; Llama's), each key/value head shared by a group of query heads."""

    def __init__(self, d_model: int, n_head: int, causal: bool, bias: str = "all", n_kv_head: int = 0):
        super().__init__()
        self.n_head, self.d_head, self.causal = n_head, d_model // n_head, causal
        self.n_kv_head = n_kv_head or n_head
        self.group = n_head // self.n_kv_head  # G query heads per key/value head
        self.q_proj = nn.Linear(d_model, d_model, bias=bias != "none")  # Eq. 1a
        self.k_proj, self.v_proj = (nn.Linear(d_model, self.n_kv_head * self.d_head, bias=bias != "none")  # Eq. 1b
                                    for _ in range(2))
        self.out_proj = nn.Linear(d_model, d_model, bias=bias == "all")

    def heads(self, x, n: int):  # (B, T, n w) -> (B, n, T, w): w is d, or k once `fold` merged W_phi into W_q, W_k
        return x.view(*x.shape[:2], n, -1).transpose(1, 2)

    def source_heads(self, source):  # (B, S, h) -> k, v (B, n, S, d): n key/value heads
        return self.heads(self.k_proj(source), self.n_kv_head), self.heads(self.v_proj(source), self.n_kv_head)

    def project(self, x, source, rotation=None):
        q, (k, v) = self.heads(self.q_proj(x), self.n_head), self.source_heads(source)
        if rotation is not None:  # rotary positions (a Llama's): q and k turned by their position's angles
            q, k = rotate(q, *rotation), rotate(k, *rotation)
        return q, k, v

    def merge(self, out):  # (B, H, T, d) -> (B, T, h)
        return self.out_proj(out.transpose(1, 2).flatten(2))

    # The recurrent form projects a position with W_q, W_k, W_v stacked by key/value head, one product for
    # [q of its G query heads | k | v (| 1: a zero row, bias 1, for Eq. 6)]; restacked at init_state and after fold.
    def stack_projections(self, append_one: bool):
        n, h, parts = self.n_kv_head, self.q_proj.in_features, (self.q_proj, self.k_proj, self.v_proj)
        weights = [p.weight.detach().view(n, -1, h) for p in parts]  # (n, G w, h), (n, w, h), (n, d, h)
        biases = [bias_of(p).view(n, -1) for p in parts]
        if append_one:
            weights, biases = weights + [weights[0].new_zeros(n, 1, h)], biases + [biases[0].new_ones(n, 1)]
        self.stacked = torch.cat(weights, 1).reshape(-1, h), torch.cat(biases, 1).reshape(-1)
        self.stacked_from = parts

    def project_step(self, x, append_one: bool, rotation=None, dtype=None):
        """(B, h) -> q (B, n, G, w), k (B, n, 1, w), v (B, n, 1, d (+ 1)), in dtype (x's if None)."""
        if getattr(self, "stacked_from", None) != (self.q_proj, self.k_proj, self.v_proj):
            self.stack_projections(append_one)
        qkv = F.linear(x, *self.stacked).view(x.shape[0], self.n_kv_head, 1, -1).to(dtype or x.dtype)  # one cast
        w = self.k_proj.out_features // self.n_kv_head
        q, k, v = qkv.split([self.group * w, w, qkv.shape[-1] - (self.group + 1) * w], -1)
        q = q.view(x.shape[0], self.n_kv_head, self.group, w)
        if rotation is not None:
            q, k = rotate(q, *rotation), rotate(k, *rotation)
        return q, k, v

    def query_step(self, x):  # (B, h) -> (B, n, G, w): each key/value head's G queries (cross attention's step)
        return self.q_proj(x).view(x.shape[0], self.n_kv_head, self.group, -1)

    def merge_step(self, out):  # (B, n, G, d) -> (B, h): head g G + i is query i of key/value head g
        return self.out_proj(out.flatten(1))


def bias_of(linear: nn.Linear):  # its bias, or zeros where it has none (a Llama's)
    return linear.bias.detach() if linear.bias is not None else linear.weight.new_zeros(linear.out_features)


def shared(kv, group: int):  # (B, n, S, .) -> (B, n G, S, .): each key/value head repeated for its G query heads
    return kv if group == 1 else kv.repeat_interleave(group, dim=1)


def softmax_attention(q, k, v, causal: bool, key_mask=None):
    """q (B, H, T, d), k and v (B, n, S, d), n dividing H; key_mask (B, S), True at real (not padded) source
    positions."""
    mask = None if key_mask is None else key_mask[:, None, None, :]  # (B, 1, 1, S)
    k, v = shared(k, q.shape[1] // k.shape[1]), shared(v, q.shape[1] // v.shape[1])
    # Eq. 2: out_i = sum_j exp(q_i.k_j / sqrt(d)) v_j / sum_l exp(q_i.k_l / sqrt(d)), one fused kernel
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)


class SoftmaxAttention(Attention):
    """exp(q.k / sqrt(d)) attention (Eq. 2): the pretrained teacher."""

    def forward(self, x, source=None, key_mask=None, rotation=None):
        q, k, v = self.project(x, x if source is None else source, rotation)
        return self.merge(softmax_attention(q, k, v, self.causal and source is None, key_mask))

    # Recurrent form: a key/value cache that grows with t (append_to_cache), n_kv_head heads.
    def init_state(self, batch_size: int, device, dtype):
        self.stack_projections(append_one=False)
        empty = torch.zeros(batch_size, self.n_kv_head, 0, self.d_head, device=device, dtype=dtype)
        return {"k": empty, "v": empty.clone(), "length": 0}

    def step(self, x, state, rotation=None):  # x (B, h) -> (B, h)
        q, k, v = self.project_step(x, False, rotation)  # q (B, n, G, d): a group's G queries read one cache
        keys, values = append_to_cache(state, k, v)
        return self.merge_step(F.scaled_dot_product_attention(q, keys, values))

    def init_cross_state(self, source, key_mask):
        k, v = self.source_heads(source)
        return {"k": k, "v": v, "mask": key_mask[:, None, None, :]}

    def step_cross(self, x, state):
        q = self.query_step(x)
        return self.merge_step(F.scaled_dot_product_attention(q, state["k"], state["v"], attn_mask=state["mask"]))


class LinearAttention(Attention):
    """phi(q).phi(k) attention (Eqs. 3-7) for the t2r, elu and rfa feature maps. Grouped-query: one feature map per
    key/value head, which its query heads share, so the state holds n_kv_head heads, not n_head. Rotary positions:
    phi reads q and k after their rotation (as LoLCATs does); rotating phi's features instead would make them signed,
    and the normaliser phi(q).z of Eq. 7 could reach zero from below as well as above."""
    foldable = True  # Eq. 8 applies to a t2r layer (after_t2r.py's window layers keep q and k for their softmax)

    def __init__(self, d_model, n_head, causal, kind, feature_size, chunk_size=0, bias="all", n_kv_head=0):
        super().__init__(d_model, n_head, causal, bias, n_kv_head)
        self.kind, self.chunk_size = kind, chunk_size
        self.feature_size = self.d_head if kind == "elu" else feature_size
        self.feature_map = FEATURE_MAPS[kind](self.n_kv_head, self.d_head, feature_size)

    def forward(self, x, source=None, key_mask=None, rotation=None):
        q, k, v = self.project(x, x if source is None else source, rotation)
        return self.merge(self.attend(q, k, v, source is not None, key_mask).to(x.dtype))

    def attend(self, q, k, v, cross: bool, key_mask=None):
        """The parallel forms: q (B, H, T, w), k (B, n, S, w), v (B, n, S, d) -> (B, H, T, d), in float32 at least."""
        q, k, v = (t.to(state_dtype(v.dtype)) for t in (q, k, v))
        with full_precision(q.device):
            fq, fk = self.features(q, k)
            fk, v = shared(fk, self.group), shared(v, self.group)
            if cross or not self.causal:
                return linear_attention_noncausal(fq, fk, v, key_mask)
            return self.causal_form(q, k, fq, fk, v)

    def features(self, q, k):  # phi(q) (B, H, T, k), each query head by its key/value head's map; phi(k) (B, n, S, k)
        B, H, T, w = q.shape
        fq, fk = self.feature_map(q.reshape(B, self.n_kv_head, self.group * T, w), k)
        return fq.reshape(B, H, T, -1), fk

    def causal_form(self, q, k, fq, fk, v):
        if self.chunk_size:
            return linear_attention_chunked(fq, fk, v, self.chunk_size)
        return linear_attention_quadratic(fq, fk, v, causal=True)

    # Recurrent form: S (k x d) and z (k) per key/value head side by side, [S | z], the same size at every position.
    def init_state(self, batch_size: int, device, dtype):
        self.stack_projections(append_one=True)
        return {"Sz": torch.zeros(batch_size, self.n_kv_head, self.feature_size, self.d_head + 1, device=device,
                                  dtype=state_dtype(dtype))}  # (B, n, k, d + 1)

    def step(self, x, state, rotation=None):  # x (B, h) -> (B, h)
        q, k, v1 = self.project_step(x, True, rotation, state["Sz"].dtype)  # v1 = [v | 1], in the state's precision
        with full_precision(x.device):
            out = self.recur(q, k, v1, state)
        return self.merge_step(out.to(x.dtype))

    def recur(self, q, k, v1, state):  # q (B, n, G, w), k (B, n, 1, w), v1 (B, n, 1, d + 1) -> (B, n, G, d)
        fq, fk = self.feature_map(q, k)
        return linear_attention_step(fq, fk, v1, state["Sz"])  # Eqs. 6-7

    def init_cross_state(self, source, key_mask):
        """[S | z] of the whole (masked) source, computed once per sentence."""
        (k, v), dtype = self.source_heads(source), state_dtype(source.dtype)
        with full_precision(source.device):
            (fk,) = self.feature_map(k.to(dtype))
            S, z = source_state(fk, v.to(dtype), key_mask)
        return {"Sz": torch.cat([S, z[..., None]], -1)}  # (B, n, k, d + 1)

    def step_cross(self, x, state):
        q = self.query_step(x)
        with full_precision(x.device):
            (fq,) = self.feature_map(q.to(state["Sz"].dtype))
            out = read_state(fq, state["Sz"])  # Eq. 7
        return self.merge_step(out.to(x.dtype))


def make_attention(kind: str, config: Config, causal: bool, feature_size: int) -> Attention:
    if kind == "softmax":
        return SoftmaxAttention(config.d_model, config.n_head, causal, config.bias, config.n_kv_head)
    if causal and config.window:  # the sliding-window hybrid, which came after T2R
        from after_t2r import WindowAttention
        return WindowAttention(config.d_model, config.n_head, kind, feature_size, config.chunk_size, config.window,
                               config.bias)
    return LinearAttention(config.d_model, config.n_head, causal, kind, feature_size,
                           config.chunk_size if causal else 0, config.bias, config.n_kv_head)


# -----------------------------------------------------------------------------
# The transformer: layers, embeddings, the language model and the translator

class Block(nn.Module):
    """Self-attention, optional cross attention, feed-forward; each with a residual and a LayerNorm (or RMSNorm)."""

    def __init__(self, config: Config, self_kind: str, causal: bool, cross_kind: str | None = None):
        super().__init__()
        self.pre_norm = config.pre_norm
        self.self_attn = make_attention(self_kind, config, causal, config.feature_size)
        self.norm1 = make_norm(config)
        self.cross_attn = cross_kind and make_attention(cross_kind, config, False, config.cross_feature_size)
        self.norm_cross = make_norm(config) if cross_kind else None
        self.ffn = make_ffn(config)
        self.norm2 = make_norm(config)
        self.drop = nn.Dropout(config.dropout)

    def residual(self, x, norm, sublayer):
        return x + self.drop(sublayer(norm(x))) if self.pre_norm else norm(x + self.drop(sublayer(x)))

    def forward(self, x, self_mask=None, source=None, source_mask=None, rotation=None):
        """self_mask (B, T): real positions of x (the encoder's padding); source_mask (B, S): of the source;
        rotation: the rotary angles of x's positions (Embedding.rotation), None without rotary positions."""
        x = self.residual(x, self.norm1, lambda y: self.self_attn(y, key_mask=self_mask, rotation=rotation))
        if self.cross_attn is not None:
            x = self.residual(x, self.norm_cross, lambda y: self.cross_attn(y, source, source_mask))
        return self.residual(x, self.norm2, self.ffn)

    def step(self, x, state, rotation=None):
        """x: (B, h), one position. The same computation as forward, with the recurrent attention."""
        x = self.residual(x, self.norm1, lambda y: self.self_attn.step(y, state["self"], rotation))
        if self.cross_attn is not None:
            x = self.residual(x, self.norm_cross, lambda y: self.cross_attn.step_cross(y, state["cross"]))
        return self.residual(x, self.norm2, self.ffn)


class TransformerBase(nn.Module):
    """Weight init, the output head and the recurrent state shared by both models."""

    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        self.embed = Embedding(config)
        self.final_norm = make_norm(config) if config.pre_norm else nn.Identity()
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

    def run_layers(self, layers, x, *args, **kwargs):
        for layer in layers:
            if self.training and self.config.layer_dropout > 0 and torch.rand(()) < self.config.layer_dropout:
                continue  # LayerDrop (Fan et al., 2020), as in the paper's WikiText-103 model
            x = layer(x, *args, **kwargs)
        return x

    def output(self, x):
        return self.lm_head(self.final_norm(x))

    @torch.no_grad()
    def step(self, tokens, state):
        """tokens (B,) at position state['pos'] (an int, or a 0-dim tensor a CUDA graph reads) -> logits (B, V);
        updates the state in place and returns it. Generation's form: dropout would apply in training mode."""
        if self.training:
            raise ValueError("step generates: call model.eval() first (in training mode dropout would apply)")
        x = self.embed(tokens[:, None], start=state["pos"])[:, 0]
        logits = self.step_layers(x, state["layers"], self.embed.rotation(1, state["pos"], x.dtype))
        state["pos"] += 1
        return logits, state

    def step_layers(self, x, layer_states, rotation=None):
        """x (B, h) of one position through every layer's recurrent form and the head (what --compile compiles)."""
        for layer, layer_state in zip(self.layers, layer_states):
            x = layer.step(x, layer_state, rotation)
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
        x = self.embed(tokens)
        rotation = self.embed.rotation(tokens.shape[1], 0, x.dtype)  # None without rotary positions
        return self.output(self.run_layers(self.layers, x, rotation=rotation))

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
        self.encoder_norm = make_norm(config) if config.pre_norm else nn.Identity()
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
        (memory, key_mask), p = self.encode(src), next(self.parameters())
        return {"pos": 0, "layers": [{"self": layer.self_attn.init_state(src.shape[0], p.device, p.dtype),
                                      "cross": layer.cross_attn.init_cross_state(memory, key_mask)}
                                     for layer in self.layers]}


# -----------------------------------------------------------------------------
# Swap then finetune (section 2.2)

def is_feature_map_parameter(name: str) -> bool:  # the parameters a conversion adds (and the window layers' gates)
    return ".feature_map." in name or name.endswith(".window_gate")


def convert(model: TransformerBase, attn: str = "t2r", feature_size: int | None = None, keep_softmax_every: int = 0,
            cross_feature_size: int = 32, window: int = 0, keep_softmax_from: str = "nth") -> TransformerBase:
    """Swap: a copy of a trained softmax model, every weight copied, its (decoder) attention replaced by `attn` with new
    feature maps. A translator's encoder stays; its decoder's causal k defaults to 4, cross k to 32, an LM's k to 32
    (section 3.2). Finetune the result. window=W: the sliding-window hybrid (after_t2r.py)."""
    config = model.config
    is_seq2seq = isinstance(model, Seq2SeqTransformer)
    check_convertible(config, attn, ATTENTION_KINDS, is_seq2seq, is_folded(model))  # one-line errors
    feature_size = feature_size or (4 if is_seq2seq else 32)
    new_config = replace(config, attn=converted_kinds(config.n_layer, attn, keep_softmax_every, keep_softmax_from),
                         feature_size=feature_size, cross_attn=attn if is_seq2seq else config.cross_attn,
                         cross_feature_size=cross_feature_size, window=window)
    student = type(model)(new_config)
    copy_pretrained(model, student)
    p = next(model.parameters())
    return student.to(device=p.device, dtype=p.dtype).train(model.training)


@torch.no_grad()
def copy_pretrained(teacher: nn.Module, student: nn.Module):
    """Copy every teacher tensor into the student, whose only other tensors may be feature maps (else ValueError)."""
    source, target = teacher.state_dict(), student.state_dict()
    unused = sorted(set(source) - set(target))
    uncovered = sorted(k for k in set(target) - set(source) if not is_feature_map_parameter(k))
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
    phi = attn.feature_map
    for name, H in (("q_proj", attn.n_head), ("k_proj", attn.n_kv_head)):  # a query head takes its group's W_phi
        W_phi, b_phi = (p.repeat_interleave(H // attn.n_kv_head, 0) for p in (phi.weight, phi.bias))
        _, k, d = W_phi.shape  # W_phi (H, k, d), b_phi (H, k)
        proj = getattr(attn, name)
        W, b = proj.weight.view(H, d, -1), bias_of(proj).view(H, d, 1)  # (H, d, h), (H, d, 1)
        folded = nn.Linear(W.shape[-1], H * k, device=W.device, dtype=W.dtype)
        folded.weight.copy_((W_phi @ W).reshape(H * k, -1))  # Eq. 8c
        folded.bias.copy_((b_phi + (W_phi @ b).squeeze(-1)).reshape(H * k))  # Eq. 8d
        setattr(attn, name, folded)
    attn.feature_map = FoldedT2RFeatureMap()


def fold(model: TransformerBase) -> TransformerBase:
    """A copy for inference with every T2R feature map merged into W_q and W_k: the outputs are unchanged. With
    rotary positions the rotation sits between W_q and W_phi (phi reads the rotated q): nothing folds."""
    folded = copy.deepcopy(model).eval()
    for module in folded.modules() if not model.config.rope_theta else []:
        if isinstance(module, LinearAttention) and module.kind == "t2r" and module.foldable:
            fold_feature_map(module)
    return folded


def is_folded(model: nn.Module) -> bool:
    return any(isinstance(m, FoldedT2RFeatureMap) for m in model.modules())


# -----------------------------------------------------------------------------
# The models people bring: Config's last fields switch on a Llama's RMSNorm, SwiGLU (support/llama_layers.py)

def make_norm(config: Config) -> nn.Module:
    if config.norm == "rmsnorm":
        return RMSNorm(config.d_model, config.norm_eps)
    return nn.LayerNorm(config.d_model, eps=config.norm_eps)


def make_ffn(config: Config) -> nn.Module:
    if config.ffn == "swiglu":
        return SwiGLU(config)
    bias = config.bias == "all"
    return nn.Sequential(nn.Linear(config.d_model, config.d_ff, bias=bias), ACTIVATIONS[config.activation](),
                         nn.Dropout(config.dropout), nn.Linear(config.d_ff, config.d_model, bias=bias))
