"""
Train a translator, or convert a trained softmax translator's decoder into an RNN and finetune it (T2R, 3.2.2).

    python train_mt.py                              # train the softmax translator on the offline corpus (en-de)
    python train_mt.py --init pretrained            # the main job: train the softmax model if needed, swap its
                                                    # decoder to T2R (causal k=4, cross k=32), finetune, BLEU table
    python train_mt.py --attn t2r                   # T2R from random initialisation, for comparison
    python train_mt.py --resume --out_dir out/mt-libreoffice-en-de-t2r-pretrained   # continue exactly
    echo "Click OK." | python train_mt.py --translate - --out_dir out/mt-libreoffice-en-de-t2r-pretrained
    torchrun --nproc_per_node 2 train_mt.py ...     # data parallel (NCCL on GPUs, gloo on CPU)

The offline corpus is the LibreOffice help in English and German (mt_data.py). Decoding: beam search
(beam 5, length penalty 0.6) or greedy, batched; t2r/elu/rfa decode with recurrent states, softmax with a KV cache.
"""

import argparse
import contextlib
import glob
import json
import os
import sys
import time
from contextlib import nullcontext

import sacrebleu
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

import mt_data
from mt_data import BOS_ID, EOS_ID, PAD_ID
from t2r import ATTENTION_KINDS, Config, Seq2SeqTransformer, convert, fold, reorder_state
from training import (Parser, UserError, all_reduce_sum, autocast_context, explicit_flags, gather_rng, get_device,
                      get_lr_inverse_sqrt, load_checkpoint, make_optimizer, make_scaler, model_from_checkpoint,
                      optimizer_step, print_config, resolve_dtype, rng_state, run_main, save_checkpoint, serializable,
                      set_lr, set_rng_state, setup_distributed, take_saved_flags)

# Schedules of the CPU default. Appendix Tables 5 and 6: finetuning lowers the peak learning rate (5e-4 -> 2e-4)
# and the number of updates (30K -> 20K), with the same inverse square-root warmup.
SCHEDULES = {
    "random": dict(max_steps=1100, lr=1e-3),
    "pretrained": dict(max_steps=450, lr=4e-4),
}
MODEL_FLAGS = ("n_layer", "n_encoder_layer", "n_head", "d_model", "d_ff")
MODEL_DEFAULTS = dict(n_layer=3, n_encoder_layer=3, n_head=4, d_model=256, d_ff=1024)
# Flags that only steer this invocation; all others define a run, and --resume takes them from the run.
RUN_CONTROL = {"resume", "eval_only", "translate", "stop_at", "out_dir", "device", "dtype", "compile", "log_interval",
               "eval_interval", "decode_batch_size", "beam", "lenpen", "pretrained_given", "bleu_sentences"}


def get_args(argv=None):
    p = Parser(prog="train_mt.py", description="Train a translator, or convert its decoder to T2R and finetune.")
    g = p.add_argument_group("data")
    g.add_argument("--dataset", default="libreoffice", help="libreoffice (offline default), multi30k, or a folder with train/valid/test.<lang> files")
    g.add_argument("--data_dir", default=None, help="where the corpus is fetched and prepared (default data/mt/<dataset>)")
    g.add_argument("--src", default="en", help="source language (libreoffice: en or de)")
    g.add_argument("--tgt", default="de", help="target language")
    g.add_argument("--vocab_size", type=int, default=8000, help="joint BPE vocabulary size (source and target share it)")
    g.add_argument("--max_len", type=int, default=128, help="training pairs with a side longer than this (tokens) are skipped")
    g = p.add_argument_group("model (ignored with --init pretrained: the teacher's sizes are used)")
    g.add_argument("--n_layer", type=int, default=None, help="decoder layers (default 3)")
    g.add_argument("--n_encoder_layer", type=int, default=None, help="encoder layers (default 3; the encoder is always softmax)")
    g.add_argument("--n_head", type=int, default=None, help="attention heads r (default 4)")
    g.add_argument("--d_model", type=int, default=None, help="model width h (default 256)")
    g.add_argument("--d_ff", type=int, default=None, help="feed-forward width (default 1024)")
    g.add_argument("--dropout", type=float, default=0.1, help="dropout on embeddings, sublayers and the feed-forward layer (paper: 0.3)")
    g.add_argument("--attn", default=None, choices=ATTENTION_KINDS, help="the decoder's causal and cross attention (default softmax; t2r with --init pretrained)")
    g.add_argument("--feature_size", type=int, default=4, help="k of the decoder's causal attention (t2r, rfa; elu has k = d)")
    g.add_argument("--cross_feature_size", type=int, default=32, help="k of the cross attention")
    g.add_argument("--chunk_size", type=int, default=64, help="chunk length of the causal linear attention (0: quadratic form)")
    g = p.add_argument_group("initialisation")
    g.add_argument("--init", default="random", choices=["random", "pretrained"], help="random, or swap-then-finetune a softmax translator")
    g.add_argument("--pretrained", default=None, help="softmax translator to convert (default <its out_dir>/model.pt, trained first if missing)")
    g = p.add_argument_group("training")
    g.add_argument("--max_steps", type=int, default=None, help="optimizer steps (default 1100 random, 450 pretrained)")
    g.add_argument("--max_tokens", type=int, default=2048, help="tokens (padding included) per batch, source or target side")
    g.add_argument("--grad_accum", type=int, default=1, help="batches per optimizer step")
    g.add_argument("--lr", type=float, default=None, help="peak learning rate (default 1e-3 random, 4e-4 pretrained)")
    g.add_argument("--warmup_steps", type=int, default=None, help="inverse square-root warmup steps (default 1/8 of max_steps)")
    g.add_argument("--label_smoothing", type=float, default=0.1, help="label smoothing epsilon")
    g.add_argument("--weight_decay", type=float, default=0.0, help="AdamW weight decay on matrices (appendix Tables 5-6: 0)")
    g.add_argument("--grad_clip", type=float, default=1.0, help="clip the gradient norm (0: off)")
    g.add_argument("--average_last", type=int, default=5, help="the final model averages the last N snapshots (1: the last weights)")
    g.add_argument("--snapshot_interval", type=int, default=20, help="steps between the snapshots that --average_last averages")
    g.add_argument("--seed", type=int, default=1337, help="seed of the initialisation, dropout and batch order")
    g.add_argument("--stop_at", type=int, default=None, help="stop after this step with a checkpoint, as if interrupted (resume with --resume)")
    g = p.add_argument_group("evaluation and decoding")
    g.add_argument("--eval_interval", type=int, default=100, help="steps between validation losses and checkpoints")
    g.add_argument("--beam", type=int, default=5, help="beam size (1: greedy decoding)")
    g.add_argument("--lenpen", type=float, default=0.6, help="length penalty: hypotheses are ranked by log p / length^lenpen")
    g.add_argument("--max_len_a", type=float, default=1.5, help="a hypothesis has at most a * source length + b tokens")
    g.add_argument("--max_len_b", type=int, default=10, help="see --max_len_a")
    g.add_argument("--decode_batch_size", type=int, default=64, help="sentences decoded together")
    g.add_argument("--bleu_sentences", type=int, default=0, help="score only the first N valid/test sentences (0: all)")
    g = p.add_argument_group("system")
    g.add_argument("--out_dir", default=None, help="checkpoints and logs (default out/mt-<dataset>-<src>-<tgt>-<attn>-<init>)")
    g.add_argument("--resume", action="store_true", help="continue from <out_dir>/ckpt.pt")
    g.add_argument("--eval_only", action="store_true", help="BLEU of <out_dir>/model.pt on valid and test, then exit")
    g.add_argument("--translate", default=None, metavar="FILE", help="translate FILE (- for stdin) with <out_dir>/model.pt, one line per line")
    g.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:1, mps")
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"], help="autocast dtype (auto: bf16/fp16 on CUDA, fp32 on CPU)")
    g.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None, help="torch.compile the model (default: on for CUDA, off on CPU)")
    g.add_argument("--log_interval", type=int, default=50, help="steps between log lines")
    args = p.parse_args(argv)
    args.explicit = explicit_flags(p, argv)
    if args.resume or args.eval_only or args.translate:
        attn = args.attn or ("t2r" if args.init == "pretrained" else "softmax")
        take_saved_flags(args, args.out_dir or default_out_dir(args, attn, args.init), RUN_CONTROL)
    return resolve_defaults(args, p)


def default_out_dir(args, attn: str, init: str) -> str:
    name = os.path.basename(os.path.normpath(args.dataset))
    return os.path.join("out", f"mt-{name}-{args.src}-{args.tgt}-{attn}-{init}")


def resolve_defaults(args, parser):
    args.attn = args.attn or ("t2r" if args.init == "pretrained" else "softmax")
    if args.init == "pretrained" and args.attn == "softmax":
        parser.error("--init pretrained converts a softmax translator: choose --attn t2r, elu or rfa")
    schedule = SCHEDULES[args.init]
    args.max_steps = schedule["max_steps"] if args.max_steps is None else args.max_steps
    args.lr = schedule["lr"] if args.lr is None else args.lr
    args.warmup_steps = max(1, args.max_steps // 8) if args.warmup_steps is None else args.warmup_steps
    args.out_dir = args.out_dir or default_out_dir(args, args.attn, args.init)
    args.pretrained_given = "pretrained" in args.explicit
    args.pretrained = args.pretrained or os.path.join(default_out_dir(args, "softmax", "random"), "model.pt")
    for name in ("max_steps", "warmup_steps", "max_tokens", "grad_accum", "eval_interval", "beam",
                 "decode_batch_size", "average_last", "snapshot_interval", "max_len", "vocab_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.lr <= 0 or not 0 <= args.label_smoothing < 1:
        parser.error("--lr must be positive and --label_smoothing in [0, 1)")
    if args.max_tokens < args.max_len + 1:
        parser.error(f"--max_tokens {args.max_tokens} cannot hold one sentence of --max_len {args.max_len}")
    return args


def model_config(args, vocab_size: int) -> Config:
    sizes = {name: getattr(args, name) or MODEL_DEFAULTS[name] for name in MODEL_FLAGS}
    return Config(vocab_size=vocab_size, **sizes, dropout=args.dropout, attn=args.attn, feature_size=args.feature_size,
                  cross_attn=args.attn, cross_feature_size=args.cross_feature_size, chunk_size=args.chunk_size,
                  pad_id=PAD_ID, tie_embeddings=True)


# -----------------------------------------------------------------------------
# Decoding. Every function takes src (B, S), padded with PAD_ID, and returns token lists without </s>.

def max_lengths(src, max_len_a: float, max_len_b: int) -> torch.Tensor:
    """(B,) the longest hypothesis of each sentence, </s> included."""
    return ((src != PAD_ID).sum(1).float() * max_len_a).long() + max_len_b


@torch.no_grad()
def greedy_decode(model, src, max_len_a=1.5, max_len_b=10) -> list:
    """Argmax decoding with the recurrent form: one step per token; the cross-attention state is
    computed once per sentence by init_state (the encoder runs once)."""
    limits = max_lengths(src, max_len_a, max_len_b)
    state = model.init_state(src)
    tokens = torch.full((src.shape[0],), BOS_ID, dtype=torch.long, device=src.device)
    out, done = [], torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
    for t in range(int(limits.max())):
        logits, state = model.step(tokens, state)
        tokens = never_emit(logits).argmax(-1)
        tokens = torch.where(t + 1 >= limits, torch.full_like(tokens, EOS_ID), tokens)  # force </s> at the limit
        tokens = torch.where(done, torch.full_like(tokens, PAD_ID), tokens)
        out.append(tokens)
        done |= tokens == EOS_ID
        if done.all():
            break
    return [strip(row) for row in torch.stack(out, 1).tolist()]


@torch.no_grad()
def greedy_decode_recompute(model, src, max_len_a=1.5, max_len_b=10) -> list:
    """The same decisions by brute force: the whole prefix goes through the parallel form at every step."""
    limits = max_lengths(src, max_len_a, max_len_b)
    prefix = torch.full((src.shape[0], 1), BOS_ID, dtype=torch.long, device=src.device)
    done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
    for t in range(int(limits.max())):
        tokens = never_emit(model(src, prefix)[:, -1]).argmax(-1)
        tokens = torch.where(t + 1 >= limits, torch.full_like(tokens, EOS_ID), tokens)
        tokens = torch.where(done, torch.full_like(tokens, PAD_ID), tokens)
        prefix = torch.cat([prefix, tokens[:, None]], 1)
        done |= tokens == EOS_ID
        if done.all():
            break
    return [strip(row) for row in prefix[:, 1:].tolist()]


def never_emit(logits):
    """<pad> and <s> are never outputs: the softmax still spreads mass on them, decoding must not pick them."""
    logits[:, [PAD_ID, BOS_ID]] = float("-inf")
    return logits


def strip(ids: list) -> list:
    return ids[: ids.index(EOS_ID)] if EOS_ID in ids else [i for i in ids if i != PAD_ID]


@torch.no_grad()
def beam_search(model, src, beam_size=5, lenpen=0.6, max_len_a=1.5, max_len_b=10) -> list:
    """Batched beam search on recurrent states. Returns per sentence the best finished hypothesis as
    (tokens, log p(tokens + </s>), log p / (len + 1)^lenpen), the last being what beams are ranked by.

    Each sentence keeps beam_size live hypotheses as rows b * K + j of the state. At each step the 2K best
    extensions are taken; those ending in </s> among the top K are finished, the first K others live on, and
    the self-attention states are reordered to follow their parents."""
    B, K = src.shape[0], beam_size
    limits = max_lengths(src, max_len_a, max_len_b).tolist()
    state = model.init_state(src)  # the encoder and the cross-attention states: once per sentence
    state = reorder_state(state, torch.arange(B, device=src.device).repeat_interleave(K))  # (B * K) rows
    tokens = torch.full((B * K, 1), BOS_ID, dtype=torch.long, device=src.device)
    scores = None  # (B, K) log p of each live hypothesis, in float32 (float64 for a float64 model)
    finished = [[] for _ in range(B)]
    for t in range(max(limits)):
        logits, state = model.step(tokens[:, -1], state)
        logp = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)  # (B * K, V)
        if scores is None:
            scores = torch.zeros(B, K, dtype=logp.dtype, device=src.device)
            scores[:, 1:] = float("-inf")  # all K beams start identical: expand only the first at step 0
        never_emit(logp)
        at_limit = torch.tensor([t + 1 >= limit for limit in limits], device=src.device).repeat_interleave(K)
        logp[at_limit] = torch.where(torch.arange(logp.shape[1], device=src.device) == EOS_ID, logp[at_limit],
                                     float("-inf"))
        V = logp.shape[1]
        candidates = (scores.view(B * K, 1) + logp).view(B, K * V)
        top_scores, top = candidates.topk(2 * K, dim=1)  # (B, 2K): at most K of them end in </s>
        top_scores_l, top_l = top_scores.tolist(), top.tolist()
        parents, next_tokens, next_scores = [], [], []
        for b in range(B):
            keep = []
            for j, (score, flat) in enumerate(zip(top_scores_l[b], top_l[b])):
                beam, token = divmod(flat, V)
                if token == EOS_ID:
                    if j < K and len(finished[b]) < K and score > float("-inf"):
                        hypothesis = tokens[b * K + beam, 1:].tolist()
                        finished[b].append((hypothesis, score, score / (len(hypothesis) + 1) ** lenpen))
                elif len(keep) < K:
                    keep.append((b * K + beam, token, score))
            parents += [p for p, _, _ in keep]
            next_tokens += [tok for _, tok, _ in keep]
            next_scores += [s if len(finished[b]) < K else float("-inf") for _, _, s in keep]
        if all(len(f) >= K for f in finished):
            break
        index = torch.tensor(parents, device=src.device)
        # Beams never move between sentences, so the cross-attention states (the same for every beam of a
        # sentence) stay put; only the causal self-attention states follow their parents.
        for layer in state["layers"]:
            layer["self"] = reorder_state(layer["self"], index)
        tokens = torch.cat([tokens[index], torch.tensor(next_tokens, device=src.device)[:, None]], 1)
        scores = torch.tensor(next_scores, dtype=logp.dtype, device=src.device).view(B, K)
    return [max(f, key=lambda h: h[2]) for f in finished]


@torch.no_grad()
def sequence_log_probs(model, src, hypotheses: list) -> list:
    """log p(hypothesis + </s> | source) of each hypothesis, by one parallel (teacher-forced) pass."""
    tgt = mt_data.pad([h + [EOS_ID] for h in hypotheses]).to(src.device)
    tgt_in = torch.cat([torch.full_like(tgt[:, :1], BOS_ID), tgt[:, :-1]], 1)
    logits = model(src, tgt_in)
    logp = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)
    logp = logp.gather(-1, tgt[..., None])[..., 0]
    return (logp * (tgt != PAD_ID)).sum(1).tolist()


def translate_sentences(model, tokenizer, sentences: list, args, device, progress: bool = False) -> list:
    """Detokenized translations of sentences, in order. Empty lines give empty translations."""
    model.eval()
    todo = [i for i, s in enumerate(sentences) if s.strip()]
    ids = mt_data.encode(tokenizer, [sentences[i] for i in todo])
    order = sorted(range(len(todo)), key=lambda i: len(ids[i]))  # similar lengths together: less padding
    out = [""] * len(sentences)
    starts = range(0, len(order), args.decode_batch_size)
    for start in tqdm(starts, desc="translate", disable=not progress, dynamic_ncols=True, mininterval=2):
        chunk = order[start: start + args.decode_batch_size]
        src = mt_data.pad([ids[i] for i in chunk]).to(device)
        if args.beam == 1:
            hyps = greedy_decode(model, src, args.max_len_a, args.max_len_b)
        else:
            hyps = [h[0] for h in beam_search(model, src, args.beam, args.lenpen, args.max_len_a, args.max_len_b)]
        for i, hyp in zip(chunk, hyps):
            out[todo[i]] = mt_data.decode(tokenizer, hyp)
    return out


@torch.no_grad()
def greedy_speed(model, tokenizer, sentences: list, device, batch_size: int = 16, max_len_a=1.5, max_len_b=10) -> dict:
    """Greedy decoding speed, the setting of the paper's Fig. 2 (batch 16, beam 1) on real sentences:
    generated tokens (</s> included, padding not) per second of decoding, encoder included.
    Sentences go in order of length, as translate_sentences batches them."""
    model.eval()
    ids = sorted(mt_data.encode(tokenizer, [s for s in sentences if s.strip()]), key=len)
    if ids:  # warm-up, untimed: the first call pays one-time costs (allocator, CUDA kernels)
        greedy_decode(model, mt_data.pad(ids[:batch_size]).to(device), max_len_a, max_len_b)
    tokens, seconds = 0, 0.0
    for start in range(0, len(ids), batch_size):
        src = mt_data.pad(ids[start: start + batch_size]).to(device)
        synchronize(device)
        t0 = time.perf_counter()
        hyps = greedy_decode(model, src, max_len_a, max_len_b)
        synchronize(device)
        seconds += time.perf_counter() - t0
        tokens += sum(len(h) + 1 for h in hyps)  # + </s>
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds if seconds else float("nan"),
            "sentences": len(ids), "batch_size": batch_size}


def synchronize(device):
    """Wait for queued GPU work, so that a clock read after it measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


# -----------------------------------------------------------------------------
# BLEU: detokenized (SacreBLEU, 13a) and tokenized (Moses-tokenized with compound splitting, multi-bleu style,
# what the paper and Vaswani et al. report for WMT14 EN-DE)

def bleu_scores(hypotheses: list, references: list, lang: str) -> dict:
    detok = sacrebleu.metrics.BLEU()
    tokenize = moses_tokenizer(lang)
    tokenized = sacrebleu.metrics.BLEU(tokenize="none", force=True)
    return {"bleu": round(detok.corpus_score(hypotheses, [references]).score, 2),
            "tok_bleu": round(tokenized.corpus_score([tokenize(h) for h in hypotheses],
                                                     [[tokenize(r) for r in references]]).score, 2),
            "signature": str(detok.get_signature())}


def moses_tokenizer(lang: str):
    try:
        from sacremoses import MosesTokenizer
    except ImportError:
        raise UserError("tokenized BLEU needs sacremoses: python -m pip install sacremoses") from None
    moses = MosesTokenizer(lang=lang)

    def tokenize(text: str) -> str:
        # compound splitting as in tensor2tensor's get_ende_bleu.sh: "Text-Feld" -> "Text ##AT##-##AT## Feld"
        return " ".join(moses.tokenize(text, escape=False, aggressive_dash_splits=True)).replace(
            " @-@ ", " ##AT##-##AT## ")
    return tokenize


def evaluate_bleu(model, tokenizer, corpus: dict, args, device, splits=("valid", "test")) -> dict:
    results = {}
    for split in splits:
        pairs = corpus[split][: args.bleu_sentences or None]
        t0 = time.time()
        hyps = translate_sentences(model, tokenizer, [s for s, _ in pairs], args, device, progress=True)
        results[split] = bleu_scores(hyps, [t for _, t in pairs], args.tgt)
        results[split]["decode_seconds"] = round(time.time() - t0, 1)
        results[split]["sentences"] = len(pairs)
        print(f"{split}: BLEU {results[split]['bleu']:.2f} (detokenized, sacrebleu 13a), tokenized BLEU "
              f"{results[split]['tok_bleu']:.2f}; {len(pairs)} sentences, beam {args.beam}, "
              f"{results[split]['decode_seconds']:.0f} s")
    return results


# -----------------------------------------------------------------------------
# Data: the corpus, the joint BPE (stored in every checkpoint) and the batches

def load_corpus(args) -> dict:
    try:
        return mt_data.load_parallel(args.dataset, args.src, args.tgt, args.data_dir)
    except mt_data.DataError as error:
        raise UserError(str(error)) from None


def load_data(args, tokenizer_text: str | None):
    """The corpus, the tokenizer (trained on the training pairs for a new model, else the checkpoint's),
    and the encoded training and validation pairs."""
    corpus = load_corpus(args)
    if tokenizer_text is None:
        print(f"training a joint BPE of {args.vocab_size} tokens on {len(corpus['train']):,} training pairs")
        tokenizer = mt_data.train_joint_bpe(corpus["train"], args.vocab_size)
    else:
        tokenizer = mt_data.load_tokenizer(tokenizer_text)
    train = mt_data.encode_pairs(tokenizer, corpus["train"])
    kept = [ex for ex in train if max(len(ex[0]), len(ex[1])) <= args.max_len]
    print(f"pairs: train {len(corpus['train']):,} ({len(train) - len(kept)} longer than {args.max_len} tokens "
          f"skipped), valid {len(corpus['valid']):,}, test {len(corpus['test']):,}")
    if not kept:
        raise UserError(f"no training pair fits --max_len {args.max_len}: raise it")
    return corpus, tokenizer, kept, mt_data.encode_pairs(tokenizer, corpus["valid"])


def batch_at(batches: list, counter: int, seed: int) -> list:
    """The counter-th batch of training: epoch counter // n in an order shuffled per epoch. A function of the
    counter alone, so a resumed run (or another process under DDP) sees exactly the batches it should."""
    epoch, index = divmod(counter, len(batches))
    order = torch.randperm(len(batches), generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    return batches[order[index]]


def loss_fn(model, src, tgt_in, tgt_out, label_smoothing: float):
    logits = model(src, tgt_in)
    return F.cross_entropy(logits.float().flatten(0, 1), tgt_out.flatten(), ignore_index=PAD_ID,
                           label_smoothing=label_smoothing)


@torch.no_grad()
def validation_loss(model, examples, batches, device, dtype, ddp) -> float:
    """Mean negative log-likelihood per target token (no label smoothing) of the validation pairs."""
    model.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=device)
    for indices in batches[ddp.rank:: ddp.world_size]:
        src, tgt_in, tgt_out = (t.to(device) for t in mt_data.collate(examples, indices))
        with autocast_context(device, dtype):
            logits = model(src, tgt_in)
        totals[0] += F.cross_entropy(logits.float().flatten(0, 1), tgt_out.flatten(), ignore_index=PAD_ID,
                                     reduction="sum")
        totals[1] += (tgt_out != PAD_ID).sum()
    model.train()
    totals = all_reduce_sum(totals, ddp)
    return (totals[0] / totals[1]).item()


# -----------------------------------------------------------------------------
# Building the model: from scratch, from a trained softmax translator, or from a resumed run

def load_teacher(args):
    checkpoint = load_checkpoint(args.pretrained, "pretrained translator")
    config = checkpoint["config"]
    if not config.get("n_encoder_layer") or "tokenizer" not in checkpoint:
        raise UserError(f"{args.pretrained} is a language model, not a translator: pass a model.pt of train_mt.py")
    kinds = set(Config(**config).layer_kinds()) | {config["cross_attn"]}
    if kinds != {"softmax"}:
        raise UserError(f"{args.pretrained} is already converted (attention {sorted(kinds)}): "
                        f"--init pretrained needs a softmax translator")
    for name in MODEL_FLAGS:
        if getattr(args, name) is not None and getattr(args, name) != config[name]:
            raise UserError(f"--{name} {getattr(args, name)} differs from the pretrained model's {config[name]}: "
                            f"drop the flag (the teacher's sizes are used)")
    saved = checkpoint.get("args", {})
    if (saved.get("src"), saved.get("tgt")) not in ((args.src, args.tgt), (None, None)):
        raise UserError(f"{args.pretrained} translates {saved['src']}-{saved['tgt']}, not {args.src}-{args.tgt}: "
                        f"pass --src {saved['src']} --tgt {saved['tgt']} or another --pretrained")
    return model_from_checkpoint(checkpoint, args.pretrained), checkpoint["tokenizer"]


def convert_teacher(teacher, args):
    # finetuning's regularisation and chunking are flags; the student is built from this config
    teacher.config.dropout, teacher.config.chunk_size = args.dropout, args.chunk_size
    model = convert(teacher, args.attn, args.feature_size, cross_feature_size=args.cross_feature_size)
    print(f"converted {args.pretrained}: decoder causal attention {args.attn} k={feature_sizes(model)[0]}, "
          f"cross attention k={feature_sizes(model)[1]}, encoder untouched; new parameters: feature maps only")
    return model


def feature_sizes(model) -> tuple:
    """(k of the causal attention, k of the cross attention) as reported in the tables; elu has k = d."""
    c = model.config
    d = c.d_model // c.n_head
    causal = None if c.layer_kinds()[0] == "softmax" else (d if c.layer_kinds()[0] == "elu" else c.feature_size)
    cross = None if c.cross_attn == "softmax" else (d if c.cross_attn == "elu" else c.cross_feature_size)
    return causal, cross


def build(args, vocab_size: int):
    try:
        return Seq2SeqTransformer(model_config(args, vocab_size))
    except ValueError as error:  # a Config that cannot be, e.g. --d_model not divisible by --n_head
        raise UserError(f"bad model flags: {error}") from None


def has_t2r(model) -> bool:
    return "t2r" in set(model.config.layer_kinds()) | {model.config.cross_attn}


def inference_model(model):
    """T2R is folded for decoding (Eq. 8): the feature map merges into W_q and W_k; the outputs are the same."""
    return fold(model) if has_t2r(model) else model.eval()


# -----------------------------------------------------------------------------
# Snapshots and checkpoint averaging (the paper averages the last five epochs)

def snapshot_paths(out_dir: str) -> list:
    return sorted(glob.glob(os.path.join(out_dir, "snapshot_*.pt")))


def save_snapshot(model, out_dir: str, step: int, keep: int):
    save_checkpoint(os.path.join(out_dir, f"snapshot_{step:07d}.pt"), {"model": model.state_dict(), "step": step})
    for old in snapshot_paths(out_dir)[:-keep]:
        os.remove(old)


def average_snapshots(paths: list) -> dict:
    """The element-wise mean of the snapshots' parameters (in float64, then cast back)."""
    states = [torch.load(p, map_location="cpu", weights_only=True)["model"] for p in paths]
    return {name: (sum(s[name].double() for s in states) / len(states)).to(tensor.dtype)
            if tensor.is_floating_point() else tensor for name, tensor in states[-1].items()}


# -----------------------------------------------------------------------------
# Training

def train(args, ddp) -> dict:
    device = get_device(args.device if not ddp.enabled or args.device != "auto" else
                        (f"cuda:{ddp.local_rank}" if torch.cuda.is_available() else "cpu"))
    dtype = resolve_dtype(args.dtype, device)
    compile_model = args.compile if args.compile is not None else device.type == "cuda"
    ckpt_path = os.path.join(args.out_dir, "ckpt.pt")
    torch.manual_seed(args.seed)  # the same initialisation on every process

    checkpoint, model, tokenizer_text = None, None, None
    if args.resume:
        checkpoint = load_checkpoint(ckpt_path)
        model, tokenizer_text = model_from_checkpoint(checkpoint, ckpt_path), checkpoint.get("tokenizer")
        if tokenizer_text is None:
            raise UserError(f"{ckpt_path} has no tokenizer: it is a language-model checkpoint, not a translator")
    elif os.path.exists(ckpt_path):
        raise UserError(f"{ckpt_path} exists: pass --resume to continue it, --eval_only to score it, "
                        f"or choose another --out_dir")
    elif args.init == "pretrained":
        teacher, tokenizer_text = load_teacher(args)
        model = convert_teacher(teacher, args)
    corpus, tokenizer, train_examples, valid_examples = load_data(args, tokenizer_text)
    if model is None:
        model = build(args, tokenizer.get_vocab_size())
    train_batches = mt_data.make_batches(train_examples, args.max_tokens)
    valid_batches = mt_data.make_batches(valid_examples, args.max_tokens)
    model.to(device)
    optimizer = make_optimizer(model, args.lr, args.weight_decay, device)
    scaler = make_scaler(device, dtype)
    step, best_val, train_seconds = 0, float("inf"), 0.0
    if args.resume:
        optimizer.load_state_dict(checkpoint["optimizer"])
        scaler.load_state_dict(checkpoint["scaler"])
        step, best_val, train_seconds = checkpoint["step"], checkpoint["best_val"], checkpoint["train_seconds"]
        # the batch order is a function of the step (batch_at); only the dropout RNG needs restoring
        set_rng_state(checkpoint["rng"][min(ddp.rank, len(checkpoint["rng"]) - 1)])
        print(f"resumed {ckpt_path} at step {step} (best validation loss {best_val:.4f})")

    if ddp.is_main:
        os.makedirs(args.out_dir, exist_ok=True)
        print_config("model", model.config.to_dict())
        print(f"parameters: {model.num_params():,}; {len(train_batches)} batches of <= {args.max_tokens} tokens")
        with open(os.path.join(args.out_dir, "args.json"), "w") as f:
            json.dump(serializable(vars(args)), f, indent=1)
    raw_model = model
    if compile_model:
        model = torch.compile(model)
    if ddp.enabled:
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    def save():
        rng = gather_rng(rng_state(), ddp)
        if ddp.is_main:
            save_checkpoint(ckpt_path, {
                "model": raw_model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
                "config": raw_model.config.to_dict(), "args": serializable(vars(args)), "step": step,
                "max_steps": args.max_steps, "best_val": best_val, "rng": rng, "train_seconds": train_seconds,
                "tokenizer": tokenizer.to_str()})

    bar = tqdm(total=args.max_steps, initial=step, desc=os.path.basename(args.out_dir), disable=not ddp.is_main,
               dynamic_ncols=True, mininterval=2)
    model.train()
    t_last, loss_sum, loss_count, tokens_seen = time.time(), 0.0, 0, 0
    while step < args.max_steps:
        if args.stop_at is not None and step >= args.stop_at:
            break
        t_step = time.time()
        lr = get_lr_inverse_sqrt(step, args.lr, args.warmup_steps)
        set_lr(optimizer, lr)
        for micro in range(args.grad_accum):
            counter = (step * args.grad_accum + micro) * ddp.world_size + ddp.rank
            src, tgt_in, tgt_out = mt_data.collate(train_examples, batch_at(train_batches, counter, args.seed))
            src, tgt_in, tgt_out = src.to(device), tgt_in.to(device), tgt_out.to(device)
            tokens_seen += int((tgt_out != PAD_ID).sum()) * ddp.world_size
            sync = not ddp.enabled or micro == args.grad_accum - 1
            with (nullcontext() if sync else model.no_sync()), autocast_context(device, dtype):
                loss = loss_fn(model, src, tgt_in, tgt_out, args.label_smoothing) / args.grad_accum
            scaler.scale(loss).backward()
            loss_sum += loss.detach()
        loss_count += 1
        optimizer_step(raw_model, optimizer, scaler, args.grad_clip)
        step += 1
        train_seconds += time.time() - t_step
        bar.update(1)
        if ddp.is_main and (step % args.snapshot_interval == 0 or step == args.max_steps):
            save_snapshot(raw_model, args.out_dir, step, args.average_last)

        if step % args.log_interval == 0 or step == args.max_steps:
            elapsed, t_last = time.time() - t_last, time.time()
            mean_loss = float(loss_sum) / loss_count
            bar.set_postfix(loss=f"{mean_loss:.3f}", lr=f"{lr:.1e}", tok_s=f"{tokens_seen / elapsed:,.0f}")
            if ddp.is_main:
                tqdm.write(f"step {step}/{args.max_steps} | loss {mean_loss:.4f} | lr {lr:.2e} | "
                           f"{tokens_seen / elapsed:,.0f} target tok/s | {train_seconds / 60:.1f} min")
            loss_sum, loss_count, tokens_seen = 0.0, 0, 0
        if step % args.eval_interval == 0 or step == args.max_steps:
            t_eval = time.time()
            val_loss = validation_loss(raw_model, valid_examples, valid_batches, device, dtype, ddp)
            best_val = min(best_val, val_loss)
            if ddp.is_main:
                tqdm.write(f"step {step}: validation loss {val_loss:.4f} (ppl {torch.tensor(val_loss).exp():.2f}), "
                           f"best {best_val:.4f}")
            train_seconds += time.time() - t_eval
            save()
            t_last = time.time()
    bar.close()
    save()
    if step < args.max_steps:
        print(f"stopped at step {step} of {args.max_steps}: continue with --resume --out_dir {args.out_dir}")
        return {}
    if not ddp.is_main:
        return {}
    final = write_final_model(raw_model, tokenizer, args, step, train_seconds)
    return report(final, tokenizer, corpus, args, device, train_seconds)


def write_final_model(model, tokenizer, args, step: int, train_seconds: float):
    """model.pt: the average of the last --average_last snapshots, with its config and tokenizer."""
    paths = snapshot_paths(args.out_dir)[-args.average_last:]
    final = Seq2SeqTransformer(model.config)
    final.load_state_dict(average_snapshots(paths))
    steps = [int(os.path.basename(p)[9:16]) for p in paths]
    print(f"model.pt: the average of the snapshots at steps {steps}")
    save_checkpoint(os.path.join(args.out_dir, "model.pt"), {
        "model": final.state_dict(), "config": model.config.to_dict(), "tokenizer": tokenizer.to_str(),
        "args": serializable(vars(args)), "step": step, "max_steps": args.max_steps, "averaged_steps": steps,
        "train_seconds": train_seconds})
    return final.to(next(model.parameters()).device)


def report(model, tokenizer, corpus, args, device, train_seconds: float) -> dict:
    results = evaluate_bleu(inference_model(model), tokenizer, corpus, args, device)
    k_causal, k_cross = feature_sizes(model)
    results.update(attn=args.attn if args.init == "random" else f"{args.attn}+pretrain", k_causal=k_causal,
                   k_cross=k_cross, train_minutes=round(train_seconds / 60, 2), beam=args.beam, lenpen=args.lenpen)
    with open(os.path.join(args.out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    return results


# -----------------------------------------------------------------------------
# Using a trained translator: BLEU of model.pt, or translate a file / stdin

def load_final_model(args):
    path = os.path.join(args.out_dir, "model.pt")
    if not os.path.isfile(path):
        raise UserError(f"no finished translator at {path}: finish training first "
                        f"(python train_mt.py --resume --out_dir {args.out_dir})")
    checkpoint = load_checkpoint(path, "translator")
    if "tokenizer" not in checkpoint or not checkpoint["config"].get("n_encoder_layer"):
        raise UserError(f"{path} is not a translator checkpoint (no tokenizer or encoder in it)")
    try:
        tokenizer = mt_data.load_tokenizer(checkpoint["tokenizer"])
    except Exception as error:  # DataError (no specials), or JSON the tokenizers library rejects
        raise UserError(f"{path} holds an unreadable tokenizer ({error}): retrain it") from None
    return model_from_checkpoint(checkpoint, path), tokenizer, checkpoint


def translate_file(args):
    """Translations on stdout, one line per input line, and nothing else there (so `> out.txt` is clean)."""
    model, tokenizer, _ = load_final_model(args)
    if args.translate == "-":
        lines = sys.stdin.read().splitlines()
    elif os.path.isfile(args.translate):
        with open(args.translate, encoding="utf-8") as f:
            lines = f.read().splitlines()
    else:
        raise UserError(f"--translate {args.translate}: no such file (use - for stdin)")
    with contextlib.redirect_stdout(sys.stderr):
        device = get_device(args.device)
    model = inference_model(model.to(device))
    for line in translate_sentences(model, tokenizer, lines, args, device, progress=len(lines) > 100):
        print(line)


def eval_only(args):
    device = get_device(args.device)
    model, tokenizer, checkpoint = load_final_model(args)
    corpus = load_corpus(args)
    return report(model.to(device), tokenizer, corpus, args, device, checkpoint.get("train_seconds", 0.0))


# -----------------------------------------------------------------------------
# The main job: train the softmax translator (if needed), convert its decoder, finetune, compare

def teacher_args(args):
    """The flags that train the softmax translator that --init pretrained expects."""
    teacher = argparse.Namespace(**vars(args))
    teacher.attn, teacher.init, teacher.out_dir = "softmax", "random", os.path.dirname(args.pretrained)
    ratio = SCHEDULES["random"]["max_steps"] / SCHEDULES["pretrained"]["max_steps"]
    teacher.max_steps = round(args.max_steps * ratio)
    teacher.warmup_steps = round(args.warmup_steps * ratio)
    teacher.lr = args.lr * SCHEDULES["random"]["lr"] / SCHEDULES["pretrained"]["lr"]
    teacher.stop_at = None
    teacher.resume = os.path.exists(os.path.join(teacher.out_dir, "ckpt.pt"))
    teacher.explicit = set()
    return teacher


def print_table(rows):
    print("\n| model | k cross | k causal | valid BLEU | test BLEU | test tok. BLEU | train minutes |\n"
          "|---|---|---|---|---|---|---|")
    for name, r in rows:
        print(f"| {name} | {r['k_cross'] or '-'} | {r['k_causal'] or '-'} | {r['valid']['bleu']:.2f} | "
              f"{r['test']['bleu']:.2f} | {r['test']['tok_bleu']:.2f} | {r['train_minutes']:.1f} |")


def read_results(out_dir: str):
    path = os.path.join(out_dir, "results.json")
    if os.path.isfile(path):
        with open(path) as f:
            return json.load(f)
    return None


def main():
    args = get_args()
    if args.translate:
        return translate_file(args)
    print_config("train_mt.py", serializable(vars(args)))
    if args.eval_only:
        return eval_only(args)
    ddp = setup_distributed()
    if args.init == "pretrained" and not args.resume:
        teacher_results = None
        if not args.pretrained_given and not os.path.isfile(args.pretrained):
            print(f"no trained softmax translator at {args.pretrained}: training it first")
            teacher_results = train(teacher_args(args), ddp)
        results = train(args, ddp)
        if ddp.is_main and results:
            teacher_results = teacher_results or read_results(os.path.dirname(args.pretrained))
            rows = [("softmax (pretrained)", teacher_results)] if teacher_results else []
            print_table(rows + [(results["attn"], results)])
    else:
        train(args, ddp)
    if ddp.enabled:
        dist.destroy_process_group()


if __name__ == "__main__":
    run_main(main)
