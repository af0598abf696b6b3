"""
The study's results files, gathered from its run folders (or, where out/ lacks a run, its record under results/runs:
experiments/records.py): each finished run's results.json and its probes' files (experiments/probes.py:
attention.csv, speed.json), the translators' test.hyp, into results/*.csv, floats to 4 decimals, and where and
when the runs ran into results/machine.json. experiments/report.py reads these files alone. Tables of fewer finished
runs than results/ already holds are refused, not written over it.
"""

import csv
import json
import os

import torch
from sacrebleu.metrics import BLEU
from experiments.claims import LONGER, RETRAINED_TEACHER, doubled
from experiments.probes import MAIN_K, attention_checkpoints
from experiments.records import RETRAINED, Records, read
from experiments.runs import read_json, shorten, state
from support.runtime import UserError, write_csv, write_json


# -----------------------------------------------------------------------------
# The tables

# teacher: of a converted run, the seed of the teacher it started from (Table 1's: 0; the equal-budget comparison
# converts each of the teacher's seeds)
LM_COLUMNS = ["model", "init", "k", "seed", "teacher", "valid_ppl", "test_ppl", "train_minutes"]
FEATURE_COLUMNS = [c for c in LM_COLUMNS if c != "teacher"]  # Fig. 4's runs: all the seed-0 teacher's
CURVE_COLUMNS = ["task", "model", "init", "step", "tokens", "valid_loss"]
ATTENTION_COLUMNS = ["stage", "k", "distance", "entropy", "empty_rows", "valid_ppl", "windows"]
MT_COLUMNS = ["model", "init", "k_cross", "k_causal", "bleu", "valid_bleu", "tok_bleu", "tokens_per_s", "speed_low",
              "speed_high", "speed_passes", "tokens_per_sentence", "train_minutes"]


def finished(runs: list) -> list:
    return [r for r in runs if state(r) == "done"]


def lm_rows(runs: list) -> list:
    rows = []
    for run in finished(runs):
        r = read_json(os.path.join(run.out_dir, "results.json"))
        rows.append({**run.row, "valid_ppl": r["valid"]["ppl"], "test_ppl": r["test"]["ppl"],
                     "train_minutes": r["train_minutes"]})
    return rows


def table1_rows(lm: list) -> list:
    """Table 1 and the rows beyond it: every model at its main k (T2R 32, RFA 32 projections, ELU the head size)."""
    fig4_only = lambda r: r["model"] == "t2r-frozen" or (r["model"] == "t2r" and r["k"] != MAIN_K)
    return [r for r in lm if not fig4_only(r)]


def curve_rows(task: str, runs: list) -> list:
    """The learning curves (validation perplexity against training tokens) of every seed-0 run but the Fig. 4
    ones and those at twice the budget: each run's results.json keeps [step, tokens, validation loss] for each
    evaluation."""
    rows = []
    for run in finished(runs):
        if run.row.get("seed", 0) != 0 or run.row["model"] == "t2r-frozen" or doubled(run.row["model"]) or \
                (run.row["model"] == "t2r" and run.row.get("k", MAIN_K) not in (MAIN_K, None)):
            continue
        for step, tokens, loss in read_json(os.path.join(run.out_dir, "results.json")).get("curve", []):
            rows.append({"task": task, "model": run.row["model"], "init": run.row["init"], "step": step,
                         "tokens": tokens, "valid_loss": loss})
    return rows


def feature_size_rows(lm: list) -> list:
    """Fig. 4: the T2R models of every k (seed 0), the frozen-MLP ones named t2r_mlp_frozen."""
    order = {("t2r", "pretrained"): 0, ("t2r-frozen", "pretrained"): 1, ("t2r", "random"): 2}
    rows = [{**r, "model": r["model"].replace("-frozen", "_mlp_frozen")} for r in lm
            if (r["model"], r["init"]) in order and r["seed"] == 0]
    return sorted(rows, key=lambda r: (order[(r["model"].replace("_mlp_frozen", "-frozen"), r["init"])], r["k"]))


def mt_rows(runs: list) -> list:
    rows = []
    for run, folder, row in trained_translators(runs):
        r = read_json(os.path.join(folder, "results.json"))
        speed_path = os.path.join(folder, "speed.json")
        speed = read_json(speed_path) if os.path.isfile(speed_path) else {}
        passes = speed.get("tokens_per_s_passes", [speed["tokens_per_s"]] if speed else [])
        rows.append({**row, "k_cross": r.get("k_cross"), "k_causal": r.get("k_causal"), "bleu": r["test"]["bleu"],
                     "valid_bleu": r["valid"]["bleu"], "tok_bleu": r["test"]["tok_bleu"],
                     "tokens_per_s": speed.get("tokens_per_s"),
                     "speed_low": min(passes, default=None), "speed_high": max(passes, default=None),
                     "speed_passes": len(passes) or None,
                     "tokens_per_sentence": speed["tokens"] / speed["sentences"] if "sentences" in speed else None,
                     "train_minutes": r["train_minutes"]})
    return rows


def trained_translators(runs: list) -> list:
    """(run, folder, table row) of each finished translator, and of a teacher trained again into other weights (its
    retrained/ folder, the row's model named "<model>-retrained": the start of the runs converted since)."""
    found = []
    for run in finished(runs):
        found.append((run, run.out_dir, run.row))
        again = os.path.join(run.out_dir, RETRAINED)
        if os.path.isfile(os.path.join(again, "results.json")):
            found.append((run, again, {**run.row, "model": f"{run.row['model']}-{RETRAINED}"}))
    return found


def attention_rows(runs: list, lm: list) -> list:
    """Figs. 5-6: the teacher's attention.csv (the teacher, and the teacher swapped to T2R at each k before
    finetuning), then each analysed T2R model's row of its own (its file's teacher row is left out)."""
    ppl = {(row["model"], row["init"], row["k"], row["seed"]): row["valid_ppl"] for row in lm}
    rows = []
    for stage, k, run in [("teacher", None, runs[0])] + attention_checkpoints(runs):
        path = os.path.join(run.out_dir, "attention.csv")
        if state(run) != "done" or not os.path.isfile(path):
            continue
        with open(path) as f:
            for row in csv.DictReader(f):
                if (row["stage"] == "teacher") != (stage == "teacher") and row["stage"] != "before finetuning":
                    continue
                number = lambda name: float(row[name]) if row[name] != "" else None
                entry = dict(distance=number("distance"), entropy=number("entropy"), empty_rows=number("empty_rows"),
                             windows=int(row["windows"]))
                if row["stage"] == "before finetuning":
                    entry.update(stage="before_finetuning", k=int(row["k"]), valid_ppl=None)
                else:
                    model, init = ("softmax", "random") if stage == "teacher" else (run.row["model"], run.row["init"])
                    key = (model, init, k, run.row["seed"])
                    entry.update(stage=stage, k=k, valid_ppl=ppl.get(key))
                rows.append(entry)
    order = ["teacher", "before_finetuning", "finetuned", "mlp_frozen", "random_init"]
    return sorted(rows, key=lambda r: (order.index(r["stage"]), r["k"] or 0))


def rounded(rows: list, columns: list) -> list:
    """The columns of each row, floats to 4 decimals, for the results CSVs."""
    return [{c: f"{r[c]:.4f}" if isinstance(r.get(c), float) else r.get(c) for c in columns} for r in rows]


def provenance(runs: list, lm_plan: list, quick: bool) -> dict:
    """results/machine.json: the command, and where and when the finished runs ran (grouped)."""
    machines = {}
    for run in finished(runs):
        path = os.path.join(run.out_dir, "machine.json")
        m = read_json(path) if os.path.isfile(path) else {}
        where = {key: m.get(key) for key in ("device", "threads", "torch", "date")}
        key = json.dumps(where)
        machines[key] = {**where, "runs": machines.get(key, {}).get("runs", 0) + 1}
    return {"command": "bash experiments/reproduce.sh" + (" --quick" if quick else ""),
            "machines": list(machines.values()), "runs_planned": len(runs), "runs_finished": len(finished(runs)),
            "attention_models": attention_counts(lm_plan)}


def attention_counts(lm_plan: list) -> list:
    """[analysed, planned]: the models whose attention (Figs. 5-6) the probes have measured, of those planned."""
    models = [lm_plan[0]] + [run for _, _, run in attention_checkpoints(lm_plan)]
    return [sum(os.path.isfile(os.path.join(r.out_dir, "attention.csv")) for r in models), len(models)]


# -----------------------------------------------------------------------------
# Table 2's differences, with their noise: a paired bootstrap over the test sentences (Koehn, 2004)

MT_PAIRS_COLUMNS = ["model", "init", "against_model", "against_init", "delta", "low", "high", "samples"]
BOOTSTRAP_SAMPLES = 1000
# A difference of two test BLEUs that results.json rounds to 2 decimals (each 0.005 off at most), against the table's
# delta to 4 (0.00005 off): the same runs' numbers agree within their sum
ROUNDED_DELTA = 2 * 0.005 + 0.00005


def bleu_statistics(hypotheses: list, references: list) -> torch.Tensor:
    """Each sentence's BLEU sufficient statistics, (n, 10): 4 n-gram matches, 4 n-gram counts, lengths."""
    bleu = BLEU(effective_order=True)  # changes sentence scores, not the statistics; silences sacreBLEU's advice
    rows = []
    for hypothesis, reference in zip(hypotheses, references):
        s = bleu.sentence_score(hypothesis, [reference])
        rows.append([*s.counts, *s.totals, s.sys_len, s.ref_len])
    return torch.tensor(rows, dtype=torch.float64)


def corpus_bleu(stats: torch.Tensor) -> float:
    """sacreBLEU's corpus score (exp smoothing, as its corpus_score) from summed sentence statistics."""
    total = [int(v) for v in stats.sum(0).tolist()]
    return BLEU.compute_bleu(total[:4], total[4:8], total[8], total[9], smooth_method="exp").score


def paired_bootstrap(a: torch.Tensor, b: torch.Tensor, samples: int = BOOTSTRAP_SAMPLES, seed: int = 0) -> tuple:
    """BLEU(a) - BLEU(b) on the test set, and the 95% interval of that difference over `samples` resamples of the
    sentences, the same resample for both systems."""
    generator = torch.Generator().manual_seed(seed)
    index = torch.randint(len(a), (samples, len(a)), generator=generator)
    deltas = sorted(corpus_bleu(a[i]) - corpus_bleu(b[i]) for i in index)
    return corpus_bleu(a) - corpus_bleu(b), deltas[int(0.025 * samples)], deltas[int(0.975 * samples) - 1]


def mt_pair_rows(runs: list, kept_csv: str | None = None) -> list:
    """Every finished translator against the teacher, T2R + pretrain against T2R from scratch (the teacher's steps,
    and the teacher's and the finetuning's together) and against the softmax control, ELU + pretrain against T2R +
    pretrain, and the control against its start where that is the teacher trained again: the BLEU difference with its
    bootstrap interval (where both saved test.hyp). Without the test corpus on this machine: the rows of kept_csv,
    where they are the same pairs of the same runs."""
    done = {(row["model"], row["init"]): (run, folder) for run, folder, row in trained_translators(runs)
            if os.path.isfile(os.path.join(folder, "test.hyp"))}
    teacher, again = ("softmax", "random"), (RETRAINED_TEACHER, "random")
    pairs = [(key, teacher) for key in done if key != teacher]
    pairs += [(("t2r", "pretrained"), ("t2r", "random")), (("elu", "pretrained"), ("t2r", "pretrained")),
              (("t2r", "pretrained"), ("softmax", "pretrained")),  # against the control, the teacher trained on
              (("t2r", "pretrained"), (LONGER, "random")),  # against T2R from scratch for the same total steps
              (("softmax", "pretrained"), again)]  # the control against its start, where that is the teacher retrained
    pairs = [(a, b) for a, b in pairs if a in done and b in done]
    if not pairs:
        return []
    references = test_references(done[pairs[0][0]][0].out_dir)
    if references is None:
        return kept_pairs(kept_csv, pairs, done)
    stats = {key: bleu_statistics(read_hypotheses(os.path.join(folder, "test.hyp"), references), references)
             for key, (run, folder) in done.items()}
    rows = []
    for a, b in pairs:
        delta, low, high = paired_bootstrap(stats[a], stats[b])
        rows.append(dict(model=a[0], init=a[1], against_model=b[0], against_init=b[1], delta=delta, low=low,
                         high=high, samples=BOOTSTRAP_SAMPLES))
    return rows


def test_references(out_dir: str) -> list | None:
    """The references a run's test.hyp translates: its corpus's test split, as many sentences as it scored. None
    where the corpus is not prepared on this machine (a fresh checkout has no data/): the results are not the place
    to download it."""
    from support import mt_data
    args = read_json(os.path.join(out_dir, "args.json"))
    if not mt_data.corpus_at_hand(args["dataset"], args["src"], args["tgt"], args.get("data_dir")):
        return None
    corpus = mt_data.load_parallel(args["dataset"], args["src"], args["tgt"], args.get("data_dir"))
    return [target for _, target in corpus["test"][: args.get("bleu_sentences") or None]]


def kept_pairs(path: str | None, pairs: list, done: dict) -> list:
    """The rows of the table kept at path, where it pairs the same runs in the same order and each difference is
    theirs: the difference of the two runs' test BLEU. Else one line: the bootstrap needs the test references."""
    kept = []
    if path and os.path.isfile(path):
        with open(path, newline="") as f:
            kept = list(csv.DictReader(f))
    bleu = {key: read_json(os.path.join(folder, "results.json"))["test"]["bleu"] for key, (_, folder) in done.items()}
    same = [((r["model"], r["init"]), (r["against_model"], r["against_init"])) for r in kept] == pairs and all(
        abs(float(r["delta"]) - (bleu[a] - bleu[b])) <= ROUNDED_DELTA for r, (a, b) in zip(kept, pairs))
    if not same:
        raise UserError(f"{shorten(path or 'mt_pairs.csv')} needs the translators' test references, and their "
                        f"corpus is not prepared here: run train_mt.py once with the runs' --dataset to prepare it, "
                        f"then rerun this command")
    return kept


def read_hypotheses(path: str, references: list) -> list:
    """A run's translations, a line each as translate.evaluate_bleu wrote them, one per reference."""
    with open(path, encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")[:-1]
    if len(lines) != len(references):
        raise UserError(f"{path} has {len(lines)} translations for {len(references)} test sentences: rerun "
                        f"train_mt.py --eval_only --out_dir {os.path.dirname(path)}")
    return lines


def refuse_fewer(results_dir: str, runs: list):
    """One line, before any file is written, where the finished runs found (in out/ and the records) are fewer than
    those of the results already in results_dir: a checkout without the records, or an --out of other runs."""
    before, now = read(os.path.join(results_dir, "machine.json")).get("runs_finished", 0), len(finished(runs))
    if now < before:
        raise UserError(f"{shorten(results_dir)} holds the results of {before} finished runs, the run folders and "
                        f"their records only {now}: nothing written (pass --results to write them elsewhere)")


def gather(results_dir: str, lm_plan: list, mt_plan: list, quick: bool, records: Records | None = None):
    """results/*.csv and results/machine.json, from the run folders, or the records of those out/ lacks: all that
    experiments/report.py reads. Nothing is written where it would hold fewer finished runs than results_dir does."""
    if records:
        lm_plan, mt_plan = ([records.or_record(r) for r in plan] for plan in (lm_plan, mt_plan))
    refuse_fewer(results_dir, lm_plan + mt_plan)
    lm = lm_rows(lm_plan)
    for name, columns, rows in [("lm_ptb.csv", LM_COLUMNS, table1_rows(lm)),
                                ("feature_size.csv", FEATURE_COLUMNS, feature_size_rows(lm)),
                                ("attention.csv", ATTENTION_COLUMNS, attention_rows(lm_plan, lm)),
                                ("mt.csv", MT_COLUMNS, mt_rows(mt_plan)),
                                ("mt_pairs.csv", MT_PAIRS_COLUMNS,
                                 mt_pair_rows(mt_plan, os.path.join(results_dir, "mt_pairs.csv"))),
                                ("curves.csv", CURVE_COLUMNS, curve_rows("lm", lm_plan) + curve_rows("mt", mt_plan))]:
        write_csv(os.path.join(results_dir, name), rounded(rows, columns), columns)
    write_json(os.path.join(results_dir, "machine.json"), provenance(lm_plan + mt_plan, lm_plan, quick))
    print(f"wrote {shorten(results_dir)}/lm_ptb.csv, feature_size.csv, attention.csv, mt.csv, mt_pairs.csv, "
          f"curves.csv and machine.json")
