"""
Distillation from the teacher's logits during finetuning: the converted model's loss mixes the task's own with the
KL divergence of its next-token distribution from the softmax teacher's, the teacher frozen beside it and run on the
same batch (Mamba-in-the-Llama's stage, which it finds the most important; RADLADS and hybrid distillation run it
after attention alignment). The trainers wrap their task in DistilledFrom before train() (after attention transfer,
when that is on, TransferFirst wraps this); the loop runs it as any task and knows nothing of it.

    python train_lm.py --init pretrained --distill_weight 0.5     # half the LM loss, half KL to the teacher
    python -m pytest -q tests/test_distill.py
"""

import torch
import torch.nn.functional as F

from layers.states import widened
from support.job import check_training_fits, meta_twin


def distillation_loss(student_logits, teacher_logits, mask=None):
    """KL(p_teacher || p_student) of the next token, summed over the vocabulary, averaged over the positions (those
    True in mask (B, T), where one is given: a translator's padding counts nothing). Logits (B, T, V), or log
    probabilities (an adaptive softmax's): log_softmax gives the same of both. In float32 at least."""
    student, teacher = (F.log_softmax(x, dim=-1) for x in widened(student_logits, teacher_logits))
    kl = (teacher.exp() * (teacher - student)).sum(-1)  # (B, T): sum_v p_t(v) log(p_t(v) / p_s(v))
    return kl.mean() if mask is None else kl[mask].mean()


class DistilledFrom:
    """A trainer's task whose loss is (1 - w) its own + w KL to the teacher's distribution (w = --distill_weight).
    The teacher is frozen, in eval mode (no dropout), on the task's device; it is loaded again when a run resumes
    (nothing of it is saved). Everything else is the task's."""

    def __init__(self, task, teacher, student):
        check_training_fits(task, lambda: meta_twin(student), frozen=lambda: meta_twin(teacher))
        self.task, self.weight = task, task.args.distill_weight
        self.teacher = teacher.to(task.device).eval().requires_grad_(False)

    def __getattr__(self, name):  # args, ddp, device, steps, batch, objective, report, ...: the task's
        return getattr(self.task, name)

    def loss(self, model, step: int, counter: int) -> tuple:
        inputs, targets, mask = self.task.batch(counter)
        logits = model(*inputs)
        with torch.no_grad():
            teacher_logits = self.teacher(*inputs)
        mixed = ((1 - self.weight) * self.task.objective(logits, targets)
                 + self.weight * distillation_loss(logits, teacher_logits, mask))
        return mixed, targets.numel() if mask is None else int(mask.sum())
