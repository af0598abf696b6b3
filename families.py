"""
The transformers people bring, beside the paper's (t2r.py): GPT-2 (learned positions, the tanh GELU, an unscaled
embedding) and the Llama family (Llama, Qwen2, Mistral, SmolLM2: RMSNorm, SwiGLU, rotary positions, grouped-query
heads, their bias modes). FamilyLM is t2r.TransformerLM with other parts; support/hf.py reads a Hugging Face folder
into it, and t2r.convert and t2r.fold take it as they take the paper's model. With its config's defaults it is the
paper's model.

    python train_lm.py --init pretrained --pretrained hf:gpt2      # or hf:HuggingFaceTB/SmolLM2-135M
    python -m pytest -q tests/test_hf.py tests/test_hf_llama.py tests/test_model_switches.py
Shapes as in t2r.py; n key/value heads, G = H / n query heads share each.
"""

import math
from dataclasses import InitVar, dataclass
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

from layers.embedding import Embedding
from layers.states import append_to_cache, causal_after, full_precision, prefill_piece, state_dtype, widened
from layers.states import add_to_state, read_sums, stacked_by_head  # the grouped step's: the fused [S | z] (below)
from t2r import (PREFILL_CHUNK, Attention, Block, Config, FoldedT2RFeatureMap, LinearAttention, SoftmaxAttention,
                 TransformerBase, TransformerLM, linear_attention_chunked_sums, linear_attention_noncausal, normalize,
                 softmax_attention, source_state)

ACTIVATIONS = {"relu": nn.ReLU, "gelu_tanh": partial(nn.GELU, approximate="tanh")}  # of the feed-forward layer
SWITCHES = {"norm": ("layernorm", "rmsnorm"), "ffn": ("mlp", "swiglu"), "bias": ("all", "none", "qkv"),
            "activation": tuple(ACTIVATIONS)}
ROPE_SCALING = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                                  "original_max_position_embeddings")}
POSITIONS = ("sinusoidal", "learned")


@dataclass
class FamilyConfig(Config):
    max_positions: int = 0          # > 0: a learned table of positions, the longest sequence (GPT-2); 0: sinusoids
    activation: str = "relu"        # of the feed-forward hidden layer, or "gelu_tanh" (GPT-2's tanh approximation)
    scale_embedding: bool = True    # token embedding times sqrt(h) (Vaswani et al.); GPT-2 and Llama do not scale it
    norm: str = "layernorm"         # or "rmsnorm": x / rms(x) times a gain, no mean, no bias (Zhang & Sennrich 2019)
    norm_eps: float = 1e-5          # the epsilon of every norm
    ffn: str = "mlp"                # or "swiglu": down(silu(gate x) * up x), three maps, no bias (Shazeer 2020)
    bias: str = "all"               # the linear maps with a bias: all; none (Llama); qkv: q, k, v only (Qwen2)
    n_kv_head: int = 0              # key/value heads, each shared by n_head / n_kv_head query heads; 0: n_head
    rope_theta: float = 0.0         # > 0: rotary positions with this base (Su et al. 2021), none added to the input
    rope_scaling: dict | None = None  # the checkpoint's stretch of the rotary frequencies: linear or llama3
    positions: InitVar[str | None] = None  # not kept: "learned" or "sinusoidal", as checkpoints before said it

    def __post_init__(self, positions=None):
        super().__post_init__()
        check_family(self, positions)

    def kv_width(self) -> int:  # the width of a layer's keys (and of its values): n_kv_head heads of d
        return (self.n_kv_head or self.n_head) * (self.d_model // self.n_head)

    def is_grouped(self) -> bool:  # whether attention needs more than t2r.py's: grouped heads, rotation, other biases
        return self.n_kv_head not in (0, self.n_head) or self.rope_theta > 0 or self.bias != "all"


def is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_family(c: FamilyConfig, positions: str | None):
    """Raise ValueError, in one line, for family switches that cannot be built."""
    for name, values in SWITCHES.items():
        if getattr(c, name) not in values:
            raise ValueError(f"{name}={getattr(c, name)!r}: choose one of {', '.join(values)}")
    if positions is not None and positions not in POSITIONS:
        raise ValueError(f"positions={positions!r}: choose one of {', '.join(POSITIONS)}")
    if not isinstance(c.max_positions, int) or c.max_positions < 0:
        raise ValueError(f"max_positions={c.max_positions!r} must be an integer >= 0")
    if positions is not None and (positions == "learned") != (c.max_positions > 0):
        raise ValueError(f"max_positions={c.max_positions} with {positions} positions: a learned table "
                         f"needs its length (> 0), sinusoidal positions take 0 (they have no end)")
    if not isinstance(c.scale_embedding, bool):
        raise ValueError(f"scale_embedding={c.scale_embedding!r} must be True or False")
    if not is_number(c.norm_eps) or not c.norm_eps > 0:
        raise ValueError(f"norm_eps={c.norm_eps!r} must be a positive number")
    if not isinstance(c.n_kv_head, int) or c.n_kv_head < 0 or c.n_kv_head and c.n_head % c.n_kv_head:
        raise ValueError(f"n_kv_head={c.n_kv_head!r} must divide n_head={c.n_head} (0: as many as n_head)")
    if not is_number(c.rope_theta) or c.rope_theta < 0:
        raise ValueError(f"rope_theta={c.rope_theta!r} must be a number >= 0 (0: no rotary positions)")
    if c.n_encoder_layer and (c.is_grouped() or c.norm != "layernorm" or c.ffn != "mlp"):
        raise ValueError("the checkpoint families are language models: their switches take no encoder")
    if c.rope_theta and (c.max_positions or c.n_encoder_layer or (c.d_model // c.n_head) % 2):
        raise ValueError("rotary positions (rope_theta > 0) are a language model's only positions, on heads of even "
                         "size: set max_positions 0, no encoder")
    scaling = c.rope_scaling
    if scaling is not None:
        needs = ROPE_SCALING.get(scaling.get("rope_type") if isinstance(scaling, dict) else None)
        if needs is None or not all(is_number(scaling.get(key)) and scaling[key] > 0 for key in needs) or \
                scaling.get("rope_type") == "llama3" and not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
            raise ValueError(f"rope_scaling={scaling!r}: supported are rope_type linear (factor) and llama3 "
                             f"({', '.join(ROPE_SCALING['llama3'])}), each a positive number, high above low)")


# -----------------------------------------------------------------------------
# Norms, feed-forward layers and positions

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

    def __init__(self, config: FamilyConfig):
        super().__init__()
        self.gate, self.up = (nn.Linear(config.d_model, config.d_ff, bias=False) for _ in range(2))
        self.down = nn.Linear(config.d_ff, config.d_model, bias=False)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.down(self.drop(F.silu(self.gate(x)) * self.up(x)))


def rope_frequencies(config: FamilyConfig) -> torch.Tensor:
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


class FamilyEmbedding(Embedding):
    """The paper's embedding, or GPT-2's (unscaled, a learned table of positions), or a Llama's (unscaled, nothing
    added: `rotation` gives its attention layers the rotary angles instead)."""

    def __init__(self, config: FamilyConfig):
        super().__init__(config)
        # (max_positions, h), GPT-2's wpe; None registers nothing, so sinusoidal models keep their state_dict keys
        self.pos = nn.Embedding(config.max_positions, config.d_model) if config.max_positions else None
        self.scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.rotary = config.rope_theta > 0
        if self.rotary:  # (d / 2,) angles per position; not saved (persistent=False): the config says them
            self.register_buffer("inv_freq", rope_frequencies(config), persistent=False)

    def check_end(self, end: int):  # positions 0 .. end - 1 exist: a learned table has no row past its end
        if self.pos is not None and end > self.pos.num_embeddings:
            raise ValueError(f"position {end - 1} is past the {self.pos.num_embeddings} learned positions")

    def forward(self, tokens, start=0):  # tokens: (B, T) from position start (an int or a 0-dim tensor) -> (B, T, h)
        if self.pos is None and not self.rotary:  # sinusoids: the paper's (a window hybrid's model, a scaled one)
            return super().forward(tokens, start)
        embedded = self.tok(tokens) * self.scale
        if not self.rotary:
            if isinstance(start, int):  # a tensor start is checked by its caller (a CUDA graph, once for all steps)
                self.check_end(start + tokens.shape[1])
            embedded = embedded + self.pos(torch.arange(tokens.shape[1], device=tokens.device) + start).to(embedded.dtype)
        return self.drop(embedded) if self.training else embedded

    def rotation(self, length: int, start=0, dtype=torch.float32):
        """(cos, sin), each (length, d), of positions start .. start + length - 1; None without rotary positions."""
        if not self.rotary:
            return None
        return rotary_angles(torch.arange(length, device=self.inv_freq.device) + start, self.inv_freq, dtype)


# -----------------------------------------------------------------------------
# Grouped-query attention (Ainslie et al., 2023) with the checkpoints' biases and rotary positions. Its recurrent
# step is its own, fused (layers/states.py's pieces, as support/fast_step.py's): [S | z] of n heads, q, k, v from one
# stacked product, and the G query heads of a key/value head reading its state at once.

def bias_of(linear: nn.Linear):  # its bias, or zeros where it has none (a Llama's)
    return linear.bias.detach() if linear.bias is not None else linear.weight.new_zeros(linear.out_features)


def shared(kv, group: int):  # (B, n, S, .) -> (B, n G, S, .): each key/value head repeated for its G query heads
    return kv if group == 1 else kv.repeat_interleave(group, dim=1)


class GroupedAttention(Attention):
    """Eq. 1's maps with n key/value heads, each shared by G query heads; q and k turned by rotary angles."""

    def projections(self, config: FamilyConfig) -> list:
        self.n_kv_head = config.n_kv_head or config.n_head
        self.group = config.n_head // self.n_kv_head  # G query heads per key/value head
        h, width, bias = config.d_model, self.n_kv_head * self.d_head, config.bias != "none"
        return [nn.Linear(h, h, bias=bias), nn.Linear(h, width, bias=bias), nn.Linear(h, width, bias=bias),
                nn.Linear(h, h, bias=config.bias == "all")]

    def project(self, x, source, rotation=None):  # -> q (B, H, T, w), k (B, n, S, w), v (B, n, S, d)
        q = self.heads(self.q_proj(x))
        k, v = (t.view(*t.shape[:2], self.n_kv_head, -1).transpose(1, 2) for t in (self.k_proj(source),
                                                                                     self.v_proj(source)))
        if rotation is not None:  # phi reads q and k after their rotation (as LoLCATs does): rotating phi's
            q, k = rotate(q, *rotation), rotate(k, *rotation)  # features would make them signed
        return q, k, v

    def stack_projections(self, append_one: bool):  # by key/value head: [q of its G query heads | k | v (| 1)]
        self.stacked_from = (self.q_proj, self.k_proj, self.v_proj)
        self.stacked = stacked_by_head(self.stacked_from, self.n_kv_head, append_one)

    def project_step(self, x, append_one: bool, rotation=None):
        """(B, h) -> q (B, n, G, w), k (B, n, 1, w), v (B, n, 1, d (+ 1))."""
        if getattr(self, "stacked_from", None) != (self.q_proj, self.k_proj, self.v_proj):
            self.stack_projections(append_one)
        qkv = F.linear(x, *self.stacked).view(x.shape[0], self.n_kv_head, 1, -1)
        w = self.k_proj.out_features // self.n_kv_head
        q, k, v = qkv.split([self.group * w, w, qkv.shape[-1] - (self.group + 1) * w], -1)
        q = q.view(x.shape[0], self.n_kv_head, self.group, w)
        if rotation is not None:
            q, k = rotate(q, *rotation), rotate(k, *rotation)
        return q, k, v

    def merge_step(self, out):  # (B, n, G, d) -> (B, h)
        return self.out_proj(out.flatten(1))


class GroupedSoftmaxAttention(GroupedAttention, SoftmaxAttention):
    def forward(self, x, source=None, key_mask=None, rotation=None):
        q, k, v = self.project(x, x, rotation)
        return self.merge(softmax_attention(q, shared(k, self.group), shared(v, self.group), self.causal, key_mask))

    def init_state(self, batch_size: int, device, dtype):  # a KV cache of n heads
        self.stack_projections(append_one=False)
        empty = torch.zeros(batch_size, self.n_kv_head, 0, self.d_head, device=device, dtype=dtype)
        return {"k": empty, "v": empty.clone(), "length": 0}

    def step(self, x, state, rotation=None):  # q (B, n, G, d): a group's G queries read one cache
        q, k, v = self.project_step(x, False, rotation)
        return self.merge_step(F.scaled_dot_product_attention(q, *append_to_cache(state, k, v)))

    def prefill(self, x, state, rotation=None):  # t2r.SoftmaxAttention.prefill, the cache holding n heads
        q, k, v = self.project(x, x, rotation)
        before, T = state["length"], x.shape[1]
        keys, values = (shared(t, self.group) for t in append_to_cache(state, k, v))
        return self.merge(F.scaled_dot_product_attention(q, keys, values, **causal_after(before, T, x.device)))


class GroupedLinearAttention(GroupedAttention, LinearAttention):
    """One feature map per key/value head, which its query heads share: the state holds n heads, not H."""

    def __init__(self, config: FamilyConfig, causal: bool, kind: str, feature_size: int):
        super().__init__(config, causal, kind, feature_size)  # one map per key/value head, built once
        self.rotary = config.rope_theta > 0

    def forward(self, x, source=None, key_mask=None, rotation=None):
        q, k, v = self.project(x, x, rotation)
        return self.merge(self.attend(q, k, v, False, key_mask).to(x.dtype))

    def attend(self, q, k, v, cross: bool, key_mask=None):
        (B, H, T, w), n = q.shape, self.n_kv_head
        fq, fk = self.feature_map(q.reshape(B, n, self.group * T, w), k)  # each query head by its group's map
        fq, fk, v = fq.reshape(B, H, T, -1), shared(fk, self.group), shared(v, self.group)
        with full_precision(q.device):
            if cross or not self.causal:
                return linear_attention_noncausal(*widened(fq, fk, v), key_mask)
            return self.causal_form(q, k, *widened(fq, fk, v))

    def init_state(self, batch_size: int, device, dtype):  # [S | z] of n heads
        self.stack_projections(append_one=True)
        return {"Sz": torch.zeros(batch_size, self.n_kv_head, self.feature_size, self.d_head + 1, device=device,
                                  dtype=state_dtype(dtype))}

    def step(self, x, state, rotation=None):
        q, k, v1 = self.project_step(x, True, rotation)
        fq, fk = self.feature_map(q, k)
        with full_precision(x.device):
            fq, fk, v1 = widened(fq, fk, v1)
            add_to_state(fk, v1, state["Sz"])  # Eq. 6
            out = normalize(*read_sums(fq, state["Sz"]))  # Eq. 7, the G queries of each key/value head at once
        return self.merge_step(out.to(x.dtype))

    def prefill(self, x, state, rotation=None):  # t2r.linear_attention_prefill with n heads of state, G queries each
        q, k, v = self.project(x, x, rotation)
        (B, H, T, w), n, Sz = q.shape, self.n_kv_head, state["Sz"]
        fq, fk = self.feature_map(q.reshape(B, n, self.group * T, w), k)  # each query head by its group's map
        with full_precision(x.device):
            fq, fk, v = (t.to(Sz.dtype) for t in (fq, fk, v))
            numerator, denominator = linear_attention_chunked_sums(  # Eq. 4 within the prompt
                fq.reshape(B, H, T, -1), shared(fk, self.group), shared(v, self.group), self.chunk_size or T)
            before = (fq @ Sz).reshape(B, H, T, -1)  # Eq. 7: each query head reads its group's [S | z]
            S, z = source_state(fk, v)  # Eq. 5 over the prompt, n heads
            Sz += torch.cat([S, z[..., None]], -1)
            out = normalize(numerator + before[..., :-1], denominator + before[..., -1])
        return self.merge(out.to(x.dtype))

    @torch.no_grad()
    def fold(self):  # Eq. 8, a query head taking its group's W_phi; with rotary positions the rotation sits between
        if self.rotary:  # W_q and W_phi (phi reads the rotated q): nothing folds
            return
        phi = self.feature_map
        for name, H in (("q_proj", self.n_head), ("k_proj", self.n_kv_head)):
            W_phi, b_phi = (p.repeat_interleave(H // self.n_kv_head, 0) for p in (phi.weight, phi.bias))
            (_, k, d), proj = W_phi.shape, getattr(self, name)
            W, b = proj.weight.view(H, d, -1), bias_of(proj).view(H, d, 1)
            folded = nn.Linear(W.shape[-1], H * k, device=W.device, dtype=W.dtype)
            folded.weight.copy_((W_phi @ W).reshape(H * k, -1))  # Eq. 8c
            folded.bias.copy_((b_phi + (W_phi @ b).squeeze(-1)).reshape(H * k))  # Eq. 8d
            setattr(self, name, folded)
        self.feature_map = FoldedT2RFeatureMap()


# -----------------------------------------------------------------------------
# The language model

class FamilyBlock(Block):
    """t2r.Block of a language model, its attention given the rotary angles of the positions."""

    def forward(self, x, rotation=None):
        x = self.residual(x, self.norm1, lambda y: self.self_attn(y, **rotary(rotation)))
        return self.residual(x, self.norm2, self.ffn)

    def step(self, x, state, rotation=None):
        x = self.residual(x, self.norm1, lambda y: self.self_attn.step(y, state["self"], **rotary(rotation)))
        return self.residual(x, self.norm2, self.ffn)

    def prefill(self, x, state, rotation=None):
        x = self.residual(x, self.norm1, lambda y: self.self_attn.prefill(y, state["self"], **rotary(rotation)))
        return self.residual(x, self.norm2, self.ffn)


def rotary(rotation) -> dict:  # the keyword an attention layer takes only where there are rotary positions
    return {} if rotation is None else {"rotation": rotation}


class FamilyLM(TransformerLM):
    """t2r.TransformerLM made of the parts a FamilyConfig names."""

    def make_embedding(self):
        return FamilyEmbedding(self.config)

    def make_attention(self, kind: str, causal: bool, feature_size: int):
        if not self.config.is_grouped():
            return super().make_attention(kind, causal, feature_size)
        if kind == "softmax":
            return GroupedSoftmaxAttention(self.config, causal)
        return GroupedLinearAttention(self.config, causal, kind, feature_size)

    def make_norm(self):
        if self.config.norm == "rmsnorm":
            return RMSNorm(self.config.d_model, self.config.norm_eps)
        return nn.LayerNorm(self.config.d_model, eps=self.config.norm_eps)

    def make_ffn(self):
        c, bias = self.config, self.config.bias == "all"
        if c.ffn == "swiglu":
            return SwiGLU(c)
        return nn.Sequential(nn.Linear(c.d_model, c.d_ff, bias=bias), ACTIVATIONS[c.activation](),
                             nn.Dropout(c.dropout), nn.Linear(c.d_ff, c.d_model, bias=bias))

    def __init__(self, config: FamilyConfig):  # t2r.TransformerLM's, its blocks given the rotary angles
        TransformerBase.__init__(self, config)
        self.layers = nn.ModuleList(FamilyBlock(config, self, kind, causal=True) for kind in config.layer_kinds())
        self.init_weights()

    def forward(self, tokens):  # (B, T) -> (B, T, V)
        x = self.embed(tokens)
        return self.output(self.run_layers(self.layers, x, rotation=self.embed.rotation(tokens.shape[1], 0, x.dtype)))

    @torch.no_grad()
    def step(self, tokens, state):  # t2r.TransformerBase.step, with the rotary angles of the position
        if self.training:
            raise ValueError("step generates: call model.eval() first (in training mode dropout would apply)")
        x = self.embed(tokens[:, None], start=state["pos"])[:, 0]
        logits = self.step_layers(x, state["layers"], self.embed.rotation(1, state["pos"], x.dtype))
        state["pos"] += 1
        return logits, state

    def step_layers(self, x, layer_states, rotation=None):
        for layer, layer_state in zip(self.layers, layer_states):
            x = layer.step(x, layer_state, rotation)
        return self.output(x)

    @torch.no_grad()
    def prefill(self, tokens, state, chunk: int = PREFILL_CHUNK):  # t2r.TransformerBase.prefill, with the rotary
        if self.training:                                            # angles of the prompt's positions
            raise ValueError("prefill generates: call model.eval() first (in training mode dropout would apply)")
        size = prefill_piece(self.config, tokens.shape[1], chunk)
        for start in range(0, tokens.shape[1], size):
            piece = tokens[:, start:start + size]
            x = self.embed(piece, start=state["pos"])
            rotation = self.embed.rotation(piece.shape[1], state["pos"], x.dtype)
            for layer, layer_state in zip(self.layers, state["layers"]):
                x = layer.prefill(x, layer_state, rotation)
            state["pos"] += piece.shape[1]
        return self.output(x[:, -1]), state
