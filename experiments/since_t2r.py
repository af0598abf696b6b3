"""
What the field converts to since T2R, measured on the study's teachers: a decaying state (decay.py), a short
convolution (after_t2r.py's ConvInput), distillation from the teacher's logits (support/distill.py) and the softmax
layer chosen by data (support/choose_layers.py), each added alone to T2R's conversion, then together.

    python -m experiments.since_t2r --jobs 2          # the PTB runs, resumable (Ctrl-C saves; the same command goes on)
    python -m experiments.since_t2r --dry_run         # every run: done, kept (its record in results/runs) or to train
    python -m experiments.since_t2r --stage mt        # the translator's teacher again, then each recipe (--jobs 2)
    python -m experiments.since_t2r --stage mqar      # the MQAR teacher again, then each recipe (--only REGEX: some)
    python -m experiments.since_t2r --stage hf        # the hf: recipe's Llama teacher (where missing), its conversions
    python -m experiments.since_t2r --stage decode    # each recipe's decoding speed and state size (trainings paused;
                                                      # --only mt: one task's rows)
    python -m experiments.since_t2r --stage results   # results/since_t2r.csv and results/since_t2r.md, from the records

The teacher is the study's 1x language model trained with seed 1 (experiments/study.py's `--stage teachers`: its
record lm/softmax-random-s1, trained again where its weights are gone); every recipe finetunes it with the study's
conversion recipe (480 steps at 1e-3, T2R's k = 32) with each of its SEEDS, and so does the softmax control (the
teacher trained on, unchanged, as long). T2R's seed-1 row is the study's own run (lm/t2r-pretrained-k32-from-s1). A
run is a train_lm.py command with its own out_dir under out/since_t2r, kept in results/runs/since_t2r
(experiments/records.py) and trained by experiments/study.py's runner: skipped when done, resumed when interrupted.
"""

if __package__ in (None, ""):  # run as a file: the project's modules are found from its root, as a module
    raise SystemExit("error: run it from the repository's root as a module: python -m experiments.since_t2r")

import os
import re
import statistics
import time
from dataclasses import replace

from experiments.decoding import (DECODE_PASSES, DECODE_PROMPT, DECODE_TOKENS, MT_STATE_TOKENS, measure_decoding,
                                  measure_translations)
from experiments.probes import MAIN_K, SPEED_PASSES
from experiments.records import Records
from experiments.runs import ROOT, Run, read_json, shorten
from experiments.sizes import LM_SIZES, MQAR_SIZES, MT_LR, MT_SIZES
from support.runtime import Parser, UserError, pattern, positive_int, run_main

TEACHER_SEED = 1  # the study's teacher of seed 1: its weights are here (seed 0's were not kept)
# Each recipe's finetuning seeds: SEED_RULE (3) where two rows differ by less than twice their spread (seeds_wanted,
# which the page applies to the finished runs); two at first, then a third where the rule asked: T2R and the
# convolution (0.7 apart after two), the decaying state, its all-linear combination and all four (within 1.1)
SEEDS = {"softmax control": (1, 2), "t2r": (1, 2, 3), "t2r+decay": (1, 2, 3), "t2r+conv4": (1, 2, 3),
         "t2r+distill": (1, 2), "t2r+chosen1": (1, 2), "t2r+decay+conv4+distill": (1, 2, 3),
         "t2r+chosen1+decay+conv4+distill": (1, 2, 3)}
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
    for seed in sorted({seed for seeds in SEEDS.values() for seed in seeds}):
        for recipe, extra in ((r, RECIPES[r]) for r in RECIPES if seed in SEEDS[r]):
            if recipe == "t2r" and seed == TEACHER_SEED:
                continue  # the study's own run
            name = f"{FOLDERS[recipe]}-s{seed}"
            flags = {**conversion.flags, **extra, "seed": seed, "out_dir": os.path.join(out, "ptb", name)}
            if recipe == "softmax control":
                flags.pop("feature_size")
            runs.append(Run(name, "train_lm.py", flags, dict(task="ptb", recipe=recipe, seed=seed)))
    return runs


# MQAR (experiments/mqar.py): the same recipes converting its softmax teacher (k = 32), scored at 8 and 64 pairs; one
# layer of its two kept softmax by data, or the paper's every-k-th at its one layer of two (every 2nd: the bottom one)
MQAR_RECIPES = {
    "softmax control": ("--attn", "softmax"),
    "t2r": (),
    "t2r+decay": ("--decay",),
    "t2r+conv4": ("--short_conv", 4),
    "t2r+distill": ("--distill_weight", 0.5),
    "t2r+chosen1": ("--keep_softmax", 1),
    "t2r+every2nd": ("--keep_softmax_every", 2),
    "t2r+decay+conv4+distill": ("--decay", "--short_conv", 4, "--distill_weight", 0.5),
    "t2r+chosen1+decay+conv4+distill": ("--keep_softmax", 1, "--decay", "--short_conv", 4, "--distill_weight", 0.5),
}
MQAR_PAIRS = (8, 64)
# More seeds (train_lm.py's --seed; 1337, its default, is every run's first) where the seed rule asks (seeds_wanted):
# first for the layer chosen by data against every 2nd (0.22 apart at 64 pairs after one seed each) and the two best
# all-linear rows (0.02 apart), then for the rows within twice the spread those seeds measured
MQAR_SEEDS = {recipe: (1337, 1, 2) for recipe in ("t2r+chosen1", "t2r+every2nd", "t2r+conv4", "t2r+decay+conv4+distill",
                                                  "softmax control", "t2r", "t2r+decay", "t2r+distill",
                                                  "t2r+chosen1+decay+conv4+distill")}


# Longer finetuning, one seed, after the rule's runs: whether the all-linear recall at 64 pairs is the parts' limit or
# the budget's (T2R alone, and the best all-linear recipe, with MQAR_LONGER times the steps)
MQAR_LONGER = 4
LONGER = ("t2r", "t2r+decay+conv4+distill")


# Its first seed recalled 0.991 at 64 pairs where the rule's budget gave 0.543: rule since-mqar-recall-longer, set then
# and before these seeds ran, judges the recipe finetuned that long on the mean of three seeds
LONGER_SEEDS = {"t2r+decay+conv4+distill": (1337, 1, 2)}
LONGER_JUDGED = "t2r+decay+conv4+distill"


def longer_name(recipe: str) -> str:  # the row of a LONGER run: shown apart from the table and the seed rule
    return f"{recipe}, {MQAR_LONGER * MQAR_SIZES['full']['finetune_steps']} steps"


LONGER_ROWS = {longer_name(recipe) for recipe in LONGER}  # the rows of the LONGER runs


def mqar_runs() -> list:
    from experiments import mqar
    t2r = ("--attn", "t2r", "--feature_size", MAIN_K)
    runs = []
    for recipe, parts in MQAR_RECIPES.items():
        for seed in MQAR_SEEDS.get(recipe, (1337,)):
            name = FOLDERS.get(recipe, recipe.replace('t2r+', '')) + ("" if seed == 1337 else f"-seed{seed}")
            runs.append(mqar.Run(name, attn="t2r", k=MAIN_K, converted=True, model=recipe,
                                 parts=(parts if recipe == "softmax control" else t2r + parts) +
                                 (() if seed == 1337 else ("--seed", seed))))
    steps = MQAR_LONGER * MQAR_SIZES["full"]["finetune_steps"]
    for recipe in LONGER:
        for seed in LONGER_SEEDS.get(recipe, (1337,)):
            runs.append(mqar.Run(f"{FOLDERS[recipe]}-{steps}steps" + ("" if seed == 1337 else f"-seed{seed}"),
                                 attn="t2r", k=MAIN_K, converted=True, model=longer_name(recipe), steps=steps,
                                 parts=t2r + MQAR_RECIPES[recipe] + (() if seed == 1337 else ("--seed", seed))))
    return runs


def train_mqar(out: str, only: str = ""):
    """The MQAR teacher, then each recipe, trained (or read back from its record). The teacher is experiments/mqar.py's
    softmax run trained again here with its flags (its weights were not kept): the same machine and thread count give
    the same weights, which its record's recall checks (results/runs/mqar/softmax against since_t2r/mqar/softmax)."""
    from experiments import mqar
    size, records = MQAR_SIZES["full"], os.path.join(ROOT, "results", "runs", "since_t2r", "mqar")
    for run in [mqar.Run("softmax")] + [r for r in mqar_runs() if re.search(only, r.model)]:
        print(f"--- mqar {run.name}", flush=True)
        mqar.train_run(run, size, os.path.join(out, "mqar"), records)


# The hf: recipe's Llama (experiments/hf_recipe.py's teacher, trained with transformers' own classes and saved with
# save_pretrained): HF_RECIPE (attention transfer, then 600 steps at 1e-3) with each part, one seed; the control
# trains the teacher on as long, softmax
HF_RECIPES = {"softmax control": ("--attn", "softmax"), **{recipe: tuple(
    part for name, value in RECIPES[recipe].items() for part in (f"--{name}",) + (() if value is True else (value,)))
    for recipe in RECIPES if recipe != "softmax control"}}
HF_FAMILY = "llama"
# train_lm.py's HF_RECIPE follows these runs: it becomes the recipe of the lowest test perplexity that leaves
# every layer linear, but where a recipe with fewer parts is within HF_NEAR of it, that one (one seed each: a
# difference that small is within the seeds' spread PTB measured). Set before the last of these runs finished.
HF_NEAR = 0.02
# Seeds: one a recipe; three for the two all-linear recipes the rule chooses between (decay, and decay+conv4+distill:
# 2.2% apart after one seed each), and where the seed rule asks (all four, 0.04 from decay+conv4+distill)
HF_SEEDS = {"t2r+decay": (1, 2, 3), "t2r+decay+conv4+distill": (1, 2, 3), "t2r+chosen1+decay+conv4+distill": (1, 2, 3)}


def hf_teacher(out: str) -> str:
    """The hf: recipe's Llama teacher in out (its corpus, tokenizer and weights), trained where missing; its folder."""
    from experiments import hf_recipe
    size = hf_recipe.SIZES["full"]
    texts = hf_recipe.write_corpus(size, out)
    folder = os.path.join(out, HF_FAMILY)
    if not os.path.isfile(os.path.join(folder, "config.json")):
        tokenizer = hf_recipe.tokenizer_of(texts["train"], size["vocab"])
        hf_recipe.train_teacher(HF_FAMILY, size, tokenizer, texts, folder)
    return folder


def hf_runs(teachers: str, out: str) -> list:
    """Each HF_RECIPES conversion of the hf: recipe's Llama, as experiments/hf_recipe.py converts at its recipe."""
    from experiments import hf_recipe
    from train_lm import HF_RECIPE
    size = hf_recipe.SIZES["full"]
    recipe = {**hf_recipe.BASE, "steps": HF_RECIPE["max_steps"], "lr": HF_RECIPE["lr"],
              "transfer": HF_RECIPE["transfer_steps"]}
    runs = []
    for name, parts in HF_RECIPES.items():
        settings = {**recipe, "transfer": 0} if name == "softmax control" else recipe  # transfer: T2R's stage
        argv = hf_recipe.convert_flags(HF_FAMILY, settings, size, teachers) + [str(p) for p in parts]
        flags, i = {}, 0
        while i < len(argv):  # "--flag value" or a switch: the Run's flags
            switch = i + 1 == len(argv) or argv[i + 1].startswith("--")
            off = switch and argv[i].startswith("--no-")  # --no-decay: decay False
            flags[argv[i][5:] if off else argv[i][2:]] = False if off else True if switch else argv[i + 1]
            i += 1 if switch else 2
        if "decay" in RECIPES[name]:
            flags["decay"] = True  # where convert_flags gave --no-decay (T2R's own, the sweep's)
        for seed in HF_SEEDS.get(name, (1,)):
            folder = f"{FOLDERS[name]}-s{seed}"
            runs.append(Run(folder, "train_lm.py", {**flags, "seed": str(seed), "out_dir": os.path.join(
                out, "hf-llama", folder)}, dict(task="hf-llama", recipe=name, seed=seed)))
    return runs


# The translator (experiments/study.py's Table 2 model: 3+3 layers, 128 wide, on the offline LibreOffice corpus): its
# teacher trained again here with the study's flags and seed (the study's weights were not kept, and another CPU does
# not train the same weights), then each recipe finetunes its decoder with the study's conversion recipe (3,200 steps
# at 8e-4, T2R's k = 4 causal and 32 cross), the study's seed 0; the control trains the teacher on as long, softmax.
# The decaying state, the convolution and the chosen layer are the decoder's causal self-attention's.
MT_SEED = 0
# More seeds where the seed rule asks (seeds_wanted): first T2R's, as every row had one seed and so no spread to judge
# by; then the rows within twice the spread they measured (0.22 BLEU: every conversion's row but the control's)
MT_SEEDS = {recipe: (MT_SEED, 1, 2) for recipe in ("t2r", "t2r+decay", "t2r+conv4", "t2r+distill", "t2r+chosen1",
                                                   "t2r+decay+conv4+distill", "t2r+chosen1+decay+conv4+distill")}


def mt_runs(out: str, size: dict) -> list:
    """The translator's teacher, trained in out/mt/teacher, then each RECIPES conversion of it, seed by seed: MT_SEED's
    in the recipe's folder, each other seed of MT_SEEDS in the folder's name with -s<seed>."""
    from experiments.study import mt_runs as study_plan
    plan = {run.name: run for run in study_plan(out, size)}
    teacher = plan[f"softmax-random-s{MT_SEED}"]
    teacher = Run("teacher", teacher.script, {**teacher.flags, "out_dir": os.path.join(out, "mt", "teacher")},
                  dict(task="mt", recipe="teacher", seed=MT_SEED))
    conversion = {**plan[f"t2r-pretrained-s{MT_SEED}"].flags, "pretrained": os.path.join(teacher.out_dir, "model.pt")}
    runs = [teacher]
    for seed in sorted({seed for seeds in MT_SEEDS.values() for seed in seeds} | {MT_SEED}):  # each seed in turn
        for recipe, extra in ((r, e) for r, e in RECIPES.items() if seed in MT_SEEDS.get(r, (MT_SEED,))):
            folder = FOLDERS[recipe] + ("" if seed == MT_SEED else f"-s{seed}")
            flags = {**conversion, **extra, "seed": seed, "out_dir": os.path.join(out, "mt", folder)}
            flags["attn"] = "softmax" if recipe == "softmax control" else "t2r"
            runs.append(Run(folder, "train_mt.py", flags, dict(task="mt", recipe=recipe, seed=seed)))
    return runs


def rows_of(study_out: str, out: str, size: dict) -> list:
    """(run, its records) for every row of the PTB table: the study's T2R from the seed-1 teacher among them."""
    _, conversion = study_runs(study_out, size)
    conversion = replace(conversion, row=dict(task="ptb", recipe="t2r", seed=TEACHER_SEED))
    return [(conversion, "study")] + [(run, "since") for run in ptb_runs(study_out, out, size)]


# -----------------------------------------------------------------------------
# The decoding probe: each recipe's speed and state, measured on its first seed's weights (experiments/decoding.py)

HF_DECODE = (128, 128)  # the hf: Llama's prompt and new tokens: within the 256 positions it was trained on
MQAR_DECODE = (128, 128)  # MQAR's: within the 256 positions of a sequence of 64 pairs
DECODED_TASKS = ("ptb", "hf-llama", "mt", "mqar")  # what --stage decode times, in its order


def probe_decoding(study_out: str, out: str, size: dict, tasks: str = ""):
    """decode.json into each recipe's first-seed run (and its record), where its weights are here: PTB's, the hf:
    Llama's, the translator's, then MQAR's; of the tasks whose name (ptb, hf-llama, mt, mqar) matches `tasks`, so that
    one task's rows can be timed again together, on one machine on one day."""
    hf = [(run, "since") for run in hf_runs(os.path.join(ROOT, "out", "hf-recipe"), out)]
    mt = [(run, "since") for run in mt_runs(out, MT_SIZES["full"])[1:]]  # the teacher's row reads no speed
    runs = []
    for run, owner in rows_of(study_out, out, size) + hf + mt:
        if run.row["seed"] != (MT_SEED if run.row["task"] == "mt" else 1) or not re.search(tasks, run.row["task"]):
            continue
        model_pt = os.path.join(run.out_dir, "model.pt")
        if os.path.isfile(model_pt):
            runs.append((run, owner, model_pt))
        else:
            print(f"{run.name}: no weights here ({model_pt}): not measured")
    for task, lengths in (("ptb", ()), ("hf-llama", HF_DECODE)):
        mine = [(run, owner, model_pt) for run, owner, model_pt in runs if run.row["task"] == task]
        found = measure_decoding([model_pt for *_, model_pt in mine], *lengths)
        for (run, owner, _), decoded in zip(mine, found, strict=True):
            keep_decoding(run, owner, decoded, study_out, out)
    mine = [(run, owner) for run, owner, _ in runs if run.row["task"] == "mt"]
    for (run, owner), decoded in zip(mine, measure_translations([run.out_dir for run, _ in mine]), strict=True):
        keep_decoding(run, owner, decoded, study_out, out)
    if re.search(tasks, "mqar"):
        probe_mqar_decoding(out)


def keep_decoding(run, owner: str, found: dict, study_out: str, out: str):
    """A measurement into the run's decode.json, then into its record (the study's or this study's)."""
    write_decoding([run.out_dir], found, run.row["recipe"])
    records_of(owner, study_out, out).keep(run)


def write_decoding(folders: list, found: dict, name: str):  # decode.json, with the machine and date, in each folder
    from experiments.records import machine
    from support.runtime import write_json
    for folder in folders:
        write_json(os.path.join(folder, "decode.json"), {**found, **machine()})
    print(f"{name}: {found['tokens_per_s']:.0f} tokens/s, state {found['state_bytes']:,} bytes", flush=True)


def probe_mqar_decoding(out: str):
    """decode.json of each MQAR recipe's first seed (its 600-step run), into its folder and its record's."""
    from experiments import mqar
    records = os.path.join(ROOT, "results", "runs", "since_t2r", "mqar")
    runs = [r for r in mqar_runs() if r.model in MQAR_RECIPES and not re.search(r"-seed\d+$", r.name)]
    model_pts = {run.name: os.path.join(mqar.folder_of(run, os.path.join(out, "mqar")), "model.pt") for run in runs}
    for run in [run for run in runs if not os.path.isfile(model_pts[run.name])]:
        print(f"mqar {run.name}: no weights here ({model_pts[run.name]}): not measured")
    runs = [run for run in runs if os.path.isfile(model_pts[run.name])]
    for run, found in zip(runs, measure_decoding([model_pts[run.name] for run in runs], *MQAR_DECODE), strict=True):
        write_decoding([os.path.dirname(model_pts[run.name]), mqar.folder_of(run, records)], found, f"mqar {run.model}")


def records_of(owner: str, study_out: str, out: str) -> Records:
    return Records(study_out, os.path.join(ROOT, "results", "runs")) if owner == "study" else \
        Records(out, os.path.join(ROOT, "results", "runs", "since_t2r"))


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


def translates_near_control(all_linear: float, control: float) -> str:
    """"An all-linear translator within COMPARABLE_BLEU of the softmax control's test BLEU": one seed each."""
    from experiments.rules import COMPARABLE_BLEU
    return "yes" if all_linear >= control - COMPARABLE_BLEU else "**no**"


# -----------------------------------------------------------------------------
# The table (results/since_t2r.csv, one row a result) and the page (results/since_t2r.md), from the records alone

TRAIN_MINUTES_NOTE = ("Train minutes: one run's finetuning (or the teacher's training), wall minutes with other "
                      "runs beside it on the 2 cores, the mean over its seeds.")
COLUMNS = ["task", "recipe", "softmax_layers", "metric", "value", "sd", "seeds", "state_bytes", "decode_tokens_per_s",
           "gap_to_teacher", "gap_to_control", "train_minutes", "trained_on", "runs"]


def kept_layers(folder: str, n_layer: int, recipe: str) -> int:
    """How many layers kept softmax: all of them (the teacher, the control), those softmax_layers.json names, or
    keep_softmax_every's."""
    if recipe in ("teacher", "softmax control"):
        return n_layer
    chosen = os.path.join(folder, "softmax_layers.json")
    if os.path.isfile(chosen):
        return len(read_json(chosen)["kept"])
    every = read_json(os.path.join(folder, "args.json")).get("keep_softmax_every") or 0
    return len(range(every, n_layer + 1, every)) if every else 0


def cell(value, form: str = "{}") -> str:  # a table's cell: "-" where there is no value
    return "-" if value is None else form.format(value)


def decoded(folder: str | None) -> dict:  # a row's decoding columns, from its first run's decode.json (None where none)
    path = folder and os.path.join(folder, "decode.json")
    found = read_json(path) if path and os.path.isfile(path) else {}
    return dict(state_bytes=found.get("state_bytes"),
                decode_tokens_per_s=round(found["tokens_per_s"]) if found else None)


def minutes_per_run(results) -> float | None:  # a run's training minutes, the mean over a recipe's runs
    minutes = [r["train_minutes"] for r in results if "train_minutes" in r]
    return round(statistics.mean(minutes), 1) if minutes else None


def mean_sd(values: list) -> tuple:  # the sample SD, where there are two values or more
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else None


def ptb_rows(study_out: str, out: str, size: dict) -> tuple:
    """The PTB rows (mean test perplexity over each recipe's finished seeds) and, per recipe, its seeds' values."""
    teacher, _ = study_runs(study_out, size)
    found = {}
    for run, owner in [(teacher, "study")] + rows_of(study_out, out, size):  # their records: a fresh checkout's too
        folder = records_of(owner, study_out, out).folder(run)
        if os.path.isfile(os.path.join(folder, "results.json")):
            recipe = "teacher" if run is teacher else run.row["recipe"]
            found.setdefault(recipe, []).append((folder, read_json(os.path.join(folder, "results.json"))))
    values = {recipe: [r["test"]["ppl"] for _, r in runs] for recipe, runs in found.items()}
    rows = []
    for recipe in ["teacher", *RECIPES]:
        if recipe not in found:
            continue
        first = found[recipe][0][0]  # the first seed's folder: its decode.json
        mean, sd = mean_sd(values[recipe])
        rows.append(dict(task="ptb", recipe=recipe, softmax_layers=kept_layers(first, size["model"]["n_layer"], recipe),
                         metric="test_ppl", value=round(mean, 2), sd=None if sd is None else round(sd, 2),
                         seeds=len(values[recipe]), **decoded(first if recipe != "teacher" else None),
                         train_minutes=minutes_per_run(r for _, r in found[recipe]),
                         runs=" ".join(shorten(folder) for folder, _ in found[recipe])))
    return with_gaps(rows), values


def mqar_rows() -> list:
    """The MQAR rows at 8 and 64 pairs: the teacher (trained again here), then each recipe, the mean of its seeds."""
    from experiments import mqar
    records = os.path.join(ROOT, "results", "runs", "since_t2r", "mqar")
    found = {}
    for run in [mqar.Run("softmax", model="teacher")] + mqar_runs():
        folder = mqar.folder_of(run, records)
        if os.path.isfile(os.path.join(folder, "results.json")):
            found.setdefault(run.model, []).append((folder, read_json(os.path.join(folder, "results.json"))))
    rows = []
    for recipe, runs in found.items():
        first = runs[0][0]
        layers = 2 if recipe in ("teacher", "softmax control") else kept_layers(first, 2, recipe)
        for pairs in MQAR_PAIRS:
            mean, sd = mean_sd([r["accuracy"][str(pairs)] for _, r in runs])
            rows.append(dict(task=f"mqar{pairs}", recipe=recipe, softmax_layers=layers, metric="recall",
                             value=round(mean, 4), sd=None if sd is None else round(sd, 4), seeds=len(runs),
                             **{**decoded(first),  # MQAR's state at the sequence's end, from its results
                                "state_bytes": runs[0][1]["state_bytes"][str(mqar.length_for(pairs))]},
                             train_minutes=minutes_per_run(r for _, r in runs),
                             runs=" ".join(shorten(folder) for folder, _ in runs)))
    return with_gaps(rows)


def hf_rows() -> list:
    """The hf: Llama rows (test perplexity, the mean of a recipe's seeds): the teacher as train_lm.py scored it before
    converting."""
    records = os.path.join(ROOT, "results", "runs", "since_t2r")  # the runs' records, in their out_dirs' layout
    found = {}
    for run in hf_runs(os.path.join(ROOT, "out", "hf-recipe"), records):
        if os.path.isfile(os.path.join(run.out_dir, "results.json")):
            found.setdefault(run.row["recipe"], []).append(run.out_dir)
    rows = []
    for name, folders in found.items():
        first = folders[0]
        if not rows and os.path.isfile(os.path.join(first, "teacher_results.json")):
            teacher = read_json(os.path.join(first, "teacher_results.json"))
            rows.append(dict(task="hf-llama", recipe="teacher", softmax_layers=4, metric="test_ppl",
                             value=round(teacher["test"]["ppl"], 2), sd=None, seeds=1, runs=shorten(first)))
        results = [read_json(os.path.join(f, "results.json")) for f in folders]
        mean, sd = mean_sd([r["test"]["ppl"] for r in results])
        rows.append(dict(task="hf-llama", recipe=name, softmax_layers=kept_layers(first, 4, name), metric="test_ppl",
                         value=round(mean, 2), sd=None if sd is None else round(sd, 2), seeds=len(results),
                         **decoded(first),
                         train_minutes=minutes_per_run(results),
                         runs=" ".join(shorten(f) for f in folders)))
    return with_gaps(rows)


def mt_rows() -> list:
    """The translator's rows (test BLEU, detokenized SacreBLEU, the mean of a recipe's seeds): its teacher, then each
    recipe; decoding read from the first seed's run."""
    records = os.path.join(ROOT, "results", "runs", "since_t2r")  # the runs' records, in their out_dirs' layout
    found = {}
    for run in mt_runs(records, MT_SIZES["full"]):
        if os.path.isfile(os.path.join(run.out_dir, "results.json")):
            found.setdefault(run.row["recipe"], []).append(run.out_dir)
    rows = []
    for recipe in ["teacher", *RECIPES]:
        if recipe not in found:
            continue
        folders = found[recipe]
        results = [read_json(os.path.join(f, "results.json")) for f in folders]
        mean, sd = mean_sd([r["test"]["bleu"] for r in results])
        layers = MT_SIZES["full"]["model"]["n_layer"]
        rows.append(dict(task="mt", recipe=recipe, softmax_layers=kept_layers(folders[0], layers, recipe),
                         metric="bleu", value=round(mean, 2), sd=None if sd is None else round(sd, 2),
                         seeds=len(results), **decoded(folders[0]), train_minutes=minutes_per_run(results),
                         runs=" ".join(shorten(f) for f in folders)))
    return with_gaps(rows)


def with_gaps(rows: list) -> list:
    """Each row's value less its task's teacher's and softmax control's (in the metric's units)."""
    for row in rows:
        same = {r["recipe"]: r["value"] for r in rows if r["task"] == row["task"]}
        for column, recipe in (("gap_to_teacher", "teacher"), ("gap_to_control", "softmax control")):
            row[column] = round(row["value"] - same[recipe], 4 if row["metric"] == "recall" else 2) \
                if recipe in same and recipe != row["recipe"] else None
    return rows


def write_results(study_out: str, out: str, size: dict, results_dir: str):
    from support.runtime import write_csv
    ptb, values = ptb_rows(study_out, out, size)
    rows = ptb + mt_rows() + mqar_rows() + hf_rows()
    for row in rows:  # where and when its runs trained (their commands: each record's args.json)
        row["trained_on"] = machines([os.path.join(ROOT, folder) for folder in row["runs"].split()])
    write_csv(os.path.join(results_dir, "since_t2r.csv"), rows, COLUMNS)
    page = os.path.join(results_dir, "since_t2r.md")
    from support.runtime import atomic_write
    with atomic_write(page) as tmp, open(tmp, "w") as f:
        f.write("\n".join(page_lines(rows, values, study_out, out, size)) + "\n")
    print(f"wrote {shorten(os.path.join(results_dir, 'since_t2r.csv'))} ({len(rows)} rows) and {shorten(page)}")


SEED_RULE = 3  # seeds a row needs where another of its task is closer than twice their spread


def seeds_wanted(rows: list) -> dict:
    """The rule on the seeds: where two rows of a task (the teacher aside) differ by less than twice their spread, each
    has SEED_RULE seeds. The spread of a pair: the larger SD of the two; a row of one seed takes its task's largest
    SD measured (a task with none has no spread to judge by). {task: {recipe: (its seeds, the rows it is close to)}}."""
    wanted = {}
    for task in dict.fromkeys(r["task"] for r in rows):
        mine = [r for r in rows if r["task"] == task and r["recipe"] not in {"teacher", *LONGER_ROWS}]
        measured = [r["sd"] for r in mine if r["sd"] is not None]
        if not measured:
            wanted[task] = None
            continue
        spread = lambda r: max(measured) if r["sd"] is None else r["sd"]
        found = wanted.setdefault(task, {})
        for i, a in enumerate(mine):
            for b in mine[i + 1:]:
                if abs(a["value"] - b["value"]) < 2 * max(spread(a), spread(b)):
                    for row, other in ((a, b), (b, a)):
                        if row["seeds"] < SEED_RULE:
                            found.setdefault(row["recipe"], (row["seeds"], []))[1].append(other["recipe"])
    return wanted


def seed_rule_lines(rows: list) -> list:
    lines = ["", "## Seeds", "", "The rule: where two rows of a task (the teacher and the longer MQAR runs aside) "
             "differ by less than twice their spread (the "
             f"larger SD of the two; a row of one seed takes its task's largest SD), each has {SEED_RULE} seeds. What "
             "it still asks for:", ""]
    for task, found in seeds_wanted(rows).items():
        if found is None:
            lines.append(f"- {task}: one seed a row, so no spread measured to judge by")
        elif not found:
            lines.append(f"- {task}: nothing")
        else:
            lines.append(f"- {task}: " + "; ".join(f"{recipe} ({seeds} seed{'s' * (seeds > 1)}; close to "
                                                   f"{', '.join(close)})" for recipe, (seeds, close) in found.items()))
    return lines


def machines(folders: list) -> str:
    """Where and when the runs trained, from their machine.json: '<device>, <threads> thread(s), <first>..<last>'."""
    found = [read_json(p) for p in (os.path.join(f, "machine.json") for f in folders) if os.path.isfile(p)]
    devices = sorted({m.get("device", "?") for m in found})
    threads = sorted({m.get("threads") for m in found} - {None})
    dates = sorted(m["date"] for m in found if "date" in m)
    span = "?" if not dates else dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
    return f"{'; '.join(devices)}, {'/'.join(map(str, threads))} thread(s) a run, {span}"


def summary_lines(rows: list) -> list:
    """A bullet a task: the best all-linear recipe against T2R, the teacher and the softmax control."""
    names = {"ptb": "PTB (test ppl", "mt": "the translator (test BLEU", "mqar64": "MQAR at 64 pairs (recall",
             "hf-llama": "the hf: recipe's Llama (test ppl"}
    lines = []
    for task, name in names.items():
        mine = {r["recipe"]: r for r in rows if r["task"] == task}
        linear = [r for r in mine.values() if r["softmax_layers"] == 0 and r["recipe"] != "t2r" and
                  r["recipe"] not in LONGER_ROWS]
        if "t2r" not in mine or not linear:
            continue
        best = (min if task in ("ptb", "hf-llama") else max)(linear, key=lambda r: r["value"])  # ppl: lower
        seeds = lambda r: f"{r['seeds']} seed{'s' if r['seeds'] > 1 else ''}"
        value = lambda r: f"{r['value']:.4f}" if task.startswith("mqar") else f"{r['value']:.2f}"  # as the tables
        others = ", ".join(f"{label} {value(mine[recipe])} ({seeds(mine[recipe])})" for label, recipe in
                           (("T2R", "t2r"), ("the teacher", "teacher"), ("the softmax control", "softmax control"))
                           if recipe in mine)
        longer = mine.get(longer_name(LONGER_JUDGED))
        longer = f" Finetuned {MQAR_LONGER}x as long, {LONGER_JUDGED}: {value(longer)} ({seeds(longer)})." \
            if longer else ""
        lines.append(f"- {name}): the best all-linear conversion, {best['recipe']}, {value(best)} "
                     f"({seeds(best)}); {others}.{longer}")
    return lines


def page_lines(rows: list, values: dict, study_out: str, out: str, size: dict) -> list:
    from experiments.rules import BY_ID, NEAR_CONTROL, when
    from experiments.verdicts import exact_permutation_p, welch
    lines = ["# Since T2R: a decaying state, a short convolution, distillation, softmax layers chosen by data", "",
             "Built by `python -m experiments.since_t2r --stage results` from results/since_t2r.csv, which it writes "
             "from the runs' records (results/runs/since_t2r, results/runs/lm); the runs: "
             "`python -m experiments.since_t2r --jobs 2` (PTB), `--stage mt`, `--stage mqar`, `--stage hf`, "
             "`--stage decode`; each row's machine and dates: the CSV's trained_on. What each part is: decay.py, "
             "after_t2r.py (ConvInput), support/distill.py, "
             "support/choose_layers.py.", "",
             "In short (the README quotes these lines):", "", *summary_lines(rows), ""]
    ptb = [r for r in rows if r["task"] == "ptb"]
    folders = [os.path.join(ROOT, f) for r in ptb for f in r["runs"].split()]
    lines += ["## PTB, the study's language model (4 layers, d_model 128), from its seed-1 teacher", "",
              f"Each recipe finetunes the teacher {size['finetune_steps']} steps at lr 1e-3 (the study's conversion "
              f"recipe, T2R's k = {MAIN_K}), once for each seed; the softmax control is the teacher finetuned as long, "
              "unchanged. Test perplexity: the mean of the seeds, their SD. Decoding: greedy tokens/s at batch 1 after "
              f"a {DECODE_PROMPT}-token prompt read by prefill ({DECODE_TOKENS} steps, the median of {DECODE_PASSES} "
              f"passes after an untimed one, the recipes taking turns, on the first seed's weights), and the state's "
              "bytes then (a KV cache's as allocated: its capacity doubles as it fills, layers/states.py). "
              f"{TRAIN_MINUTES_NOTE} "
              f"Trained on: {machines(folders)}.", "",
              "| recipe | softmax layers | test ppl | SD | seeds | vs teacher | vs control | state bytes | tokens/s "
              "| train minutes |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in ptb:
        lines.append(f"| {r['recipe']} | {r['softmax_layers']} | {r['value']:.2f} | {cell(r['sd'], '{:.2f}')} | "
                     f"{r['seeds']} | {cell(r['gap_to_teacher'], '{:+.2f}')} | "
                     f"{cell(r['gap_to_control'], '{:+.2f}')} | "
                     f"{cell(r['state_bytes'], '{:,}')} | {cell(r['decode_tokens_per_s'])} | "
                     f"{cell(r['train_minutes'])} |")
    decode = [os.path.join(r["runs"].split()[0], "decode.json") for r in ptb]
    decoded = [d for d in decode if os.path.isfile(os.path.join(ROOT, d))]
    if decoded:
        lines += ["", f"Decoding measured on: {machines([os.path.dirname(os.path.join(ROOT, d)) for d in decoded])}."]
    lines += ["", "### Verdicts (each rule dated in experiments/rules.py)", ""]
    control = values.get("softmax control")
    for recipe in [r for r in RECIPES if r not in ("softmax control", "t2r")]:
        if recipe in values and "t2r" in values:
            judged = min(len(values[recipe]), len(values["t2r"])) > 1  # a spread on both sides
            verdict = part_helps(values[recipe], values["t2r"]) if judged else "not judged (one seed)"
            stats = ""
            if judged:
                t, df, p = welch(values[recipe], values["t2r"])
                stats = f"; Welch t {t:.2f}, df {df:.1f}, p {p:.2g}; permutation p " \
                        f"{exact_permutation_p(values[recipe], values['t2r']):.2f}"
            lines.append(f"- {recipe} lowers T2R's perplexity ({len(values[recipe])} against "
                         f"{len(values['t2r'])} seeds{stats}): **{verdict}**" if verdict == "yes" else
                         f"- {recipe} lowers T2R's perplexity ({len(values[recipe])} against {len(values['t2r'])} "
                         f"seeds{stats}): {verdict}")
    linear = [r for r in ptb if r["softmax_layers"] == 0 and r["recipe"] != "t2r"]
    if control and linear:
        best = min(linear, key=lambda r: r["value"])
        lines.append(f"- an all-linear conversion within {NEAR_CONTROL:.0%} of the softmax control "
                     f"({mean_sd(control)[0]:.2f}, <= {(1 + NEAR_CONTROL) * mean_sd(control)[0]:.2f}): the best, "
                     f"{best['recipe']}, {best['value']:.2f}: {near_control(values[best['recipe']], control)}")
    chosen = next((r for r in ptb if r["recipe"] == "t2r+chosen1"), None)
    if chosen:
        from layers.config_rules import converted_kinds
        n_layer = size["model"]["n_layer"]
        every = {i for i, kind in enumerate(converted_kinds(n_layer, "t2r", 4)) if kind == "softmax"}
        picks = [read_json(os.path.join(ROOT, f, "softmax_layers.json"))["kept"] for f in chosen["runs"].split()]
        same = all(set(p) == every for p in picks)
        seeds = ", ".join(str(s) for s in SEEDS["t2r+chosen1"][:len(picks)])
        lines.append(f"- one layer kept softmax, chosen by data, against every 4th (the paper's T2R 75%, of "
                     f"{n_layer} layers layer {min(every)}, 0 the bottom): the ranking kept layer "
                     f"{', '.join(str(p[0]) for p in picks)} (seeds {seeds}): "
                     + (f"{chosen_beats_every_kth([], [], every, every)}, so the t2r+chosen1 row above is the paper's "
                        "T2R 75% on this teacher" if same else "see the seeds"))
    rules = ("since-part-helps", "since-near-control", "since-chosen-layers")
    lines += [f"  (rules: {', '.join(f'{i} {when(BY_ID[i])}' for i in rules)})"]
    return lines + mt_lines(rows) + mqar_lines(rows) + hf_lines(rows) + seed_rule_lines(rows)


def mt_lines(rows: list) -> list:
    mt = [r for r in rows if r["task"] == "mt"]
    if not mt:
        return ["", "## The translator", "", "Not run yet: `python -m experiments.since_t2r --stage mt`."]
    size = MT_SIZES["full"]
    lines = ["", "## The translator (the study's Table 2 model: 3+3 layers, d_model 128, the LibreOffice corpus)", "",
             f"Its teacher trained again here with the study's flags (seed {MT_SEED}); each recipe finetunes it "
             f"{size['finetune_steps']} steps at lr {MT_LR['finetune']:g} (the study's conversion: T2R's k = 4 in the "
             "decoder's causal attention, 32 in its cross attention), with as many seeds as the seeds column says "
             "(their mean and SD); the parts and the chosen layer are the decoder's causal attention's; the control "
             "trains the teacher on as long, softmax. Test BLEU: "
             "detokenized SacreBLEU, beam 5. Decoding: greedy tokens/s at batch 16 on the test sentences (the "
             f"study's speed probe, the median of {SPEED_PASSES} passes, the recipes taking turns), and one "
             "sentence's decoder state after "
             f"{MT_STATE_TOKENS} target tokens, cross attention included. {TRAIN_MINUTES_NOTE} "
             f"Trained on: {machines([os.path.join(ROOT, f) for r in mt for f in r['runs'].split()])}.", "",
             "| recipe | softmax layers | test BLEU | SD | seeds | vs teacher | vs control | state bytes | tokens/s "
             "| train minutes |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['recipe']} | {r['softmax_layers']} | {r['value']:.2f} | {cell(r['sd'], '{:.2f}')} | "
              f"{r['seeds']} | {cell(r['gap_to_teacher'], '{:+.2f}')} | "
              f"{cell(r['gap_to_control'], '{:+.2f}')} | {cell(r['state_bytes'], '{:,}')} | "
              f"{cell(r['decode_tokens_per_s'], '{}')} | {cell(r['train_minutes'], '{}')} |" for r in mt]
    missing = [recipe for recipe in RECIPES if recipe not in {r["recipe"] for r in mt}]
    if missing:
        lines += ["", f"Still to run (`python -m experiments.since_t2r --stage mt`): {', '.join(missing)}."]
    from experiments.rules import BY_ID, COMPARABLE_BLEU, when
    control = next((r for r in mt if r["recipe"] == "softmax control"), None)
    linear = [r for r in mt if r["softmax_layers"] == 0 and r["recipe"] != "t2r"]
    if control and linear:
        best = max(linear, key=lambda r: r["value"])
        lines += ["", f"- an all-linear conversion within {COMPARABLE_BLEU:g} BLEU of the softmax control "
                  f"({control['value']:.2f}): the best, {best['recipe']}, {best['value']:.2f}: "
                  f"{translates_near_control(best['value'], control['value'])} (rule since-mt-near-control, "
                  f"{when(BY_ID['since-mt-near-control'])})"]
    chosen = next((r for r in mt if r["recipe"] == "t2r+chosen1"), None)
    if chosen:  # told, not judged: no rule was set for the translator's ranking
        kept = read_json(os.path.join(ROOT, chosen["runs"].split()[0], "softmax_layers.json"))["kept"]
        lines.append(f"- the layer kept softmax, chosen by data: the ranking kept decoder layer "
                     f"{', '.join(map(str, kept))} of {MT_SIZES['full']['model']['n_layer']} (0 the bottom); not "
                     "judged: no rule compares it with another placement")
    return lines


def hf_lines(rows: list) -> list:
    from train_lm import HF_RECIPE
    hf = [r for r in rows if r["task"] == "hf-llama"]
    if not hf:
        return ["", "## The hf: recipe's Llama", "", "Not run yet: `python -m experiments.since_t2r --stage hf`."]
    lines = ["", "## The hf: recipe's Llama (experiments/hf_recipe.py's teacher: 4 layers, 128 wide, 4 query and 2 "
             "key/value heads, rotary positions)", "",
             f"Converted with train_lm.py's HF_RECIPE ({HF_RECIPE['transfer_steps']} steps of attention transfer, then "
             f"{HF_RECIPE['max_steps']} at lr {HF_RECIPE['lr']:g}) and each part (one seed; three for the two "
             "all-linear recipes train_lm.py's HF_PARTS chose between and where the seed rule asked: their mean); "
             "the control: the teacher trained on as long, softmax. Trained on: "
             f"{machines([os.path.join(ROOT, f) for r in hf for f in r['runs'].split()])}.", "",
             f"Decoding as PTB's, after a {HF_DECODE[0]}-token prompt, {HF_DECODE[1]} steps (the positions it "
             f"was trained on). {TRAIN_MINUTES_NOTE}", "",
             "| recipe | softmax layers | test ppl | SD | seeds | vs teacher | vs control | state bytes | tokens/s "
             "| train minutes |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['recipe']} | {r['softmax_layers']} | {r['value']:.2f} | {cell(r['sd'], '{:.2f}')} | "
              f"{r['seeds']} | "
              f"{cell(r['gap_to_teacher'], '{:+.2f}')} | "
              f"{cell(r['gap_to_control'], '{:+.2f}')} | {cell(r.get('state_bytes'), '{:,}')} | "
              f"{cell(r.get('decode_tokens_per_s'))} | {cell(r.get('train_minutes'))} |" for r in hf]
    return lines


def mqar_lines(rows: list) -> list:
    from experiments.rules import BY_ID, when
    mq = [r for r in rows if r["task"].startswith("mqar")]
    if not mq:
        return ["", "## MQAR", "", "Not run yet: `python -m experiments.since_t2r --stage mqar`."]
    from experiments.sizes import MQAR_SIZES
    size = MQAR_SIZES["full"]
    lines = ["", "## MQAR (experiments/mqar.py's 2-layer softmax teacher, d_model 128, 4 heads)", "",
             f"Each recipe finetunes the teacher {size['finetune_steps']} steps (the longer runs below: "
             f"{MQAR_LONGER * size['finetune_steps']}), k = {MAIN_K}, with as many seeds as the seeds column says, "
             "train_lm.py's default seed first (their mean); "
             "recall on the same fixed test sequences, the state's bytes after the sequence. The layer kept softmax "
             "by the paper's placement is every 2nd: of 2 layers, every 4th would keep none. Decoding as PTB's, "
             f"after a {MQAR_DECODE[0]}-token prompt, {MQAR_DECODE[1]} steps (a 64-pair sequence's length). "
             f"{TRAIN_MINUTES_NOTE} Trained on: "
             f"{machines(sorted({os.path.join(ROOT, f) for r in mq for f in r['runs'].split()}))}.", "",
             "| recipe | softmax layers | recall, 8 pairs | recall, 64 pairs | seeds | state bytes at 64 pairs "
             "| tokens/s | train minutes |",
             "|---|---|---|---|---|---|---|---|"]
    by, longer = {(r["recipe"], r["task"]): r for r in mq}, [longer_name(recipe) for recipe in LONGER]
    for recipe in [recipe for recipe in dict.fromkeys(r["recipe"] for r in mq) if recipe not in longer]:
        r8, r64 = by.get((recipe, "mqar8")), by.get((recipe, "mqar64"))
        lines.append(f"| {recipe} | {r64['softmax_layers']} | {r8['value']:.4f} | {r64['value']:.4f} | "
                     f"{r64['seeds']} | {r64['state_bytes']:,} | {cell(r64.get('decode_tokens_per_s'))} | "
                     f"{cell(r64.get('train_minutes'))} |")
    linear = [r for r in mq if r["task"] == "mqar64" and r["softmax_layers"] == 0 and r["recipe"] not in longer]
    if linear:
        best = max(linear, key=lambda r: r["value"])
        lines += ["", f"- an all-linear k = {MAIN_K} conversion recalls at least 0.95 at 64 pairs: the best, "
                  f"{best['recipe']}, {best['value']:.4f}: {recalls(best['value'])} "
                  f"(rule since-mqar-recall, {when(BY_ID['since-mqar-recall'])})"]
        lines += conv_teacher_line()
    ran = [(recipe, by[(name, "mqar64")]) for recipe, name in zip(LONGER, longer) if (name, "mqar64") in by]
    seeds = lambda row: f"{row['seeds']} seed{'s' * (row['seeds'] > 1)}"
    if ran:  # after since-mqar-recall, to tell the budget's limit from the parts': not judged by it
        lines.append(f"- finetuned {MQAR_LONGER}x as long ({MQAR_LONGER * size['finetune_steps']} steps; run after "
                     "rule since-mqar-recall to tell the budget's limit from the parts', so not judged by it), recall "
                     "at 64 pairs: " + ", ".join(f"{recipe} {row['value']:.4f} ({seeds(row)}; against "
                                                 f"{by[(recipe, 'mqar64')]['value']:.4f} at {size['finetune_steps']} "
                                                 "steps)" for recipe, row in ran))
    judged = by.get((longer_name(LONGER_JUDGED), "mqar64"))
    if judged:
        wanted = len(LONGER_SEEDS[LONGER_JUDGED])
        verdict = recalls(judged["value"]) if judged["seeds"] >= wanted else \
            f"not judged until its {wanted} seeds are in ({judged['seeds']} so far)"
        lines.append(f"- {LONGER_JUDGED} finetuned {MQAR_LONGER}x as long recalls at least 0.95 at 64 pairs, the "
                     f"mean of its seeds: {judged['value']:.4f} ({seeds(judged)}): {verdict} (rule "
                     f"since-mqar-recall-longer, {when(BY_ID['since-mqar-recall-longer'])})")
    chosen, every = by.get(("t2r+chosen1", "mqar64")), by.get(("t2r+every2nd", "mqar64"))
    if chosen and every:
        recall = lambda row: [read_json(os.path.join(ROOT, f, "results.json"))["accuracy"]["64"]
                              for f in row["runs"].split()]
        picks = [read_json(os.path.join(ROOT, f, "softmax_layers.json"))["kept"] for f in chosen["runs"].split()]
        mine, theirs = recall(chosen), recall(every)
        judged = min(len(mine), len(theirs)) > 1
        verdict = chosen_beats_every_kth([-r for r in mine], [-r for r in theirs], {tuple(p) for p in picks},
                                         {(0,)}) if judged else "not judged (one seed)"  # lower -recall: better
        lines.append(f"- one layer kept softmax, chosen by data (the ranking kept layer "
                     f"{', '.join(str(p[0]) for p in picks)}, 0 the bottom) against every 2nd (layer 0), recall at 64 "
                     f"pairs: {', '.join(f'{r:.4f}' for r in mine)} against {', '.join(f'{r:.4f}' for r in theirs)} "
                     f"({len(mine)} and {len(theirs)} seeds): {verdict} (rule since-chosen-layers)")
    return lines


def conv_teacher_line() -> list:
    """experiments/mqar.py's conversion of a teacher trained with a convolution (results/mqar.csv), beside the
    convolution added at the swap: shown, not judged (it ran before the rule)."""
    import csv
    path = os.path.join(ROOT, "results", "mqar.csv")
    if not os.path.isfile(path):
        return []
    with open(path, newline="") as f:
        row = next((r for r in csv.DictReader(f) if r["model"] == f"t2r{MAIN_K}+conv" and r["pairs"] == "64"), None)
    if row is None:
        return []
    return [f"  (beside it, not judged, as it ran before the rule: experiments/mqar.py's T2R k = {MAIN_K} conversion "
            f"of a teacher trained with a kernel-3 convolution recalls {float(row['accuracy']):.4f} at 64 pairs, "
            "results/mqar.csv; a reading: there the convolution carries the previous-token shift the teacher learned "
            "to use, while one added at the swap must take the shift over from the teacher's own attention head in "
            f"the finetuning: {MQAR_SIZES['full']['finetune_steps']} steps were too few for it, {MQAR_LONGER}x as "
            "many enough, below)"]


# -----------------------------------------------------------------------------

def main(argv=None):
    from experiments.study import execute
    p = Parser(prog="python -m experiments.since_t2r", description="The conversions since T2R, on the study's teacher.")
    p.add_argument("--stage", default="train", choices=["train", "mt", "mqar", "hf", "decode", "results"],
                   help="train: the PTB runs (the teacher first, where its weights are gone); mt: the translator's "
                   "teacher, then its conversions; mqar: the MQAR runs (one at a time); hf: the hf: recipe's Llama "
                   "(its teacher trained first where missing) and its conversions; decode: each recipe's decoding "
                   "speed and state (run it alone: it times); results: the CSV and page")
    p.add_argument("--dry_run", action="store_true", help="print the plan and each run's state, run nothing")
    p.add_argument("--jobs", type=positive_int, default=1, help="runs at a time, each with its share of the cores")
    p.add_argument("--only", type=pattern, default="", help="--stage mqar: the recipes whose name matches this "
                   "regular expression (after the teacher), so that two processes can share the runs; --stage "
                   f"decode: the tasks ({', '.join(DECODED_TASKS)})")
    args = p.parse_args(argv)
    if args.stage == "decode" and not any(re.search(args.only, task) for task in DECODED_TASKS):
        raise UserError(f"--only: {args.only!r} matches none of the tasks decode times ({', '.join(DECODED_TASKS)})")
    study_out, out = os.path.join(ROOT, "out", "study"), os.path.join(ROOT, "out", "since_t2r")
    size = LM_SIZES["full"]
    t0 = time.time()
    if args.stage == "train":
        execute(study_runs(study_out, size), args.dry_run, args.jobs,
                Records(study_out, os.path.join(ROOT, "results", "runs")))
        execute(ptb_runs(study_out, out, size), args.dry_run, args.jobs,
                Records(out, os.path.join(ROOT, "results", "runs", "since_t2r")))
    if args.stage == "mt":
        execute(mt_runs(out, MT_SIZES["full"]), args.dry_run, args.jobs,
                Records(out, os.path.join(ROOT, "results", "runs", "since_t2r")))
    if args.stage == "mqar" and not args.dry_run:
        train_mqar(out, args.only)
    if args.stage == "hf":
        teachers = os.path.join(ROOT, "out", "hf-recipe")
        if not args.dry_run:
            hf_teacher(teachers)
        execute(hf_runs(teachers, out), args.dry_run, args.jobs, Records(out, os.path.join(ROOT, "results", "runs",
                                                                                            "since_t2r")))
    if args.stage == "decode":
        probe_decoding(study_out, out, size, args.only)
    if args.stage == "results":
        write_results(study_out, out, size, os.path.join(ROOT, "results"))
    print(f"since_t2r: {(time.time() - t0) / 60:.1f} minutes this time")


if __name__ == "__main__":
    run_main(main)
