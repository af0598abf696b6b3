"""Tests of the recall probe (experiments/recall.py): the probes repeat their span, the accuracy scores the right
positions (an oracle scores 1, a model one token late scores 0), the script runs on trained models, and the report
says when the teacher itself does not copy.

    python -m pytest -q -s tests/test_recall.py
"""

import csv
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import train_lm
from conftest import run, write_corpus
from experiments import gather, recall, report, study
from generate import load_tokenizer
from support.runtime import UserError, model_from_checkpoint

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
        train_lm.main([*flags, *extra])
    out = run("experiments.recall", "--ckpt", "softmax/model.pt", "--ckpt", "t2r/model.pt", "--distances", "4,16",
              "--samples", "8", "--span", "4", "--out", "recall.csv", cwd=tmp_path).stdout
    print(out)
    with open(tmp_path / "recall.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["model"], r["distance"]) for r in rows] == [("softmax", "4"), ("softmax", "16"), ("t2r", "4"),
                                                           ("t2r", "16")]
    ids = torch.from_numpy(np.asarray(load_tokenizer(torch.load("softmax/model.pt", weights_only=True)).valid,
                                      dtype=np.int64))  # the validation split the script probed
    for row in rows:  # each accuracy against a brute-force count: every guess from a forward pass over its own prefix
        model = model_from_checkpoint(torch.load(f"{row['model']}/model.pt", weights_only=True)).eval()  # folder = row
        x = recall.probes(ids, int(row["distance"]), 4, 8, seed=0)
        with torch.no_grad():
            hits = [int(model(x[b:b + 1, :t])[0, -1].argmax()) == int(x[b, t])
                    for b in range(len(x)) for t in range(x.shape[1] - 3, x.shape[1])]
        assert float(row["repeat_accuracy"]) == round(sum(hits) / len(hits), 4), row


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


def test_the_recall_table_reads_the_probe_each_recall_run_wrote(tmp_path):
    plan = study.lm_runs(str(tmp_path), study.LM_SIZES["quick"])
    teacher = plan[0]
    os.makedirs(teacher.out_dir)
    for name, text in (("results.json", "{}"), ("recall.csv", "model,distance,span,samples,repeat_accuracy,"
                                                "first_accuracy\nsoftmax,8,16,64,0.9,0.2\n")):
        with open(os.path.join(teacher.out_dir, name), "w") as f:
            f.write(text)
    rows = [{k: report.cell(v) for k, v in row.items()} for row in gather.recall_rows(plan)]
    text = "\n".join(report.recall_section({"recall": rows}, lambda *names: []))
    print(text)
    assert "| softmax | 0.90 (0.20) |" in text and "The softmax teacher copies" in text
