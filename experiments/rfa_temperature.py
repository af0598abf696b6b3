"""
Why the study's RFA baseline is weak, measured at the swap (no training): a softmax teacher's attention against the
kernel RFA starts from. RFA (t2r.py's RFAFeatureMap) normalises q and k to unit length and estimates
exp(q^.k^ / tau^2) with D = k / 2 random projections, tau = 1 at the start. The teacher's logits q.k / sqrt(d) =
|q||k| / sqrt(d) cos(q, k) span far more than the [-1, 1] / tau^2 of unit vectors.

    python -m experiments.rfa_temperature      # the study's seed-1 PTB teacher, 8 validation windows (about 20 s)

On --windows validation windows of --context tokens, each layer's q, k, v are captured and, per layer and head:
    implied_tau : the tau at which RFA's kernel of unit vectors matches the teacher's on a typical pair:
                  1 / tau^2 = median |q_i||k_j| / sqrt(d) over the causal pairs j <= i
    logit_range : the median, over queries, of max - min of the teacher's logits over the keys a query sees
                  (RFA's kernel spans at most 2 / tau^2: 2 at tau = 1, attention weights within a factor e^2)
    error       : ||out - out_teacher|| / ||out_teacher|| over every position and window, out the head's causal
                  attention output (before W_o) and out_teacher the teacher's softmax one, for
        exact    RFA's kernel itself, exp(q^.k^ / tau^2) normalised (infinitely many projections): the temperature's
                 part alone, at each tau of --taus and at the implied one
        rfa      RFAFeatureMap with D = --feature_size / 2 projections at the same taus, --draws draws of omega (the
                 same draws at every tau), t2r.py's causal linear form: the estimate's variance added.
                 negative_normalisers: the share of queries whose estimated sum of weights is negative (the
                 table's "negative", at the implied tau)
        t2r      T2RFeatureMap at its random initialisation, k = --t2r_feature_size, --draws draws: where T2R starts
        elu      elu(x) + 1, k = d
        uniform  the mean of the values a query sees: the limit of a large tau
The table goes to --csv, one row a layer, head, features and tau.
"""

if __package__ in (None, ""):  # run as a file: the project's modules are found from its root, as a module
    raise SystemExit("error: run it from the repository's root as a module: python -m experiments.rfa_temperature")

import argparse
import math
import os

import torch
import torch.nn.functional as F

from experiments.analyze_attention import load_lm, validation_windows
from support import data
from support.runtime import Parser, UserError, positive_float, positive_int, print_config, run_main, seed, write_csv
from t2r import (EluFeatureMap, RFAFeatureMap, T2RFeatureMap, linear_attention_chunked_sums, normalize,
                 softmax_attention)

TEACHER = "out/study/lm/softmax-random-s1/model.pt"  # experiments/study.py's seed-1 PTB teacher (4 layers, 2 heads of 64)
TAUS = (0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0)
COLUMNS = ["layer", "head", "features", "k", "tau", "tau_source", "draws", "error_mean", "error_std",
           "negative_normalisers", "implied_tau", "logit_range"]
CHUNK = 64  # the causal linear form's chunk, the study's --chunk_size


# -----------------------------------------------------------------------------
# The teacher's heads

@torch.no_grad()
def heads_at_the_swap(model, windows: torch.Tensor) -> list[tuple]:
    """Per layer, the (q, k, v) its self-attention forms on the windows (N, T), each (N, H, T, d) in float64: the
    layer's input is captured with a hook, then projected by the layer's own project()."""
    model = model.double().eval()
    inputs = []
    hooks = [layer.self_attn.register_forward_hook(lambda module, args, out: inputs.append(args[0]))
             for layer in model.layers]
    try:
        model.run_layers(model.layers, model.embed(windows))  # not the output head: no (N, T, V) logits are needed
    finally:
        for hook in hooks:
            hook.remove()
    return [layer.self_attn.project(x, x) for layer, x in zip(model.layers, inputs)]


def causal_pairs(T: int) -> torch.Tensor:
    return torch.ones(T, T, dtype=torch.bool).tril()  # (T, T): query i sees keys j <= i


def implied_tau(q, k) -> torch.Tensor:
    """(H,): 1 / sqrt(median |q_i||k_j| / sqrt(d)) over the causal pairs of each head, q and k (N, H, T, d)."""
    scale = q.norm(dim=-1)[..., :, None] * k.norm(dim=-1)[..., None, :] / math.sqrt(q.shape[-1])  # (N, H, T, T)
    per_head = scale.transpose(0, 1)[..., causal_pairs(q.shape[-2])].flatten(1)  # (H, N * pairs)
    return per_head.median(dim=-1).values.rsqrt()


def logit_range(q, k) -> torch.Tensor:
    """(H,): the median over queries (from the second position on) of max - min of q_i.k_j / sqrt(d) over j <= i."""
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (N, H, T, T)
    seen = causal_pairs(q.shape[-2])
    spread = logits.masked_fill(~seen, -math.inf).amax(-1) - logits.masked_fill(~seen, math.inf).amin(-1)
    return spread[:, :, 1:].transpose(0, 1).flatten(1).median(dim=-1).values


# -----------------------------------------------------------------------------
# The student's outputs at the swap, each (N, H, T, d)

def relative_error(out, teacher_out) -> torch.Tensor:  # (H,)
    return (out - teacher_out).pow(2).sum((0, 2, 3)).sqrt() / teacher_out.pow(2).sum((0, 2, 3)).sqrt()


def exact_kernel(q, k, v, tau: torch.Tensor):
    """exp(q^.k^ / tau^2), normalised over j <= i: RFA's kernel without the estimate (a softmax of unit vectors)."""
    unit_q, unit_k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    logits = unit_q @ unit_k.transpose(-1, -2) / tau.view(-1, 1, 1) ** 2  # (N, H, T, T), tau per head
    return logits.masked_fill(~causal_pairs(q.shape[-2]), -math.inf).softmax(-1) @ v


def linear_form(feature_map, q, k, v):
    """t2r.py's causal linear attention (the chunked form of training) -> out, and (N, H, T) True where the
    estimated sum of weights is negative (RFA's sin and cos features can make it so)."""
    numerator, denominator = linear_attention_chunked_sums(*feature_map(q, k), v, CHUNK)
    return normalize(numerator, denominator), denominator < 0


def uniform(v):
    """The mean of v_1 .. v_i at position i."""
    return v.cumsum(-2) / torch.arange(1, v.shape[-2] + 1, dtype=v.dtype)[:, None]


# -----------------------------------------------------------------------------

@torch.no_grad()
def measure(model, windows: torch.Tensor, taus=TAUS, feature_size: int = 64, t2r_feature_size: int = 32,
            draws: int = 8, seed: int = 0) -> list:
    """The rows of the table (COLUMNS) for a softmax language model on the windows (N, T): RFA's k = feature_size
    (D = feature_size / 2 projections), T2R's k = t2r_feature_size."""
    torch.manual_seed(seed)  # the draws of omega and of T2R's maps
    rows = []
    for layer, (q, k, v) in enumerate(heads_at_the_swap(model, windows)):
        H, d = q.shape[1], q.shape[-1]
        teacher_out = softmax_attention(q, k, v, causal=True)
        tau_of_head, range_of_head = implied_tau(q, k), logit_range(q, k)

        def add(features, errors, k=None, tau=None, tau_source=None, negative=None):  # errors (draws, H)
            for head in range(H):
                rows.append(dict(layer=layer, head=head, features=features, k=k,
                                 tau=None if tau is None else round(float(tau[head]), 4), tau_source=tau_source,
                                 draws=len(errors), error_mean=errors[:, head].mean().item(),
                                 error_std=errors[:, head].std().item() if len(errors) > 1 else None,
                                 negative_normalisers=None if negative is None else negative[:, head].mean().item(),
                                 implied_tau=tau_of_head[head].item(), logit_range=range_of_head[head].item()))

        # the same omega draws at every tau, so that the taus differ by the temperature alone
        rfa = RFAFeatureMap(H, d, feature_size).double().eval()
        omegas = [torch.randn_like(rfa.omega) for _ in range(draws)]
        grid = [(torch.full((H,), tau, dtype=torch.float64), "grid") for tau in taus] + [(tau_of_head, "implied")]
        for tau, source in grid:
            add("exact", relative_error(exact_kernel(q, k, v, tau), teacher_out)[None], tau=tau, tau_source=source)
            errors, negative = [], []
            rfa.log_tau.copy_(tau.log())
            for omega in omegas:
                rfa.omega.copy_(omega)
                out, below_zero = linear_form(rfa, q, k, v)
                errors.append(relative_error(out, teacher_out))
                negative.append(below_zero.double().mean((0, 2)))
            add("rfa", torch.stack(errors), k=feature_size, tau=tau, tau_source=source, negative=torch.stack(negative))

        t2r_maps = [T2RFeatureMap(H, d, t2r_feature_size).double() for _ in range(draws)]  # its own initialisation
        add("t2r", torch.stack([relative_error(linear_form(t2r, q, k, v)[0], teacher_out) for t2r in t2r_maps]),
            k=t2r_feature_size)
        add("elu", relative_error(linear_form(EluFeatureMap(), q, k, v)[0], teacher_out)[None], k=d)
        add("uniform", relative_error(uniform(v), teacher_out)[None])
    return rows


def summary(rows: list) -> str:
    """A line a layer and head: the implied temperature, the logit range, and the relative errors (rfa's and t2r's the
    mean over draws, +- their standard deviation) at tau = 1, at the grid's best tau and at the implied one."""
    def pick(**match):
        return [r for r in rows if all(r[key] == value for key, value in match.items())]

    def error(r):
        return f"{r['error_mean']:.3f}" + (f" +- {r['error_std']:.3f}" if r["error_std"] is not None else "")

    def at_taus(features, at):  # tau = 1, the best of the grid (tau), the implied tau
        grid = pick(features=features, tau_source="grid", **at)
        one, best = [r for r in grid if r["tau"] == 1.0], min(grid, key=lambda r: r["error_mean"])
        implied = pick(features=features, tau_source="implied", **at)[0]
        return [error(one[0]) if one else "-", f"{error(best)} ({best['tau']:g})", error(implied)]

    rfa_k, t2r_k = pick(features="rfa")[0]["k"], pick(features="t2r")[0]["k"]
    header = ["layer", "head", "implied tau", "logit range", "exact tau=1", "exact best", "exact implied",
              f"rfa D={rfa_k // 2} tau=1", "rfa best", "rfa implied", "negative", f"t2r k={t2r_k}", "elu", "uniform"]
    table = []
    for head_row in pick(features="uniform"):
        at = dict(layer=head_row["layer"], head=head_row["head"])
        implied_rfa = pick(features="rfa", tau_source="implied", **at)[0]
        table.append([str(at["layer"]), str(at["head"]), f"{head_row['implied_tau']:.3f}",
                      f"{head_row['logit_range']:.2f}", *at_taus("exact", at), *at_taus("rfa", at),
                      f"{implied_rfa['negative_normalisers']:.2f}", error(pick(features="t2r", **at)[0]),
                      error(pick(features="elu", **at)[0]), error(head_row)])
    widths = [max(len(line[i]) for line in [header, *table]) for i in range(len(header))]
    return "\n".join(" | ".join(cell.rjust(width) for cell, width in zip(line, widths)) for line in [header, *table])


def tau_list(text: str) -> tuple:
    """Comma-separated positive temperatures."""
    try:
        return tuple(positive_float(part) for part in text.split(","))
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError(f"--taus {text!r}: {error}") from None


def get_args(argv=None):
    p = Parser(prog="python -m experiments.rfa_temperature",
               description="A softmax teacher's temperature against RFA's kernel at the swap (no training).")
    p.add_argument("--teacher", default=TEACHER, help="the softmax language model's model.pt or ckpt.pt")
    p.add_argument("--windows", type=positive_int, default=8, help="disjoint validation windows from the split's start")
    p.add_argument("--context", type=positive_int, default=512, help="tokens per window (the study's block size)")
    p.add_argument("--taus", type=tau_list, default=TAUS, help="RFA temperatures to measure, comma-separated")
    p.add_argument("--feature_size", type=positive_int, default=64,
                   help="k of RFA: D = k / 2 random projections (the study's 64: 32 projections)")
    p.add_argument("--t2r_feature_size", type=positive_int, default=32, help="k of T2R's random map (the study's 32)")
    p.add_argument("--draws", type=positive_int, default=8, help="random projections (and T2R maps) drawn per tau")
    p.add_argument("--seed", type=seed, default=0, help="seed of the draws")
    p.add_argument("--csv", default="results/rfa_temperature.csv", help="where the table goes")
    args = p.parse_args(argv)
    if args.feature_size % 2:
        p.error(f"--feature_size {args.feature_size}: RFA's sin and cos features need an even k")
    if args.context < 2:
        p.error("--context must be at least 2")
    if os.path.isdir(args.csv):
        p.error(f"--csv {args.csv} is a folder: give the table's file name")
    return args


def main():
    args = get_args()
    print_config("experiments.rfa_temperature", vars(args))
    model, saved = load_lm(args.teacher, "cpu")
    if set(model.config.layer_kinds()) != {"softmax"}:
        raise UserError(f"--teacher {args.teacher} is not a softmax model: give the teacher a conversion starts from")
    try:
        lm_data = data.read_prepared(saved.get("dataset", "ptb"), saved.get("data_dir"),
                                     tokenizer=saved.get("tokenizer", "word"),
                                     vocab_size=saved.get("vocab_size") if saved.get("tokenizer") == "bpe" else None,
                                     cache_dir=saved.get("cache_dir", "data/cache"))
    except data.DataError as error:
        raise UserError(f"{error}: run from the folder the teacher was trained in") from None
    windows = validation_windows(lm_data.valid, args.context, args.windows)
    print(f"{len(windows)} validation windows of {args.context} tokens")
    rows = measure(model, windows, args.taus, args.feature_size, args.t2r_feature_size, args.draws, args.seed)
    print(summary(rows))
    write_csv(args.csv, rows, COLUMNS)
    print(f"wrote {args.csv}")


if __name__ == "__main__":
    run_main(main)
