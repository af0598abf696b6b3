"""
bench.py runs end to end (--quick, into out/bench-quick) and writes what its docstring promises; its instruments
(benchmarks/bench_tools.py, benchmarks/bench_report.py) and its ratios are right; bad flags
(benchmarks/bench_flags.py) are one-line errors.

    python -m pytest -q tests/test_bench.py  # about 20 s on a 2-core CPU, more on a slower machine
"""

import csv
import importlib.util
import os
import subprocess
from types import SimpleNamespace

import pytest
import torch

import bench
from benchmarks import bench_flags, bench_models, bench_report, bench_tools
from conftest import ROOT, assert_one_line_error, run, run_in_process
from t2r import Config, TransformerLM


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """`bench.py --quick --threads 1` in an empty folder, as a user runs it: no --out_dir. In this process (no torch
    import); one thread: the smoke test checks the pipeline, not the numbers, and must not fight other jobs for cores."""
    cwd = tmp_path_factory.mktemp("bench")
    result = run_in_process("bench.py", "--quick", "--threads", "1", cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(cwd / "out" / "bench-quick" / "bench.csv", newline="") as f:
        reader = csv.DictReader(f)
        return cwd, reader.fieldnames, list(reader), result.stdout


def test_quick_writes_under_out_not_results(quick_run):
    cwd, _, _, stdout = quick_run
    assert not (cwd / "results").exists()
    assert sorted(p.name for p in cwd.iterdir()) == ["out"]
    assert "wrote out/bench-quick/bench.csv, bench.md" in stdout


def test_quick_measures_the_first_token_by_prefill_and_by_steps(quick_run):
    """The prefill section: the time to the first token of each model at each length, read in one pass and a step a
    token (--quick leaves out the transformers baseline, which experiments/first_token.py's test builds)."""
    cwd, _, rows, _ = quick_run
    prefill = {(r["model"], int(r["length"])) for r in rows
               if r["section"] == "prefill" and r["metric"] == "first_token_ms"}
    models = {"softmax_kv", "softmax_kv_by_steps", "t2r32", "t2r32_by_steps"}
    assert prefill == {(m, L) for m in models for L in (8, 16)}
    assert "## Prefill: the time to the first token, batch 1" in (cwd / "out/bench-quick/bench.md").read_text()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_quick_run_on_cuda_in_bf16(tmp_path):
    """Every CUDA path of bench.py: bf16 generation, the CUDA graph, pairs, capacity, training under autocast."""
    gpu = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES") or "0"}  # run() hides it otherwise
    run("bench.py", "--quick", "--device", "cuda", "--dtype", "bfloat16", "--capacity_length", "256", "--out_dir",
        "b", cwd=tmp_path, extra_env=gpu)
    with open(tmp_path / "b" / "bench.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["device"] == "cuda" for r in rows)
    present = {(r["section"], r["model"]) for r in rows}
    assert {("gen", "t2r32_graph"), ("gen", "softmax_kv"), ("pairs", "t2r32/proj_only"), ("capacity", "t2r32"),
            ("train_attn", "t2r_chunked")} <= present, sorted(present)


def test_csv_columns_are_documented(quick_run):
    _, columns, rows, _ = quick_run
    print("bench.csv columns:", ",".join(columns))
    assert ",".join(columns) in bench.__doc__
    assert rows and all(r["device"] == "cpu" for r in rows)


def test_every_model_is_measured_in_its_sections(quick_run):
    _, _, rows, _ = quick_run
    present = {(r["section"], r["model"]) for r in rows}
    expected = {("gen", m) for m in [*bench.LM_MODELS, *bench.SRU_MODELS]  # graphs need CUDA; compiling, time
                if not m.endswith(("_graph", "_compiled"))}
    expected |= {("s2s", m) for m in bench.S2S_MODELS}
    expected |= {(s, m) for s in ("train_attn", "train_lm") for m in bench.TRAIN_MODELS
                 if m not in bench.SRU_MODELS and m != "t2r_fla"}  # fla's kernel: CUDA only
    expected |= {("train_lm", m) for m in bench.SRU_MODELS} | {("pairs", "t2r32/proj_only"), ("pairs", "t2r32")}
    expected |= {("memory", m) for m in ("softmax_kv", "t2r32", "t2r32_window64", "t2r4", "elu", "rfa32", "sru++",
                                         "sru++_top")}
    assert expected <= present, sorted(expected - present)
    metrics = {(r["section"], r["model"]): set() for r in rows}
    for r in rows:
        metrics[(r["section"], r["model"])].add(r["metric"])
    for m in [m for s, m in expected if s == "gen"]:
        assert {"tokens_per_s", "latency_ms"} <= metrics[("gen", m)]
    for s in ("train_attn", "train_lm"):
        assert {"ms", "peak_bytes"} <= metrics[(s, "t2r_chunked")]


def test_measured_state_ratio_matches_theory(quick_run):
    _, _, rows, _ = quick_run
    got = {(r["model"], r["metric"]): float(r["value"]) for r in rows if r["section"] == "memory"}
    for model in ("t2r32", "t2r32_window64", "t2r4", "elu", "rfa32", "sru++", "sru++_top"):  # caches included
        assert got[(model, "kv_over_state")] == pytest.approx(got[(model, "kv_over_state_theory")], rel=1e-3)


def test_a_t2r_state_is_the_same_size_at_every_length_and_grows_with_the_batch(quick_run):
    """Eq. 6's S (k x d_head) and z (k) for each of the 4 layers' 4 heads, in float32, d_head = 256 / 4, k = 32:
    counted here, against what bench.py measured on the state generation reached."""
    _, _, rows, _ = quick_run
    got = {(int(r["batch"]), int(r["length"])): float(r["value"]) for r in rows
           if (r["section"], r["model"], r["metric"]) == ("gen", "t2r32", "state_bytes")}
    print("t2r32 state bytes (batch, length):", got)
    assert got and all(size == batch * 4 * 4 * (32 * 64 + 32) * 4 for (batch, _), size in got.items())


def test_markdown_ratios_and_plots(quick_run):
    cwd, _, rows, stdout = quick_run
    out_dir = cwd / "out" / "bench-quick"
    text = (out_dir / "bench.md").read_text()
    assert "| ratio | measured | goal | verdict |" in text and "| softmax_kv |" in text and "## How it measures" in text
    for b in (1, 16):  # the paired rounds' median (lowest to highest), as the CSV has them
        start = f"| t2r32 step / proj_only step, batch {b}: paired rounds |"
        line = next(x for x in text.splitlines() if x.startswith(start))
        csv_row = lambda metric: next(float(r["value"]) for r in rows if (r["model"], r["batch"], r["metric"])
                                      == ("t2r32/proj_only", str(b), metric))
        expected = "{:.2f} ({:.2f} to {:.2f})".format(*map(csv_row, ("time_ratio", "time_ratio_min", "time_ratio_max")))
        assert line.split("|")[2].strip() == expected, line
    if importlib.util.find_spec("matplotlib") is not None:
        pngs = sorted(p.name for p in out_dir.glob("*.png"))
        assert {"gen_tokens_per_s.png", "gen_latency.png", "gen_memory.png", "s2s_crossover.png", "train.png"} \
            <= set(pngs), pngs
    else:
        assert "no plots" in stdout


def test_ratios_from_rows():
    rows = [bench.row("gen", model, 16, L, "tokens_per_s", tps, "tok/s")
            for model, L, tps in (("t2r32", 8192, 6000.0), ("softmax_kv", 8192, 500.0), ("proj_only", 8192, 6200.0))]
    rows += [bench.row("memory", "t2r32", 1, 4096, metric, v, "x")
             for metric, v in (("kv_over_state", 260.0), ("kv_over_state_theory", 252.06))]
    rows += bench_tools.ratio_rows("pairs", "t2r32/proj_only", 16, "time_ratio", [1.02, 0.97, 1.12])
    rows += bench_tools.ratio_rows("mt", "t2r/softmax", 16, "tokens_per_s_ratio", [1.3, 1.2, 1.1, 0.9, 1.25])
    args = SimpleNamespace(batch_sizes=[1, 16], memory_length=4096, quadratic_max=4096, device=torch.device("cpu"))
    got = {what: (measured, verdict) for what, measured, _, verdict in bench_report.ratios(rows, args)}
    print("\n".join(f"{w}: {m} {v}" for w, (m, v) in got.items()))
    assert got["t2r32 / softmax_kv tokens/s at 8192, batch 16"] == ("12.00", "MISS")  # the CPU's goal is 14
    assert got["t2r32 step / proj_only step, batch 16: paired rounds"] == ("1.02 (0.97 to 1.12)", "pass")
    assert got["t2r32 / softmax_kv tokens/s at 4096, batch 16"][1].startswith("n/a")
    assert got["translator greedy, test sentences: t2r / softmax tokens/s, batch 16: paired passes"] == \
        ("1.20 (0.90 to 1.30)", "pass")
    beam = "translator beam 5, test sentences: t2r / softmax tokens/s, batch 16: paired passes"
    assert got[beam][1].startswith("n/a")
    assert got["KV cache / t2r32 state at 4096 tokens, measured"] == ("260.00", "MISS")  # 3% off the theory


def test_a_gpu_has_its_own_goal():
    rows = [bench.row("gen", model, 16, 8192, "tokens_per_s", tps, "tok/s") for model, tps in (("t2r32", 6000.0),
                                                                                                ("softmax_kv", 500.0))]
    args = SimpleNamespace(batch_sizes=[16], memory_length=4096, quadratic_max=4096, device=torch.device("cuda"))
    got = {what: verdict for what, _, _, verdict in bench_report.ratios(rows, args)}
    assert got["t2r32 / softmax_kv tokens/s at 8192, batch 16"] == "pass"  # the GPU's goal is 10


def test_peak_memory_counts_new_tensors_only():
    weight = torch.randn(256, 256)
    with bench_tools.PeakMemory() as pm:
        a = torch.zeros(1024, 256)  # 1 MiB
        b = a @ weight  # another 1 MiB
        view = weight.t()  # a view of a tensor from before: nothing new
        del a, b, view
        c = torch.ones(512, 256)  # 0.5 MiB, after 2 MiB were freed
    assert pm.peak == 2 * 2 ** 20
    assert pm.current == 512 * 256 * 4
    del c


def test_explicit_flags_win_over_quick():
    args = bench_flags.get_args(["--quick", "--lengths", "32,4", "--out_dir", "elsewhere", "--repeats", "5"])
    assert (args.lengths, args.out_dir, args.repeats) == ([4, 32], "elsewhere", 5)
    assert args.s2s_lengths == bench_flags.int_list(bench_flags.QUICK["s2s_lengths"])  # a flag not given: --quick's
    assert bench_flags.get_args(["--only", "train,gen"]).only == ["train_attn", "train_lm", "gen"]


@pytest.mark.parametrize("flags, width, heads", [([], 256, 4), (["--d_model", "64", "--n_head", "2"], 64, 2)])
@pytest.mark.parametrize("name", ["softmax_sdpa", "t2r_chunked", "t2r_window64"])
def test_the_random_models_take_the_width_and_heads_of_the_flags(flags, width, heads, name, tmp_path):
    """--d_model and --n_head size every model bench.py builds (a GPU's arithmetic shows at 1024 and more)."""
    args = bench_flags.get_args([*flags, "--device", "cpu", "--out_dir", str(tmp_path)])
    args.device, args.ckpt_config, args.ckpt_state = torch.device("cpu"), None, None
    config = bench_models.lm_config(args)
    assert (config.d_model, config.n_head, config.d_ff) == (width, heads, 4 * width)
    layer = bench_models.train_model("train_attn", name, args)
    assert (layer.q_proj.in_features, layer.n_head) == (width, heads)
    lm = bench_models.train_model("train_lm", name, args)
    assert (lm.config.d_model, lm.layers[0].self_attn.q_proj.in_features, lm.layers[0].self_attn.n_head) == \
        (width, width, heads)


def test_the_defaults_follow_the_device(monkeypatch):
    """--device auto on a GPU: FULL_CUDA's batch sizes and lengths, and the capacity section (a CPU would swap, not
    run out of memory); on a CPU, FULL's and no capacity."""
    cpu = bench_flags.get_args(["--device", "cpu"])
    assert "capacity" not in cpu.only and cpu.batch_sizes == bench_flags.int_list(bench_flags.FULL["batch_sizes"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu = bench_flags.get_args([])
    assert "capacity" in gpu.only and gpu.batch_sizes == bench_flags.int_list(bench_flags.FULL_CUDA["batch_sizes"]) != \
        cpu.batch_sizes and gpu.train_lengths == bench_flags.int_list(bench_flags.FULL_CUDA["train_lengths"])
    assert bench_flags.get_args(["--batch_sizes", "256"]).batch_sizes == [256]


@pytest.mark.parametrize("attn, capacity", [("softmax", 64), ("t2r", None)])
def test_state_at_a_length_is_the_state_generation_reaches(attn, capacity):
    """state_at(state, n) holds what n steps leave: the position, and a KV cache of n entries in the capacity
    its doubling reached (64 for 40 tokens); a constant-size state is unchanged. The next step fits in it."""
    config = Config(vocab_size=50, n_layer=2, n_head=2, d_model=16, d_ff=32, dropout=0.0, attn=attn, feature_size=4)
    model = TransformerLM(config).eval()
    stepped = model.init_state(3)
    for _ in range(40):
        model.step(torch.zeros(3, dtype=torch.long), stepped)
    made = bench_tools.state_at(model.init_state(3), 40)
    assert made["pos"] == stepped["pos"] == 40
    for ours, theirs in zip(made["layers"], stepped["layers"]):
        assert {k: getattr(v, "shape", v) for k, v in ours["self"].items()} == \
            {k: getattr(v, "shape", v) for k, v in theirs["self"].items()}
    if capacity:
        assert made["layers"][0]["self"]["k"].shape[2] == capacity
        model.step(torch.zeros(3, dtype=torch.long), made)
        assert made["layers"][0]["self"]["k"].shape[2] == capacity  # written in place, not grown


@pytest.mark.parametrize("limit", [1, 7, 1000, 54321])
def test_largest_batch_finds_the_limit_within_a_64th(limit, monkeypatch):
    tried = []
    monkeypatch.setattr(bench_tools, "fits", lambda model, batch, length, device: tried.append(batch) or
                        batch <= limit)
    found = bench_tools.largest_batch(None, 8192, None)
    assert found <= limit and limit - found <= max(1, found // 64), (found, tried)
    assert len(tried) <= 2 * limit.bit_length() + 8


@pytest.mark.parametrize("flags, fragment", [
    ("--bogus", "unrecognized arguments: --bogus"),
    ("--only nope", "unknown section 'nope' in --only"),
    ("--lengths 1,x", "expected comma-separated integers, got '1,x'"),
    ("--lengths 0", "expected positive integers, got '0'"),
    ("--models gpt", "unknown model 'gpt' in --models"),
    ("--repeats 0", "--repeats must be at least 1"),
    ("--pair_rounds 0", "--pair_rounds must be at least 1"),
    ("--mt_passes 0", "--mt_passes must be at least 1"),
    ("--ckpt missing.pt", "no checkpoint at missing.pt"),
    ("--mt_runs no/such/run", "--mt_runs no/such/run: no model.pt and args.json there"),
    ("--models t2r32_graph --device cpu", "CUDA graphs need a CUDA device"),
    ("--only capacity --device cpu", "found on a CUDA device"),
    ("--capacity_length 0", "--capacity_length must be at least 1"),
    ("--vocab_size 1", "--vocab_size must be at least 2"),
    ("--threads 99999999999", "--threads 99999999999: this machine has"),
    ("--dtype float16", "invalid choice: 'float16'"),
    ("--threads -1", "--threads: -1 is not an integer >= 0"),
    ("--seed 18446744073709551616", "is not a seed from 0 to 2**63 - 1"),
    ("--only mt", "--only mt decodes the translators of --mt_runs"),
    ("--only gen --models t2r32-4", "no model that --only gen measures"),
    ("--d_model 30 --n_head 4", "the width must split into whole heads"),
    ("--ckpt model.pt --d_model 64", "--ckpt brings its own shapes"),
    ("--d_model 0", "argument --d_model: 0 is not a positive integer"),
])
def test_bad_input_is_a_one_line_error(run_here, flags, fragment, tmp_path):
    assert_one_line_error(run_here("bench.py", *flags.split(), "--out_dir", tmp_path, cwd=tmp_path), fragment)
    assert not any(tmp_path.iterdir())  # nothing written


def test_an_out_dir_that_cannot_be_written_is_refused_before_any_work(run_here, tmp_path):
    (tmp_path / "taken").write_text("")  # a file where the folder's parent should be (root may write anywhere else)
    result = run_here("bench.py", "--quick", "--out_dir", "taken/bench", cwd=tmp_path)
    assert_one_line_error(result, "--out_dir taken/bench cannot be written (Not a directory)")
    assert "bench:" not in result.stdout  # nothing measured


def test_the_gpu_checks_refuse_a_machine_without_cuda_before_any_work(tmp_path):
    """benchmarks/gpu_checks.sh, the GPU's checks as one command, says so in one line where no CUDA device is."""
    result = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu_checks.sh"), str(tmp_path / "gpu")],
                            cwd=ROOT, capture_output=True, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert_one_line_error(result, "no CUDA device here")
    assert not (tmp_path / "gpu").exists()


def test_an_out_dir_that_is_a_file_is_refused_before_any_work(run_here, tmp_path):
    (tmp_path / "taken").write_text("")
    assert_one_line_error(run_here("bench.py", "--quick", "--out_dir", "taken", cwd=tmp_path), "is a file")


# -----------------------------------------------------------------------------
# What bounds the ratios: the translators' time in parts, and the ceilings

def translator_run(folder, kind):
    """A finished train_mt.py run folder (model.pt, args.json) holding a tiny random translator of `kind`."""
    import json
    from support import mt_data
    from conftest import write_parallel
    from t2r import Seq2SeqTransformer
    corpus = write_parallel(str(folder / "toy"), n=(60, 10, 25))
    tokenizer = mt_data.train_joint_bpe(mt_data.load_parallel(corpus, "en", "de")["train"], 300)
    torch.manual_seed(0)
    config = Config(vocab_size=tokenizer.get_vocab_size(), n_layer=2, n_encoder_layer=1, n_head=2, d_model=16,
                    d_ff=32, dropout=0.0, attn=kind, cross_attn=kind, feature_size=4, cross_feature_size=6,
                    pad_id=mt_data.PAD_ID)
    model = Seq2SeqTransformer(config).eval()
    torch.save({"model": model.state_dict(), "config": config.to_dict(), "tokenizer": tokenizer.to_str()},
               folder / "model.pt")
    # short translations (at most half the source + 2 tokens): the profiler's events are read one by one
    (folder / "args.json").write_text(json.dumps(dict(dataset=corpus, src="en", tgt="de", data_dir=None,
                                                      bleu_sentences=20, max_len_a=0.5, max_len_b=2)))
    return str(folder), config


@pytest.mark.parametrize("kind", ["softmax", "t2r"])
def test_greedy_time_finds_the_head_the_matrix_products_and_the_new_tokens_attention(tmp_path, kind):
    """The head and the other matrix products are found in both; the attention kernel of one new token only in
    softmax's decoding (both encoders are softmax). Not the size of "rest": it is what the profiled ops leave of
    another, unprofiled pass, and on a loaded machine the two passes' times differ by more than it."""
    run_dir, _ = translator_run(tmp_path, kind)
    shares = bench.profile_greedy(run_dir, SimpleNamespace(device=torch.device("cpu"), mt_sentences=4))
    print(kind, {part: round(share, 3) for part, share in shares.items()})
    assert list(shares) == list(bench_tools.TIME_PARTS)
    assert shares["head"] > 0 and shares["linear"] > 0
    assert (shares["sdpa"] > 0) == (kind == "softmax")


def test_time_shares_sort_ops_by_name_and_shape():
    event = lambda key, shapes, us: SimpleNamespace(key=key, input_shapes=shapes, self_cpu_time_total=us)
    events = [event("aten::addmm", [[50], [16, 8], [8, 50]], 300.0), event("aten::mm", [[16, 8], [8, 24]], 200.0),
              event("aten::addmm", [[24], [16, 8], [8, 24]], 100.0),
              event("aten::_scaled_dot_product_flash_attention_for_cpu", [[16, 2, 1, 4]], 250.0),
              event("aten::_scaled_dot_product_flash_attention_for_cpu", [[16, 2, 7, 4]], 80.0),  # the encoder
              event("aten::layer_norm", [[16, 8]], 50.0)]
    shares = bench_tools.time_shares(events, vocab_size=50, seconds=0.002)
    assert shares == pytest.approx(dict(head=0.15, linear=0.15, sdpa=0.125, rest=0.575))


def test_ceilings_are_the_floors_over_softmax_and_the_attention_share():
    rows = [bench.row("gen", model, 16, 8192, "tokens_per_s", tps, "tok/s")
            for model, tps in (("softmax_kv", 400.0), ("proj_only", 2800.0), ("floor", 3400.0))]
    rows += [bench.row("mt", "softmax", 16, 0, f"share_{part}", share, "fraction")
             for part, share in zip(bench_tools.TIME_PARTS, (0.3, 0.4, 0.2, 0.1))]
    rows += bench_tools.ratio_rows("pairs", "t2r32/proj_only", 1, "time_ratio", [1.2, 1.25, 1.3])
    rows += [bench.row("pairs", "t2r32", 1, 0, "share_eq_6_7", 0.1, "fraction"),
             bench.row("pairs", "t2r32", 1, 0, "extra_ops_per_step", 80.0, "ops")]
    found = bench_report.ceilings(rows)
    got = [(what, round(ceiling, 4)) for what, ceiling, _ in found]
    assert got == [("t2r32 / softmax_kv tokens/s at 8192, batch 16", 7.0),
                   ("t2r32 / softmax_kv tokens/s at 8192, batch 16", 8.5),
                   ("t2r32 step / proj_only step, batch 1: paired rounds", 1.125),  # 1.25 x (1 - 0.1)
                   ("translator greedy, test sentences: t2r / softmax tokens/s, batch 16", 1.25)]
    assert "80 more op calls a step" in found[2][2]
    assert "| softmax | 30% | 40% | 20% | 10% |" in bench_report.bounds(rows)


def test_alternating_takes_turns_forward_then_backward():
    calls = []
    make = lambda name: lambda: calls.append(name) or len(calls)
    got = bench_tools.alternating({"a": make("a"), "b": make("b")}, rounds=3)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert got == {"a": [1, 4, 5], "b": [2, 3, 6]}


def test_translators_take_turns_and_are_compared_pass_by_pass(tmp_path, monkeypatch):
    """Each pass's rate against the softmax run's pass of the same round: the median of those ratios (1.5 here), not
    the ratio of the medians (110 / 100), and their range. The passes' rates are made up; the runs are real."""
    runs = [translator_run(tmp_path / kind, kind)[0] for kind in ("softmax", "t2r")]
    rates, feeds = [[100.0, 40.0, 300.0], [350.0, 60.0, 110.0]], {}  # per pass: softmax's, then t2r's

    def made_up_decoding(model, *rest):  # the first model asked for is the softmax run's (--mt_runs order)
        if id(model) not in feeds:
            feeds[id(model)] = iter(rates[len(feeds)] * 2)  # greedy's passes, then beam's
        feed = feeds[id(model)]
        return lambda: {"tokens_per_s": next(feed)}
    monkeypatch.setattr(bench, "decoding", made_up_decoding)
    args = SimpleNamespace(device=torch.device("cpu"), mt_runs=runs, mt_sentences=4, mt_passes=3)
    rows = []
    bench.bench_translators(args, rows)
    got = {(r["model"], r["metric"]): r["value"] for r in rows}
    print({key: round(v, 3) for key, v in got.items()})
    for metric in ("tokens_per_s", "beam5_tokens_per_s"):
        assert (got[("softmax", metric)], got[("t2r", metric)]) == (100.0, 110.0)
        ratios = [got[("t2r/softmax", metric + "_ratio" + end)] for end in ("_min", "", "_max")]
        assert ratios == pytest.approx([110 / 300, 1.5, 3.5])
    assert ("softmax/softmax", "tokens_per_s_ratio") not in got and got[("t2r", "share_sdpa")] == 0


@pytest.mark.parametrize("switches", [dict(max_positions=64, activation="gelu_tanh", scale_embedding=False),
                                      dict(norm="rmsnorm", ffn="swiglu", bias="none", rope_theta=1000.0), dict(window=4)])
def test_a_checkpoint_bench_does_not_build_is_refused_not_measured_as_another(run_here, tmp_path, switches):
    """bench.py --ckpt of a converted GPT-2 or Llama exited 0 having measured the paper's model with the parts that
    fit (LayerNorm, a plain MLP, sinusoids): refused, in one line."""
    from support.configs import build_model
    from support.checkpoints import save_checkpoint
    model = build_model(dict(vocab_size=50, n_layer=1, n_head=2, d_model=16, d_ff=32, attn="t2r", **switches))
    save_checkpoint(str(tmp_path / "model.pt"), {"model": model.state_dict(), "config": model.config.to_dict()})
    result = run_here("bench.py", "--ckpt", "model.pt", "--out_dir", "b", cwd=tmp_path)
    assert_one_line_error(result, "--ckpt takes the paper's model")
    assert not list(tmp_path.glob("b/*"))  # nothing measured, nothing written
