"""
What a fixed-size state forgets: a span of validation text shown once, then repeated D tokens later. A model that
remembers the span continues the repeat exactly; one whose state has lost it can only guess as on first reading.

    python -m experiments.recall --ckpt out/ptb-softmax-random/model.pt --ckpt out/conversion/lm-t2r/model.pt
    python -m experiments.recall --ckpt ... --distances 8,32,128,512,2048 --span 16 --out results/recall.csv

For each distance D and each of --samples places in the validation split: x = span, the D tokens that follow it
in the text, the span again. Accuracy: how often the model's top prediction is the next token of the span, over
its repeat (the first token of the repeat excluded: nothing announces it) and, as the floor, over its first
reading. A KV cache keeps the span at any D; a T2R state (S, z) must fold it into k x d numbers per head;
SRU++'s c must carry it unless an attention layer looks it up. Every model reads the same sequences. Past the
length a model was trained on (the study: 512 tokens), its positions are new to it too, for the teacher as well.
"""

import argparse
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import numpy as np
import torch

from generate import load_tokenizer
from support.runtime import (Parser, UserError, device_name, get_device, load_checkpoint, model_from_checkpoint,
                             positive_int, run_main, seed, write_csv)

COLUMNS = ["model", "distance", "span", "samples", "repeat_accuracy", "first_accuracy"]


def probes(ids: torch.Tensor, distance: int, span: int, samples: int, seed: int) -> torch.Tensor:
    """(samples, 2 span + distance) token ids: a span, the text after it, the span again."""
    room = len(ids) - span - distance
    if room < samples:
        raise UserError(f"the validation split has {len(ids)} tokens: too few for {samples} probes of "
                        f"{2 * span + distance} tokens; lower --samples or the largest of --distances")
    starts = torch.randperm(room, generator=torch.Generator().manual_seed(seed))[:samples]
    text = torch.stack([ids[s: s + span + distance] for s in starts.tolist()])  # span, then what follows it
    return torch.cat([text, text[:, :span]], dim=1)


@torch.no_grad()
def accuracies(model, x: torch.Tensor, span: int, batch_size: int) -> tuple:
    """(on the repeat, on the first reading): top-1 accuracy of the span's tokens 2..span."""
    hits = torch.zeros(2)
    for batch in x.split(batch_size):
        predicted = model(batch[:, :-1]).argmax(-1)  # (B, T - 1): predicted[:, t] guesses batch[:, t + 1]
        first = predicted[:, : span - 1] == batch[:, 1: span]
        repeat = predicted[:, -(span - 1):] == batch[:, -(span - 1):]
        hits += torch.tensor([repeat.sum().item(), first.sum().item()], dtype=torch.float)
    return tuple((hits / (len(x) * (span - 1))).tolist())


def name_of(path: str, checkpoint: dict) -> str:
    """The run's row name (t2r+pretrain, sru++, ...) from its results.json, else its path."""
    results = os.path.join(os.path.dirname(path), "results.json")
    if os.path.isfile(results):
        with open(results) as f:
            return json.load(f).get("attn", path)
    return path


def main(argv=None):
    p = Parser(prog="python -m experiments.recall", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", action="append", required=True, help="a language model's model.pt (repeat the flag)")
    p.add_argument("--distances", default="8,32,128,512,2048", help="tokens between the span and its repeat")
    p.add_argument("--span", type=positive_int, default=16, help="tokens in the span (at least 2)")
    p.add_argument("--samples", type=positive_int, default=64, help="places in the validation text (for every model)")
    p.add_argument("--batch_size", type=positive_int, default=8, help="probes per forward pass")
    p.add_argument("--seed", type=seed, default=0, help="which places")
    p.add_argument("--out", default="out/recall.csv", help="the CSV written (one row per model and distance)")
    p.add_argument("--device", type=device_name, default="auto", help="auto, cpu, cuda")
    args = p.parse_args(argv)
    try:
        distances = sorted({int(d) for d in args.distances.split(",")})
    except ValueError:
        p.error(f"--distances: expected comma-separated integers, got {args.distances!r}")
    if min(distances) < 0 or args.span < 2:
        p.error("--distances must be >= 0 and --span >= 2")
    checkpoints = [(path, load_checkpoint(path)) for path in args.ckpt]  # every file readable before any work
    tokenizers = {checkpoint.get("identity", {}).get("tokenizer") for _, checkpoint in checkpoints}
    for path, checkpoint in checkpoints:
        if checkpoint["config"].get("n_encoder_layer"):
            raise UserError(f"{path} is a translation model: the probe reads language models")
    if len(tokenizers) > 1:
        raise UserError("the checkpoints were trained with different tokenizers: probe models of one corpus together")
    device = get_device(args.device)
    ids = torch.from_numpy(np.asarray(load_tokenizer(checkpoints[0][1]).valid, dtype=np.int64))
    rows = []
    for path, checkpoint in checkpoints:
        model, name = model_from_checkpoint(checkpoint, path).to(device).eval(), name_of(path, checkpoint)
        for distance in distances:
            x = probes(ids, distance, args.span, args.samples, args.seed).to(device)
            repeat, first = accuracies(model, x, args.span, args.batch_size)
            rows.append(dict(model=name, distance=distance, span=args.span, samples=args.samples,
                             repeat_accuracy=round(repeat, 4), first_accuracy=round(first, 4)))
            print(f"{name:24s} D={distance:<5d} repeat {repeat:.3f}  first reading {first:.3f}", flush=True)
    write_csv(args.out, rows, COLUMNS)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    run_main(main)
