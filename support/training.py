"""
The training loop of both trainers: train(task, model, checkpoint).

    resume exactly, gradient accumulation, DDP, logging, evaluate and save every --eval_interval, --stop_at,
    one run per out_dir (a lock), a NaN guard, Ctrl-C and SIGTERM that save, and the run's identity in every
    checkpoint

train_lm.py and train_mt.py each define a Task (their data, loss and evaluation); their train_run() opens the run
(support/run_files.py), makes the model and hands both to train(). Also here: the learning-rate schedules and the
optimizer.
"""

import math
import os
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from support.checkpoints import save_checkpoint
from support.run_files import check_identity, set_aside_shorter_run, write_results
from support.runtime import (Distributed, Interrupted, UserError, all_reduce_sum, autocast_context, gather_rng,
                             get_device, make_scaler, print_config, resolve_dtype, rng_state, serializable,
                             set_rng_state, unwrap, write_json)


# -----------------------------------------------------------------------------
# Learning rate

def get_lr(step: int, max_lr: float, min_lr: float, warmup_steps: int, max_steps: int) -> float:
    """Linear warmup to max_lr, then cosine decay to min_lr at max_steps."""
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * progress))


def get_lr_inverse_sqrt(step: int, max_lr: float, warmup_steps: int) -> float:
    """Linear warmup to max_lr, then max_lr * sqrt(warmup / step): fairseq's inverse_sqrt (Vaswani et al.)."""
    step = step + 1
    return max_lr * min(step / warmup_steps, math.sqrt(warmup_steps / step))


def set_lr(optimizer, lr: float):
    for group in optimizer.param_groups:
        group["lr"] = lr


def optimizer_step(model, optimizer, scaler, grad_clip: float):
    """Clip the gradient norm (after unscaling fp16 gradients), step, and clear the gradients."""
    if grad_clip > 0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)


def make_optimizer(model, lr: float, weight_decay: float, device: torch.device):
    """AdamW; weight decay on weight matrices only, not on biases, LayerNorm gains or the RFA temperature."""
    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    decay = [p for name, p in params if p.dim() >= 2 and not name.endswith("bias")]  # T2R's bias is (r, k)
    no_decay = [p for name, p in params if p.dim() < 2 or name.endswith("bias")]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.98), eps=1e-8, fused=device.type == "cuda")


def training_device(requested: str, ddp: Distributed) -> torch.device:
    """--device, or under torchrun with --device auto: this process's GPU (or the CPU)."""
    if ddp.enabled and requested == "auto":
        requested = f"cuda:{ddp.local_rank}" if torch.cuda.is_available() else "cpu"
    return get_device(requested)


# -----------------------------------------------------------------------------
# The training loop, shared by train_lm.py and train_mt.py (as minGPT's Trainer serves its projects)

class Task:
    """What differs between training a language model and a translator. A trainer subclasses it; `train`
    runs the loop around it. args are the trainer's flags, ddp its process group."""

    SCHEDULES: dict = {}  # the default budgets, {"random": dict(max_steps, lr), "pretrained": dict(...)}
    generator = None  # a data generator saved and restored with the checkpoint (None: batches follow the step)
    trains_part = False  # whether a step may leave some parameters without a gradient (DDP must be told)
    validation_name = "validation loss"  # what the periodic evaluation logs (the LM's: on some windows only)

    def __init__(self, args, ddp: Distributed):
        self.args, self.ddp = args, ddp
        self.steps = args.max_steps  # the run's optimizer steps
        self.device = training_device(args.device, ddp)  # where, and in what precision, the loop runs
        self.dtype = resolve_dtype(args.dtype, self.device)

    def load_data(self, checkpoint: dict | None):
        """The task's data (and a translator's tokenizer: the checkpoint's, or a new one), checked against the
        checkpoint of a resumed or evaluated run."""
        raise NotImplementedError

    def lr(self, step: int) -> float:
        """The learning rate of a step."""
        raise NotImplementedError

    def batch(self, counter: int) -> tuple:
        """Micro-batch number `counter` (counted over steps, micro-batches, processes), on self.device:
        (the model's inputs, the targets, the mask of real target positions or None for all)."""
        raise NotImplementedError

    def objective(self, logits, targets):
        """The mean training loss of a batch."""
        raise NotImplementedError

    def loss(self, model, step: int, counter: int) -> tuple:
        """(mean loss, target tokens) of one micro-batch: the task's objective."""
        inputs, targets, mask = self.batch(counter)
        return self.objective(model(*inputs), targets), targets.numel() if mask is None else int(mask.sum())

    def validation_loss(self, model) -> float:
        raise NotImplementedError

    def report(self, model, train_seconds: float) -> dict:
        """The final evaluation of the finished model (results.json)."""
        raise NotImplementedError

    def identity(self) -> dict:
        """Fingerprints of what the run was trained on (its tokenizer, its data), called after load_data():
        a checkpoint carries them, and resuming, evaluating or converting it on anything else is refused."""
        return {}

    def checkpoint_extras(self) -> dict:
        """What else goes into ckpt.pt and model.pt (a translator's tokenizer)."""
        return {}

    def after_step(self, model, step: int):
        """Called after every optimizer step (a translator saves its snapshots)."""

    # A stage before the task's own steps (support/transfer.py) speaks through these; a task alone has none
    def milestone(self, step: int) -> bool:
        """Whether this step is logged and evaluated whatever the intervals (a stage's last)."""
        return False

    def stage(self, step: int) -> str:
        """What the log line calls the stage of this step ("": the task's own)."""
        return ""

    def after_log(self, model, step: int, micro_batches: int):
        """Called after each log line, on every process."""

    def after_evaluation(self, model, step: int, train_seconds: float):
        """Called after each periodic evaluation, untimed."""

    def checkpoint_due(self, step: int) -> bool:
        """Whether ckpt.pt is saved after this step besides the evaluations' (before this step's evaluation, if it has
        one): a stage shorter than --eval_interval saves as it goes."""
        return False

    def final_model(self, model) -> tuple:
        """(the finished model, what model.pt says about it beyond the common fields)."""
        return model, {}

    @staticmethod
    def teacher_overrides(args) -> dict:
        """Flags in which the teacher that --init pretrained trains differs from the student, beyond attention,
        initialisation and budget (the LM's paper preset: the teacher's update frequency)."""
        return {}


@dataclass
class Progress:
    step: int = 0
    best_val: float = math.inf  # the best validation loss so far
    train_seconds: float = 0.0  # training and periodic evaluation, over every invocation of the run
    tokens: int = 0  # training target tokens seen, over all processes (under DDP: this process's count x processes)
    curve: list = field(default_factory=list)  # the learning curve: [step, tokens, validation loss] per evaluation


def train(task: Task, model, checkpoint: dict | None) -> dict:
    """Train `model` to --max_steps (or --stop_at), evaluating and saving every --eval_interval steps; resumable at
    any checkpoint (`checkpoint`: the one open_run returned). Returns the final evaluation ({} when stopped early)."""
    args, ddp, device, dtype = task.args, task.ddp, task.device, task.dtype
    raw_model, optimizer, scaler, p = start(task, model, checkpoint)
    model = wrap(raw_model, task, device, ddp)
    bar = tqdm(total=task.steps, initial=p.step, desc=os.path.basename(args.out_dir), dynamic_ncols=True,
               mininterval=2, disable=not (ddp.is_main and sys.stderr.isatty()))  # logs get the step lines only
    t_log, loss_sum, steps, tokens = time.time(), 0.0, 0, 0
    nonfinite = torch.zeros((), dtype=torch.bool, device=device)  # a NaN or inf loss since the last check
    with CtrlC() as ctrl_c:
        if checkpoint and task.milestone(p.step) and not (p.curve and p.curve[-1][0] == p.step):
            t_log += evaluate_and_save(task, raw_model, optimizer, scaler, p)  # saved before it, stopped during it
        while p.step < task.steps and (args.stop_at is None or p.step < args.stop_at):
            t_step, lr = time.time(), task.lr(p.step)
            set_lr(optimizer, lr)
            for micro in range(args.grad_accum):
                counter = (p.step * args.grad_accum + micro) * ddp.world_size + ddp.rank
                sync = not ddp.enabled or micro == args.grad_accum - 1  # DDP: all-reduce once, after the last
                with (nullcontext() if sync else model.no_sync()), autocast_context(device, dtype):
                    loss, n = task.loss(model, p.step, counter)
                    loss = loss / args.grad_accum
                scaler.scale(loss).backward()
                loss_sum += loss.detach()  # no .item() here: on a GPU it would wait for every step
                nonfinite |= ~torch.isfinite(loss.detach())
                tokens, p.tokens = tokens + n * ddp.world_size, p.tokens + n * ddp.world_size
            optimizer_step(raw_model, optimizer, scaler, args.grad_clip)
            p.step, p.train_seconds, steps = p.step + 1, p.train_seconds + time.time() - t_step, steps + 1
            bar.update(1)
            task.after_step(raw_model, p.step)
            last = p.step == task.steps
            if p.step % args.log_interval == 0 or last or task.milestone(p.step):
                check_finite(nonfinite, task, p)
                log_step(bar, p, task, float(loss_sum) / steps, lr, tokens / (time.time() - t_log))
                task.after_log(raw_model, p.step, steps * args.grad_accum)
                t_log, loss_sum, steps, tokens = time.time(), 0.0, 0, 0
            if task.checkpoint_due(p.step):
                check_finite(nonfinite, task, p)
                t_save = time.time()
                save_run(task, raw_model, optimizer, scaler, p)
                t_log += time.time() - t_save  # left out of the next tok/s, as evaluations are
            if p.step % args.eval_interval == 0 or last or task.milestone(p.step):
                check_finite(nonfinite, task, p)
                t_log += evaluate_and_save(task, raw_model, optimizer, scaler, p)  # left out of the next tok/s
            if ctrl_c.pressed(ddp, device, agree=p.step % args.log_interval == 0):
                break
    bar.close()
    check_finite(nonfinite, task, p)
    save_run(task, raw_model, optimizer, scaler, p)
    if ctrl_c.pressed(ddp, device, agree=True):
        raise Interrupted(f"interrupted at step {p.step} of {task.steps}: saved {args.out_dir}/ckpt.pt; "
                          f"continue with --resume --out_dir {args.out_dir}")
    if p.step < task.steps:
        print(f"stopped at step {p.step} of {task.steps}: continue with --resume --out_dir {args.out_dir}")
        return {}
    return finish(task, raw_model, p)


def evaluate_and_save(task: Task, model, optimizer, scaler, p: Progress) -> float:
    """The validation loss (and what a stage adds, untimed: after_evaluation), then ckpt.pt. Returns the seconds it
    took."""
    start_time = time.time()
    validate(task, model, p)
    p.train_seconds += time.time() - start_time
    task.after_evaluation(model, p.step, p.train_seconds)
    save_run(task, model, optimizer, scaler, p)
    return time.time() - start_time


class CtrlC:
    """The first Ctrl-C (SIGINT), or SIGTERM (`kill`, a scheduler ending the job), asks the loop to stop after the step
    in progress and save; a second one stops at once. Saving between steps keeps the resumed run exact (the batch
    generator has drawn whole steps)."""

    SIGNALS = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}

    def __enter__(self):
        self.flag = False
        self.previous = {signum: signal.signal(signum, self.handle) for signum in self.SIGNALS}
        return self

    def handle(self, signum, frame):
        name = self.SIGNALS[signum]
        if self.flag:
            raise Interrupted(f"{name} again: stopped at once, without saving; the last checkpoint saved is kept")
        self.flag = True
        tqdm.write(f"{name}: saving after this step (a second one quits without saving)")

    def pressed(self, ddp: Distributed, device, agree: bool) -> bool:
        """Whether to stop now. One process asks its own flag at every step; under DDP the processes must stop at
        the same step, so they ask each other (an all-reduce) only when `agree`, at logging steps, not every step."""
        if not ddp.enabled:
            return self.flag
        return agree and bool(all_reduce_sum(torch.tensor(float(self.flag), device=device), ddp).item())

    def __exit__(self, *exc):
        for signum, previous in self.previous.items():
            signal.signal(signum, previous)


class Diverged(UserError):
    """A NaN or inf loss: the run stops before saving; an experiment sweeping learning rates records the rate as one
    that diverged instead of stopping."""


def check_finite(nonfinite, task: Task, p: Progress):
    """Stop before a NaN or inf reaches a checkpoint: ckpt.pt keeps the last step whose losses were finite."""
    if task.ddp.enabled:
        nonfinite = all_reduce_sum(nonfinite.float(), task.ddp) > 0
    if nonfinite.item():
        raise Diverged(f"the training loss became NaN or inf before step {p.step}: stopped without saving, so "
                        f"{task.args.out_dir}/ckpt.pt keeps the last good checkpoint: lower --lr, then --resume "
                        f"(or check the data)")


def start(task: Task, model, checkpoint: dict | None):
    """The model, optimizer, scaler and progress of a new run, or of the run in out_dir restored exactly."""
    args, ddp, device, dtype = task.args, task.ddp, task.device, task.dtype
    path = os.path.join(args.out_dir, "ckpt.pt")
    model = model.to(device)
    task.run_identity = {**task.identity(), "world_size": ddp.world_size}
    if checkpoint:
        check_identity(checkpoint, task.run_identity, path)
    optimizer = make_optimizer(model, args.lr, args.weight_decay, device)
    scaler = make_scaler(device, dtype)
    p = Progress()
    if checkpoint:
        optimizer.load_state_dict(checkpoint["optimizer"])
        scaler.load_state_dict(checkpoint["scaler"])
        p = Progress(checkpoint["step"], checkpoint["best_val"], checkpoint["train_seconds"],
                     checkpoint.get("tokens", 0), checkpoint.get("curve", []))
        set_rng_state(checkpoint["rng"][min(ddp.rank, len(checkpoint["rng"]) - 1)], task.generator)
        print(f"resumed {path} at step {p.step} (best validation loss {p.best_val:.4f})")
    if ddp.is_main and checkpoint and p.step < task.steps:
        set_aside_shorter_run(args.out_dir, p.step)
    if ddp.is_main:
        print_config("model", model.config)  # the fields that differ from the defaults
        print(f"parameters: {sum(p.numel() for p in model.parameters()):,}")
        write_json(os.path.join(args.out_dir, "args.json"), serializable(vars(args)))
    return model, optimizer, scaler, p


def wrap(model, task, device, ddp):
    """torch.compile (default on CUDA) and DistributedDataParallel under torchrun."""
    if task.args.compile if task.args.compile is not None else device.type == "cuda":
        model = torch.compile(model)
    if ddp.enabled:
        # LayerDrop skips whole layers, whose parameters then get no gradient in that step
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                        find_unused_parameters=getattr(unwrap(model).config, "layer_dropout", 0) > 0
                                        or task.trains_part)
    return model


def log_step(bar, p: Progress, task: Task, loss: float, lr: float, tokens_per_s: float):
    bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.1e}", tok_s=f"{tokens_per_s:,.0f}")
    if task.ddp.is_main:
        tqdm.write(f"step {p.step}/{task.steps}{task.stage(p.step)} | loss {loss:.4f} | lr {lr:.2e} | "
                   f"{tokens_per_s:,.0f} tok/s | {p.train_seconds / 60:.1f} min")


def validate(task: Task, model, p: Progress):
    """The validation loss at this step; a NaN or inf one stops the run before its weights are saved (they can be
    finite yet so large that the model's outputs overflow)."""
    val_loss = task.validation_loss(model)
    if not math.isfinite(val_loss):
        raise Diverged(f"the validation loss is {val_loss} at step {p.step}: the weights diverged; not saved, so "
                        f"{task.args.out_dir}/ckpt.pt keeps the last good checkpoint: lower --lr, then --resume "
                        f"(or start again if none was saved)")
    p.best_val = min(p.best_val, val_loss)
    p.curve.append([p.step, p.tokens, val_loss])
    if task.ddp.is_main:
        tqdm.write(f"step {p.step}: {task.validation_name} {val_loss:.4f} (ppl {math.exp(val_loss):.2f}), "
                   f"best {p.best_val:.4f}")


def save_run(task: Task, model, optimizer, scaler, p: Progress):
    """ckpt.pt: everything a resumed run needs to continue exactly, every process's RNG included."""
    rng = gather_rng(rng_state(task.generator), task.ddp)
    if task.ddp.is_main:
        save_checkpoint(os.path.join(task.args.out_dir, "ckpt.pt"), {
            "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
            "config": model.config.to_dict(), "args": serializable(vars(task.args)), "step": p.step,
            "max_steps": task.steps, "best_val": p.best_val, "rng": rng,
            "train_seconds": p.train_seconds, "identity": task.run_identity,
            "tokens": p.tokens, "curve": p.curve, **task.checkpoint_extras()})


def finish(task: Task, model, p: Progress) -> dict:
    """model.pt (the finished model: what generate.py, translate.py and --init pretrained read) and
    results.json (its final evaluation)."""
    final, about = task.final_model(model)
    if task.ddp.is_main:
        save_checkpoint(os.path.join(task.args.out_dir, "model.pt"), {
            "model": final.state_dict(), "config": final.config.to_dict(), "args": serializable(vars(task.args)),
            "step": p.step, "max_steps": task.steps, "train_seconds": p.train_seconds,
            "identity": task.run_identity, **task.checkpoint_extras(), **about})
    results = task.report(final, p.train_seconds)
    if results:
        results["curve"] = p.curve  # the learning curve, for plots: [step, training tokens, validation loss]
    return write_results(task, results)


