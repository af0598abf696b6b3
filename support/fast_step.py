"""
Decoding speed, in one place: what generate.py, translate.py, bench.py and benchmarks/ run instead of t2r.py's step
(`model.step`, Eqs. 6-7 as the paper writes them, on S and z), each held by tests/test_step.py to its logits within a
stated tolerance. FlatStep: the step unrolled, its layers' parts called as plain functions, q, k and v from one stacked
product, S and z fused as [S | z]; compile_step: the step through torch.compile; CapturedStep: the fast step recorded
once as a CUDA graph and replayed. The fused state's pieces (add_to_state, read_sums, stacked_by_head) are
layers/states.py's: families.py's and decay.py's grouped-query layers step with them too.

    python -m pytest -q tests/test_step.py
"""

import copy
from functools import partial
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten

from after_t2r import CONVOLVED
from decay import DecayingAttention
from families import FamilyBlock, FamilyLM
from layers.states import add_to_state, append_to_cache, full_precision, read_sums, stacked_by_head, widened  # [S | z]
from t2r import (Block, FoldedT2RFeatureMap, LinearAttention, SoftmaxAttention, T2RFeatureMap, TransformerBase,
                 fold_feature_map, normalize)


# -----------------------------------------------------------------------------
# The fused step: t2r.py's Eqs. 6-7 on S and z side by side, Sz = [S | z] (B, H, k, d + 1) with v1 = [v | 1], and
# q, k, v (and the 1) from one product, because at batch 1 each operation costs more than its arithmetic.

def read_state(fq, Sz):  # fq (B, H, Q, k): Q queries read each head's state -> (B, H, Q, d)
    return normalize(*read_sums(fq, Sz))  # Eq. 7


def fused(state):
    """A model's state (t2r.py's init_state) with each {S, z} in it held as one [S | z] (B, H, k, d + 1), "Sz", and S
    and z as views of it: the fast step adds to [S | z], the model's step and prefill to S and z, one state moving."""
    if isinstance(state, dict) and {"S", "z"} <= state.keys():
        Sz = torch.cat([state["S"], state["z"][..., None]], -1)
        return {**state, "Sz": Sz, "S": Sz[..., :-1], "z": Sz[..., -1]}
    if isinstance(state, dict):
        return {key: fused(part) for key, part in state.items()}
    return [fused(part) for part in state] if isinstance(state, list) else state


def compile_step(model):
    """A shallow copy of model whose step runs its layers and output head through torch.compile (the first steps
    compile; it pays off over long generations); the caller's model is left as it is. The embedding and the position
    counter stay outside, so a new position does not recompile."""
    compiled = copy.copy(model)
    compiled.step_layers = torch.compile(compiled.step_layers)  # what a family's step calls (families.py)
    if type(model).step is TransformerBase.step:  # t2r.py's step loops its layers itself, for the reader: the
        compiled.step = partial(step_compiled_layers, compiled)  # compiled loop runs in its place
    return compiled


def step_compiled_layers(model, tokens, state):
    """t2r.py's TransformerBase.step with its loop over the layers and the head in model.step_layers (compiled)."""
    if model.training:
        raise ValueError("step generates: call model.eval() first (in training mode dropout would apply)")
    with torch.no_grad():
        x = model.embed(tokens[:, None], start=state["pos"])[:, 0]
        logits = model.step_layers(x, state["layers"])
        state["pos"] += 1
        return logits, state


# -----------------------------------------------------------------------------
# The step unrolled: t2r.py's step on the same weights, fused, without its module calls

class FlatStep:
    """init_state and step of a t2r.py model, giving its step's logits (tests/test_step.py: within 1e-12 in float64),
    with the layers' parts called as plain functions and the linear attention's step fused (above). Why: at batch 1 on
    a CPU each module call costs microseconds, as much as a small layer's arithmetic, and t2r.py's step, written to be
    read, makes about ten a layer; unrolled and fused, a token takes 0.79 of its time at batch 1 on the default LM
    (results/measurements.md).
    Unrolled: torch's LayerNorm, Linear and ReLU (the MLP, the head), t2r.py's multi-head softmax and linear
    attention, self and cross, and decay.py's decaying state (folded here, which the layer is not), after the short
    convolution's step where a layer has one (after_t2r.py); the embedding and any other attention module (the
    window's, bench.py's floors) run as modules. Build it from the model as it will decode (folded, on its device, in
    its dtype): it reads the model's weights (W_q, W_k, W_v stacked at each init_state). Its state is the model's,
    fused: the model's prefill reads a prompt into it. A model that steps its own way (a family's with rotary
    positions or grouped heads: a Llama's; SRU++) does not fit: `eager_decoder` gives it its own step."""

    def __init__(self, model):
        if model.training:
            raise ValueError("FlatStep decodes: call model.eval() first (it leaves dropout out)")
        if not self.fits(model):
            raise ValueError(f"FlatStep unrolls t2r.py's step: {type(model).__name__} steps its own way")
        self.model, self.stackers = model, []  # what stacks each attention's W_q, W_k, W_v at init_state
        self.blocks = [FlatBlock(layer, self.stackers) for layer in model.layers]
        self.final_norm, self.lm_head = unrolled(model.final_norm), unrolled(model.lm_head)

    @property
    def config(self):  # the model's (bench.py reads a decoder's)
        return self.model.config

    @staticmethod
    def fits(model) -> bool:  # whether model steps as t2r.py's models do (its layers' parts may be others')
        if not isinstance(model, TransformerBase):  # SRU++ (sru.py) has no layers of t2r.py's to unroll
            return False
        if isinstance(model, FamilyLM):  # families.py's: t2r.py's step where it has no rotation to pass, so
            return not model.config.is_grouped() and stepped_as(model, FamilyLM, FamilyBlock)  # no rotary positions
        return stepped_as(model, TransformerBase, Block)

    def init_state(self, batch_or_src):
        """model.init_state (a batch size, or a translator's source (B, S)), fused. It also stacks each attention's
        W_q, W_k, W_v into the one projection the steps use: a sequence steps with the weights of its init_state."""
        for stack in self.stackers:
            stack()
        return fused(self.model.init_state(batch_or_src))

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


def stepped_as(model, model_class, block_class) -> bool:  # model's step and its layers' are those classes' own
    steps = [(type(model).step, model_class.step), (type(model).step_layers, model_class.step_layers)]
    return all(a is b for a, b in steps) and all(type(layer).step is block_class.step for layer in model.layers)


def eager_decoder(model):
    """What decodes model eagerly: FlatStep where it fits, else the model's own step."""
    return FlatStep(model) if FlatStep.fits(model) else model


class FlatBlock:
    """t2r.Block.step: each sublayer with its residual and norm, post-norm (the paper's) or pre-norm."""

    def __init__(self, block: nn.Module, stackers: list):
        self.pre_norm, self.ffn = block.pre_norm, unrolled(block.ffn)
        self.norm1, self.norm2 = unrolled(block.norm1), unrolled(block.norm2)
        self.self_attn = unrolled_attention(block.self_attn, stackers)
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


def unrolled_attention(attn: nn.Module, stackers: list):
    """t2r.py's attention step (x (B, h), state) -> (B, h), q, k, v (and linear attention's 1) from one product on the
    weights the function stackers gets stacks, after the short convolution's step where the layer has one; a subclass
    (a window, a family's heads) or another module runs its own step."""
    kind = CONVOLVED.get(type(attn), type(attn))
    if kind not in (SoftmaxAttention, LinearAttention, DecayingAttention):
        return attn.step
    step = fused_attention_step(kind, attn, stackers)
    if type(attn) in CONVOLVED:  # ConvInput.step: the last K - 1 inputs in state["conv"]
        return lambda x, state: step(attn.conv.step(x, state["conv"]), state)
    return step


def fused_attention_step(kind: type, attn: nn.Module, stackers: list):  # kind: attn's class, or what it convolves
    H, out, stacked = attn.n_head, unrolled(attn.out_proj), {}
    decays = kind is DecayingAttention  # decay.py's: [S | z] = g_i [S | z] before Eq. 6, g_i from the key's mean
    folds = decays and isinstance(attn.feature_map, T2RFeatureMap)  # Eq. 8, which decay.py's layer leaves undone

    def stack():  # [q | k | v (| 1)] by head, from the weights as they are now ([q | k | g | v | 1] where it decays)
        maps = decaying_maps(attn, folds) if decays else (attn.q_proj, attn.k_proj, attn.v_proj)
        stacked["qkv"] = stacked_by_head(maps, H, kind is not SoftmaxAttention)
    stackers.append(stack)
    if kind is SoftmaxAttention:
        def softmax_step(x, state):  # SoftmaxAttention.step
            q, k, v = F.linear(x, *stacked["qkv"]).view(x.shape[0], H, 1, -1).split(attn.d_head, -1)
            return out(F.scaled_dot_product_attention(q, *append_to_cache(state, k, v)).flatten(1))
        return softmax_step
    w = attn.feature_map.weight.shape[1] if folds else attn.q_proj.out_features // H  # d, or k once folded
    feature_map = FoldedT2RFeatureMap().forward if folds else attn.feature_map.forward
    widths = [w, w, 1, attn.d_head + 1] if decays else [w, w, attn.d_head + 1]

    def linear_step(x, state):  # LinearAttention.step: Eqs. 6-7 on [S | z] (DecayingAttention.step: decayed first)
        q, k, *key_mean, v1 = F.linear(x, *stacked["qkv"]).view(x.shape[0], H, 1, -1).split(widths, -1)
        (fq, fk), Sz = feature_map(q, k), state["Sz"]
        if fk.dtype != Sz.dtype:  # bf16 weights or autocast: the state and its sums in float32
            fq, fk, v1 = widened(fq, fk, v1)
        with full_precision(x.device):
            if decays:  # the gate g_i (B, H, 1, 1) from the key's mean (of one entry: itself), in the state's precision
                Sz.mul_(attn.log_gate(key_mean[0].to(Sz.dtype)).exp()[..., None])
            add_to_state(fk, v1, Sz)  # Eq. 6
            attended = read_state(fq, Sz)  # Eq. 7
        return out(attended.to(x.dtype).flatten(1))
    return linear_step


def decaying_maps(attn: DecayingAttention, folds: bool) -> tuple:
    """decay.py's layer's q, k, the key's mean over its d entries (what the gate reads: a map of its own, the mean of
    W_k's rows per head) and v, for one product. folds: W_phi merged into W_q and W_k (Eq. 8), which the layer does not
    do itself, as its gate reads the unfolded key; the layer is left as it is."""
    H, h = attn.k_proj.out_features // attn.d_head, attn.k_proj.in_features
    key_mean = nn.Linear(h, H, bias=attn.k_proj.bias is not None, device=attn.k_proj.weight.device,
                         dtype=attn.k_proj.weight.dtype)
    key_mean.weight.data.copy_(attn.k_proj.weight.detach().view(H, -1, h).mean(1))
    if attn.k_proj.bias is not None:
        key_mean.bias.data.copy_(attn.k_proj.bias.detach().view(H, -1).mean(1))
    if folds:  # fold_feature_map sets new q and k maps on what it is given: here a view of the layer's, not the layer
        attn = SimpleNamespace(q_proj=attn.q_proj, k_proj=attn.k_proj, v_proj=attn.v_proj, feature_map=attn.feature_map)
        fold_feature_map(attn)
    return attn.q_proj, attn.k_proj, key_mean, attn.v_proj


def unrolled_cross_attention(attn: nn.Module):
    """t2r.py's step_cross (x (B, h), the source's state) -> (B, h): softmax over the source's keys and values, or
    Eq. 7 on the source's [S | z] (fused by init_state); another module runs its own."""
    if type(attn) not in (SoftmaxAttention, LinearAttention):
        return attn.step_cross
    H, query, out = attn.n_head, unrolled(attn.q_proj), unrolled(attn.out_proj)
    if type(attn) is SoftmaxAttention:
        def softmax_cross(x, state):  # SoftmaxAttention's step_cross
            q = query(x).view(x.shape[0], H, 1, -1)
            return out(F.scaled_dot_product_attention(q, state["k"], state["v"], attn_mask=state["mask"]).flatten(1))
        return softmax_cross
    feature_map = attn.feature_map.forward

    def linear_cross(x, state):  # LinearAttention's step_cross
        (fq,) = feature_map(query(x).view(x.shape[0], H, 1, -1))
        with full_precision(x.device):
            attended = read_state(*widened(fq), state["Sz"])  # Eq. 7
        return out(attended.to(x.dtype).flatten(1))
    return linear_cross


# -----------------------------------------------------------------------------
# The step recorded as a CUDA graph

class CapturedStep:
    """The eager step of a language model (FlatStep where it fits, else the model's own) recorded once per batch size as
    a CUDA graph, and replayed at every token: one launch per token instead of one per operation. A constant-size state
    is static memory, so this works only where every self-attention is linear without a window (a KV cache grows; a
    graph replays fixed shapes at fixed addresses). At most `length` steps per init_state; the logits returned are a
    copy, valid after the next step."""

    def __init__(self, model, length: int):
        self.device = next(model.parameters()).device
        if self.device.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device")
        states = [] if model.config.n_encoder_layer else [layer.self_attn.init_state(1, torch.device("meta"),
                                                                                     torch.float32) for layer in model.layers]
        fixed = [all(torch.is_tensor(part) for part in state.values()) for state in states]  # no count of the tokens
        if not fixed or not all(fixed):  # kept, as a KV cache or a window has
            raise ValueError("CUDA graphs need a language model whose every self-attention has a constant-size state "
                             "(linear attention without a window); use --step eager")
        if hasattr(model.embed, "check_end"):  # a learned table (families.py): the graph reads its position on the
            model.embed.check_end(length)  # device, so it is checked here, for every step
        self.decoder, self.length, self.batch_size, self.steps = eager_decoder(model), length, None, 0

    def record(self, batch_size: int):
        """Static inputs, state and outputs; warm-up on a side stream, as torch.cuda.graphs asks; then capture."""
        self.tokens = torch.zeros(batch_size, dtype=torch.long, device=self.device)
        self.state = self.decoder.init_state(batch_size)  # the model's prefill reads a prompt into it
        self.state["pos"] = torch.zeros((), dtype=torch.long, device=self.device)  # a tensor: read on the device
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(3):
                self.decoder.step(self.tokens, self.state)
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits, _ = self.decoder.step(self.tokens, self.state)
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
