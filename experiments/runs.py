"""
A run of the study and where it stands: what it is (Run: its script, flags, table row and probes) and its state, read
from its out_dir's files alone (todo, interrupted, shorter, done, or probe). experiments/study.py plans and trains
the runs; experiments/gather.py, experiments/conversion.py and experiments/from_scratch.py read the finished ones.

    python -m experiments.study --dry_run            # every run of the plan and its state
"""

import json
import os
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Run:
    name: str  # the out_dir's last component
    script: str  # train_lm.py or train_mt.py
    flags: dict = field(default_factory=dict)  # flag name (no dashes) -> value; True for a switch
    row: dict = field(default_factory=dict)  # what the results tables say about this run (model, init, k, seed)
    probes: list = field(default_factory=list)  # (file written into out_dir, argv): what reads it once trained

    @property
    def out_dir(self) -> str:
        return self.flags["out_dir"]


def run_state(out_dir: str, max_steps: int | None = None) -> str:
    """done, interrupted, or todo; "shorter" where the run finished with fewer than the plan's `max_steps` (a
    translator, whose schedule ignores its length, then trains on: see train_mt.py)."""
    if os.path.isfile(os.path.join(out_dir, "results.json")):
        saved = os.path.join(out_dir, "args.json")
        trained = read_json(saved).get("max_steps") if os.path.isfile(saved) else None
        return "shorter" if max_steps and trained and trained < max_steps else "done"
    if os.path.isfile(os.path.join(out_dir, "ckpt.pt")):
        return "interrupted"
    return "todo"


def trained(run: Run) -> str:
    """The run's training against the plan: a finished translator given more steps is "shorter" (a language model's
    cosine schedule ends at its --max_steps: train_lm.py refuses to train one on)."""
    return run_state(run.out_dir, run.flags.get("max_steps") if run.script == "train_mt.py" else None)


def state(run: Run) -> str:
    """trained() but "probe" for a trained run whose probes have not all written their files."""
    done = trained(run)
    return "probe" if done == "done" and missing_probes(run) else done


def missing_probes(run: Run) -> list:
    return [(name, argv) for name, argv in run.probes if not os.path.isfile(os.path.join(run.out_dir, name))]


def read_json(path: str):
    with open(path) as f:
        return json.load(f)


def shorten(path: str) -> str:
    return os.path.relpath(path, ROOT) if path.startswith(ROOT) else path
