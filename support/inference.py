"""
A trained model made ready to decode, for generate.py, translate.py and train_mt.py's BLEU: eval mode, its T2R layers
folded (Eq. 8), and, where asked, its recurrent step compiled or unrolled (FlatStep).
"""

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from layers.states import append_to_cache, full_precision, widened
from t2r import (Block, LinearAttention, SoftmaxAttention, T2RFeatureMap, TransformerBase, add_to_state, fold,
                 read_state)


def inference_model(model):
    """The model in eval mode, its T2R layers folded (Eq. 8: the feature map merges into W_q and W_k; the outputs are
    the same). A model without T2R layers is not copied."""
    return fold(model) if any(isinstance(m, T2RFeatureMap) for m in model.modules()) else model.eval()


def compile_step(model):
    """A shallow copy of model whose step runs its layers and output head through torch.compile (the first steps
    compile; it pays off over long generations); the caller's model is left as it is. The embedding and the position
    counter stay outside, so a new position does not recompile."""
    compiled = copy.copy(model)
    compiled.step_layers = torch.compile(compiled.step_layers)
    return compiled


# -----------------------------------------------------------------------------
# The step unrolled: t2r.py's step, the same operations on the same weights, without its module calls

class FlatStep:
    """init_state and step of a t2r.py model, giving its step's logits (tests/test_step.py holds them equal), with
    the layers' parts called as plain functions. Why: at batch 1 on a CPU each module call costs microseconds, as much
    as a small layer's arithmetic, and t2r.py's step, written to be read, makes about ten a layer; unrolled, a token
    takes about 14% less time at batch 1 (results/measurements.md). Unrolled: torch's LayerNorm, Linear and ReLU (the
    MLP, the head) and t2r.py's multi-head softmax and linear attention, self and cross; the embedding and any other
    attention module (MQAR's convolution, bench.py's floors) run as modules. Build it from the model as it will decode
    (folded, on its device, in its dtype): it holds the model's weights, not copies. A model that steps its own way
    (families.py's, the window hybrid's, SRU++) does not fit: `eager_decoder` gives it its own step."""

    def __init__(self, model):
        if model.training:
            raise ValueError("FlatStep decodes: call model.eval() first (it leaves dropout out)")
        if not self.fits(model):
            raise ValueError(f"FlatStep unrolls t2r.py's step: {type(model).__name__} steps its own way")
        self.model = model
        self.blocks = [FlatBlock(layer) for layer in model.layers]
        self.final_norm, self.lm_head = unrolled(model.final_norm), unrolled(model.lm_head)

    @property
    def config(self):  # the model's (bench.py reads a decoder's)
        return self.model.config

    @staticmethod
    def fits(model) -> bool:  # whether model steps as t2r.py's models do (its layers' parts may be others')
        steps = [(type(model).step, TransformerBase.step), (type(model).step_layers, TransformerBase.step_layers)]
        return isinstance(model, TransformerBase) and all(a is b for a, b in steps) and all(
            type(layer).step is Block.step for layer in model.layers)

    def init_state(self, batch_or_src):
        """model.init_state: a batch size, or a translator's source (B, S). It also stacks each attention's W_q, W_k,
        W_v into the one projection the steps use."""
        return self.model.init_state(batch_or_src)

    @torch.no_grad()
    def step(self, tokens, state):
        """tokens (B,) at position state['pos'] -> logits (B, V), as model.step; updates the state in place."""
        if self.model.training:
            raise ValueError("FlatStep decodes: call model.eval() first (in training mode dropout would apply)")
        x = self.model.embed(tokens[:, None], start=state["pos"])[:, 0]
        for block, layer_state in zip(self.blocks, state["layers"]):
            x = block.step(x, layer_state)
        state["pos"] += 1
        return self.lm_head(self.final_norm(x)), state


def eager_decoder(model):
    """What decodes model eagerly: FlatStep where it fits, else the model's own step."""
    return FlatStep(model) if FlatStep.fits(model) else model


class FlatBlock:
    """t2r.Block.step: each sublayer with its residual and norm, post-norm (the paper's) or pre-norm."""

    def __init__(self, block: nn.Module):
        self.pre_norm, self.ffn = block.pre_norm, unrolled(block.ffn)
        self.norm1, self.norm2 = unrolled(block.norm1), unrolled(block.norm2)
        self.self_attn = unrolled_attention(block.self_attn)
        self.cross_attn, self.norm_cross = None, None  # a translator's decoder: attention over the source
        if block.cross_attn is not None:
            self.cross_attn, self.norm_cross = unrolled_cross_attention(block.cross_attn), unrolled(block.norm_cross)

    def sublayer(self, x, norm, sublayer, *state):
        return x + sublayer(norm(x), *state) if self.pre_norm else norm(x + sublayer(x, *state))

    def step(self, x, state):  # x (B, h)
        x = self.sublayer(x, self.norm1, self.self_attn, state["self"])
        if self.cross_attn:
            x = self.sublayer(x, self.norm_cross, self.cross_attn, state["cross"])
        return self.sublayer(x, self.norm2, self.ffn)


def unrolled(module: nn.Module):
    """module as a plain function of x: LayerNorm, Linear, ReLU and Sequential (without its dropout: eval mode) as
    tensor functions on the module's weights; any other module's own forward."""
    if type(module) is nn.Sequential:
        parts = [unrolled(m) for m in module if not isinstance(m, nn.Dropout)]
        return lambda x: chain(parts, x)
    if type(module) is nn.LayerNorm:
        return lambda x, m=module: F.layer_norm(x, m.normalized_shape, m.weight, m.bias, m.eps)
    if type(module) is nn.Linear:
        return lambda x, m=module: F.linear(x, m.weight, m.bias)
    return torch.relu if type(module) is nn.ReLU else (lambda x: x) if type(module) is nn.Identity else module.forward


def chain(parts, x):
    for part in parts:
        x = part(x)
    return x


def unrolled_attention(attn: nn.Module):
    """t2r.py's attention step (x (B, h), state) -> (B, h), with the projections stacked as init_state leaves them;
    a subclass (a window, a family's heads) or another module runs its own step."""
    if type(attn) not in (SoftmaxAttention, LinearAttention):
        return attn.step
    H, out = attn.n_head, unrolled(attn.out_proj)
    if type(attn) is SoftmaxAttention:
        def softmax_step(x, state):  # SoftmaxAttention.step
            q, k, v = F.linear(x, *attn.stacked).view(x.shape[0], H, 1, -1).split(attn.d_head, -1)
            return out(F.scaled_dot_product_attention(q, *append_to_cache(state, k, v)).flatten(1))
        return softmax_step
    w, feature_map = attn.q_proj.out_features // H, attn.feature_map.forward  # w: d, or k once folded

    def linear_step(x, state):  # LinearAttention.step: Eqs. 6-7 on [S | z]
        q, k, v1 = F.linear(x, *attn.stacked).view(x.shape[0], H, 1, -1).split([w, w, attn.d_head + 1], -1)
        (fq, fk), Sz = feature_map(q, k), state["Sz"]
        if fk.dtype != Sz.dtype:  # bf16 weights or autocast: the state and its sums in float32
            fq, fk, v1 = widened(fq, fk, v1)
        with full_precision(x.device):
            add_to_state(fk, v1, Sz)  # Eq. 6
            attended = read_state(fq, Sz)  # Eq. 7
        return out(attended.to(x.dtype).flatten(1))
    return linear_step


def unrolled_cross_attention(attn: nn.Module):
    """t2r.py's step_cross (x (B, h), the source's state) -> (B, h): softmax over the source's keys and values, or
    Eq. 7 on the source's [S | z]; another module runs its own."""
    if type(attn) not in (SoftmaxAttention, LinearAttention):
        return attn.step_cross
    H, query, out = attn.n_head, unrolled(attn.q_proj), unrolled(attn.out_proj)
    if type(attn) is SoftmaxAttention:
        def softmax_cross(x, state):  # SoftmaxAttention.step_cross
            q = query(x).view(x.shape[0], H, 1, -1)
            return out(F.scaled_dot_product_attention(q, state["k"], state["v"], attn_mask=state["mask"]).flatten(1))
        return softmax_cross
    feature_map = attn.feature_map.forward

    def linear_cross(x, state):  # LinearAttention.step_cross
        (fq,) = feature_map(query(x).view(x.shape[0], H, 1, -1))
        with full_precision(x.device):
            attended = read_state(*widened(fq), state["Sz"])  # Eq. 7
        return out(attended.to(x.dtype).flatten(1))
    return linear_cross
