"""
Convert, or train a fast RNN from scratch? SRU++ (Lei, 2021) beside T2R on the default PTB job, measured.

    python -m experiments.from_scratch               # the runs (finished ones skipped), the bench, the report
    python -m experiments.from_scratch --dry_run     # the plan: every run, its command, done or not
    python -m experiments.from_scratch --quick       # toy sizes (a few minutes), into out/from-scratch-quick

Rows: the softmax teacher, T2R from scratch, T2R + pretrain (the teacher converted and finetuned), SRU++ with
attention in every layer and in the top layer only; every model from scratch gets the teacher's budget
(train_lm.py's defaults: 1200 steps of 8 x 512 tokens). Quality and training minutes come from the runs; decoding
speed and state size from one bench.py run at the same width and depth (random weights: speed does not depend on
them), so those columns compare on one machine at one time. The report is results/from_scratch.md.
"""


if __package__ in (None, ""):  # run as a file: the project's modules are found from its root, as a module
    raise SystemExit("error: run it from the repository's root as a module: python -m experiments.from_scratch")

import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from experiments.records import machine
from experiments.runs import Run, read_json, run_state
from experiments.study import execute
from support.runtime import UserError, atomic_write, run_main

# row name -> (train_lm.py flags, the bench.py model that decodes like it)
ROWS = {
    "softmax (teacher)": ({"out_dir": "out/ptb-softmax-random"}, "softmax_kv"),
    "T2R from scratch": ({"attn": "t2r", "out_dir": "out/ptb-t2r-random"}, "t2r32"),
    "T2R + pretrain": ({"init": "pretrained", "out_dir": "out/conversion/lm-t2r"}, "t2r32"),
    "SRU++, attention in every layer": ({"arch": "sru++", "out_dir": "out/ptb-sru++-random"}, "sru++"),
    "SRU++, attention in the top layer": ({"arch": "sru++", "attn_every": 4, "out_dir": "out/ptb-sru++every4-random"},
                                          "sru++_top"),
}
QUICK = dict(n_layer=2, d_model=32, block_size=64, batch_size=4, eval_context=64, eval_score=32, eval_windows=4,
             eval_interval=10, max_steps=10)
BENCH_LENGTHS = (512, 4096)


def plan(out: str, quick: bool) -> list:
    """The runs, in order: T2R + pretrain needs the teacher."""
    runs = []
    for name, (flags, _) in ROWS.items():
        flags = dict(flags)
        if quick:
            flags["out_dir"] = os.path.join(out, os.path.basename(flags["out_dir"]))
            flags.update({k: v for k, v in QUICK.items() if not (flags.get("init") and k in ("n_layer", "d_model"))})
            if flags.get("attn_every"):
                flags["attn_every"] = QUICK["n_layer"]
        else:
            flags["out_dir"] = os.path.join(ROOT, flags["out_dir"])
        if flags.get("init") == "pretrained":
            flags["pretrained"] = os.path.join(runs[0].out_dir, "model.pt")
        runs.append(Run(name, "train_lm.py", flags, dict(model=name)))
    return runs


def bench(out_dir: str, quick: bool, dry_run: bool) -> str:
    """bench.py's generation and state tables for the rows' models (bench.csv in out_dir), once."""
    path = os.path.join(out_dir, "bench.csv")
    lengths = "32,64" if quick else ",".join(map(str, BENCH_LENGTHS))
    cmd = [sys.executable, os.path.join(ROOT, "bench.py"), "--only", "gen,memory,train_lm", "--models",
           ",".join(sorted({model for _, model in ROWS.values()})), "--lengths", lengths, "--batch_sizes", "1",
           "--memory_length", lengths.split(",")[-1], "--train_lengths", lengths.split(",")[0],
           "--out_dir", os.path.relpath(out_dir, ROOT)] + (["--quick"] if quick else [])  # run from ROOT
    print(f"bench: {'done' if os.path.isfile(path) else 'todo'} | {' '.join(cmd[1:])}", flush=True)
    if not dry_run and not os.path.isfile(path):
        if subprocess.run(cmd, cwd=ROOT).returncode != 0:
            raise UserError("bench.py failed: see its output above, then rerun this command")
    return path


# -----------------------------------------------------------------------------
# The report

def bench_values(path: str) -> dict:
    """(section, model, length, metric) -> value from bench.csv (batch 1)."""
    import csv
    with open(path, newline="") as f:
        return {(r["section"], r["model"], int(r["length"]), r["metric"]): float(r["value"])
                for r in csv.DictReader(f) if r["batch"] == "1"}


def parameters(out_dir: str) -> int:
    """The finished model's parameter count (tied embeddings counted once)."""
    from support.checkpoints import load_checkpoint, model_from_checkpoint
    path = os.path.join(out_dir, "model.pt")
    return sum(p.numel() for p in model_from_checkpoint(load_checkpoint(path), path).parameters())


def table(runs: list, bench_csv: str, lengths: tuple) -> list:
    got = bench_values(bench_csv)
    short, long = lengths
    lines = [f"| model | parameters | test ppl | train minutes (threads) | train ms / step of {short} tokens | "
             f"decode tok/s at {short} | at {long} | state bytes at {long} |", "|---|---|---|---|---|---|---|---|"]
    for run in runs:
        results = read_json(os.path.join(run.out_dir, "results.json"))
        threads = read_json(os.path.join(run.out_dir, "machine.json")).get("threads", "?")
        model = ROWS[run.name][1]
        train_name = {"softmax_kv": "softmax_sdpa", "t2r32": "t2r_chunked"}.get(model, model)
        minutes = f"{results['train_minutes']:.1f}" + (" + the teacher's" if run.flags.get("init") else "")
        lines.append(f"| {run.name} | {parameters(run.out_dir):,} | {results['test']['ppl']:.2f} | {minutes} "
                     f"({threads}) | {got[('train_lm', train_name, short, 'ms')]:.0f} | "
                     f"{got[('gen', model, short, 'tokens_per_s')]:.0f} | "
                     f"{got[('gen', model, long, 'tokens_per_s')]:.0f} | "
                     f"{got[('memory', model, long, 'state_bytes')]:,.0f} |")
    return lines


def write_report(path: str, runs: list, bench_csv: str, lengths: tuple, quick: bool):
    m = machine()
    text = ["# Convert, or train an RNN from scratch: SRU++ beside T2R", "",
            f"`python -m experiments.from_scratch{' --quick' if quick else ''}` on {m['device']}, torch {m['torch']}, "
            f"report written {m['date']}. Runs: PTB, train_lm.py's defaults; the bench columns: `bench.py` at batch 1 "
            f"with the same width and depth ({os.path.relpath(bench_csv, ROOT)}). Train minutes are wall time over "
            f"the sessions a run took, on a machine that may have done other work beside it: the bench columns, "
            f"every model measured in one run, one after another, are the speeds to compare.", ""]
    text += table(runs, bench_csv, lengths)
    with atomic_write(path) as tmp, open(tmp, "w") as f:
        f.write("\n".join(text) + "\n")
    print("\n".join(text))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="toy sizes, into out/from-scratch-quick")
    p.add_argument("--dry_run", action="store_true", help="print the plan only")
    p.add_argument("--out", default=None, help="where the quick runs go (default out/from-scratch-quick)")
    args = p.parse_args(argv)
    out = args.out or os.path.join(ROOT, "out", "from-scratch-quick")
    runs = plan(out, args.quick)
    # SRU++ first, the rows no other experiment measures; the sort is stable, so the teacher stays before its student
    execute(sorted(runs, key=lambda r: r.flags.get("arch") != "sru++"), args.dry_run)
    bench_dir = os.path.join(out, "bench") if args.quick else os.path.join(ROOT, "results", "bench-from-scratch")
    bench_csv = bench(bench_dir, args.quick, args.dry_run)
    if not args.dry_run and all(run_state(r.out_dir) == "done" for r in runs):
        lengths = (32, 64) if args.quick else BENCH_LENGTHS
        report = os.path.join(out if args.quick else os.path.join(ROOT, "results"), "from_scratch.md")
        write_report(report, runs, bench_csv, lengths, args.quick)


if __name__ == "__main__":
    run_main(main)
