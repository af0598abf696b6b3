"""
The flags both trainers (train_lm.py, train_mt.py) share: added to their parsers, taken from a saved run by --resume
and --eval_only (a resumed run is the same run), defaulted from one another, and checked together before any work.
"""

import argparse
import json
import os

import torch

from support.checkpoints import load_checkpoint
from support.run_files import nothing_to_resume
from support.runtime import (UserError, device_name, explicit_flags, fraction, non_negative_float, non_negative_int,
                             positive_float, positive_int, seed, unit_interval)
from t2r import ATTENTION_KINDS


# The flags that belong to one invocation of a run; all others define the run, and --resume or --eval_only
# take them from it (a resumed run is the same run: its evaluation, precision and logging included).
INVOCATION_FLAGS = {"resume", "eval_only", "stop_at", "out_dir", "device",
                    "pretrained_given"}  # no longer written: a run saved before may hold it


def add_data_flags(p, dataset: str, dataset_help: str, data_dir_help: str):
    """--dataset and --data_dir; returns their group, for the trainer's own data flags."""
    g = p.add_argument_group("data")
    g.add_argument("--dataset", default=dataset, help=dataset_help)
    g.add_argument("--data_dir", default=None, help=data_dir_help)
    return g


def add_model_flags(p, defaults: dict, dropout: float, feature_size: int):
    """The model flags both trainers share; returns their group, for the trainer's own."""
    g = p.add_argument_group("model (ignored with --init pretrained: the teacher's sizes are used)")
    g.add_argument("--n_layer", type=positive_int, default=None, help=f"(decoder) layers (default "
                   f"{defaults['n_layer']})")
    g.add_argument("--n_head", type=positive_int, default=None, help=f"attention heads r (default "
                   f"{defaults['n_head']})")
    g.add_argument("--d_model", type=positive_int, default=None, help=f"model width h (default {defaults['d_model']})")
    g.add_argument("--d_ff", type=positive_int, default=None, help=f"feed-forward width (default {defaults['d_ff']})")
    g.add_argument("--dropout", type=fraction, default=dropout, help="dropout on embeddings, sublayers and the "
                   "feed-forward layer")
    g.add_argument("--attn", default=None, choices=ATTENTION_KINDS, help="attention kind (default softmax; t2r with "
                   "--init pretrained, where softmax trains the teacher on unchanged: a control)")
    g.add_argument("--feature_size", type=positive_int, default=feature_size, help="k of the (causal) t2r or rfa "
                   "attention (elu has k = d)")
    g.add_argument("--chunk_size", type=non_negative_int, default=64, help="chunk length of the causal linear "
                   "attention in training (0: quadratic form)")
    g.add_argument("--window", type=non_negative_int, default=0, help="sliding-window hybrid: the linear layers "
                   "attend with softmax to the last W tokens (0: off)")
    g.add_argument("--decay", action=argparse.BooleanOptionalAction, default=False, help="the causal linear layers' "
                   "state decays, a gate per head and position from the key and one new number per head (decay.py); "
                   "with --init pretrained added at the swap, to a Hugging Face model (hf:) too, whose T2R conversion "
                   "has it by default (train_lm.py's HF_PARTS; --no-decay: without)")
    g.add_argument("--short_conv", type=non_negative_int, default=0, help="a depthwise causal convolution of K taps "
                   "before each causal self-attention (after_t2r.py; 0: off); with --init pretrained it is added to "
                   "the teacher (an hf: one too), as the identity")
    return g


def add_run_flags(p, schedules: dict, weight_decay: float, log_interval: int, eval_interval: int):
    """The flags both trainers share, in three groups; returns the "training" group for the trainer's own."""
    g = p.add_argument_group("initialisation")
    g.add_argument("--init", default="random", choices=["random", "pretrained"], help="random, or swap-then-finetune "
                   "a trained softmax model")
    g.add_argument("--pretrained", default=None, help="the softmax model.pt to convert (default: the softmax run's, "
                   "trained first if missing); train_lm.py also takes hf:NAME, a Hugging Face GPT-2 (gpt2, "
                   "distilgpt2, gpt2-medium; downloaded), or hf:FOLDER holding its config.json, model.safetensors (or "
                   "pytorch_model.bin) and tokenizer.json; an hf: model converts with train_lm.py's HF_RECIPE unless "
                   "flags say otherwise: --transfer_steps 100 and --decay (t2r), --max_steps 600, --lr 1e-3")
    g.add_argument("--transfer_steps", type=non_negative_int, default=0, help="with --init pretrained: "
                   "attention-transfer steps before finetuning, training only the feature maps (and window gates) to "
                   "imitate softmax")
    g.add_argument("--transfer_lr", type=positive_float, default=1e-2, help="peak learning rate of the transfer stage")
    g.add_argument("--keep_softmax", type=non_negative_int, default=0, help="with --init pretrained: keep softmax the "
                   "N (decoder) layers whose restoration alone lowers a short distillation loss most, the ranking "
                   "printed and saved in softmax_layers.json (support/choose_layers.py; 0: none)")
    g.add_argument("--distill_weight", type=unit_interval, default=0.0, help="with --init pretrained: the "
                   "finetuning's loss is (1 - w) the task's + w KL(teacher || student) of the next token's "
                   "distribution, the softmax teacher frozen beside the student (support/distill.py; 0: off)")
    g = p.add_argument_group("training")
    r, f = schedules["random"], schedules["pretrained"]
    g.add_argument("--max_steps", type=positive_int, default=None, help=f"optimizer steps (default {r['max_steps']} "
                   f"random, {f['max_steps']} pretrained)")
    g.add_argument("--grad_accum", type=positive_int, default=1, help="micro-batches per optimizer step")
    g.add_argument("--lr", type=positive_float, default=None, help=f"peak learning rate (default {r['lr']:g} random, "
                   f"{f['lr']:g} pretrained)")
    g.add_argument("--warmup_steps", type=positive_int, default=None, help="warmup steps (default: a fraction of "
                   "max_steps)")
    g.add_argument("--weight_decay", type=non_negative_float, default=weight_decay, help="AdamW weight decay on "
                   "matrices")
    g.add_argument("--grad_clip", type=non_negative_float, default=1.0, help="clip the gradient norm (0: off)")
    g.add_argument("--seed", type=seed, default=1337, help="seed of the initialisation, dropout and batch order")
    g.add_argument("--stop_at", type=non_negative_int, default=None, help="stop after this step with a checkpoint, as "
                   "if interrupted (resume with --resume)")
    s = p.add_argument_group("system")
    s.add_argument("--out_dir", default=None, help="checkpoints, model.pt, results.json (default "
                   "out/<dataset>-<attn>-<init>)")
    s.add_argument("--resume", action="store_true", help="continue the run in <out_dir> exactly where it stopped")
    s.add_argument("--eval_only", action="store_true", help="evaluate <out_dir>/model.pt on valid and test, then exit")
    s.add_argument("--device", type=device_name, default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda, "
                   "cuda:1, mps")
    s.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"], help="autocast "
                   "dtype (auto: bf16/fp16 on CUDA, fp32 on CPU)")
    s.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None, help="torch.compile the model "
                   "(default: on for CUDA, off on CPU)")
    s.add_argument("--log_interval", type=positive_int, default=log_interval, help="steps between log lines")
    s.add_argument("--eval_interval", type=positive_int, default=eval_interval, help="steps between evaluations and "
                   "checkpoints")
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
