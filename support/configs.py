"""What is checked and derived of a t2r.Config, kept out of t2r.py's way: the one-line reasons a config cannot be
(check_config, run by Config itself), which layers a conversion keeps softmax (converted_kinds, for convert), and
the feature sizes the result tables show (feature_sizes)."""

POSITIONS = ("sinusoidal", "learned")


def check_config(c, attention_kinds: tuple, activations: dict, positions: str | None = None):
    """Raise ValueError, in one line, for a config that cannot be built."""
    for name, least in (("vocab_size", 1), ("n_layer", 1), ("n_head", 1), ("d_model", 1), ("d_ff", 1),
                        ("n_encoder_layer", 0), ("chunk_size", 0), ("window", 0), ("max_positions", 0)):
        value = getattr(c, name)
        if not isinstance(value, int) or value < least:
            raise ValueError(f"{name}={value!r} must be an integer >= {least}")
    if c.d_model % c.n_head:
        raise ValueError(f"d_model={c.d_model} is not divisible by n_head={c.n_head}")
    if isinstance(c.attn, (list, tuple)):
        c.attn = list(c.attn)
        if len(c.attn) != c.n_layer:
            raise ValueError(f"attn lists {len(c.attn)} kinds for n_layer={c.n_layer} layers")
    for kind in c.layer_kinds() + [c.cross_attn]:
        if kind not in attention_kinds:
            raise ValueError(f"unknown attention kind {kind!r}: choose one of {', '.join(attention_kinds)}")
    for name in ("feature_size", "cross_feature_size"):
        if getattr(c, name) < 1:
            raise ValueError(f"{name} must be positive")
    if "rfa" in c.layer_kinds() and c.feature_size % 2:
        raise ValueError("rfa uses sin and cos features: feature_size must be even")
    if c.cross_attn == "rfa" and c.cross_feature_size % 2:
        raise ValueError("rfa uses sin and cos features: cross_feature_size must be even")
    check_adaptive(c)
    check_gpt2_switches(c, activations, positions)
    check_llama_switches(c)


def check_gpt2_switches(c, activations: dict, positions: str | None):
    """The switches GPT-2 needs: learned positions and their number, the GELU, the unscaled embedding. positions,
    where given (checkpoints written before max_positions alone said it), must agree with max_positions."""
    if positions is not None and positions not in POSITIONS:
        raise ValueError(f"positions={positions!r}: choose one of {', '.join(POSITIONS)}")
    if c.activation not in activations:
        raise ValueError(f"activation={c.activation!r}: choose one of {', '.join(activations)}")
    if positions is not None and (positions == "learned") != (c.max_positions > 0):
        raise ValueError(f"max_positions={c.max_positions} with {positions} positions: a learned table "
                         f"needs its length (> 0), sinusoidal positions take 0 (they have no end)")
    if not isinstance(c.scale_embedding, bool):
        raise ValueError(f"scale_embedding={c.scale_embedding!r} must be True or False")


LLAMA_SWITCHES = {"norm": ("layernorm", "rmsnorm"), "ffn": ("mlp", "swiglu"), "bias": ("all", "none", "qkv")}


ROPE_SCALING = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                                  "original_max_position_embeddings")}


def is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_llama_switches(c):
    """The switches of Llama-family checkpoints: each a known value, grouped-query heads that divide the heads,
    rotary positions in place of the others, in a language model."""
    for name, values in LLAMA_SWITCHES.items():
        if getattr(c, name) not in values:
            raise ValueError(f"{name}={getattr(c, name)!r}: choose one of {', '.join(values)}")
    if not is_number(c.norm_eps) or not c.norm_eps > 0:
        raise ValueError(f"norm_eps={c.norm_eps!r} must be a positive number")
    if not isinstance(c.n_kv_head, int) or c.n_kv_head < 0 or c.n_kv_head and c.n_head % c.n_kv_head:
        raise ValueError(f"n_kv_head={c.n_kv_head!r} must divide n_head={c.n_head} (0: as many as n_head)")
    if c.window and c.n_kv_head not in (0, c.n_head):
        raise ValueError("the sliding-window hybrid takes one key/value head per query head: n_kv_head = n_head")
    if not is_number(c.rope_theta) or c.rope_theta < 0:
        raise ValueError(f"rope_theta={c.rope_theta!r} must be a number >= 0 (0: no rotary positions)")
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


def check_adaptive(c):
    c.adaptive_cutoffs = list(c.adaptive_cutoffs)
    if not c.adaptive_cutoffs:
        return
    edges = [0, *c.adaptive_cutoffs, c.vocab_size]
    if any(not isinstance(cut, int) for cut in c.adaptive_cutoffs) or edges != sorted(set(edges)):
        raise ValueError(f"adaptive_cutoffs={c.adaptive_cutoffs} must increase strictly inside (0, "
                         f"vocab_size={c.vocab_size})")
    if c.adaptive_factor < 1 or c.d_model // c.adaptive_factor ** len(c.adaptive_cutoffs) < 1:
        raise ValueError(f"adaptive_factor={c.adaptive_factor} leaves the last band no dimension of "
                         f"d_model={c.d_model}")
    if c.n_encoder_layer or not c.tie_embeddings:
        raise ValueError("the adaptive input and softmax are a tied language model's: set tie_embeddings, "
                         "and no encoder")


def feature_sizes(config) -> tuple:
    """(k of the converted causal attention, k of the cross attention) as the tables report them, None where
    the attention is softmax (a translator's cross attention; a language model has none). elu has k = d."""
    def k(kinds, size):
        kinds = set(kinds) - {"softmax"}
        return None if not kinds else config.d_model // config.n_head if kinds == {"elu"} else size
    cross = k([config.cross_attn], config.cross_feature_size) if config.n_encoder_layer else None
    return k(config.layer_kinds(), config.feature_size), cross


KEEP_SOFTMAX_FROM = ("nth", "top")  # the two readings of "every fourth layer from the top is kept"


def check_convertible(c, attn: str, attention_kinds: tuple, is_seq2seq: bool, folded: bool):
    """Raise ValueError, in one line, where t2r.convert cannot start from the model of config c."""
    if attn not in attention_kinds or attn == "softmax":
        raise ValueError(f"convert to one of t2r, elu, rfa, not {attn!r}")
    if set(c.layer_kinds()) != {"softmax"} or (is_seq2seq and c.cross_attn != "softmax"):
        raise ValueError("this model is already converted: convert starts from a softmax transformer")
    if folded:
        raise ValueError("this model is folded for inference: convert the unfolded model")


def converted_kinds(n_layer: int, attn: str, keep_softmax_every: int, keep_softmax_from: str = "nth") -> list:
    """Layer kinds, bottom to top. keep_softmax_every=4 keeps every 4th layer counted from the top as softmax
    (the paper's "T2R 75%"): from "nth", the 4th, 8th, ... from the top; from "top", the top one, the 5th, 9th, ...
    0 converts every layer."""
    if keep_softmax_from not in KEEP_SOFTMAX_FROM:
        raise ValueError(f"keep_softmax_from is one of {KEEP_SOFTMAX_FROM}, not {keep_softmax_from!r}")
    first = keep_softmax_every if keep_softmax_from == "nth" else 1  # the first kept layer, counted from the top

    def keep(i):  # i counts from the bottom; n_layer - i counts from the top, starting at 1
        return keep_softmax_every > 0 and (n_layer - i - first) % keep_softmax_every == 0 and n_layer - i >= first
    kinds = ["softmax" if keep(i) else attn for i in range(n_layer)]
    if keep_softmax_every and "softmax" not in kinds:
        raise ValueError(f"keep_softmax_every={keep_softmax_every} counts past the {n_layer} layers: none stays "
                         f"softmax (use at most {n_layer}, or keep_softmax_from top)")
    return kinds
