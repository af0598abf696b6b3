"""
Conversion as it is done since T2R, measured: the default jobs converted four ways, with the same finetuning budget.

    python -m experiments.conversion                 # the language model, then the translator, then the report
    python -m experiments.conversion --task lm       # only the language model (PTB, train_lm.py's defaults)
    python -m experiments.conversion --dry_run       # the plan: every run, its command, done or not
    python -m experiments.conversion --quick         # the same at toy sizes (a few minutes), into out/conversion-quick

Rows: T2R as in the paper (swap, finetune), + attention transfer before finetuning, + a sliding window, + both.
Each row is scored three times: right after the swap (no training; evaluated here), after the transfer stage
(results.json's after_transfer) and after finetuning. The teacher is the default job's (trained first if missing).
Runs are skipped when finished and resumed when interrupted, as in experiments/study.py; the report is
results/conversion.md (out/conversion-quick/conversion.md with --quick).
"""


if __package__ in (None, ""):  # run as a file: the project's modules are found from its root, as a module
    raise SystemExit("error: run it from the repository's root as a module: python -m experiments.conversion")

import argparse
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import torch

from experiments.records import machine
from experiments.runs import Run, read_json, run_state
from experiments.study import execute
from support.runtime import Distributed, atomic_write, run_main, write_json
from t2r import convert

# Transfer: a third of the finetuning steps (each costs less than a finetuning step: phi alone learns).
# Window: 64 tokens of the LM's 512; 8 for the translator, shorter than most target sentences, so that the
# linear part matters (a window as long as the sentence is softmax).
TASKS = dict(
    lm=dict(script="train_lm.py", teacher="out/ptb-softmax-random", transfer=200, window=64,
            quick=dict(n_layer=2, d_model=32, n_head=2, d_ff=64, block_size=64, batch_size=4,
                                 eval_context=64, eval_score=32, eval_windows=4, eval_interval=10, max_steps=10)),
    mt=dict(script="train_mt.py", teacher="out/mt-libreoffice-en-de-softmax-random", transfer=150, window=8,
            quick=dict(n_layer=2, n_encoder_layer=2, d_model=32, n_head=2, d_ff=64, max_tokens=512,
                                 bleu_sentences=40, eval_interval=10, snapshot_interval=2, average_last=2,
                                 max_steps=10)),
)
ROWS = (("t2r", False, False), ("t2r+transfer", True, False), ("t2r+window", False, True),
        ("t2r+transfer+window", True, True))


def plan(task: str, out: str, quick: bool) -> tuple:
    """(the teacher run, the four student runs) of one task."""
    spec = TASKS[task]
    sizes = dict(spec["quick"]) if quick else {}
    teacher_dir = os.path.join(out, f"{task}-teacher") if quick else os.path.join(ROOT, spec["teacher"])
    teacher_sizes = {**sizes, "max_steps": 2 * sizes["max_steps"]} if quick else {}  # twice the student's
    teacher = Run(f"{task}-teacher", spec["script"], {**teacher_sizes, "out_dir": teacher_dir},
                  dict(model="softmax (teacher)"))
    student_sizes = {k: v for k, v in sizes.items() if k not in ("n_layer", "n_encoder_layer", "d_model", "n_head",
                                                                 "d_ff")}
    transfer = 4 if quick else spec["transfer"]
    window = 4 if quick else spec["window"]
    students = []
    for name, with_transfer, with_window in ROWS:
        flags = {**student_sizes, "init": "pretrained", "pretrained": os.path.join(teacher_dir, "model.pt"),
                 **({"transfer_steps": transfer} if with_transfer else {}), **({"window": window} if with_window else {}),
                 "out_dir": os.path.join(out, f"{task}-{name.replace('+', '-')}")}
        students.append(Run(f"{task}-{name}", spec["script"], flags, dict(model=name, window=window if with_window
                                                                          else 0)))
    return teacher, students


# -----------------------------------------------------------------------------
# The score right after the swap: the teacher converted, evaluated as the trainer's final evaluation does

def after_swap(task: str, run: Run) -> dict:
    """The converted, untrained model's final evaluation, cached in <out_dir>/after_swap.json."""
    path = os.path.join(run.out_dir, "after_swap.json")
    if os.path.isfile(path):
        return read_json(path)
    argv = [arg for name, value in run.flags.items() for arg in ([f"--{name}"] if value is True else
                                                                 [f"--{name}", str(value)])]
    module = __import__(TASKS[task]["script"][:-3])
    args = module.get_args(argv)
    task_object = (module.LMTask if task == "lm" else module.MTTask)(args, Distributed())
    task_object.load_data(None)
    torch.manual_seed(args.seed)  # the teacher converted exactly as the run converts it (train_run)
    teacher = module.load_lm_teacher(args, task_object) if task == "lm" else task_object.take_teacher()
    model = convert(teacher, **module.conversion(args))
    results = task_object.report(model.to(task_object.device).eval(), 0.0)
    write_json(path, results)
    return results


# -----------------------------------------------------------------------------
# The report

def score(results: dict | None, task: str) -> str:
    if not results:
        return "-"
    return f"{results['test']['ppl']:.2f}" if task == "lm" else f"{results['test']['bleu']:.2f}"


def table(task: str, teacher: Run, students: list) -> list:
    what = "test perplexity (PTB)" if task == "lm" else "test BLEU (LibreOffice en-de)"
    teacher_results = read_json(os.path.join(teacher.out_dir, "results.json"))
    measured = read_json(os.path.join(students[-1].out_dir, "machine.json"))
    lines = [f"Measured on {measured['device']} ({measured['threads']} thread{'s' * (measured['threads'] != 1)}), "
             f"{measured['date']}.", "",
             f"| {task.upper()} {what} | after the swap | after transfer | after finetuning | transfer + finetuning "
             f"minutes |", "|---|---|---|---|---|",
             f"| softmax teacher | - | - | {score(teacher_results, task)} | {teacher_results['train_minutes']:.1f} |"]
    for run in students:
        results = read_json(os.path.join(run.out_dir, "results.json"))
        swap = read_json(os.path.join(run.out_dir, "after_swap.json"))
        transfer = results.get("after_transfer")
        minutes = f"{transfer['train_minutes']:.1f} + {results['train_minutes'] - transfer['train_minutes']:.1f}" \
            if transfer else f"{results['train_minutes']:.1f}"
        lines.append(f"| {run.row['model']} | {score(swap, task)} | {score(transfer, task)} | {score(results, task)} "
                     f"| {minutes} |")
    return lines


def write_report(path: str, tables: list, quick: bool):
    m = machine()
    text = ["# Conversion since T2R: attention transfer and a sliding window", "",
            f"`python -m experiments.conversion{' --quick' if quick else ''}` (torch {m['torch']}), report written "
            f"{m['date']}. Same finetuning budget in every row (the trainers' defaults); the transfer stage comes on "
            f"top of it.", ""]
    for lines in tables:
        text += lines + [""]
    with atomic_write(path) as tmp, open(tmp, "w") as f:
        f.write("\n".join(text))
    print("\n".join(text))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=["lm", "mt", "both"], default="both", help="which trainer's job to convert")
    p.add_argument("--quick", action="store_true", help="toy sizes, into out/conversion-quick")
    p.add_argument("--dry_run", action="store_true", help="print the plan only")
    p.add_argument("--out", default=None, help="where the runs go (default out/conversion, or out/conversion-quick)")
    args = p.parse_args(argv)
    out = args.out or os.path.join(ROOT, "out", "conversion-quick" if args.quick else "conversion")
    for task in (["lm", "mt"] if args.task == "both" else [args.task]):
        teacher, students = plan(task, out, args.quick)
        execute([teacher], args.dry_run)
        if args.dry_run:
            execute(students, True)
            continue
        for run in students:
            swap = after_swap(task, run)
            print(f"{run.name}: after the swap, test {score(swap, task)}")
        execute(students, False)
    # the report: every task whose runs are all finished, whichever --task this invocation ran
    plans = [plan(task, out, args.quick) for task in ("lm", "mt")]
    tables = [table(task, teacher, students) for task, (teacher, students) in zip(("lm", "mt"), plans)
              if all(run_state(r.out_dir) == "done" for r in [teacher, *students])]
    if tables and not args.dry_run:
        report = os.path.join(out, "conversion.md") if args.quick else os.path.join(ROOT, "results", "conversion.md")
        write_report(report, tables, args.quick)


if __name__ == "__main__":
    run_main(main)
