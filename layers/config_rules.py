"""
What t2r.py's Config cannot build, as a one-line ValueError before any work starts: sizes that are not positive
integers, a width the heads do not divide, an attention kind per layer that is not one, rfa's odd feature sizes, and
the adaptive bands' own rules (adaptive.py); and which layers a conversion keeps softmax, every k-th counted from the
top (the paper's "T2R 75%": converted_kinds, which t2r.py's convert reads).

    python -m pytest -q test_t2r.py
"""

from layers.adaptive import check_bands

LEAST = dict(vocab_size=1, n_layer=1, n_head=1, d_model=1, d_ff=1, n_encoder_layer=0, chunk_size=0, feature_size=1,
             cross_feature_size=1, adaptive_factor=1)  # the smallest value of each integer field


def check_config(c, attention_kinds):
    """Raise ValueError for a config (c: a t2r.Config, its attn a str or a list) that cannot be built."""
    wrong = [f for f, n in LEAST.items() if not isinstance(getattr(c, f), int) or getattr(c, f) < n]
    if wrong:
        raise ValueError(f"{wrong[0]}={getattr(c, wrong[0])!r} must be an integer >= {LEAST[wrong[0]]}")
    if c.d_model % c.n_head:
        raise ValueError(f"d_model={c.d_model} is not divisible by n_head={c.n_head}")
    if isinstance(c.attn, list) and len(c.attn) != c.n_layer:
        raise ValueError(f"attn lists {len(c.attn)} kinds for n_layer={c.n_layer} layers")
    for kind, name in [(k, "feature_size") for k in c.layer_kinds()] + [(c.cross_attn, "cross_feature_size")]:
        if kind not in attention_kinds:
            raise ValueError(f"unknown attention kind {kind!r}: choose one of {', '.join(attention_kinds)}")
        if kind == "rfa" and getattr(c, name) % 2:
            raise ValueError(f"rfa uses sin and cos features: {name} must be even")
    check_bands(c)


KEEP_SOFTMAX_FROM = ("nth", "top")  # the two readings of "every fourth layer from the top is kept"


def converted_kinds(n_layer: int, attn: str, keep_softmax_every: int, keep_softmax_from: str = "nth") -> list:
    """Layer kinds, bottom to top. keep_softmax_every=4 keeps every 4th layer counted from the top as softmax (the
    paper's "T2R 75%"): from "nth", the 4th, 8th, ...; from "top", the top one, the 5th, 9th, ... 0: none."""
    if keep_softmax_from not in KEEP_SOFTMAX_FROM:
        raise ValueError(f"keep_softmax_from is one of {KEEP_SOFTMAX_FROM}, not {keep_softmax_from!r}")
    first = keep_softmax_every if keep_softmax_from == "nth" else 1  # the first kept layer, 1 being the top one
    kept = set(range(first, n_layer + 1, keep_softmax_every)) if keep_softmax_every else set()  # counted from the top
    if keep_softmax_every and not kept:
        raise ValueError(f"keep_softmax_every={keep_softmax_every} counts past the {n_layer} layers: none stays "
                         f"softmax (use at most {n_layer}, or keep_softmax_from top)")
    return ["softmax" if n_layer - i in kept else attn for i in range(n_layer)]
