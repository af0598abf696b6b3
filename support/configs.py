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
