"""The report of bench.py: bench.csv (one row per measurement, a dict with the keys of CSV_COLUMNS), bench.md
(the ratios, the tables, the models, how it measures) and the plots."""

import os
import platform
import time

import torch

from benchmarks.bench_tools import EQ_6_7_OPS, TIME_PARTS, row
from support.runtime import atomic_write, write_csv

CSV_COLUMNS = ["section", "model", "batch", "length", "metric", "value", "unit", "device"]


# -----------------------------------------------------------------------------
# Report: bench.csv, bench.md, plots

HOW_IT_MEASURES = """## How it measures

- **Generation** is greedy under `torch.no_grad`, one token per step, as in generate.py: t2r.py's step unrolled
  (support/fast_step.py's FlatStep), but the `_graph` and `_compiled` rows (the step recorded or compiled), the
  window and SRU++ (their own steps) and `softmax_recompute`. Weights are random (`--seed`) unless `--ckpt` gives
  them: they change the tokens picked, not the time.
- **Time.** A warmup, then CUDA events (read after one synchronize) or `time.perf_counter` around every step.
  tokens/s at `length` = batch x length / (time of the first `length` steps from an empty state): one run to
  the longest length gives every shorter one. The translator runs once per length, its source as long as its
  target, and its tokens/s include encoding the source (also reported as encode_ms). Latency at `length` is the
  median of the 32 steps up to that token, which a single slow step (a KV-cache doubling) does not move.
  Training is forward + backward, the median of `--repeats` after a warmup.
- **Ratios in pairs.** A shared CPU's speed drifts by tens of percent within minutes, more than the gaps these
  ratios measure. So the step ratios (section pairs) and the translators (--mt_runs) take turns: --pair_rounds
  rounds of --pair_steps steps, or --mt_passes passes over the test sentences, each round alternating which runs
  first; the ratio is the median of the rounds' ratios, the range beside it.
- **Memory.** state_bytes: the tensors of the recurrent state (a KV cache counts its allocated capacity).
  CPU: rss_bytes is the resident set at that length, peak_rss_bytes the process's peak so far (it only grows
  during a run). CUDA: cuda_peak_bytes is the peak allocated during the run, less what was allocated before it.
  Training peak on CPU: `bench_tools.PeakMemory` adds the bytes of each tensor storage an op creates (forward and
  backward) and subtracts them when it is freed; tensors from before the step (weights, inputs) count zero and
  scratch space inside one kernel is not seen.
- **The attention state** at `--memory_length` tokens, batch 1: KV cache bytes over RNN state bytes, measured
  and in theory 2 N h / (r k (d + 1)) (h = d_model, r heads of d dimensions, feature size k); a window of W
  adds 2 W d per head. SRU++ keeps c (h numbers) per layer and the keys and values of its a attention
  layers: 2 N h L / (L h + 2 a N d') for L layers.
- **Capacity** (CUDA only): the largest batch whose state at `--capacity_length` tokens and the step that writes
  the last token fit in the GPU's memory. Doubling, then bisection to within 1/64, each try building the state as
  generation leaves it (`bench_tools.state_at`: a KV cache of that many entries in the capacity its doubling
  reached) and running one step; out of memory means no. tokens/s there: batch / the median of 5 steps.
- **Where the time goes** (CPU, `--mt_runs`): one more greedy pass under `torch.profiler`; each part's self
  CPU time over the time of a pass without the profiler (`bench_tools.time_shares`). A ceiling in "What bounds
  the ratios" is what the ratio would be if the part that differs cost nothing and the rest stayed the same.
- **Precision.** `--dtype bfloat16` puts the generation models' weights and KV caches in bf16 (linear attention
  keeps S and z in float32, as t2r.py does under autocast) and runs training under bf16 autocast.
"""


def value(rows, section, model, batch, length, metric):
    """The value of one measurement (batch None: any batch), or None if it was not measured."""
    for r in rows:
        if (r["section"], r["model"], r["length"], r["metric"]) == (section, model, length, metric) \
                and (batch is None or r["batch"] == batch):
            return r["value"]
    return None


def ratios(rows, args) -> list:
    """bench.md's first table: T2R against softmax, against the floors (floor, proj_only) and against its own
    shorter lengths, each as (what, measured, goal, verdict); n/a where a length was not run."""
    lengths = sorted({r["length"] for r in rows if r["section"] == "gen"}) or args.lengths  # unmeasured: as asked
    lo, hi, N, tps = lengths[0], lengths[-1], args.memory_length, "tokens_per_s"
    gen = lambda model, batch, length, metric: ("gen", model, batch, length, metric)
    attn = lambda model, length, metric: ("train_attn", model, None, length, metric)
    plan = [(f"t2r32 latency at {hi} / at {lo}, batch {b}", gen("t2r32", b, hi, "latency_ms"),
             gen("t2r32", b, lo, "latency_ms"), "<=", 1.2) for b in args.batch_sizes]
    need_8192 = 10 if args.device.type == "cuda" else 14
    fast = "t2r32_graph" if any(r["model"] == "t2r32_graph" for r in rows) else "t2r32"  # CUDA's generation path
    plan += [(f"{fast} / softmax_kv tokens/s at {L}, batch 16", gen(fast, 16, L, tps), gen("softmax_kv", 16, L, tps),
              ">=", need) for L, need in ((4096, 5), (8192, need_8192))]
    plan += [(f"t2r32{c} step / proj_only{c} step, batch {b}: paired rounds", ("pairs", f"t2r32{c}/proj_only{c}", b, 0,
              "time_ratio"), None, "<=", 1.10 if b == 1 else 1.05) for c in ("", "_compiled") for b in args.batch_sizes]
    plan += [(f"translator {what}, test sentences: t2r / softmax tokens/s, batch 16: paired passes",
              ("mt", "t2r/softmax", 16, 0, metric + "_ratio"), None, ">=", need)
             for what, metric, need in (("greedy", tps, 1.15), ("beam 5", "beam5_tokens_per_s", 1.0))]
    plan += [(f"KV cache / t2r32 state at {N} tokens, measured", ("memory", "t2r32", 1, N, "kv_over_state"), None,
              "~", value(rows, "memory", "t2r32", 1, N, "kv_over_state_theory")),
             ("train attn 8192: softmax_sdpa ms / t2r_chunked ms", attn("softmax_sdpa", 8192, "ms"),
              attn("t2r_chunked", 8192, "ms"), ">=", 5),
             ("train attn 8192: t2r_chunked peak / softmax_sdpa peak", attn("t2r_chunked", 8192, "peak_bytes"),
              attn("softmax_sdpa", 8192, "peak_bytes"), "<=", 0.25),
             (f"train attn {args.quadratic_max}: t2r_chunked peak / softmax_math peak",
              attn("t2r_chunked", args.quadratic_max, "peak_bytes"),
              attn("softmax_math", args.quadratic_max, "peak_bytes"), "<=", 0.25),
             ("train attn: t2r_chunked ms at 8192 / at 4096", attn("t2r_chunked", 8192, "ms"),
              attn("t2r_chunked", 4096, "ms"), "<=", 2.3),
             ("train attn 16384: t2r_chunked ms / softmax_sdpa ms (the GPU's flash kernel)",
              attn("t2r_chunked", 16384, "ms"), attn("softmax_sdpa", 16384, "ms"), "<=", 1.0),
             ("train attn 16384: t2r_fla ms / softmax_sdpa ms (fla's chunk kernel against flash)",
              attn("t2r_fla", 16384, "ms"), attn("softmax_sdpa", 16384, "ms"), "<=", 1.0)]
    out = []
    for what, top, bottom, op, goal in plan:
        a, b = value(rows, *top), 1 if bottom is None else value(rows, *bottom)
        spread = [value(rows, *top[:-1], top[-1] + end) for end in ("_min", "_max")]  # paired: the rounds' range
        out.append(judge(what, None if a is None or not b else a / b, op, goal, None if None in spread else spread))
    return out


def ceilings(rows) -> list:
    """(ratio, ceiling, how): what a ratio could reach if the attention arithmetic that differs cost nothing."""
    out = []
    L = max((r["length"] for r in rows if r["section"] == "gen" and r["model"] == "softmax_kv"), default=None)
    softmax = value(rows, "gen", "softmax_kv", 16, L, "tokens_per_s")
    for floor, how in (("proj_only", "the same projections, no attention arithmetic"),
                       ("floor", "no self-attention layer at all")):
        top = value(rows, "gen", floor, 16, L, "tokens_per_s")
        if top and softmax:
            out.append((f"t2r32 / softmax_kv tokens/s at {L}, batch 16", top / softmax, f"{floor} / softmax_kv: {how}"))
    for batch in sorted({r["batch"] for r in rows if r["metric"] == "share_eq_6_7"}):
        eq, calls = (value(rows, "pairs", "t2r32", batch, 0, m) for m in ("share_eq_6_7", "extra_ops_per_step"))
        measured = value(rows, "pairs", "t2r32/proj_only", batch, 0, "time_ratio")
        names = ", ".join(op.split("::")[1] for op in EQ_6_7_OPS)
        out.append((f"t2r32 step / proj_only step, batch {batch}: paired rounds", measured * (1 - eq),
                    f"the ratio x (1 - {eq:.1%}), the share of t2r32's step in the arithmetic of Eqs. 6-7 ({names}; "
                    f"self CPU time, less proj_only's relu). The rest of the gap: {calls:.0f} more op calls a step "
                    "(views, slices), each a trip through the interpreter and the dispatcher"))
    share = value(rows, "mt", "softmax", 16, 0, "share_sdpa")
    if share is not None:
        out.append(("translator greedy, test sentences: t2r / softmax tokens/s, batch 16", 1 / (1 - share),
                    f"1 / (1 - {share:.1%}): the share of softmax's greedy time in its decoder's attention kernel"))
    return out


def bounds(rows) -> list:
    """bench.md's section on what bounds the ratios: the ceilings, and the translators' time in parts."""
    found = ceilings(rows)
    names = list(dict.fromkeys(r["model"] for r in rows if r["section"] == "mt" and r["metric"] == "share_rest"))
    lines = ["## What bounds the ratios", ""] if found or names else []
    if found:
        lines += ["| ratio | ceiling | from |", "|---|---|---|"]
        lines += [f"| {what} | {ceiling:.2f} | {how} |" for what, ceiling, how in found] + [""]
    if names:
        lines += ["**Greedy decoding's time, in parts** (translators on their test sentences, batch 16)", "",
                  "| model | output head | other matrix products | softmax attention of the new token | the rest |",
                  "|---|---|---|---|---|"]
        share = lambda name, part: f"{value(rows, 'mt', name, 16, 0, 'share_' + part):.0%}"
        lines += [f"| {name} | " + " | ".join(share(name, p) for p in TIME_PARTS) + " |" for name in names] + [""]
    return lines


def judge(what, measured, op, goal, spread=None) -> tuple:
    """op: '<=', '>=' or '~' (within 1% of goal, a theory that may be missing); spread: (lowest, highest) of the
    paired rounds whose median is measured."""
    goal_text = f"{op} {goal:g}" if op != "~" else f"theory {fmt(goal) or '-'}, within 1%"
    if measured is None or goal is None:
        return what, "", goal_text, "n/a (not measured in this run)"
    ok = measured <= goal if op == "<=" else measured >= goal if op == ">=" else abs(measured / goal - 1) < 0.01
    text = f"{measured:.2f}" + (f" ({spread[0]:.2f} to {spread[1]:.2f})" if spread else "")
    return what, text, goal_text, "pass" if ok else "MISS"


def fmt(v, metric=""):
    if v is None:
        return ""
    if metric.endswith("bytes"):
        return f"{v / 2 ** 20:.3g}" if v >= 2 ** 20 / 100 else f"{v / 2 ** 20:.2g}"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


def table(rows, section, metric, title, batch=None) -> list:
    """Markdown lines: one row per (model, batch), one column per length."""
    sel = [r for r in rows if r["section"] == section and r["metric"] == metric
           and (batch is None or r["batch"] == batch)]
    if not sel:
        return []
    lengths = sorted({r["length"] for r in sel})
    keys = list(dict.fromkeys((r["model"], r["batch"]) for r in sel))
    unit = "MiB" if metric.endswith("bytes") else sel[0]["unit"]
    out = [f"**{title}** ({metric}, {unit})", "", "| model | batch | " + " | ".join(map(str, lengths)) + " |",
           "|---|---|" + "---|" * len(lengths)]
    for model, b in keys:
        cells = [fmt(value(sel, section, model, b, L, metric), metric) for L in lengths]
        out.append(f"| {model} | {b} | " + " | ".join(cells) + " |")
    return out + [""]


def machine_line(device) -> str:
    if device.type == "cuda":
        return f"CUDA {torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    threads = torch.get_num_threads()
    return (f"CPU {cpu}, {threads} thread{'s' * (threads != 1)}, torch {torch.__version__}, "
            f"Python {platform.python_version()}")


def markdown(rows, args, command, seconds, models) -> str:
    """bench.md: the run, the ratios, the tables, the models, how it measures."""
    big, cpu = max(args.batch_sizes), args.device.type == "cpu"
    lines = ["# bench.py results", "",
             f"`{command}` on {machine_line(args.device)}, {time.strftime('%Y-%m-%d')}; {seconds / 60:.1f} min.",
             "Sizes in MiB; latency at position = length; tokens/s for generating `length` tokens from an empty "
             "state (s2s: source length = target length, encoding included). The models and how each number is "
             "measured: at the end.", "",
             "## Ratios", "", "| ratio | measured | goal | verdict |", "|---|---|---|---|"]
    lines += [f"| {' | '.join(r)} |" for r in ratios(rows, args)] + [""] + bounds(rows)
    lines += ["## Generation, language model", ""]
    lines += table(rows, "gen", "tokens_per_s", "tokens/s") + table(rows, "gen", "latency_ms", "per-token latency")
    lines += table(rows, "gen", "state_bytes", "state (KV cache or S, z)", batch=big)
    lines += table(rows, "gen", "rss_bytes" if cpu else "cuda_peak_bytes",
                   "process resident set" if cpu else "CUDA peak", batch=big)
    lines += ["## Prefill: the time to the first token, batch 1", ""]
    lines += table(rows, "prefill", "first_token_ms", "the prompt read, its last position's logits")
    lines += ["## Generation, encoder-decoder (Fig. 2, 3)", ""]
    lines += table(rows, "s2s", "tokens_per_s", "tokens/s") + table(rows, "s2s", "latency_ms", "per-token latency")
    lines += table(rows, "s2s", "speedup", f"{CROSSOVER[0]} / {CROSSOVER[1]} tokens/s: where T2R starts to win")
    lines += table(rows, "s2s", "state_bytes", "state, self and cross attention")
    lines += ["## Attention state, batch 1", ""] + table(rows, "memory", "state_bytes", "state bytes")
    lines += table(rows, "memory", "kv_over_state", "KV cache / state, measured")
    lines += table(rows, "memory", "kv_over_state_theory", "KV cache / state, theory 2Nh/(rk(d+1))")
    if any(r["section"] == "capacity" for r in rows):
        lines += [f"## Capacity on the GPU at {args.capacity_length} tokens", ""]
        lines += table(rows, "capacity", "largest_batch", "the largest batch that fits")
        lines += table(rows, "capacity", "tokens_per_s", "tokens/s at that batch")
    lines += ["## Training, forward + backward", ""]
    for section, what in (("train_attn", "one attention layer"), ("train_lm", "whole LM")):
        lines += table(rows, section, "ms", f"{what}: time")
        lines += table(rows, section, "peak_bytes", f"{what}: peak memory")
    lines += ["## The models", ""]
    for section, title in (("gen", "language model"), ("s2s", "encoder-decoder"), ("train", "training")):
        lines += [f"{title}:", ""] + [f"- `{name}`: {text}" for name, text in models[section].items()] + [""]
    return "\n".join(lines) + "\n" + HOW_IT_MEASURES


def plot_plans(args) -> dict:
    """file name -> panels, each (section, metric, batch or None, title, y label, scale)."""
    big, mib = max(args.batch_sizes), 2 ** -20
    s2s = 16 if 16 in args.s2s_batch_sizes else args.s2s_batch_sizes[0]
    peak = ("rss_bytes", "process resident set") if args.device.type == "cpu" else ("cuda_peak_bytes", "CUDA peak")
    each = lambda metric, what, ylabel: [("gen", metric, b, f"LM {what}, batch {b}", ylabel, 1)
                                         for b in args.batch_sizes]
    return {
        "gen_tokens_per_s.png": each("tokens_per_s", "generation", "tokens/s") + [
            ("s2s", "tokens_per_s", b, f"translation, batch {b}, source = target", "tokens/s", 1)
            for b in args.s2s_batch_sizes],
        "gen_latency.png": each("latency_ms", "per-token latency", "ms at position") + [
            ("s2s", "latency_ms", s2s, f"translation per-token latency, batch {s2s}", "ms at position", 1)],
        "gen_memory.png": [("gen", "state_bytes", big, f"LM state, batch {big}", "MiB", mib),
                           ("s2s", "state_bytes", s2s, f"translation state (self + cross), batch {s2s}", "MiB", mib),
                           ("gen", peak[0], big, peak[1], "MiB", mib)],
        "s2s_crossover.png": [("s2s", "speedup", None, f"translation: {CROSSOVER[0]} / {CROSSOVER[1]} tokens/s",
                               "ratio", 1)],
        "train.png": [("train_attn", "ms", None, "attention layer fwd+bwd", "ms", 1),
                      ("train_attn", "peak_bytes", None, "attention layer peak memory", "MiB", mib),
                      ("train_lm", "ms", None, "whole LM fwd+bwd", "ms", 1),
                      ("train_lm", "peak_bytes", None, "whole LM peak memory", "MiB", mib)],
    }


def series(rows, section, metric, batch=None) -> dict:
    """(model, batch) -> [(length, value)] sorted by length."""
    out = {}
    for r in rows:
        if r["section"] == section and r["metric"] == metric and (batch is None or r["batch"] == batch):
            out.setdefault((r["model"], r["batch"]), []).append((r["length"], r["value"]))
    return {key: sorted(points) for key, points in out.items()}


def draw_panel(ax, data, title, ylabel, scale):
    for (model, batch), points in data.items():
        points = [p for p in points if p[1] > 0]  # a floor has no state: nothing to draw on a log scale
        if points:
            style = ":" if model in ("floor", "proj_only") else "--" if model.endswith("_unfolded") else "-"
            label = model if len({b for _, b in data}) == 1 else f"{model}, batch {batch}"
            ax.plot([p[0] for p in points], [p[1] * scale for p in points], style, marker="o", ms=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("length (tokens)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)


def write_plots(rows, args) -> list:
    """The plots that have data, into args.out_dir; their file names (none without matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots (pip install matplotlib)")
        return []
    written = []
    for filename, panels in plot_plans(args).items():
        panels = [p for p in panels if series(rows, *p[:3])]
        if not panels:
            continue
        fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
        for ax, (section, metric, batch, title, ylabel, scale) in zip(axes[0], panels):
            draw_panel(ax, series(rows, section, metric, batch), title, ylabel, scale)
        fig.tight_layout()
        with atomic_write(os.path.join(args.out_dir, filename)) as tmp:
            fig.savefig(tmp, dpi=110, format="png")
        plt.close(fig)
        written.append(filename)
    return written


CROSSOVER = ("t2r32-4", "softmax_kv")  # the translators whose speed ratio shows where T2R starts to win


def crossover_rows(rows) -> list:
    """T2R over softmax translation tokens/s at every batch and length both ran: rows of metric 'speedup'."""
    fast, slow = CROSSOVER
    out = []
    for r in rows:
        if (r["section"], r["model"], r["metric"]) == ("s2s", fast, "tokens_per_s"):
            base = value(rows, "s2s", slow, r["batch"], r["length"], "tokens_per_s")
            if base:
                out.append(row("s2s", f"{fast} / {slow}", r["batch"], r["length"], "speedup", r["value"] / base, "x"))
    return out


def write_all(rows, args, command, seconds, models):
    """bench.csv, bench.md and the plots into args.out_dir; prints the ratios."""
    rows = rows + crossover_rows(rows)
    csv_rows = [{**r, "device": args.device.type, "value": f"{r['value']:.6g}" if isinstance(r["value"], float)
                 else r["value"]} for r in rows]
    write_csv(os.path.join(args.out_dir, "bench.csv"), csv_rows, CSV_COLUMNS)
    with atomic_write(os.path.join(args.out_dir, "bench.md")) as tmp, open(tmp, "w") as f:
        f.write(markdown(rows, args, command, seconds, models))
    plots = write_plots(rows, args)
    print(f"wrote {args.out_dir}/bench.csv, bench.md{', ' + ', '.join(plots) if plots else ''} in {seconds:.0f} s")
    for what, measured, goal, verdict in ratios(rows, args):
        print(f"ratio: {what}: {measured or '-'} (goal {goal}) {verdict}")
