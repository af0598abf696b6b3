"""
The recurrent step, fast: what `model.step` of t2r.py computes, at close to the cost of the model's weights.
t2r.py's step reads like the paper (Eqs. 5-7); this one reads like the profile. Both give the same logits
(test_fast_step.py).

    decoder = FastStep(fold(model).eval())     # a TransformerLM or Seq2SeqTransformer of t2r.py
    state = decoder.init_state(batch_size)     # a translator: decoder.init_state(src)
    logits, state = decoder.step(tokens, state)
    FastStep(model, compile=True)              # the layers and the output head through torch.compile
    CapturedStep(decoder, length)              # CUDA: the whole step recorded once as a CUDA graph

What changes, and why:
- One matrix product for q, k and v: the three projections of Eq. 1 stacked head by head, not three products.
- S and z side by side in one (k, d + 1) buffer per head. The stacked projection ends each head's v with a
  constant 1 (a zero weight row, bias 1), so [S | z] += phi(k) (x) [v | 1] is Eq. 6 in one batched product and
  phi(q)^T [S | z] = [numerator | denominator] is Eq. 7 in one more.
- Positions from a table, layer norms and feed-forward layers as plain functions: a flat loop of tensor ops.
- A constant-size state is static memory: the step can be recorded once and replayed (CapturedStep), which a
  growing KV cache does not allow.
Layers without a fused form (a softmax window, the floors of bench.py) run their own reference step in the loop.
Build the decoder after the model has its final device and dtype: it stacks the weights once.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten

from t2r import (LinearAttention, SoftmaxAttention, append_to_cache, full_precision, normalize, sinusoidal_positions,
                 state_dtype)


def stacked_projection(attn: nn.Module, append_one: bool) -> tuple:
    """The q, k, v projections as one (weight, bias) whose output, viewed (B, H, w), is [q | k | v] head by head,
    each v followed by a constant 1 when append_one."""
    H, h = attn.n_head, attn.q_proj.in_features
    parts = [attn.q_proj, attn.k_proj, attn.v_proj]
    weights = [p.weight.detach().view(H, -1, h) for p in parts]  # (H, w_i, h)
    biases = [p.bias.detach().view(H, -1) for p in parts]  # (H, w_i)
    if append_one:
        weights.append(weights[0].new_zeros(H, 1, h))
        biases.append(biases[0].new_ones(H, 1))
    return torch.cat(weights, 1).reshape(-1, h), torch.cat(biases, 1).reshape(-1)


def layer_norm(x, norm: nn.Module):
    if isinstance(norm, nn.Identity):
        return x
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


# -----------------------------------------------------------------------------
# Attention layers: init_state and step(x (B, h), state) -> (B, h), as t2r.py's, with stacked weights

class LinearSelfAttention:
    """A causal linear-attention layer without a window (t2r folded or not, elu, rfa)."""

    def __init__(self, attn: LinearAttention):
        self.feature_map, self.out = attn.feature_map, attn.out_proj
        self.H, self.k, self.d = attn.n_head, attn.feature_size, attn.d_head
        self.w = attn.q_proj.out_features // self.H  # d, or k once folded
        self.elementwise = getattr(self.feature_map, "elementwise", False)  # folded t2r, elu: one call for q | k
        self.weight, self.bias = stacked_projection(attn, append_one=True)  # per head: q | k | v | 1

    def init_state(self, batch_size: int, device, dtype):
        return {"Sz": torch.zeros(batch_size, self.H, self.k, self.d + 1, device=device, dtype=state_dtype(dtype))}

    def step(self, x, state):
        Sz = state["Sz"]  # (B, H, k, d + 1)
        B, (H, k, d, w) = x.shape[0], (self.H, self.k, self.d, self.w)
        o = F.linear(x, self.weight, self.bias).view(B, H, 1, 2 * w + d + 1).to(Sz.dtype)
        with full_precision(x.device):
            if self.elementwise:
                (fqk,) = self.feature_map(o[..., :2 * w])  # (B, H, 1, 2k): [phi(q) | phi(k)]
                fq, fk = fqk[..., :w], fqk[..., w:]
            else:
                fq, fk = self.feature_map(o[..., :w], o[..., w:2 * w])  # (B, H, 1, k)
            # Eq. 6 for S and z at once: [S | z] += phi(k_i) (x) [v_i | 1]
            Sz.addcmul_(fk.view(B, H, k, 1), o[..., 2 * w:])  # (B, H, k, 1) * (B, H, 1, d + 1)
            # Eq. 7: phi(q_i)^T [S | z] = [numerator | denominator]
            both = torch.bmm(fq.reshape(B * H, 1, k), Sz.view(B * H, k, d + 1))  # (B H, 1, d + 1)
            out = normalize(both[..., :d], both[..., d])  # (B H, 1, d)
        return F.linear(out.view(B, H * d).to(x.dtype), self.out.weight, self.out.bias)


class SoftmaxSelfAttention:
    """A causal softmax layer: the stacked projection, then the same growing KV cache as t2r.py."""

    def __init__(self, attn: SoftmaxAttention):
        self.attn, self.out, self.H, self.d = attn, attn.out_proj, attn.n_head, attn.d_head
        self.weight, self.bias = stacked_projection(attn, append_one=False)  # per head: q | k | v

    def init_state(self, batch_size: int, device, dtype):
        return self.attn.init_state(batch_size, device, dtype)

    def step(self, x, state):
        B = x.shape[0]
        q, k, v = F.linear(x, self.weight, self.bias).view(B, self.H, 1, 3 * self.d).split(self.d, -1)
        keys, values = append_to_cache(state, k, v)
        out = F.scaled_dot_product_attention(q, keys, values)  # (B, H, 1, d)
        return F.linear(out.reshape(B, self.H * self.d), self.out.weight, self.out.bias)


class LinearCrossAttention:
    """A translator's linear cross attention: [S | z] of the source once per sentence, one product per token."""

    def __init__(self, attn: LinearAttention):
        self.attn, self.feature_map, self.q, self.out = attn, attn.feature_map, attn.q_proj, attn.out_proj
        self.H, self.k, self.d = attn.n_head, attn.feature_size, attn.d_head

    def init_state(self, memory, key_mask):
        state = self.attn.init_cross_state(memory, key_mask)
        return {"Sz": torch.cat([state["S"], state["z"][..., None]], -1)}  # (B, H, k, d + 1)

    def step(self, x, state):
        Sz = state["Sz"]
        B, (H, k, d) = x.shape[0], (self.H, self.k, self.d)
        q = F.linear(x, self.q.weight, self.q.bias).view(B, H, 1, -1).to(Sz.dtype)
        with full_precision(x.device):
            (fq,) = self.feature_map(q)  # (B, H, 1, k)
            both = torch.bmm(fq.reshape(B * H, 1, k), Sz.view(B * H, k, d + 1))  # Eq. 7, as above
            out = normalize(both[..., :d], both[..., d])
        return F.linear(out.view(B, H * d).to(x.dtype), self.out.weight, self.out.bias)


class ReferenceSelfAttention:
    """A layer without a fused form runs t2r.py's step (or its own, for the floors of bench.py)."""

    def __init__(self, attn: nn.Module):
        self.init_state, self.step = attn.init_state, attn.step


class ReferenceCrossAttention:
    def __init__(self, attn: nn.Module):
        self.init_state, self.step = attn.init_cross_state, attn.step_cross


def fast_self_attention(attn: nn.Module):
    if hasattr(attn, "fast_step"):  # a module that brings its own (bench.py's projections-only floor)
        return attn.fast_step()
    if isinstance(attn, LinearAttention) and not attn.window:
        return LinearSelfAttention(attn)
    if isinstance(attn, SoftmaxAttention):
        return SoftmaxSelfAttention(attn)
    return ReferenceSelfAttention(attn)


def fast_cross_attention(attn: nn.Module):
    return LinearCrossAttention(attn) if isinstance(attn, LinearAttention) else ReferenceCrossAttention(attn)


# -----------------------------------------------------------------------------
# Blocks and the model

class FastBlock:
    """t2r.Block.step without module calls: each sublayer with its residual and LayerNorm."""

    def __init__(self, block: nn.Module):
        self.pre_norm, self.norm1, self.norm2 = block.pre_norm, block.norm1, block.norm2
        self.self_attn = fast_self_attention(block.self_attn)
        self.cross_attn = None if block.cross_attn is None else fast_cross_attention(block.cross_attn)
        self.norm_cross = getattr(block, "norm_cross", None)
        self.ffn_in, self.activation, self.ffn_out = block.ffn[0], block.ffn[1], block.ffn[3]

    def sublayer(self, x, norm, sublayer, state):
        if self.pre_norm:
            return x + sublayer(layer_norm(x, norm), state)
        return layer_norm(x + sublayer(x, state), norm)

    def feed_forward(self, x, state=None):
        hidden = self.activation(F.linear(x, self.ffn_in.weight, self.ffn_in.bias))
        return F.linear(hidden, self.ffn_out.weight, self.ffn_out.bias)

    def step(self, x, state):
        x = self.sublayer(x, self.norm1, self.self_attn.step, state["self"])
        if self.cross_attn is not None:
            x = self.sublayer(x, self.norm_cross, self.cross_attn.step, state["cross"])
        return self.sublayer(x, self.norm2, self.feed_forward, None)


class FastStep:
    """init_state and step of a t2r.py model (same arguments, same logits), fast. compile=True runs the layers
    and the output head through torch.compile (the first steps compile; it pays off over long generations)."""

    def __init__(self, model: nn.Module, compile: bool = False):
        if model.training:
            raise ValueError("FastStep needs model.eval(): it leaves dropout out")
        self.model, self.config = model, model.config
        self.blocks = [FastBlock(block) for block in model.layers]
        self.table = None  # sinusoidal positions, grown on demand (reserve)
        self.body = torch.compile(self.layers_and_output) if compile else self.layers_and_output

    def reserve(self, length: int):
        """Make the position table cover positions 0 .. length - 1."""
        embed = self.model.embed
        embed.check_end(length)
        if embed.pos is not None:
            self.table = embed.pos.weight
        elif self.table is None or len(self.table) < length:
            device = next(self.model.parameters()).device
            n = max(length, 256, 2 * (0 if self.table is None else len(self.table)))
            self.table = sinusoidal_positions(torch.arange(n, device=device), embed.d_model)  # (n, h)

    def embed(self, tokens, pos):
        """tokens (B,) at position pos: an int, or a 0-dim tensor (CapturedStep) -> (B, h), as t2r.Embedding."""
        embed = self.model.embed
        if isinstance(pos, int):
            self.reserve(pos + 1)
            row = self.table[pos]
        else:
            row = self.table.index_select(0, pos.view(1))  # no host read: the position stays on the device
        x = embed.tok(tokens[:, None])[:, 0]
        return (x * embed.scale + row).to(x.dtype)

    def layers_and_output(self, x, layer_states):
        for block, state in zip(self.blocks, layer_states):
            x = block.step(x, state)
        return self.model.output(x)

    @torch.no_grad()
    def init_state(self, batch_or_src):
        """A batch size (language model) or the source tokens (B, S) of a translator, as model.init_state."""
        p = next(self.model.parameters())
        if torch.is_tensor(batch_or_src):
            memory, key_mask = self.model.encode(batch_or_src)
            return {"pos": 0, "layers": [{"self": b.self_attn.init_state(len(batch_or_src), p.device, p.dtype),
                                          "cross": b.cross_attn.init_state(memory, key_mask)} for b in self.blocks]}
        return {"pos": 0, "layers": [{"self": b.self_attn.init_state(batch_or_src, p.device, p.dtype)}
                                     for b in self.blocks]}

    @torch.no_grad()
    def step(self, tokens, state):
        """tokens (B,) -> logits (B, V); updates state in place (pos too, an int or a tensor) and returns it."""
        logits = self.body(self.embed(tokens, state["pos"]), state["layers"])
        state["pos"] += 1
        return logits, state


# -----------------------------------------------------------------------------
# CUDA graphs: a constant-size state is static memory, so one step can be recorded and replayed

class CapturedStep:
    """FastStep of a language model recorded once per batch size as a CUDA graph, and replayed at every token:
    one launch per token instead of one per operation. Only for constant-size states (every self-attention
    linear, without a window): a KV cache grows, and a graph replays fixed shapes at fixed addresses. At most
    `length` steps per init_state; the logits returned are a copy, valid after the next step."""

    def __init__(self, fast: FastStep, length: int):
        self.device = next(fast.model.parameters()).device
        if self.device.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device")
        if fast.model.config.n_encoder_layer or not all(isinstance(b.self_attn, LinearSelfAttention)
                                                        for b in fast.blocks):
            raise ValueError("CUDA graphs need a language model whose every self-attention has a constant-size state "
                             "(linear attention without a window); use the eager FastStep")
        self.fast, self.config, self.length = fast, fast.config, length
        fast.reserve(length)
        self.batch_size, self.steps = None, 0

    def record(self, batch_size: int):
        """Static inputs, state and outputs; warm-up on a side stream, as torch.cuda.graphs asks; then capture."""
        self.tokens = torch.zeros(batch_size, dtype=torch.long, device=self.device)
        self.state = self.fast.init_state(batch_size)
        self.state["pos"] = torch.zeros((), dtype=torch.long, device=self.device)  # a tensor: read on the device
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(3):
                self.fast.step(self.tokens, self.state)
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits, _ = self.fast.step(self.tokens, self.state)
        self.batch_size = batch_size

    def init_state(self, batch_size: int):
        if batch_size != self.batch_size:
            self.record(batch_size)
        for leaf in tree_flatten(self.state)[0]:  # the warm-up ran steps: start from position 0 again
            if torch.is_tensor(leaf):
                leaf.zero_()
        self.steps = 0
        return self.state

    def step(self, tokens, state):
        if self.steps >= self.length:
            raise ValueError(f"the graph's positions end at {self.length}: make a CapturedStep of a longer length")
        self.tokens.copy_(tokens)
        self.graph.replay()
        self.steps += 1
        return self.logits.clone(), state
