"""
A decaying state, beside t2r.py: the linear attention of T2R whose state forgets at a rate of its own (Liger, Lizard,
LAWCAT, Jet-Nemotron gate theirs; "additive states saturate"), a gate g_i in (0, 1) per head and position:
    S_i = g_i S_{i-1} + phi(k_i) v_i^T,   z_i = g_i z_{i-1} + phi(k_i),   out_i = phi(q_i)^T S_i / phi(q_i)^T z_i
With g = 1 it is T2R's Eq. 6. The normaliser z decays with S, so out_i stays a weighted average of the values, each
weighted by phi(q_i).phi(k_j) times the decay since position j: prod_{j<l<=i} g_l.

The gate: g_i = sigmoid(beta + mean(k_i)), k_i the head's key (its projection of the pretrained teacher, before the
feature map) and beta one new number per head, starting at 4 (g about 0.98, a memory of ~50 tokens at first; the
key's mean moves it per position, as Liger builds its gates from the pretrained key projection). The feature map
reads the same keys, so a decaying layer does not fold (Eq. 8 would drop k's mean). In a family's model (families.py:
GPT-2, the Llama family) the same: a Llama's gate is one per key/value head, read from its key after the rotation the
feature map reads too, and the G query heads sharing that head's [S | z] share its decay.

    python train_lm.py --init pretrained --decay                 # T2R with a decaying state
    python train_lm.py --init pretrained --pretrained hf:FOLDER --decay      # a Hugging Face model's (GPT-2, Llama)
    python -m pytest -q tests/test_decay.py                      # its parallel, chunked, recurrent forms and prefill
"""

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from families import FamilyConfig, FamilyLM, GroupedLinearAttention, shared
from layers.states import add_to_state, full_precision, read_sums, widened
from t2r import LinearAttention, Seq2SeqTransformer, normalize

GATE_START = 4.0  # beta at the swap: sigmoid(4) = 0.982


@dataclass
class DecayConfig(FamilyConfig):
    decay: bool = True  # the causal linear layers' state decays (a saved config without the field: t2r.py's)


def decayed_quadratic(fq, fk, v, log_g):
    """The readable reference: fq, fk (B, H, T, k), v (B, H, T, d), log_g (B, H, T) -> (B, H, T, d), O(T^2)."""
    G = log_g.cumsum(-1)  # log of the decay from the start to each position
    i, j = torch.arange(G.shape[-1], device=G.device)[:, None], torch.arange(G.shape[-1], device=G.device)[None, :]
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(j > i, float("-inf")).exp()  # prod_{j<l<=i} g_l
    sim = (fq @ fk.transpose(-1, -2)) * decay  # (B, H, T, T)
    return normalize(sim @ v, sim.sum(-1))


def decayed_chunked_sums(fq, fk, v, log_g, chunk_size: int, S, z):
    """The numerator (B, H, T, d) and denominator (B, H, T) in chunks of C positions, from the state S (B, H, k, d),
    z (B, H, k) before them, and the state after them: within a chunk the quadratic form, across chunks the state,
    decayed. Nothing in place: training differentiates it."""
    (B, H, T, k), d, C = fq.shape, v.shape[-1], chunk_size
    pad = -T % C  # padded positions: zero features add nothing, g = 1 decays nothing
    fq, fk, v = (F.pad(t, (0, 0, 0, pad)) for t in (fq, fk, v))
    n = (T + pad) // C
    b = F.pad(log_g, (0, pad)).view(B, H, n, C).cumsum(-1)  # log decay from a chunk's start to each position in it
    fq, fk, v = fq.view(B, H, n, C, k), fk.view(B, H, n, C, k), v.view(B, H, n, C, d)
    later = torch.ones(C, C, dtype=torch.bool, device=b.device).triu(1)  # j > i: not seen
    within = (b[..., :, None] - b[..., None, :]).masked_fill(later, float("-inf")).exp()  # prod_{j<l<=i} g_l
    sim = (fq @ fk.transpose(-1, -2)) * within  # (B, H, n, C, C)
    to_end = (b[..., -1:] - b).exp()[..., None] * fk  # phi(k_j) decayed to its chunk's end
    reading = b.exp()[..., None] * fq  # phi(q_i) times the decay since its chunk's start
    numerators, denominators = [], []
    for c in range(n):  # the state at each chunk's start, read by its queries, then moved to the next chunk's
        numerators.append(sim[:, :, c] @ v[:, :, c] + reading[:, :, c] @ S)
        denominators.append(sim[:, :, c].sum(-1) + (reading[:, :, c] * z[:, :, None, :]).sum(-1))
        end = b[:, :, c, -1].exp()  # (B, H): the whole chunk's decay
        S = end[..., None, None] * S + to_end[:, :, c].transpose(-1, -2) @ v[:, :, c]
        z = end[..., None] * z + to_end[:, :, c].sum(-2)
    numerator, denominator = torch.stack(numerators, 2), torch.stack(denominators, 2)
    return numerator.view(B, H, n * C, d)[:, :, :T], denominator.view(B, H, n * C)[:, :, :T], S, z


def decayed_attention(fq, fk, v, log_g, chunk_size: int):
    """The parallel form in training: chunks of chunk_size from an empty state, or the quadratic form for 0."""
    if not chunk_size:
        return decayed_quadratic(fq, fk, v, log_g)
    S, z = fk.new_zeros(*fk.shape[:2], fk.shape[-1], v.shape[-1]), fk.new_zeros(*fk.shape[:2], fk.shape[-1])
    numerator, denominator, _, _ = decayed_chunked_sums(fq, fk, v, log_g, chunk_size, S, z)
    return normalize(numerator, denominator)


def decayed_step(fq, fk, v, g, S, z):
    """One position: fq, fk (B, H, k), v (B, H, d), g (B, H); S, z in place -> (B, H, d)."""
    S.mul_(g[..., None, None]).add_(fk[..., :, None] * v[..., None, :])  # S_i = g_i S_{i-1} + phi(k_i) v_i^T
    z.mul_(g[..., None]).add_(fk)  # z_i = g_i z_{i-1} + phi(k_i)
    return normalize((fq[..., None, :] @ S)[..., 0, :], (fq * z).sum(-1))  # phi(q_i)^T S_i / phi(q_i)^T z_i


class DecayingAttention(LinearAttention):
    """A causal linear-attention layer whose state decays (above); the rest as LinearAttention's."""

    def __init__(self, config, causal: bool, kind: str, feature_size: int):
        super().__init__(config, causal, kind, feature_size)
        heads = self.k_proj.out_features // self.d_head  # one gate per head of keys (H here; fewer in a Llama's)
        self.gate_bias = nn.Parameter(torch.full((heads,), GATE_START))  # beta, per head

    def log_gate(self, k):  # k (B, H, T, d) -> log g (B, H, T), in k's dtype (float32 at least where called)
        return F.logsigmoid(self.gate_bias.to(k.dtype)[:, None] + k.mean(-1))

    def causal_form(self, q, k, fq, fk, v):
        return decayed_attention(fq, fk, v, self.log_gate(*widened(k)), self.chunk_size)

    def step(self, x, state):  # x (B, h) -> (B, h)
        q, k, v = self.project(x[:, None], x[:, None])  # (B, H, 1, .)
        (fq, fk), S, z = self.feature_map(q, k), state["S"], state["z"]
        with full_precision(x.device):
            g = self.log_gate(k.to(S.dtype))[:, :, 0].exp()  # (B, H)
            out = decayed_step(*(t[:, :, 0].to(S.dtype) for t in (fq, fk, v)), g, S, z)
        return self.merge(out[:, :, None].to(x.dtype))[:, 0]

    def prefill(self, x, state):  # x (B, T, h) after the state's positions -> (B, T, h); the state moves past them
        q, k, v = self.project(x, x)
        (fq, fk), S, z = self.feature_map(q, k), state["S"], state["z"]
        with full_precision(x.device):
            fq, fk, v, k = (t.to(S.dtype) for t in (fq, fk, v, k))
            numerator, denominator, S_after, z_after = decayed_chunked_sums(fq, fk, v, self.log_gate(k),
                                                                            self.chunk_size or x.shape[1], S, z)
            S.copy_(S_after), z.copy_(z_after)  # in place, as a step's
        return self.merge(normalize(numerator, denominator).to(x.dtype))

    # Nothing to fold: the gate reads the key itself, which folding (Eq. 8) would not form. The fast step folds a copy,
    # the key's mean a row of its own (support/fast_step.py's decaying_maps).
    def fold(self):
        pass

    def new_tensors(self) -> list:  # the gates' beta are new too
        return super().new_tensors() + ["gate_bias"]


class GroupedDecayingAttention(DecayingAttention, GroupedLinearAttention):
    """The decaying state in a family's model with rotary positions or grouped-query heads (families.py): a gate per
    key/value head, from its rotated key, decays the [S | z] its G query heads share; the state keeps n heads."""

    def causal_form(self, q, k, fq, fk, v):  # k (B, n, T, w): each query head decays as its key/value head does
        return decayed_attention(fq, fk, v, shared(self.log_gate(*widened(k)), self.group), self.chunk_size)

    def step(self, x, state, rotation=None):  # GroupedLinearAttention.step, its [S | z] decayed first
        q, k, v1 = self.project_step(x, True, rotation)  # q (B, n, G, w), k (B, n, 1, w)
        fq, fk = self.feature_map(q, k)
        with full_precision(x.device):
            fq, fk, v1, k = widened(fq, fk, v1, k)
            state["Sz"].mul_(self.log_gate(k).exp()[..., None])  # g_i (B, n, 1, 1): [S | z] = g_i [S | z]
            add_to_state(fk, v1, state["Sz"])  # + phi(k_i) [v_i | 1]
            out = normalize(*read_sums(fq, state["Sz"]))
        return self.merge_step(out.to(x.dtype))

    def prefill(self, x, state, rotation=None):  # x (B, T, h) -> (B, T, h): DecayingAttention.prefill's, grouped
        q, k, v = self.project(x, x, rotation)
        (B, H, T, w), n, Sz = q.shape, self.n_kv_head, state["Sz"]
        fq, fk = self.feature_map(q.reshape(B, n, self.group * T, w), k)  # each query head by its group's map
        with full_precision(x.device):
            fq, fk, v, k = (t.to(Sz.dtype) for t in (fq, fk, v, k))
            fk, v, log_g, S, z = (shared(t, self.group) for t in (fk, v, self.log_gate(k), Sz[..., :-1], Sz[..., -1]))
            numerator, denominator, S, z = decayed_chunked_sums(fq.reshape(B, H, T, -1), fk, v, log_g,
                                                                self.chunk_size or T, S, z)
            Sz.copy_(torch.cat([S, z[..., None]], -1)[:, ::self.group])  # a group's G copies are one state
        return self.merge(normalize(numerator, denominator).to(x.dtype))


class DecayingLayers:
    """The parts of a model whose causal linear attention decays (a translator's decoder's; cross attention stays)."""

    def make_attention(self, kind: str, causal: bool, feature_size: int):
        if kind == "softmax" or not causal:
            return super().make_attention(kind, causal, feature_size)
        layer = GroupedDecayingAttention if self.config.is_grouped() else DecayingAttention
        return layer(self.config, causal, kind, feature_size)


class DecayingLM(DecayingLayers, FamilyLM):
    """A language model (the paper's, or a family's: families.py) whose causal linear layers decay."""


class DecayingTranslator(DecayingLayers, Seq2SeqTransformer):
    pass


def decay_model(config: DecayConfig):
    return (DecayingTranslator if config.n_encoder_layer else DecayingLM)(config)


def decay_student(decay: bool):
    """t2r.convert's build= for a student whose causal linear layers decay (None where not: the teacher's class)."""
    return (lambda config: decay_model(DecayConfig(**{**config.to_dict(), "decay": True}))) if decay else None
