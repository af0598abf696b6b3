"""Tests of attention transfer (the feature maps learn to imitate softmax before finetuning): the carried-forward run
is the teacher's, the error is zero where linear attention is given softmax's weights, only the feature maps and
window gates learn, and the error falls; then the transfer stage and --window in both trainers.

    python -m pytest -q -s tests/test_transfer.py
"""

import json
import os
import signal
import subprocess
import sys
import types

import pytest
import torch

import after_t2r
from conftest import (MT_TINY, ROOT, SCRIPT_ENV, TINY, assert_check_passes, assert_one_line_error, lm_config, make,
                      mt_config, report, run_in_process, translations_in_process, write_corpus)
from support.runtime import write_json
from support.transfer import TransferFirst
from t2r import Seq2SeqTransformer, TransformerLM

T = 9


def is_new(name: str) -> bool:  # what a conversion adds: feature maps, window gates
    return ".feature_map." in name or name.endswith(".window_gate")


def lm_pair(window=0):
    """A softmax LM (float64, eval) and its conversion to T2R."""
    teacher = make(TransformerLM, lm_config("softmax"))
    return teacher, after_t2r.convert_to_window(teacher, window, "t2r", feature_size=6)


def mt_pair(window=0):
    teacher = make(Seq2SeqTransformer, mt_config("softmax"))
    return teacher, after_t2r.convert_to_window(teacher, window, "t2r", feature_size=4, cross_feature_size=6)


def mt_batch():
    g = torch.Generator().manual_seed(2)
    src, tgt = torch.randint(1, 37, (2, 6), generator=g), torch.randint(1, 37, (2, T), generator=g)
    src[1, 4:], tgt[1, 6:] = 0, 0  # padding (pad_id 0) in the second sentence
    return src, tgt


def lm_batch():
    return (torch.randint(0, 37, (2, T), generator=torch.Generator().manual_seed(1)),)


@pytest.mark.parametrize("window", [0, 3])
@pytest.mark.parametrize("pair, batch", [(lm_pair, lm_batch), (mt_pair, mt_batch)], ids=["lm", "translator"])
def test_the_carried_forward_run_is_the_teachers(pair, batch, window):
    teacher, student = pair(window)
    inputs = batch()
    with torch.no_grad():
        errors, logits = after_t2r.attention_transfer(student, *inputs)
        expected = teacher(*inputs)
    assert report(f"transfer run vs teacher logits (W={window})", (logits - expected).abs().max()) == 0
    assert len(errors) == len(after_t2r.linear_attention_layers(student)) and (errors > 0).all()


def test_the_transfer_run_under_torch_compile_then_the_student_again():
    """Training compiles the model on CUDA: the transfer call swaps each layer's forward for one call under it, and
    the next call is the student's own forward again (the eager backend traces without compiling C++)."""
    teacher, student = lm_pair()
    compiled, inputs = torch.compile(student, backend="eager"), lm_batch()
    with torch.no_grad():
        _, logits = after_t2r.attention_transfer(compiled, *inputs)
        diffs = ((logits - teacher(*inputs)).abs().max(), (compiled(*inputs) - student(*inputs)).abs().max())
    assert report("compiled transfer run vs teacher logits", diffs[0]) < 1e-9
    assert report("compiled student after it vs the student", diffs[1]) < 1e-9
    assert (logits - student(*inputs)).abs().max() > 0  # the student is not the teacher: the forward was restored


def test_the_error_is_zero_where_the_window_covers_the_text():
    _, student = lm_pair(window=T)  # softmax over the last T tokens: all of them
    errors, _ = after_t2r.attention_transfer(student, *lm_batch())
    assert report("transfer error, W = T", errors.abs().max()) < 1e-25


def test_the_translators_cross_attention_has_its_own_error():
    _, student = mt_pair(window=T)
    names = [name for name, _ in after_t2r.linear_attention_layers(student)]
    errors, _ = after_t2r.attention_transfer(student, *mt_batch(), mask=mt_batch()[1] != 0)
    causal = torch.stack([e for e, n in zip(errors, names) if "self_attn" in n])
    cross = torch.stack([e for e, n in zip(errors, names) if "cross_attn" in n])
    print(dict(zip(names, errors.tolist())))
    assert len(causal) == len(cross) == 2 and report("causal, W = T", causal.abs().max()) < 1e-25
    assert (cross > 1e-6).all()


def test_padded_queries_do_not_count():
    _, student = mt_pair()
    src, tgt = mt_batch()
    errors, _ = after_t2r.attention_transfer(student, src, tgt, mask=tgt != 0)
    tgt_other_padding = tgt.clone()
    tgt_other_padding[1, 6:] = 5  # other tokens where the mask is off: causal attention keeps them out of the rest
    again, _ = after_t2r.attention_transfer(student, src, tgt_other_padding, mask=tgt != 0)
    assert report("masked error, other padding", (errors - again).abs().max()) < 1e-15


@pytest.mark.parametrize("window", [0, 3])
def test_only_feature_maps_and_window_gates_get_gradients(window):
    _, student = lm_pair(window)
    errors, _ = after_t2r.attention_transfer(student.train(), *lm_batch())
    errors.sum().backward()
    learned = {name for name, p in student.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert learned and all(is_new(name) for name in learned), sorted(learned)
    assert any(name.endswith("window_gate") for name in learned) == bool(window)


def test_the_error_of_every_layer_falls():
    _, student = lm_pair(window=2)
    params = [p for name, p in student.named_parameters() if is_new(name)]
    optimizer = torch.optim.Adam(params, lr=1e-2)
    tokens = torch.randint(0, 37, (8, 16), generator=torch.Generator().manual_seed(5))
    history = []
    for _ in range(40):
        errors, _ = after_t2r.attention_transfer(student, tokens)
        optimizer.zero_grad()
        errors.sum().backward()
        optimizer.step()
        history.append(errors.detach())
    print(f"per-layer error, step 1: {history[0].tolist()}, step 40: {history[-1].tolist()}")
    assert (history[-1] < 0.7 * history[0]).all()


def test_a_softmax_model_has_nothing_to_transfer():
    teacher, _ = lm_pair()
    with pytest.raises(ValueError, match="no linear attention"):
        after_t2r.attention_transfer(teacher, *lm_batch())


# -----------------------------------------------------------------------------
# The transfer stage and --window in the trainers

@pytest.fixture(scope="module")
def lm_teacher(tmp_path_factory):
    """A finished tiny softmax LM: (folder, corpus, its model.pt)."""
    tmp = tmp_path_factory.mktemp("transfer")
    corpus = write_corpus(str(tmp / "tiny"))
    run_in_process("train_lm.py", "--dataset", corpus, "--max_steps", "4", *TINY, "--out_dir", "teacher", cwd=tmp,
                   check=True)
    return tmp, corpus, str(tmp / "teacher/model.pt")


@pytest.fixture(scope="module")
def straight_transfer(lm_teacher):
    """A conversion with a 4-step transfer stage (a window and dropout: both resumed) run without a stop: (its folder,
    its flags, its output)."""
    tmp, corpus, teacher = lm_teacher
    common = ["--dataset", corpus, *TINY, "--init", "pretrained", "--pretrained", teacher, "--transfer_steps", "4",
              "--max_steps", "3", "--window", "4", "--dropout", "0.1"]
    straight = run_in_process("train_lm.py", *common, "--out_dir", "straight", cwd=tmp)
    assert straight.returncode == 0, straight.stderr
    return tmp, common, straight


def assert_same_run(tmp, run_dir):
    """run_dir's last checkpoint is the uninterrupted run's: its step, its scores after the stage, its weights bit for
    bit (the same machine, one thread: the same float32 operations in the same order)."""
    a, b = (torch.load(tmp / name / "ckpt.pt", weights_only=True) for name in ("straight", run_dir))
    assert a["step"] == b["step"] == 7 and b["after_transfer"], f"{run_dir}: step {b['step']}, no scores after the stage"
    assert all(a["after_transfer"][split] == b["after_transfer"][split] for split in ("valid", "test"))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_lm_transfer_stage_resumes_exactly_reports_and_generates(straight_transfer, run_here):
    tmp, common, straight = straight_transfer
    in_process = lambda script, *argv: run_here(script, *argv, cwd=tmp)  # no subprocess: no torch import each
    assert "step 4/7 (transfer)" in straight.stdout and "transfer error by layer: 0.self" in straight.stdout
    assert in_process("train_lm.py", *common, "--out_dir", "split", "--stop_at", "2").returncode == 0  # mid-transfer
    assert in_process("train_lm.py", "--resume", "--out_dir", "split").returncode == 0
    assert_same_run(tmp, "split")
    results = json.loads((tmp / "straight/results.json").read_text())
    assert results["attn"] == "t2r+transfer+window4+pretrain"
    print(f"after transfer {results['after_transfer']['valid']['ppl']:.2f}, finetuned {results['valid']['ppl']:.2f}")
    # generate.py samples from the window model with its recurrent form
    out = in_process("generate.py", "--ckpt", "straight/model.pt", "--prompt", "w1 w2", "--num_tokens", "12", "--check")
    assert "softmax window of 4" in out.stdout, out.stdout
    assert_check_passes(out.stdout)


# train_lm.py stopped by a signal it sends itself at a chosen point, as a user's `kill` or a cluster's preemption
# would stop it there: during the stage's n-th batch (SIGTERM: the step ends and saves; SIGKILL: gone at once), or
# right after the evaluation that ends the stage. argv: the point, the signal, n, then train_lm.py's flags.
STOPPED = """
import os, runpy, signal, sys
from support import transfer
point, signum, n = sys.argv[1], getattr(signal, sys.argv[2]), int(sys.argv[3])
batches, transfer_batch, evaluated = [], transfer.attention_transfer, transfer.TransferFirst.after_evaluation

def counting_batches(*args, **kwargs):
    batches.append(1)
    if point == "batch" and len(batches) == n:
        os.kill(os.getpid(), signum)
    return transfer_batch(*args, **kwargs)

def then_stopped(self, model, step, seconds):
    evaluated(self, model, step, seconds)
    if point == "after its evaluation" and step == self.transfer_steps:
        os.kill(os.getpid(), signum)

transfer.attention_transfer, transfer.TransferFirst.after_evaluation = counting_batches, then_stopped
sys.argv = ["train_lm.py", *sys.argv[4:]]
runpy.run_path(os.path.join(os.environ["PYTHONPATH"], "train_lm.py"), run_name="__main__")
"""


def stopped_run(tmp, common, run_dir, point, signal_name, n=0):
    result = subprocess.run([sys.executable, "-c", STOPPED, point, signal_name, str(n), *common, "--out_dir", run_dir],
                            cwd=tmp, capture_output=True, text=True, timeout=300,
                            env={**os.environ, **SCRIPT_ENV, "PYTHONPATH": ROOT})
    print(result.stderr.strip()[-300:])
    return result


@pytest.mark.parametrize("point, signal_name, n", [
    ("batch", "SIGTERM", 3),  # the 3rd of the stage's 4 steps: it ends, is saved, and the run stops
    ("batch", "SIGKILL", 3),  # gone in the 3rd step: the stage's checkpoint at step 2 (TINY's --log_interval) is kept
    ("after its evaluation", "SIGTERM", 0),
    ("after its evaluation", "SIGKILL", 0),  # gone before the stage's scores were saved: evaluated again on --resume
])
def test_a_conversion_stopped_in_the_transfer_stage_resumes_exactly(straight_transfer, run_here, point, signal_name,
                                                                      n):
    tmp, common, _ = straight_transfer
    run_dir = f"stopped-{point.replace(' ', '-')}-{signal_name}"
    stopped = stopped_run(tmp, common, run_dir, point, signal_name, n)
    if signal_name == "SIGTERM":  # as Ctrl-C: the step in progress ends, is saved, and the run says how to go on
        assert stopped.returncode == 130 and "Traceback" not in stopped.stderr, stopped.stderr
        assert f"saved {run_dir}/ckpt.pt; continue with --resume" in stopped.stderr
    else:
        assert stopped.returncode == -signal.SIGKILL, stopped.stderr
    resumed = run_here("train_lm.py", "--resume", "--out_dir", run_dir, cwd=tmp)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_run(tmp, run_dir)


def test_a_conversion_stopped_before_it_saved_says_to_start_again(straight_transfer, run_here):
    """Killed in the stage's first step, before its first checkpoint: --resume says in one line that there is nothing
    to resume and what to do instead, which then trains the run as if it had never stopped."""
    tmp, common, _ = straight_transfer
    assert stopped_run(tmp, common, "first-step", "batch", "SIGKILL", 1).returncode == -signal.SIGKILL
    resumed = run_here("train_lm.py", "--resume", "--out_dir", "first-step", cwd=tmp)
    assert_one_line_error(resumed, "nothing to resume in first-step", "the same command without --resume")
    again = run_here("train_lm.py", *common, "--out_dir", "first-step", cwd=tmp)
    assert again.returncode == 0, again.stderr
    assert_same_run(tmp, "first-step")


def test_the_translator_transfers_and_beam_searches_with_a_window(trained_translator, run_here, tmp_path):
    tmp, corpus, _ = trained_translator
    window = str(tmp_path / "mt-window")
    trained = run_here("train_mt.py", "--init", "pretrained", "--dataset", corpus, *MT_TINY, "--max_steps", "4",
                       "--transfer_steps", "3", "--window", "3", "--out_dir", window, cwd=tmp)
    assert trained.returncode == 0, trained.stderr
    results = json.loads((tmp_path / "mt-window/results.json").read_text())
    assert results["attn"] == "t2r+transfer+window3+pretrain" and "bleu" in results["after_transfer"]["test"]
    out = run_here("translate.py", "--ckpt", f"{window}/model.pt", "--beam", "3", cwd=tmp, stdin="w1 w2 w3\nw4\n")
    same = translations_in_process(f"{window}/model.pt", ["w1 w2 w3", "w4"], "--beam", "3")
    print(same)
    assert out.stdout.splitlines() == same  # the script's beam search on window states is the function's


def test_the_conversion_report_reads_each_rows_three_scores(tmp_path):
    from experiments import conversion
    teacher, students = conversion.plan("lm", str(tmp_path), quick=True)
    assert [r.flags.get("transfer_steps", 0) > 0 for r in students] == [False, True, False, True]
    assert [r.flags.get("window", 0) > 0 for r in students] == [False, False, True, True]

    def scored(ppl, minutes=1.0, **more):
        return {"valid": {"ppl": ppl}, "test": {"ppl": ppl}, "train_minutes": minutes, **more}
    for run_dir, results in [(teacher.out_dir, scored(100.0, 5.0))] + [
            (r.out_dir, scored(90.0 - i, 2.0, **({"after_transfer": scored(200.0 - i, 0.5)}
                                                 if "transfer_steps" in r.flags else {})))
            for i, r in enumerate(students)]:
        os.makedirs(run_dir, exist_ok=True)
        write_json(os.path.join(run_dir, "results.json"), results)
        write_json(os.path.join(run_dir, "after_swap.json"), scored(999.0))
    write_json(os.path.join(students[-1].out_dir, "machine.json"), {"device": "a test machine", "threads": 2,
                                                               "date": "2026-11-23"})
    lines = conversion.table("lm", teacher, students)
    print("\n".join(lines))
    assert lines[0] == "Measured on a test machine (2 threads), 2026-11-23."
    assert lines[4] == "| softmax teacher | - | - | 100.00 | 5.0 |"
    assert lines[6] == "| t2r+transfer | 999.00 | 199.00 | 89.00 | 0.5 + 1.5 |"
    assert lines[7] == "| t2r+window | 999.00 | - | 88.00 | 2.0 |"


def test_finetuning_after_the_stage_goes_on_in_training_mode():
    """A task's report may leave its model in eval mode (MQAR's scores with it); the stage's end puts it back, so
    the finetuning that follows keeps its dropout."""
    class EvalReport:
        args, steps = types.SimpleNamespace(transfer_steps=2), 5

        def report(self, model, train_seconds):
            model.eval()
            return {"scored": True}

    model = torch.nn.Linear(2, 2).train()
    stage = TransferFirst(EvalReport(), None)
    stage.after_evaluation(model, 2, 1.0)
    assert stage.after_transfer == {"scored": True} and model.training
