"""
The results page's MQAR section (experiments/mqar.py's table, results/mqar.csv): each model's recall at every pair
count and its state's bytes, the learning-rate sweeps of the models trained from scratch, and three or four lines
of what the numbers say conversion keeps and loses. experiments/report.py places it on the page and in the summary.

    python -m experiments.report
"""

import re

from experiments.provenance import mqar_provenance
from experiments.sizes import MQAR_SIZES
from experiments.verdicts import group

FEW_PAIRS = 8  # MQAR's "few pairs": where a state of the smallest k still has room to spare


def selected(rows: list) -> list:
    """The rows a table shows: of a learning-rate sweep, the rate with the lowest validation loss (a table written
    before the sweep has no column for it: every row)."""
    return [r for r in rows if r.get("selected") in (None, 1)]


def mqar_section(results: dict, figure) -> list:
    """MQAR: every model's accuracy at each number of pairs, its state's bytes, the sweeps, and the reading."""
    rows, where = results["mqar"], results["mqar_machine"]
    if not rows:
        return []
    size = MQAR_SIZES["quick" if "--quick" in where.get("command", "").split() else "full"]  # the sizes of the CSV's command
    shown, pairs, longest = selected(rows), sorted({r["pairs"] for r in rows}), max(r["length"] for r in rows)
    lines = ["## What a fixed state forgets: associative recall (MQAR)", "",
             "Multi-query associative recall (Arora et al., 2023): a sequence lists N key-value pairs, then asks for "
             "every key again at a random later position; a model must answer with the key's value. Softmax "
             "attention looks the key up in its KV cache, which grows with the sequence; a T2R state of k x d numbers "
             f"a head holds every pair at once. A {size['n_layer']}-layer teacher (d_model {size['d_model']}, "
             f"{size['n_head']} heads), its conversions to T2R (finetuned; also after attention transfer, and with a "
             f"{size['window']}-token softmax window), and softmax, T2R and SRU++ trained from scratch for the "
             f"teacher's steps and curriculum; {rows[0]['length']}-{longest} tokens, accuracy over every query of the "
             f"same test sequences. Produced by {mqar_provenance(where)}.", "",
             "Attention transfer (`+transfer`) is output matching: each T2R layer's ReLU feature map is trained to "
             "reproduce the softmax attention it replaced (after_t2r.py), then the model is finetuned; its row "
             "\"(after transfer, before finetuning)\" is the model straight after that stage. `+conv`: a short "
             "convolution (kernel 3, depthwise, causal) before each attention layer, as every Zoology baseline has. "
             "SRU++ (attention in every layer here) keeps softmax attention's KV cache beside its recurrence: its "
             "state is mostly that cache, which grows with the sequence (its bytes column)." +
             ("" if any(r.get("selected") is not None for r in rows) else
              " This table was written before the learning-rate sweep and the short convolution: "
              "`python -m experiments.mqar` adds them."), "",
             "| model | lr | steps | state bytes at " + f"{longest} tokens | " +
             " | ".join(f"{n} pairs" for n in pairs) + " |", "|---" * (len(pairs) + 4) + "|"]
    for model in dict.fromkeys(r["model"] for r in shown):
        mine = {r["pairs"]: r for r in group(shown, model=model)}
        last = mine[pairs[-1]]
        name = f"{model} (state: its attention's KV cache)" if model.startswith("sru++") else model
        lines.append(f"| {name} | {rate(last)} | {last['steps'] or '-':,} | {last['state_bytes']:,} | " +
                     " | ".join(f"{mine[n]['accuracy']:.3f}" if n in mine else "-" for n in pairs) + " |")
    return lines + ["", *sweep_table(rows, pairs), *mqar_reading(rows), "",
                    *figure("mqar.png", "What a fixed state forgets", "mqar.csv", mqar_provenance(where))]


def rate(row: dict) -> str:  # a table from before the sweep has none
    return f"{row['lr']:g}" if row.get("lr") else "-"


def sweep_table(rows: list, pairs: list) -> list:
    """The runs of each learning-rate sweep: their validation loss, which picks the one the table shows."""
    swept = [m for m in dict.fromkeys(r["model"] for r in rows) if len({r.get("run") for r in group(rows, model=m)}) > 1]
    if not swept:
        return []
    lines = ["The learning-rate sweeps of the models trained from scratch (the lowest validation loss is shown above):",
             "", f"| model | lr | validation loss | {pairs[0]} pairs | {pairs[-1]} pairs | shown |", "|---" * 6 + "|"]
    for model in swept:
        for run in dict.fromkeys(r["run"] for r in group(rows, model=model)):
            at = {r["pairs"]: r for r in group(rows, model=model, run=run)}
            first, last = at[pairs[0]], at[pairs[-1]]
            if first["accuracy"] is None:  # the rate diverged: NaN or inf losses, no model to score
                lines.append(f"| {model} | {rate(first)} | diverged | - | - | |")
                continue
            lines.append(f"| {model} | {rate(first)} | {first['valid_loss']:.4f} | {first['accuracy']:.3f} | "
                         f"{last['accuracy']:.3f} | {'yes' if first['selected'] else ''} |")
    edge = at_the_edge(rows, swept)
    return lines + ([""] + [f"At the edge of its sweep (a rate beyond it might do better): "
                            f"{', '.join(f'{model} (its pick {lr:g})' for model, lr in edge)}."] if edge else []) + [""]


def at_the_edge(rows: list, swept: list) -> list:
    """[(model, rate)] of the sweeps whose pick (the lowest validation loss) is their highest or lowest rate."""
    edge = []
    for model in swept:
        rates = {r["lr"] for r in group(rows, model=model) if r.get("lr")}
        pick = next((r["lr"] for r in group(rows, model=model) if r.get("selected") == 1), None)
        if pick is not None and len(rates) > 1 and pick in (min(rates), max(rates)):
            edge.append((model, pick))
    return edge


def mqar_reading(rows: list) -> list:
    """Lines from the numbers: what plain T2R keeps with few pairs, what it loses with the most (and what the window
    and attention transfer change), the models trained from scratch, and the short convolution's effect. Models by
    their names in mqar.py's plan: t2r<k>, t2r<k>+transfer, t2r<k>+window<W>, "... from scratch", "...+conv"."""
    rows, pairs = selected(rows), sorted({r["pairs"] for r in rows})
    if not pairs:
        return []
    few, most = (FEW_PAIRS if FEW_PAIRS in pairs else pairs[0]), pairs[-1]
    at = lambda model, n: next((r for r in rows if r["model"] == model and r["pairs"] == n), None)
    models = list(dict.fromkeys(r["model"] for r in rows))
    plain = sorted((m for m in models if re.fullmatch(r"t2r\d+", m)), key=lambda m: int(m[3:]))
    if not (plain and at("softmax", few) and at("softmax", most)):
        return []
    span = lambda names, n: "-".join(f"{f(at(m, n)['accuracy'] for m in names):.2f}" for f in (min, max))
    ends = lambda n: " to ".join(f"{at(m, n)['accuracy']:.2f} (k = {m[3:]}, {at(m, n)['state_bytes']:,} bytes of state)"
                                 for m in (plain[0], plain[-1]))
    variants = [(name, [m for m in models if re.fullmatch(rf"t2r\d+\{key}", m)]) for name, key in
                (("a softmax window", r"+window\d+"), ("attention transfer first", r"+transfer"))]
    lines = [f"- **Kept**: at {few} pairs T2R recalls {span(plain, few)} (k = {', '.join(m[3:] for m in plain)}; "
             f"the teacher {at('softmax', few)['accuracy']:.2f}).",
             f"- **Lost**: at {most} pairs it recalls {ends(most)}, against the teacher's "
             f"{at('softmax', most)['accuracy']:.2f} from a {at('softmax', most)['state_bytes']:,}-byte KV cache"
             + "".join(f"; with {name}, {span(found, most)}" for name, found in variants if found) + "."]
    scratch = [m for m in models if "scratch" in m and "+conv" not in m]
    if scratch:
        state = lambda m: " (a KV cache in its attention layers)" if m.startswith("sru++") else ""  # not a fixed state
        lines.append("- **From scratch**, for the teacher's steps: " + ", ".join(
            f"{m}{state(m)} {at(m, few)['accuracy']:.2f} at {few} pairs and {at(m, most)['accuracy']:.2f} at {most}"
            for m in scratch) + ".")
    conv = [m for m in models if m.endswith("+conv") and "(after" not in m]
    if conv:
        lines.append("- **With a short convolution** before attention, at " + f"{few} and {most} pairs: " + ", ".join(
            f"{m} {at(m, few)['accuracy']:.2f} and {at(m, most)['accuracy']:.2f}" for m in conv) + ".")
    return lines
