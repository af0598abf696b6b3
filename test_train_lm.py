"""End-to-end tests of train_lm.py and generate.py on a tiny corpus: the main job, exact resume, DDP,
and the one-line errors. Each runs the scripts as a user would, in a fresh folder.

    python -m pytest -q -s test_train_lm.py
"""

import json

import pytest
import torch

import train_lm

from conftest import TINY, assert_flags_refused, assert_one_line_error, run, run_two_processes, write_corpus


def test_main_job_end_to_end(tmp_path, corpus):
    """--init pretrained alone: pretrain the teacher, convert, finetune, evaluate both; then generate."""
    out = run("train_lm.py", "--init", "pretrained", "--dataset", corpus, "--max_steps", "6", *TINY, cwd=tmp_path)
    print(out.stdout[-1500:])
    assert "training it first" in out.stdout
    assert "| softmax (pretrained) | - |" in out.stdout and "| t2r+pretrain | 8 |" in out.stdout
    teacher = torch.load(tmp_path / "out/tiny-softmax-random/ckpt.pt", weights_only=True)
    student = torch.load(tmp_path / "out/tiny-t2r-pretrained/ckpt.pt", weights_only=True)
    assert teacher["step"] == 12 and student["step"] == 6  # the teacher gets twice the finetuning steps
    assert student["config"]["attn"] == ["t2r", "t2r"]
    # generate past the training length (32 tokens) with the folded recurrent form, and check it
    student_ckpt = "out/tiny-t2r-pretrained/model.pt"
    gen = run("generate.py", "--ckpt", student_ckpt, "--prompt", "w1 w2 w3", "--num_tokens", "80", "--check", "--temperature", "0.8",
              "--top_k", "5", cwd=tmp_path)
    print(gen.stdout[-600:])
    assert "folded, Eq. 8" in gen.stdout and "tokens/s" in gen.stdout
    diff = float(gen.stdout.split("logits = ")[1].split()[0])
    assert diff < 1e-3
    same = run("generate.py", "--ckpt", student_ckpt, "--prompt", "w1 w2 w3", "--num_tokens", "80", "--temperature", "0.8", "--top_k", "5",
               cwd=tmp_path)
    assert same.stdout.split("\n")[1] == gen.stdout.split("\n")[1]  # seeded sampling is reproducible
    softmax = run("generate.py", "--ckpt", "out/tiny-softmax-random/model.pt", "--mode", "recompute",
                  "--temperature", "0", "--num_tokens", "5", cwd=tmp_path)
    assert "KV cache" not in softmax.stdout.split("\n")[0] and "mode recompute" in softmax.stdout
    again = run("train_lm.py", "--init", "pretrained", "--dataset", corpus, "--max_steps", "6", *TINY, cwd=tmp_path,
                check=False)
    assert_one_line_error(again, "exists", "--resume")
    # --eval_only takes the run's flags from its folder and labels it as the run it evaluates
    evaluated = run("train_lm.py", "--eval_only", "--out_dir", "out/tiny-t2r-pretrained", cwd=tmp_path)
    assert "valid ppl" in evaluated.stdout
    results = json.loads((tmp_path / "out/tiny-t2r-pretrained/results.json").read_text())
    assert results["attn"] == "t2r+pretrain" and results["k"] == 8


def final_state(path):
    checkpoint = torch.load(path, weights_only=True)
    return checkpoint["model"], checkpoint["optimizer"]["state"]


@pytest.mark.parametrize("attn", ["softmax", "rfa"])  # rfa: random features redrawn every step must resume too
def test_resume_is_exact(tmp_path, corpus, attn):
    common = ["--dataset", corpus, "--attn", attn, "--max_steps", "8", "--dropout", "0.1", *TINY]
    run("train_lm.py", *common, "--out_dir", "straight", cwd=tmp_path)
    stopped = run("train_lm.py", *common, "--out_dir", "split", "--stop_at", "3", cwd=tmp_path)
    assert "stopped at step 3 of 8" in stopped.stdout
    run("train_lm.py", "--resume", "--out_dir", "split", cwd=tmp_path)  # every other flag comes from the run
    a, opt_a = final_state(tmp_path / "straight/ckpt.pt")
    b, opt_b = final_state(tmp_path / "split/ckpt.pt")
    diff = max((a[k].double() - b[k].double()).abs().max().item() for k in a)
    print(f"{attn}: max |straight - resumed| parameter = {diff}")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(torch.equal(opt_a[i]["exp_avg"], opt_b[i]["exp_avg"]) for i in opt_a)


def test_ddp_gloo_two_processes(tmp_path, corpus):
    run_two_processes("train_lm.py", "--dataset", corpus, "--attn", "t2r", "--max_steps", "4", *TINY, cwd=tmp_path)
    checkpoint = torch.load(tmp_path / "out/tiny-t2r-random/ckpt.pt", weights_only=True)
    assert checkpoint["step"] == 4 and len(checkpoint["rng"]) == 2  # each process's batch stream is saved


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished softmax run and a finished T2R run from scratch on the tiny corpus."""
    tmp = tmp_path_factory.mktemp("lm")
    corpus = write_corpus(str(tmp / "tiny"))
    for attn in ("softmax", "t2r"):
        run("train_lm.py", "--dataset", corpus, "--attn", attn, "--max_steps", "2", *TINY, cwd=tmp)
    return tmp, corpus


def test_softmax_control_continues_the_teacher(trained, tmp_path):
    """--init pretrained --attn softmax: the teacher trained on for the finetuning budget, no swap."""
    tmp, corpus = trained
    out = run("train_lm.py", "--init", "pretrained", "--attn", "softmax", "--dataset", corpus, "--pretrained",
              str(tmp / "out/tiny-softmax-random/model.pt"), "--max_steps", "2", *TINY, "--out_dir", str(tmp_path / "c"),
              cwd=tmp)
    assert "unchanged (softmax)" in out.stdout
    assert torch.load(tmp_path / "c/model.pt", weights_only=True)["config"]["attn"] == "softmax"


def test_a_truncated_checkpoint_is_refused_and_kept(trained, tmp_path):
    tmp, corpus = trained
    good = (tmp / "out/tiny-softmax-random/ckpt.pt").read_bytes()
    (tmp_path / "run").mkdir()
    ckpt = tmp_path / "run/ckpt.pt"
    ckpt.write_bytes(good[: len(good) // 2])  # truncated, as by a full disk
    result = run("train_lm.py", "--dataset", corpus, "--resume", "--out_dir", str(tmp_path / "run"), *TINY,
                 cwd=tmp, check=False)
    assert_one_line_error(result, "truncated or corrupt")
    assert ckpt.read_bytes() == good[: len(good) // 2]  # nothing was overwritten
    assert_one_line_error(run("generate.py", "--ckpt", str(ckpt), cwd=tmp, check=False), "truncated or corrupt")


@pytest.mark.parametrize("name, flags, message", [
    ("another vocabulary", ["--init", "pretrained", "--pretrained", "out/tiny-softmax-random/model.pt",
                            "--dataset", "other"], "vocabulary"),
    ("a converted teacher", ["--init", "pretrained", "--pretrained", "out/tiny-t2r-random/model.pt"],
     "already converted"),
    ("another size on resume", ["--resume", "--out_dir", "out/tiny-softmax-random", "--n_layer", "3"], "n_layer"),
    ("heads that do not divide the width", ["--n_head", "3"], "divisible"),
    ("a block longer than the data", ["--block_size", "100000"], "--block_size"),
    ("a finished run again", ["--out_dir", "out/tiny-softmax-random"], "exists"),
])
def test_train_lm_refuses(trained, tmp_path, name, flags, message):
    tmp, corpus = trained
    write_corpus(str(tmp / "other"), seed=1, words=25)
    flags = [f if f != "other" else str(tmp / "other") for f in flags]
    defaults = ["--dataset", corpus, *TINY, "--max_steps", "2", "--out_dir", str(tmp_path / "new")]
    given = {f for f in flags if f.startswith("--")}
    argv = [a for i, a in enumerate(defaults) if not (a in given or (i and defaults[i - 1] in given))] + flags
    assert_one_line_error(run("train_lm.py", *argv, cwd=tmp, check=False), message)


def test_a_missing_dataset_is_a_one_line_error(tmp_path):
    assert_one_line_error(run("train_lm.py", "--dataset", "missing", cwd=tmp_path, check=False), "missing")


@pytest.mark.parametrize("argv, message", [
    (["--no_such_flag"], "unrecognized arguments: --no_such_flag"),
    (["--max_steps", "many"], "--max_steps: 'many' is not a number"),
    (["--eval_score", "600"], "--eval_score must be between 1 and --eval_context"),
    (["--n_layer", "0"], "--n_layer: 0 is not a positive integer"),
    (["--n_head", "-1"], "--n_head: -1 is not a positive integer"),
    (["--lr", "inf"], "--lr: inf is not a positive finite number"),
    (["--lr", "nan"], "--lr: nan is not a positive finite number"),
    (["--min_lr_ratio", "-5"], "--min_lr_ratio: -5 is not in [0, 1]"),
    (["--dropout", "1"], "--dropout: 1 is not in [0, 1)"),
    (["--log_interval", "0"], "--log_interval: 0 is not a positive integer"),
    (["--eval_windows", "0"], "--eval_windows: 0 is not a positive integer"),
    (["--chunk_size", "-1"], "--chunk_size: -1 is not an integer >= 0"),
    (["--device", "foo"], "--device: 'foo' is no device"),
])
def test_bad_flags_are_refused_before_any_work(capsys, argv, message):
    assert_flags_refused(train_lm.get_args, argv, message, capsys)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_on_a_machine_without_it_is_refused(capsys):
    with pytest.raises(SystemExit):
        train_lm.get_args(["--device", "cuda"])
    assert "no such CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--ckpt", "nope.pt"], "no checkpoint"),
    (["--ckpt", "out/tiny-softmax-random/model.pt", "--prompt", "  "], "empty"),
])
def test_generate_refuses(trained, argv, message):
    tmp, _ = trained
    assert_one_line_error(run("generate.py", *argv, cwd=tmp, check=False), message)
