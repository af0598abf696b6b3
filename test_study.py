"""Tests of the reproduction study's own code: the attention analysis (analyze_attention.py) and the
study driver's bookkeeping (experiments/study.py): run states, the CSVs, the claims it evaluates.

    python -m pytest -q -s test_study.py

The driver's tables are tested on made-up run folders; no number here is a result of the study.
"""

import csv
import json
import math
import os
import sys

import pytest
import torch

import analyze_attention
from t2r import Config, TransformerLM
from conftest import TINY, report, run, write_corpus
from training import UserError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "experiments"))
import study  # noqa: E402


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
# analyze_attention.py as a user runs it

@pytest.fixture(scope="module")
def tiny_teacher(tmp_path_factory):
    """A softmax teacher trained for 4 steps on a toy corpus: (folder, data flags, its ckpt.pt)."""
    tmp = tmp_path_factory.mktemp("study")
    common = ["--dataset", write_corpus(str(tmp / "corpus")), "--cache_dir", str(tmp / "cache")]
    run("train_lm.py", *TINY, *common, "--max_steps", "4", "--out_dir", str(tmp / "teacher"), cwd=tmp)
    return tmp, common, str(tmp / "teacher" / "ckpt.pt")


def test_analyze_attention_end_to_end(tiny_teacher, tmp_path):
    _, common, teacher = tiny_teacher
    student_dir = str(tmp_path / "student")
    run("train_lm.py", *TINY, *common, "--max_steps", "2", "--init", "pretrained", "--pretrained", teacher,
        "--out_dir", student_dir, cwd=tmp_path)
    table = str(tmp_path / "attention.csv")
    result = run("analyze_attention.py", os.path.join(student_dir, "ckpt.pt"), "--teacher", teacher,
                 "--before", "4", "8", "--windows", "3", "--context", "32", "--csv", table, cwd=tmp_path)
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
    run("train_lm.py", *TINY, *common, "--init", "pretrained", "--pretrained", teacher, "--feature_size", "8",
        "--seed", "7", "--stop_at", "0", "--out_dir", start_dir, cwd=tmp_path)
    saved = torch.load(os.path.join(start_dir, "ckpt.pt"), weights_only=True)["model"]
    rebuilt = analyze_attention.starting_point(torch.load(teacher, weights_only=True), teacher, 8, 7).state_dict()
    assert set(saved) == set(rebuilt)
    diff = max((saved[name] - rebuilt[name]).abs().max() for name in saved)
    assert report("seed 7: --before vs the run's step-0 checkpoint", diff) == 0
    other = analyze_attention.starting_point(torch.load(teacher, weights_only=True), teacher, 8, 1).state_dict()
    assert (other["layers.0.self_attn.feature_map.weight"] != rebuilt["layers.0.self_attn.feature_map.weight"]).any()


def test_softmax_control_trains_the_teacher_on_unchanged(tiny_teacher, tmp_path):
    """The study's control: --init pretrained --attn softmax starts from the teacher itself (no swap)."""
    _, common, teacher = tiny_teacher
    control = str(tmp_path / "control")
    run("train_lm.py", *TINY, *common, "--init", "pretrained", "--pretrained", teacher, "--attn", "softmax",
        "--max_steps", "2", "--stop_at", "0", "--out_dir", control, cwd=tmp_path)
    start = torch.load(os.path.join(control, "ckpt.pt"), weights_only=True)
    original = torch.load(teacher, weights_only=True)
    assert start["config"]["attn"] == original["config"]["attn"] == "softmax"
    diff = max((start["model"][name] - original["model"][name]).abs().max() for name in original["model"])
    assert report("control at step 0 vs the teacher", diff) == 0
    run("train_lm.py", "--resume", "--out_dir", control, cwd=tmp_path)
    results = json.loads(open(os.path.join(control, "results.json")).read())
    assert results["attn"] == "softmax+pretrain" and results["k"] is None


@pytest.mark.parametrize("argv, message", [
    (["missing.pt"], "no checkpoint at missing.pt"),
    (["ckpt.pt", "--before", "8"], "--before converts the --teacher"),
    ([], "give at least one checkpoint"),
])
def test_analyze_attention_errors_are_one_line(tmp_path, argv, message):
    result = run("analyze_attention.py", *argv, cwd=tmp_path, check=False)
    assert result.returncode == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


# -----------------------------------------------------------------------------
# The study driver: plan, run states, results

def test_plan_covers_every_row_the_issue_asks_for(tmp_path):
    lm = study.lm_runs(str(tmp_path), study.LM_SIZES["full"])
    rows = {(r.row["model"], r.row["init"], r.row["k"], r.row["seed"]) for r in lm}
    for model, k in (("t2r", 32), ("elu", 64), ("rfa", 32), ("t2r75", 32)):
        assert {(model, "pretrained", k, 0), (model, "pretrained", k, 1)} <= rows
    for model, k in (("t2r", 32), ("elu", 64), ("rfa", 32)):
        assert (model, "random", k, 0) in rows
    for k in study.FEATURE_SIZES:
        assert {("t2r", "pretrained", k, 0), ("t2r", "random", k, 0), ("t2r-frozen", "pretrained", k, 0)} <= rows
    assert lm[0].row["model"] == "softmax", "the teacher trains first"
    size = study.LM_SIZES["full"]
    teacher_ckpt = os.path.join(study.out_dir_of(lm[0]), "ckpt.pt")
    for r in lm:
        flags = r.flags
        value = lambda name: flags[flags.index(name) + 1] if name in flags else None
        if r.row["init"] == "random":  # the teacher's budget, from scratch
            assert value("--max_steps") == str(size["pretrain_steps"]) and value("--init") is None
            assert value("--lr") == str(study.LM_LR["pretrain"]) and value("--d_model") == "128"
        else:  # a quarter of it, from the teacher
            assert value("--max_steps") == str(size["finetune_steps"]) and value("--init") == "pretrained"
            assert value("--lr") == str(study.LM_LR["finetune"]) and value("--pretrained") == teacher_ckpt
        assert ("--keep_softmax_every" in flags) == (r.row["model"] == "t2r75") and value("--keep_softmax_every") in (None, "4")
        assert ("--freeze_feature_map" in flags) == (r.row["model"] == "t2r-frozen")
        assert value("--attn") == {"t2r75": "t2r", "t2r-frozen": "t2r"}.get(r.row["model"], r.row["model"])
        assert value("--seed") == str(r.row["seed"]) and value("--out_dir") == os.path.join(str(tmp_path), "lm", r.name)
        if r.row["model"] != "softmax":
            assert value("--feature_size") == str(r.row["k"])
    assert 4 * size["finetune_steps"] == size["pretrain_steps"]
    assert len({r.name for r in lm}) == len(lm), "two runs share an out_dir"
    mt = study.mt_runs(str(tmp_path), study.MT_SIZES["full"])
    assert [(r.row["model"], r.row["init"]) for r in mt] == [
        ("softmax", "random"), ("t2r", "pretrained"), ("elu", "pretrained"), ("t2r", "random")]


def test_run_states_skip_done_and_resume_interrupted(tmp_path):
    run_ = study.Run("x", "train_lm.py", ["--max_steps", "3", "--out_dir", str(tmp_path / "x")])
    assert study.run_state(str(tmp_path / "x")) == "todo" and "--resume" not in study.command(run_)
    os.makedirs(tmp_path / "x")
    (tmp_path / "x" / "ckpt.pt").write_bytes(b"")
    assert study.run_state(str(tmp_path / "x")) == "interrupted" and study.command(run_)[-1] == "--resume"
    (tmp_path / "x" / "results.json").write_text("{}")
    assert study.run_state(str(tmp_path / "x")) == "done"


def fake_lm_results(out_dir, valid, test, minutes):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"valid": {"ppl": valid}, "test": {"ppl": test}, "train_minutes": minutes}, f)


def test_results_tables_and_claims_from_made_up_runs(tmp_path):
    out, results = str(tmp_path / "study"), str(tmp_path / "results")
    lm_plan = study.lm_runs(out, study.LM_SIZES["quick"])
    mt_plan = study.mt_runs(out, study.MT_SIZES["quick"])
    ppl = {"softmax": 100.0, "t2r": 110.0, "t2r75": 102.0, "elu": 130.0, "rfa": 125.0, "t2r-frozen": 115.0}
    from_scratch = {"softmax": 0.0, "t2r": 20.0, "elu": 5.0, "rfa": 5.0}  # what random init costs each kind
    for r in lm_plan:
        row = r.row
        k = row["k"] or 64
        value = ppl[row["model"]] + 40 / k + row["seed"]
        if row["init"] == "random":
            value += from_scratch[row["model"]] + (80 / k if row["model"] == "t2r" else 0)
        fake_lm_results(study.out_dir_of(r), value, value - 5, 9.0 if row["init"] == "random" else 2.0)
    bleu = {("softmax", "random"): 20.0, ("t2r", "pretrained"): 19.5, ("elu", "pretrained"): 19.0, ("t2r", "random"): 17.0}
    speed = {"softmax": 500.0, "t2r": 900.0, "elu": 800.0}
    for r in mt_plan:
        d = study.out_dir_of(r)
        os.makedirs(d)
        b = bleu[(r.row["model"], r.row["init"])]
        with open(os.path.join(d, "results.json"), "w") as f:
            json.dump({"valid": {"bleu": b + 1}, "test": {"bleu": b, "tok_bleu": b + 0.5}, "train_minutes": 3.0,
                       "k_cross": None if r.row["model"] == "softmax" else 32, "k_causal": 4}, f)
        with open(os.path.join(d, "speed.json"), "w") as f:
            json.dump({"tokens_per_s": speed[r.row["model"]]}, f)
    # the analysis' raw table, as analyze_attention.py writes it
    raw = os.path.join(out, "attention", "raw.csv")
    os.makedirs(os.path.dirname(raw))
    lines = ["model,stage,attn,k,distance,entropy,empty_rows,windows", "teacher.pt,teacher,softmax,,,2.0,0.0,4"]
    for k in study.FEATURE_SIZES:
        lines.append(f"teacher -> t2r k={k},before finetuning,t2r,{k},{1.0 / k + 0.5},5.0,0.0,4")
    for stage, k, r in study.attention_checkpoints(lm_plan):
        distance = {"finetuned": 0.1, "mlp_frozen": 0.2, "random_init": ""}[stage]
        distance = distance if distance == "" else distance + 1 / k
        entropy = {"finetuned": 3.0, "mlp_frozen": 3.5, "random_init": 4.0}[stage] - k / 100
        lines.append(f"{os.path.join(study.out_dir_of(r), 'ckpt.pt')},x,t2r,{k},{distance},{entropy},0.0,4")
    with open(raw, "w") as f:
        f.write("\n".join(lines) + "\n")

    study.write_results(out, results, lm_plan, mt_plan)
    with open(os.path.join(results, "lm_ptb.csv")) as f:
        lm = list(csv.DictReader(f))
    assert list(lm[0]) == ["model", "init", "k", "seed", "valid_ppl", "test_ppl", "train_minutes"]
    assert {r["model"] for r in lm} == {"softmax", "elu", "rfa", "t2r", "t2r75"}
    assert {r["k"] for r in lm if r["model"] in ("t2r", "rfa", "t2r75")} == {"32"}, "Table 1 is at k = 32"
    with open(os.path.join(results, "mt.csv")) as f:
        mt = list(csv.DictReader(f))
    assert list(mt[0]) == ["model", "init", "k_cross", "k_causal", "bleu", "tokens_per_s"] and len(mt) == 4
    with open(os.path.join(results, "attention.csv")) as f:
        att = list(csv.DictReader(f))
    assert {r["stage"] for r in att} == {"teacher", "before_finetuning", "finetuned", "mlp_frozen", "random_init"}
    assert os.path.isfile(os.path.join(results, "feature_size.png"))
    assert os.path.isfile(os.path.join(results, "attention.png"))
    with open(os.path.join(results, "study.md")) as f:
        text = f.read()
    print(text)
    # the made-up numbers are built so that every claim holds; the 75% hybrid closes (106.75 - 98.75) /
    # (106.75 - 96.125) = 75% of the gap to the softmax control (test perplexities, means over the two seeds)
    assert "**no**" not in text and "within noise" not in text and "n/a" not in text
    assert "75% of the gap closed" in text and "| Transformer trained on for the finetuning steps (control) | - | 2 |" in text
    claims = text.split("### The paper's claims and ours")[1].split("\n\n")[1].splitlines()[2:]
    assert len(claims) == 16 and all(line.endswith("| yes |") for line in claims), claims  # 5 LM, 7 Figs. 4-6, 4 MT
    assert "| T2R + pretrain | 32 | 2 | 111.75 ± 0.50 |" in text  # two seeds: mean and half the range


def test_a_claim_that_does_not_hold_says_no():
    mt = [dict(model="softmax", init="random", bleu=20.0, tokens_per_s=500.0),
          dict(model="t2r", init="pretrained", bleu=17.0, tokens_per_s=700.0),
          dict(model="elu", init="pretrained", bleu=19.0, tokens_per_s=800.0),
          dict(model="t2r", init="random", bleu=18.0, tokens_per_s=700.0)]
    held = {claim: ok for claim, _, _, ok in study.mt_claims(mt)}
    assert list(held.values()) == ["**no**"] * 4 and len(held) == 4
    assert "| **no** |" in "\n".join(study.claims_table(study.mt_claims(mt)))


def test_speed_claim_is_within_noise_when_the_passes_overlap():
    mt = [dict(model="softmax", init="random", bleu=20.0, tokens_per_s=700.0, speed_low=650.0, speed_high=760.0),
          dict(model="t2r", init="pretrained", bleu=19.5, tokens_per_s=740.0, speed_low=720.0, speed_high=790.0),
          dict(model="elu", init="pretrained", bleu=19.0, tokens_per_s=600.0, speed_low=590.0, speed_high=610.0)]
    assert study.mt_claims(mt)[-1][3] == "within noise"
    mt[0].update(speed_high=710.0)  # now every T2R pass beats every softmax and ELU pass
    assert study.mt_claims(mt)[-1][3] == "yes"


def lm_row(model, init, test, seed=0, k=32, minutes=1.0):
    k = None if model == "softmax" else (64 if model == "elu" else k)
    return dict(model=model, init=init, k=k, seed=seed, valid_ppl=test + 5, test_ppl=test, train_minutes=minutes)


def test_lm_claims_say_no_within_noise_and_not_applicable():
    base = [lm_row("softmax", "random", 120.0), lm_row("t2r", "random", 130.0), lm_row("elu", "random", 131.0),
            lm_row("rfa", "random", 132.0), lm_row("t2r75", "pretrained", 115.0)]
    # T2R + pretrain ahead of ELU by 1 with seeds 3 apart: the ordering holds, inside the spread
    close = base + [lm_row("t2r", "pretrained", 100.0 + s, s) for s in (0, 3)] + \
        [lm_row("elu", "pretrained", 102.5 + s, s) for s in (0, 3)] + [lm_row("rfa", "pretrained", 140.0 + s, s) for s in (0, 3)]
    held = [c[3] for c in study.lm_claims(close)]
    assert held[0] == "within noise"
    assert held[3:5] == ["**no**", "n/a"], "T2R (101.5) is ahead of softmax (120): there is no gap to close"
    worse = base + [lm_row("t2r", "pretrained", 135.0)] + [lm_row("elu", "pretrained", 125.0)] + \
        [lm_row("rfa", "pretrained", 126.0)]
    held = [c[3] for c in study.lm_claims(worse)]
    assert held == ["**no**", "**no**", "**no**", "yes", "yes"], held  # 75% hybrid: (135 - 115) / (135 - 120) > 0.5


def test_feature_claims_say_no():
    fs = [dict(variant="pretrained", k=k, valid_ppl=100.0) for k in (4, 64)] + \
        [dict(variant="random", k=k, valid_ppl=v) for k, v in ((4, 101.0), (64, 110.0))]
    att = [dict(stage=stage, k=k, distance=d, entropy=e, valid_ppl=p) for stage, k, d, e, p in (
        ("before_finetuning", 4, 0.5, 5.0, None), ("before_finetuning", 64, 0.5, 5.0, None),
        ("finetuned", 4, 0.6, 3.0, 100.0), ("finetuned", 64, 0.7, 3.5, 100.0),
        ("mlp_frozen", 4, 0.5, 3.0, None), ("mlp_frozen", 64, 0.6, 3.0, None),
        ("random_init", 4, None, 2.0, 101.0), ("random_init", 64, None, 2.5, 110.0))]
    held = {claim.split(":")[1].strip(): v for claim, _, _, v in study.feature_claims(fs, att)}
    print(held)
    assert set(held.values()) == {"**no**"} and len(held) == 7
