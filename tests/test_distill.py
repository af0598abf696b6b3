"""Distillation from the teacher's logits (support/distill.py, --distill_weight): the KL term against a float64
formula, its mask, where its gradient goes; the mixed loss at the weight's two ends; the trainers' runs, resumed
exactly with the teacher read again, after attention transfer, and a translator's.

    python -m pytest -q -s tests/test_distill.py
"""

import itertools
import json
import math
from types import SimpleNamespace

import pytest
import torch

from conftest import MT_TINY, TINY, assert_flags_refused, report, run_in_process, write_corpus, write_parallel
from support.distill import DistilledFrom, distillation_loss

import train_lm


def kl_by_hand(student_logits, teacher_logits):
    """sum_v p_t(v) (log p_t(v) - log p_s(v)) at each position, from the softmax's definition, in float64."""
    kl = torch.zeros(student_logits.shape[:-1], dtype=torch.float64)
    for index in itertools.product(*map(range, student_logits.shape[:-1])):
        s, t = student_logits[index].double(), teacher_logits[index].double()
        p_t = t.exp() / t.exp().sum()
        log_p_s, log_p_t = s - math.log(s.exp().sum()), t - math.log(t.exp().sum())
        kl[index] = (p_t * (log_p_t - log_p_s)).sum()
    return kl


def test_the_kl_term_is_the_teachers_divergence_from_the_students():
    """KL(teacher || student), not the reverse: the two differ here by more than the tolerance (0.1 against 1e-12)."""
    g = torch.Generator().manual_seed(0)
    student, teacher = (torch.randn(2, 5, 7, generator=g, dtype=torch.float64) * 2 for _ in range(2))
    expected = kl_by_hand(student, teacher)
    reverse = kl_by_hand(teacher, student)
    assert (expected - reverse).abs().mean() > 0.1
    difference = (distillation_loss(student, teacher) - expected.mean()).abs()
    assert report("distillation_loss - KL by hand", difference) < 1e-12


def test_the_kl_term_counts_only_the_masked_positions():
    g = torch.Generator().manual_seed(1)
    student, teacher = (torch.randn(2, 4, 7, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.tensor([[True, True, False, False], [True, True, True, False]])
    changed = student.clone()
    changed[~mask] += 10.0  # padding: whatever the student says there counts nothing
    assert distillation_loss(changed, teacher, mask) == distillation_loss(student, teacher, mask)
    by_hand = kl_by_hand(student, teacher)[mask].mean()
    assert report("masked KL - by hand", (distillation_loss(student, teacher, mask) - by_hand).abs()) < 1e-12


def test_the_kl_term_is_zero_at_the_teacher_and_its_gradient_goes_to_the_student_only():
    teacher = torch.randn(3, 6, 9, dtype=torch.float64)
    student = teacher.clone().requires_grad_()
    teacher.requires_grad_()
    loss = distillation_loss(student, teacher)
    loss.backward()
    assert abs(loss.item()) < 1e-12 and student.grad.abs().max() < 1e-12  # a minimum: KL >= 0, 0 at p_s = p_t
    moved = (student.detach() + torch.randn_like(student)).requires_grad_()
    distillation_loss(moved, teacher.detach()).backward()
    assert moved.grad.abs().max() > 1e-3


class ToyTask:
    """A task of one fixed batch: its objective the mean squared logit (anything but the KL), no mask."""

    def __init__(self, weight):
        self.args = SimpleNamespace(distill_weight=weight)
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self.inputs, self.targets = torch.randint(0, 11, (2, 6)), torch.randint(0, 11, (2, 6))

    def tokens_per_step(self):
        return 12

    def batch(self, counter):
        return (self.inputs,), self.targets, None

    def objective(self, logits, targets):
        return logits.pow(2).mean()


@pytest.mark.parametrize("weight", [0.0, 0.3, 1.0])
def test_the_mixed_loss_is_the_tasks_and_the_kl_in_the_weights_proportion(weight):
    from conftest import lm_config, make
    from t2r import TransformerLM
    student, teacher = (make(TransformerLM, lm_config(kind, vocab_size=11), torch.float32, seed)
                        for kind, seed in (("t2r", 0), ("softmax", 1)))
    task = ToyTask(weight)
    distilled = DistilledFrom(task, teacher, student)
    loss, tokens = distilled.loss(student, 0, 0)
    logits, teacher_logits = student(task.inputs), teacher(task.inputs)
    expected = (1 - weight) * task.objective(logits, None) + weight * distillation_loss(logits, teacher_logits)
    assert tokens == 12 and report(f"w={weight}: mixed loss - by parts", (loss - expected).abs()) < 1e-6
    assert not any(p.requires_grad for p in distilled.teacher.parameters()) and not distilled.teacher.training


def test_the_memory_estimate_counts_the_frozen_teacher(monkeypatch):
    """A distilled run is refused where it cannot fit with its teacher: the estimate adds the teacher's float32
    weights and a step's teacher logits and their log-softmax to the student's own."""
    from conftest import lm_config, make
    from support import job
    from t2r import TransformerLM
    student, teacher = (make(TransformerLM, lm_config(kind, vocab_size=11, n_layer=n), torch.float32, 0)
                        for kind, n in (("t2r", 2), ("softmax", 3)))
    needed = []
    monkeypatch.setattr(job, "check_fits", lambda bytes_, *_: needed.append(bytes_))
    task = ToyTask(0.5)
    DistilledFrom(task, teacher, student)
    job.check_training_fits(task, lambda: job.meta_twin(student))  # the student alone
    teacher_bytes = 4 * sum(p.numel() for p in teacher.parameters()) + 2 * 4 * task.tokens_per_step() * 11
    assert needed[0] - needed[1] == teacher_bytes


# -----------------------------------------------------------------------------
# The trainers

@pytest.fixture(scope="module")
def lm_teacher(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("distill")
    corpus = write_corpus(str(tmp / "tiny"))
    run_in_process("train_lm.py", "--dataset", corpus, "--max_steps", "4", *TINY, "--out_dir", "teacher", cwd=tmp,
                   check=True)
    return tmp, ["--dataset", corpus, *TINY, "--init", "pretrained", "--pretrained", str(tmp / "teacher/model.pt"),
                 "--max_steps", "6", "--distill_weight", "0.5"]


def test_a_distilled_conversion_resumes_exactly_with_its_teacher_read_again(lm_teacher):
    """Stopped at step 3 and resumed (the teacher is read again: nothing of it is in ckpt.pt), the run ends with the
    weights of the run that never stopped, bit for bit (one process, the same operations); a distilled run's weights
    are not the undistilled run's (the term does something)."""
    tmp, common = lm_teacher
    for out_dir, extra in (("straight", []), ("plain", ["--distill_weight", "0"])):
        run_in_process("train_lm.py", *common, *extra, "--out_dir", out_dir, cwd=tmp, check=True)
    run_in_process("train_lm.py", *common, "--out_dir", "split", "--stop_at", "3", cwd=tmp, check=True)
    run_in_process("train_lm.py", "--resume", "--out_dir", "split", cwd=tmp, check=True)
    straight, split, plain = (torch.load(tmp / name / "model.pt", weights_only=True)["model"]
                              for name in ("straight", "split", "plain"))
    assert all(torch.equal(straight[k], split[k]) for k in straight)
    assert not all(torch.equal(straight[k], plain[k]) for k in straight)
    assert json.loads((tmp / "split/args.json").read_text())["distill_weight"] == 0.5
    assert json.loads((tmp / "split/results.json").read_text())["attn"] == "t2r+distill0.5+pretrain"


def test_distillation_follows_attention_transfer(lm_teacher):
    tmp, common = lm_teacher
    result = run_in_process("train_lm.py", *common, "--transfer_steps", "2", "--out_dir", "transfer", cwd=tmp,
                            check=True)
    assert "after the 2 steps of attention transfer" in result.stdout
    assert (tmp / "transfer/model.pt").is_file()


def test_a_translator_distils_its_teacher(tmp_path):
    corpus = write_parallel(str(tmp_path / "toy"))
    result = run_in_process("train_mt.py", "--init", "pretrained", "--dataset", corpus, "--max_steps", "4",
                            "--distill_weight", "0.5", *MT_TINY, cwd=tmp_path, check=True)
    assert "| t2r+distill0.5+pretrain |" in result.stdout


@pytest.mark.parametrize("flags, message", [
    ("--distill_weight 0.5", "--distill_weight distils the softmax teacher a conversion starts from"),
    ("--init pretrained --distill_weight 1.5", "--distill_weight: 1.5 is not in [0, 1]")])
def test_distillation_flags_are_refused_where_they_cannot_work(capsys, flags, message):
    assert_flags_refused(train_lm.get_args, flags.split(), message, capsys)
