"""
What GPT-2 (124M) costs as a T2R model: its memory from the shapes, and its CPU speed with random weights of its
exact shape (speed does not depend on the weights' values), so that it runs with no download.

    python -m experiments.gpt2_cost                  # memory, one finetuning step, decoding 1024 tokens
    python -m experiments.gpt2_cost --memory_only    # the memory alone (instant: nothing is allocated)

Memory: float32 weights, their gradients and AdamW's two moments (what finetuning holds before activations), and
one sequence's generation state: T2R's S and z (the same at every length) against softmax's keys and values.
Speed: one finetuning step (forward, backward, AdamW) at batch 1 x 512 tokens, the median of `--repeats` after a
warm-up; greedy decoding of 1024 tokens at batch 1, softmax with its KV cache against T2R folded (Eq. 8).
"""


if __package__ in (None, ""):  # run as a file: the project's modules are found from its root, as a module
    raise SystemExit("error: run it from the repository's root as a module: python -m experiments.gpt2_cost")

import statistics
import time

import torch
import torch.nn.functional as F
from bench import generate, latency_at
from support import hf
from support.runtime import Parser, positive_int, run_main
from layers.states import state_bytes
from support.training import make_optimizer
from families import FamilyConfig, FamilyLM
from t2r import convert, fold

FEATURE_SIZE = 32  # T2R's k, as in the paper
LENGTH = 1024  # GPT-2's last position


def memory(config: FamilyConfig, feature_size: int = FEATURE_SIZE, lengths: tuple = (LENGTH,)) -> dict:
    """Bytes in float32, computed on the meta device: the model is described, nothing is allocated; the KV cache
    at each of lengths."""
    with torch.device("meta"):
        student = convert(FamilyLM(config), "t2r", feature_size)
        state = state_bytes(student.init_state(batch_size=1))
    weights = 4 * sum(p.numel() for p in student.parameters())
    return {"weights": weights, "gradients": weights, "adamw_moments": 2 * weights, "t2r_state": state,
            **{f"kv_cache_{n}": 4 * 2 * config.n_layer * n * config.kv_width() for n in lengths}}


def step_seconds(model, repeats: int, tokens: int = 512) -> float:
    """The median seconds of one finetuning step (forward, backward, AdamW) on `tokens` tokens, after a warm-up."""
    model.train()
    optimizer = make_optimizer(model, 1e-4, 0.01, torch.device("cpu"))
    batch, times = torch.randint(0, model.config.vocab_size, (1, tokens + 1)), []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        logits = model(batch[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def print_memory(figures: dict):
    for what, size in figures.items():
        print(f"memory | {what:15s} | {size:>13,d} bytes | {size / 2 ** 20:8.1f} MiB")


def timed_models(config: FamilyConfig, shape: str, repeats: int) -> tuple:
    """The softmax model of the config's shape with random weights and its T2R conversion (chunked: the form that
    finetunes), after printing one finetuning step's seconds of each."""
    threads = torch.get_num_threads()
    print(f"torch {torch.__version__}, {threads} thread{'s' * (threads != 1)}; random weights of {shape} shape")
    torch.manual_seed(0)
    teacher = FamilyLM(config)
    student = convert(teacher, "t2r", FEATURE_SIZE)
    for name, model in (("softmax", teacher), (f"t2r k={FEATURE_SIZE}", student)):
        print(f"finetuning step, batch 1 x 512 | {name} | {step_seconds(model, repeats):.2f} s", flush=True)
    return teacher, student


def decoding(model, at: tuple = (32, LENGTH)) -> tuple:
    """Greedy tokens/s over at[-1] tokens at batch 1, and the per-token latency at each of the lengths `at`."""
    generate(model, "step", 1, 16, torch.device("cpu"))  # warm-up
    times, _, _ = generate(model, "step", 1, at[-1], torch.device("cpu"))
    return at[-1] / sum(times), [latency_at(times, n) for n in at]


def main(argv=None):
    p = Parser(prog="gpt2_cost.py", description="GPT-2 (124M) as T2R: memory from its shapes, CPU speed.")
    p.add_argument("--memory_only", action="store_true", help="print the memory figures and stop")
    p.add_argument("--repeats", type=positive_int, default=2, help="finetuning steps timed after the warm-up")
    args = p.parse_args(argv)
    config = hf.gpt2_config(hf.GPT2, "GPT-2 (124M)")
    print_memory(memory(config))
    if args.memory_only:
        return
    teacher, student = timed_models(config, "GPT-2's", args.repeats)
    with torch.no_grad():
        for name, model in (("softmax, KV cache", teacher.eval()), (f"t2r k={FEATURE_SIZE}, folded", fold(student))):
            rate, (first, last) = decoding(model)
            print(f"greedy decoding of {LENGTH} tokens, batch 1 | {name} | {rate:.1f} tokens/s | "
                  f"{1000 * first:.1f} ms a token at 32, {1000 * last:.1f} ms at {LENGTH}", flush=True)


if __name__ == "__main__":
    run_main(main)
