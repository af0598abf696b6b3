"""experiments/hf_recipe.py at --quick: teachers trained with transformers, converted by train_lm.py, each teacher's
perplexity by transformers equal to ours, and a second run reads what the first trained."""

import csv

import pytest

from conftest import run_in_process
from experiments import hf_recipe


def test_the_recipe_sweep_runs_and_its_teachers_are_measured_as_their_owners_would(tmp_path):
    first = run_in_process("experiments.hf_recipe", "--quick", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    with open(tmp_path / "out/hf-recipe-quick/hf_recipe.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    print(first.stdout[-1200:])
    assert [(r["family"], r["variant"]) for r in rows][:len(hf_recipe.plan(True))] == \
        [(family, name) for family, name, _ in hf_recipe.plan(True)]
    for r in rows:  # the tokenizer's own ids, the same model, the same protocol: the same number
        assert float(r["teacher_valid_ppl"]) == pytest.approx(float(r["owner_valid_ppl"]), rel=1e-4), r
    again = run_in_process("experiments.hf_recipe", "--quick", cwd=tmp_path)
    assert again.returncode == 0 and "--- " not in again.stdout and "teacher step" not in again.stdout
