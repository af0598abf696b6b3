"""
What came after T2R, on top of t2r.py: the sliding-window hybrid (softmax over the last W tokens, linear attention
before them) and attention transfer (train the new feature maps to imitate softmax before finetuning), conversion
methods of the linearizing work since T2R (Hedgehog, LoLCATs, Liger); and the short convolution before attention of
the recall baselines (Zoology), which experiments/mqar.py measures with and without.

Both enter through t2r.py's seams: the window layers are what the student's make_attention builds when
t2r.convert makes it (convert_to_window), attention transfer is a stage of its own before finetuning.

    python train_lm.py --init pretrained --window 64             # convert to the hybrid, finetune
    python train_lm.py --init pretrained --transfer_steps 200    # attention transfer first, then finetune
    python -m pytest -q tests/test_window.py tests/test_transfer.py
"""

import math
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

from decay import DecayingAttention, GroupedDecayingAttention
from families import (FamilyConfig, FamilyLM, GroupedAttention, GroupedLinearAttention, GroupedSoftmaxAttention,
                      shared)
from layers.states import full_precision, widened
from t2r import (LinearAttention, Seq2SeqTransformer, SoftmaxAttention, convert, linear_attention_chunked_sums,
                 normalize, softmax_attention)

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
    return normalize(*window_attention_chunked_sums(q, k, fq, fk, v, window, gate, chunk_size))


def window_attention_chunked_sums(q, k, fq, fk, v, window: int, gate, chunk_size: int):
    """The numerator (B, H, T, d) and denominator (B, H, T) of window_attention_chunked, not yet divided."""
    B, H, T, d = v.shape
    C, W = chunk_size, window
    # sum_{j<=i-W} phi(q_i).phi(k_j) v_j: key j counts from query j + W on
    late = (F.pad(t, (0, 0, W, 0))[:, :, :T] for t in (fk, v))
    numerator, denominator = linear_attention_chunked_sums(fq, *late, C)
    if W == 0:
        return numerator, denominator
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
    return numerator, denominator


def window_attention_prefill(q, k, fq, phi, v, state, window: int, gate, chunk_size: int):
    """T positions after the state's t in one pass (q, k, fq, v: (B, H, T, .)), the state moved past them. The
    chunked form over the window's keys before them (the ring, oldest first) and the prompt's, the queries the
    prompt's; the tokens that left the window before it add Eq. 7's sums of S and z to every query; the keys that
    leave it during the prompt join S and z (Eq. 5), the last W join the ring."""
    t, T, W, S, z = state["length"], q.shape[2], window, state["S"], state["z"]
    held = min(t, W)  # the window's keys before the prompt: positions t - held .. t - 1, in slots p % W
    slots = torch.arange(t - held, t, device=q.device) % W
    keys, values = (torch.cat([state[name][:, :, slots], new], 2) for name, new in (("k", k), ("v", v)))
    fk = phi(keys)  # (B, H, held + T, k)
    queries, fqs = (F.pad(x, (0, 0, held, 0)) for x in (q, fq))  # the ring's positions ask nothing: dropped below
    numerator, denominator = window_attention_chunked_sums(queries, keys, fqs, fk, values, W, gate, chunk_size)
    numerator = numerator[:, :, held:] + fq @ S  # Eq. 7's sums of the tokens before the window, to every query
    denominator = denominator[:, :, held:] + (fq * z[:, :, None]).sum(-1)
    leaving = max(0, held + T - W)  # keys of positions t - held .. t + T - W - 1 leave the window: into S and z
    S += fk[:, :, :leaving].transpose(-1, -2) @ values[:, :, :leaving]
    z += fk[:, :, :leaving].sum(-2)
    kept = torch.arange(t + T - min(W, t + T), t + T, device=q.device)  # the last W positions: the new ring
    state["k"][:, :, kept % W], state["v"][:, :, kept % W] = (x[:, :, kept - (t - held)] for x in (keys, values))
    state["length"] = t + T
    return normalize(numerator, denominator)


def window_attention_step(q, k, fq, v, state, window: int, gate, phi):
    """One recurrent step (q, k, fq, v: (B, H, .)). The state keeps the last W keys and values in a ring
    buffer and S and z of the tokens that have left it: O(W d + k d) per head at every length."""
    t, slot, S, z = state["length"], state["length"] % window, state["S"], state["z"]
    if t >= window:  # token t - W leaves the window: Eq. 6 adds it to S and z
        fk_old = phi(state["k"][:, :, slot, None])[0][:, :, 0]  # (B, H, k)
        S += fk_old[..., :, None] * state["v"][:, :, slot, None, :]  # S_i = S_{i-1} + phi(k_j) v_j^T
        z += fk_old  # z_i = z_{i-1} + phi(k_j)
    state["k"][:, :, slot], state["v"][:, :, slot] = k, v
    state["length"] = t + 1
    keys, values = state["k"][:, :, : t + 1], state["v"][:, :, : t + 1]  # the window (all W slots once full)
    s = (keys @ q[..., None])[..., 0] / math.sqrt(q.shape[-1])  # (B, H, min(t + 1, W))
    e = gate[:, None] * torch.exp(s - s.amax(-1, keepdim=True))  # g exp(s_ij - m_i)
    before = (fq[:, :, None] @ S)[:, :, 0], (fq * z).sum(-1)  # Eq. 7's sums of the tokens before the window
    return normalize((e[:, :, None] @ values)[:, :, 0] + before[0], e.sum(-1) + before[1])


class WindowAttention(LinearAttention):
    """A causal linear-attention layer as the sliding-window hybrid: softmax over the last W tokens, the feature map
    over everything before them, with a learned gate g per head."""


    def __init__(self, config, kind: str, feature_size: int):
        super().__init__(config, True, kind, feature_size)
        self.window = config.window
        self.window_gate = nn.Parameter(torch.zeros(self.n_head))  # log g per head: g = 1 at the start

    def forward(self, x, source=None, key_mask=None, **position):  # position: rotary angles (GroupedWindowAttention)
        q, k, v = self.project(x, x, **position)
        return self.merge(self.attend(q, k, v, False, key_mask).to(x.dtype))

    def causal_form(self, q, k, fq, fk, v):
        q, k = widened(q, k)
        gate = self.window_gate.to(q.dtype).exp()
        if self.chunk_size:
            return window_attention_chunked(q, k, fq, fk, v, self.window, gate, self.chunk_size)
        return window_attention_quadratic(q, k, fq, fk, v, self.window, gate)

    def fold(self):  # nothing: the window's softmax needs q and k themselves, which folding (Eq. 8) would not form
        pass

    def new_tensors(self) -> list:  # the gates are new too
        return super().new_tensors() + ["window_gate"]

    # Recurrent form: S and z as T2R's, and the last W keys and values in a ring buffer
    def init_state(self, batch_size: int, device, dtype):
        state = super().init_state(batch_size, device, dtype)
        ring = torch.zeros(batch_size, self.n_head, self.window, self.d_head, device=device, dtype=state["S"].dtype)
        return {**state, "k": ring, "v": ring.clone(), "length": 0}

    def step(self, x, state, **position):  # x (B, h) -> (B, h)
        q, k, v = self.project(x[:, None], x[:, None], **position)  # (B, H, 1, .)
        (fq,) = self.feature_map(q)
        phi = lambda key: widened(*self.feature_map(key.to(self.v_proj.weight.dtype)))  # a key leaving the window
        with full_precision(x.device):
            q, k, fq, v = widened(q[:, :, 0], k[:, :, 0], fq[:, :, 0], v[:, :, 0])
            out = window_attention_step(q, k, fq, v, state, self.window, self.window_gate.to(q.dtype).exp(), phi)
        return self.merge(out[:, :, None].to(x.dtype))[:, 0]

    def prefill(self, x, state, **position):  # x (B, T, h): the prompt after the state's positions -> (B, T, h)
        q, k, v = self.project(x, x, **position)
        (fq,) = self.feature_map(q)
        phi = lambda keys: widened(*self.feature_map(keys.to(self.v_proj.weight.dtype)))[0]  # as the step's
        with full_precision(x.device):
            q, k, fq, v = widened(q, k, fq, v)
            out = window_attention_prefill(q, k, fq, phi, v, state, self.window, self.window_gate.to(q.dtype).exp(),
                                           self.chunk_size or x.shape[1])
        return self.merge(out.to(x.dtype))


class GroupedWindowAttention(GroupedAttention, WindowAttention):
    """The hybrid in a family's model (families.py): its biases and rotary positions, one key/value head a query's."""


@dataclass
class WindowConfig(FamilyConfig):
    window: int = 64  # the causal linear layers attend with softmax to the last W tokens

    def __post_init__(self, positions=None):
        super().__post_init__(positions)
        if not isinstance(self.window, int) or self.window < 0:
            raise ValueError(f"window={self.window!r} must be an integer >= 0")
        if self.n_kv_head not in (0, self.n_head):
            raise ValueError("the sliding-window hybrid takes one key/value head per query head: n_kv_head = n_head")


class WindowLayers:
    """Mixed into a model class: its causal linear-attention layers are window layers."""

    def make_attention(self, kind: str, causal: bool, feature_size: int):
        if not causal or kind == "softmax" or not self.config.window:
            return super().make_attention(kind, causal, feature_size)
        layer = GroupedWindowAttention if self.config.is_grouped() else WindowAttention
        return layer(self.config, kind, feature_size)


class WindowLM(WindowLayers, FamilyLM):
    """A language model (the paper's, or a family's: families.py) with window layers."""


class WindowTranslator(WindowLayers, Seq2SeqTransformer):
    """The translator with window layers in its decoder's self-attention."""


def window_model(config: WindowConfig):
    return (WindowTranslator if config.n_encoder_layer else WindowLM)(config)


def window_student(window: int):
    """t2r.convert's build= for the hybrid of W = window: the student's causal linear layers are window layers
    (None for 0: the teacher's class)."""
    return (lambda config: window_model(WindowConfig(**config.to_dict(), window=window))) if window else None


def convert_to_window(model, window: int, attn: str = "t2r", **kwargs):
    """t2r.convert, the student's causal linear layers the sliding-window hybrid of W = window (0: plain convert)."""
    return convert(model, attn, build=window_student(window), **kwargs)


# -----------------------------------------------------------------------------
# Attention transfer (Hedgehog, Zhang et al. 2024; LoLCATs, Zhang et al. 2025): before finetuning, train only the
# new feature maps so that each converted layer's linear attention reproduces the softmax attention it replaced.
# The swap kept W_q, W_k, W_v, so the target is free: softmax attention on the layer's own q, k, v. Every layer
# passes the target on, so the model runs exactly as the teacher did and each layer learns on the teacher's inputs:
#   loss_l = mean_i || linear_attention_l(q_i, K, V) - softmax_attention_l(q_i, K, V) ||^2 / (H d)

def linear_attention_layers(model: nn.Module) -> list:
    """(name, module) of every linear attention layer, bottom to top (a translator's self, then cross)."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, LinearAttention)]


def imitate_softmax(layer: LinearAttention, errors: dict, x, source=None, key_mask=None, **position):
    """A layer's forward during attention transfer: pass on the softmax attention of the layer's own q, k, v (the
    teacher's output exactly), and keep the squared error of its linear attention against it in errors[layer].
    position: the rotary angles where the model has them (families.py). A layer with a short convolution (ConvInput)
    reads its output, as its own forward does."""
    x = layer.conv(x) if isinstance(layer, ConvInput) else x
    q, k, v = (t.detach() for t in layer.project(x, x if source is None else source, **position))  # only phi, g learn
    cross, group = source is not None, q.shape[1] // k.shape[1]  # group > 1: grouped-query heads (families.py)
    target = softmax_attention(q, shared(k, group), shared(v, group), layer.causal and not cross, key_mask)  # Eq. 2
    own = layer.attend(q, k, v, cross, key_mask)
    errors[layer] = (own - target.to(own.dtype)).pow(2).mean((1, 3))  # (B, T), mean over heads and d
    return layer.merge(target)


def attention_transfer(model: nn.Module, *inputs, mask=None):
    """Run a converted model (or its DDP / compiled wrapper) on `inputs` with every linear attention layer passing on
    softmax attention. Returns (errors (L,): each layer's mean squared error, logits: the teacher's exactly).
    mask (B, T): the query positions that count (a translator's real target tokens); None: all of them."""
    layers = [m for _, m in linear_attention_layers(model)]
    if not layers:
        raise ValueError("attention transfer needs a converted model: this one has no linear attention")
    errors = {}
    for layer in layers:  # for this one call, each layer's forward is imitate_softmax
        layer.forward = partial(imitate_softmax, layer, errors)
    try:
        logits = model(*inputs)
    finally:
        for layer in layers:
            del layer.forward
    means = []
    for layer in layers:
        e = errors.get(layer)  # (B, T); None where LayerDrop skipped the layer
        if e is None:
            means.append(logits.new_zeros((), dtype=torch.float32))
        else:
            means.append(e.mean() if mask is None else (e * mask).sum() / mask.sum().clamp_min(1))
    return torch.stack(means), logits


# -----------------------------------------------------------------------------
# The short convolution (Zoology, Arora et al. 2023; Based): every recall baseline there mixes each position with
# the few before it ahead of the attention, a depthwise causal convolution of kernel K:
#   x~_i = b + sum_{j=0}^{K-1} w_j * x_{i-j}      (per channel; x_{i-j} = 0 before the sequence starts)
# so a head can attend with a key that already holds its neighbour's token. Its recurrent step keeps the last
# K - 1 inputs: a state of fixed size, like S and z. A family's model (families.py) takes it as the paper's does.

@dataclass
class ConvConfig(FamilyConfig):
    short_conv: int = 3  # K, the kernel of the depthwise causal convolution before each attention layer
    decay: bool = False  # and the causal linear layers' state decays (decay.py): the two parts together

    def __post_init__(self, positions=None):
        super().__post_init__(positions)
        if not isinstance(self.short_conv, int) or self.short_conv < 1:
            raise ValueError(f"short_conv={self.short_conv!r} must be an integer >= 1")


class ShortConv(nn.Module):
    def __init__(self, d_model: int, kernel: int):
        super().__init__()
        self.kernel = kernel
        self.weight = nn.Parameter(torch.zeros(d_model, 1, kernel))  # w_{K-1}, ..., w_0 (conv1d's order)
        self.weight.data[:, 0, -1] = 1.0  # the identity at initialisation: x~_i = x_i
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x):  # (B, T, h) -> (B, T, h)
        x = F.pad(x.transpose(1, 2), (self.kernel - 1, 0))  # zeros before the sequence starts
        return F.conv1d(x, self.weight, self.bias, groups=x.shape[1]).transpose(1, 2)

    def init_state(self, batch_size: int, device, dtype):  # the last K - 1 inputs, (B, K - 1, h)
        return torch.zeros(batch_size, self.kernel - 1, self.weight.shape[0], device=device, dtype=dtype)

    def step(self, x, last):  # x (B, h); last (B, K - 1, h), updated in place -> (B, h)
        window = torch.cat([last, x[:, None]], 1)  # x_{i-K+1}, ..., x_i
        last.copy_(window[:, 1:])
        return self.bias + (window * self.weight[:, 0].T).sum(1)

    def new_tensors(self) -> list:  # a conversion may add it: as the identity, the teacher's outputs stay the same
        return ["weight", "bias"]

    def prefill(self, x, last):  # x (B, T, h) after the last K - 1 inputs, which move on in place -> (B, T, h)
        window = torch.cat([last, x], 1)  # the convolution over them and the prompt: T outputs, no padding
        if self.kernel > 1:
            last.copy_(window[:, -(self.kernel - 1):])
        return F.conv1d(window.transpose(1, 2), self.weight, self.bias, groups=x.shape[2]).transpose(1, 2)


class ConvInput:
    """An attention layer (the mixin's next class) whose input is the short convolution's output: the attention's own
    tensors keep their names, so a conversion copies them and adds the convolution (new_tensors)."""

    def __init__(self, config, *args):
        super().__init__(config, *args)
        self.conv = ShortConv(config.d_model, config.short_conv)

    def forward(self, x, source=None, key_mask=None, **position):  # position: a family's rotary angles
        return super().forward(self.conv(x), source, key_mask, **position)

    def init_state(self, batch_size: int, device, dtype):  # the attention's state and the last K - 1 inputs
        last = self.conv.init_state(batch_size, device, dtype)
        return {**super().init_state(batch_size, device, dtype), "conv": last}

    def step(self, x, state, **position):
        return super().step(self.conv.step(x, state["conv"]), state, **position)

    def prefill(self, x, state, **position):
        return super().prefill(self.conv.prefill(x, state["conv"]), state, **position)


class ConvSoftmaxAttention(ConvInput, SoftmaxAttention):
    pass


class ConvLinearAttention(ConvInput, LinearAttention):
    pass


class ConvDecayingAttention(ConvInput, DecayingAttention):
    pass


# a family's layers (families.py: rotary positions, grouped-query heads, their biases), each reading the convolution
class ConvGroupedSoftmaxAttention(ConvInput, GroupedSoftmaxAttention):
    pass


class ConvGroupedLinearAttention(ConvInput, GroupedLinearAttention):
    pass


class ConvGroupedDecayingAttention(ConvInput, GroupedDecayingAttention):
    pass


CONVOLVED = {ConvSoftmaxAttention: SoftmaxAttention, ConvLinearAttention: LinearAttention,  # an ungrouped layer above:
             ConvDecayingAttention: DecayingAttention}  # the attention after its convolution (support/fast_step.py's)
CONV_LINEAR = {(False, False): ConvLinearAttention, (False, True): ConvDecayingAttention,  # by (grouped, decay)
               (True, False): ConvGroupedLinearAttention, (True, True): ConvGroupedDecayingAttention}


class ConvLayers:
    """The parts of a model whose causal self-attention reads a short convolution's output (an encoder's and a cross
    attention stay as they are)."""

    def make_attention(self, kind: str, causal: bool, feature_size: int):
        if not causal:
            return super().make_attention(kind, causal, feature_size)
        grouped = self.config.is_grouped()
        if kind == "softmax":
            return (ConvGroupedSoftmaxAttention if grouped else ConvSoftmaxAttention)(self.config, causal)
        return CONV_LINEAR[grouped, self.config.decay](self.config, causal, kind, feature_size)


class ConvLM(ConvLayers, FamilyLM):
    """A language model (the paper's, or a family's: families.py) with a short convolution before each self-attention
    (MQAR's baselines)."""


class ConvTranslator(ConvLayers, Seq2SeqTransformer):
    """The translator with a short convolution before its decoder's self-attention."""


def conv_model(config: ConvConfig):
    return (ConvTranslator if config.n_encoder_layer else ConvLM)(config)


def conv_student(kernel: int, decay: bool = False):
    """t2r.convert's build= for a student with a short convolution of `kernel` before each causal self-attention,
    new and the identity (at the swap the student computes what it would without it), None for 0: the teacher's
    class. Its recurrent state keeps the last kernel - 1 inputs of each layer. decay: its linear layers' state decays
    too (decay.py)."""
    if not kernel:
        return None
    return lambda config: conv_model(ConvConfig(**{**config.to_dict(), "short_conv": kernel, "decay": decay}))
