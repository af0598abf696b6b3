"""Tests of the recall probe (experiments/recall.py): the probes repeat their span, the accuracy scores the right
positions (an oracle scores 1, a model one token late scores 0), the script runs on trained models, and the report
says when the teacher itself does not copy.

    python -m pytest -q -s test_recall.py
"""

import csv
import os
import sys

import pytest
import torch
import torch.nn.functional as F

import job
import train_lm
from conftest import ROOT, run, write_corpus
from data import load_corpus
from runtime import UserError

sys.path.insert(0, os.path.join(ROOT, "experiments"))
import gather  # noqa: E402
import probes  # noqa: E402
import recall  # noqa: E402
import repeat_corpus  # noqa: E402
import report  # noqa: E402
import study  # noqa: E402

SPAN, DISTANCE, V = 5, 7, 50


def test_a_probe_is_a_span_the_text_after_it_and_the_span_again():
    ids = torch.arange(1000)
    x = recall.probes(ids, DISTANCE, SPAN, samples=4, seed=0)
    assert x.shape == (4, 2 * SPAN + DISTANCE)
    assert torch.equal(x[:, :SPAN], x[:, -SPAN:])
    assert torch.equal(x[:, 1: SPAN + DISTANCE] - x[:, : SPAN + DISTANCE - 1], torch.ones(4, SPAN + DISTANCE - 1,
                                                                                          dtype=torch.long))
    assert torch.equal(x, recall.probes(ids, DISTANCE, SPAN, samples=4, seed=0))  # the same places for every model


class Predicts:
    """A stand-in model whose top prediction at position t is the probe's token at t + shift."""

    def __init__(self, x, shift):
        self.x, self.shift = x, shift

    def __call__(self, inputs):
        target = torch.roll(self.x, -self.shift, dims=1)[:, : inputs.shape[1]]
        return F.one_hot(target, V).float()


@pytest.mark.parametrize("shift, expected", [(1, (1.0, 1.0)), (0, (0.0, 0.0))], ids=["oracle", "one-late"])
def test_the_accuracy_scores_the_spans_next_tokens(shift, expected):
    x = recall.probes(torch.randperm(V), DISTANCE, SPAN, samples=3, seed=1)  # no token twice in the text
    assert recall.accuracies(Predicts(x, shift), x, SPAN, batch_size=3) == expected


def test_the_script_probes_every_model_on_the_same_sequences(tmp_path, monkeypatch):
    corpus = write_corpus(str(tmp_path / "tiny"))
    flags = ["--dataset", corpus, "--n_layer", "1", "--d_model", "16", "--n_head", "2", "--block_size", "16",
             "--max_steps", "2", "--eval_context", "16", "--eval_score", "8", "--eval_windows", "2"]
    monkeypatch.chdir(tmp_path)  # the two models trained in this process, for speed
    for extra in (["--out_dir", "softmax"], ["--attn", "t2r", "--feature_size", "4", "--out_dir", "t2r"]):
        job.main_job(train_lm.LMTask, train_lm.get_args([*flags, *extra]))
    out = run("experiments/recall.py", "--ckpt", "softmax/model.pt", "--ckpt", "t2r/model.pt", "--distances", "4,16",
              "--samples", "8", "--span", "4", "--out", "recall.csv", cwd=tmp_path).stdout
    print(out)
    with open(tmp_path / "recall.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["model"], r["distance"]) for r in rows] == [("softmax", "4"), ("softmax", "16"), ("t2r", "4"),
                                                           ("t2r", "16")]
    assert all(0 <= float(r["repeat_accuracy"]) <= 1 for r in rows)


def test_too_short_a_split_is_refused():
    with pytest.raises(UserError, match="too few for 64 probes of 4128 tokens"):
        recall.probes(torch.arange(3000), 4096, 16, samples=64, seed=0)


@pytest.mark.parametrize("teacher_repeat, reading", [(0.9, "The softmax teacher copies"),
                                                     (0.21, "The softmax teacher does not copy")])
def test_the_report_says_whether_the_teacher_copies(teacher_repeat, reading):
    """0.21 against 0.20 over 64 x 15 tokens is within two standard errors of the difference (0.018): no copying."""
    rows = [dict(model=m, distance=d, span=16, samples=64, repeat_accuracy=a, first_accuracy=0.2)
            for m, a in (("softmax", teacher_repeat), ("t2r+pretrain", 0.2)) for d in (8, 64)]
    text = "\n".join(report.recall_section({"recall": rows}, lambda *names: []))
    print(next(line for line in text.splitlines() if "teacher" in line))
    assert reading in text


def test_every_fourth_line_is_followed_by_a_random_span_that_comes_again_within_three_lines():
    lines = [f"line{i} text" for i in range(40)]
    out = repeat_corpus.with_random_spans(lines, every=4, back=3, words=4, seed=1)
    text = set(lines)
    assert [line for line in out if line in text] == lines and len(out) == 40 + 2 * 10
    for i in range(3, 40, 4):
        j = out.index(lines[i])
        span = out[j + 1].split()
        assert 2 <= len(span) <= 6 and set(span) <= {w for line in lines for w in line.split()}
        copy = out.index(out[j + 1], j + 2)
        assert sum(line in text for line in out[j + 2: copy]) <= 2  # 0 to back - 1 lines of text between


def test_the_repeat_corpus_keeps_ptbs_validation_and_test_text(tmp_path):
    repeat_corpus.main(["--out", str(tmp_path)])
    ptb = load_corpus("ptb")
    assert all((tmp_path / f"{split}.txt").read_text() == ptb[split] for split in ("valid", "test"))
    train = (tmp_path / "train.txt").read_text().splitlines()
    assert len(train) == len(ptb["train"].splitlines()) * (repeat_corpus.EVERY + 2) // repeat_corpus.EVERY


def test_the_copy_plan_is_the_recall_rows_trained_on_the_repeat_corpus(tmp_path):
    plan = study.copy_runs(str(tmp_path), study.LM_SIZES["full"])
    assert [(r.row["model"], r.row["init"]) for r in plan] == list(probes.RECALL_ROWS)
    assert all(r.flags["dataset"] == repeat_corpus.REPEATS_DIR and r.out_dir.startswith(str(tmp_path / "copy" / "lm"))
               for r in plan)
    assert plan[1].flags["pretrained"] == os.path.join(plan[0].out_dir, "ckpt.pt")  # its own teacher


def test_the_recall_table_names_each_models_training_text(tmp_path):
    lm_plan = study.lm_runs(str(tmp_path), study.LM_SIZES["quick"])
    copy_plan = study.copy_runs(str(tmp_path), study.LM_SIZES["quick"])
    for plan, accuracy in ((lm_plan, 0.2), (copy_plan, 0.9)):  # each run's probe writes its own file
        os.makedirs(plan[0].out_dir)
        for name, text in (("results.json", "{}"), ("recall.csv", "model,distance,span,samples,repeat_accuracy,"
                                                    f"first_accuracy\nsoftmax,8,16,64,{accuracy},0.2\n")):
            with open(os.path.join(plan[0].out_dir, name), "w") as f:
                f.write(text)
    rows = [{k: report.cell(v) for k, v in row.items()} for row in gather.recall_rows(lm_plan, copy_plan)]
    text = "\n".join(report.recall_section({"recall": rows}, lambda *names: []))
    print(text)
    assert "| softmax | 0.20 (0.20) |" in text and "| softmax (trained with repeated spans) | 0.90 (0.20) |" in text
    assert "**The softmax teacher does not copy**" in text
    assert "The softmax teacher (trained with repeated spans) copies" in text


@pytest.mark.parametrize("every, back, words, text", [
    (2, 8, 16, "a line of 8 to 24 random words after every 2 training lines, repeated 0 to 7 lines of text after it"),
    (1, 1, 32, "a line of 16 to 48 random words after every training line, repeated right after it")])
def test_the_report_describes_the_corpus_from_its_flags(every, back, words, text):
    assert repeat_corpus.layout(every, back, words) == text
