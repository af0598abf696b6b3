"""
The reproduction study (issue 6): the paper's Table 1, Fig. 4, Figs. 5-6 and Table 2 at CPU scale.

    bash experiments/reproduce.sh                    # everything: train, analyse, write results/ and the plots
    python experiments/study.py --stage lm           # only the language-model runs (Table 1, Fig. 4)
    python experiments/study.py --dry_run            # print the plan: every run, its command, done or not
    python experiments/study.py --quick              # the whole pipeline at toy sizes (minutes), into out/study-quick

Every run is a plain train_lm.py / train_mt.py command with its own out_dir. A run with a results.json is
skipped, a run with a ckpt.pt but no results.json is resumed, so an interrupted study continues where it
stopped. The sizes are chosen so that the whole study fits in about 3 hours on a 2-core CPU (3 h 15 min
measured on a 2-core AMD EPYC, README "Results"); the claims it tests are orderings and ratios, not the
paper's absolute numbers.
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from training import UserError, run_main, write_csv  # noqa: E402

# -----------------------------------------------------------------------------
# The plan. Language model: a 4-layer, 128-wide transformer with 2 heads of 64 dimensions (so ELU's k = 64
# is twice T2R's 32, as 128 against 32 in the paper), trained on PTB. Finetuning gets a quarter of the
# pretraining steps at half the learning rate (the paper: ~98 against ~474 GPU hours, appendix Tables 3-4).

LM_SIZES = dict(full=dict(model=["--n_layer", "4", "--n_head", "2", "--d_model", "128", "--d_ff", "512"],
                          train=["--batch_size", "8", "--block_size", "512", "--dropout", "0.1"],
                          pretrain_steps=500, finetune_steps=125, eval_interval=125),
                quick=dict(model=["--n_layer", "4", "--n_head", "2", "--d_model", "32", "--d_ff", "64"],
                           train=["--batch_size", "2", "--block_size", "64", "--dropout", "0.1",
                                  "--eval_context", "64", "--eval_score", "32", "--eval_windows", "2"],
                           pretrain_steps=4, finetune_steps=2, eval_interval=2))
LM_LR = dict(pretrain=2e-3, finetune=1e-3)
FEATURE_SIZES = (4, 8, 16, 32, 64)
MAIN_K = 32  # T2R's and RFA's k in Table 1
SEEDS = (0, 1)  # the + pretrain rows run with each; the others with the first


@dataclass
class Run:
    name: str  # the out_dir's last component
    script: str  # train_lm.py or train_mt.py
    flags: list = field(default_factory=list)
    row: dict = field(default_factory=dict)  # what the results tables say about this run (model, init, k, seed)


def lm_runs(out: str, size: dict) -> list:
    teacher = os.path.join(out, "lm", "softmax-random-s0")
    common = size["train"] + ["--eval_interval", str(size["eval_interval"])]
    pretrain = common + size["model"] + ["--max_steps", str(size["pretrain_steps"]), "--lr", str(LM_LR["pretrain"])]
    finetune = common + ["--init", "pretrained", "--pretrained", os.path.join(teacher, "ckpt.pt"),
                         "--max_steps", str(size["finetune_steps"]), "--lr", str(LM_LR["finetune"])]

    def scratch(attn, k, seed=0):
        name = f"{attn}-random" + (f"-k{k}" if attn in ("t2r", "rfa") else "") + f"-s{seed}"
        return Run(name, "train_lm.py", pretrain + ["--attn", attn, "--feature_size", str(k), "--seed", str(seed)],
                   dict(model=attn, init="random", k=k, seed=seed))

    def converted(attn, k, seed, model=None, extra=()):
        model = model or attn
        name = f"{model}-pretrained" + (f"-k{k}" if attn in ("t2r", "rfa") else "") + f"-s{seed}"
        size_flags = [] if k is None else ["--feature_size", str(k)]
        return Run(name, "train_lm.py", finetune + ["--attn", attn, *size_flags, "--seed", str(seed), *extra],
                   dict(model=model, init="pretrained", k=k, seed=seed))

    d_head = int(size["model"][5]) // int(size["model"][3])
    runs = [Run("softmax-random-s0", "train_lm.py", pretrain + ["--attn", "softmax", "--seed", "0"],
                dict(model="softmax", init="random", k=None, seed=0))]
    # Table 1: the + pretrain rows (two seeds each), then the random-initialisation rows at the teacher's budget
    for seed in SEEDS:
        runs += [converted("t2r", MAIN_K, seed), converted("elu", d_head, seed), converted("rfa", MAIN_K, seed),
                 converted("t2r", MAIN_K, seed, model="t2r75", extra=("--keep_softmax_every", "4"))]
    # a control the paper does not need (its teacher had converged; ours has not): the teacher trained on,
    # unchanged, for the finetuning budget. Converted models are compared with it as well as with the teacher.
    runs += [converted("softmax", None, seed) for seed in SEEDS]
    runs += [scratch("t2r", MAIN_K), scratch("elu", d_head), scratch("rfa", MAIN_K)]
    # Fig. 4 (and Figs. 5-6): T2R at every feature size, pretrained, with the MLP frozen, and from scratch
    for k in FEATURE_SIZES:
        if k != MAIN_K:
            runs.append(converted("t2r", k, 0))
    for k in FEATURE_SIZES:
        runs.append(converted("t2r", k, 0, model="t2r-frozen", extra=("--freeze_feature_map",)))
    for k in FEATURE_SIZES:
        if k != MAIN_K:
            runs.append(scratch("t2r", k))
    for run in runs:
        run.flags += ["--out_dir", os.path.join(out, "lm", run.name)]
    return runs


# -----------------------------------------------------------------------------
# Translation, Table 2: a 3+3-layer, 128-wide translator with 4 heads (ELU's k = 32 in both attentions),
# on the offline LibreOffice corpus. Finetuning: 3/8 of the steps at 0.4x the learning rate (train_mt.py's
# defaults keep the same ratios; the paper: 20K against 30K updates at 2e-4 against 5e-4).

MT_SIZES = dict(full=dict(model=["--n_layer", "3", "--n_encoder_layer", "3", "--n_head", "4", "--d_model", "128",
                                 "--d_ff", "512"],
                          train=["--max_tokens", "2048"], pretrain_steps=1600, finetune_steps=600, eval_interval=200),
                quick=dict(model=["--n_layer", "2", "--n_encoder_layer", "2", "--n_head", "4", "--d_model", "32",
                                  "--d_ff", "64"],
                           train=["--max_tokens", "512", "--bleu_sentences", "40", "--snapshot_interval", "2",
                                  "--average_last", "2"], pretrain_steps=4, finetune_steps=4, eval_interval=2))
# 800 steps at 1e-3 left the teacher at 2.8 test BLEU (validation loss 4.93, still falling fast): too little to
# compare models with, hence twice the steps at twice the rate.
MT_LR = dict(pretrain=2e-3, finetune=8e-4)
SPEED_BATCH = 16  # Fig. 2: greedy decoding, batch 16
SPEED_PASSES = 3  # over the whole test set; tokens/s is their median, their range the noise


def mt_runs(out: str, size: dict) -> list:
    teacher = os.path.join(out, "mt", "softmax-random-s0")
    common = size["train"] + ["--eval_interval", str(size["eval_interval"]), "--seed", "0"]
    pretrain = common + size["model"] + ["--init", "random", "--max_steps", str(size["pretrain_steps"]),
                                         "--lr", str(MT_LR["pretrain"])]
    finetune = common + ["--init", "pretrained", "--pretrained", os.path.join(teacher, "model.pt"),
                         "--max_steps", str(size["finetune_steps"]), "--lr", str(MT_LR["finetune"])]
    runs = [Run("softmax-random-s0", "train_mt.py", pretrain + ["--attn", "softmax"], dict(model="softmax", init="random")),
            Run("t2r-pretrained-s0", "train_mt.py", finetune + ["--attn", "t2r"], dict(model="t2r", init="pretrained")),
            Run("elu-pretrained-s0", "train_mt.py", finetune + ["--attn", "elu"], dict(model="elu", init="pretrained")),
            Run("t2r-random-s0", "train_mt.py", pretrain + ["--attn", "t2r"], dict(model="t2r", init="random"))]
    for run in runs:
        run.flags += ["--out_dir", os.path.join(out, "mt", run.name)]
    return runs


def measure_speed(runs: list, dry_run: bool):
    """Greedy tokens/s at batch 16 on the test sources, for each finished translator (speed.json)."""
    import train_mt
    from training import get_device
    for run in runs:
        out_dir = out_dir_of(run)
        path = os.path.join(out_dir, "speed.json")
        print(f"speed {run.name}: {'done' if os.path.isfile(path) else 'todo'}", flush=True)
        if dry_run or os.path.isfile(path):
            continue
        args = train_mt.get_args(run.flags + ["--eval_only"])
        model, tokenizer, _ = train_mt.load_final_model(args)
        device = get_device("auto")
        corpus = train_mt.load_corpus(args)
        sentences = [s for s, _ in corpus["test"][: args.bleu_sentences or None]]
        model = train_mt.inference_model(model.to(device))
        # the median of a few passes: one pass of ~15 s on a CPU varies by several percent
        passes = [train_mt.greedy_speed(model, tokenizer, sentences, device, SPEED_BATCH, args.max_len_a,
                                        args.max_len_b) for _ in range(SPEED_PASSES)]
        speed = sorted(passes, key=lambda p: p["tokens_per_s"])[len(passes) // 2]
        rates = [p["tokens_per_s"] for p in passes]
        write_json(path, {**speed, "tokens_per_s_passes": rates, **machine()})
        print(f"    {speed['tokens_per_s']:.0f} tokens/s, the median of {', '.join(f'{r:.0f}' for r in rates)} "
              f"({speed['tokens']} tokens in {speed['seconds']:.1f} s)", flush=True)


# -----------------------------------------------------------------------------
# The attention analysis (Figs. 5 and 6) of the language models, with analyze_attention.py

def attention_checkpoints(runs: list) -> list:
    """(stage, k, run) for every T2R language model the analysis reads."""
    stages = {("t2r", "pretrained"): "finetuned", ("t2r-frozen", "pretrained"): "mlp_frozen",
              ("t2r", "random"): "random_init"}
    return [(stages[(r.row["model"], r.row["init"])], r.row["k"], r) for r in runs
            if (r.row["model"], r.row["init"]) in stages and r.row["seed"] == 0]


def run_attention(out: str, runs: list, quick: bool, dry_run: bool):
    raw = os.path.join(out, "attention", "raw.csv")
    needed = [runs[0]] + [r for _, _, r in attention_checkpoints(runs)]  # the teacher, then the T2R models
    checkpoints = [os.path.join(out_dir_of(r), "ckpt.pt") for r in needed]
    # redone when a model it read has changed since (a rerun, a resumed run)
    stale = os.path.isfile(raw) and any(os.path.getmtime(c) > os.path.getmtime(raw) for c in checkpoints
                                        if os.path.isfile(c))
    print(f"attention analysis: {'todo' if stale or not os.path.isfile(raw) else 'done'}", flush=True)
    if dry_run or (os.path.isfile(raw) and not stale):
        return
    unfinished = [r.name for r in needed if run_state(out_dir_of(r)) != "done"]
    if unfinished:
        raise UserError(f"the attention analysis needs finished runs; not finished: {', '.join(unfinished)}: "
                        f"run --stage lm first")
    windows = ["--windows", "4", "--context", "64"] if quick else ["--windows", "100", "--context", "512"]
    cmd = [sys.executable, os.path.join(ROOT, "analyze_attention.py"), *checkpoints[1:], "--teacher", checkpoints[0],
           "--before", *map(str, FEATURE_SIZES), "--seed", "0", *windows, "--csv", raw]
    os.makedirs(os.path.dirname(raw), exist_ok=True)
    with open(os.path.join(out, "attention", "analysis.log"), "w") as log:
        result = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        raise UserError(f"the attention analysis failed; see {out}/attention/analysis.log")


# -----------------------------------------------------------------------------
# Running: skip what is done, resume what was interrupted, log each run to <out_dir>/train.log

def run_state(out_dir: str) -> str:
    if os.path.isfile(os.path.join(out_dir, "results.json")):
        return "done"
    if os.path.isfile(os.path.join(out_dir, "ckpt.pt")):
        return "interrupted"
    return "todo"


def out_dir_of(run: Run) -> str:
    return run.flags[run.flags.index("--out_dir") + 1]


def command(run: Run) -> list:
    flags = list(run.flags)
    if run_state(out_dir_of(run)) == "interrupted":
        flags.append("--resume")
    return [sys.executable, os.path.join(ROOT, run.script), *flags]


def execute(runs: list, dry_run: bool):
    todo = [r for r in runs if run_state(out_dir_of(r)) != "done"]
    print(f"{len(runs)} runs, {len(runs) - len(todo)} already done")
    for i, run in enumerate(runs, 1):
        out_dir = out_dir_of(run)
        state = run_state(out_dir)
        cmd = command(run)
        print(f"[{i}/{len(runs)}] {run.name}: {state} | {' '.join(shorten(c) for c in cmd[1:])}", flush=True)
        if dry_run or state == "done":
            continue
        os.makedirs(out_dir, exist_ok=True)
        t0 = time.time()
        with open(os.path.join(out_dir, "train.log"), "a") as log:
            result = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        if result.returncode != 0:
            raise UserError(f"{run.name} failed (exit {result.returncode}); see {out_dir}/train.log, "
                            f"then rerun this command to continue")
        write_json(os.path.join(out_dir, "machine.json"), {**machine(), "wall_seconds": round(time.time() - t0, 1)})
        print(f"    {time.time() - t0:.0f} s wall | {summary(read_json(os.path.join(out_dir, 'results.json')))}", flush=True)


def machine() -> dict:
    """Where a run ran: its minutes and tokens/s only compare with runs on the same machine."""
    import platform
    import torch
    cpu = platform.processor() or platform.machine()
    if os.path.isfile("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"{cpu}, {os.cpu_count()} cores"
    return {"device": device, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}


def shorten(path: str) -> str:
    return os.path.relpath(path, ROOT) if path.startswith(ROOT) else path


def summary(results: dict) -> str:
    if "ppl" in results["valid"]:
        score = f"valid ppl {results['valid']['ppl']:.2f} | test ppl {results['test']['ppl']:.2f}"
    else:
        score = f"valid BLEU {results['valid']['bleu']:.2f} | test BLEU {results['test']['bleu']:.2f}"
    return f"{score} | {results['train_minutes']:.1f} train minutes"


# -----------------------------------------------------------------------------
# Results: the CSVs, the plots and results/study.md (tables and the paper's claims against ours)

def write_json(path: str, values: dict):
    with open(path + ".tmp", "w") as f:
        json.dump(values, f, indent=1)
    os.replace(path + ".tmp", path)


def read_json(path: str):
    with open(path) as f:
        return json.load(f)


def rounded(rows: list, columns: list) -> list:
    """The columns of each row, floats to 4 decimals, for the results CSVs."""
    return [{c: f"{r[c]:.4f}" if isinstance(r.get(c), float) else r.get(c) for c in columns} for r in rows]


def finished(runs: list) -> list:
    return [r for r in runs if run_state(out_dir_of(r)) == "done"]


def lm_rows(runs: list) -> list:
    rows = []
    for run in finished(runs):
        r = read_json(os.path.join(out_dir_of(run), "results.json"))
        rows.append({**run.row, "valid_ppl": r["valid"]["ppl"], "test_ppl": r["test"]["ppl"],
                     "train_minutes": r["train_minutes"]})
    return rows


def mt_rows(runs: list) -> list:
    rows = []
    for run in finished(runs):
        out_dir = out_dir_of(run)
        r = read_json(os.path.join(out_dir, "results.json"))
        speed_path = os.path.join(out_dir, "speed.json")
        speed = read_json(speed_path) if os.path.isfile(speed_path) else {}
        passes = speed.get("tokens_per_s_passes", [speed["tokens_per_s"]] if speed else [])
        rows.append({**run.row, "k_cross": r.get("k_cross"), "k_causal": r.get("k_causal"), "bleu": r["test"]["bleu"],
                     "valid_bleu": r["valid"]["bleu"], "tok_bleu": r["test"]["tok_bleu"],
                     "tokens_per_s": speed.get("tokens_per_s"),
                     "speed_low": min(passes, default=None), "speed_high": max(passes, default=None),
                     "train_minutes": r["train_minutes"]})
    return rows


def attention_rows(out: str, runs: list, lm: list) -> list:
    raw = os.path.join(out, "attention", "raw.csv")
    if not os.path.isfile(raw):
        return []
    by_checkpoint = {os.path.join(out_dir_of(r), "ckpt.pt"): (stage, k, r) for stage, k, r in attention_checkpoints(runs)}
    ppl = {(row["model"], row["init"], row["k"], row["seed"]): row["valid_ppl"] for row in lm}
    rows = []
    with open(raw) as f:
        for row in csv.DictReader(f):
            number = lambda name: float(row[name]) if row[name] != "" else None
            entry = dict(distance=number("distance"), entropy=number("entropy"), empty_rows=number("empty_rows"),
                         windows=int(row["windows"]))
            if row["stage"] == "teacher":
                entry.update(stage="teacher", k=None, valid_ppl=ppl.get(("softmax", "random", None, 0)))
            elif row["stage"] == "before finetuning":
                entry.update(stage="before_finetuning", k=int(row["k"]), valid_ppl=None)
            elif row["model"] in by_checkpoint:
                stage, k, run = by_checkpoint[row["model"]]
                entry.update(stage=stage, k=k, valid_ppl=ppl.get((run.row["model"], run.row["init"], k, 0)))
            else:
                raise UserError(f"{raw} names {row['model']}, which is not a run of this study (moved?): delete "
                                f"{raw} and rerun --stage attention")
            rows.append(entry)
    order = ["teacher", "before_finetuning", "finetuned", "mlp_frozen", "random_init"]
    return sorted(rows, key=lambda r: (order.index(r["stage"]), r["k"] or 0))


def half_range(values: list) -> float:
    """The spread we report for two seeds: half the range, not a confidence interval."""
    return (max(values) - min(values)) / 2 if values else 0.0


def mean_spread(values: list) -> str:
    if not values:
        return "-"
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.2f}"
    return f"{mean:.2f} ± {half_range(values):.2f}"


def group(rows: list, **match) -> list:
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def mean_of(rows: list, column: str):
    values = [r[column] for r in rows if r.get(column) is not None]
    return sum(values) / len(values) if values else None


# The paper's numbers (WikiText-103 perplexity, Table 1; WMT14 EN-DE BLEU, Table 2), shown beside ours.
PAPER_LM = {("elu", "random"): (22.0, 22.8), ("rfa", "random"): (20.4, 21.3), ("t2r", "random"): (20.1, 20.8),
            ("elu", "pretrained"): (21.5, 22.2), ("rfa", "pretrained"): (20.8, 21.6), ("t2r", "pretrained"): (19.0, 19.6),
            ("t2r75", "pretrained"): (17.9, 18.5), ("softmax", "random"): (17.9, 18.5)}
PAPER_MT = {("softmax", "random"): 28.9, ("t2r", "pretrained"): 28.7, ("t2r", "random"): 27.5, ("elu", "pretrained"): 28.4}
NAMES = {"softmax": "Transformer (softmax, the teacher)", "elu": "ELU", "rfa": "RFA", "t2r": "T2R", "t2r75": "T2R 75%"}
COMPARABLE_BLEU = 1.0  # "similar BLEU": within this many points


def lm_table(lm: list) -> list:
    lines = ["| model | k | seeds | valid ppl | test ppl | train minutes | paper valid / test (WT103) |",
             "|---|---|---|---|---|---|---|"]
    order = [("elu", "random"), ("rfa", "random"), ("t2r", "random"), ("elu", "pretrained"), ("rfa", "pretrained"),
             ("t2r", "pretrained"), ("t2r75", "pretrained"), ("softmax", "random"), ("softmax", "pretrained")]
    for model, init in order:
        rows = table1_rows(lm, model, init)
        if not rows:
            continue
        name = NAMES[model] + ("" if model == "softmax" else (" + pretrain" if init == "pretrained" else " + random init"))
        if (model, init) == ("softmax", "pretrained"):
            name = "Transformer trained on for the finetuning steps (control)"
        paper = PAPER_LM.get((model, init))
        lines.append(f"| {name} | {rows[0]['k'] or '-'} | {len(rows)} | {mean_spread([r['valid_ppl'] for r in rows])} | "
                     f"{mean_spread([r['test_ppl'] for r in rows])} | {mean_spread([r['train_minutes'] for r in rows])} | "
                     f"{f'{paper[0]} / {paper[1]}' if paper else 'not in the paper'} |")
    return lines


def table1_rows(lm: list, model: str, init: str) -> list:
    return [r for r in group(lm, model=model, init=init) if r["k"] in (None, MAIN_K) or model == "elu"]


def verdict(held: bool) -> str:
    return "yes" if held else "**no**"


def lm_claims(lm: list) -> list:
    """(claim, the paper's numbers, ours, verdict): yes, **no**, within noise (the ordering holds but the
    means are closer than the seeds' spreads), or n/a."""
    rows = lambda model, init: table1_rows(lm, model, init)
    test = lambda model, init: mean_of(rows(model, init), "test_ppl")
    minutes = lambda model, init: mean_of(rows(model, init), "train_minutes")
    claims = []
    t2r, elu, rfa = test("t2r", "pretrained"), test("elu", "pretrained"), test("rfa", "pretrained")
    if None not in (t2r, elu, rfa):
        spread = lambda model: half_range([r["test_ppl"] for r in rows(model, "pretrained")])
        margin = lambda other: test(other, "pretrained") - t2r - spread(other) - spread("t2r")
        held = "**no**" if t2r >= min(elu, rfa) else ("yes" if min(margin("elu"), margin("rfa")) > 0 else "within noise")
        claims.append(("T2R + pretrain beats ELU + pretrain and RFA + pretrain (test ppl, mean of the seeds)",
                       "19.6 vs 22.2 and 21.6", f"{t2r:.2f} vs {elu:.2f} and {rfa:.2f}", held))
    gains = {m: (test(m, "random"), test(m, "pretrained")) for m in ("t2r", "elu", "rfa")}
    if all(None not in g for g in gains.values()):
        gain = {m: g[0] - g[1] for m, g in gains.items()}
        claims.append(("pretraining helps T2R: converted and finetuned (a quarter of the steps) it beats T2R trained "
                       "from scratch with the teacher's budget, and gains more than ELU and RFA do (test ppl)",
                       "T2R 20.8 -> 19.6; ELU 22.8 -> 22.2; RFA 21.3 -> 21.6",
                       "; ".join(f"{NAMES[m]} {gains[m][0]:.2f} -> {gains[m][1]:.2f}" for m in ("t2r", "elu", "rfa")),
                       verdict(gain["t2r"] > 0 and gain["t2r"] > gain["elu"] and gain["t2r"] > gain["rfa"])))
    if None not in (test("t2r", "random"), t2r, minutes("t2r", "random"), minutes("t2r", "pretrained")):
        ratio = minutes("t2r", "random") / minutes("t2r", "pretrained")
        claims.append(("conversion reaches (at least) the from-scratch perplexity in a fraction of the time "
                       "(the fraction is set by the plan; the verdict is on the perplexity)",
                       "98 vs 474 GPU hours (~5x), 19.6 vs 20.8",
                       f"{minutes('t2r', 'pretrained'):.1f} vs {minutes('t2r', 'random'):.1f} minutes ({ratio:.1f}x), "
                       f"{t2r:.2f} vs {test('t2r', 'random'):.2f}", verdict(t2r <= test("t2r", "random"))))
    # the softmax model to compare with: the teacher trained on for the same steps (the control), else the teacher
    control = test("softmax", "pretrained")
    soft, soft_name = (control, "the softmax control") if control is not None else (test("softmax", "random"), "the teacher")
    if None not in (soft, t2r):
        claims.append((f"a gap remains between T2R + pretrain and the softmax model ({soft_name}, test ppl)",
                       "19.6 vs 18.5", f"{t2r:.2f} vs {soft:.2f}", verdict(t2r > soft)))
    hybrid = test("t2r75", "pretrained")
    if None not in (soft, hybrid, t2r):
        if t2r <= soft:
            ours, held = f"T2R {t2r:.2f} is not behind {soft_name}'s {soft:.2f}: no gap to close", "n/a"
        else:
            closed = (t2r - hybrid) / (t2r - soft)
            ours, held = f"{t2r:.2f} -> {hybrid:.2f}, {soft_name} {soft:.2f}: {100 * closed:.0f}% of the gap closed", \
                verdict(closed > 0.5)
        claims.append((f"the 75% hybrid closes most of the gap to the softmax model ({soft_name}, test ppl)",
                       "19.6 -> 18.5, softmax 18.5 (all of it)", ours, held))
    return claims


def feature_claims(fs: list, att: list) -> list:
    claims = []
    pre = {r["k"]: r["valid_ppl"] for r in group(fs, variant="pretrained")}
    rnd = {r["k"]: r["valid_ppl"] for r in group(fs, variant="random")}
    ks = sorted(set(pre) & set(rnd))
    if len(ks) >= 2:
        gaps = {k: rnd[k] - pre[k] for k in ks}
        claims.append(("Fig. 4: pretraining beats random init at every k, most at small k",
                       "pretrain below random at every k; the gap grows as k shrinks",
                       ", ".join(f"k={k}: {gaps[k]:+.1f}" for k in ks) + " ppl (random - pretrain)",
                       verdict(all(g > 0 for g in gaps.values()) and gaps[ks[0]] > gaps[ks[-1]])))
    by = lambda stage, col: {r["k"]: r[col] for r in group(att, stage=stage) if r[col] is not None}
    before, tuned, frozen = by("before_finetuning", "distance"), by("finetuned", "distance"), by("mlp_frozen", "distance")
    ks = sorted(set(before) & set(tuned) & set(frozen))
    if ks:
        claims.append(("Fig. 5: finetuning makes the attention much closer to the teacher's",
                       "distance after finetuning below before, at every k",
                       ", ".join(f"k={k}: {before[k]:.3f} -> {tuned[k]:.3f}" for k in ks), verdict(all(tuned[k] < before[k] for k in ks))))
        claims.append(("Fig. 5: the distance shrinks as k grows (largest k against smallest)", "decreasing in k",
                       ", ".join(f"{tuned[k]:.3f}" for k in ks) + f" for k = {', '.join(map(str, ks))}",
                       verdict(tuned[ks[-1]] < tuned[ks[0]])))
        claims.append(("Fig. 5: with the MLP frozen the distance is larger", "frozen above full finetuning at every k",
                       ", ".join(f"k={k}: {frozen[k]:.3f} vs {tuned[k]:.3f}" for k in ks), verdict(all(frozen[k] > tuned[k] for k in ks))))
    ent_tuned, ent_rand = by("finetuned", "entropy"), by("random_init", "entropy")
    ks = sorted(set(ent_tuned) & set(ent_rand))
    if ks:
        claims.append(("Fig. 6: pretraining gives peakier (lower-entropy) attention", "pretrain below random at every k",
                       ", ".join(f"k={k}: {ent_tuned[k]:.2f} vs {ent_rand[k]:.2f}" for k in ks),
                       verdict(all(ent_tuned[k] < ent_rand[k] for k in ks))))
        claims.append(("Fig. 6: entropy falls as k grows (largest k against smallest)", "decreasing in k (pretrain and random)",
                       f"pretrain {ent_tuned[ks[0]]:.2f} -> {ent_tuned[ks[-1]]:.2f}, random {ent_rand[ks[0]]:.2f} -> "
                       f"{ent_rand[ks[-1]]:.2f} (k={ks[0]} -> {ks[-1]})",
                       verdict(ent_tuned[ks[-1]] < ent_tuned[ks[0]] and ent_rand[ks[-1]] < ent_rand[ks[0]])))
    pairs = [(r["entropy"], r["valid_ppl"]) for r in att if r["stage"] in ("finetuned", "random_init")
             and r["entropy"] is not None and r["valid_ppl"] is not None]
    if len(pairs) >= 3:
        r = pearson(*zip(*pairs))
        claims.append(("Fig. 6: entropy correlates with validation perplexity", "strong correlation",
                       f"Pearson r = {r:.2f} over {len(pairs)} T2R models", verdict(r > 0.7)))
    return claims


def pearson(xs, ys) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    return sxy / (sxx * syy) ** 0.5 if sxx and syy else float("nan")


def mt_claims(mt: list) -> list:
    get = lambda model, init: (group(mt, model=model, init=init) or [None])[0]
    soft, t2r, t2r_rand, elu = get("softmax", "random"), get("t2r", "pretrained"), get("t2r", "random"), get("elu", "pretrained")
    claims = []
    if soft and t2r:
        claims.append(("T2R + pretrain reaches the transformer's BLEU (within 1 point; ours sacreBLEU, the paper's "
                       "tokenized BLEU)", "28.7 vs 28.9", f"{t2r['bleu']:.2f} vs {soft['bleu']:.2f}",
                       verdict(soft["bleu"] - t2r["bleu"] <= COMPARABLE_BLEU)))
    if t2r and t2r_rand:
        claims.append(("T2R benefits from pretraining (test BLEU)", "28.7 vs 27.5 (random init)",
                       f"{t2r['bleu']:.2f} vs {t2r_rand['bleu']:.2f}", verdict(t2r["bleu"] > t2r_rand["bleu"])))
    if t2r and elu:
        claims.append(("ELU + pretrain is comparable to T2R + pretrain (within 1 BLEU)", "28.4 vs 28.7",
                       f"{elu['bleu']:.2f} vs {t2r['bleu']:.2f}", verdict(abs(elu["bleu"] - t2r["bleu"]) <= COMPARABLE_BLEU)))
    if t2r and elu and soft and None not in (t2r["tokens_per_s"], elu["tokens_per_s"], soft["tokens_per_s"]):
        faster = t2r["tokens_per_s"] > elu["tokens_per_s"] and t2r["tokens_per_s"] > soft["tokens_per_s"]
        # the slowest T2R pass against the fastest of each other model: does the ordering survive the noise?
        clear = t2r.get("speed_low", t2r["tokens_per_s"]) > max(r.get("speed_high", r["tokens_per_s"]) for r in (elu, soft))
        claims.append(("T2R decodes faster than ELU (smaller k) and than the transformer: greedy, batch 16, on the "
                       "test sentences (short: the paper's gap over softmax grows with length, Fig. 2)",
                       "15%+ over ELU; over softmax from short lengths on",
                       f"{t2r['tokens_per_s']:.0f} vs {elu['tokens_per_s']:.0f} (ELU) and {soft['tokens_per_s']:.0f} "
                       f"(softmax) tokens/s, medians of {SPEED_PASSES} passes",
                       "**no**" if not faster else ("yes" if clear else "within noise")))
    return claims


def claims_table(claims: list) -> list:
    lines = ["| claim | paper | ours | held |", "|---|---|---|---|"]
    lines += [f"| {c} | {paper} | {ours} | {held} |" for c, paper, ours, held in claims]
    return lines


def feature_size_rows(lm: list) -> list:
    names = {("t2r", "pretrained"): "pretrained", ("t2r-frozen", "pretrained"): "pretrained_mlp_frozen",
             ("t2r", "random"): "random"}
    rows = [{**r, "variant": names[(r["model"], r["init"])], "model": r["model"].replace("-frozen", "_mlp_frozen")}
            for r in lm if (r["model"], r["init"]) in names and r["seed"] == 0]
    return sorted(rows, key=lambda r: (r["variant"], r["k"]))


def plot_feature_size(fs: list, path: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for variant, label, marker in (("pretrained", "T2R + pretrain", "o"), ("random", "T2R + random init", "s"),
                                   ("pretrained_mlp_frozen", "T2R + pretrain, MLP frozen", "^")):
        rows = group(fs, variant=variant)
        if rows:
            ax.plot([r["k"] for r in rows], [r["valid_ppl"] for r in rows], marker=marker, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(FEATURE_SIZES, [str(k) for k in FEATURE_SIZES])
    ax.set_xlabel("feature size k")
    ax.set_ylabel("PTB validation perplexity")
    ax.set_title("Fig. 4 at CPU scale")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_attention(att: list, path: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
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
        ax.set_xscale("log", base=2)
        ax.set_xticks(FEATURE_SIZES, [str(k) for k in FEATURE_SIZES])
        ax.set_xlabel("feature size k")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title} at CPU scale")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def feature_table(fs: list, att: list) -> list:
    lines = ["| k | valid ppl, pretrain | valid ppl, random init | valid ppl, MLP frozen | distance before finetuning | "
             "distance finetuned | distance MLP frozen | entropy finetuned | entropy random init | entropy MLP frozen |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    cell = lambda rows, col: f"{rows[0][col]:.2f}" if rows and rows[0].get(col) is not None else "-"
    cell3 = lambda rows, col: f"{rows[0][col]:.3f}" if rows and rows[0].get(col) is not None else "-"
    for k in FEATURE_SIZES:
        lines.append(f"| {k} | {cell(group(fs, variant='pretrained', k=k), 'valid_ppl')} | "
                     f"{cell(group(fs, variant='random', k=k), 'valid_ppl')} | "
                     f"{cell(group(fs, variant='pretrained_mlp_frozen', k=k), 'valid_ppl')} | "
                     f"{cell3(group(att, stage='before_finetuning', k=k), 'distance')} | "
                     f"{cell3(group(att, stage='finetuned', k=k), 'distance')} | "
                     f"{cell3(group(att, stage='mlp_frozen', k=k), 'distance')} | "
                     f"{cell(group(att, stage='finetuned', k=k), 'entropy')} | "
                     f"{cell(group(att, stage='random_init', k=k), 'entropy')} | "
                     f"{cell(group(att, stage='mlp_frozen', k=k), 'entropy')} |")
    return lines


def teacher_entropy(att: list) -> list:
    """The softmax teacher's entropy, the reference for the T2R columns (it has no distance to itself)."""
    teacher = group(att, stage="teacher")
    if not teacher:
        return []
    return [f"Entropy in nats; the softmax teacher's: {teacher[0]['entropy']:.2f}. Distance: to the teacher's "
            f"distribution of the same window, layer and head.", ""]


def mt_table(mt: list) -> list:
    lines = ["| model | k cross | k causal | test BLEU | valid BLEU | test tok. BLEU | greedy tokens/s, batch 16 (range) | "
             "train minutes | paper BLEU (WMT14 EN-DE) |", "|---|---|---|---|---|---|---|---|---|"]
    for model, init in (("softmax", "random"), ("t2r", "pretrained"), ("t2r", "random"), ("elu", "pretrained")):
        for r in group(mt, model=model, init=init):
            name = NAMES[model] + ("" if model == "softmax" else (" + pretrain" if init == "pretrained" else " + random init"))
            speed = "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:.0f}"
            if r.get("speed_low") is not None and r["speed_low"] != r["speed_high"]:
                speed += f" ({r['speed_low']:.0f}-{r['speed_high']:.0f})"
            lines.append(f"| {name} | {r['k_cross'] or '-'} | {r['k_causal'] or '-'} | {r['bleu']:.2f} | {r['valid_bleu']:.2f} | "
                         f"{r['tok_bleu']:.2f} | {speed} | {r['train_minutes']:.1f} | {PAPER_MT[(model, init)]} |")
    return lines


def write_results(out: str, results_dir: str, lm_plan: list, mt_plan: list):
    lm = lm_rows(lm_plan)
    fs = feature_size_rows(lm)
    att = attention_rows(out, lm_plan, lm)
    mt = mt_rows(mt_plan)
    table1 = [r for r in lm if r["model"] in ("softmax", "elu", "rfa", "t2r", "t2r75")
              and (r["k"] in (None, MAIN_K) or r["model"] == "elu")]
    for name, columns, rows in [
            ("lm_ptb.csv", ["model", "init", "k", "seed", "valid_ppl", "test_ppl", "train_minutes"], table1),
            ("feature_size.csv", ["model", "init", "k", "seed", "valid_ppl", "test_ppl", "train_minutes"], fs),
            ("attention.csv", ["stage", "k", "distance", "entropy", "empty_rows", "valid_ppl", "windows"], att),
            ("mt.csv", ["model", "init", "k_cross", "k_causal", "bleu", "tokens_per_s"], mt)]:
        write_csv(os.path.join(results_dir, name), rounded(rows, columns), columns)
    if fs:
        plot_feature_size(fs, os.path.join(results_dir, "feature_size.png"))
    if att:
        plot_attention(att, os.path.join(results_dir, "attention.png"))
    claims = lm_claims(lm) + feature_claims(fs, att) + mt_claims(mt)
    machines = {}
    for run in finished(lm_plan) + finished(mt_plan):
        path = os.path.join(out_dir_of(run), "machine.json")
        m = read_json(path) if os.path.isfile(path) else {}
        where = (f"{m['device']}, {m['threads']} threads, torch {m['torch']}, {m['date']}" if m else "not recorded")
        machines.setdefault(where, []).append(run.name if run.script == "train_lm.py" else f"mt/{run.name}")
    done, total = len(finished(lm_plan)) + len(finished(mt_plan)), len(lm_plan) + len(mt_plan)
    attention_done = os.path.isfile(os.path.join(out, "attention", "raw.csv"))
    banner = [] if done == total and attention_done else [
        f"**Partial: {done} of {total} runs finished{'' if attention_done else ', attention analysis not run'}. "
        f"Missing rows are runs not yet made; a verdict can change when they are.**", ""]
    lines = ["<!-- written by experiments/study.py from the CSVs beside it; do not edit -->", *banner,
             "### Language modelling (Table 1, PTB)", "", *lm_table(lm), "",
             "With two seeds: mean ± half the range. Train minutes of a + pretrain row: the finetuning only.", "",
             "### Feature size and attention (Figs. 4-6, PTB validation)", "", *feature_table(fs, att), "",
             *teacher_entropy(att),
             "### Translation (Table 2, LibreOffice help en-de)", "", *mt_table(mt), "",
             "### The paper's claims and ours", "", *claims_table(claims), "",
             "Where the runs ran (minutes and tokens/s compare only within one machine):", "",
             *[f"- {where}: {len(names)} runs" for where, names in machines.items()], ""]
    with open(os.path.join(results_dir, "study.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))
    print(f"wrote {results_dir}/lm_ptb.csv, feature_size.csv, attention.csv, mt.csv, study.md and the plots")


# -----------------------------------------------------------------------------

def main(argv=None):
    p = argparse.ArgumentParser(description="Reproduce the T2R paper's findings at CPU scale.")
    p.add_argument("--stage", default="all", choices=["all", "lm", "attention", "mt", "results"],
                   help="one part of the study (all: every part, in this order)")
    p.add_argument("--quick", action="store_true", help="toy sizes, to check the pipeline in minutes (out/study-quick)")
    p.add_argument("--out", default=None, help="where the runs go (default out/study, or out/study-quick)")
    p.add_argument("--results", default=None, help="where the CSVs, plots and study.md go (default results/, "
                   "or out/study-quick/results)")
    p.add_argument("--dry_run", action="store_true", help="print the plan and each run's state, run nothing")
    args = p.parse_args(argv)
    # absolute paths: the runs' saved flags (--pretrained) must read the same however the study is started
    out = os.path.abspath(args.out or os.path.join(ROOT, "out", "study-quick" if args.quick else "study"))
    results_dir = os.path.abspath(args.results or (os.path.join(out, "results") if args.quick else
                                                   os.path.join(ROOT, "results")))
    size = "quick" if args.quick else "full"
    lm_plan, mt_plan = lm_runs(out, LM_SIZES[size]), mt_runs(out, MT_SIZES[size])
    t0 = time.time()
    if args.stage in ("all", "lm"):
        execute(lm_plan, args.dry_run)
    if args.stage in ("all", "attention"):
        run_attention(out, lm_plan, args.quick, args.dry_run)
    if args.stage in ("all", "mt"):
        execute(mt_plan, args.dry_run)
        measure_speed(mt_plan, args.dry_run)
    if args.stage in ("all", "results") and not args.dry_run:
        write_results(out, results_dir, lm_plan, mt_plan)
    print(f"study: {(time.time() - t0) / 60:.1f} minutes this time")


if __name__ == "__main__":
    run_main(main)
