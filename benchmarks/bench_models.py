"""The models bench.py measures: their names, what each is, and how each is built (random weights of the LM's
shapes, or of --ckpt's, on --device in --dtype)."""

import os

import torch
import torch.nn as nn

from after_t2r import WindowAttention
from benchmarks.bench_tools import NoAttention, ProjectionsOnly, replace_self_attention
from support.checkpoints import load_checkpoint
from support.fast_step import CapturedStep, compile_step, eager_decoder
from sru import SRUConfig, SRUppLM
from support.configs import build_model, config_of
from support.fla_kernel import FlaLinearAttention
from t2r import Config, LinearAttention, Seq2SeqTransformer, SoftmaxAttention, fold


# The language models: name -> (attention, feature size k, folded with Eq. 8, what it is). All run t2r.py's step
# (SRU++ and the window its own) as generate.py does: unrolled (support/fast_step.py's FlatStep), but *_graph (a CUDA
# graph, CUDA only) and *_compiled (torch.compile; not with --quick).
LM_MODELS = {
    "softmax_kv": ("softmax", 32, False, "softmax with its KV cache (preallocated, doubled when full)"),
    "softmax_recompute": ("softmax", 32, False, "softmax re-running the whole prefix at every token "
                          "(Katharopoulos et al.'s baseline), up to --recompute_max"),
    "t2r32": ("t2r", 32, True, "T2R, k = 32, folded: the generation model"),
    "t2r32_graph": ("t2r", 32, True, "t2r32's step recorded once as a CUDA graph and replayed (CUDA only)"),
    "t2r32_compiled": ("t2r", 32, True, "t2r32's step through torch.compile"),
    "t2r32_unfolded": ("t2r", 32, False, "the same, not folded: what folding gains"),
    "t2r32_window64": ("t2r", 32, False, "T2R, k = 32, with a softmax window of the last 64 tokens (window "
                       "layers are not folded: their softmax needs q and k)"),
    "t2r4": ("t2r", 4, True, "T2R, k = 4, folded"),
    "t2r4_unfolded": ("t2r", 4, False, "the same, not folded"),
    "elu": ("elu", 32, False, "ELU + 1 feature map (k = d = 64)"),
    "rfa32": ("rfa", 32, False, "random feature attention, k = 32"),
    "floor": ("t2r", 32, True, "t2r32 with every self-attention removed (its step returns zeros)"),
    "proj_only": ("t2r", 32, True, "t2r32 whose self-attentions run the same stacked q, k, v projection and the "
                  "output projection, but not the attention: the cost of the weights alone"),
    "proj_only_compiled": ("t2r", 32, True, "proj_only through torch.compile"),
}
# SRU++ of the LM's width and depth: name -> (attention in every layer, or in the top one only; what it is).
SRU_MODELS = {
    "sru++": (False, "SRU++, one attention head of d' = d/4 in every layer: c and a d' KV cache per layer"),
    "sru++_top": (True, "SRU++ with attention in the top layer only: c per layer and one d' KV cache"),
}
# The translators: name -> (attention, cross-attention k, causal self-attention k, folded, what it is).
S2S_MODELS = {
    "softmax_kv": ("softmax", 32, 32, False, "softmax with self and cross KV caches"),
    "t2r32-4": ("t2r", 32, 4, True, "T2R, cross k = 32, causal k = 4, folded"),
    "t2r32-4_unfolded": ("t2r", 32, 4, False, "the same, not folded"),
    "elu": ("elu", 64, 64, False, "ELU + 1 (k = d = 64)"),
    "rfa32-4": ("rfa", 32, 4, False, "random feature attention, cross k = 32, causal k = 4"),
}
TRAIN_MODELS = {
    "softmax_sdpa": "softmax, F.scaled_dot_product_attention (a fused kernel)",
    "softmax_math": "the same with the math backend, which forms the T x T matrix (up to --quadratic_max)",
    "t2r_quadratic": "T2R with chunk_size 0, also T x T (up to --quadratic_max)",
    "t2r_chunked": "T2R with chunk_size 64: linear in T",
    "t2r_window64": "T2R chunked with a softmax window of 64: the hybrid's training form, linear in T",
    "t2r_fla": "T2R chunked with flash-linear-attention's chunk kernel (support/fla_kernel.py; CUDA, if installed)",
    **{name: spec[1] + " (whole-LM section only)" for name, spec in SRU_MODELS.items()},
}
WINDOW = 64  # the W of the window models
GEN_MODELS = list(dict.fromkeys([*LM_MODELS, *SRU_MODELS, *S2S_MODELS]))  # the names --models accepts
CAPACITY_MODELS = ("softmax_kv", "t2r32")  # the largest batch at --capacity_length: a KV cache against a state
PAIRS = (("t2r32", "proj_only"), ("t2r32_compiled", "proj_only_compiled"))  # section pairs: a step against a step


# -----------------------------------------------------------------------------
# Builders

def lm_config(args, **overrides) -> Config:
    """The random LM (4 layers, --d_model, --n_head, a feed-forward 4x as wide, --vocab_size), or the shapes of
    --ckpt."""
    base = dict(vocab_size=args.vocab_size, n_layer=4, n_head=args.n_head, d_model=args.d_model,
                d_ff=4 * args.d_model, dropout=0.0)
    if args.ckpt_config:
        base.update({k: args.ckpt_config[k] for k in ("vocab_size", "n_layer", "n_head", "d_model", "d_ff",
                                                      "pre_norm", "tie_embeddings") if k in args.ckpt_config})
    return config_of({**base, **overrides})  # with a window: after_t2r.WindowConfig


def load_fitting(model: nn.Module, args) -> nn.Module:
    """Copy the --ckpt tensors whose name and shape fit (all but the feature maps of another kind)."""
    if args.ckpt_state:
        target = model.state_dict()
        fitting = {k: v for k, v in args.ckpt_state.items() if k in target and target[k].shape == v.shape}
        model.load_state_dict(fitting, strict=False)
    return model


def sru_model(name: str, args, dropout: float = 0.0) -> SRUppLM:
    c = lm_config(args)
    top_only = SRU_MODELS[name][0]
    return SRUppLM(SRUConfig(vocab_size=c.vocab_size, n_layer=c.n_layer, d_model=c.d_model,
                             attn_every=c.n_layer if top_only else 1, dropout=dropout))


def place(model: nn.Module, args) -> nn.Module:
    """On --device, in --dtype (a generation model's weights; training keeps float32 weights under autocast)."""
    return model.to(args.device, torch.bfloat16 if args.dtype == "bfloat16" else torch.float32)


def plain_lm(name: str, args):
    """The model of LM_MODELS[name] as t2r.py builds it (folded where the name says), on --device: no decoder."""
    kind, k, folded, _ = LM_MODELS[name]
    window = WINDOW if "window" in name else 0
    model = load_fitting(build_model(lm_config(args, attn=kind, feature_size=k, window=window)), args).eval()
    return place(fold(model) if folded else model, args)


def transformers_twin(family: str, vocab: int, layers: int, width: int, heads: int, ffn: int, positions: int):
    """transformers' own model of a shape, random weights, in eval mode (None where transformers is not installed):
    a GPT-2, or a Llama (rotary positions, SwiGLU, 2 query heads a key/value head). Its generate() makes exactly
    the new tokens asked for (no end-of-text token)."""
    try:
        import transformers
    except ImportError:
        return None
    transformers.utils.logging.disable_progress_bar()
    if family == "gpt2":
        config = transformers.GPT2Config(vocab_size=vocab, n_layer=layers, n_embd=width, n_head=heads, n_inner=ffn,
                                         n_positions=positions, bos_token_id=None, eos_token_id=None)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(vocab_size=vocab, num_hidden_layers=layers, hidden_size=width,
                                          num_attention_heads=heads, num_key_value_heads=heads // 2,
                                          intermediate_size=ffn, max_position_embeddings=positions,
                                          tie_word_embeddings=True, bos_token_id=None, eos_token_id=None)
        model = transformers.LlamaForCausalLM(config)
    model.generation_config.pad_token_id = model.generation_config.eos_token_id = None
    return model.eval()


def build_lm(name: str, args):
    """name -> (model, mode) with mode 'step' (recurrent) or 'recompute' (the whole prefix at every token)."""
    if name in SRU_MODELS:
        return place(sru_model(name, args).eval(), args), "step"
    model = plain_lm(name, args)
    if name == "floor":
        model = place(replace_self_attention(model, lambda attn: NoAttention()), args)
    if name.startswith("proj_only"):
        model = place(replace_self_attention(model, ProjectionsOnly), args)
    if name == "softmax_recompute":
        return model, "recompute"
    if name.endswith("_compiled"):
        return compile_step(model), "step"
    return (CapturedStep(model, max(args.lengths) + 16) if name.endswith("_graph") else eager_decoder(model)), "step"


def build_s2s(name: str, args):
    kind, cross_k, self_k, folded, _ = S2S_MODELS[name]
    config = lm_config(args, n_encoder_layer=lm_config(args).n_layer, attn=kind, feature_size=self_k,
                       cross_attn=kind, cross_feature_size=cross_k)
    model = Seq2SeqTransformer(config).eval()
    return eager_decoder(place(fold(model) if folded else model, args)), "step"


def translator_name(run: str) -> str:
    """softmax, t2r, ... from a run's model.pt: its attention kinds, and _window for a hybrid."""
    config = load_checkpoint(os.path.join(run, "model.pt"))["config"]
    kinds = sorted(set(config_of(config).layer_kinds()) | {config.get("cross_attn", "softmax")})
    return "+".join(kinds) + ("_window" if config.get("window") else "")


def train_model(section, name, args):
    if name in SRU_MODELS:
        return sru_model(name, args, dropout=0.1).to(args.device).train()
    kind, chunk = ("softmax", 0) if name.startswith("softmax") else ("t2r", 0 if name == "t2r_quadratic" else 64)
    window = WINDOW if "window" in name else 0
    if section == "train_attn":
        config = lm_config(args, chunk_size=chunk, window=window)
        if kind == "softmax":
            return SoftmaxAttention(config, causal=True).to(args.device)
        if window:
            return WindowAttention(config, "t2r", 32).to(args.device)
        layer = (FlaLinearAttention if name == "t2r_fla" else LinearAttention)(config, True, "t2r", 32)
        return layer.to(args.device)
    model = build_model(lm_config(args, attn=kind, feature_size=32, chunk_size=chunk, window=window, dropout=0.1))
    return load_fitting(model, args).to(args.device).train()
