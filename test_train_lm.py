"""End-to-end tests of train_lm.py and generate.py on a tiny corpus: the main job, exact resume, DDP,
and the one-line errors. Each runs the scripts as a user would, in a fresh folder.

    python -m pytest -q -s test_train_lm.py
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, TINY, assert_one_line_error, run, write_corpus


def test_main_job_end_to_end(tmp_path, corpus):
    """--init pretrained alone: pretrain the teacher, convert, finetune, evaluate both; then generate."""
    out = run("train_lm.py", "--init", "pretrained", "--dataset", corpus, "--max_steps", "6", *TINY, cwd=tmp_path)
    print(out.stdout[-1500:])
    assert "training the softmax model first" in out.stdout
    assert "| softmax (pretrained) | - |" in out.stdout and "| t2r+pretrain | 8 |" in out.stdout
    teacher = torch.load(tmp_path / "out/tiny-softmax-random/ckpt.pt", weights_only=True)
    student = torch.load(tmp_path / "out/tiny-t2r-pretrained/ckpt.pt", weights_only=True)
    assert teacher["step"] == 12 and student["step"] == 6  # the teacher gets twice the finetuning steps
    assert student["config"]["attn"] == ["t2r", "t2r"]
    # generate past the training length (32 tokens) with the folded recurrent form, and check it
    student_ckpt = "out/tiny-t2r-pretrained/ckpt.pt"
    gen = run("generate.py", "--ckpt", student_ckpt, "--prompt", "w1 w2 w3", "--num_tokens", "80", "--check", "--temperature", "0.8",
              "--top_k", "5", cwd=tmp_path)
    print(gen.stdout[-600:])
    assert "folded, Eq. 8" in gen.stdout and "tokens/s" in gen.stdout
    diff = float(gen.stdout.split("logits = ")[1].split()[0])
    assert diff < 1e-3
    same = run("generate.py", "--ckpt", student_ckpt, "--prompt", "w1 w2 w3", "--num_tokens", "80", "--temperature", "0.8", "--top_k", "5",
               cwd=tmp_path)
    assert same.stdout.split("\n")[1] == gen.stdout.split("\n")[1]  # seeded sampling is reproducible
    softmax = run("generate.py", "--ckpt", "out/tiny-softmax-random/ckpt.pt", "--mode", "recompute",
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
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         os.path.join(ROOT, "train_lm.py"), "--dataset", corpus, "--attn", "t2r", "--max_steps", "4", *TINY],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    print(result.stdout[-800:])
    checkpoint = torch.load(tmp_path / "out/tiny-t2r-random/ckpt.pt", weights_only=True)
    assert checkpoint["step"] == 4 and len(checkpoint["rng"]) == 2  # each process's batch stream is saved


def test_errors_are_one_line_and_lose_nothing(tmp_path, corpus):
    assert_one_line_error(run("train_lm.py", "--dataset", str(tmp_path / "missing"), cwd=tmp_path, check=False),
                          "missing")
    assert_one_line_error(run("train_lm.py", "--no_such_flag", cwd=tmp_path, check=False), "--no_such_flag", "--help")
    assert_one_line_error(run("train_lm.py", "--max_steps", "many", cwd=tmp_path, check=False), "max_steps")

    run("train_lm.py", "--dataset", corpus, "--max_steps", "2", *TINY, cwd=tmp_path)
    ckpt = tmp_path / "out/tiny-softmax-random/ckpt.pt"
    good = ckpt.read_bytes()
    ckpt.write_bytes(good[: len(good) // 2])  # truncated, as by a full disk
    truncated = ckpt.read_bytes()
    assert_one_line_error(run("train_lm.py", "--dataset", corpus, "--max_steps", "2", "--resume", *TINY,
                              cwd=tmp_path, check=False), "truncated or corrupt")
    assert ckpt.read_bytes() == truncated  # nothing was overwritten
    assert_one_line_error(run("generate.py", "--ckpt", str(ckpt), cwd=tmp_path, check=False), "truncated or corrupt")
    ckpt.write_bytes(good)

    other = write_corpus(str(tmp_path / "other"), seed=1, words=25)
    assert_one_line_error(run("train_lm.py", "--init", "pretrained", "--dataset", other, "--pretrained", str(ckpt),
                              *TINY, cwd=tmp_path, check=False), "vocabulary")
    run("train_lm.py", "--dataset", corpus, "--attn", "t2r", "--max_steps", "2", *TINY, cwd=tmp_path)
    converted = str(tmp_path / "out/tiny-t2r-random/ckpt.pt")
    assert_one_line_error(run("train_lm.py", "--init", "pretrained", "--dataset", corpus, "--pretrained", converted,
                              "--out_dir", "x", *TINY, cwd=tmp_path, check=False), "already converted")
    assert_one_line_error(run("train_lm.py", "--dataset", corpus, "--resume", "--max_steps", "2", "--n_layer", "3", *TINY[2:],
                              cwd=tmp_path, check=False), "n_layer")
    assert_one_line_error(run("generate.py", "--ckpt", str(ckpt), "--prompt", "  ", cwd=tmp_path, check=False),
                          "empty")
    assert_one_line_error(run("train_lm.py", "--dataset", corpus, "--n_head", "3", *TINY[:2], *TINY[4:],
                              "--out_dir", "y", cwd=tmp_path, check=False), "bad model flags", "divisible")
    assert_one_line_error(run("train_lm.py", "--dataset", corpus, *TINY, "--block_size", "100000", "--out_dir", "z",
                              cwd=tmp_path, check=False), "--block_size")
    assert_one_line_error(run("generate.py", "--ckpt", str(tmp_path / "nope.pt"), cwd=tmp_path, check=False),
                          "no checkpoint")
