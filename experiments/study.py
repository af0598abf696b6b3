"""
The reproduction study, its plan and its runs: the paper's Table 1, Fig. 4, Figs. 5-6 and Table 2 at CPU scale.

    bash experiments/reproduce.sh                    # everything: the runs, then the CSVs, plots and results/README.md
    python -m experiments.study --stage lm           # only the language-model runs (Table 1, Fig. 4)
    python -m experiments.study --stage teachers     # only the teacher's seeds 1 and 2 and their conversions
    python -m experiments.study --dry_run            # print the plan: every run, its command, done or not
    python -m experiments.study --stage results      # the CSVs and the page again, from out/ or results/runs
    python -m experiments.study --quick              # the whole pipeline at toy sizes (minutes), into out/study-quick

Every run is a plain train_lm.py / train_mt.py command with its own out_dir, followed by its probes
(experiments/probes.py: the attention analysis, a translator's speed), which read its weights
while they are there. A finished run's results are kept in results/runs/ (experiments/records.py), so that a study
continued on a new machine, whose out/ is empty, trains only what is missing. A run with a results.json is
skipped (refused where its args.json differs from the plan's flags), a run with a ckpt.pt but no results.json is
resumed, so an interrupted study (Ctrl-C, or `kill -INT` of this script: each run saves first) continues where it
stopped; a run killed before its first checkpoint starts again. With --jobs 2 two runs share the machine, a
conversion starting once its teacher is trained. Then experiments/gather.py collects each run's results into
results/*.csv and results/machine.json (from its out_dir, or its record where out/ lacks it: in a fresh checkout the
results stage rebuilds the committed files, or refuses in one line to write fewer runs over them), and
experiments/report.py turns those files alone into the tables, plots and claims of results/README.md.

The sizes: about 18 hours on a 2-core CPU, two runs at a time (measured on a 2-core EPYC, 2026-11-24: 1,894
training minutes over the first 44 runs; a 2400-step language model 65-108 minutes, a finetuning 14-29, a translator
56-101, the probes' minutes besides; the two controls since, a 2880-step language model and a translator's
finetuning, add about 3 hours; the teacher trained again with seeds 1 and 2 and each converted, about 3.5 more: 92
training minutes a teacher, 10 a conversion, on a 2-core Xeon, 2026-11-28): it is meant to be stopped and continued,
on this machine or another, results/runs/ carrying the finished runs. At these sizes the LM teacher is measured short
of the convergence rule (below): its plateau is several doublings of compute away.
The claims it tests are orderings and ratios, not the paper's absolute numbers.
"""


if __package__ in (None, ""):  # run as a file: the project's modules are found from its root, as a module
    raise SystemExit("error: run it from the repository's root as a module: python -m experiments.study")

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

from experiments.claims import DOUBLED, LONGER, LONGER_SEEDS, TEACHERS  # the equal-budget control's names and seeds
from experiments.gather import gather
from experiments.probes import FEATURE_SIZES, MAIN_K, add_probes
from experiments.records import UNCHECKED, Records, machine, same_value, weights_of
from experiments.report import write_report
from experiments.runs import ROOT, Run, missing_probes, read_json, shorten, state, trained
from experiments.sizes import LM_LR, LM_SIZES, MT_LR, MT_SIZES
from support.configs import feature_sizes
from support.run_files import earlier_outputs
from support.runtime import Interrupted, Parser, UserError, positive_int, run_main, write_json
from t2r import Config

# -----------------------------------------------------------------------------
# The plan. Language model: Table 1 and Fig. 4, on PTB, at the sizes and budgets of experiments/sizes.py (which
# says why they are what they are).

RFA_K = 2 * MAIN_K  # RFA's k = 32 random projections, each giving a sin and a cos feature, as in the authors' code
SEEDS = (0, 1)  # the + pretrain rows run with each; the others with the first
# The + pretrain rows beyond T2R, ELU and RFA: model name -> the flags that make it (the sizes from LM_SIZES)
CONVERSIONS = {
    "t2r75": lambda size: {"keep_softmax_every": 4},  # the 4th, 8th, ... layer from the top kept softmax
    "t2r75top": lambda size: {"keep_softmax_every": 4, "keep_softmax_from": "top"},  # the top one, the 5th, ...
    "t2r-transfer": lambda size: {"transfer_steps": size["transfer_steps"]},  # attention transfer, then finetuning
    "t2r-window": lambda size: {"window": size["window"]},  # softmax over the last W tokens + linear beyond
    "t2r-transfer-window": lambda size: {"transfer_steps": size["transfer_steps"], "window": size["window"]},
}


def lm_runs(out: str, size: dict) -> list:
    teacher = os.path.join(out, "lm", "softmax-random-s0")
    common = {**size["train"], "eval_interval": size["eval_interval"]}
    pretrain = {**common, **size["model"], "max_steps": size["pretrain_steps"], "lr": LM_LR["pretrain"]}
    finetune = {**common, "init": "pretrained", "pretrained": os.path.join(teacher, "ckpt.pt"),
                "max_steps": size["finetune_steps"], "lr": LM_LR["finetune"]}

    def run(init, attn, k, seed, model=None, extra=None):
        model = model or attn
        name = f"{model}-{init}" + (f"-k{k}" if attn in ("t2r", "rfa") else "") + f"-s{seed}"
        size_flag = {} if k is None else {"feature_size": k}
        flags = {**(pretrain if init == "random" else finetune), "attn": attn, **size_flag, "seed": seed,
                 **(extra or {}), "out_dir": os.path.join(out, "lm", name)}
        teacher = {} if init == "random" else {"teacher": 0}  # the seed of the teacher it converts
        return Run(name, "train_lm.py", flags, dict(model=model, init=init, k=k, seed=seed, **teacher))

    elu_k, _ = feature_sizes(Config(**size["model"], attn="elu"))  # the head size
    runs = [run("random", "softmax", None, 0)]  # the teacher, first
    # Table 1: the + pretrain rows (two seeds each), then the random-initialisation rows at the teacher's budget
    for seed in SEEDS:
        runs += [run("pretrained", "t2r", MAIN_K, seed), run("pretrained", "elu", elu_k, seed),
                 run("pretrained", "rfa", RFA_K, seed)]
        runs += [run("pretrained", "t2r", MAIN_K, seed, model=name, extra=flags(size))
                 for name, flags in CONVERSIONS.items()]
    # a control: the teacher trained on, unchanged, for the finetuning budget (does the converted model gain
    # from finetuning or from the extra steps?)
    runs += [run("pretrained", "softmax", None, seed) for seed in SEEDS]
    runs += [run("random", "t2r", MAIN_K, 0), run("random", "elu", elu_k, 0), run("random", "rfa", RFA_K, 0),
             sru_run(out, pretrain, size)]
    # a control at equal total steps: T2R + pretrain trained for the teacher's steps and the finetuning's, so T2R
    # from scratch gets as many in one run of that length (its own warmup and cosine decay, not a restart); three
    # seeds, so that the gap to T2R + pretrain can be set against the seeds' spread
    runs += doubled_budget(run, size)  # first: the longest runs of the plan
    runs += [run("random", "t2r", MAIN_K, seed, model=LONGER, extra={"max_steps": longer_steps(size)})
             for seed in LONGER_SEEDS]
    # Fig. 4 (and Figs. 5-6): T2R at every feature size, pretrained, with the MLP frozen, and from scratch
    runs += [run("pretrained", "t2r", k, 0) for k in FEATURE_SIZES if k != MAIN_K]
    runs += [run("pretrained", "t2r", k, 0, model="t2r-frozen", extra={"freeze_feature_map": True})
             for k in FEATURE_SIZES]
    runs += [run("random", "t2r", k, 0) for k in FEATURE_SIZES if k != MAIN_K]
    return runs


TEACHER_SEEDS = TEACHERS[1:]  # the 1x teacher trained again: a conversion inherits its teacher's seed, which one
# teacher never samples


def teacher_seed_runs(out: str, size: dict) -> list:
    """The 1x teacher trained again with each of TEACHER_SEEDS and converted to T2R (k = 32) with the same seed, as the
    plan converts seed 0's (t2r-pretrained-k32-s0): with it the conversion arm of the equal-budget comparison, one
    conversion a teacher (experiments/claims.py's conversion_arm). The lm stage trains them after lm_runs; `--stage
    teachers` trains these alone."""
    plan = {run.name: run for run in lm_runs(out, size)}
    teacher, conversion = plan["softmax-random-s0"], plan[f"t2r-pretrained-k{MAIN_K}-s0"]
    runs = []
    for seed in TEACHER_SEEDS:
        name = f"softmax-random-s{seed}"
        again = replace(teacher, name=name, row={**teacher.row, "seed": seed}, probes=[],
                        flags={**teacher.flags, "seed": seed, "out_dir": os.path.join(out, "lm", name)})
        name = f"t2r-pretrained-k{MAIN_K}-from-s{seed}"
        flags = {**conversion.flags, "seed": seed, "pretrained": os.path.join(again.out_dir, "ckpt.pt"),
                 "out_dir": os.path.join(out, "lm", name)}
        runs += [again, replace(conversion, name=name, row={**conversion.row, "seed": seed, "teacher": seed},
                                probes=[], flags=flags)]
    return runs


def longer_steps(size: dict) -> int:
    return size["pretrain_steps"] + size["finetune_steps"]


def doubled_budget(run, size: dict) -> list:
    """The equal-budget comparison again at twice every budget: a teacher trained twice as long, its T2R finetuned
    twice as long, and T2R from scratch for both together. Does the verdict hold as the budget grows?"""
    teacher = run("random", "softmax", None, 0, model=f"softmax-{DOUBLED}",
                  extra={"max_steps": 2 * size["pretrain_steps"]})
    conversion = run("pretrained", "t2r", MAIN_K, 0, model=f"t2r-{DOUBLED}",
                     extra={"pretrained": os.path.join(teacher.out_dir, "ckpt.pt"),
                            "max_steps": 2 * size["finetune_steps"]})
    scratch = run("random", "t2r", MAIN_K, 0, model=f"{LONGER}-{DOUBLED}", extra={"max_steps": 2 * longer_steps(size)})
    return [teacher, scratch, conversion]  # the two long runs first: the conversion waits for its teacher


def sru_run(out: str, pretrain: dict, size: dict) -> Run:
    """SRU++ (Lei, 2021) from scratch at the teacher's depth, width and budget: the RNN one could train instead."""
    transformer_only = ("n_head", "d_ff")  # SRU++ has no heads or feed-forward layers (its width is d_model)
    flags = {k: v for k, v in pretrain.items() if k not in transformer_only}
    name = "sru++-random-s0"
    return Run(name, "train_lm.py", {**flags, "arch": "sru++", "seed": 0, "out_dir": os.path.join(out, "lm", name)},
               dict(model="sru++", init="random", k=None, seed=0))


# -----------------------------------------------------------------------------
# Translation, Table 2: on the offline LibreOffice corpus (the sizes and budgets: experiments/sizes.py).
# RFA at Table 2's 32 (cross) and 4 (causal) random projections: a sin and a cos feature each, as in the authors' code
MT_FEATURES = {"rfa": {"feature_size": 2 * 4, "cross_feature_size": 2 * 32}}


def mt_runs(out: str, size: dict) -> list:
    teacher = os.path.join(out, "mt", "softmax-random-s0")
    common = {**size["train"], "eval_interval": size["eval_interval"], "seed": 0}
    pretrain = {**common, **size["model"], "init": "random", "max_steps": size["pretrain_steps"],
                "warmup_steps": size["warmup_steps"], "lr": MT_LR["pretrain"]}
    finetune = {**common, "init": "pretrained", "pretrained": os.path.join(teacher, "model.pt"),
                "max_steps": size["finetune_steps"], "warmup_steps": size["warmup_steps"], "lr": MT_LR["finetune"]}
    runs = []
    # ("softmax", "pretrained"): the control, the teacher trained on unchanged for the finetuning steps
    for attn, init in (("softmax", "random"), ("t2r", "pretrained"), ("elu", "pretrained"), ("rfa", "pretrained"),
                       ("t2r", "random"), ("softmax", "pretrained")):
        name = f"{attn}-{init}-s0"
        flags = {**(pretrain if init == "random" else finetune), "attn": attn, **MT_FEATURES.get(attn, {}),
                 "out_dir": os.path.join(out, "mt", name)}
        runs.append(Run(name, "train_mt.py", flags, dict(model=attn, init=init)))
    for model in ("t2r-transfer", "t2r-window", "t2r-transfer-window"):  # the conversions since T2R
        name = f"{model}-pretrained-s0"
        flags = {**finetune, "attn": "t2r", **CONVERSIONS[model](size), "out_dir": os.path.join(out, "mt", name)}
        runs.append(Run(name, "train_mt.py", flags, dict(model=model, init="pretrained")))
    # the equal-budget control: T2R from scratch for the teacher's steps and the finetuning's together
    name = f"{LONGER}-random-s0"
    flags = {**pretrain, "attn": "t2r", "max_steps": size["pretrain_steps"] + size["finetune_steps"],
             "out_dir": os.path.join(out, "mt", name)}
    return runs + [Run(name, "train_mt.py", flags, dict(model=LONGER, init="random"))]


# -----------------------------------------------------------------------------
# Running: skip what is done, resume what was interrupted, log each run to <out_dir>/train.log

def command(run: Run) -> list:
    if state(run) == "probe":
        if not os.path.isfile(os.path.join(run.out_dir, "model.pt")):
            raise UserError(f"{run.name} is trained but not probed, and its weights are gone: delete {run.out_dir} "
                            f"to train it again")
        return [sys.executable, *missing_probes(run)[0][1]]
    flags = {**run.flags, **({"resume": True} if state(run) in ("interrupted", "shorter") else {})}
    argv = []
    for name, value in flags.items():
        argv += [f"--{name}"] if value is True else [f"--no-{name}"] if value is False else [f"--{name}", str(value)]
    return [sys.executable, os.path.join(ROOT, run.script), *argv]


def teacher_of(run: Run, runs: list) -> Run | None:
    """The run of the plan that trains this conversion's teacher (its --pretrained), if any."""
    return next((r for r in runs if r.out_dir == os.path.dirname(run.flags.get("pretrained", ""))), None)


def ready(run: Run, runs: list) -> bool:
    """A conversion is ready once the run of the plan that trains its teacher is trained (a probe may follow)."""
    teacher = teacher_of(run, runs)
    return teacher is None or trained(teacher) == "done" or state(run) == "probe"


def converted_from_an_older_teacher(run: Run, runs: list, records: Records | None = None) -> bool:
    """A conversion started before its teacher's last training: the teacher trains on now (the plan gives it more
    steps), or its model.pt is newer than the conversion's last checkpoint, or the conversion's record names
    other teacher weights than the teacher's record (or its retrained/: the same flags, trained again elsewhere)."""
    teacher, checkpoint = teacher_of(run, runs), os.path.join(run.out_dir, "ckpt.pt")
    if teacher is None:
        return False
    if records and records.kept(run) and records.kept(teacher):  # the digests decide
        started_from = records.teacher_digest(run)
        return started_from not in records.digests_of(teacher, os.path.basename(run.flags["pretrained"]))
    if not os.path.isfile(checkpoint):
        return False
    model = run.flags["pretrained"]
    return trained(teacher) != "done" or os.path.getmtime(model) > os.path.getmtime(checkpoint)


def start(run: Run, threads: int):
    """Launch the run's next step (its training, or a probe) in the background with `threads` torch threads,
    logging to its out_dir/train.log. It gets its own session, so a Ctrl-C reaches the study alone, which passes it
    on once (a second one would stop a run without saving)."""
    os.makedirs(run.out_dir, exist_ok=True)
    what = missing_probes(run)[0][0] if state(run) == "probe" else "training"
    left = [n for n in earlier_outputs(run.out_dir) if n.startswith("snapshot_")] if state(run) == "todo" else []
    if left:  # of a start killed (not interrupted: that saves) before its first ckpt.pt: the trainer would refuse them
        for name in left:
            os.remove(os.path.join(run.out_dir, name))
        print(f"{run.name}: removed {len(left)} snapshot_*.pt of a start killed before its first checkpoint",
              flush=True)
    print(f"started {run.name}" + ("" if what == "training" else f": its probe {what}"), flush=True)
    with open(os.path.join(run.out_dir, "train.log"), "a") as log:
        process = subprocess.Popen(command(run), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    return process, what


def finish(run: Run, what: str, returncode: int, seconds: float, threads: int):
    if returncode == 130:  # Ctrl-C sent to the run itself: it saved its checkpoint
        raise Interrupted(f"{run.name} was interrupted and saved its checkpoint: rerun the same command to continue")
    if returncode != 0:
        raise UserError(f"{run.name} failed (exit {returncode}, {what}); see {run.out_dir}/train.log, "
                        f"then rerun this command to continue")
    if what == "training":
        write_json(os.path.join(run.out_dir, "weights.json"), weights_of(run))
        write_json(os.path.join(run.out_dir, "machine.json"),
                   {**machine(), "threads": threads, "wall_seconds": round(seconds, 1)})
        results = read_json(os.path.join(run.out_dir, "results.json"))
        print(f"    {run.name}: {seconds:.0f} s wall | {summary(results)}", flush=True)


def restore(runs: list, records: Records):
    """Bring kept runs back into an empty out/; a kept teacher whose weights a run still to do needs trains again.
    Finished runs whose record is missing or out of date are kept now."""
    for run in runs:
        records.restore(run)
    for run in runs:
        teacher = teacher_of(run, runs)
        if teacher and state(run) != "done" and trained(teacher) == "done" and \
                not os.path.isfile(run.flags["pretrained"]):
            print(f"{teacher.name} is kept without its weights, which {run.name} needs: it trains again", flush=True)
            records.unrestore(teacher)
        if state(run) == "done":  # a no-op where the record is up to date
            records.keep(run)


def refuse_stale(runs: list, records: Records | None):
    stale = [r.out_dir for r in runs if converted_from_an_older_teacher(r, runs, records)]
    if stale:
        raise UserError(f"{', '.join(stale)} converted an earlier model of a teacher trained since (or training "
                        f"on): delete {'them' if stale[1:] else 'it'} (and {'their' if stale[1:] else 'its'} "
                        f"record under {records.root if records else 'results/runs'}) to redo the conversion with "
                        f"the new teacher")



def changed_flags(run: Run) -> list:
    """The plan's flags that run's args.json (its own, or its record's) says it was trained with otherwise: a finished
    run must not stand for a run the plan has changed since. A translator given more steps trains on ("shorter")."""
    saved_path = os.path.join(run.out_dir, "args.json")
    saved = read_json(saved_path) if os.path.isfile(saved_path) else None
    changed = []
    for name, planned in run.flags.items() if saved is not None else ():
        was = saved.get(name)
        trains_on = name == "max_steps" and run.script == "train_mt.py" and isinstance(was, int) and was < planned
        if name not in UNCHECKED and not same_value(was, planned) and not trains_on:
            changed.append(f"--{name} {was} (the plan: {planned})")
    return changed


def refuse_changed(runs: list, records: Records | None):
    changed = [(r, flags) for r in runs if (flags := changed_flags(r))]
    if changed:
        (run, flags), more = changed[0], f" (and {len(changed) - 1} more runs)" if changed[1:] else ""
        raise UserError(f"{run.out_dir}{more} was trained with other flags than the plan's: {', '.join(flags)}; "
                        f"delete it (and its record under {records.root if records else 'results/runs'}) to train "
                        f"it as planned")


def execute(runs: list, dry_run: bool, jobs: int = 1, records: Records | None = None):
    """Train and probe every unfinished run of the plan, `jobs` at a time, each with its share of the CPU threads,
    in the plan's order as far as the teachers allow, and keep each finished run's record. Ctrl-C stops them all;
    each saves its checkpoint first."""
    threads = int(os.environ.get("OMP_NUM_THREADS", 0)) or max(1, (os.cpu_count() or 1) // jobs)
    for run in runs if not dry_run else []:  # one that finished as the study last stopped trained here
        if trained(run) == "done" and not os.path.isfile(os.path.join(run.out_dir, "machine.json")):
            write_json(os.path.join(run.out_dir, "machine.json"), {**machine(), "threads": threads})
    if records and not dry_run:
        restore(runs, records)
    refuse_changed(runs, records)
    refuse_stale(runs, records)
    # a dry run restores nothing: a finished run kept under results/runs shows as kept, and counts as done
    kept = lambda r: dry_run and records is not None and state(r) == "todo" and records.kept(r)
    todo = [r for r in runs if state(r) != "done" and not kept(r)]
    print(f"{len(runs)} runs, {len(runs) - len(todo)} already done")
    for i, run in enumerate(runs, 1):
        print(f"[{i}/{len(runs)}] {run.name}: {'kept' if kept(run) else state(run)} | "
              f"{' '.join(shorten(c) for c in command(run)[1:])}", flush=True)
    # Ctrl-C, or `kill -INT` (a study started with `nohup ... &` has SIGINT ignored: taken back here), is noted and
    # acted on at the loop's next turn, never between a run's start and its entry in `running`: a run started as the
    # signal came would be left running, unsaved, after the study stopped
    interrupted = []
    signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
    running = {}  # Popen -> (run, what it does, start time)
    try:
        while todo and not dry_run or running:
            if interrupted:
                raise Interrupted("study interrupted: every run saved its checkpoint; rerun the same command to "
                                  "continue")
            for run in [r for r in todo if ready(r, runs)][:jobs - len(running)]:
                if interrupted:  # none started after a Ctrl-C
                    break
                process, what = start(run, threads)
                running[process] = (run, what, time.time())
                todo.remove(run)
            if not running:
                raise UserError(f"{todo[0].name} waits for a teacher that is not in the plan")
            time.sleep(0.2)
            for process in [p for p in running if p.poll() is not None]:
                run, what, t0 = running.pop(process)
                finish(run, what, process.returncode, time.time() - t0, threads)
                if state(run) == "probe":  # its next probe, in the same slot
                    process, what = start(run, threads)
                    running[process] = (run, what, time.time())
                elif records:
                    records.keep(run)
                    refuse_stale(runs, records)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C stops the waiting below
        for process in running:  # on Ctrl-C or a failed run: the others save and stop
            process.send_signal(signal.SIGINT)
            process.wait()


def summary(results: dict) -> str:
    if "ppl" in results["valid"]:
        score = f"valid ppl {results['valid']['ppl']:.2f} | test ppl {results['test']['ppl']:.2f}"
    else:
        score = f"valid BLEU {results['valid']['bleu']:.2f} | test BLEU {results['test']['bleu']:.2f}"
    return f"{score} | {results['train_minutes']:.1f} train minutes"


# -----------------------------------------------------------------------------

def main(argv=None):
    p = Parser(prog="study.py", description="Reproduce the T2R paper's findings at CPU scale.")
    p.add_argument("--stage", default="all", choices=["all", "lm", "mt", "results", "teachers"],
                   help="one part of the study, its runs and their probes (all: both parts; results: the CSVs and "
                   "the report, from out/ or the records in results/runs; teachers: only the lm part's 1x teacher "
                   "again with seeds 1 and 2, each converted)")
    p.add_argument("--quick", action="store_true", help="toy sizes, to check the pipeline in minutes (out/study-quick)")
    p.add_argument("--out", default=None, help="where the runs go (default out/study, or out/study-quick)")
    p.add_argument("--results", default=None, help="where the CSVs, plots and README.md go (default results/, "
                   "or out/study-quick/results)")
    p.add_argument("--dry_run", action="store_true", help="print the plan and each run's state, run nothing")
    p.add_argument("--jobs", type=positive_int, default=1, help="runs at a time, each with its share of the cores "
                   "(2 on a 2-core CPU: one thread each, faster in all than one run on two threads)")
    args = p.parse_args(argv)
    # absolute paths: the runs' saved flags (--pretrained) must read the same however the study is started
    out = os.path.abspath(args.out or os.path.join(ROOT, "out", "study-quick" if args.quick else "study"))
    results_dir = os.path.abspath(args.results or (os.path.join(out, "results") if args.quick else
                                                   os.path.join(ROOT, "results")))
    size = "quick" if args.quick else "full"
    lm_plan, mt_plan = lm_runs(out, LM_SIZES[size]), mt_runs(out, MT_SIZES[size])
    add_probes(lm_plan, mt_plan, args.quick)
    teachers = teacher_seed_runs(out, LM_SIZES[size])  # no probes: the equal-budget comparison reads their test ppl
    records = Records(out, os.path.join(results_dir, "runs"))  # what a new machine continues from
    t0 = time.time()
    plans = {"all": lm_plan + teachers + mt_plan, "lm": lm_plan + teachers, "mt": mt_plan, "teachers": teachers}
    if args.stage in plans:
        execute(plans[args.stage], args.dry_run, args.jobs, records)
    if args.stage in ("all", "results") and not args.dry_run:
        gather(results_dir, lm_plan + teachers, mt_plan, args.quick, records)  # out/, or the records of those it lacks
        write_report(results_dir)
    print(f"study: {(time.time() - t0) / 60:.1f} minutes this time")


if __name__ == "__main__":
    run_main(main)
