"""experiments/hf_recipe.py at --quick: teachers trained with transformers, converted by train_lm.py, each teacher's
perplexity by transformers equal to ours, and a second run reads what the first trained."""

import csv
import os
import re

import pytest

import train_lm
from conftest import ROOT, run_in_process
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


def test_an_hf_conversion_defaults_to_the_recipe_the_sweep_measured():
    with open(os.path.join(ROOT, "results", "hf_recipe.csv"), newline="") as f:
        llama = [r for r in csv.DictReader(f) if r["family"] == "llama" and not r["variant"].startswith(("recipe",
                                                                                                         "control"))]
    linear = [r for r in llama if r["attn"] == "t2r" and r["keep_softmax_every"] == "0"]  # no KV cache left
    best = min(linear, key=lambda r: float(r["valid_ppl"]))
    args = train_lm.get_args(["--init", "pretrained", "--pretrained", "hf:any/folder"])
    assert (args.max_steps, args.lr, args.transfer_steps) == (int(best["steps"]), float(best["lr"]),
                                                              int(best["transfer"])), best


def test_given_steps_and_rate_win_over_the_recipe():
    args = train_lm.get_args(["--init", "pretrained", "--pretrained", "hf:any/folder", "--max_steps", "50", "--lr",
                              "3e-4", "--transfer_steps", "7"])
    assert (args.max_steps, args.lr, args.transfer_steps) == (50, 3e-4, 7)


@pytest.mark.parametrize("flags", [["--attn", "softmax"], ["--attn", "elu"], ["--freeze_feature_map"]])
def test_the_recipes_transfer_is_for_t2r_feature_maps_that_train(flags):  # softmax has none; elu's has no weights
    args = train_lm.get_args(["--init", "pretrained", "--pretrained", "hf:any/folder", *flags])
    assert (args.max_steps, args.transfer_steps) == (train_lm.HF_RECIPE["max_steps"], 0)


def test_a_project_teacher_keeps_the_papers_finetuning_schedule():
    args = train_lm.get_args(["--init", "pretrained"])
    assert (args.max_steps, args.lr) == (train_lm.SCHEDULES["pretrained"]["max_steps"],
                                         train_lm.SCHEDULES["pretrained"]["lr"])


def test_the_recipe_pages_figures_are_the_tables():
    """Every perplexity results/hf_recipe.md gives is one of results/hf_recipe.csv's, to two decimals."""
    page = open(os.path.join(ROOT, "results", "hf_recipe.md"), encoding="utf-8").read()
    with open(os.path.join(ROOT, "results", "hf_recipe.csv"), newline="") as f:
        table = {f"{float(r[c]):.2f}" for r in csv.DictReader(f) for c in ("owner_valid_ppl", "teacher_valid_ppl",
                                                                           "valid_ppl")}
    figures = re.findall(r"\b\d+\.\d\d\b", page)
    assert len(figures) >= 20 and set(figures) <= table, set(figures) - table


def test_an_hf_t2r_conversion_takes_the_parts_since_t2r_measured_best_on_the_recipes_llama():
    """HF_PARTS follows results/since_t2r.csv by experiments/since_t2r.py's rule (set before the last hf: runs): the
    all-linear recipe of the lowest test perplexity, or one with fewer parts within HF_NEAR of it."""
    from experiments.since_t2r import HF_NEAR, RECIPES
    with open(os.path.join(ROOT, "results", "since_t2r.csv"), newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["task"] == "hf-llama" and r["softmax_layers"] == "0"]
    best = min(rows, key=lambda r: float(r["value"]))
    near = [r for r in rows if float(r["value"]) <= (1 + HF_NEAR) * float(best["value"])]
    chosen = min(near, key=lambda r: (len(RECIPES[r["recipe"]]), float(r["value"])))
    args = train_lm.get_args(["--init", "pretrained", "--pretrained", "hf:any/folder"])
    parts = {name: getattr(args, name) for name in ("decay", "short_conv", "distill_weight")}
    assert parts == {"decay": "decay" in chosen["recipe"], "short_conv": 4 if "conv4" in chosen["recipe"] else 0,
                     "distill_weight": 0.5 if "distill" in chosen["recipe"] else 0.0}, chosen


@pytest.mark.parametrize("flags", [["--no-decay"], ["--attn", "softmax"], ["--attn", "elu"], ["--window", "8"]])
def test_the_recipes_decaying_state_is_for_t2r_and_can_be_turned_off(flags):
    args = train_lm.get_args(["--init", "pretrained", "--pretrained", "hf:any/folder", *flags])
    assert args.decay is False
