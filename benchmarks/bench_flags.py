"""
bench.py's command line: its flags, the sizes of a full run (FULL, and FULL_CUDA's changes on a GPU) and of --quick,
and the checks that refuse, before it starts, a run that would measure nothing or could not write what it measured
(each a one-line error).

    python bench.py --help                   # every flag and its default
"""

import argparse
import os
import tempfile

import torch

from benchmarks.bench_models import CAPACITY_MODELS, GEN_MODELS, LM_MODELS, PAIRS, S2S_MODELS, SRU_MODELS
from support.runtime import Parser, non_negative_int, positive_int, seed

SECTIONS = ("gen", "prefill", "pairs", "s2s", "memory", "capacity", "train_attn", "train_lm", "mt")  # mt: --mt_runs; capacity: GPU
FULL = dict(lengths="128,256,512,1024,2048,4096,8192", batch_sizes="1,16", s2s_lengths="16,32,64,128,256,512,1024,"
            "2048,4096", s2s_batch_sizes="1,16,64", recompute_max=512, memory_length=4096,
            train_lengths="512,1024,2048,4096,8192", quadratic_max=4096, repeats=3, pair_rounds=21, pair_steps=128,
            vocab_size=10_000, out_dir="results/bench")
FULL_CUDA = dict(batch_sizes="1,16,256", train_lengths="1024,2048,4096,8192,16384")  # FULL's changes on a GPU
QUICK = dict(lengths="8,16", batch_sizes="1,16", s2s_lengths="8,16", s2s_batch_sizes="16", recompute_max=8,
             memory_length=64, train_lengths="32,64", quadratic_max=64, repeats=2, pair_rounds=3, pair_steps=4,
             vocab_size=1000, out_dir="out/bench-quick")
RANDOM_LM = dict(n_head=4, d_model=256)  # the random LM's heads and width unless --n_head, --d_model say
QUICK_CAPACITY = 256  # --quick's capacity search stops at this batch: a smoke test leaves the GPU to the tests beside it


def int_list(text: str) -> list:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return sorted(set(values))


def make_parser() -> Parser:
    """The flags; those left at None take their value from FULL, or from QUICK with --quick."""
    p = Parser(prog="bench.py", description="Speed and memory of softmax attention against T2R, against length.")
    p.add_argument("--quick", action="store_true", help="smoke run, under a minute with --threads 1 on 2 CPU cores: "
                   + ", ".join(f"--{k} {v}" for k, v in QUICK.items()))
    p.add_argument("--only", default="", help=f"comma-separated sections among {', '.join(SECTIONS)} (train = "
                   "train_attn,train_lm; default: all, capacity on CUDA only)")
    p.add_argument("--models", default="", help="comma-separated subset of the generation models (default: all): "
                   + ", ".join(GEN_MODELS))
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto: cuda if available; on "
                   "cuda the defaults change: " + ", ".join(f"--{k} {v}" for k, v in FULL_CUDA.items()))
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="bfloat16: generation in "
                   "bf16 weights (linear attention states stay float32), training under bf16 autocast")
    p.add_argument("--capacity_length", type=int, default=8192,
                   help="section capacity (CUDA only): the largest batch whose state fits at this many tokens")
    p.add_argument("--out_dir", default=None, help=f"where the outputs go (default {FULL['out_dir']})")
    p.add_argument("--lengths", type=int_list, default=None, help=f"generated lengths of the LM ({FULL['lengths']})")
    p.add_argument("--batch_sizes", type=int_list, default=None, help="LM generation batch sizes (1,16)")
    p.add_argument("--s2s_lengths", type=int_list, default=None,
                   help=f"source = target lengths of the translator ({FULL['s2s_lengths']})")
    p.add_argument("--s2s_batch_sizes", type=int_list, default=None, help="translator batch sizes (Fig. 2: 16)")
    p.add_argument("--s2s_max_tokens", type=int, default=65536,
                   help="translator runs of batch x length above this are left out (a KV cache of batch 64 at 4096 "
                   "tokens reads gigabytes a step)")
    p.add_argument("--mt_runs", type=lambda s: [d for d in s.split(",") if d], default=[],
                   help="comma-separated train_mt.py run folders: their greedy and beam decoding of their own test "
                   "sentences, batch 16 (section mt; one softmax run and one converted, e.g. "
                   "out/mt-libreoffice-en-de-softmax-random,out/mt-libreoffice-en-de-t2r-pretrained)")
    p.add_argument("--mt_sentences", type=int, default=500, help="test sentences each --mt_runs run decodes")
    p.add_argument("--mt_passes", type=int, default=5, help="passes over them per run, the runs taking turns")
    p.add_argument("--pair_rounds", type=int, default=None, help="section pairs: rounds, the two steps taking turns "
                   "(21)")
    p.add_argument("--pair_steps", type=int, default=None, help="section pairs: steps of each model per round (128)")
    p.add_argument("--recompute_max", type=int, default=None,
                   help="longest length of softmax_recompute, which is quadratic per token (512)")
    p.add_argument("--memory_length", type=int, default=None, help="tokens of the state-size comparison (4096)")
    p.add_argument("--train_lengths", type=int_list, default=None, help=f"training lengths ({FULL['train_lengths']})")
    p.add_argument("--train_batch", type=int, default=1, help="sequences per training step")
    p.add_argument("--quadratic_max", type=int, default=None,
                   help="longest training length of the T x T forms softmax_math, t2r_quadratic (4096)")
    p.add_argument("--repeats", type=int, default=None, help="timed training iterations, median taken (3)")
    p.add_argument("--gen_repeats", type=int, default=1,
                   help="timed generation runs; per-step times are the elementwise median")
    p.add_argument("--vocab_size", type=int, default=None, help="the random LM's vocabulary "
                   f"({FULL['vocab_size']}; its output layer is a large share of a step's time; --ckpt brings its own)")
    p.add_argument("--d_model", type=positive_int, default=None, help="the random LM's width "
                   f"({RANDOM_LM['d_model']}; its feed-forward 4x as wide): a GPU's arithmetic shows at 1024 and more, "
                   "a small width times launches")
    p.add_argument("--n_head", type=positive_int, default=None, help=f"the random LM's heads ({RANDOM_LM['n_head']})")
    p.add_argument("--ckpt", default="", help="optional train_lm.py checkpoint: its LM shapes and the weights that fit")
    p.add_argument("--threads", type=non_negative_int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--seed", type=seed, default=1337, help="torch.manual_seed of the random weights and tokens")
    return p


def get_args(argv=None):
    p = make_parser()
    args = p.parse_args(argv)
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    for name, default in (QUICK if args.quick else {**FULL, **(FULL_CUDA if cuda else {})}).items():
        if getattr(args, name) is None:
            setattr(args, name, int_list(default) if name.endswith(("lengths", "sizes")) else default)
    named = [s.strip() for s in args.only.split(",") if s.strip()]
    only = named or [s for s in SECTIONS if cuda or s != "capacity"]
    args.only = [s for o in only for s in (("train_attn", "train_lm") if o == "train" else (o,))]
    for section in args.only:
        if section not in SECTIONS:
            p.error(f"unknown section {section!r} in --only: choose among {', '.join(SECTIONS)}")
    for run in args.mt_runs:
        if not all(os.path.isfile(os.path.join(run, f)) for f in ("model.pt", "args.json")):
            p.error(f"--mt_runs {run}: no model.pt and args.json there (a finished train_mt.py run)")
    args.only += ["mt"] if args.mt_runs and "mt" not in args.only else []
    if "capacity" in only and not cuda:
        p.error("--only capacity: the largest batch that fits is found on a CUDA device (a CPU would swap)")
    for name in ("capacity_length", "mt_sentences", "mt_passes", "s2s_max_tokens", "recompute_max", "memory_length",
                 "train_batch", "quadratic_max", "repeats", "gen_repeats", "pair_rounds", "pair_steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    for name in args.models:
        if name not in GEN_MODELS:
            p.error(f"unknown model {name!r} in --models: choose among {', '.join(GEN_MODELS)}")
    if args.threads > (os.cpu_count() or 1):
        p.error(f"--threads {args.threads}: this machine has {os.cpu_count()} CPU cores; pass at most that")
    if args.vocab_size < 2:
        p.error("--vocab_size must be at least 2")
    if args.ckpt and (args.d_model, args.n_head) != (None, None):
        p.error("--d_model and --n_head size the random LM: --ckpt brings its own shapes; pass one or the other")
    args.d_model, args.n_head = (RANDOM_LM[name] if getattr(args, name) is None else getattr(args, name)
                                 for name in ("d_model", "n_head"))
    if args.d_model % args.n_head:
        p.error(f"--d_model {args.d_model} and --n_head {args.n_head}: the width must split into whole heads "
                "(d_model a multiple of n_head)")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available")
    if "t2r32_graph" in args.models and not cuda:
        p.error("--models t2r32_graph: CUDA graphs need a CUDA device")
    check_selection(args, p, named)
    return args


def check_selection(args, parser, named_sections: list):
    """Refuse a run that would measure nothing, or could not write what it measured, before it starts."""
    if "mt" in named_sections and not args.mt_runs:
        parser.error("--only mt decodes the translators of --mt_runs: pass --mt_runs RUN[,RUN...]")
    filtered = {"gen": [*LM_MODELS, *SRU_MODELS], "pairs": [m for pair in PAIRS for m in pair],
                "s2s": list(S2S_MODELS), "capacity": list(CAPACITY_MODELS)}
    sections = [s for s in filtered if s in args.only]
    if args.models and sections and not any(set(args.models) & set(filtered[s]) for s in sections):
        parser.error(f"--models {','.join(args.models)}: no model that --only {','.join(sections)} measures ("
                     + "; ".join(f"{s}: {', '.join(filtered[s])}" for s in sections) + ")")
    if os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):
        parser.error(f"--out_dir {args.out_dir} is a file: pass a folder")
    try:  # found now, not after an hour of measuring
        os.makedirs(args.out_dir, exist_ok=True)
        tempfile.TemporaryFile(dir=args.out_dir).close()
    except OSError as error:
        parser.error(f"--out_dir {args.out_dir} cannot be written ({error.strerror}): pass a writable folder")
