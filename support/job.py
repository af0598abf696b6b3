"""
What both trainers share around their main(), besides their flags (support/flags.py): the processes, the softmax
teacher (trained first when missing, loaded and checked), and the conversion's table.
"""

import argparse
import json
import os
import shlex
import sys
from contextlib import contextmanager
from dataclasses import replace

import torch
import torch.distributed as dist

from after_t2r import conv_student, window_student
from decay import decay_student
from support.checkpoints import load_checkpoint
from support.configs import build_model, config_of, feature_sizes
from support.flags import INVOCATION_FLAGS
from support.hf import is_hf
from support.runtime import UserError, check_fits, decoding_kernels, print_config, serializable, setup_distributed
from t2r import new_tensors


TEACHER_RESULTS = "teacher_results.json"  # a Hugging Face teacher's evaluation, in the student's out_dir


# -----------------------------------------------------------------------------
# Around a trainer's runs: the processes, the teacher trained first, the conversion's table

@contextmanager
def processes(args):
    """One process, or torchrun's process group (set up, then torn down once every process is done)."""
    ddp = setup_distributed()
    decoding_kernels()  # a translator's batches, like decoding's steps, bring new shapes (see decoding_kernels)
    try:
        yield ddp
        if ddp.enabled:  # wait for the main process's final evaluation: a gloo group torn down early can abort
            dist.barrier()
    finally:
        if ddp.enabled:
            dist.destroy_process_group()


def print_flags(args, ddp):
    """The run's flags as it will use them, once its data is read: a checkpoint's context may have shortened
    --block_size and --eval_context, and a Hugging Face checkpoint brings its own shapes, tokenizer and dropout (those
    flags are left out). Each run prints its own: a teacher trained first, then its conversion."""
    if ddp.is_main:
        ignored = ignored_by_checkpoint(args) | ({"feature_size"} if getattr(args, "attn", None) == "elu" else set())
        shown = {k: v for k, v in vars(args).items() if k not in ignored}  # ELU's k is the head size
        print_config(os.path.basename(sys.argv[0]), serializable(shown))


def new_model(task, make, config_of, vocab_size: int):
    """make(config_of(args, vocab_size)): a model from random initialisation, once it is known to fit, with a
    one-line error for flags whose Config cannot be (e.g. --d_model not divisible by --n_head)."""
    try:
        config = config_of(task.args, vocab_size)
    except ValueError as error:
        raise UserError(f"bad model flags: {error}") from None
    check_training_fits(task, lambda: make(config))
    return make(config)


def meta_twin(model):
    """A model of the same class and config on the meta device (call it under torch.device("meta")): what a
    conversion of it would allocate, without allocating it."""
    return type(model)(model.config)


def training_bytes(model, tokens: int, element: int) -> tuple:
    """16 bytes a parameter (weights, gradients, Adam's two moments) and, at the least, the activations the backward
    pass keeps for each of a step's tokens, `element` bytes each: (weights, activations)."""
    c = model.config
    params = sum(p.numel() for p in model.parameters())
    layers = c.n_layer + getattr(c, "n_encoder_layer", 0)
    hidden = 3 if getattr(c, "ffn", "mlp") == "swiglu" else 2  # d_ff-wide tensors kept: SwiGLU's gate, up, product
    per_token = layers * (12 * c.d_model + hidden * getattr(c, "d_ff", 4 * c.d_model)) + 2 * c.vocab_size
    return 16 * params, element * tokens * per_token


def check_training_fits(task, make, frozen=None):
    """Refuse in one line, before anything is allocated, a run whose model (make() on the meta device: its shapes,
    no memory) cannot train in the memory free on the device; frozen(): a model run beside it without gradients (the
    teacher --distill_weight distils: its weights and the logits of a step's tokens)."""
    with torch.device("meta"):
        model, beside = make(), frozen() if frozen else None
    element = 2 if task.dtype in (torch.bfloat16, torch.float16) else 4
    weights, activations = training_bytes(model, task.tokens_per_step(), element)
    if beside is not None:
        weights += 4 * sum(p.numel() for p in beside.parameters())
        activations += 2 * 4 * task.tokens_per_step() * beside.config.vocab_size  # its logits, their log-softmax
    fix = f"lower {task.BATCH_FLAGS if activations > weights else MODEL_SIZE_FLAGS}"
    check_fits(weights + activations, task.device, f"training {weights // 16:,} parameters on "
               f"{task.tokens_per_step():,} tokens a step", fix)


MODEL_SIZE_FLAGS = "--d_model, --d_ff, --n_layer or --feature_size"


def needs_teacher(args) -> bool:
    """--init pretrained without --pretrained and without a finished default teacher: it is trained first."""
    return (args.init == "pretrained" and not (args.resume or args.eval_only) and "pretrained" not in args.explicit
            and not os.path.isfile(args.pretrained))


def student_build(args):
    """t2r.convert's build= for these flags: the window hybrid's student, a short convolution's (its state decaying
    or not), a decaying state's, or None (the teacher's class): after_t2r.py's and decay.py's."""
    return window_student(args.window) or conv_student(args.short_conv, args.decay) or decay_student(args.decay)


def finetuning(args) -> dict:
    """The config fields a finetuning sets anew on the teacher's: its dropout, chunk size and LayerDrop."""
    return dict(dropout=args.dropout, chunk_size=args.chunk_size,
                **({"layer_dropout": args.layer_dropout} if hasattr(args, "layer_dropout") else {}))


def trained_on(teacher, changes: dict):
    """--attn softmax --init pretrained, a control: the teacher itself, finetuned, built with the finetuning's config
    (its dropout layers too); the random stream is left as the teacher alone left it."""
    with torch.random.fork_rng(devices=[]):
        model = build_model(replace(teacher.config, **changes))
    model.load_state_dict(teacher.state_dict())
    return model.to(next(teacher.parameters()).device)


@contextmanager
def conversion_errors(args):
    """What t2r.convert refuses of these flags for this teacher (--keep_softmax_every past its layers), one line."""
    try:
        yield
    except ValueError as error:
        raise UserError(f"bad conversion flags for {args.pretrained}: {error}") from None


def freeze_feature_maps(model, frozen: bool):
    """The paper's "T2R MLP frozen" (--freeze_feature_map): only W_phi, b_phi stay fixed."""
    new = new_tensors(model) if frozen else set()
    for name, p in model.named_parameters():
        p.requires_grad_(name not in new)


def announce_conversion(model, args):
    if args.attn == "softmax":
        print(f"continuing {args.pretrained} unchanged (softmax): the finetuning budget without the swap")
        return
    causal, cross = feature_sizes(model.config)
    new = sum(p.numel() for name, p in model.named_parameters() if name in new_tensors(model))
    parts = ({"t2r": "feature maps", "rfa": "random projections"}.get(args.attn, ""), "window gates" if args.window else "",
             "convolutions" if getattr(args, "short_conv", 0) else "", "decay gates" if getattr(args, "decay", 0) else "")
    added = ", ".join(filter(None, parts))
    print(f"converted {args.pretrained} to {args.attn}: causal k={causal}" + (f", cross k={cross}" if cross else "")
          + (f", softmax window {args.window}" if args.window else "")
          + (f"; new parameters: {added} only ({new:,})" if new else "; no new parameters"))


def print_conversion_table(task_class, args, ddp, teacher_results, results, default_out_dir):
    """The teacher's row (trained first, or read beside it), the softmax control's once it has run, and the finetuned
    model's; then a line on what the teacher's row is, with the control's command while it has not run.
    default_out_dir(args, attn, init) names a run's folder (the control's: its name, beside this run's)."""
    if not (ddp.is_main and results):
        return
    teacher_results = teacher_results or read_results(teacher_results_file(args))
    name = f"{args.pretrained} (softmax, not finetuned)" if is_hf(args.pretrained) else "softmax (pretrained)"
    control_dir = os.path.join(os.path.dirname(os.path.normpath(args.out_dir)),
                               os.path.basename(default_out_dir(args, "softmax", "pretrained")))
    control = control_results(args, control_dir) if args.attn != "softmax" else None  # (this run is the control)
    task_class.print_table(([(name, teacher_results)] if teacher_results else [])
                           + ([(f"{control['attn']} (control)", control)] if control else [])
                           + [(results["attn"], results)])
    if args.attn != "softmax":  # a briefly trained teacher, or one new to the data, gains from the steps alone
        command = (f"the command that started this run, with --attn softmax --out_dir {control_dir}" if args.resume
                   else control_command(args, control_dir))  # a resumed run knows its flags, not which were given
        fair = (f"{control['attn']} (control), finetuned as long ({control_dir})" if control else
                f"the softmax control finetuned as long: {command}")
        print(f"\n{name} is the teacher before finetuning, which finetuning alone improves too; the fair comparison "
              f"is {fair}")


def control_command(args, out_dir: str) -> str:
    """This conversion's softmax control as a command: the flags given on the command line, less the conversion's
    own, with --attn softmax (the teacher finetuned as it is) and its own --out_dir."""
    left_out = (CONVERSION_ONLY - {"pretrained"}) | {"attn", "out_dir", "resume", "eval_only", "stop_at"}
    flags = []
    for name, value in vars(args).items():  # in the parser's order
        if name not in args.explicit or name in left_out:
            continue
        if isinstance(value, bool):  # a switch: --compile or --no-compile
            flags.append(f"--{name}" if value else f"--no-{name}")
        else:  # a list is comma-separated (--adaptive_cutoffs 20000,60000)
            flags += [f"--{name}", ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    return shlex.join(["python", os.path.basename(sys.argv[0]), *flags, "--attn", "softmax", "--out_dir", out_dir])


def control_results(args, out_dir: str):
    """The results.json of out_dir's run if it is this conversion's softmax control: the same teacher and data, the
    same finetuning steps, not swapped (None otherwise)."""
    saved = read_results(os.path.join(out_dir, "args.json")) or {}
    same = all(saved.get(name) == getattr(args, name) for name in ("init", "pretrained", "dataset", "max_steps"))
    return read_results(os.path.join(out_dir, "results.json")) if same and saved.get("attn") == "softmax" else None


def teacher_results_file(args) -> str:
    """Our teacher's results.json, or a Hugging Face model's evaluation before finetuning, beside the student's."""
    if is_hf(args.pretrained):
        return os.path.join(args.out_dir, TEACHER_RESULTS)
    return os.path.join(os.path.dirname(args.pretrained), "results.json")


def teacher_run_args(args, schedules: dict, overrides: dict):
    """The flags of the softmax teacher that --init pretrained converts. Its budget stands to the finetuning
    budget as the paper's pretraining to its finetuning (appendix Tables 3-6): the default schedules' ratio."""
    print(f"no finished softmax teacher at {args.pretrained}: training it first")
    teacher = argparse.Namespace(**vars(args))
    teacher.attn, teacher.init, teacher.out_dir = "softmax", "random", os.path.dirname(args.pretrained)
    steps = schedules["random"]["max_steps"] / schedules["pretrained"]["max_steps"]
    teacher.max_steps, teacher.warmup_steps = round(args.max_steps * steps), round(args.warmup_steps * steps)
    teacher.lr = args.lr * schedules["random"]["lr"] / schedules["pretrained"]["lr"]
    teacher.stop_at, teacher.eval_only, teacher.explicit = None, False, set()
    teacher.transfer_steps, teacher.window, teacher.distill_weight, teacher.short_conv = 0, 0, 0.0, 0
    teacher.decay, teacher.keep_softmax = False, 0
    teacher.resume = os.path.exists(os.path.join(teacher.out_dir, "ckpt.pt"))
    vars(teacher).update(overrides)
    if teacher.resume:
        check_unfinished_teacher(teacher)
    return teacher


def ignored_by_checkpoint(args) -> set:
    """The flags a Hugging Face checkpoint decides (its sizes, tokenizer, and dropout unless given): an hf: run
    does not print them, nor pretends to use them."""
    if not (getattr(args, "init", None) == "pretrained" and is_hf(getattr(args, "pretrained", "") or "")):
        return set()
    return {"n_layer", "n_head", "d_model", "d_ff", "tokenizer", "vocab_size", "adaptive_cutoffs", "adaptive_factor"} | \
        ({"dropout"} - getattr(args, "explicit", set()))


# The flags that shape the conversion, not the softmax teacher: a teacher trained first may differ in them
CONVERSION_ONLY = {"feature_size", "cross_feature_size", "chunk_size", "window", "keep_softmax_every",
                   "keep_softmax_from", "freeze_feature_map", "pretrained", "transfer_steps", "transfer_lr",
                   "distill_weight", "short_conv", "decay", "keep_softmax"}


def check_unfinished_teacher(teacher):
    """A teacher trained first and interrupted is finished with the flags it started with, or not at all: this
    run's flags would make it another teacher (another schedule, another block size) under the same name."""
    saved = read_results(os.path.join(teacher.out_dir, "args.json")) or {}
    for name, value in saved.items():
        if name in INVOCATION_FLAGS | CONVERSION_ONLY or not hasattr(teacher, name):
            continue
        if name == "vocab_size" and getattr(teacher, "tokenizer", "bpe") != "bpe":  # the data's own count (args.json)
            continue
        if getattr(teacher, name) != value:
            raise UserError(f"{teacher.out_dir} holds an unfinished softmax teacher trained with --{name} {value}, "
                            f"this run's teacher would have {getattr(teacher, name)}: finish it first (python "
                            f"{os.path.basename(sys.argv[0])} --resume --out_dir {teacher.out_dir}), or pass "
                            f"--pretrained, or delete {teacher.out_dir}")


def load_teacher(args, what: str) -> dict:
    """The checkpoint --init pretrained converts: finished, with finite weights."""
    if is_hf(args.pretrained):
        raise UserError(f"--pretrained {args.pretrained} is a Hugging Face language model: train_lm.py converts it")
    checkpoint = load_checkpoint(args.pretrained, what)
    if checkpoint["config"].get("arch", "transformer") != "transformer":
        raise UserError(f"{args.pretrained} is an {checkpoint['config']['arch'].upper()} model: --init pretrained "
                        f"converts a softmax transformer")
    if checkpoint.get("step", 0) < checkpoint.get("max_steps", 0):
        raise UserError(f"{args.pretrained} stopped at step {checkpoint['step']} of {checkpoint['max_steps']}: "
                        f"finish it with --resume --out_dir {os.path.dirname(args.pretrained)}")
    read_results(teacher_results_file(args))  # its row of the final table: a damaged one is found before any work
    return checkpoint


def check_teacher(checkpoint: dict, args, model_flags: tuple, given_flags: tuple = ()):
    """The teacher is softmax, and every size flag given (and each of `given_flags` given on the command line)
    is the teacher's: a converted model keeps the teacher's shapes, so a different value would be ignored."""
    config = checkpoint["config"]
    kinds = set(config_of(config).layer_kinds()) | ({config["cross_attn"]} if config.get("n_encoder_layer") else set())
    if kinds != {"softmax"}:
        raise UserError(f"{args.pretrained} is already converted (attention {sorted(kinds)}): "
                        f"--init pretrained needs a softmax model")
    for name in model_flags + given_flags:
        unset = name not in args.explicit if name in given_flags else getattr(args, name) is None  # a default
        if not unset and getattr(args, name) != config[name]:
            source = "" if name in args.explicit else f" (set by --preset {args.preset})"
            raise UserError(f"--{name} {getattr(args, name)}{source} differs from the pretrained model's "
                            f"{config[name]}: drop the flag (the teacher's sizes are used)")


def model_name(args) -> str:
    """A run's row in the tables: t2r, t2r+pretrain, t2r+transfer+window64+pretrain, t2r+keep4top+pretrain,
    t2r+distill0.5+pretrain, ..."""
    steps = (["transfer"] if args.transfer_steps else []) + ([f"window{args.window}"] if args.window else [])
    if getattr(args, "keep_softmax_every", 0):  # the layers left softmax (a language model's option)
        steps.append(f"keep{args.keep_softmax_every}" + ("top" if args.keep_softmax_from == "top" else ""))
    if getattr(args, "keep_softmax", 0):  # layers kept softmax, chosen by data (support/choose_layers.py)
        steps.append(f"chosen{args.keep_softmax}")
    if getattr(args, "decay", False):  # a decaying state (decay.py)
        steps.append("decay")
    if getattr(args, "short_conv", 0):  # a short convolution before each causal self-attention (after_t2r.py)
        steps.append(f"conv{args.short_conv}")
    if getattr(args, "distill_weight", 0):  # KL to the teacher's logits (support/distill.py), its weight
        steps.append(f"distill{args.distill_weight:g}")
    return "+".join([args.attn] + steps + (["pretrain"] if args.init == "pretrained" else []))


def read_results(path: str):
    """A results.json or args.json (None if there is none), or a one-line error if it cannot be read."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            results = json.load(f)
    except (OSError, ValueError) as error:
        raise UserError(f"{path} is unreadable ({type(error).__name__}): restore it, or delete it") from None
    if not isinstance(results, dict):
        raise UserError(f"{path} holds a JSON {type(results).__name__}, not an object: restore it, or delete it")
    return results
