"""
A Hugging Face model as the pretrained transformer that T2R converts (section 2.2): GPT-2, or one of the Llama family
(Llama, Qwen2, Mistral; SmolLM2 is a Llama), read into families.FamilyLM: GPT-2 with learned positions, the tanh GELU
and an unscaled token embedding; a Llama with RMSNorm, SwiGLU, rotary positions and grouped-query attention (the
fields of families.FamilyConfig). Each family has a table of where each of its tensors lands.

    python train_lm.py --init pretrained --pretrained hf:gpt2     # download GPT-2 (124M), convert, finetune on PTB
    python train_lm.py --init pretrained --pretrained hf:./gpt2   # a folder of config.json, model.safetensors and
                                                                  # tokenizer.json (or pytorch_model.bin)
    python train_lm.py --init pretrained --pretrained hf:HuggingFaceTB/SmolLM2-135M   # a Llama: the same job
    python generate.py --ckpt out/ptb-t2r-gpt2/model.pt --prompt "the company said"
    python -m experiments.gpt2_cost                               # its memory and CPU speed as T2R
    python -m experiments.llama_cost                              # SmolLM2-135M's, from 1K to 8K tokens
"""

import json
import math
import os
import re

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, models

from support.checkpoints import non_finite_weights
from support.data import EOS, after_a_line, end_of_line_id
from support.runtime import UserError
from families import FamilyConfig, FamilyLM, is_number

PREFIX = "hf:"  # --pretrained hf:NAME (downloaded) or hf:FOLDER
FILES = ["config.json", "tokenizer.json", "*.safetensors*"]  # what a download fetches: the weights, sharded or not
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
# Older Llama checkpoints save each layer's rotary frequencies (rotary_emb.inv_freq): ours come from config.json.
MASK_BUFFERS = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)|model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")


def tensor_plan(model: FamilyLM, family: str = "gpt2") -> list:
    """(our tensor, theirs, which third of c_attn or None, transposed or not) for every tensor of ours."""
    if family == "gpt2":
        modules = TOP_MODULES + [(f"layers.{i}.{ours}", f"h.{i}.{theirs}", third)
                                 for i in range(model.config.n_layer) for ours, theirs, third in LAYER_MODULES]
    else:  # the Llama family (below)
        modules = [(ours, theirs, None) for ours, theirs in LLAMA_TOP] + [
            (f"layers.{i}.{ours}", f"model.layers.{i}.{theirs}", None)
            for i in range(model.config.n_layer) for ours, theirs in LLAMA_LAYER]
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
        files = " ".join(repr(pattern) for pattern in FILES)
        raise UserError(f"could not download {name} from the Hugging Face hub ({type(error).__name__}): where the "
                        f"network allows, run `hf download {name} --include {files} --local-dir {name}`, bring "
                        f"that folder here and pass --pretrained hf:./{name}") from None


def read_settings(folder: str) -> dict:
    path = os.path.join(folder, "config.json")
    try:
        with open(path) as f:
            settings = json.load(f)
    except (OSError, ValueError) as error:  # a missing file or bad JSON
        raise UserError(f"cannot read {path} ({type(error).__name__}): a model's folder has config.json") from None
    if not isinstance(settings, dict):
        raise UserError(f"{path} holds a JSON {type(settings).__name__}, not an object of settings: it is damaged")
    return settings


def context_limit(folder: str) -> tuple:
    """(the longest sequence the checkpoint supports, the setting that says so): GPT-2's n_positions (its learned
    table ends there), a rotary model's max_position_embeddings (what it was trained to); (None, "") if none."""
    settings = read_settings(folder)
    key = "n_positions" if settings.get("model_type") == "gpt2" else "max_position_embeddings"
    limit = settings.get(key)
    return (limit, key) if type(limit) is int and limit > 0 else (None, "")


def describe(folder: str, tokenizer_path: str) -> str:
    """One line of what an hf: run converts: the family, its sizes, its context and its tokenizer."""
    settings, config = read_settings(folder), read_config(folder)
    limit, setting = context_limit(folder)
    tokenizer = Tokenizer.from_file(tokenizer_path)
    heads = f"{config.n_head} heads" + (f" ({config.n_kv_head} key/value)" if config.n_kv_head not in (0, config.n_head)
                                         else "")
    return (f"{folder}: {settings['model_type']}, {config.n_layer} layers, d_model {config.d_model}, {heads}, "
            f"vocabulary {config.vocab_size}" + (f", {limit} positions ({setting})" if limit else "") +
            f"; tokenizer: {type(tokenizer.model).__name__}, {tokenizer.get_vocab_size()} tokens")


def read_config(folder: str, settings: dict | None = None) -> FamilyConfig:
    """Our FamilyConfig of the folder's config.json (its settings, if read already), for each family its own reading; any
    other family is refused."""
    settings, where = settings or read_settings(folder), os.path.join(folder, "config.json")
    family = settings.get("model_type")
    if family == "gpt2":
        return gpt2_config(settings, where)
    if family in LLAMA_FAMILY:
        return llama_config(settings, where)
    raise UserError(f"{where} describes a {family!r} model: {', '.join(('gpt2',) + LLAMA_FAMILY)} convert "
                    f"(SmolLM2 is a llama)")


def gpt2_config(settings: dict, where: str) -> FamilyConfig:
    """Our FamilyConfig of the settings of a GPT-2 config.json, refusing any that would compute something else."""
    sizes = {key: settings.get(key) for key in ("vocab_size", "n_layer", "n_head", "n_embd", "n_positions")}
    wrong = next((key for key, value in sizes.items() if type(value) is not int or value < 1), None)  # true is no int
    if wrong and wrong in settings:
        raise UserError(f"{where} has {wrong}={settings[wrong]!r}: a GPT-2 size is a positive whole number")
    get = settings.get
    for key, values in SUPPORTED.items():
        if get(key, values[0]) not in values:
            raise UserError(f"{where} has {key}={get(key)!r}, which our model does not compute (ours: {values[0]!r})")
    check_dropouts(settings, where, ("resid_pdrop", "embd_pdrop", "attn_pdrop"))
    try:  # GPT-2's dropout on embeddings and sublayer outputs (resid_pdrop) is our one dropout; it has no attn_pdrop
        return FamilyConfig(vocab_size=settings["vocab_size"], n_layer=settings["n_layer"], n_head=settings["n_head"],
                      d_model=settings["n_embd"], d_ff=get("n_inner") or 4 * settings["n_embd"],
                      dropout=get("resid_pdrop", 0.1), max_positions=settings["n_positions"],
                      activation="gelu_tanh", scale_embedding=False)
    except (KeyError, TypeError, ValueError) as error:
        raise UserError(f"{where} is not a usable GPT-2 config ({type(error).__name__}: {error})") from None


# -----------------------------------------------------------------------------
# The Llama family: where each tensor lands (our module <- theirs, .weight and .bias alike, nn.Linear both: no
# transposes), and the config.json settings our model computes as they do.

LLAMA_FAMILY = ("llama", "qwen2", "mistral")
LLAMA_TOP = [("embed.tok", "model.embed_tokens"), ("final_norm", "model.norm"), ("lm_head", "lm_head")]
LLAMA_LAYER = [("norm1", "input_layernorm"),  # layers.{i}.<ours> <- model.layers.{i}.<theirs>; RMSNorm, pre-norm
               ("self_attn.q_proj", "self_attn.q_proj"), ("self_attn.k_proj", "self_attn.k_proj"),  # n_kv_head heads
               ("self_attn.v_proj", "self_attn.v_proj"), ("self_attn.out_proj", "self_attn.o_proj"),
               ("norm2", "post_attention_layernorm"),
               ("ffn.gate", "mlp.gate_proj"), ("ffn.up", "mlp.up_proj"), ("ffn.down", "mlp.down_proj")]  # SwiGLU
LLAMA_SUPPORTED = {"hidden_act": ("silu",), "mlp_bias": (False,), "pretraining_tp": (1,)}
BIASES = {"llama": "none", "mistral": "none", "qwen2": "qkv"}  # Qwen2's q, k and v have biases, nothing else


def rope_settings(settings: dict, where: str = "config.json") -> tuple:
    """(theta, scaling or None) from config.json: transformers 5 writes rope_parameters, earlier ones rope_theta and
    rope_scaling (whose type was once called "type"). Each is checked: a dict, a positive theta."""
    for key in ("rope_parameters", "rope_scaling"):
        if settings.get(key) is not None and not isinstance(settings[key], dict):
            raise UserError(f"{where} has {key}={settings[key]!r}: an object of rotary settings (or null) is expected")
    rope = settings.get("rope_parameters") or {**(settings.get("rope_scaling") or {}),
                                               "rope_theta": settings.get("rope_theta", 10_000.0)}
    theta = rope.get("rope_theta", 10_000.0)
    if not is_positive_number(theta):
        raise UserError(f"{where} has rope_theta={theta!r}: the rotary base is a positive number (10000 for most)")
    kind = rope.get("rope_type", rope.get("type", "default"))
    scaling = {key: value for key, value in rope.items() if key not in ("rope_theta", "type", "rope_type")}
    return theta, (None if kind == "default" else {**scaling, "rope_type": kind})


def llama_config(settings: dict, where: str) -> FamilyConfig:
    """Our FamilyConfig of a Llama, Qwen2 or Mistral config.json, refusing any setting that would compute otherwise."""
    family, get = settings["model_type"], settings.get
    names = ("vocab_size", "num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size")
    wrong = next((key for key in names if type(get(key)) is not int or get(key) < 1), None)
    if wrong:
        raise UserError(f"{where} has {wrong}={get(wrong)!r}: a size is a positive whole number")
    heads, width = settings["num_attention_heads"], settings["hidden_size"]
    if get("head_dim") not in (None, width // heads) or width % heads:
        raise UserError(f"{where} has heads of {get('head_dim')} dimensions, not hidden_size / num_attention_heads: "
                        f"our heads split the width")
    for key, values in LLAMA_SUPPORTED.items():
        if get(key, values[0]) not in values:
            raise UserError(f"{where} has {key}={get(key)!r}, which our model does not compute (ours: {values[0]!r})")
    if get("attention_bias", False):
        raise UserError(f"{where} has attention_bias=true (biases on q, k, v and o alone): our model does not")
    check_dropouts(settings, where, ("attention_dropout",))
    window = get("sliding_window") if family == "mistral" or get("use_sliding_window") else None
    if window:
        raise UserError(f"{where} attends within a sliding window of {window} tokens, which our softmax teacher does "
                        f"not compute: use a checkpoint without one (sliding_window null)")
    theta, scaling = rope_settings(settings, where)
    try:
        return FamilyConfig(vocab_size=settings["vocab_size"], n_layer=settings["num_hidden_layers"], n_head=heads,
                      d_model=width, d_ff=settings["intermediate_size"], dropout=get("attention_dropout", 0.0),
                      tie_embeddings=get("tie_word_embeddings", False), scale_embedding=False, norm="rmsnorm",
                      norm_eps=get("rms_norm_eps", 1e-6), ffn="swiglu", bias=BIASES[family],
                      n_kv_head=get("num_key_value_heads") or heads, rope_theta=theta, rope_scaling=scaling)
    except (TypeError, ValueError) as error:
        raise UserError(f"{where} is not a usable {family} config ({error})") from None


def is_positive_number(x) -> bool:
    return is_number(x) and math.isfinite(x) and x > 0


def check_dropouts(settings: dict, where: str, keys: tuple):
    """Each dropout config.json names is a number in [0, 1): a string or 1.5 would break later, as a traceback."""
    for key in keys:
        value = settings.get(key, 0.0)
        if not (is_number(value) and 0 <= value < 1):
            raise UserError(f"{where} has {key}={value!r}: a dropout is a number in [0, 1)")


def check_tensors(tensors: dict, n_layer: int, family: str, folder: str):
    """What the tensors present say, before a model is built for them: floating-point weights (an int8 one is a
    quantized checkpoint, which would be cast and converted as if it were the weights), and as many layers as
    config.json says (a million would take minutes to build, only to find tensors missing)."""
    stored = next(((name, t.dtype) for name, t in tensors.items() if not t.is_floating_point()
                   and not MASK_BUFFERS.fullmatch(name)), None)
    if stored:
        raise UserError(f"{folder}: {stored[0]} is stored as {stored[1]} (a quantized checkpoint?): convert one whose "
                        f"weights are float32, float16 or bfloat16")
    pattern = re.compile(r"h\.(\d+)\." if family == "gpt2" else r"model\.layers\.(\d+)\.")
    present = {int(m.group(1)) for m in map(pattern.match, tensors) if m}
    if present != set(range(n_layer)):
        raise UserError(f"{folder}: config.json says {n_layer} layers, its tensors hold {len(present)}: it is "
                        f"another model's config, or damaged")


def weight_files(folder: str) -> list:
    """The checkpoint's files: the shards its model.safetensors.index.json names, or its one file."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise UserError(f"cannot read {index} ({type(error).__name__}): download it again") from None
        missing = next((name for name in shards if not os.path.isfile(os.path.join(folder, name))), None)
        if missing:
            raise UserError(f"{folder} lacks {missing}, a shard its model.safetensors.index.json names: download it")
        return [os.path.join(folder, name) for name in shards]
    paths = [os.path.join(folder, name) for name in ("model.safetensors", "pytorch_model.bin")]
    path = next((p for p in paths if os.path.isfile(p)), None)
    if path is None:
        raise UserError(f"{folder} has neither model.safetensors (or its shards) nor pytorch_model.bin: download "
                        f"the weights")
    return [path]


def read_tensors(folder: str) -> dict:
    """The checkpoint's tensors by name (GPT-2's without the "transformer." of GPT2LMHeadModel.save_pretrained), in
    the dtype they were saved in: bf16 ones become the model's when loaded into it."""
    tensors = {}
    for path in weight_files(folder):
        try:
            part = load_file(path) if path.endswith(".safetensors") else torch.load(path, "cpu", weights_only=True)
        except Exception as error:  # truncated, or no checkpoint at all: safetensors and torch raise many kinds
            raise UserError(f"{path} is unreadable ({type(error).__name__}): download it again") from None
        broken = non_finite_weights(part)
        if broken:
            raise UserError(f"{path} holds NaN or inf weights ({broken[0]}): it is damaged; download it again")
        tensors.update({name.removeprefix("transformer."): tensor for name, tensor in part.items()})
    return tensors


def load(folder: str) -> FamilyLM:
    """Our softmax FamilyLM with the checkpoint's weights: every tensor of it used, or a one-line error."""
    settings = read_settings(folder)
    config, tensors, family = read_config(folder, settings), read_tensors(folder), settings["model_type"]
    check_tensors(tensors, config.n_layer, family, folder)
    with torch.device("meta"):  # shapes first, no memory: a config.json too large for its tensors is refused here
        shapes = FamilyLM(config)
    head = "lm_head.weight"  # a tied model's output layer is its embedding: saved or not, it is not read
    plan = [row for row in tensor_plan(shapes, family) if not (config.tie_embeddings and row[0] == head)]
    embedding = next(theirs for ours, theirs, _, _ in plan if ours == "embed.tok.weight")
    used = {theirs for _, theirs, _, _ in plan} | ({head} if config.tie_embeddings else set())
    extra = sorted(name for name in tensors if name not in used and not MASK_BUFFERS.fullmatch(name))
    missing = [theirs for _, theirs, _, _ in plan if theirs not in tensors]
    if extra or missing:
        raise UserError(f"{folder}: the checkpoint {'has' if extra else 'lacks'} the tensor {(extra or missing)[0]}, "
                        f"which {family} {'has not' if extra else 'has'}: it is another model, or damaged")
    if config.tie_embeddings and head in tensors and not torch.equal(tensors[head], tensors[embedding]):
        raise UserError(f"{folder}: {head} is not {embedding}, and config.json ties the output layer to the embedding")
    state, target = {}, shapes.state_dict()
    for ours, theirs, third, transposed in plan:
        state[ours] = read(tensors[theirs], third, transposed)
        if state[ours].shape != target[ours].shape:
            raise UserError(f"{folder}: {theirs} has shape {tuple(tensors[theirs].shape)}, not what config.json says")
    model = FamilyLM(config)  # the size of the tensors read: it fits
    model.load_state_dict({**state, head: state["embed.tok.weight"]} if config.tie_embeddings else state)
    return model


def tokenizer_file(folder: str) -> str:
    """The path of the checkpoint's tokenizer.json, read with `tokenizers`: data.prepare encodes the corpus with it,
    as it encodes the file's text. A line's end is whatever one token it makes of a newline within a text (a prefix
    space or sentencepiece's ▁ goes to a string's start, not to the newline); a word-level one drops newlines: its
    <eos> ends each line, as the project's own."""
    path = os.path.abspath(os.path.join(folder, "tokenizer.json"))
    try:
        tokenizer = Tokenizer.from_file(path)
    except Exception as error:  # missing or damaged: tokenizers raises a plain Exception
        raise UserError(f"cannot read {path} ({type(error).__name__}): download it with the model") from None
    vocab = tokenizer.get_vocab()
    if isinstance(tokenizer.model, models.WordLevel):
        missing = [t for t in (EOS, tokenizer.model.unk_token) if t not in vocab]
        if missing:
            raise UserError(f"{path} is a word-level tokenizer without {' or '.join(missing)}: each line ends with "
                            f"{EOS} and unknown words become its unk_token, so its vocabulary needs both")
    elif end_of_line_id(tokenizer) is None:  # its id stands for <eos> (the evaluation's first context token)
        newline = after_a_line(lambda text: tokenizer.encode(text, add_special_tokens=False).ids, "")
        made = "merges it with the text before it" if newline is None else f"makes {len(newline)} tokens of it"
        raise UserError(f"{path} {made}, not one token, where a line ends within a text: its model cannot mark a "
                        f"line's end the way data.prepare reads it (a byte-level BPE and sentencepiece's have one)")
    return path
