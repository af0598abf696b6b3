"""
A Hugging Face GPT-2 as the pretrained transformer that T2R converts (section 2.2). GPT-2 is t2r.TransformerLM with
learned positions, the tanh GELU and an unscaled token embedding (the switches of t2r.Config).

    python train_lm.py --init pretrained --pretrained hf:gpt2     # download GPT-2 (124M), convert, finetune on PTB
    python train_lm.py --init pretrained --pretrained hf:./gpt2   # a folder of config.json, model.safetensors and
                                                                  # tokenizer.json (or pytorch_model.bin)
    python generate.py --ckpt out/ptb-t2r-gpt2/model.pt --prompt "the company said"
    python -m experiments.gpt2_cost                               # its memory and CPU speed as T2R
"""

import json
import os
import re

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

from support.runtime import UserError, non_finite_weights
from t2r import Config, TransformerLM

PREFIX = "hf:"  # --pretrained hf:NAME (downloaded) or hf:FOLDER
FILES = ["config.json", "model.safetensors", "tokenizer.json"]  # what a download fetches
GPT2 = dict(model_type="gpt2", vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)  # 124M

# config.json settings that our model computes as GPT-2 does, default first; any other value is refused.
# (reorder_and_upcast_attn only computes the scores in float32, the same function: it is accepted.)
SUPPORTED = {"activation_function": ("gelu_new", "gelu_pytorch_tanh"),  # both the tanh approximation of the GELU
             "layer_norm_epsilon": (1e-5,),  # nn.LayerNorm's
             "scale_attn_weights": (True,),  # scores q.k / sqrt(d), Eq. 2
             "scale_attn_by_inverse_layer_idx": (False,),  # would divide layer i's scores by i + 1 too
             "add_cross_attention": (False,), "tie_word_embeddings": (True,)}  # our output layer is the embedding

# -----------------------------------------------------------------------------
# Where each GPT-2 tensor lands: our module <- GPT-2's, its .weight and its .bias alike. GPT-2's linear maps are
# Conv1Ds (c_*), x @ W + b with W stored input-major, (in, out): their weights are transposed into nn.Linear's
# (out, in). c_attn computes q, k and v at once, side by side along its 3h outputs: q_proj takes the first third.

TOP_MODULES = [("embed.tok", "wte", None),  # (V, h); GPT-2 ties its output layer to it as ours does
               ("embed.pos", "wpe", None),  # (n_positions, h): the learned positions
               ("final_norm", "ln_f", None)]
LAYER_MODULES = [("norm1", "ln_1", None),  # layers.{i}.<ours> <- h.{i}.<GPT-2's>; pre-norm: before attention
                 ("self_attn.q_proj", "attn.c_attn", 0), ("self_attn.k_proj", "attn.c_attn", 1),
                 ("self_attn.v_proj", "attn.c_attn", 2), ("self_attn.out_proj", "attn.c_proj", None),
                 ("norm2", "ln_2", None),  # before the MLP
                 ("ffn.0", "mlp.c_fc", None),  # h -> 4h, then the tanh GELU
                 ("ffn.3", "mlp.c_proj", None)]  # 4h -> h
# Skipped on purpose, being no parameters: the causal mask that older checkpoints save in every layer
# (h.{i}.attn.bias, a lower triangle, and h.{i}.attn.masked_bias, the -1e4 it fills in). Ours is causal by design.
MASK_BUFFERS = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")


def tensor_plan(model: TransformerLM) -> list:
    """(our tensor, GPT-2's tensor, which third of c_attn or None, transposed or not) for every tensor of ours."""
    modules = TOP_MODULES + [(f"layers.{i}.{ours}", f"h.{i}.{theirs}", third)
                             for i in range(model.config.n_layer) for ours, theirs, third in LAYER_MODULES]
    ours = model.state_dict()
    return [(f"{mine}.{p}", f"{theirs}.{p}", third, p == "weight" and theirs.split(".")[-1].startswith("c_"))
            for mine, theirs, third in modules for p in ("weight", "bias") if f"{mine}.{p}" in ours]


def read(tensor, third, transposed: bool):
    tensor = tensor if third is None else tensor.chunk(3, dim=-1)[third]
    return tensor.T if transposed else tensor


# -----------------------------------------------------------------------------
# Loading

def is_hf(spec) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


def folder_of(spec: str) -> str:
    """The folder of hf:FOLDER, or of hf:NAME downloaded (once) into the Hugging Face cache."""
    name = spec.removeprefix(PREFIX)
    if os.path.isdir(name):
        return name
    if not name or name.startswith((".", "/", "~")):
        raise UserError(f"--pretrained {spec}: there is no folder {name!r} (give hf:FOLDER, or a hub name: hf:gpt2)")
    try:
        from huggingface_hub import snapshot_download  # imported here: only a download needs it
        return snapshot_download(name, allow_patterns=FILES)
    except Exception as error:  # offline, an unknown name, a gated model: the hub's many errors all mean the same here
        raise UserError(f"could not download {name} from the Hugging Face hub ({type(error).__name__}): where the "
                        f"network allows, run `hf download {name} {' '.join(FILES)} --local-dir {name}`, bring "
                        f"that folder here and pass --pretrained hf:./{name}") from None


def read_config(folder: str) -> Config:
    path = os.path.join(folder, "config.json")
    try:
        with open(path) as f:
            return gpt2_config(json.load(f), path)
    except (OSError, ValueError) as error:  # a missing file or bad JSON (gpt2_config raises only UserError)
        raise UserError(f"cannot read {path} ({type(error).__name__}): a GPT-2 folder has config.json") from None


def gpt2_config(settings: dict, where: str) -> Config:
    """Our Config of the settings of a GPT-2 config.json, refusing any that would compute something else."""
    if not isinstance(settings, dict):
        raise UserError(f"{where} holds a JSON {type(settings).__name__}, not an object of settings: it is damaged")
    sizes = {key: settings.get(key) for key in ("vocab_size", "n_layer", "n_head", "n_embd", "n_positions")}
    wrong = next((key for key, value in sizes.items() if type(value) is not int or value < 1), None)  # true is no int
    if wrong and wrong in settings:
        raise UserError(f"{where} has {wrong}={settings[wrong]!r}: a GPT-2 size is a positive whole number")
    get = settings.get
    if get("model_type") != "gpt2":
        raise UserError(f"{where} describes a {get('model_type')!r} model: only GPT-2 (model_type gpt2) converts")
    for key, values in SUPPORTED.items():
        if get(key, values[0]) not in values:
            raise UserError(f"{where} has {key}={get(key)!r}, which our model does not compute (ours: {values[0]!r})")
    try:  # GPT-2's dropout on embeddings and sublayer outputs (resid_pdrop) is our one dropout; it has no attn_pdrop
        return Config(vocab_size=settings["vocab_size"], n_layer=settings["n_layer"], n_head=settings["n_head"],
                      d_model=settings["n_embd"], d_ff=get("n_inner") or 4 * settings["n_embd"],
                      dropout=get("resid_pdrop", 0.1), max_positions=settings["n_positions"],
                      activation="gelu_tanh", scale_embedding=False)
    except (KeyError, TypeError, ValueError) as error:
        raise UserError(f"{where} is not a usable GPT-2 config ({type(error).__name__}: {error})") from None


def read_tensors(folder: str) -> dict:
    """GPT-2's tensors by name, without the "transformer." of GPT2LMHeadModel.save_pretrained."""
    paths = [os.path.join(folder, name) for name in ("model.safetensors", "pytorch_model.bin")]
    path = next((p for p in paths if os.path.isfile(p)), None)
    if path is None:
        raise UserError(f"{folder} has neither model.safetensors nor pytorch_model.bin: download the weights")
    try:
        tensors = load_file(path) if path.endswith(".safetensors") else torch.load(path, "cpu", weights_only=True)
    except Exception as error:  # truncated, or no checkpoint at all: safetensors and torch raise many kinds
        raise UserError(f"{path} is unreadable ({type(error).__name__}): download it again") from None
    broken = non_finite_weights(tensors)
    if broken:
        raise UserError(f"{path} holds NaN or inf weights ({broken[0]}): it is damaged; download it again")
    return {name.removeprefix("transformer."): tensor for name, tensor in tensors.items()}


def load(folder: str) -> TransformerLM:
    """Our softmax TransformerLM with GPT-2's weights: every tensor of the checkpoint used, or a one-line error."""
    config, tensors = read_config(folder), read_tensors(folder)
    with torch.device("meta"):  # shapes first, no memory: a config.json too large for its tensors is refused here
        shapes = TransformerLM(config)
    plan = tensor_plan(shapes)
    used = {theirs for _, theirs, _, _ in plan} | {"lm_head.weight"}
    extra = sorted(name for name in tensors if name not in used and not MASK_BUFFERS.fullmatch(name))
    missing = [theirs for _, theirs, _, _ in plan if theirs not in tensors]
    if extra or missing:
        raise UserError(f"{folder}: the checkpoint {'has' if extra else 'lacks'} the tensor {(extra or missing)[0]}, "
                        f"which GPT-2 {'has not' if extra else 'has'}: it is another model, or damaged")
    if "lm_head.weight" in tensors and not torch.equal(tensors["lm_head.weight"], tensors["wte.weight"]):
        raise UserError(f"{folder}: lm_head.weight is not wte.weight, and our output layer is tied to the embedding")
    state, target = {}, shapes.state_dict()
    for ours, theirs, third, transposed in plan:
        state[ours] = read(tensors[theirs], third, transposed)
        if state[ours].shape != target[ours].shape:
            raise UserError(f"{folder}: {theirs} has shape {tuple(tensors[theirs].shape)}, not what config.json says")
    model = TransformerLM(config)  # the size of the tensors read: it fits
    model.load_state_dict({**state, "lm_head.weight": state["embed.tok.weight"]})
    return model


def tokenizer_file(folder: str) -> str:
    """The path of GPT-2's byte-level BPE, read with `tokenizers`: data.prepare cuts the corpus with it."""
    path = os.path.abspath(os.path.join(folder, "tokenizer.json"))
    try:
        newline = Tokenizer.from_file(path).encode("\n").ids
    except Exception as error:  # missing or damaged: tokenizers raises a plain Exception
        raise UserError(f"cannot read {path} ({type(error).__name__}): download it with the model") from None
    if len(newline) != 1:  # data.prepare ends every line with it, as <eos>
        raise UserError(f"{path} has no newline token: it is not GPT-2's byte-level BPE")
    return path
