"""
bench.py runs end to end (--quick) and writes what its docstring promises; its helpers are right.

    python -m pytest -q test_bench.py        # about 50 s on a 2-core CPU, more on a slower machine
"""

import csv
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

import bench

# The CSV columns, as documented in bench.py's docstring.
EXPECTED_COLUMNS = ["section", "model", "batch", "length", "metric", "value", "unit", "device"]
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("bench")
    # one thread: the smoke test checks the pipeline, not the numbers, and must not fight other jobs for cores.
    # The timeout only guards against a hang; how long the run takes varies between CI machines.
    result = subprocess.run([sys.executable, "bench.py", "--quick", "--threads", "1", "--out_dir", str(out_dir)],
                            cwd=HERE, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    with open(out_dir / "bench.csv", newline="") as f:
        reader = csv.DictReader(f)
        return out_dir, reader.fieldnames, list(reader), result.stdout


def test_csv_columns_are_documented(quick_run):
    _, columns, rows, _ = quick_run
    print("bench.csv columns:", ",".join(columns))
    assert columns == EXPECTED_COLUMNS == bench.CSV_COLUMNS
    assert ",".join(EXPECTED_COLUMNS) in bench.__doc__
    assert rows


def test_every_model_has_positive_rows(quick_run):
    _, _, rows, _ = quick_run
    for r in rows:
        assert float(r["value"]) > 0, r
        assert int(r["batch"]) >= 1 and int(r["length"]) >= 1, r
    present = {(r["section"], r["model"]) for r in rows}
    expected = {("gen", m) for m in bench.LM_MODELS} | {("s2s", m) for m in bench.S2S_MODELS}
    expected |= {(s, m) for s in ("train_attn", "train_lm") for m in bench.TRAIN_MODELS}
    expected |= {("memory", m) for m in ("softmax_kv", "t2r32", "t2r4", "elu", "rfa32")}
    assert expected <= present, sorted(expected - present)
    metrics = {(r["section"], r["model"]): set() for r in rows}
    for r in rows:
        metrics[(r["section"], r["model"])].add(r["metric"])
    for m in bench.LM_MODELS:
        assert {"tokens_per_s", "latency_ms"} <= metrics[("gen", m)]
    for s in ("train_attn", "train_lm"):
        assert {"ms", "peak_bytes"} <= metrics[(s, "t2r_chunked")]


def test_measured_state_ratio_matches_theory(quick_run):
    _, _, rows, _ = quick_run
    got = {(r["model"], r["metric"]): float(r["value"]) for r in rows if r["section"] == "memory"}
    for model in ("t2r32", "t2r4", "elu", "rfa32"):
        assert got[(model, "kv_over_state")] == pytest.approx(got[(model, "kv_over_state_theory")], rel=1e-3)


def test_markdown_and_plots(quick_run):
    out_dir, _, _, stdout = quick_run
    text = (out_dir / "bench.md").read_text()
    assert "| target | measured | verdict |" in text and "| softmax_kv |" in text
    if importlib.util.find_spec("matplotlib") is not None:
        pngs = sorted(p.name for p in out_dir.glob("*.png"))
        assert {"gen_tokens_per_s.png", "gen_latency.png", "gen_memory.png", "train.png"} <= set(pngs), pngs
    else:
        assert "no plots" in stdout


def test_theory_ratio():
    # 2 N h / (r k (d + 1)): N=4096, h=256, r=4 heads of d=64, k=32 -> 2*4096*256 / (4*32*65) = 252.06
    assert bench.theory_ratio(4096, 256, 4, 32) == pytest.approx(252.06, abs=0.01)
    assert bench.theory_ratio(4096, 256, 4, 4) == pytest.approx(2016.49, abs=0.01)  # the translator's k=4
    assert bench.theory_ratio(4096, 1024, 8, 32) == pytest.approx(2 * 4096 * 128 / (32 * 129))  # the paper's LM


def test_peak_memory_counts_new_tensors_only():
    weight = torch.randn(256, 256)
    with bench.PeakMemory() as pm:
        a = torch.zeros(1024, 256)  # 1 MiB
        b = a @ weight  # another 1 MiB
        view = weight.t()  # a view of a tensor from before: nothing new
        del a, b, view
        c = torch.ones(512, 256)  # 0.5 MiB, after 2 MiB were freed
    assert pm.peak == 2 * 2 ** 20
    assert pm.current == 512 * 256 * 4
    del c


def test_bad_flags_are_one_line_errors(capsys):
    for argv in (["--bogus"], ["--only", "nope"], ["--lengths", "1,x"], ["--models", "gpt"], ["--repeats", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            bench.get_args(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and err.startswith("error:"), err


def test_quick_defaults():
    args = bench.get_args(["--quick"])
    assert max(args.lengths) <= 256 and args.recompute_max <= max(args.lengths)
    full = bench.get_args([])
    assert full.lengths == [2 ** i for i in range(7, 14)] and full.batch_sizes == [1, 16]
    assert full.s2s_lengths == full.lengths and full.s2s_batch == 16
