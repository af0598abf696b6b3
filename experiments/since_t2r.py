"""
What the field converts to since T2R, measured on the study's teachers: a decaying state (decay.py), a short
convolution (after_t2r.py's ConvInput), distillation from the teacher's logits (support/distill.py) and the softmax
layer chosen by data (support/choose_layers.py), each added alone to T2R's conversion, then together.

    python -m experiments.since_t2r --jobs 2          # the PTB runs, resumable (Ctrl-C saves; the same command goes on)
    python -m experiments.since_t2r --dry_run         # every run: done, kept (its record in results/runs) or to train
    python -m experiments.since_t2r --stage decode    # each recipe's decoding speed and state size (trainings paused)
    python -m experiments.since_t2r --stage results   # results/since_t2r.csv and results/since_t2r.md, from the records

The teacher is the study's 1x language model trained with seed 1 (experiments/study.py's `--stage teachers`: its
record lm/softmax-random-s1, trained again where its weights are gone); every recipe finetunes it with the study's
conversion recipe (480 steps at 1e-3, T2R's k = 32) and each of SEEDS, and so does the softmax control (the teacher
trained on, unchanged, as long). T2R's seed-1 row is the study's own run (lm/t2r-pretrained-k32-from-s1). A run is
a train_lm.py command with its own out_dir under out/since_t2r, kept in results/runs/since_t2r (experiments/records.py)
and trained by experiments/study.py's runner: skipped when done, resumed when interrupted.
"""

if __package__ in (None, ""):  # run as a file: the project's modules are found from its root, as a module
    raise SystemExit("error: run it from the repository's root as a module: python -m experiments.since_t2r")

import os
import time
from dataclasses import replace

from experiments.probes import MAIN_K
from experiments.records import Records
from experiments.runs import ROOT, Run
from experiments.sizes import LM_SIZES
from support.runtime import Parser, positive_int, run_main

TEACHER_SEED = 1  # the study's teacher of seed 1: its weights are here (seed 0's were not kept)
SEEDS = (1, 2, 3)  # every row's finetuning seeds
# recipe -> the flags it adds to the study's conversion (T2R at k = 32); the order is the page's
RECIPES = {
    "softmax control": {"attn": "softmax"},  # the teacher finetuned on as long: what the conversions aim at
    "t2r": {},
    "t2r+decay": {"decay": True},
    "t2r+conv4": {"short_conv": 4},
    "t2r+distill": {"distill_weight": 0.5},
    "t2r+chosen1": {"keep_softmax": 1},
    "t2r+decay+conv4+distill": {"decay": True, "short_conv": 4, "distill_weight": 0.5},  # all linear
    "t2r+chosen1+decay+conv4+distill": {"keep_softmax": 1, "decay": True, "short_conv": 4, "distill_weight": 0.5},
}
FOLDERS = {"softmax control": "softmax-control", "t2r": "t2r", "t2r+decay": "decay", "t2r+conv4": "conv4",
           "t2r+distill": "distill", "t2r+chosen1": "chosen1", "t2r+decay+conv4+distill": "decay+conv4+distill",
           "t2r+chosen1+decay+conv4+distill": "all4"}


def study_runs(study_out: str, size: dict) -> list:
    """The study's runs this plan reads: the seed-1 teacher and its T2R conversion (experiments/study.py)."""
    from experiments.study import teacher_seed_runs
    return [r for r in teacher_seed_runs(study_out, size) if r.name.endswith(f"s{TEACHER_SEED}")]


def ptb_runs(study_out: str, out: str, size: dict) -> list:
    """Every recipe with every seed, in the order they train: the first seed of every recipe, then the second, ..."""
    teacher, conversion = study_runs(study_out, size)
    runs = []
    for seed in SEEDS:
        for recipe, extra in RECIPES.items():
            if recipe == "t2r" and seed == TEACHER_SEED:
                continue  # the study's own run
            name = f"{FOLDERS[recipe]}-s{seed}"
            flags = {**conversion.flags, **extra, "seed": seed, "out_dir": os.path.join(out, "ptb", name)}
            if recipe == "softmax control":
                flags.pop("feature_size")
            runs.append(Run(name, "train_lm.py", flags, dict(task="ptb", recipe=recipe, seed=seed)))
    return runs


def rows_of(study_out: str, out: str, size: dict) -> list:
    """(run, its records) for every row of the PTB table: the study's T2R from the seed-1 teacher among them."""
    _, conversion = study_runs(study_out, size)
    conversion = replace(conversion, row=dict(task="ptb", recipe="t2r", seed=TEACHER_SEED))
    return [(conversion, "study")] + [(run, "since") for run in ptb_runs(study_out, out, size)]


# -----------------------------------------------------------------------------
# The verdicts (their rules dated in experiments/rules.py, set before the runs they judge)

def near_control(all_linear: list, control: list) -> str:
    """"An all-linear conversion within NEAR_CONTROL of the softmax control's test perplexity": the means of their
    seeds."""
    from experiments.rules import NEAR_CONTROL
    mean = lambda xs: sum(xs) / len(xs)
    return "yes" if mean(all_linear) <= (1 + NEAR_CONTROL) * mean(control) else "**no**"


def part_helps(with_part: list, t2r: list) -> str:
    """"Adding the part lowers T2R's test perplexity": the two-arms rule over the seeds."""
    from experiments.verdicts import two_arms
    return two_arms(with_part, t2r)


def chosen_beats_every_kth(chosen: list, every_kth: list, chosen_layers: set, every_kth_layers: set) -> str:
    """"The layers chosen by data beat every-k-th's": where the data chose the layers every-k-th keeps, the two
    recipes build the same model and there is nothing to judge; otherwise the two-arms rule over the seeds."""
    from experiments.verdicts import two_arms
    if chosen_layers == every_kth_layers:
        return "the same layers"
    return two_arms(chosen, every_kth)


def recalls(recall: float) -> str:
    """"An all-linear k = 32 conversion recalls at least MQAR_RECALL at 64 pairs"."""
    from experiments.rules import MQAR_RECALL
    return "yes" if recall >= MQAR_RECALL else "**no**"


# -----------------------------------------------------------------------------

def main(argv=None):
    from experiments.study import execute
    p = Parser(prog="python -m experiments.since_t2r", description="The conversions since T2R, on the study's teacher.")
    p.add_argument("--stage", default="train", choices=["train", "results"],
                   help="train: the runs (the teacher first, where its weights are gone); results: the CSV and page")
    p.add_argument("--dry_run", action="store_true", help="print the plan and each run's state, run nothing")
    p.add_argument("--jobs", type=positive_int, default=1, help="runs at a time, each with its share of the cores")
    args = p.parse_args(argv)
    study_out, out = os.path.join(ROOT, "out", "study"), os.path.join(ROOT, "out", "since_t2r")
    size = LM_SIZES["full"]
    t0 = time.time()
    if args.stage == "train":
        execute(study_runs(study_out, size), args.dry_run, args.jobs,
                Records(study_out, os.path.join(ROOT, "results", "runs")))
        execute(ptb_runs(study_out, out, size), args.dry_run, args.jobs,
                Records(out, os.path.join(ROOT, "results", "runs", "since_t2r")))
    print(f"since_t2r: {(time.time() - t0) / 60:.1f} minutes this time")


if __name__ == "__main__":
    run_main(main)
