"""
Train a language model, or convert a trained softmax one into an RNN and finetune it (T2R, section 2.2).

    python train_lm.py                              # pretrain the softmax transformer on PTB (CPU default)
    python train_lm.py --init pretrained            # the main job: pretrain if needed, swap to T2R, finetune,
                                                    # evaluate both and print the table
    python train_lm.py --attn t2r                   # T2R from random initialisation, for comparison
    python train_lm.py --resume --out_dir out/ptb-t2r-pretrained   # continue exactly where it stopped
    torchrun --nproc_per_node 2 train_lm.py ...     # data parallel (NCCL on GPUs, gloo on CPU)
    python train_lm.py --preset wt103 --dataset wikitext103        # the paper's model, for GPUs

Evaluation follows section 3.2.1: windows of 512 tokens, only the last 256 of each scored.
"""

import argparse
import copy
import itertools
import json
import os
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

import data
from t2r import ATTENTION_KINDS, Config, TransformerLM, convert, is_feature_map_parameter
from training import (Parser, UserError, all_reduce_sum, autocast_context, explicit_flags, gather_rng, get_device,
                      get_lr, load_checkpoint, make_optimizer, make_scaler, model_from_checkpoint, optimizer_step,
                      print_config, resolve_dtype, rng_state, run_main, save_checkpoint, serializable, set_lr,
                      set_rng_state, setup_distributed, take_saved_flags, unwrap)

# The paper's WikiText-103 model (section 3.2.1, appendix Table 3), for GPU users.
# batch 6 x 512 = 3072 tokens per GPU and update-freq 3: on 8 GPUs the paper's ~74K tokens per update.
PRESETS = {
    "wt103": dict(n_layer=32, n_head=8, d_model=1024, d_ff=4096, dropout=0.2, layer_dropout=0.2,
                  feature_size=32, block_size=512, batch_size=6, grad_accum=3),
}
PRESET_FINETUNE = dict(grad_accum=1)  # appendix Table 4: update-freq 1 when finetuning
MODEL_FLAGS = ("n_layer", "n_head", "d_model", "d_ff")

# Pretraining schedule of the CPU default, and the finetuning one. Appendix Table 4 against Table 3:
# finetuning halves the peak learning rate, the warmup and the number of updates.
SCHEDULES = {
    "random": dict(max_steps=1200, lr=1e-3),
    "pretrained": dict(max_steps=600, lr=5e-4),
}


def get_args(argv=None):
    p = Parser(prog="train_lm.py", description="Pretrain a transformer LM, or convert one to T2R and finetune.")
    g = p.add_argument_group("data")
    g.add_argument("--dataset", default="ptb", help="ptb (offline default), wikitext103, or a folder of train/valid/test text files")
    g.add_argument("--data_dir", default=None, help="where the dataset lives or is downloaded (wikitext103: data/wikitext103)")
    g.add_argument("--tokenizer", default="word", choices=["word", "bpe"], help="word-level (the paper's setting) or BPE")
    g.add_argument("--vocab_size", type=int, default=8000, help="BPE vocabulary size (word level uses every training word)")
    g.add_argument("--cache_dir", default="data/cache", help="where token ids are cached as numpy memmaps")
    g = p.add_argument_group("model (ignored with --init pretrained: the teacher's sizes are used)")
    g.add_argument("--preset", default=None, choices=sorted(PRESETS), help="the paper's WikiText-103 model (32 layers, 1024/4096)")
    g.add_argument("--n_layer", type=int, default=None, help="layers (default 4)")
    g.add_argument("--n_head", type=int, default=None, help="attention heads r (default 4)")
    g.add_argument("--d_model", type=int, default=None, help="model width h (default 256)")
    g.add_argument("--d_ff", type=int, default=None, help="feed-forward width (default 4 * d_model)")
    g.add_argument("--dropout", type=float, default=0.3, help="dropout on embeddings, sublayers and the feed-forward layer")
    g.add_argument("--layer_dropout", type=float, default=0.0, help="LayerDrop: probability of skipping a layer in training")
    g.add_argument("--attn", default=None, choices=ATTENTION_KINDS, help="attention kind (default softmax; t2r with --init pretrained, where softmax trains the teacher on unchanged, a control)")
    g.add_argument("--feature_size", type=int, default=32, help="k, the feature size of t2r and rfa (elu has k = d)")
    g.add_argument("--keep_softmax_every", type=int, default=0, help="with --init pretrained: keep every n-th layer from the top softmax (4: 'T2R 75%%')")
    g.add_argument("--chunk_size", type=int, default=64, help="chunk length of the causal linear attention (0: quadratic form)")
    g = p.add_argument_group("initialisation")
    g.add_argument("--init", default="random", choices=["random", "pretrained"], help="random, or swap-then-finetune a softmax checkpoint")
    g.add_argument("--pretrained", default=None, help="softmax checkpoint to convert (default out/<dataset>-softmax-random/ckpt.pt, trained first if missing)")
    g.add_argument("--freeze_feature_map", action="store_true", help="finetune with the feature-map MLP frozen (the paper's 'T2R MLP frozen' analysis)")
    g = p.add_argument_group("training")
    g.add_argument("--max_steps", type=int, default=None, help="optimizer steps (default 1200 random, 600 pretrained)")
    g.add_argument("--batch_size", type=int, default=8, help="sequences per micro-batch (per process)")
    g.add_argument("--block_size", type=int, default=512, help="tokens per training sequence")
    g.add_argument("--grad_accum", type=int, default=1, help="micro-batches per optimizer step")
    g.add_argument("--lr", type=float, default=None, help="peak learning rate (default 1e-3 random, 5e-4 pretrained)")
    g.add_argument("--min_lr_ratio", type=float, default=0.1, help="final learning rate as a fraction of the peak")
    g.add_argument("--warmup_steps", type=int, default=None, help="linear warmup steps (default 10%% of max_steps)")
    g.add_argument("--weight_decay", type=float, default=0.01, help="AdamW weight decay on matrices")
    g.add_argument("--grad_clip", type=float, default=1.0, help="clip the gradient norm (0: off)")
    g.add_argument("--seed", type=int, default=1337, help="seed of the initialisation, dropout and batch order")
    g.add_argument("--stop_at", type=int, default=None, help="stop after this step with a checkpoint, as if interrupted (resume with --resume)")
    g = p.add_argument_group("evaluation")
    g.add_argument("--eval_interval", type=int, default=250, help="steps between evaluations and checkpoints")
    g.add_argument("--eval_windows", type=int, default=40, help="validation windows used by the periodic evaluation (the final one uses all)")
    g.add_argument("--eval_context", type=int, default=512, help="tokens of context per evaluation window")
    g.add_argument("--eval_score", type=int, default=256, help="tokens scored at the end of each window (stride)")
    g.add_argument("--eval_batch_size", type=int, default=8, help="windows per evaluation batch")
    g = p.add_argument_group("system")
    g.add_argument("--out_dir", default=None, help="checkpoints and logs (default out/<dataset>-<attn>-<init>)")
    g.add_argument("--resume", action="store_true", help="continue from <out_dir>/ckpt.pt")
    g.add_argument("--eval_only", action="store_true", help="evaluate <out_dir>/ckpt.pt on valid and test, then exit")
    g.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:1, mps")
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"], help="autocast dtype (auto: bf16/fp16 on CUDA, fp32 on CPU)")
    g.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None, help="torch.compile the model (default: on for CUDA, off on CPU)")
    g.add_argument("--log_interval", type=int, default=25, help="steps between log lines")
    args = p.parse_args(argv)
    args.explicit = explicit_flags(p, argv)
    if args.resume or args.eval_only:
        adopt_saved_flags(args)
    return resolve_defaults(args, p)


# Flags that only steer this invocation; all others define a run, and --resume takes them from the run.
RUN_CONTROL = {"resume", "eval_only", "stop_at", "out_dir", "device", "dtype", "compile", "log_interval",
               "eval_interval", "eval_windows", "eval_batch_size", "eval_context", "eval_score", "pretrained_given"}


def adopt_saved_flags(args):
    """--resume and --eval_only continue the run in out_dir (see training.take_saved_flags)."""
    attn = args.attn or ("t2r" if args.init == "pretrained" else "softmax")
    out_dir = args.out_dir or default_out_dir(args.dataset, attn, args.init)
    take_saved_flags(args, out_dir, RUN_CONTROL)


def dataset_name(dataset: str) -> str:
    return os.path.basename(os.path.normpath(dataset))


def default_out_dir(dataset: str, attn: str, init: str) -> str:
    return os.path.join("out", f"{dataset_name(dataset)}-{attn}-{init}")


def resolve_defaults(args, parser):
    if args.preset:
        preset = {**PRESETS[args.preset], **(PRESET_FINETUNE if args.init == "pretrained" else {})}
        for key, value in preset.items():
            if key not in args.explicit:
                setattr(args, key, value)
    args.attn = args.attn or ("t2r" if args.init == "pretrained" else "softmax")
    schedule = SCHEDULES[args.init]
    if args.max_steps is None:
        args.max_steps = schedule["max_steps"]
    if args.lr is None:
        args.lr = schedule["lr"]
    if args.warmup_steps is None:
        args.warmup_steps = max(1, args.max_steps // 10)
    args.out_dir = args.out_dir or default_out_dir(args.dataset, args.attn, args.init)
    args.pretrained_given = "pretrained" in args.explicit
    args.pretrained = args.pretrained or os.path.join(default_out_dir(args.dataset, "softmax", "random"), "ckpt.pt")
    if args.lr <= 0:
        parser.error("--lr must be positive")
    for name, value in (("max_steps", args.max_steps), ("batch_size", args.batch_size), ("block_size", args.block_size),
                        ("grad_accum", args.grad_accum), ("eval_interval", args.eval_interval)):
        if value < 1:
            parser.error(f"--{name} must be at least 1")
    if not 0 < args.eval_score <= args.eval_context:
        parser.error("--eval_score must be between 1 and --eval_context")
    return args


def model_config(args, vocab_size: int) -> Config:
    d_model = args.d_model or 256
    return Config(vocab_size=vocab_size, n_layer=args.n_layer or 4, n_head=args.n_head or 4, d_model=d_model,
                  d_ff=args.d_ff or 4 * d_model, dropout=args.dropout, layer_dropout=args.layer_dropout,
                  attn=args.attn, feature_size=args.feature_size, chunk_size=args.chunk_size)


# -----------------------------------------------------------------------------
# Evaluation (section 3.2.1)

@torch.no_grad()
def evaluate(model, ids, eos_id, args, device, dtype, ddp, max_windows=None) -> dict:
    """Negative log-likelihood of every token, each predicted with up to eval_context tokens of context
    and scored once (the last eval_score tokens of each window). Returns the summed NLL and counts."""
    model.eval()
    # bos=<eos>: the first token is predicted after an end of line, so every token is scored once
    windows = data.eval_windows(ids, args.eval_context, args.eval_score, bos=eos_id)
    windows = list(itertools.islice(windows, max_windows))[ddp.rank :: ddp.world_size]
    totals = torch.zeros(2, dtype=torch.float64, device=device)  # summed NLL, scored tokens (on device for NCCL)
    for i in range(0, len(windows), args.eval_batch_size):
        batch = windows[i : i + args.eval_batch_size]
        for x, y, mask in group_by_length(batch):
            x, y, mask = x.to(device), y.to(device), mask.to(device)
            with autocast_context(device, dtype):
                logits = model(x)
            nll = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none")
            totals[0] += (nll * mask.flatten()).sum()
            totals[1] += mask.sum()
    model.train()
    totals = all_reduce_sum(totals, ddp)
    return {"nll": totals[0].item(), "tokens": int(totals[1].item())}


def group_by_length(windows):
    """Stack windows of equal length (only the first window of a split can be shorter)."""
    by_length = {}
    for x, y, mask in windows:
        by_length.setdefault(len(x), []).append((x, y, mask))
    for same in by_length.values():
        yield tuple(torch.stack([torch.as_tensor(w[j]) for w in same]) for j in range(3))


def perplexities(result: dict, n_words: int | None, tokenizer: str) -> dict:
    out = {"ppl": float(torch.tensor(result["nll"] / result["tokens"]).exp()), "tokens": result["tokens"]}
    if tokenizer == "bpe" and n_words:  # word-level perplexity, comparable with the literature
        out["word_ppl"] = float(torch.tensor(result["nll"] / n_words).exp())
    return out


def final_evaluation(model, lm_data, args, device, dtype, ddp) -> dict:
    results = {}
    for split in ("valid", "test"):
        r = evaluate(model, getattr(lm_data, split), lm_data.eos_id, args, device, dtype, ddp)
        results[split] = perplexities(r, lm_data.n_words.get(split), args.tokenizer)
    return results


# -----------------------------------------------------------------------------
# Building the model: from scratch, from a pretrained softmax checkpoint, or from a resumed run

def load_teacher(args, vocab_size: int):
    checkpoint = load_checkpoint(args.pretrained, "pretrained checkpoint")
    config = checkpoint["config"]
    if config["vocab_size"] != vocab_size:
        raise UserError(f"{args.pretrained} has a vocabulary of {config['vocab_size']}, the data has {vocab_size}: "
                        f"pretrain on the same --dataset and --tokenizer, or pass the matching --pretrained")
    kinds = Config(**config).layer_kinds()
    if set(kinds) != {"softmax"}:
        raise UserError(f"{args.pretrained} is already converted (attention {sorted(set(kinds))}): "
                        f"--init pretrained needs a softmax checkpoint")
    if config.get("n_encoder_layer"):
        raise UserError(f"{args.pretrained} is a translation model, not a language model")
    for name in MODEL_FLAGS:
        if getattr(args, name) is not None and getattr(args, name) != config[name]:
            raise UserError(f"--{name} {getattr(args, name)} differs from the pretrained model's {config[name]}: "
                            f"drop the flag (the teacher's sizes are used)")
    if checkpoint.get("step", 0) < checkpoint.get("max_steps", 0):
        raise UserError(f"{args.pretrained} stopped at step {checkpoint['step']} of {checkpoint['max_steps']}: "
                        f"finish it with python train_lm.py --resume --out_dir {os.path.dirname(args.pretrained)}")
    return model_from_checkpoint(checkpoint, args.pretrained)


def build(args, vocab_size: int):
    try:
        return build_model(args, vocab_size)
    except ValueError as error:  # a Config that cannot be, e.g. --d_model not divisible by --n_head
        raise UserError(f"bad model flags: {error}") from None


def build_model(args, vocab_size: int):
    if args.init == "pretrained":
        teacher = load_teacher(args, vocab_size)
        # finetuning's regularisation and chunking are flags; the student is built from this config
        teacher.config.dropout, teacher.config.layer_dropout = args.dropout, args.layer_dropout
        teacher.config.chunk_size = args.chunk_size
        if args.attn == "softmax":  # a control: the teacher trained on for the finetuning budget, no swap
            print(f"continuing {args.pretrained} unchanged (softmax): the finetuning budget without the swap")
            return teacher
        model = convert(teacher, args.attn, args.feature_size, args.keep_softmax_every)
        print(f"converted {args.pretrained} to {args.attn} (k={feature_size(model)}, "
              f"keep_softmax_every={args.keep_softmax_every}); new parameters: feature maps only")
        return model
    return TransformerLM(model_config(args, vocab_size))


def feature_size(model) -> int:
    """k of the converted attention (elu has k = d), as reported in the tables."""
    kinds = set(model.config.layer_kinds()) - {"softmax"}
    if kinds == {"elu"}:
        return model.config.d_model // model.config.n_head
    return model.config.feature_size


# -----------------------------------------------------------------------------
# Training

def train(args, ddp) -> dict:
    device = get_device(args.device if not ddp.enabled or args.device != "auto" else
                        (f"cuda:{ddp.local_rank}" if torch.cuda.is_available() else "cpu"))
    dtype = resolve_dtype(args.dtype, device)
    compile_model = args.compile if args.compile is not None else device.type == "cuda"
    lm_data = load_data(args)
    ckpt_path = os.path.join(args.out_dir, "ckpt.pt")

    torch.manual_seed(args.seed)  # the same initialisation on every process
    generator = torch.Generator().manual_seed(args.seed + ddp.rank)  # a different batch order per process
    checkpoint = None
    if args.resume or args.eval_only:
        checkpoint = load_checkpoint(ckpt_path)
        if checkpoint["config"]["vocab_size"] != lm_data.vocab_size:
            raise UserError(f"{ckpt_path} has a vocabulary of {checkpoint['config']['vocab_size']}, the data has "
                            f"{lm_data.vocab_size}: pass the --dataset and --tokenizer it was trained with")
        model = model_from_checkpoint(checkpoint, ckpt_path)
    else:
        if os.path.exists(ckpt_path):
            raise UserError(f"{ckpt_path} exists: pass --resume to continue it, --eval_only to evaluate it, "
                            f"or choose another --out_dir")
        model = build(args, lm_data.vocab_size)
    if len(lm_data.train) <= args.block_size:
        raise UserError(f"the training split has {len(lm_data.train)} tokens, not more than --block_size "
                        f"{args.block_size}: use a smaller --block_size or more data")
    if args.freeze_feature_map:
        for name, p in model.named_parameters():
            if is_feature_map_parameter(name):
                p.requires_grad_(False)
    model.to(device)
    optimizer = make_optimizer(model, args.lr, args.weight_decay, device)
    scaler = make_scaler(device, dtype)
    step, best_val, train_seconds = 0, float("inf"), 0.0
    if args.resume:
        optimizer.load_state_dict(checkpoint["optimizer"])
        scaler.load_state_dict(checkpoint["scaler"])
        step, best_val, train_seconds = checkpoint["step"], checkpoint["best_val"], checkpoint["train_seconds"]
        set_rng_state(checkpoint["rng"][min(ddp.rank, len(checkpoint["rng"]) - 1)], generator)
        print(f"resumed {ckpt_path} at step {step} (best validation loss {best_val:.4f})")

    if ddp.is_main:
        os.makedirs(args.out_dir, exist_ok=True)
        print_config("model", model.config.to_dict())
        print(f"parameters: {unwrap(model).num_params():,}")
        with open(os.path.join(args.out_dir, "args.json"), "w") as f:
            json.dump(serializable(vars(args)), f, indent=1)
    raw_model = model
    if compile_model:
        model = torch.compile(model)
    if ddp.enabled:
        # LayerDrop skips whole layers, whose parameters then get no gradient in that step
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                        find_unused_parameters=raw_model.config.layer_dropout > 0)

    def save():
        rng = gather_rng(rng_state(generator), ddp)
        if ddp.is_main:
            save_checkpoint(ckpt_path, {
                "model": raw_model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
                "config": raw_model.config.to_dict(), "args": serializable(vars(args)), "step": step,
                "max_steps": args.max_steps, "best_val": best_val, "rng": rng, "train_seconds": train_seconds})

    if args.eval_only:
        return report(raw_model, lm_data, args, device, dtype, ddp, train_seconds)

    tokens_per_step = args.batch_size * args.block_size * args.grad_accum * ddp.world_size
    min_lr = args.lr * args.min_lr_ratio
    bar = tqdm(total=args.max_steps, initial=step, desc=os.path.basename(args.out_dir), disable=not ddp.is_main,
               dynamic_ncols=True, mininterval=2)
    model.train()
    t_last, loss_sum, loss_count = time.time(), 0.0, 0
    while step < args.max_steps:
        if args.stop_at is not None and step >= args.stop_at:
            break
        t_step = time.time()
        lr = get_lr(step, args.lr, min_lr, args.warmup_steps, args.max_steps)
        set_lr(optimizer, lr)
        for micro in range(args.grad_accum):
            x, y = data.get_batch(lm_data.train, args.batch_size, args.block_size, generator)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            sync = not ddp.enabled or micro == args.grad_accum - 1
            with (nullcontext() if sync else model.no_sync()), autocast_context(device, dtype):
                logits = model(x)
                loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten()) / args.grad_accum
            scaler.scale(loss).backward()
            loss_sum += loss.detach()  # no .item() here: on a GPU it would wait for every step
        loss_count += 1
        optimizer_step(raw_model, optimizer, scaler, args.grad_clip)
        step += 1
        train_seconds += time.time() - t_step
        bar.update(1)

        if step % args.log_interval == 0 or step == args.max_steps:
            elapsed, t_last = time.time() - t_last, time.time()
            tok_s = tokens_per_step * loss_count / elapsed
            mean_loss = float(loss_sum) / loss_count
            bar.set_postfix(loss=f"{mean_loss:.3f}", lr=f"{lr:.1e}", tok_s=f"{tok_s:,.0f}")
            if ddp.is_main:
                tqdm.write(f"step {step}/{args.max_steps} | loss {mean_loss:.4f} | lr {lr:.2e} | "
                           f"{tok_s:,.0f} tok/s | {train_seconds / 60:.1f} min")
            loss_sum, loss_count = 0.0, 0
        if step % args.eval_interval == 0 or step == args.max_steps:
            t_eval = time.time()
            val = evaluate(raw_model, lm_data.valid, lm_data.eos_id, args, device, dtype, ddp, args.eval_windows)
            val_loss = val["nll"] / val["tokens"]
            if val_loss < best_val:
                best_val = val_loss
            if ddp.is_main:
                tqdm.write(f"step {step}: validation loss {val_loss:.4f} (ppl {torch.tensor(val_loss).exp():.1f}, "
                           f"{args.eval_windows} windows), best {best_val:.4f}")
            train_seconds += time.time() - t_eval
            save()
            t_last = time.time()
    bar.close()
    save()
    if step < args.max_steps:
        print(f"stopped at step {step} of {args.max_steps}: continue with --resume --out_dir {args.out_dir}")
        return {}
    return report(raw_model, lm_data, args, device, dtype, ddp, train_seconds)


def report(model, lm_data, args, device, dtype, ddp, train_seconds) -> dict:
    results = final_evaluation(model, lm_data, args, device, dtype, ddp)
    results["train_minutes"] = train_seconds / 60
    results["attn"] = args.attn if args.init == "random" else f"{args.attn}+pretrain"
    results["k"] = feature_size(model) if args.attn != "softmax" else None
    if ddp.is_main:
        line = f"valid ppl {results['valid']['ppl']:.2f} | test ppl {results['test']['ppl']:.2f}"
        if "word_ppl" in results["test"]:
            line += f" | word-level valid {results['valid']['word_ppl']:.2f} test {results['test']['word_ppl']:.2f}"
        print(f"{args.out_dir}: {line} | {results['train_minutes']:.1f} train minutes")
        with open(os.path.join(args.out_dir, "results.json"), "w") as f:
            json.dump(results, f, indent=1)
    return results


def load_data(args):
    try:
        return data.prepare(args.dataset, args.data_dir, tokenizer=args.tokenizer,
                            vocab_size=args.vocab_size if args.tokenizer == "bpe" else None, cache_dir=args.cache_dir)
    except data.DataError as error:
        raise UserError(str(error)) from None


# -----------------------------------------------------------------------------
# The main job: pretrain (if needed), convert, finetune, evaluate both

def teacher_args(args):
    """The flags that pretrain the softmax teacher that --init pretrained expects."""
    teacher = copy.copy(args)
    teacher.attn, teacher.init, teacher.keep_softmax_every, teacher.freeze_feature_map = "softmax", "random", 0, False
    teacher.out_dir = os.path.dirname(args.pretrained)
    # Tables 3 and 4: pretraining has twice the updates, the warmup and the peak learning rate of finetuning
    teacher.max_steps, teacher.warmup_steps, teacher.lr = 2 * args.max_steps, 2 * args.warmup_steps, 2 * args.lr
    teacher.stop_at, teacher.eval_only = None, False
    teacher.resume = os.path.exists(args.pretrained)
    teacher.explicit = set()
    return teacher


def print_table(rows):
    print("\n| model | k | valid ppl | test ppl | train minutes |\n|---|---|---|---|---|")
    for name, k, r in rows:
        print(f"| {name} | {k or '-'} | {r['valid']['ppl']:.2f} | {r['test']['ppl']:.2f} | {r['train_minutes']:.1f} |")


def main():
    args = get_args()
    ddp = setup_distributed()
    if ddp.is_main:
        print_config("train_lm.py", serializable(vars(args)))
    if args.init == "pretrained" and not args.eval_only and not args.resume:
        teacher_results = None
        if not args.pretrained_given and not finished(args.pretrained):
            print(f"no finished pretrained checkpoint at {args.pretrained}: training the softmax model first")
            teacher_results = train(teacher_args(args), ddp)
        results = train(args, ddp)
        if ddp.is_main and results:
            if teacher_results is None:
                teacher_results = read_results(os.path.dirname(args.pretrained))
            rows = [("softmax (pretrained)", "-", teacher_results)] if teacher_results else []
            print_table(rows + [(results["attn"], results["k"], results)])
    else:
        train(args, ddp)
    if ddp.enabled:
        dist.destroy_process_group()


def finished(path: str) -> bool:
    if not os.path.isfile(path):
        return False
    checkpoint = load_checkpoint(path, "pretrained checkpoint")
    return checkpoint.get("step", 0) >= checkpoint.get("max_steps", 0)


def read_results(out_dir: str):
    path = os.path.join(out_dir, "results.json")
    if os.path.isfile(path):
        with open(path) as f:
            return json.load(f)
    return None


if __name__ == "__main__":
    run_main(main)
