"""
Attention transfer as a stage of its own (after_t2r.attention_transfer): before the finetuning, --transfer_steps
steps that train only the feature maps (and window gates) to imitate the softmax attention they replaced. The
trainers wrap their task in TransferFirst before train(); the loop runs it as any task and knows nothing of it.

    python train_lm.py --init pretrained --transfer_steps 200
    python -m pytest -q tests/test_transfer.py
"""

from tqdm import tqdm

from after_t2r import attention_transfer, linear_attention_layers
from support.training import get_lr


class TransferFirst:
    """A trainer's task with the transfer stage's steps before its own: steps 0 .. T - 1 minimise the layers'
    transfer errors at their own warmup and cosine rate (--transfer_lr), then the task's steps follow as they would
    alone (its rate counted from the stage's end). At step T the finished stage is evaluated as a run's end is
    (results.json's after_transfer). Everything else is the task's. Steps: the task's lr and loss count from the stage's
    end; everything else (after_step, its snapshots, task.steps, raised by T here) counts the run's steps, as its
    checkpoints do."""

    def __init__(self, task, checkpoint: dict | None):
        self.task, self.transfer_steps = task, task.args.transfer_steps
        task.steps += self.transfer_steps  # the run's optimizer steps, the stage's first (snapshots count them)
        self.after_transfer = (checkpoint or {}).get("after_transfer")  # a run resumed after the stage keeps them
        self.errors = 0.0  # the layers' transfer errors, summed since the last log line
        self.trains_part = True  # the stage trains phi alone: the rest of the model gets no gradient

    def __getattr__(self, name):  # args, ddp, device, steps, batch, report, ...: the task's
        return getattr(self.task, name)

    def lr(self, step: int) -> float:
        T, peak = self.transfer_steps, self.args.transfer_lr
        return get_lr(step, peak, 0.1 * peak, max(1, T // 10), T) if step < T else self.task.lr(step - T)

    def loss(self, model, step: int, counter: int) -> tuple:
        if step >= self.transfer_steps:
            return self.task.loss(model, step - self.transfer_steps, counter)
        inputs, targets, mask = self.task.batch(counter)
        errors, _ = attention_transfer(model, *inputs, mask=mask)  # (layers,), the teacher's logits unused
        self.errors = self.errors + errors.detach()
        return errors.mean(), targets.numel() if mask is None else int(mask.sum())

    def milestone(self, step: int) -> bool:  # the stage's end is logged and evaluated
        return step == self.transfer_steps

    def checkpoint_due(self, step: int) -> bool:
        """ckpt.pt at each of the stage's log lines, and at its end before the evaluation (a full one, as a run's end):
        the stage is shorter than --eval_interval, and a run stopped in it or in that evaluation resumes from there."""
        return step <= self.transfer_steps and (step % self.args.log_interval == 0 or step == self.transfer_steps)

    def stage(self, step: int) -> str:
        return " (transfer)" if step <= self.transfer_steps else self.task.stage(step)

    def after_log(self, model, step: int, micro_batches: int):
        """Each layer's mean transfer error since the last log line (this process's batches)."""
        if step <= self.transfer_steps and self.ddp.is_main:
            names = [name.replace("layers.", "").replace("_attn", "") for name, _ in linear_attention_layers(model)]
            errors = (self.errors / micro_batches).tolist()  # per layer, e.g. "0.self", "0.cross"
            tqdm.write("  transfer error by layer: " + ", ".join(f"{n} {e:.2e}" for n, e in zip(names, errors)))
        self.errors = 0.0

    def after_evaluation(self, model, step: int, train_seconds: float):
        if step == self.transfer_steps:  # the model before finetuning, scored as a finished run is
            print(f"after the {step} steps of attention transfer:")
            self.after_transfer = self.task.report(model, train_seconds)
            model.train()  # finetuning goes on: a task's report may leave the model in eval mode (no dropout)

    def after_step(self, model, step: int):
        if step > self.transfer_steps:  # a translator's snapshots are of the finetuning only: they are averaged
            self.task.after_step(model, step)

    def checkpoint_extras(self) -> dict:
        return {**self.task.checkpoint_extras(), "after_transfer": self.after_transfer}

    def report(self, model, train_seconds: float) -> dict:
        results = self.task.report(model, train_seconds)
        return {**results, "after_transfer": self.after_transfer} if results and self.after_transfer else results
