"""
The study's translation speed probe (Table 2's tokens/s column; the setting of the paper's Fig. 2): greedy
decoding, batch 16, on the test sentences of a finished train_mt.py run. experiments/study.py calls
measure() once per translator and keeps the result in the run's speed.json.
"""

import json
import os
import time

import torch

import mt_data
from runtime import UserError
from translate import greedy_decode, inference_model, load_translator


def synchronize(device):
    """Wait for queued GPU work, so that a clock read after it measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def greedy_speed(model, tokenizer, sentences: list, device, batch_size: int = 16, max_len_a=1.5, max_len_b=10) -> dict:
    """Greedy decoding speed on real sentences: generated tokens (</s> included, padding not) per second of
    decoding, encoder included. Sentences go in order of length, as translate.py batches them."""
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


def measure(out_dir: str, device, batch_size: int, passes: int) -> dict:
    """The median of `passes` passes over the run's test sentences (one pass of ~15 s on a CPU varies by
    several percent), with every pass's tokens/s. The data and length limits are the run's own (args.json)."""
    with open(os.path.join(out_dir, "args.json")) as f:
        args = json.load(f)
    model, tokenizer, _ = load_translator(os.path.join(out_dir, "model.pt"))
    try:
        corpus = mt_data.load_parallel(args["dataset"], args["src"], args["tgt"], args["data_dir"])
    except mt_data.DataError as error:
        raise UserError(str(error)) from None
    sentences = [s for s, _ in corpus["test"][: args["bleu_sentences"] or None]]
    model = inference_model(model.to(device))
    runs = [greedy_speed(model, tokenizer, sentences, device, batch_size, args["max_len_a"], args["max_len_b"])
            for _ in range(passes)]
    median = sorted(runs, key=lambda p: p["tokens_per_s"])[len(runs) // 2]
    return {**median, "tokens_per_s_passes": [p["tokens_per_s"] for p in runs]}
