"""
Softmax layers chosen by data (fla-org/hybrid-distillation's ranking) instead of T2R's every k-th: which of the
teacher's layers, kept softmax alone, lowers a short distillation loss the most. For each layer i, and for none,
the conversion that keeps only layer i softmax is distilled from the teacher for RANK_STEPS steps on the run's own
batches (KL to the teacher's logits, every tensor trained as finetuning trains them), then scored on the RANK_BATCHES
batches after them; a layer's gain is how far its KL falls below the all-linear conversion's. --keep_softmax N keeps
the N layers of greatest gain; the ranking is printed and saved beside the run (softmax_layers.json).

    python train_lm.py --init pretrained --keep_softmax 1
    python -m pytest -q tests/test_choose_layers.py
"""

import os

import torch

from support.distill import distillation_loss
from support.runtime import UserError, write_json
from t2r import convert

RANK_STEPS = 20  # distillation steps a candidate takes
RANK_BATCHES = 4  # the batches its KL is scored on, after those


def rank_layers(teacher, task, conversion: dict, steps: int = RANK_STEPS, batches: int = RANK_BATCHES) -> list:
    """[(layer, its KL, its gain)], the greatest gain first (layer 0 the bottom one). conversion: t2r.convert's
    arguments. Every candidate draws the same feature maps and sees the same batches, and the run's batches go on
    afterwards as if no ranking had drawn any (a task's generator is put back)."""
    generator = getattr(task, "generator", None)
    start = generator.get_state() if generator is not None else None
    teacher = teacher.to(task.device).eval()
    scores = {}
    for kept in [None, *range(teacher.config.n_layer)]:
        if start is not None:
            generator.set_state(start)
        torch.manual_seed(task.args.seed)
        student = convert(teacher, **conversion, keep_softmax_layers=() if kept is None else (kept,)).to(task.device)
        scores[kept] = distilled_kl(student.train(), teacher, task, steps, batches)
    if start is not None:
        generator.set_state(start)
    return sorted(((i, scores[i], scores[None] - scores[i]) for i in range(teacher.config.n_layer)),
                  key=lambda row: -row[2])


def distilled_kl(student, teacher, task, steps: int, batches: int) -> float:
    """The student distilled for `steps` batches (KL alone, AdamW at the run's rate), then its mean KL on the
    `batches` batches after them."""
    optimizer = torch.optim.AdamW(student.parameters(), lr=task.args.lr)
    for counter in range(steps):
        inputs, _, mask = task.batch(counter)
        with torch.no_grad():
            target = teacher(*inputs)
        loss = distillation_loss(student(*inputs), target, mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    student.eval()
    with torch.no_grad():
        kls = [distillation_loss(student(*inputs), teacher(*inputs), mask)
               for inputs, _, mask in (task.batch(steps + b) for b in range(batches))]
    return float(sum(kls) / len(kls))


def chosen_softmax_layers(teacher, task, conversion: dict, count: int) -> tuple:
    """The `count` layers of greatest gain (rank_layers), after printing the ranking and saving it in the run's
    folder."""
    if count >= teacher.config.n_layer:
        raise UserError(f"--keep_softmax {count} keeps every one of its {teacher.config.n_layer} layers softmax: "
                         f"that is the teacher (use fewer)")
    ranking = rank_layers(teacher, task, conversion)
    chosen = tuple(sorted(layer for layer, _, _ in ranking[:count]))
    if task.ddp.is_main:
        print("softmax layers chosen by data: each kept alone and distilled "
              f"{RANK_STEPS} steps, its KL to the teacher on {RANK_BATCHES} batches (all linear: "
              f"{ranking[0][1] + ranking[0][2]:.4f})")
        for layer, kl, gain in ranking:
            print(f"  layer {layer} (0 the bottom): KL {kl:.4f}, gain {gain:+.4f}" + (" <- kept" if layer in chosen
                                                                                       else ""))
        write_json(os.path.join(task.args.out_dir, "softmax_layers.json"),
                   {"kept": list(chosen), "ranking": [{"layer": l, "kl": k, "gain": g} for l, k, g in ranking],
                    "rank_steps": RANK_STEPS, "rank_batches": RANK_BATCHES})
    return chosen
