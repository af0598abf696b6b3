"""
What both trainers share around their main(): the flags (added, adopted from a saved run, checked), the processes,
the softmax teacher (trained first when missing, loaded and checked), and the conversion's table.
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
from support.hf import is_hf
from support.run_files import nothing_to_resume
from support.runtime import (UserError, check_fits, decoding_kernels, device_name, explicit_flags, fraction,
                             non_negative_float, non_negative_int, positive_float, positive_int, print_config, seed,
                             serializable, setup_distributed, unit_interval)
from t2r import ATTENTION_KINDS, new_tensors


# -----------------------------------------------------------------------------
# The flags both trainers share

# The flags that belong to one invocation of a run; all others define the run, and --resume or --eval_only
# take them from it (a resumed run is the same run: its evaluation, precision and logging included).
INVOCATION_FLAGS = {"resume", "eval_only", "stop_at", "out_dir", "device",
                    "pretrained_given"}  # no longer written: a run saved before may hold it
TEACHER_RESULTS = "teacher_results.json"  # a Hugging Face teacher's evaluation, in the student's out_dir


def add_data_flags(p, dataset: str, dataset_help: str, data_dir_help: str):
    """--dataset and --data_dir; returns their group, for the trainer's own data flags."""
    g = p.add_argument_group("data")
    g.add_argument("--dataset", default=dataset, help=dataset_help)
    g.add_argument("--data_dir", default=None, help=data_dir_help)
    return g


def add_model_flags(p, defaults: dict, dropout: float, feature_size: int):
    """The model flags both trainers share; returns their group, for the trainer's own."""
    g = p.add_argument_group("model (ignored with --init pretrained: the teacher's sizes are used)")
    g.add_argument("--n_layer", type=positive_int, default=None, help=f"(decoder) layers (default {defaults['n_layer']})")
    g.add_argument("--n_head", type=positive_int, default=None, help=f"attention heads r (default {defaults['n_head']})")
    g.add_argument("--d_model", type=positive_int, default=None, help=f"model width h (default {defaults['d_model']})")
    g.add_argument("--d_ff", type=positive_int, default=None, help=f"feed-forward width (default {defaults['d_ff']})")
    g.add_argument("--dropout", type=fraction, default=dropout, help="dropout on embeddings, sublayers and the feed-forward layer")
    g.add_argument("--attn", default=None, choices=ATTENTION_KINDS, help="attention kind (default softmax; t2r with --init pretrained, where softmax trains the teacher on unchanged: a control)")
    g.add_argument("--feature_size", type=positive_int, default=feature_size, help="k of the (causal) t2r or rfa attention (elu has k = d)")
    g.add_argument("--chunk_size", type=non_negative_int, default=64, help="chunk length of the causal linear attention in training (0: quadratic form)")
    g.add_argument("--window", type=non_negative_int, default=0, help="sliding-window hybrid: the linear layers attend with softmax to the last W tokens (0: off)")
    g.add_argument("--decay", action=argparse.BooleanOptionalAction, default=False, help="the causal linear layers' state decays, a gate per head and position from the key and one new number per head (decay.py); with --init pretrained added at the swap, to a Hugging Face model (hf:) too, whose T2R conversion has it by default (train_lm.py's HF_PARTS; --no-decay: without)")
    g.add_argument("--short_conv", type=non_negative_int, default=0, help="a depthwise causal convolution of K taps before each causal self-attention (after_t2r.py; 0: off); with --init pretrained it is added to the teacher (an hf: one too), as the identity")
    return g


def add_run_flags(p, schedules: dict, weight_decay: float, log_interval: int, eval_interval: int):
    """The flags both trainers share, in three groups; returns the "training" group for the trainer's own."""
    g = p.add_argument_group("initialisation")
    g.add_argument("--init", default="random", choices=["random", "pretrained"], help="random, or swap-then-finetune a trained softmax model")
    g.add_argument("--pretrained", default=None, help="the softmax model.pt to convert (default: the softmax run's, trained first if missing); train_lm.py also takes hf:NAME, a Hugging Face GPT-2 (gpt2, distilgpt2, gpt2-medium; downloaded), or hf:FOLDER holding its config.json, model.safetensors (or pytorch_model.bin) and tokenizer.json; an hf: model converts with train_lm.py's HF_RECIPE unless flags say otherwise: --transfer_steps 100 and --decay (t2r), --max_steps 600, --lr 1e-3")
    g.add_argument("--transfer_steps", type=non_negative_int, default=0, help="with --init pretrained: attention-transfer steps before finetuning, training only the feature maps (and window gates) to imitate softmax")
    g.add_argument("--transfer_lr", type=positive_float, default=1e-2, help="peak learning rate of the transfer stage")
    g.add_argument("--keep_softmax", type=non_negative_int, default=0, help="with --init pretrained: keep softmax the N (decoder) layers whose restoration alone lowers a short distillation loss most, the ranking printed and saved in softmax_layers.json (support/choose_layers.py; 0: none)")
    g.add_argument("--distill_weight", type=unit_interval, default=0.0, help="with --init pretrained: the finetuning's loss is (1 - w) the task's + w KL(teacher || student) of the next token's distribution, the softmax teacher frozen beside the student (support/distill.py; 0: off)")
    g = p.add_argument_group("training")
    r, f = schedules["random"], schedules["pretrained"]
    g.add_argument("--max_steps", type=positive_int, default=None, help=f"optimizer steps (default {r['max_steps']} random, {f['max_steps']} pretrained)")
    g.add_argument("--grad_accum", type=positive_int, default=1, help="micro-batches per optimizer step")
    g.add_argument("--lr", type=positive_float, default=None, help=f"peak learning rate (default {r['lr']:g} random, {f['lr']:g} pretrained)")
    g.add_argument("--warmup_steps", type=positive_int, default=None, help="warmup steps (default: a fraction of max_steps)")
    g.add_argument("--weight_decay", type=non_negative_float, default=weight_decay, help="AdamW weight decay on matrices")
    g.add_argument("--grad_clip", type=non_negative_float, default=1.0, help="clip the gradient norm (0: off)")
    g.add_argument("--seed", type=seed, default=1337, help="seed of the initialisation, dropout and batch order")
    g.add_argument("--stop_at", type=non_negative_int, default=None, help="stop after this step with a checkpoint, as if interrupted (resume with --resume)")
    s = p.add_argument_group("system")
    s.add_argument("--out_dir", default=None, help="checkpoints, model.pt, results.json (default out/<dataset>-<attn>-<init>)")
    s.add_argument("--resume", action="store_true", help="continue the run in <out_dir> exactly where it stopped")
    s.add_argument("--eval_only", action="store_true", help="evaluate <out_dir>/model.pt on valid and test, then exit")
    s.add_argument("--device", type=device_name, default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:1, mps")
    s.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"], help="autocast dtype (auto: bf16/fp16 on CUDA, fp32 on CPU)")
    s.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None, help="torch.compile the model (default: on for CUDA, off on CPU)")
    s.add_argument("--log_interval", type=positive_int, default=log_interval, help="steps between log lines")
    s.add_argument("--eval_interval", type=positive_int, default=eval_interval, help="steps between evaluations and checkpoints")
    return g


def take_saved_flags(args, out_dir: str, invocation: set, growable: tuple = (), script: str = "this script",
                     lowerable: tuple = ()):
    """--resume and --eval_only continue the run in out_dir, which must stay the same run: every flag not given
    now is the run's own, and a given flag that contradicts the run is refused. Only the flags in `invocation`
    (where to run it, when to stop) belong to this invocation alone; a flag in `growable` may be raised (a longer
    run whose schedule does not depend on its length is the same run, continued), one in `lowerable` lowered (the
    learning rate of a run whose loss turned NaN: the recovery the error suggests)."""
    saved_path = os.path.join(out_dir, "args.json")
    if os.path.isfile(saved_path):
        try:
            with open(saved_path) as f:
                saved = json.load(f)
        except (OSError, ValueError) as error:
            raise UserError(f"{saved_path} is unreadable ({type(error).__name__}): restore it, or delete it to "
                            f"take the flags from {out_dir}/ckpt.pt") from None
    else:
        saved = load_checkpoint(os.path.join(out_dir, "ckpt.pt")).get("args", {})
    foreign = [name for name in saved if not hasattr(args, name)]
    if len(foreign) > 3:  # more than a few flags retired since: another trainer's run
        raise UserError(f"{out_dir} is not a {script} run (it has --{foreign[0]}, which {script} does not): "
                        f"continue it with the script that trained it")
    for name, value in saved.items():
        if name in invocation or not hasattr(args, name):
            continue
        if name not in args.explicit:
            setattr(args, name, value)
        elif name in growable and getattr(args, name) > value:
            print(f"--{name} {getattr(args, name)}: {out_dir}, trained with --{name} {value}, goes on with its "
                  f"other flags (--warmup_steps {saved.get('warmup_steps')})")
        elif name in lowerable and getattr(args, name) < value:
            print(f"--{name} {getattr(args, name)}: {out_dir}, trained with --{name} {value}, goes on at the lower "
                  f"value from its last checkpoint")
        elif value != getattr(args, name):
            raise UserError(f"{out_dir} was trained with --{name} {value}, the flags say {getattr(args, name)}: "
                            f"drop the flag to continue or evaluate that run, or pick another --out_dir")
    args.out_dir = out_dir


def adopt_saved_run(parser, argv, default_out_dir, growable: tuple = ()):
    """Parse the flags; --resume and --eval_only take every flag not given from the run in out_dir. With --resume,
    the flags in `growable` may be raised: a trainer whose schedule ignores --max_steps lets a run go on longer."""
    args = parser.parse_args(argv)
    args.explicit = explicit_flags(parser, argv)
    if args.resume or args.eval_only:
        attn = args.attn or ("t2r" if args.init == "pretrained" else "softmax")
        out_dir = args.out_dir or default_out_dir(args, attn, args.init)
        if args.resume and not any(os.path.isfile(os.path.join(out_dir, name)) for name in ("args.json", "ckpt.pt")):
            raise UserError(nothing_to_resume(out_dir))  # stopped before its flags were saved (open_run: its weights)
        take_saved_flags(args, out_dir, INVOCATION_FLAGS,
                         growable if args.resume else (), script=parser.prog, lowerable=("lr",) if args.resume else ())
    return args


def resolve_run_flags(args, parser, schedules: dict, warmup_divisor: int, default_out_dir):
    """The defaults that depend on other flags, and the checks every trainer shares.
    default_out_dir(args, attn, init) names a run's folder."""
    args.attn = args.attn or ("t2r" if args.init == "pretrained" else "softmax")
    schedule = schedules[args.init]
    args.max_steps = schedule["max_steps"] if args.max_steps is None else args.max_steps
    args.lr = schedule["lr"] if args.lr is None else args.lr
    if args.warmup_steps is None:
        args.warmup_steps = max(1, args.max_steps // warmup_divisor)
    if args.lr > torch.finfo(torch.float32).max:  # the optimizer computes in float32: it would be inf
        parser.error(f"--lr {args.lr:g} is beyond float32's largest number ({torch.finfo(torch.float32).max:.3g})")
    args.out_dir = args.out_dir or default_out_dir(args, args.attn, args.init)
    args.pretrained = args.pretrained or os.path.join(default_out_dir(args, "softmax", "random"), "model.pt")
    check_conversion_flags(args, parser)
    return args


def apply_preset(args, presets: dict, finetune: dict):
    """--preset: its values for every flag not given on the command line; with --init pretrained, the finetuning
    values on top (the paper's finetuning tables change only some of them). A resumed or evaluated run already
    holds its preset's values, and the ones it changed: they stay."""
    if args.preset:
        adopt_defaults(args, {**presets[args.preset], **(finetune if args.init == "pretrained" else {})})


def adopt_defaults(args, values: dict):
    """values for every flag not given on the command line; a resumed or evaluated run keeps its own."""
    if not (args.resume or args.eval_only):
        for key, value in values.items():
            if key not in args.explicit:
                setattr(args, key, value)


def check_conversion_flags(args, parser):
    """The flags that only mean something together: refused up front where one would be ignored or could not
    work (before a missing teacher is trained first)."""
    if "pretrained" in args.explicit and args.init != "pretrained":
        parser.error(f"--pretrained {args.pretrained} is the model --init pretrained converts: add --init pretrained")
    if args.transfer_steps and args.init != "pretrained":
        parser.error("--transfer_steps trains the feature maps of a converted model: add --init pretrained")
    if "transfer_lr" in args.explicit and not args.transfer_steps:
        parser.error("--transfer_lr is the learning rate of the transfer stage: add --transfer_steps")
    if args.window and (args.short_conv or args.decay):
        parser.error(f"--window and --{'short_conv' if args.short_conv else 'decay'} each make the model's layers "
                     f"(after_t2r.py, decay.py): use one of them")
    if args.decay and args.attn == "softmax":
        parser.error("--decay makes a linear attention's state decay: pass --attn t2r, elu or rfa")
    if args.keep_softmax and (args.init != "pretrained" or args.attn == "softmax"):
        parser.error("--keep_softmax keeps some of a converted model's layers softmax: add --init pretrained and "
                     "--attn t2r, elu or rfa")
    if args.keep_softmax and getattr(args, "keep_softmax_every", 0):
        parser.error("--keep_softmax chooses the layers by data, --keep_softmax_every every n-th: use one")
    if args.distill_weight and args.init != "pretrained":
        parser.error("--distill_weight distils the softmax teacher a conversion starts from: add --init pretrained")
    if args.attn == "softmax" and (args.transfer_steps or args.window):
        parser.error(f"--{'transfer_steps' if args.transfer_steps else 'window'} needs linear attention: "
                     f"pass --attn t2r, elu or rfa, not softmax")
    if args.attn == "elu" and args.transfer_steps and not args.window:
        parser.error("--transfer_steps with --attn elu would train nothing (elu's feature map has no weights): "
                     "add --window (its gates train), or use --attn t2r or rfa")
    for name in ("feature_size", "cross_feature_size"):
        if args.attn == "rfa" and getattr(args, name, 0) % 2:
            parser.error(f"--{name} {getattr(args, name)}: rfa's features are a sin and a cos per random "
                         f"projection, so it must be even")
    check_layer_flags(args, parser)


def check_layer_flags(args, parser):
    """--keep_softmax_every and --freeze_feature_map (a language model's conversion options)."""
    keep, frozen = getattr(args, "keep_softmax_every", 0), getattr(args, "freeze_feature_map", False)
    if keep and args.init != "pretrained":
        parser.error("--keep_softmax_every picks which of the teacher's layers stay softmax: add --init pretrained")
    if keep and args.attn == "softmax":
        parser.error("--keep_softmax_every keeps some layers softmax and converts the others: add --attn t2r, elu "
                     "or rfa")
    if keep == 1:
        parser.error("--keep_softmax_every 1 keeps every layer softmax, which is the teacher: use 2 or more")
    if "keep_softmax_from" in args.explicit and not keep:
        parser.error("--keep_softmax_from says where --keep_softmax_every starts counting: add --keep_softmax_every")
    if frozen and args.attn in ("softmax", "elu"):
        parser.error(f"--freeze_feature_map: {args.attn} attention has no feature-map weights to freeze: "
                     f"use --attn t2r or rfa, or drop the flag")
    if args.transfer_steps and frozen:
        parser.error("--transfer_steps trains only the feature maps, which --freeze_feature_map freezes: drop one")


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
