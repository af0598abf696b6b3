"""
The study's figures, drawn from the rows experiments/report.py reads (results/*.csv), each with the command,
machine and date at its foot:

    feature_size.png     Fig. 4 at CPU scale: validation perplexity against k
    attention.png        Figs. 5 and 6: distance to the teacher's attention, and its entropy, against k
    learning_curves.png  validation perplexity against training tokens, conversions starting where the teacher ends
    recall.png           what the state forgets: accuracy on a repeated span against the distance to its first reading
"""

import math
from experiments.claims import group, model_name
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
    fig.text(0.01, 0.01, footer, fontsize=6, color="gray")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
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


def plot_recall(recall: list, footer: str, path: str):
    """Top-1 accuracy on the repeat of a span against the tokens between it and its first reading; dotted: the
    same model on the first reading (what it guesses with nothing to recall)."""
    plt, fig, (ax,) = new_figure(1, 6)
    distances = sorted({r["distance"] for r in recall})
    for i, model in enumerate(dict.fromkeys(r["model"] for r in recall)):
        rows = sorted(group(recall, model=model), key=lambda r: r["distance"])
        color = f"C{i}"
        ax.plot([r["distance"] for r in rows], [r["repeat_accuracy"] for r in rows], marker="o", color=color,
                label=model)
        ax.plot([r["distance"] for r in rows], [r["first_accuracy"] for r in rows], linestyle=":", color=color)
    ax.set_ylabel("top-1 accuracy on the repeated span")
    ax.set_title("What the state forgets (dotted: first reading)")
    ax.legend(fontsize=7)
    log2_axis(ax, distances, "tokens between the span and its repeat")
    save(plt, fig, footer, path)
