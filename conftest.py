"""Helpers shared by the tests: run a script as a user would, check a one-line error, report a difference,
write a tiny word corpus. pytest loads this file before any test file; tests import the names they use.

CPU only, tiny sizes, no downloads.
"""

import os
import random
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.abspath(__file__))

# A language model small enough to train a few steps in a second (train_lm.py flags).
TINY = ["--n_layer", "2", "--n_head", "2", "--d_model", "32", "--d_ff", "64", "--block_size", "32",
        "--batch_size", "4", "--eval_context", "32", "--eval_score", "16", "--eval_interval", "4",
        "--eval_windows", "4", "--log_interval", "2", "--feature_size", "8", "--chunk_size", "8"]


def run(script, *args, cwd, check=True, extra_env=None, stdin=None):
    """python <script> <args> in cwd, one thread, as a subprocess; raises with its output if it fails."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(extra_env or {})}
    result = subprocess.run([sys.executable, os.path.join(ROOT, script), *args], cwd=cwd, env=env, input=stdin,
                            capture_output=True, text=True, timeout=300)
    if check and result.returncode != 0:
        raise AssertionError(f"{script} {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def assert_one_line_error(result, *fragments):
    """Exit status 2 and exactly one line on stderr, starting with 'error: ' and containing each fragment."""
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    print(lines[0])


def report(name, diff) -> float:
    """Print a maximum difference (the tests print every one they check) and return it as a float."""
    diff = float(diff.detach()) if torch.is_tensor(diff) else float(diff)
    print(f"{name}: max |diff| = {diff:.3e}")
    return diff


def write_corpus(folder, seed=0, words=40, lines=(600, 60, 60)):
    """train/valid/test.txt of random lines over `words` words: a folder dataset for train_lm.py."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(words)]
    os.makedirs(folder, exist_ok=True)
    for split, n in zip(("train", "valid", "test"), lines):
        with open(os.path.join(folder, f"{split}.txt"), "w") as f:
            for _ in range(n):
                f.write(" ".join(rng.choice(vocab) for _ in range(rng.randint(3, 12))) + "\n")
    return folder


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(str(tmp_path / "tiny"))
