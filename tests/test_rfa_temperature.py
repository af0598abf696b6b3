"""experiments/rfa_temperature.py on tiny random teachers: the temperature it reads off a teacher is the one at which
RFA's exact kernel comes closest, the kernel it calls exact is the one RFAFeatureMap estimates, and the command writes
its table or refuses bad input in one line.

    python -m pytest -q -s tests/test_rfa_temperature.py
"""

import csv
import os

import pytest
import torch

from conftest import assert_flags_refused, assert_one_line_error, lm_config, make, run_in_process, write_corpus
from experiments.rfa_temperature import COLUMNS, get_args, measure
from support import data
from support.checkpoints import save_checkpoint
from t2r import TransformerLM


def sharp_teacher(q_k_std: float = 0.5, seed: int = 0):
    """A tiny softmax LM (2 layers, 2 heads of 8) whose W_q, W_k are large: logits q.k / sqrt(d) of about 10, as a
    trained teacher's, where the initialisation's std of 0.02 gives a near-uniform attention."""
    model = make(TransformerLM, lm_config(), seed=seed)
    with torch.no_grad():
        for layer in model.layers:
            layer.self_attn.q_proj.weight.normal_(std=q_k_std)
            layer.self_attn.k_proj.weight.normal_(std=q_k_std)
    return model


def windows(n: int = 4, length: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 37, (n, length), generator=torch.Generator().manual_seed(seed))


def rows_of(rows, **match):
    return [r for r in rows if all(r[key] == value for key, value in match.items())]


def test_the_exact_kernel_is_closer_at_a_sharp_teachers_implied_tau_than_at_1():
    rows = measure(sharp_teacher(), windows(), taus=(1.0,), feature_size=8, t2r_feature_size=8, draws=2)
    for at_one in rows_of(rows, features="exact", tau=1.0):
        at = dict(layer=at_one["layer"], head=at_one["head"])
        implied = rows_of(rows, features="exact", tau_source="implied", **at)[0]
        print(f"layer {at['layer']} head {at['head']}: implied tau {implied['tau']}, error {implied['error_mean']:.3f}"
              f" against {at_one['error_mean']:.3f} at tau = 1")
        assert implied["tau"] < 1 and implied["error_mean"] < 0.75 * at_one["error_mean"], (implied, at_one)


@pytest.mark.parametrize("tau", [1.0, 0.7])
def test_many_projections_estimate_what_the_table_calls_rfas_exact_kernel(tau):
    # 20,000 projections: each estimated weight's standard deviation is about 1 / sqrt(2 D) = 0.005, against weights
    # exp((cos - 1) / tau^2) of about e^-2 = 0.14 at tau = 0.7 for keys at right angles: some percent of a weight, and
    # less once averaged into the outputs. A kernel of tau instead of tau^2 (or another scale) would differ at 0.7 by
    # the errors' own size (0.1 or more between neighbouring taus here).
    rows = measure(sharp_teacher(), windows(n=2, length=16), taus=(tau,), feature_size=40_000, t2r_feature_size=8,
                   draws=1)
    for exact in rows_of(rows, features="exact", tau_source="grid"):
        at = dict(layer=exact["layer"], head=exact["head"])
        estimate = rows_of(rows, features="rfa", tau_source="grid", **at)[0]
        gap = abs(estimate["error_mean"] - exact["error_mean"])
        print(f"tau {tau}, layer {at['layer']} head {at['head']}: rfa {estimate['error_mean']:.4f}, "
              f"exact {exact['error_mean']:.4f}")
        assert gap < 0.015, (estimate, exact)


def test_the_command_writes_a_row_for_each_layer_head_features_and_tau(tmp_path):
    corpus = write_corpus(str(tmp_path / "tiny"))
    cache = str(tmp_path / "cache")
    vocab_size = data.prepare(corpus, cache_dir=cache).vocab_size
    model = make(TransformerLM, lm_config(vocab_size=vocab_size))
    teacher = str(tmp_path / "teacher.pt")
    save_checkpoint(teacher, dict(model=model.float().state_dict(), config=model.config.to_dict(),
                                  args=dict(dataset=corpus, tokenizer="word", cache_dir=cache)))
    table = str(tmp_path / "rfa_temperature.csv")
    run_in_process("experiments.rfa_temperature", "--teacher", teacher, "--windows", "2", "--context", "16",
                   "--taus", "0.5,1", "--draws", "2", "--csv", table, cwd=str(tmp_path), check=True)
    with open(table) as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == COLUMNS
        rows = list(reader)
    # per layer and head: exact and rfa at 2 taus and the implied one, then t2r, elu and uniform
    assert len(rows) == 2 * 2 * (2 * 3 + 3), len(rows)
    assert {r["features"] for r in rows} == {"exact", "rfa", "t2r", "elu", "uniform"}
    assert all(r["error_mean"] and r["implied_tau"] and r["logit_range"] for r in rows)


def test_a_missing_teacher_is_a_one_line_error(tmp_path):
    result = run_in_process("experiments.rfa_temperature", "--teacher", str(tmp_path / "none.pt"),
                            "--csv", str(tmp_path / "t.csv"), cwd=str(tmp_path))
    assert_one_line_error(result, "no checkpoint at")
    assert not os.path.exists(tmp_path / "t.csv")


@pytest.mark.parametrize("argv, message", [(["--feature_size", "7"], "even k"),
                                           (["--taus", "0.5,-1"], "positive"),
                                           (["--draws", "0"], "positive integer"),
                                           (["--csv", "."], "is a folder")])
def test_bad_flags_are_refused_in_one_line(argv, message, capsys):
    assert_flags_refused(get_args, argv, message, capsys)


def test_the_results_page_explains_rfa_from_the_csv_and_only_where_it_is():
    from experiments.report import rfa_temperature
    assert rfa_temperature([]) == ""
    text = rfa_temperature([{"implied_tau": 0.41}, {"implied_tau": 0.36}, {"implied_tau": 0.45}])
    assert "implies tau 0.36-0.45 per head" in text and "say little about T2R" in text
