"""Tests of the reproduction study's own code: the attention analysis (experiments/analyze_attention.py), the plan and
its bookkeeping (experiments/study.py: run states, gathering the CSVs), the speed probe (translate.measure_run)
and the report (experiments/report.py: tables, plots and the page; the verdicts themselves: test_claims.py). The
report is tested on made-up run folders and CSVs; no number here is the study's, except in the test that
regenerates the committed results page from the committed CSVs.

    python -m pytest -q -s tests/test_study.py
"""

import csv
import json
import math
import os
import shutil

import pytest
import torch

from conftest import ROOT, TINY, assert_one_line_error, report, run_in_process, write_corpus, write_parallel
from experiments import analyze_attention, gather, probes, runs, study
from experiments import report as study_report  # conftest's report() prints a difference
from support import mt_data
from support.runtime import UserError
from t2r import Config, Seq2SeqTransformer, TransformerLM
from translate import decode_speed, greedy_decode, measure_run


# -----------------------------------------------------------------------------
# The measures of Figs. 5 and 6

def test_entropy_and_distance_on_known_distributions():
    T = 8
    uniform = torch.full((1, 1, 1, T), 1 / T)
    one_hot = torch.zeros(1, 1, 1, T)
    one_hot[..., 3] = 1
    entropy, empty = analyze_attention.mean_entropy(uniform)
    assert abs(entropy - math.log(T)) < 1e-12 and empty == 0
    assert analyze_attention.mean_entropy(one_hot) == (0.0, 0.0)
    # an empty row (a T2R query with all-zero features) is counted, and left out of the entropy
    rows = torch.cat([uniform, torch.zeros(1, 1, 1, T)], dim=2)
    entropy, empty = analyze_attention.mean_entropy(rows)
    assert abs(entropy - math.log(T)) < 1e-12 and empty == 0.5
    # ||one_hot - uniform||^2 = (1 - 1/T)^2 + (T - 1) / T^2
    expected = math.sqrt((1 - 1 / T) ** 2 + (T - 1) / T ** 2)
    assert abs(analyze_attention.mean_distance(one_hot, uniform) - expected) < 1e-12
    with pytest.raises(UserError):
        analyze_attention.mean_distance(one_hot, torch.zeros(1, 2, 1, T))


@pytest.mark.parametrize("kind", ["softmax", "t2r", "elu"])
def test_last_query_attention_reproduces_each_layers_output(kind):
    """The captured distributions, applied to each layer's values, give that layer's attention output at the
    last position (read with an independent hook on the module's output), in float64."""
    torch.manual_seed(0)
    config = Config(vocab_size=29, n_layer=2, n_head=2, d_model=16, d_ff=32, dropout=0.0, attn=kind,
                    feature_size=6, chunk_size=4)
    model = TransformerLM(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(std=0.1)
    windows = torch.randint(0, 29, (3, 10), generator=torch.Generator().manual_seed(1))
    a = analyze_attention.last_query_attention(model, windows, batch_size=2)  # (N, L, H, T)
    assert a.shape == (3, 2, 2, 10)
    inputs, outputs = [], []

    def capture(module, args, out):  # returns None: the output is left as it is
        inputs.append(args[0])
        outputs.append(out)

    hooks = [layer.self_attn.register_forward_hook(capture) for layer in model.layers]
    with torch.no_grad():
        model(windows)
    for hook in hooks:
        hook.remove()
    worst = 0.0
    for layer_index, (layer, x, out) in enumerate(zip(model.layers, inputs, outputs)):
        _, _, v = layer.self_attn.project(x, x)  # (N, H, T, d)
        weights = a[:, layer_index].double()  # (N, H, T), float32 from the analysis
        mixed = (weights[:, :, None, :] @ v)  # (N, H, 1, d)
        worst = max(worst, (layer.self_attn.merge(mixed)[:, 0] - out[:, -1]).abs().max().item())
    assert report(f"{kind}: last-query weights @ v vs the layer output", worst) < 1e-5  # float32 weights


# -----------------------------------------------------------------------------
# experiments/analyze_attention.py as a user runs it

@pytest.fixture(scope="module")
def tiny_teacher(tmp_path_factory):
    """A softmax teacher trained for 4 steps on a toy corpus: (folder, data flags, its ckpt.pt)."""
    tmp = tmp_path_factory.mktemp("study")
    common = ["--dataset", write_corpus(str(tmp / "corpus")), "--cache_dir", str(tmp / "cache")]
    run_in_process("train_lm.py", *TINY, *common, "--max_steps", "4", "--out_dir", str(tmp / "teacher"), cwd=tmp,
                   check=True)
    return tmp, common, str(tmp / "teacher" / "ckpt.pt")


def test_analyze_attention_end_to_end(tiny_teacher, tmp_path):
    _, common, teacher = tiny_teacher
    student_dir = str(tmp_path / "student")
    run_in_process("train_lm.py", *TINY, *common, "--max_steps", "2", "--init", "pretrained", "--pretrained", teacher,
                   "--out_dir", student_dir, cwd=tmp_path, check=True)
    table = str(tmp_path / "attention.csv")
    result = run_in_process("experiments.analyze_attention", os.path.join(student_dir, "ckpt.pt"), "--teacher",
                            teacher, "--before", "4", "8", "--windows", "3", "--context", "32", "--csv", table,
                            cwd=tmp_path, check=True)
    print(result.stdout[-600:])
    with open(table) as f:
        rows = list(csv.DictReader(f))
    assert [r["stage"] for r in rows] == ["teacher", "before finetuning", "before finetuning", "finetuned"]
    assert [r["k"] for r in rows] == ["", "4", "8", "8"]
    assert rows[0]["distance"] == "" and all(float(r["distance"]) > 0 for r in rows[1:])
    assert all(0 < float(r["entropy"]) <= math.log(32) + 1e-9 for r in rows)
    assert all(r["windows"] == "3" for r in rows)


def test_before_finetuning_is_the_finetuning_runs_starting_point(tiny_teacher, tmp_path):
    """--before K --seed S builds exactly the model train_lm.py --init pretrained --seed S starts from: a run
    stopped at step 0 saves that model untouched."""
    _, common, teacher = tiny_teacher
    start_dir = str(tmp_path / "start")
    run_in_process("train_lm.py", *TINY, *common, "--init", "pretrained", "--pretrained", teacher, "--feature_size",
                   "8", "--seed", "7", "--stop_at", "0", "--out_dir", start_dir, cwd=tmp_path, check=True)
    saved = torch.load(os.path.join(start_dir, "ckpt.pt"), weights_only=True)["model"]
    rebuilt = analyze_attention.starting_point(torch.load(teacher, weights_only=True), teacher, 8, 7).state_dict()
    assert set(saved) == set(rebuilt)
    diff = max((saved[name] - rebuilt[name]).abs().max() for name in saved)
    assert report("seed 7: --before vs the run's step-0 checkpoint", diff) == 0
    other = analyze_attention.starting_point(torch.load(teacher, weights_only=True), teacher, 8, 1).state_dict()
    assert (other["layers.0.self_attn.feature_map.weight"] != rebuilt["layers.0.self_attn.feature_map.weight"]).any()


def test_softmax_control_trains_the_teacher_on_unchanged(tiny_teacher, tmp_path, run_here):
    """The study's control: --init pretrained --attn softmax starts from the teacher itself (no swap)."""
    _, common, teacher = tiny_teacher
    control = str(tmp_path / "control")
    assert run_here("train_lm.py", *TINY, *common, "--init", "pretrained", "--pretrained", teacher, "--attn", "softmax",
                    "--max_steps", "2", "--stop_at", "0", "--out_dir", control, cwd=tmp_path).returncode == 0
    start = torch.load(os.path.join(control, "ckpt.pt"), weights_only=True)
    original = torch.load(teacher, weights_only=True)
    assert start["config"]["attn"] == original["config"]["attn"] == "softmax"
    diff = max((start["model"][name] - original["model"][name]).abs().max() for name in original["model"])
    assert report("control at step 0 vs the teacher", diff) == 0
    assert run_here("train_lm.py", "--resume", "--out_dir", control, cwd=tmp_path).returncode == 0
    results = json.loads(open(os.path.join(control, "results.json")).read())
    assert results["attn"] == "softmax+pretrain" and results["k"] is None


@pytest.mark.parametrize("argv, message", [
    (["missing.pt"], "no checkpoint at missing.pt"),
    (["ckpt.pt", "--before", "8"], "--before converts the --teacher"),
    ([], "give at least one checkpoint")])
def test_analyze_attention_errors_are_one_line(run_here, tmp_path, argv, message):
    assert_one_line_error(run_here("experiments.analyze_attention", *argv, cwd=tmp_path), message)


# -----------------------------------------------------------------------------
# The speed probe (Table 2's tokens/s)

def tiny_t2r_translator(tokenizer):
    torch.manual_seed(0)
    config = Config(vocab_size=tokenizer.get_vocab_size(), n_layer=1, n_encoder_layer=1, n_head=2, d_model=16,
                    d_ff=32, dropout=0.0, attn="t2r", cross_attn="t2r", feature_size=4, cross_feature_size=6,
                    pad_id=mt_data.PAD_ID)
    return Seq2SeqTransformer(config).eval()


def test_decode_speed_counts_every_generated_token():
    """The count is every hypothesis token plus its </s>, over batches of 16 in length order."""
    pairs = [("Click the button to open the dialog.", "Klicken Sie auf die Schaltfläche."),
             ("Change size", "Größe ändern"), ("Open the file", "Datei öffnen")] * 8
    tokenizer = mt_data.train_joint_bpe(pairs, 300)
    model = tiny_t2r_translator(tokenizer)
    sentences = [s for s, _ in pairs][:20] + [""]  # 20 sentences (one batch of 16, one of 4) and an empty line
    result = decode_speed(model, tokenizer, sentences, torch.device("cpu"), batch_size=16)
    ids = sorted(mt_data.encode(tokenizer, sentences[:20]), key=len)
    expected = sum(len(h) + 1 for start in (0, 16) for h in greedy_decode(model, mt_data.pad(ids[start:start + 16])))
    print(result)
    assert result["tokens"] == expected and result["sentences"] == 20 and result["tokens_per_s"] > 0
    assert result["step"] == "FlatStep"  # what decoded, kept in speed.json: tokens/s compare on the same step


def test_speed_of_a_run_folder_is_the_median_of_its_passes(tmp_path):
    """measure() reads the run's model.pt and args.json (its corpus, --bleu_sentences, length limits)."""
    corpus = write_parallel(str(tmp_path / "toy"), n=(60, 10, 25))
    tokenizer = mt_data.train_joint_bpe(mt_data.load_parallel(corpus, "en", "de")["train"], 300)
    model = tiny_t2r_translator(tokenizer)
    torch.save({"model": model.state_dict(), "config": model.config.to_dict(), "tokenizer": tokenizer.to_str()},
               tmp_path / "model.pt")
    (tmp_path / "args.json").write_text(json.dumps(dict(dataset=corpus, src="en", tgt="de", data_dir=None,
                                                        bleu_sentences=20, max_len_a=1.5, max_len_b=4)))
    result = measure_run(str(tmp_path), torch.device("cpu"), batch_size=8, passes=3)
    print(result)
    assert result["sentences"] == 20 and result["batch_size"] == 8 and len(result["tokens_per_s_passes"]) == 3
    assert result["tokens_per_s"] == sorted(result["tokens_per_s_passes"])[1]


# -----------------------------------------------------------------------------
# The plan and its bookkeeping

def test_plan_covers_every_table_and_figure_row(tmp_path):
    lm = study.lm_runs(str(tmp_path), study.LM_SIZES["full"])
    rows = {(r.row["model"], r.row["init"], r.row["k"], r.row["seed"]) for r in lm}
    conversions = [(model, 32) for model in study.CONVERSIONS]
    for model, k in [("t2r", 32), ("elu", 64), ("rfa", 64), *conversions]:  # RFA: 32 projections, 64 features
        assert {(model, "pretrained", k, 0), (model, "pretrained", k, 1)} <= rows
    for model, k in (("t2r", 32), ("elu", 64), ("rfa", 64), ("sru++", None), (study.LONGER, 32)):
        assert (model, "random", k, 0) in rows
    for k in study.FEATURE_SIZES:
        assert {("t2r", "pretrained", k, 0), ("t2r", "random", k, 0), ("t2r-frozen", "pretrained", k, 0)} <= rows
    assert {(study.LONGER, "random", 32, seed) for seed in (0, 1, 2)} <= rows  # the control on three seeds
    doubled = {f"softmax-{study.DOUBLED}", f"t2r-{study.DOUBLED}", f"{study.LONGER}-{study.DOUBLED}"}
    assert {r.row["model"] for r in lm} >= doubled
    assert lm[0].row["model"] == "softmax", "the teacher trains first"
    size = study.LM_SIZES["full"]
    for r in lm:
        flags, twice = r.flags, 2 if r.row["model"] in doubled else 1
        teacher = next(t for t in lm if t.row["model"] == ("softmax" if twice == 1 else f"softmax-{study.DOUBLED}"))
        if r.row["model"].startswith(study.LONGER):  # the control: the conversion's total steps, from scratch
            assert flags["max_steps"] == twice * (size["pretrain_steps"] + size["finetune_steps"])
            assert "init" not in flags
        elif r.row["init"] == "random":  # the teacher's budget, from scratch
            assert flags["max_steps"] == twice * size["pretrain_steps"] and "init" not in flags
            assert flags["lr"] == study.LM_LR["pretrain"] and flags["d_model"] == 128
        else:  # a fifth of it, from the teacher
            assert flags["max_steps"] == twice * size["finetune_steps"] and flags["init"] == "pretrained"
            assert flags["lr"] == study.LM_LR["finetune"]
            assert flags["pretrained"] == os.path.join(teacher.out_dir, "ckpt.pt")
        assert flags.get("keep_softmax_every") == (4 if r.row["model"] in ("t2r75", "t2r75top") else None)
        assert flags.get("keep_softmax_from") == ("top" if r.row["model"] == "t2r75top" else None)
        assert ("transfer_steps" in flags) == ("transfer" in r.row["model"])
        assert ("window" in flags) == ("window" in r.row["model"])
        assert flags.get("freeze_feature_map") == (True if r.row["model"] == "t2r-frozen" else None)
        if r.row["model"] == "sru++":  # no transformer flag: train_lm.py refuses them for SRU++
            assert flags["arch"] == "sru++" and not {"attn", "n_head", "d_ff", "feature_size"} & set(flags)
        else:
            assert flags["attn"] == ("t2r" if r.row["model"].startswith("t2r") else r.row["model"].split("-")[0])
            assert flags.get("feature_size") == r.row["k"]
        assert flags["seed"] == r.row["seed"] and r.out_dir == os.path.join(str(tmp_path), "lm", r.name)
        assert r.row.get("teacher") == (0 if r.row["init"] == "pretrained" else None)  # the seed-0 teacher's
    assert 5 * size["finetune_steps"] == size["pretrain_steps"]  # finetuning: a fifth of the pretraining steps
    assert len({r.name for r in lm}) == len(lm), "two runs share an out_dir"
    mt_size = study.MT_SIZES["full"]  # finetuning: 2/3 of the teacher's steps and its warmup (Tables 5-6)
    mt = study.mt_runs(str(tmp_path), mt_size)
    assert [(r.row["model"], r.row["init"]) for r in mt] == [
        ("softmax", "random"), ("t2r", "pretrained"), ("elu", "pretrained"), ("rfa", "pretrained"), ("t2r", "random"),
        ("softmax", "pretrained"), ("t2r-transfer", "pretrained"), ("t2r-window", "pretrained"),
        ("t2r-transfer-window", "pretrained"), (study.LONGER, "random")]
    assert mt[-1].flags["max_steps"] == mt_size["pretrain_steps"] + mt_size["finetune_steps"]  # the equal budget
    assert mt[5].flags["attn"] == "softmax" and mt[5].flags["init"] == "pretrained"  # the teacher trained on
    rfa = mt[3].flags  # Table 2's 4 causal and 32 cross projections, two features each
    assert (rfa["attn"], rfa["feature_size"], rfa["cross_feature_size"]) == ("rfa", 8, 64)
    assert all(r.flags["pretrained"] == os.path.join(mt[0].out_dir, "model.pt") and 3 * r.flags["max_steps"] ==
               2 * mt_size["pretrain_steps"] and r.flags["warmup_steps"] == mt_size["warmup_steps"]
               for r in mt if r.row["init"] == "pretrained")


def test_every_planned_lm_command_parses(tmp_path):
    """Each run's flags are accepted by train_lm.py as the study writes them (SRU++ refuses transformer flags)."""
    import train_lm
    for r in study.lm_runs(str(tmp_path), study.LM_SIZES["full"]):
        argv = study.command(r)[2:]
        args = train_lm.get_args(argv)
        assert args.max_steps == r.flags["max_steps"] and args.out_dir == r.out_dir


def test_command_writes_each_flag_and_resumes_an_interrupted_run(tmp_path):
    run_ = study.Run("x", "train_lm.py", {"max_steps": 3, "freeze_feature_map": True, "out_dir": str(tmp_path / "x")})
    assert runs.run_state(run_.out_dir) == "todo"
    assert study.command(run_)[2:] == ["--max_steps", "3", "--freeze_feature_map", "--out_dir", run_.out_dir]
    os.makedirs(tmp_path / "x")
    (tmp_path / "x" / "ckpt.pt").write_bytes(b"")
    assert runs.run_state(run_.out_dir) == "interrupted" and study.command(run_)[-1] == "--resume"
    (tmp_path / "x" / "results.json").write_text("{}")
    assert runs.run_state(run_.out_dir) == "done"


def test_a_dry_run_counts_the_runs_kept_under_results_as_done_and_restores_nothing(tmp_path, capsys):
    runs = study.lm_runs(str(tmp_path / "out"), study.LM_SIZES["quick"])[:2]
    records = study.Records(str(tmp_path / "out"), str(tmp_path / "kept"))
    os.makedirs(records.folder(runs[0]))
    (tmp_path / "kept" / "lm" / runs[0].name / "results.json").write_text("{}")
    study.execute(runs, dry_run=True, records=records)
    printed = capsys.readouterr().out
    assert "2 runs, 1 already done" in printed and f"{runs[0].name}: kept |" in printed
    assert f"{runs[1].name}: todo |" in printed and not (tmp_path / "out").exists()


def test_the_teacher_seed_runs_are_the_plans_teacher_and_conversion_with_another_seed(tmp_path):
    """--stage teachers: the 1x teacher again with seeds 1 and 2, each converted by the plan's recipe from its own
    checkpoint with its seed; every other flag the plan's seed-0 runs'."""
    from experiments.sizes import LM_SIZES
    size, out = LM_SIZES["full"], str(tmp_path)
    plan = {run.name: run for run in study.lm_runs(out, size)}
    extra = {run.name: run for run in study.teacher_seed_runs(out, size)}
    assert list(extra) == ["softmax-random-s1", "t2r-pretrained-k32-from-s1", "softmax-random-s2",
                           "t2r-pretrained-k32-from-s2"]
    for seed in (1, 2):
        teacher, conversion = extra[f"softmax-random-s{seed}"], extra[f"t2r-pretrained-k32-from-s{seed}"]
        same = lambda run, original: {k: v for k, v in run.flags.items() if k not in ("seed", "out_dir", "pretrained")} \
            == {k: v for k, v in original.flags.items() if k not in ("seed", "out_dir", "pretrained")}
        assert same(teacher, plan["softmax-random-s0"]) and same(conversion, plan["t2r-pretrained-k32-s0"])
        assert teacher.flags["seed"] == conversion.flags["seed"] == seed and not teacher.probes
        assert conversion.row == {**plan["t2r-pretrained-k32-s0"].row, "seed": seed, "teacher": seed}
        assert conversion.flags["pretrained"] == os.path.join(teacher.out_dir, "ckpt.pt")
        assert study.teacher_of(conversion, list(extra.values())) is teacher


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path):
    result = run_in_process("experiments.study", "--quick", "--dry_run", "--out", str(tmp_path / "study"),
                            cwd=tmp_path, check=True)
    print(result.stdout[-400:])
    assert "56 runs, 0 already done" in result.stdout  # the language models, the teacher's seeds, the translators
    assert "[42/56] t2r-random-k64-s0: todo" in result.stdout
    assert "[46/56] t2r-pretrained-k32-from-s2: todo" in result.stdout
    assert not (tmp_path / "study").exists()


@pytest.mark.parametrize("script, argv, message", [
    ("experiments.probes", ["speed", "nowhere"], "no model.pt in nowhere: give the folder of a finished train_mt.py"),
    ("experiments.report", ["--results", "."], "lm_ptb.csv: run python -m experiments.study first"),
])
def test_study_and_report_errors_are_one_line(run_here, tmp_path, script, argv, message):
    assert_one_line_error(run_here(script, *argv, cwd=tmp_path), message)


# -----------------------------------------------------------------------------
# The report: tables, plots, claims

def fake_json(path, values):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(values, f)


def fake_runs(out: str, lm_plan: list, mt_plan: list):
    """Made-up results.json, speed.json and the analysis' raw table, built so that every claim holds."""
    ppl = {"softmax": 100.0, "t2r": 110.0, "t2r75": 99.3, "t2r75top": 99.3, "elu": 130.0, "rfa": 125.0,
           "t2r-frozen": 115.0, "t2r-transfer": 108.0, "t2r-window": 106.0, "t2r-transfer-window": 105.0, "sru++": 112.0,
           study.LONGER: 110.0, "softmax-2x": 95.0, "t2r-2x": 104.0, "t2r-longer-2x": 104.0}
    from_scratch = {"softmax": 0.0, "t2r": 20.0, "elu": 5.0, "rfa": 5.0, "sru++": 0.0, study.LONGER: 15.0,
                    "softmax-2x": 0.0, "t2r-longer-2x": 15.0}  # what
    # random init costs (T2R trained longer from scratch: less)
    curve = [[1, 100, 5.0], [2, 200, 4.8], [3, 300, 4.7], [4, 400, 4.699]]  # converged: 0.1% in the last fifth
    converted_curve = [[1, 100, 4.69], [2, 200, 4.68]]  # below the from-scratch end in a quarter of its tokens
    for r in lm_plan:
        k, seed, random_init = r.row["k"] or 64, r.row["seed"], r.row["init"] == "random"
        value = ppl[r.row["model"]] + 40 / k + seed
        if random_init:
            value += from_scratch[r.row["model"]] + (80 / k if r.row["model"] == "t2r" else 0)
        fake_json(os.path.join(r.out_dir, "results.json"), {"valid": {"ppl": value}, "test": {"ppl": value - 5},
                                                            "train_minutes": 9.0 if random_init else 2.0,
                                                            "curve": curve if random_init else converted_curve})
    bleu = {("softmax", "random"): 20.0, ("t2r", "pretrained"): 19.5, ("elu", "pretrained"): 19.0,
            ("rfa", "pretrained"): 18.5, ("t2r", "random"): 17.0, ("t2r-transfer", "pretrained"): 19.6,
            ("t2r-window", "pretrained"): 19.7, ("t2r-transfer-window", "pretrained"): 19.8,
            ("softmax", "pretrained"): 20.3, (study.LONGER, "random"): 18.0}
    speed_ = {"softmax": 500.0, "t2r": 900.0, "elu": 800.0, "rfa": 850.0, "t2r-transfer": 900.0, "t2r-window": 850.0,
              "t2r-transfer-window": 850.0, study.LONGER: 900.0}
    for r in mt_plan:
        b = bleu[(r.row["model"], r.row["init"])]
        fake_json(os.path.join(r.out_dir, "results.json"), {
            "valid": {"bleu": b + 1}, "test": {"bleu": b, "tok_bleu": b + 0.5}, "train_minutes": 3.0,
            "k_cross": None if r.row["model"] == "softmax" else 32, "k_causal": 4, "curve": curve})
        fake_json(os.path.join(r.out_dir, "speed.json"), {"tokens_per_s": speed_[r.row["model"]]})
    header, teacher = "model,stage,attn,k,distance,entropy,empty_rows,windows", "teacher.pt,teacher,softmax,,,2.0,0.0,4"
    before = [f"teacher -> t2r k={k},before finetuning,t2r,{k},{1.0 / k + 0.5},5.0,0.0,4" for k in study.FEATURE_SIZES]
    write_lines(os.path.join(lm_plan[0].out_dir, "attention.csv"), [header, teacher, *before])
    for stage, k, r in probes.attention_checkpoints(lm_plan):  # each with a teacher row the tables leave out
        distance = {"finetuned": 0.1 + 1 / k, "mlp_frozen": 0.2 + 1 / k, "random_init": ""}[stage]
        entropy = {"finetuned": 3.0, "mlp_frozen": 3.5, "random_init": 4.0}[stage] - k / 100
        row = f"{r.out_dir}/ckpt.pt,{'checkpoint' if distance == '' else 'finetuned'},t2r,{k},{distance},{entropy},0.0,4"
        write_lines(os.path.join(r.out_dir, "attention.csv"), [header, teacher.replace("2.0", "9.0"), row])


def write_lines(path, lines):
    open(path, "w").write("\n".join(lines) + "\n")


def read_rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def claim_lines(page: str, section: str = "## The paper's claims and ours") -> list:
    """The table's rows, each without its last cell (the rule's id): "| claim | paper | ours | held |"."""
    rows = page.split(section)[1].split("\n\n")[2].splitlines()[2:]
    return [row.rsplit(" | ", 1)[0] + " |" for row in rows]


def control_lines(page: str) -> list:
    return claim_lines(page, "## The study's controls and ablations")


def test_results_tables_and_claims_from_made_up_runs(tmp_path):
    out, results = str(tmp_path / "study"), str(tmp_path / "results")
    size = study.LM_SIZES["quick"]
    lm_plan = study.lm_runs(out, size) + study.teacher_seed_runs(out, size)  # as the results stage gathers them
    mt_plan = study.mt_runs(out, study.MT_SIZES["quick"])
    fake_runs(out, lm_plan, mt_plan)
    gather.gather(results, lm_plan, mt_plan, quick=True)
    study_report.write_report(results)
    lm = read_rows(os.path.join(results, "lm_ptb.csv"))
    assert list(lm[0]) == gather.LM_COLUMNS
    doubled = {f"{model}-{study.DOUBLED}" for model in ("softmax", "t2r", study.LONGER)}
    assert {r["model"] for r in lm} == {"softmax", "elu", "rfa", "t2r", "sru++", study.LONGER, *study.CONVERSIONS,
                                        *doubled}
    assert {r["k"] for r in lm if r["model"].startswith("t2r")} == {"32"}, "Table 1 is at k = 32"
    mt = read_rows(os.path.join(results, "mt.csv"))
    assert list(mt[0]) == gather.MT_COLUMNS and len(mt) == 10
    curves = read_rows(os.path.join(results, "curves.csv"))
    assert {(r["task"], r["model"]) for r in curves if r["step"] == "4"} >= {("lm", "t2r"), ("mt", "softmax")}
    att = read_rows(os.path.join(results, "attention.csv"))
    assert {r["stage"] for r in att} == {"teacher", "before_finetuning", "finetuned", "mlp_frozen", "random_init"}
    with open(os.path.join(results, "machine.json")) as f:
        machine = json.load(f)
    assert machine["runs_finished"] == machine["runs_planned"] == 56
    assert machine["attention_models"][0] == machine["attention_models"][1] > 0
    assert machine["command"] == "bash experiments/reproduce.sh --quick"
    assert all(os.path.isfile(os.path.join(results, name)) for name in ("feature_size.png", "attention.png",
                                                                         "learning_curves.png"))
    with open(os.path.join(results, "README.md")) as f:
        text = f.read()
    print(text)
    # the made-up numbers are built so that every claim holds; the 75% hybrid closes (106.75 - 96.05) /
    # (106.75 - 96.125) = 101% of the gap to the softmax control, and is 0.575 ahead of the teacher (95.625, 96.625
    # and 97.625 over its seeds), inside the spread of 1.5 (test ppl); the decoding speed on the test sentences is a
    # control, not a claim
    assert "Partial" not in text and study_report.verdict_legend() in text
    assert "101% of the gap closed, -0.08 left (spread 1.00)" in text
    assert "96.05 vs the teacher's 96.62 (-0.58, spread 1.50); vs the softmax control's 96.12, the same total steps " \
        "(-0.08, spread 1.00)" in text
    assert "| Transformer (softmax, the teacher) | - | 3 |" in text
    assert "| Transformer trained on for the finetuning steps (control) | - | 2 |" in text
    claims_, controls = claim_lines(text), control_lines(text)
    judged = [line for line in claims_ if not line.endswith("| not measured |")]  # Fig. 2's: no bench.csv here
    assert len(claims_) == 19 and len(judged) == 16, claims_  # 6 LM, 7 Figs. 4-6, 3 MT; 3 of Fig. 2
    assert all(line.endswith("| yes |") for line in judged), claims_
    # equal budgets (1x, 2x), the gap to the softmax control, the hybrids closing it, the top-kept reading against
    # the teacher; the translator against the control and at equal budgets
    assert len(controls) == 9 and all(line.endswith("| yes |") for line in controls), controls
    assert "the language-model teacher: 0.1% lower validation perplexity over the last fifth of its 4 steps: " \
        "converged" in text
    assert "| T2R + pretrain | 32 | 2 | 111.75 ± 0.50 |" in text  # the seed-0 teacher's two: mean, half the range
    # at equal budgets one conversion a teacher (106.25, 107.25, 108.25) against three seeds from scratch
    assert "| 107.25 (106.25, 107.25, 108.25; 3 runs: a conversion of each of the teacher's seeds 0, 1, 2) vs " \
        "122.25 (121.25, 122.25, 123.25; 3 seeds); Welch's t -18.37 (df 4.0)" in text
    assert "**Of 16 checks of the paper's claims at CPU scale, 16 agreed, 0 did not, 0 were inconclusive** (3 not " \
        "measured yet)" in text
    quick = study.LM_SIZES["quick"]  # the page's budgets are the edition's that ran
    assert os.path.isfile(os.path.join(results, "equal_budget.png"))
    assert f"| 2x | {2 * (quick['pretrain_steps'] + quick['finetune_steps']):,} |" in text


MADE_UP_CSVS = {
    "lm_ptb.csv": ["model,init,k,seed,valid_ppl,test_ppl,train_minutes", "softmax,random,,0,105.0,100.0,9.0",
                   "t2r,pretrained,32,0,112.0,107.0,2.0", "t2r,random,32,0,111.0,106.0,9.0"],
    "feature_size.csv": ["model,init,k,seed,valid_ppl,test_ppl,train_minutes", "t2r,pretrained,4,0,113.0,108.0,2.0",
                         "t2r,random,4,0,115.0,110.0,9.0", "t2r_mlp_frozen,pretrained,4,0,114.0,109.0,2.0"],
    "attention.csv": ["stage,k,distance,entropy,empty_rows,valid_ppl,windows", "teacher,,,4.0,0.0,105.0,4",
                      "finetuned,4,0.2,5.0,0.0,113.0,4"],
    "mt.csv": ["model,init,k_cross,k_causal,bleu,tokens_per_s", "softmax,random,,,20.0,500.0",
               "t2r,pretrained,32,4,18.0,"],
}


def test_report_regenerates_from_made_up_csvs(tmp_path):
    """The CSVs alone are enough (no run folder, no machine.json; an old mt.csv without the newer columns):
    a partial study gives a page of what there is, and a summary short enough for the top-level README."""
    for name, lines in MADE_UP_CSVS.items():
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    result = run_in_process("experiments.report", "--results", str(tmp_path), cwd=tmp_path, check=True)
    text, summary = (tmp_path / "README.md").read_text(), (tmp_path / "summary.md").read_text()
    print(text, result.stdout)
    assert "| T2R + pretrain | 32 | 1 | 112.00 | 107.00 | 2.00 | 19.0 / 19.6 |" in text
    assert "| 4 | 113.00 | 115.00 | 114.00 | - | 0.2000 | - | 5.00 | - | - |" in text
    assert "| T2R + pretrain | 32 | 4 | 18.00 | - | - | - | - | 28.7 |" in text
    # T2R + pretrain behind T2R from scratch, 7 behind the teacher, 2 BLEU behind it; Fig. 4 needs two k, Table 2's
    # gain a T2R from scratch, Fig. 2 bench.csv; the controls' runs are not there
    found = [line.split(" | ")[-1][:-2] for line in claim_lines(text)]
    assert found == ["**no**", "yes", "not measured", "**no**", *["not measured"] * 4], found
    assert [line.split(" | ")[-1][:-2] for line in control_lines(text)] == ["not measured"] * 4
    assert "**Of 3 checks of the paper's claims at CPU scale, 1 agreed, 2 did not, 0 were inconclusive** (5 not " \
        "measured yet)" in text
    assert "an unrecorded command on an unrecorded machine" in text
    assert len(summary.splitlines()) < 40 and "**Of 3 checks of the paper's claims at CPU scale, 1 agreed" in summary
    assert (tmp_path / "feature_size.png").stat().st_size > 0 and (tmp_path / "attention.png").stat().st_size > 0


def test_a_page_without_attention_rows_links_no_attention_figure(tmp_path):
    """Before the attention analysis has run, its CSV has a header only: no plot is drawn, so none is linked."""
    for name, lines in MADE_UP_CSVS.items():
        (tmp_path / name).write_text("\n".join(lines[:1] if name == "attention.csv" else lines) + "\n")
    run_in_process("experiments.report", "--results", str(tmp_path), cwd=tmp_path, check=True)
    text = (tmp_path / "README.md").read_text()
    assert not (tmp_path / "attention.png").exists() and "attention.png" not in text
    assert "(feature_size.png)" in text


def test_the_committed_page_is_what_the_report_writes_from_the_committed_csvs(tmp_path):
    csvs = [f"{name}.csv" for name in study_report.CSVS + study_report.OPTIONAL_CSVS]
    for name in csvs + ["machine.json", "mqar.json", "bench/bench.csv"]:
        if os.path.isfile(os.path.join(ROOT, "results", name)):  # a missing CSV the report needs fails it below
            (tmp_path / name).parent.mkdir(exist_ok=True)
            (tmp_path / name).write_bytes(open(os.path.join(ROOT, "results", name), "rb").read())
    study_report.write_report(str(tmp_path))
    for name in ("README.md", "summary.md"):
        with open(os.path.join(ROOT, "results", name)) as f:
            committed = f.read()
        # the summary's link to the page, from the repository's root
        regenerated = (tmp_path / name).read_text().replace(os.path.relpath(str(tmp_path), ROOT), "results")
        assert regenerated == committed, f"results/{name} is not what report.py writes: rerun it"
    summary = open(os.path.join(ROOT, "results", "summary.md")).read().splitlines()
    headline = summary[1:4]  # under the comment: the count and the scale; the seeds and the controls; the link
    assert headline[0].startswith("**Of 19 checks of the paper's claims at CPU scale, ")
    assert headline[1].startswith("Seeds: ") and "controls are listed with their outcomes, not counted" in headline[1]
    assert all(len(line) < 200 for line in headline)
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert "\n## Results\n\n" + "\n".join(headline) + "\n\n" in readme, "the README's results open with the summary's"
    results = readme.split("\n## Results\n", 1)[1]  # a tutorial: the dated tables and sentences stay on the page
    assert not any(line in results for line in summary if line.startswith(("|", "Made by ", "- PTB at ", "- **")))


# -----------------------------------------------------------------------------
# The results stage in a fresh checkout: out/ is empty, the records under results/runs are all there is

GATHERED = ("lm_ptb.csv", "feature_size.csv", "attention.csv", "mt.csv", "mt_pairs.csv", "curves.csv", "machine.json")


@pytest.fixture
def fresh_checkout(tmp_path, monkeypatch):
    """A copy of the committed results/ (the records in results/runs included) beside an empty out/, in a working
    directory without data/: the translators' test corpus is not prepared there, as in a fresh clone."""
    shutil.copytree(os.path.join(ROOT, "results"), tmp_path / "results")
    monkeypatch.chdir(tmp_path)
    return ["--stage", "results", "--out", str(tmp_path / "out" / "study"), "--results", str(tmp_path / "results")]


def committed(name: str) -> bytes:
    with open(os.path.join(ROOT, "results", name), "rb") as f:
        return f.read()


def test_the_results_stage_of_a_fresh_checkout_rebuilds_the_committed_results_from_the_records(fresh_checkout,
                                                                                                 tmp_path, monkeypatch):
    for name in [name for name in vars(study_report) if name.startswith("plot_")]:  # their bytes are matplotlib's
        monkeypatch.setattr(study_report, name, lambda *args: None)
    study.main(fresh_checkout)
    for name in GATHERED + ("README.md",):
        assert (tmp_path / "results" / name).read_bytes() == committed(name), f"results/{name} is not rebuilt"
    assert not (tmp_path / "out").exists(), "the records are read where they are, not copied into out/"


def test_the_results_stage_refuses_in_one_line_to_write_fewer_runs_over_the_results(fresh_checkout, tmp_path):
    shutil.rmtree(tmp_path / "results" / "runs")  # a checkout without the records: out/ and they hold no run
    with pytest.raises(UserError) as refused:
        study.main(fresh_checkout)
    finished = json.loads(committed("machine.json"))["runs_finished"]
    assert f"results holds the results of {finished} finished runs, the run folders and their records only 0: " \
        "nothing written" in str(refused.value) and "\n" not in str(refused.value)
    assert all((tmp_path / "results" / name).read_bytes() == committed(name) for name in GATHERED + ("README.md",))


@pytest.mark.parametrize("kept", ["other delta", "one pair fewer", "none"])
def test_without_the_test_corpus_a_pairs_table_not_of_these_runs_is_refused_in_one_line(fresh_checkout, tmp_path,
                                                                                         kept):
    """The bootstrap needs the test references; without them the kept mt_pairs.csv stays only where it pairs the same
    runs and each delta is their test BLEU difference."""
    pairs = tmp_path / "results" / "mt_pairs.csv"
    lines = pairs.read_text().splitlines(keepends=True)
    if kept == "other delta":  # 0.02 more: beyond the 0.01 of BLEU's two decimals
        cells = lines[1].split(",")
        lines[1] = ",".join(cells[:4] + [f"{float(cells[4]) + 0.02:.4f}"] + cells[5:])
    pairs.write_text("".join(lines[:-1] if kept == "one pair fewer" else lines))
    if kept == "none":
        pairs.unlink()
    with pytest.raises(UserError) as refused:
        study.main(fresh_checkout)
    assert "mt_pairs.csv needs the translators' test references, and their corpus is not prepared here: run " \
        "train_mt.py once" in str(refused.value) and "\n" not in str(refused.value)
    assert (tmp_path / "results" / "lm_ptb.csv").read_bytes() == committed("lm_ptb.csv"), "nothing is written"


def test_the_equal_budget_table_names_each_arms_runs_and_teachers_with_welch_and_the_permutation_p():
    """At 1x one conversion of each of the teacher's seeds against three seeds from scratch: Welch's t (df), its
    two-sided p and the exact permutation p; at 2x one run a side, and no p. [101, 102, 103] against [104, 105, 106]:
    t = -3 / sqrt(2/3) = -3.67 on 2 (3 - 1) = 4 df; the observed split and its mirror the farthest of 20: p 0.10."""
    rows = [dict(model="t2r", init="pretrained", seed=t, teacher=t, test_ppl=101.0 + t) for t in (0, 1, 2)]
    rows += [dict(model="t2r", init="pretrained", seed=1, teacher=0, test_ppl=90.0)]  # Table 1's, not the arm's
    rows += [dict(model="t2r-longer", init="random", seed=s, test_ppl=104.0 + s) for s in (0, 1, 2)]
    rows += [dict(model="t2r-2x", init="pretrained", seed=0, teacher=0, test_ppl=99.0),
             dict(model="t2r-longer-2x", init="random", seed=0, test_ppl=98.0)]
    table = study_report.equal_budget_section({"lm": rows, "machine": {}}, lambda *a: [])
    print("\n".join(table))
    assert table[2].endswith("| 102.00 ± 1.00 (3 runs: a conversion of each of the teacher's seeds 0, 1, 2) | "
                             "105.00 ± 1.00 (3 seeds) | -3.67 (4.0), 0.021 | 0.10 |")
    assert table[3].endswith("| 99.00 (1 run: the conversion of the 2x teacher, seed 0) | 98.00 (1 seed) | "
                             "- (one run a side) | - |")
    assert "- PTB at 2x (5,760 steps): T2R + pretrain 99.00 (1 run: the conversion of the 2x teacher, seed 0) " \
        "against T2R from scratch 98.00 (1 seed), +1.00 test ppl; one seed a side: no p can be computed." in table


def test_table_1_gives_the_teacher_over_its_seeds_and_the_pretrain_rows_of_the_seed_0_teacher():
    import statistics
    teacher = [131.0543, 131.8103, 131.9679]
    rows = [dict(model="softmax", init="random", k=None, seed=s, valid_ppl=v + 10, test_ppl=v, train_minutes=90.0)
            for s, v in enumerate(teacher)]
    rows += [dict(model="t2r", init="pretrained", k=32, seed=s, teacher=t, valid_ppl=v + 10, test_ppl=v,
                  train_minutes=10.0) for s, t, v in ((0, 0, 136.0), (1, 0, 135.0), (1, 1, 137.0))]
    table = "\n".join(study_report.lm_table(rows))
    assert "| Transformer (softmax, the teacher) | - | 3 | 141.61 ± 0.46 | 131.61 ± 0.46 |" in table
    assert "| T2R + pretrain | 32 | 2 | 145.50 ± 0.50 | 135.50 ± 0.50 |" in table  # teacher 1's conversion left out
    (line, _) = study_report.teacher_seeds(rows)
    assert line.startswith(f"The teacher: 3 seeds, test ppl 131.05, 131.81, 131.97 (mean 131.61, SD "
                           f"{statistics.stdev(teacher):.2f});"), line


@pytest.mark.parametrize("command, edition", [("bash experiments/reproduce.sh", "full"),
                                              ("bash experiments/reproduce.sh --quick", "quick")])
def test_the_page_gives_the_sizes_and_budgets_of_the_edition_that_ran(command, edition):
    """A quick study's page described the full study's models and step totals."""
    rows = [dict(model="t2r", init="pretrained", test_ppl=130.0), dict(model="t2r-longer", init="random", test_ppl=129.0)]
    results = {"lm": rows, "machine": {"command": command}}
    table = study_report.equal_budget_section(results, lambda *a: [])
    size = study.LM_SIZES[edition]
    assert f"| 1x | {size['pretrain_steps'] + size['finetune_steps']:,} |" in table[2]
    assert f"d_model {size['model']['d_model']}," in study_report.model_sizes(study_report.edition(results))


@pytest.mark.parametrize("seeds, words", [((1,), "one for Table 1's language models"),
                                          ((1, 2), "1 or 2 for Table 1's language models"),
                                          ((1, 2, 3), "1 to 3 for Table 1's language models")])
def test_the_headline_names_the_seeds_of_each_part(seeds, words):
    """The seeds by part, so that the largest count does not hide a part of one seed (translation here)."""
    rows = [dict(model=model, init="random", seed=seed, test_ppl=130.0)
            for model, n in zip(("t2r", "softmax", study.LONGER), seeds) for seed in range(n)]
    mt = [dict(model="softmax", init="random", bleu=20.0)]
    text = study_report.seed_line({"lm": rows, "mt": mt, "fs": []})
    assert text == f"Seeds: {words}; one for translation." if seeds != (1,) else \
        text == "Seeds: one each for Table 1's language models and translation.", text
