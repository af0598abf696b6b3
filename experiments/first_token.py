"""
Time to the first token against `transformers`, on the same weights, paired in one process: a prompt read by
transformers' model (one batched forward with its cache and the last position's logits, as generate() prefills) and
by ours, the softmax teacher (its KV cache filled at once) and its T2R conversion (k = 32; t2r.py's prefill: the
chunked parallel form, the state handed to the step); then the prompt and 256 greedy tokens: generate() against our
prefill and steps (generate.py's loop, the step unrolled where it fits). Two shapes, random weights (speed does not
depend on their values): the default language model's (4 layers, d 256, 4 heads, d_ff 1024, 10,000 tokens) as a
GPT-2, and a Llama of that size (rotary positions, 2 key/value heads for 4 query heads, SwiGLU).

    python -m experiments.first_token                   # 512, 2,048 and 8,192 tokens, 1 thread (about 10 minutes)
    python -m experiments.first_token --quick           # short prompts, seconds: the pipeline
    python -m experiments.first_token --lengths 1000,100000 --only t2r --memory   # peak memory of a long prefill

Each figure is the median of --repeats, the three models taking turns within a repeat (the first of each order
rotated), after a warm-up at the first length. Ratios are ours over transformers'. Run it on an otherwise idle machine.
"""

if __package__ in (None, ""):  # run as a file: the project's modules are found from its root, as a module
    raise SystemExit("error: run it from the repository's root as a module: python -m experiments.first_token")

import os
import resource
import statistics
import tempfile
import time

import torch

from benchmarks.bench_models import transformers_twin
from experiments.records import machine
from support import hf
from support.fast_step import eager_decoder
from support.inference import inference_model
from support.runtime import Parser, UserError, increasing_ints, positive_int, run_main
from t2r import PREFILL_CHUNK, convert

NEW_TOKENS = 256
SHAPE = dict(vocab=10_000, layers=4, width=256, heads=4, ffn=1024)  # t2r.py's Config defaults, as GPT-2 and Llama


def models(family: str, positions: int) -> dict:
    """{name: model}: transformers', then ours read from its save_pretrained folder (support/hf.py), softmax and T2R."""
    torch.manual_seed(0)
    theirs = transformers_twin(family, **SHAPE, positions=positions)
    if theirs is None:
        raise UserError("transformers is not installed: pip install -r requirements-dev.txt")
    with tempfile.TemporaryDirectory() as folder:
        theirs.save_pretrained(folder)
        teacher = hf.load(folder).eval()
    student = inference_model(convert(teacher, attn="t2r", feature_size=32).eval())  # folded where it can be
    return {"transformers": theirs, "softmax": teacher, "t2r": student}


@torch.no_grad()
def first_token(name: str, model, prompt) -> float:
    """Seconds from the prompt to the first token's logits."""
    start = time.perf_counter()
    if name == "transformers":
        model(prompt, use_cache=True, logits_to_keep=1).logits[:, -1].argmax(-1)
    else:
        model.prefill(prompt, model.init_state(1), chunk=PREFILL_CHUNK)[0].argmax(-1)
    return time.perf_counter() - start


@torch.no_grad()
def prompt_and_new_tokens(name: str, model, prompt, new: int = NEW_TOKENS) -> float:
    """Seconds from the prompt to `new` greedy tokens: generate(), or our prefill then the steps."""
    start = time.perf_counter()
    if name == "transformers":
        model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    else:
        decoder = eager_decoder(model)  # generate.py's: the step unrolled where it fits
        state = decoder.init_state(1)
        logits, state = model.prefill(prompt, state, chunk=PREFILL_CHUNK)
        for _ in range(new - 1):
            logits, state = decoder.step(logits.argmax(-1), state)
    return time.perf_counter() - start


def paired(measure, chosen: dict, prompt, repeats: int) -> dict:
    """{name: median seconds} over repeats, the models taking turns (the order rotated each repeat)."""
    names, seconds = list(chosen), {name: [] for name in chosen}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            seconds[name].append(measure(name, chosen[name], prompt))
    return {name: statistics.median(times) for name, times in seconds.items()}


def peak_memory_mib() -> float:  # the process's peak resident memory so far (Linux reports KiB)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv=None):
    p = Parser(prog="python -m experiments.first_token", description="Time to the first token against transformers.")
    p.add_argument("--lengths", type=increasing_ints, default=[512, 2048, 8192], help="prompt lengths, in tokens")
    p.add_argument("--families", default="gpt2,llama", help="comma-separated: gpt2 (the default LM's shape), llama")
    p.add_argument("--only", default="transformers,softmax,t2r", help="comma-separated models to time")
    p.add_argument("--repeats", type=positive_int, default=3, help="paired repeats a figure is the median of")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads")
    p.add_argument("--quick", action="store_true", help="prompts of 16 and 64 tokens, 8 new ones, one repeat: the "
                   "pipeline")
    p.add_argument("--memory", action="store_true", help="one prefill a length, each in a process of its own: the "
                   "peak resident memory (the first length's process first); no timing, no transformers")
    args = p.parse_args(argv)
    families, only = args.families.split(","), args.only.split(",")
    if not set(families) <= {"gpt2", "llama"} or not set(only) <= {"transformers", "softmax", "t2r"}:
        raise UserError("--families takes gpt2 and llama, --only transformers, softmax and t2r (comma-separated)")
    lengths, repeats, new = ([16, 64], 1, 8) if args.quick else (args.lengths, args.repeats, NEW_TOKENS)
    with_new = lambda name, model, prompt: prompt_and_new_tokens(name, model, prompt, new)
    torch.set_num_threads(args.threads)
    if args.memory:
        return memory(families, only, lengths)
    where = machine()
    print(f"{where['device']}, {args.threads} thread(s), torch {where['torch']}, {where['date']}; "
          f"prompt then {new} greedy tokens, batch 1, medians of {repeats}")
    print(f"\n| shape | prompt | model | first token (s) | / transformers | prompt + {new} tokens (s) | / generate() |")
    print("|---|---|---|---|---|---|---|")
    for family in families:
        chosen = {name: model for name, model in models(family, max(lengths) + NEW_TOKENS).items() if name in only}
        warm = torch.randint(0, SHAPE["vocab"], (1, lengths[0]))
        paired(first_token, chosen, warm, 1), paired(with_new, chosen, warm, 1)  # warm-up
        for length in lengths:
            prompt = torch.randint(0, SHAPE["vocab"], (1, length))
            first = paired(first_token, chosen, prompt, repeats)
            total = paired(with_new, chosen, prompt, repeats)
            for name in chosen:
                against = lambda times: (f"{times[name] / times['transformers']:.2f}x"
                                         if "transformers" in times else "-")
                print(f"| {'default LM as GPT-2' if family == 'gpt2' else 'Llama'} | {length:,} | {name} | "
                      f"{first[name]:.3f} | {against(first)} | {total[name]:.2f} | {against(total)} |", flush=True)


def memory(families: list, only: list, lengths: list):
    """The peak resident memory of one prefill at each length, each in a fresh process (a peak never goes down)."""
    import subprocess
    import sys
    for family in families:
        for name in [n for n in only if n != "transformers"]:
            for length in lengths:
                code = ("import torch, experiments.first_token as f; torch.set_num_threads(1); "
                        f"m = f.models({family!r}, {length + 1})[{name!r}]; "
                        f"before = f.peak_memory_mib(); m.prefill(torch.randint(0, 10000, (1, {length})), "
                        f"m.init_state(1)); print(before, f.peak_memory_mib())")
                out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                     cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
                if out.returncode:
                    raise UserError(f"the memory probe failed: {out.stderr.strip().splitlines()[-1]}")
                before, peak = map(float, out.stdout.split())
                print(f"{family} {name}: prefill of {length:,} tokens: peak resident memory {peak:,.0f} MiB "
                      f"({peak - before:,.0f} MiB above the models')", flush=True)


if __name__ == "__main__":
    run_main(main)
