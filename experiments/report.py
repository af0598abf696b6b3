"""
The study's report, from its results files alone: reads results/*.csv and results/machine.json (written by
experiments/study.py) and writes

    results/README.md           the full results page: tables, plots, the paper's claims with verdicts, and
                                the command, machine and date that produced the numbers
    results/summary.md          a short block (headline table and verdicts) for the top-level README
    results/feature_size.png    Fig. 4 at CPU scale
    results/attention.png       Figs. 5 and 6 at CPU scale

    python -m experiments.report                     # from results/
    python -m experiments.report --results out/study-quick/results

No run folder is read: the committed CSVs are enough to regenerate the page.
"""


if __package__ in (None, ""):  # run as a file: the project's modules are found from its root, as a module
    raise SystemExit("error: run it from the repository's root as a module: python -m experiments.report")

import argparse
import csv
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
from experiments.claims import (DOUBLED, LONGER, PAPER_LM, PAPER_MT, RETRAINED_TEACHER, all_claims, all_controls,
                                bootstrap_interval, conversion_arm, conversions_of, convergence_checks,
                                equal_budget_gaps, model_name, p_value, table1, verdict_legend)
from experiments.plots import plot_attention, plot_equal_budget, plot_feature_size, plot_learning_curves, plot_mqar
from experiments.provenance import machine_lines, mqar_provenance, partial_banner, provenance, short_provenance
from experiments.records import read
from experiments.mqar_report import mqar_reading, mqar_section, selected
from experiments.sizes import LM_SIZES, MT_SIZES
from experiments.rules import RULES, rules_table
from experiments.verdicts import NOT_MEASURED, exact_permutation_p, group, half_range, welch
from support.runtime import UserError, atomic_write, run_main

CSVS = ("lm_ptb", "feature_size", "attention", "mt")
LM_ORDER = [("elu", "random"), ("rfa", "random"), ("t2r", "random"), ("elu", "pretrained"), ("rfa", "pretrained"),
            ("t2r", "pretrained"), ("t2r75", "pretrained"), ("t2r75top", "pretrained"), ("softmax", "random"),
            ("softmax", "pretrained"), ("t2r-transfer", "pretrained"), ("t2r-window", "pretrained"),
            ("t2r-transfer-window", "pretrained"), ("sru++", "random"), (LONGER, "random")]
MT_ORDER = [("softmax", "random"), ("t2r", "pretrained"), ("t2r", "random"), ("elu", "pretrained"),
            ("rfa", "pretrained"), ("t2r-transfer", "pretrained"), ("t2r-window", "pretrained"),
            ("t2r-transfer-window", "pretrained"), (RETRAINED_TEACHER, "random"), ("softmax", "pretrained")]
# the study's second edition, experiments/mqar.py and experiments/rfa_temperature.py write these
OPTIONAL_CSVS = ("curves", "mt_pairs", "mqar", "rfa_temperature")


# -----------------------------------------------------------------------------
# Reading

def cell(text: str):
    """A CSV cell: None when empty, else an int, a float or the text."""
    if text == "":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def read_csv(path: str) -> list:
    if not os.path.isfile(path):
        raise UserError(f"no {path}: run python -m experiments.study first (or pass --results)")
    with open(path, newline="") as f:
        return [{k: cell(v) for k, v in row.items()} for row in csv.DictReader(f)]


def read_results(results_dir: str) -> dict:
    """{lm, fs, att, mt, bench, curves, mt_pairs, mqar: rows; machine, mqar_machine: machine.json, mqar.json or
    {}}. A Fig. 4 row's variant: pretrained, random or pretrained_mlp_frozen."""
    lm, fs, att, mt = (read_csv(os.path.join(results_dir, f"{name}.csv")) for name in CSVS)
    for r in fs:
        r["variant"] = "pretrained_mlp_frozen" if r["model"] == "t2r_mlp_frozen" else r["init"]
    optional = {name: read_csv(os.path.join(results_dir, f"{name}.csv"))
                if os.path.isfile(os.path.join(results_dir, f"{name}.csv")) else [] for name in OPTIONAL_CSVS}
    bench_csv = os.path.join(results_dir, "bench", "bench.csv")  # bench.py's tables, for Fig. 2's length trend
    bench = read_csv(bench_csv) if os.path.isfile(bench_csv) else []
    machine, mqar_machine = (read(os.path.join(results_dir, f)) for f in ("machine.json", "mqar.json"))
    return dict(lm=lm, fs=fs, att=att, mt=mt, bench=bench, machine=machine, mqar_machine=mqar_machine, **optional)




def feature_sizes_of(results: dict) -> list:
    return sorted({r["k"] for r in results["fs"] + results["att"] if r["k"] is not None})


# -----------------------------------------------------------------------------
# Tables

def mean_spread(values: list) -> str:
    if not values:
        return "-"
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.2f}"
    return f"{mean:.2f} ± {half_range(values):.2f}"


def lm_table(lm: list) -> list:
    """Table 1: its rows (claims.table1), each the mean of its seeds."""
    lm = table1(lm)
    lines = ["| model | k | seeds | valid ppl | test ppl | train minutes | paper valid / test (WT103) |",
             "|---|---|---|---|---|---|---|"]
    for model, init in LM_ORDER:
        rows = group(lm, model=model, init=init)
        if not rows:
            continue
        paper = PAPER_LM.get((model, init))
        lines.append(f"| {model_name(model, init)} | {rows[0]['k'] or '-'} | {len(rows)} | "
                     f"{mean_spread([r['valid_ppl'] for r in rows])} | {mean_spread([r['test_ppl'] for r in rows])} | "
                     f"{mean_spread([r['train_minutes'] for r in rows])} | "
                     f"{f'{paper.valid} / {paper.test}' if paper else 'not in the paper'} |")
    return lines


def teacher_seeds(lm: list) -> list:
    """The teacher's seeds under Table 1, with their standard deviation, where it was trained with more than one."""
    runs = [r["test_ppl"] for r in group(lm, model="softmax", init="random")]
    if len(runs) < 2:
        return []
    mean = sum(runs) / len(runs)
    sd = (sum((x - mean) ** 2 for x in runs) / (len(runs) - 1)) ** 0.5
    listed = ", ".join(f"{x:.2f}" for x in runs)
    return [f"The teacher: {len(runs)} seeds, test ppl {listed} (mean {mean:.2f}, SD {sd:.2f}); the + pretrain rows "
            "convert its seed-0 run, as the paper converts one teacher; a conversion of each of its seeds is the "
            "equal-budget comparison's (below).", ""]


def feature_table(results: dict) -> list:
    fs, att = results["fs"], results["att"]
    columns = [("valid ppl, pretrain", fs, "variant", "pretrained", "valid_ppl", 2),
               ("valid ppl, random init", fs, "variant", "random", "valid_ppl", 2),
               ("valid ppl, MLP frozen", fs, "variant", "pretrained_mlp_frozen", "valid_ppl", 2),
               ("distance before finetuning", att, "stage", "before_finetuning", "distance", 4),
               ("distance finetuned", att, "stage", "finetuned", "distance", 4),
               ("distance MLP frozen", att, "stage", "mlp_frozen", "distance", 4),
               ("entropy finetuned", att, "stage", "finetuned", "entropy", 2),
               ("entropy random init", att, "stage", "random_init", "entropy", 2),
               ("entropy MLP frozen", att, "stage", "mlp_frozen", "entropy", 2)]
    lines = ["| k | " + " | ".join(c[0] for c in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for k in feature_sizes_of(results):
        cells = []
        for _, rows, key, value, column, digits in columns:
            found = [r[column] for r in rows if r[key] == value and r["k"] == k and r[column] is not None]
            cells.append(f"{found[0]:.{digits}f}" if found else "-")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return lines


def teacher_entropy(att: list) -> list:
    """The softmax teacher's entropy, the reference for the T2R columns (it has no distance to itself)."""
    teacher = group(att, stage="teacher")
    if not teacher:
        return []
    return [f"Entropy in nats; the softmax teacher's: {teacher[0]['entropy']:.2f}. Distance: to the teacher's "
            f"distribution of the same window, layer and head.", ""]


def mt_table(mt: list) -> list:
    lines = ["| model | k cross | k causal | test BLEU | valid BLEU | test tok. BLEU | "
             "greedy tokens/s, batch 16 (range) | train minutes | paper BLEU (WMT14 EN-DE) |",
             "|---|---|---|---|---|---|---|---|---|"]
    number = lambda value, digits: "-" if value is None else f"{value:.{digits}f}"
    for model, init in MT_ORDER:
        for r in group(mt, model=model, init=init):
            speed = number(r["tokens_per_s"], 0)
            if r.get("speed_low") is not None and r["speed_low"] != r["speed_high"]:
                speed += f" ({r['speed_low']:.0f}-{r['speed_high']:.0f})"
            lines.append(f"| {model_name(model, init)} | {r['k_cross'] or '-'} | {r['k_causal'] or '-'} | "
                         f"{r['bleu']:.2f} | {number(r.get('valid_bleu'), 2)} | {number(r.get('tok_bleu'), 2)} | "
                         f"{speed} | {number(r.get('train_minutes'), 1)} | "
                         f"{PAPER_MT.get((model, init), 'not in the paper')} |")
    return lines


def budget_points(lm: list) -> list:
    """(budget multiple, T2R + pretrain's test ppl, one conversion a teacher (claims.conversion_arm), T2R from
    scratch's at the same total steps, by seed), where run."""
    runs = lambda rows: [r["test_ppl"] for r in rows]
    points = [(1, runs(conversion_arm(lm)), runs(group(lm, model=LONGER, init="random"))),
              (2, runs(conversion_arm(lm, f"-{DOUBLED}")), runs(group(lm, model=f"{LONGER}-{DOUBLED}", init="random")))]
    return [p for p in points if p[1] or p[2]]


def arm_of(lm: list, budget: int) -> str:
    """T2R + pretrain's runs at a budget (1 or 2), by the teacher each converted."""
    return conversions_of(conversion_arm(lm, "" if budget == 1 else f"-{DOUBLED}"), budget)


def arms_tests(converted: list, scratch: list) -> tuple | None:
    """(Welch's t, its df, its two-sided p, the exact permutation p) where each side has two runs or more."""
    if min(len(converted), len(scratch)) < 2:
        return None
    return (*welch(converted, scratch), exact_permutation_p(converted, scratch))


def equal_budget_section(results: dict, figure) -> list:
    points = budget_points(results["lm"])
    if not points:
        return []
    size = LM_SIZES[edition(results)]
    steps = size["pretrain_steps"] + size["finetune_steps"]
    return ["| budget | total steps | T2R + pretrain | T2R from scratch, the same steps | Welch's t (df), two-sided p "
            "| exact permutation p |", "|---|---|---|---|---|---|",
            *[f"| {b}x | {b * steps:,} | {mean_spread(c)} ({arm_of(results['lm'], b)}) | {mean_spread(r)} "
              f"({seeds(r)}) | {tests_cells(c, r)} |" for b, c, r in points], "", *equal_budget_lines(results), "",
            *figure("equal_budget.png", "Equal budgets", "lm_ptb.csv")]


def tests_cells(converted: list, scratch: list) -> str:
    """The equal-budget table's last two cells: Welch's t (df), its two-sided p | the exact permutation p."""
    found = arms_tests(converted, scratch)
    if found is None:
        return f"- ({'one run a side' if max(len(converted), len(scratch)) < 2 else 'a side of one run'}) | -"
    t, df, p, exact = found
    return f"{t:.2f} ({df:.1f}), {p_value(p)} | {exact:.2f}"


def seeds(runs: list) -> str:
    return f"{len(runs)} seed" + ("" if len(runs) == 1 else "s")


def curves_section(results: dict, figure) -> list:
    """The learning curves, and whether each teacher met the convergence rule (claims.CONVERGED)."""
    if not results["curves"]:
        return []
    checks = convergence_checks(results["curves"])
    return ["## Learning curves and convergence", "",
            "Validation perplexity against training tokens; a converted run starts where its teacher ended. For the "
            "language model these are train_lm.py's periodic estimates on the first `--eval_windows` windows of the "
            "validation split, which read higher than the tables' perplexities (every window). A teacher "
            "counts as converged when the last fifth of its run lowered its best validation perplexity by less than "
            "1%.", "", *[f"- {name}: {measured}: {verdict}" for name, measured, verdict in checks], "",
            *figure("learning_curves.png", "Learning curves", "curves.csv")]


def rule_of(claim: str) -> str:
    """The id of the rule in force that judges a check (experiments/rules.py), by the check's text."""
    found = [rule.id for rule in RULES if rule.in_force and re.match(rule.check, claim)]
    return found[0] if len(found) == 1 else "none"


def claims_table(claims: list) -> list:
    lines = ["| claim | paper | ours | held | rule |", "|---|---|---|---|---|"]
    lines += [f"| {c} | {paper} | {ours} | {held} | {rule_of(c)} |" for c, paper, ours, held in claims]
    return lines


def outcome(held: str):
    """A verdict as the headline counts it: agreed, did not, inconclusive (within noise too: the difference is
    inside the noise), or None for a check with nothing to judge (n/a) or no runs yet."""
    if held in (NOT_MEASURED, "n/a"):
        return None
    return "agreed" if held == "yes" else "did not" if held == "**no**" else "inconclusive"


def headline(claims: list) -> str:
    """"Of 19 checks of the paper's claims at CPU scale, 8 agreed, 3 did not, 8 were inconclusive": the paper's claims
    alone, each on the paper's own comparison; the controls are listed apart with their outcomes, not counted."""
    found = [outcome(held) for *_, held in claims]
    waiting = sum(held == NOT_MEASURED for *_, held in claims)
    return (f"**Of {len(found) - found.count(None)} checks of the paper's claims at CPU scale, {found.count('agreed')} "
            f"agreed, {found.count('did not')} did not, {found.count('inconclusive')} were inconclusive**"
            + (f" ({waiting} not measured yet)" if waiting else ""))


def equal_budget_lines(results: dict) -> list:
    """One sentence per equal-budget comparison (PTB at 1x and 2x, translation), with its seeds and the test its
    seeds allow: Welch's t and the exact permutation p where each side has two runs or more, the paired bootstrap
    over the test sentences for the translators; a side of one seed has no p. T2R + pretrain: one conversion a
    teacher (claims.conversion_arm), named by the teacher's seeds."""
    lines, size = [], LM_SIZES[edition(results)]
    steps = size["pretrain_steps"] + size["finetune_steps"]
    for budget, converted, scratch in budget_points(results["lm"]):
        if not (converted and scratch):
            continue
        text = (f"PTB at {budget}x ({budget * steps:,} steps): T2R + pretrain {mean_spread(converted)} "
                f"({arm_of(results['lm'], budget)}) against T2R from scratch {mean_spread(scratch)} "
                f"({seeds(scratch)}), {sum(converted) / len(converted) - sum(scratch) / len(scratch):+.2f} test ppl")
        found = arms_tests(converted, scratch)
        if found:
            t, df, p, exact = found
            text += (f"; Welch's t {t:.2f} (df {df:.1f}), two-sided p = {p_value(p)}; exact permutation p = "
                     f"{exact:.2f} over every split of the {len(converted + scratch)} runs")
        else:
            text += "; one seed a side: no p can be computed"
        lines.append(f"- {text}.")
    get = lambda model, init: (group(results.get("mt", []), model=model, init=init) or [None])[0]
    t2r, longer = get("t2r", "pretrained"), get(LONGER, "random")
    if t2r and longer:
        interval = bootstrap_interval(results.get("mt_pairs", []), t2r, longer)[0]
        lines.append(f"- Translation: T2R + pretrain {t2r['bleu']:.2f} against T2R from scratch {longer['bleu']:.2f} "
                     f"test BLEU, one seed a side{interval or '; no paired bootstrap'} (paired bootstrap over the "
                     f"test sentences).")
    return lines


# -----------------------------------------------------------------------------
# The pages

FILES = [  # (file, one row per, its columns), the last table of the page
    ("lm_ptb.csv", "Table 1 run", "`model` (softmax, elu, rfa, sru++, t2r, t2r-transfer, t2r-window, "
     "t2r-transfer-window, t2r75 and t2r75top: the two readings of the 75% hybrid), `init` (random; pretrained "
     "= converted from the teacher, and for softmax the control), `k` (empty for softmax), `seed`, `teacher` (of a "
     "pretrained row: the seed of the teacher it converted; Table 1's are seed 0's, the conversions of seeds 1 and 2 "
     "the equal-budget comparison's), `valid_ppl`, `test_ppl`, `train_minutes` (for pretrained rows the finetuning "
     "only)"),
    ("feature_size.csv", "Fig. 4 run (seed 0)", "`model` (t2r, or t2r_mlp_frozen: the feature-map MLP frozen while "
     "finetuning), `init`, `k`, `seed`, `valid_ppl`, `test_ppl`, `train_minutes`"),
    ("attention.csv", "model in Figs. 5-6", "`stage` (teacher; before_finetuning: the teacher swapped to T2R, "
     "untrained; finetuned; mlp_frozen; random_init), `k`, `distance` (to the teacher's distribution of the same "
     "window, layer and head), `entropy` (nats, over the rows that are not empty), `empty_rows` (the fraction of "
     "rows whose ReLU features are all zero), `valid_ppl`, `windows`"),
    ("mt.csv", "Table 2 run", "`model` (softmax-retrained: the teacher trained again with its flags on another "
     "machine, into other weights, the start of the runs converted since), `init`, `k_cross`, `k_causal`, `bleu` "
     "(test, sacreBLEU), `valid_bleu`, "
     "`tok_bleu` (test, tokenized), `tokens_per_s` (greedy, batch 16, test sentences: the median of `speed_passes` "
     "passes, from `speed_low` to `speed_high`), `tokens_per_sentence` (generated, on average), `train_minutes`"),
    ("mt_pairs.csv", "pair of Table 2 runs", "`model`, `init` against `against_model`, `against_init`: `delta` (test "
     "BLEU difference), `low` to `high` (its 95% interval over `samples` paired bootstrap resamples of the test "
     "sentences, Koehn 2004)"),
    ("curves.csv", "evaluation of a run", "`task` (lm, mt), `model`, `init`, `step`, `tokens` (training target tokens "
     "seen so far), `valid_loss` (nats per token); seed-0 runs of the tables"),
    ("mqar.csv", "MQAR run and number of pairs", "`model` (a learning-rate sweep's runs share it), `run`, `lr`, `conv` "
     "(1: the short convolution), `selected` (1: the sweep's lowest `valid_loss`, the run the tables show), `pairs`, "
     "`length` (tokens), `accuracy` (over every query of the test sequences; empty: the run diverged), "
     "`state_bytes` (the generation state after `length` tokens, batch 1), `steps` (training, a conversion's after "
     "its teacher's), `valid_loss`, `train_minutes`; `mqar.json`: its command, machine and date"),
    ("bench/bench.csv", "bench.py measurement", "`section` (s2s: the translator's greedy decoding, source = target "
     "length), `model`, `batch`, `length`, `metric`, `value`, `unit`, `device`; Fig. 2's length claims read it"),
    ("machine.json", "", "the command, the machines and dates of the runs, how many of the planned runs finished"),
    ("runs/", "finished run", "its record (experiments/records.py), from which the CSVs are gathered: "
     "`results.json`, `args.json`, `machine.json`, `weights.json` (digests of its weights and its teacher's), and "
     "its probes' `attention.csv`, `speed.json`, a translator's `valid.hyp` and `test.hyp`; `retrained/`: the same "
     "files of its training again, where that gave other weights; `runs/mqar/`: an MQAR run's `results.json`, "
     "`config.json` (its model), `args.json` (the training loop's flags; the curriculum's steps, where recorded) "
     "and `machine.json`")]


def edition(results: dict) -> str:
    """"quick" or "full": the sizes (experiments/sizes.py) of the runs, as the command in machine.json says."""
    return "quick" if "--quick" in (results.get("machine") or {}).get("command", "").split() else "full"


def model_sizes(edition: str) -> str:
    """The study's models (experiments/sizes.py), at the top: the numbers below are theirs."""
    lm, mt = LM_SIZES[edition]["model"], MT_SIZES[edition]["model"]
    return (f"The models: a {lm['n_layer']}-layer language model, d_model {lm['d_model']}, {lm['n_head']} heads of "
            f"{lm['d_model'] // lm['n_head']}, feed-forward {lm['d_ff']} (the paper: 32 layers, 1024, 8 heads of 128, "
            f"4096); a {mt['n_encoder_layer']}+{mt['n_layer']}-layer translator, d_model {mt['d_model']}, "
            f"{mt['n_head']} heads, feed-forward {mt['d_ff']} (the paper: 6+6, 1024, 16 heads, 4096).")


def results_page(results: dict, claims: list, controls: list) -> list:
    machine = results["machine"]
    figure = lambda name, title, source, made_by=provenance(machine): [
        f"![{title}]({name})", "", f"*{title}, drawn from `{source}`; the runs: {made_by}.*", ""]
    return ["<!-- written by experiments/report.py from the CSVs and machine.json beside it; do not edit -->",
            "# The paper's findings at CPU scale", "",
            "The T2R paper's Table 1, Fig. 4, Figs. 5-6 and Table 2, rerun with models small enough for a CPU: "
            f"{headline(claims)} ({scope(results)}). {seed_line(results)} Each claim of the paper is checked once, on "
            "the comparison the paper made, by the rule dated below; the controls and ablations are the study's own, "
            f"which the paper did not run, listed with their outcomes ({len(controls)}), not counted. "
            f"Produced by {provenance(machine)}. "
            "`python -m experiments.report` rewrites this page from the files beside it.", "",
            model_sizes(edition(results)), "", *partial_banner(machine),
            "## Language modelling (Table 1, PTB)", "", *lm_table(results["lm"]), "",
            "With two or three seeds: mean ± half the range. Train minutes of a + pretrain row: the finetuning only; "
            "a + transfer row trains its attention-transfer steps before the same finetuning steps, and its minutes "
            "include them. RFA's k counts features: a sin and a cos for each random projection." +
            rfa_temperature(results["rfa_temperature"]), "",
            *teacher_seeds(results["lm"]),
            *curves_section(results, figure), *mqar_section(results, figure),
            "## Feature size and attention (Figs. 4-6, PTB validation, seed 0)", "", *feature_table(results), "",
            *teacher_entropy(results["att"]),
            *(figure("feature_size.png", "Fig. 4 at CPU scale", "feature_size.csv") if results["fs"] else []),
            *(figure("attention.png", "Figs. 5 and 6 at CPU scale", "attention.csv") if results["att"] else []),
            "## Translation (Table 2, LibreOffice help en-de)", "", *mt_table(results["mt"]), "",
            "## The paper's claims and ours", "",
            "One check per claim of the paper, on the comparison the paper made (the teacher, its budgets).", "",
            *claims_table(claims), "",
            "## The study's controls and ablations", "",
            "Checks the paper did not make: T2R + pretrain against T2R from scratch for the same total steps (at 1x a "
            "conversion of each of three teachers, trained with seeds 0, 1 and 2, against three seeds from scratch, by "
            "the two-arms rule; at twice every budget one run a side), against the teacher trained on for the "
            "finetuning's steps, and the 75% hybrid's other reading (the top layer kept); and the decoding speed on "
            "the test sentences (the paper's Table 2 points to Fig. 2 for speed, checked above). At twice the budget "
            "a side with one seed takes its 1x seeds' spread.", "", *claims_table(controls), "",
            *equal_budget_section(results, figure), verdict_legend(), "",
            "## The rules, dated", "",
            "Every verdict's rule, with the commit that set it and whether its runs had finished by then "
            "(experiments/rules.py, the only copy). Where a rule was set after its runs' numbers were known, the "
            "check's numbers end with the verdict of the rule in force before them; Figs. 5 and 6 follow the rule "
            "set before their runs, the later rule's verdict beside it.", "", *rules_table(), "",
            "## Where and when", "",
            f"Produced by {provenance(machine)}. Where the runs ran (minutes and tokens/s compare only within one "
            "machine):", "", *[f"- {line}" for line in machine_lines(machine)], "",
            *([machine["note"], ""] if machine.get("note") else []),
            *(["Fig. 2's length claims read `bench/bench.csv`, written by its own `bench.py` run: its command, machine "
               "and date head [bench/bench.md](bench/bench.md).", ""] if results["bench"] else []),
            "## The files", "", "Floats to 4 decimals; an empty cell where a value does not apply.", "",
            "| file | one row per | columns |", "|---|---|---|",
            *[f"| `{f}` | {row} | {cols} |" for f, row, cols in FILES], ""]


def scope(results: dict) -> str:
    """What the checks stand on, in a few words: the corpora, the models' sizes, the teachers' convergence."""
    lm, mt = LM_SIZES[edition(results)]["model"], MT_SIZES[edition(results)]["model"]
    words = [f"PTB and en-de, {lm['n_layer']}-layer models of d_model {lm['d_model']} (en-de: "
             f"{mt['n_encoder_layer']}+{mt['n_layer']})"]
    checks = convergence_checks(results.get("curves", []))
    unconverged = [name for name, _, verdict in checks if verdict != "converged"]
    if checks and not unconverged:
        words.append("teachers converged")
    elif len(checks) > 1 and len(unconverged) == len(checks):
        words.append("teachers not converged")
    elif unconverged:
        words.append(f"{unconverged[0]} not converged")
    return ", ".join(words)


def seed_counts(counts: set) -> str:
    """"1 to 3", "1 or 2", "one": how many seeds the models of one part have."""
    counts = sorted(counts - {0})
    if counts == [1]:
        return "one"
    return " or ".join(map(str, counts)) if len(counts) < 3 else f"{counts[0]} to {counts[-1]}"


def seed_line(results: dict) -> str:
    """The seeds of each part by name, so that a one-seed part is not hidden behind the largest count."""
    lm = {len(group(table1(results["lm"]), model=model, init=init)) for model, init in LM_ORDER}
    doubled = {len(group(results["lm"], model=f"{model}-{DOUBLED}", init=init))
               for model, init in (("softmax", "random"), ("t2r", "pretrained"), (LONGER, "random"))}
    mt = {len(group(results["mt"], model=model, init=init)) for model, init in MT_ORDER}
    figures = {len(group(results.get("fs", []), variant=r["variant"], k=r["k"])) for r in results.get("fs", [])}
    parts = [(lm, "Table 1's language models"), (doubled, "twice the budget"), (mt, "translation"),
             (figures, "Figs. 4-6")]
    phrases = {}  # the parts of one count together: "one each for twice the budget, translation and Figs. 4-6"
    for counts, name in parts:
        if counts - {0}:
            phrases.setdefault(seed_counts(counts), []).append(name)
    said = [f"{count}{' each' * (len(names) > 1)} for " + (", ".join(names[:-1]) + " and " if names[1:] else "")
            + names[-1] for count, names in phrases.items()]
    return f"Seeds: {'; '.join(said)}." if said else ""


def summary_page(results: dict, claims: list, controls: list, link: str) -> list:
    """Under 40 lines, for the top-level README: two short lines first (what was checked, how many held, on what
    scale; the link to the page), then the headline numbers beside the paper's, the runs, and every verdict."""
    lm, mt = table1(results["lm"]), results["mt"]
    rows = [("softmax", "random"), ("t2r", "pretrained"), ("t2r", "random"), ("elu", "pretrained"),
            ("rfa", "pretrained"), ("t2r75", "pretrained"), ("softmax", "pretrained"), (LONGER, "random")]
    lines = ["<!-- the top-level README's Results section: its links are relative to the repository's root -->",
             f"{headline(claims)}: {scope(results)}.",
             f"{seed_line(results)} The study's {len(controls)} controls are listed with their outcomes, not counted.",
             f"Tables, plots, every claim, its rule and where each run ran: [{link}]({link}).", "",
             *partial_banner(results["machine"]),  # while runs are missing: under the three lines the README quotes
             "| model | PTB test ppl (paper, WikiText-103) | en-de test BLEU (paper, WMT14) |", "|---|---|---|"]
    for model, init in rows:
        ppl = [r["test_ppl"] for r in group(lm, model=model, init=init)]
        bleu = group(mt, model=model, init=init)
        paper_lm, paper_mt = PAPER_LM.get((model, init)), PAPER_MT.get((model, init))
        lines.append(f"| {model_name(model, init)} | {mean_spread(ppl)}" + (f" ({paper_lm.test})" if paper_lm else "")
                     + " | " + (f"{bleu[0]['bleu']:.2f}" + (f" ({paper_mt})" if paper_mt else "") if bleu else "-")
                     + " |")
    lines += ["", f"Made by {short_provenance(results['machine'])}."]
    budgets = equal_budget_lines(results)
    if budgets:  # the study's control: the paper compares the conversion with T2R from scratch at the teacher's budget
        lines += ["", "At equal total steps (the study's control, not a claim of the paper):", "", *budgets]
    reading = mqar_reading(results.get("mqar", []))
    if reading:  # what a fixed state forgets, in three lines
        made_by = mqar_provenance(results.get("mqar_machine", {}))
        lines += ["", f"Associative recall (MQAR), what conversion keeps and loses ({made_by}):", "", *reading]
    lines += ["", "The paper's claims:", ""]
    lines += [f"- {held}: {claim}" for claim, _, _, held in claims]
    lines += ["", "The study's controls and ablations, with their outcomes (not counted):", ""]
    lines += [f"- {held}: {claim}" for claim, _, _, held in controls]
    return lines + [""]


def write_text(path: str, lines: list):
    with atomic_write(path) as tmp, open(tmp, "w") as f:
        f.write("\n".join(lines))


def rfa_temperature(rows: list) -> str:
    """Why RFA is weak here, from results/rfa_temperature.csv (experiments/rfa_temperature.py), where it is."""
    if not rows:
        return ""
    implied = [float(r["implied_tau"]) for r in rows]
    return (f" Why RFA is weak here: its kernel starts at tau = 1, far blunter than the teacher's attention, which "
            f"implies tau {min(implied):.2f}-{max(implied):.2f} per head, and its random projections cannot estimate "
            "a sharper one ([measurements.md](measurements.md#rfas-temperature-at-the-swap), `python -m "
            "experiments.rfa_temperature`): its **no** verdicts say little about T2R.")


def write_report(results_dir: str):
    results = read_results(results_dir)
    claims, controls = all_claims(results), all_controls(results)
    footer = provenance(results["machine"]).replace("`", "")
    figures = [(results["fs"], plot_feature_size, "feature_size.png", (feature_sizes_of(results),)),
               (results["att"], plot_attention, "attention.png", (feature_sizes_of(results),)),
               (results["curves"], plot_learning_curves, "learning_curves.png", ())]
    for rows, plot, name, extra in figures:
        if rows:
            plot(rows, *extra, footer, os.path.join(results_dir, name))
    if budget_points(results["lm"]):
        plot_equal_budget(budget_points(results["lm"]), equal_budget_gaps(results["lm"]), footer,
                          os.path.join(results_dir, "equal_budget.png"))
    if results["mqar"]:
        plot_mqar(selected(results["mqar"]), mqar_provenance(results["mqar_machine"]).replace("`", ""),
                  os.path.join(results_dir, "mqar.png"))
    link = os.path.relpath(os.path.join(results_dir, "README.md"), ROOT)
    write_text(os.path.join(results_dir, "README.md"), results_page(results, claims, controls))
    write_text(os.path.join(results_dir, "summary.md"), summary_page(results, claims, controls, link))
    print("\n".join(summary_page(results, claims, controls, link)))
    print(f"wrote {os.path.relpath(results_dir)}/README.md, summary.md and the plots")


def main(argv=None):
    p = argparse.ArgumentParser(description="The study's results page, from results/*.csv alone.")
    p.add_argument("--results", default=os.path.join(ROOT, "results"),
                   help="the folder with the CSVs and machine.json; the page and plots are written there")
    write_report(os.path.abspath(p.parse_args(argv).results))


if __name__ == "__main__":
    run_main(main)
