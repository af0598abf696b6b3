"""
The study's figures, drawn from the rows experiments/report.py reads (results/*.csv), each with the command,
machine and date at its foot:

    feature_size.png     Fig. 4 at CPU scale: validation perplexity against k
    attention.png        Figs. 5 and 6: distance to the teacher's attention, and its entropy, against k
    learning_curves.png  validation perplexity against training tokens, conversions starting where the teacher ends
    mqar.png             what a fixed state forgets: MQAR accuracy against the pairs held (converted, transfer first,
                         a short convolution, from scratch), and against the state's bytes
    equal_budget.png     T2R + pretrain against T2R from scratch for the same total steps, at each budget, every seed;
                         and their gap against the seeds' spread
"""

import math
import re
import textwrap

from experiments.claims import model_name
from experiments.verdicts import group
from support.runtime import atomic_write


def new_figure(ncols: int, width: float, nrows: int = 1):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, 3.9 * nrows), squeeze=False)
    return plt, fig, list(axes.flat)


def log2_axis(ax, ticks: list, label: str):
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel(label)


def save(plt, fig, footer: str, path: str):
    # the footer (command, machines, dates) wrapped to the figure's width: at 6 points about 22 characters an inch
    lines = textwrap.wrap(footer, width=int(22 * fig.get_figwidth()))
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=6, color="gray")
    fig.tight_layout(rect=(0, (0.03 + 0.1 * len(lines)) / fig.get_figheight(), 1, 1))
    with atomic_write(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


def plot_feature_size(fs: list, ks: list, footer: str, path: str):
    plt, fig, (ax,) = new_figure(1, 5)
    for variant, label, marker in (("pretrained", "T2R + pretrain", "o"), ("random", "T2R + random init", "s"),
                                   ("pretrained_mlp_frozen", "T2R + pretrain, MLP frozen", "^")):
        rows = sorted(group(fs, variant=variant), key=lambda r: r["k"])
        if rows:
            ax.plot([r["k"] for r in rows], [r["valid_ppl"] for r in rows], marker=marker, label=label)
    ax.set_ylabel("PTB validation perplexity")
    ax.set_title("Fig. 4 at CPU scale")
    ax.legend()
    log2_axis(ax, ks, "feature size k")
    save(plt, fig, footer, path)


def plot_attention(att: list, ks: list, footer: str, path: str):
    plt, fig, (left, right) = new_figure(2, 9)
    stages = (("before_finetuning", "T2R before finetuning", "x"), ("finetuned", "T2R (finetuned)", "o"),
              ("mlp_frozen", "T2R MLP frozen", "^"), ("random_init", "T2R + random init", "s"))
    for stage, label, marker in stages:
        rows = sorted(group(att, stage=stage), key=lambda r: r["k"])
        if rows and rows[0]["distance"] is not None:
            left.plot([r["k"] for r in rows], [r["distance"] for r in rows], marker=marker, label=label)
        if rows:
            right.plot([r["k"] for r in rows], [r["entropy"] for r in rows], marker=marker, label=label)
    teacher = group(att, stage="teacher")
    if teacher:
        right.axhline(teacher[0]["entropy"], color="gray", linestyle="--", label="softmax teacher")
    for ax, ylabel, title in ((left, "mean Euclidean distance to the teacher", "Fig. 5"),
                              (right, "mean attention entropy (nats)", "Fig. 6")):
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title} at CPU scale")
        ax.legend(fontsize=7)
        log2_axis(ax, ks, "feature size k")
    save(plt, fig, footer, path)


def plot_learning_curves(curves: list, footer: str, path: str):
    """A row per task: every run's validation perplexity against the training tokens it has seen, a converted
    run's counted on top of its teacher's (it starts where the teacher ends: the cost of converting is the
    length of its line); on the right the same, zoomed on the conversions."""
    tasks = [t for t in ("lm", "mt") if group(curves, task=t)]
    from matplotlib.ticker import FuncFormatter
    plain = FuncFormatter(lambda v, _: f"{v:.3g}" if v < 100 else f"{v:.0f}")  # 200 and 10.5, not 2 x 10^2 and 10
    # between the powers of ten only 2, 3 and 5 x 10^n: all nine crowd where the axis spans decades (60 70 80 90 100)
    sparse = FuncFormatter(lambda v, _: plain(v) if f"{v:.1e}"[0] in "235" else "")
    plt, fig, axes = new_figure(2, 11, nrows=len(tasks))
    for task, full, zoom in zip(tasks, axes[0::2], axes[1::2]):
        teacher = group(curves, task=task, model="softmax", init="random")
        start = max((r["tokens"] for r in teacher), default=0)
        runs = sorted({(r["model"], r["init"]) for r in group(curves, task=task)}, key=lambda m: (m[1], m[0]))
        zoom_ppl = []
        for i, (model, init) in enumerate(runs):
            rows = sorted(group(curves, task=task, model=model, init=init), key=lambda r: r["step"])
            offset = start if init == "pretrained" else 0
            x = [(r["tokens"] + offset) / 1e6 for r in rows]
            y = [math.exp(r["valid_loss"]) for r in rows]
            # tab20 has 20 distinct colours; the default cycle repeats after 10 and the study has more runs
            style = dict(color=plt.get_cmap("tab20")(i % 20), linestyle="-" if init == "pretrained" else "--",
                         marker="." if len(rows) < 30 else None, label=model_name(model, init))
            for ax in (full, zoom):
                ax.plot(x, y, **style)
            zoom_ppl += [v for u, v in zip(x, y) if u >= start / 1e6 * 0.9]
        if zoom_ppl:
            zoom.set_xlim(start / 1e6 * 0.9, None)
            zoom.set_ylim(min(zoom_ppl) / 1.03, max(zoom_ppl) * 1.03)
        title = {"lm": "Language model (PTB)", "mt": "Translator (LibreOffice en-de)"}[task]
        full.set_yscale("log")
        for ax, suffix in ((full, ""), (zoom, ": the conversions")):
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(sparse if ax is full else plain)
            ax.set_xlabel("training tokens (millions; a conversion's after its teacher's)")
            ax.set_ylabel("validation perplexity (periodic estimate)")
            ax.set_title(title + suffix)
        full.legend(fontsize=6, loc="upper right")
    save(plt, fig, footer, path)


MQAR_PANELS = ("converted (dashed: a softmax window beside)", "transfer first (dotted: before finetuning)",
               "+ a short convolution (dashed: transfer too)", "from scratch, the best lr (dashed: + conv)")


def mqar_panel(model: str) -> int:
    """Which of MQAR_PANELS a row of results/mqar.csv is drawn in, from its model's name."""
    return 3 if "from scratch" in model else 2 if "+conv" in model else 1 if "+transfer" in model else 0


def mqar_style(model: str) -> dict:
    """A line's colour by its state (T2R's k; the teacher black, SRU++ grey); dashed or dotted as MQAR_PANELS say."""
    k, ks = re.match(r"t2r(\d+)", model), (8, 16, 32, 64)
    color = f"C{ks.index(int(k[1]))}" if k and int(k[1]) in ks else "gray" if model.startswith("sru") else "black"
    dashed = "window" in model or "transfer+conv" in model or "scratch+conv" in model
    return dict(color=color, marker="os^v"[mqar_panel(model)],
                linestyle=":" if "before finetuning" in model else "--" if dashed else "-")


def plot_mqar(rows: list, footer: str, path: str):
    """MQAR (experiments/mqar.py): accuracy against the pairs a sequence holds, one line per model, in four panels
    (converted; transfer first; a short convolution; from scratch); and at the most pairs, against the bytes of the
    model's generation state there (a KV cache grows, a T2R state does not)."""
    plt, fig, axes = new_figure(3, 15, nrows=2)
    pairs = sorted({r["pairs"] for r in rows})
    for model in dict.fromkeys(r["model"] for r in rows):
        mine, style = sorted(group(rows, model=model), key=lambda r: r["pairs"]), mqar_style(model)
        axes[mqar_panel(model)].plot([r["pairs"] for r in mine], [r["accuracy"] for r in mine], label=model, **style)
        axes[4].scatter([mine[-1]["state_bytes"]], [mine[-1]["accuracy"]], color=style["color"],
                        marker=style["marker"])
    for ax, title in zip(axes, MQAR_PANELS):
        log2_axis(ax, pairs, "key-value pairs in the sequence")
        ax.set(ylabel="recall accuracy", title=title, ylim=(-0.03, 1.03))
        if ax.lines:  # a panel may be empty (a plan without its runs)
            ax.legend(fontsize=6, loc="best")
    axes[4].set_xscale("log")
    axes[4].set(xlabel=f"bytes of the generation state after {pairs[-1]} pairs (batch 1)", ylabel="recall accuracy",
                title=f"at {pairs[-1]} pairs, against the state's size (markers: the panels')")
    axes[5].axis("off")
    save(plt, fig, footer, path)


def plot_equal_budget(points: list, gaps: list, footer: str, path: str):
    """points: (budget multiple, the conversions' test ppl (one a teacher), from scratch's), as report.budget_points
    gives; gaps: (budget multiple, the conversions' mean minus from scratch's, their half ranges added),
    claims.equal_budget_gaps."""
    plt, fig, (ax, right) = new_figure(2, 10)
    for i, (name, style) in enumerate((("T2R + pretrain (a teacher, then finetuning; one run a teacher)", "o-"),
                                       ("T2R from scratch, the same total steps", "s--"))):
        seen = [(budget, runs[i]) for budget, *runs in points if runs[i]]
        for budget, ppl in seen:
            ax.plot([budget] * len(ppl), ppl, style[0], color=f"C{i}", alpha=0.5)
        ax.plot([b for b, _ in seen], [sum(p) / len(p) for _, p in seen], style, color=f"C{i}", label=name)
    ax.set_ylabel("PTB test perplexity")
    ax.legend(fontsize=7)
    right.axhline(0, color="gray", linewidth=0.8)
    # the budgets' gaps unjoined: two budgets, one seed a side at 2x, show no trend with the budget
    right.errorbar([b for b, _, _ in gaps], [g for _, g, _ in gaps], yerr=[n for _, _, n in gaps], fmt="o",
                   color="C2", capsize=4)
    right.set_ylabel("T2R + pretrain minus from scratch (test ppl)")
    right.set_title("the gap at each budget; above 0: from scratch better;\nbars: each side's half range, added "
                    "(no trend read)", fontsize=9)
    ax.set_title("each seed; the line: their mean", fontsize=9)
    for axis in (ax, right):
        axis.set_xticks(sorted({p[0] for p in points}), [f"{p[0]}x" for p in sorted(points)])
        axis.set_xlabel("budget (1x: the study's teacher and finetuning steps)")
    save(plt, fig, footer, path)
