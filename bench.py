"""
Length-scaling benchmarks of T2R (Kasai et al., 2021, section 3.3, Figs. 2 and 3): softmax attention
against its RNN forms, in generation (speed, per-token latency, memory) and in training (time, memory).

    python bench.py --quick                  # CI smoke run, under a minute on a 2-core CPU
    python bench.py                          # the full run (CPU: about 30-45 minutes on 2 cores; see below)
    python bench.py --only gen,memory        # sections: gen (LM), s2s, memory, train (= train_attn,train_lm)
    python bench.py --lengths 128,512,2048 --batch_sizes 16 --out_dir results/bench-small
    python bench.py --ckpt out/ptb-t2r-pretrained/ckpt.pt   # shapes and weights of a trained LM

What it measures (all models greedy, torch.no_grad, one token per step, like generate.py):
  gen     unconditional LM generation at every --batch_sizes, for L in --lengths (powers of two, 128..8192):
          tokens/s for generating L tokens from an empty state, per-token latency at position L, state bytes.
          Models: softmax_kv (softmax with its preallocated, doubling KV cache), softmax_recompute (the whole
          prefix re-run at every token, Katharopoulos et al.'s baseline; only up to --recompute_max),
          t2r32 and t2r4 (folded with Eq. 8, the generation model) and t2r32_unfolded, t2r4_unfolded
          (to show what folding gains), elu (k = d = 64), rfa32, and two floors built from t2r32:
          floor (every self-attention removed: its step returns zeros) and proj_only (the q, k, v and
          output projections run, the attention itself does not: the cost of the weights alone).
  s2s     conditional generation with the encoder-decoder, source length = target length, batch --s2s_batch
          (16, as in Fig. 2): softmax_kv, t2r32-4 (cross k=32, causal k=4, folded), t2r32-4_unfolded,
          elu (64-64), rfa32-4. tokens/s include encoding the source (encode_ms is also reported).
  memory  the attention state at --memory_length tokens (4096), batch 1: KV cache bytes over RNN state bytes,
          measured (state_bytes) and in theory 2 N h / (r k (d + 1)) (= 2 N d / (k (d + 1))): ~252 for k=32, d=64.
  train   forward + backward (median of --repeats after a warmup) and peak memory, against --train_lengths,
          of one causal attention layer (attn) and of the whole LM (lm, cross-entropy loss, dropout on):
          softmax_sdpa (F.scaled_dot_product_attention, a fused kernel), softmax_math (the same with the math
          backend, which forms the T x T matrix), t2r_quadratic (chunk_size=0) and t2r_chunked (chunk_size 64).
          The T x T forms (softmax_math, t2r_quadratic) stop at --quadratic_max.

Timing. CUDA: warmup, CUDA events around every step / iteration, torch.cuda.synchronize before reading them.
CPU: warmup, time.perf_counter around every step; generation reports, per position, the median of the last 32
step times (robust to the occasional slow step, e.g. a KV-cache doubling), and training the median of --repeats.
tokens/s for L tokens = batch * L / (total time of the first L steps): one run to the longest length gives all
shorter ones. Random weights (--seed): weights do not change the timing, only the tokens picked.
Run it on an otherwise idle machine: other processes on the same cores distort every number.

Memory. state_bytes: bytes of the tensors of the recurrent state (t2r.state_bytes; a KV cache counts its
allocated capacity). CPU: rss_bytes is the resident set now (/proc/self/statm) and peak_rss_bytes the process's
peak so far (resource.getrusage, so it only grows during a run); CUDA: cuda_peak_bytes is
torch.cuda.max_memory_allocated after reset_peak_memory_stats, minus what was allocated before the run.
Training peak memory on CPU: a TorchDispatchMode sees every aten op (forward and backward), adds the bytes of
each new output storage and subtracts them when the storage is freed (a weakref finalizer); the peak of that sum
is the peak of the tensors the step created (activations, saved tensors, gradients, temporaries between ops;
not scratch space inside a single kernel, nor the inputs and weights that existed before).

Outputs in --out_dir (default results/bench):
  bench.csv   one row per measurement, columns: section,model,batch,length,metric,value,unit,device
              section  gen | s2s | memory | train_attn | train_lm
              metric   gen, s2s:   tokens_per_s (tok/s), latency_ms (ms, at position = length),
                                   state_bytes (B), rss_bytes (B), peak_rss_bytes (B) on CPU,
                                   cuda_peak_bytes (B) on CUDA, encode_ms (ms, s2s only)
                       memory:     state_bytes (B), kv_over_state (x, measured), kv_over_state_theory (x)
                       train_*:    ms (ms, forward + backward), peak_bytes (B)
  bench.md    markdown tables of the same numbers, and the issue's targets checked
  *.png       gen_tokens_per_s, gen_latency, gen_memory, train (matplotlib, Agg; skipped if not installed)

Duration of the default run on an idle 2-core CPU (torch 2.13), extrapolated from partial runs up to 2048 tokens:
about 30-45 minutes: gen ~10 (softmax_kv at batch 16 ~3, softmax_recompute ~1.5, each RNN ~0.5), s2s ~15-25
(softmax_kv alone ~10-20: at 8192 tokens its self and cross caches are 1.5 GiB read at every step, and encoding
8192 x 16 source tokens takes ~40 s per model), train ~2, memory ~0.1. --quick: 46 s with --threads 1 on a
2-core AMD EPYC (the test's setting). Fewer minutes:
--s2s_lengths 128,256,512,1024,2048,4096 or --models.
"""

import argparse
import copy
import csv
import os
import platform
import resource
import statistics
import sys
import time
import weakref
from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from training import Parser
from t2r import Config, LinearAttention, Seq2SeqTransformer, SoftmaxAttention, TransformerLM, fold, state_bytes

CSV_COLUMNS = ["section", "model", "batch", "length", "metric", "value", "unit", "device"]
LM_MODELS = ["softmax_kv", "softmax_recompute", "t2r32", "t2r32_unfolded", "t2r4", "t2r4_unfolded", "elu",
             "rfa32", "floor", "proj_only"]
S2S_MODELS = ["softmax_kv", "t2r32-4", "t2r32-4_unfolded", "elu", "rfa32-4"]
TRAIN_MODELS = ["softmax_sdpa", "softmax_math", "t2r_quadratic", "t2r_chunked"]
SECTIONS = ("gen", "s2s", "memory", "train_attn", "train_lm")
QUICK = dict(lengths="32,64", batch_sizes="1,16", s2s_lengths="32,64", recompute_max=32,
             memory_length=1024, train_lengths="64,128", quadratic_max=128, repeats=2)


def int_list(text: str) -> list:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return sorted(set(values))


def get_args(argv=None):
    p = Parser(prog="bench.py", description="Length-scaling benchmarks of T2R generation and training.")
    p.add_argument("--quick", action="store_true",
                   help=f"CI smoke run (< 60 s on 2 CPU cores): {', '.join(f'--{k} {v}' for k, v in QUICK.items())}")
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections among {', '.join(SECTIONS)}")
    p.add_argument("--models", default="",
                   help="comma-separated subset of the generation models (default: all; see the docstring)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto: cuda if available")
    p.add_argument("--out_dir", default="results/bench", help="where bench.csv, bench.md and the plots go")
    p.add_argument("--lengths", type=int_list, default=None,
                   help="generated lengths of the LM (default 128,256,...,8192)")
    p.add_argument("--batch_sizes", type=int_list, default=None, help="LM generation batch sizes (default 1,16)")
    p.add_argument("--s2s_lengths", type=int_list, default=None,
                   help="source = target lengths of the translator (default: --lengths)")
    p.add_argument("--s2s_batch", type=int, default=16, help="translator batch size (Fig. 2: 16)")
    p.add_argument("--recompute_max", type=int, default=None,
                   help="longest length of softmax_recompute, which is quadratic per token (default 512)")
    p.add_argument("--memory_length", type=int, default=None, help="tokens of the state-size comparison (default 4096)")
    p.add_argument("--train_lengths", type=int_list, default=None, help="training lengths (default 512,...,8192)")
    p.add_argument("--train_batch", type=int, default=1, help="sequences per training step")
    p.add_argument("--quadratic_max", type=int, default=None,
                   help="longest training length of the T x T forms softmax_math, t2r_quadratic (default 4096)")
    p.add_argument("--repeats", type=int, default=None, help="timed training iterations, median taken (default 3)")
    p.add_argument("--gen_repeats", type=int, default=1,
                   help="timed generation runs; per-step times are the elementwise median (default 1)")
    p.add_argument("--ckpt", default="", help="optional train_lm.py checkpoint: its LM shapes and the weights that fit")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=1337, help="torch.manual_seed of the random weights and tokens")
    args = p.parse_args(argv)
    defaults = dict(lengths=[2 ** i for i in range(7, 14)], batch_sizes=[1, 16], s2s_lengths=None,
                    recompute_max=512, memory_length=4096, train_lengths=[2 ** i for i in range(9, 14)],
                    quadratic_max=4096, repeats=3)
    for name, default in defaults.items():
        if getattr(args, name) is None:
            value = QUICK[name] if args.quick else default
            setattr(args, name, int_list(value) if isinstance(value, str) else value)
    if args.s2s_lengths is None:
        args.s2s_lengths = args.lengths
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    args.only = [s for o in only for s in (("train_attn", "train_lm") if o == "train" else (o,))]
    for section in args.only:
        if section not in SECTIONS:
            p.error(f"unknown section {section!r} in --only: choose among {', '.join(SECTIONS)}")
    for name in ("s2s_batch", "recompute_max", "memory_length", "train_batch", "quadratic_max", "repeats",
                 "gen_repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    for name in args.models:
        if name not in LM_MODELS + S2S_MODELS:
            p.error(f"unknown model {name!r} in --models: choose among {', '.join(dict.fromkeys(LM_MODELS + S2S_MODELS))}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available")
    return args


# -----------------------------------------------------------------------------
# Models

def lm_config(args, **overrides) -> Config:
    """The default small LM (about 4 layers, d=256, 4 heads), or the shapes of --ckpt."""
    base = dict(vocab_size=10_000, n_layer=4, n_head=4, d_model=256, d_ff=1024, dropout=0.0)
    if args.ckpt_config:
        base.update({k: args.ckpt_config[k] for k in ("vocab_size", "n_layer", "n_head", "d_model", "d_ff",
                                                      "pre_norm", "tie_embeddings") if k in args.ckpt_config})
    return Config(**{**base, **overrides})


def load_fitting(model: nn.Module, args) -> nn.Module:
    """Copy the --ckpt tensors whose name and shape fit (all but the feature maps of another kind)."""
    if args.ckpt_state:
        target = model.state_dict()
        fitting = {k: v for k, v in args.ckpt_state.items() if k in target and target[k].shape == v.shape}
        model.load_state_dict(fitting, strict=False)
    return model


class NoAttention(nn.Module):
    """The floor: a self-attention whose output is zero; the rest of the model runs as usual."""

    def init_state(self, batch_size, device, dtype):
        return {}

    def step(self, x, state):
        return torch.zeros_like(x)

    def forward(self, x, key_mask=None):
        return torch.zeros_like(x)


class ProjectionsOnly(nn.Module):
    """The q, k, v and output projections of an attention layer without the attention: out = W_o v."""

    def __init__(self, attn):
        super().__init__()
        self.attn = attn

    def init_state(self, batch_size, device, dtype):
        return {}

    def step(self, x, state):
        q, k, v = self.attn.project(x[:, None], x[:, None])
        return self.attn.merge(v)[:, 0]


def replace_self_attention(model, make):
    model = copy.deepcopy(model)
    for layer in model.layers:
        layer.self_attn = make(layer.self_attn)
    return model


def build_lm(name: str, args):
    """name -> (model, mode) with mode 'step' (recurrent) or 'recompute'."""
    kind, k, folded = {
        "softmax_kv": ("softmax", 32, False), "softmax_recompute": ("softmax", 32, False),
        "t2r32": ("t2r", 32, True), "t2r32_unfolded": ("t2r", 32, False), "t2r4": ("t2r", 4, True),
        "t2r4_unfolded": ("t2r", 4, False), "elu": ("elu", 32, False), "rfa32": ("rfa", 32, False),
        "floor": ("t2r", 32, True), "proj_only": ("t2r", 32, True)}[name]
    model = load_fitting(TransformerLM(lm_config(args, attn=kind, feature_size=k)), args).eval()
    if folded:
        model = fold(model)
    if name == "floor":
        model = replace_self_attention(model, lambda attn: NoAttention())
    if name == "proj_only":
        model = replace_self_attention(model, ProjectionsOnly)
    return model.to(args.device), "recompute" if name == "softmax_recompute" else "step"


def build_s2s(name: str, args):
    kind, cross_k, self_k = {"softmax_kv": ("softmax", 32, 32), "t2r32-4": ("t2r", 32, 4),
                             "t2r32-4_unfolded": ("t2r", 32, 4), "elu": ("elu", 64, 64),
                             "rfa32-4": ("rfa", 32, 4)}[name]
    config = lm_config(args, n_encoder_layer=lm_config(args).n_layer, attn=kind, feature_size=self_k,
                       cross_attn=kind, cross_feature_size=cross_k)
    model = Seq2SeqTransformer(config).eval()
    if name == "t2r32-4":
        model = fold(model)
    return model.to(args.device)


# -----------------------------------------------------------------------------
# Measurement helpers

class StepTimer:
    """Times consecutive intervals: CUDA events on CUDA (read after one synchronize), perf_counter on CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.marks = []

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def intervals(self) -> list:
        """Seconds between consecutive marks."""
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self.marks, self.marks[1:])]
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


def rss_bytes() -> int:
    """Resident set size now (Linux), else 0."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


class PeakMemory(TorchDispatchMode):
    """Peak bytes of the tensor storages created inside the `with` block, on CPU (see the docstring)."""

    def __init__(self):
        super().__init__()
        self.live, self.current, self.peak = {}, 0, 0

    def _watch(self, storage, nbytes):
        key = id(storage)  # storages keep their Python object while alive, so the id is stable
        self.live[key] = nbytes
        self.current += nbytes
        self.peak = max(self.peak, self.current)
        weakref.finalize(storage, self._free, key)

    def _free(self, key):
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for t in tree_flatten((args, kwargs))[0]:  # storages from before count 0, so views of them count 0
            if isinstance(t, torch.Tensor) and id(t.untyped_storage()) not in self.live:
                self._watch(t.untyped_storage(), 0)
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and id(t.untyped_storage()) not in self.live:
                self._watch(t.untyped_storage(), t.untyped_storage().nbytes())
        return out


def theory_ratio(n: int, d_model: int, n_head: int, k: int) -> float:
    """KV cache over RNN state, per layer: 2 N h (keys and values) / (r k (d + 1)) (S: k x d and z: k per head)."""
    d = d_model // n_head
    return 2 * n * d_model / (n_head * k * (d + 1))


def cuda_reset(device):
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    return 0


# -----------------------------------------------------------------------------
# Generation

@torch.no_grad()
def generate(model, mode, batch, n_steps, device, src=None, checkpoints=(), seed=0):
    """Greedy generation of n_steps tokens. Returns per-step seconds, encode seconds, and at each checkpoint
    length (after that many tokens) the memory readings."""
    torch.manual_seed(seed)
    baseline = cuda_reset(device)
    timer = StepTimer(device)
    snapshots = {}
    timer.mark()
    if src is not None:
        state = model.init_state(src)  # encode the source once, build the cross-attention states
    elif mode == "step":
        state = model.init_state(batch)
    else:
        state = None
        tokens = torch.zeros(batch, n_steps + 1, dtype=torch.long, device=device)
    timer.mark()
    token = torch.zeros(batch, dtype=torch.long, device=device)
    for t in range(n_steps):
        if mode == "step":
            logits, state = model.step(token, state)
            token = logits.argmax(-1)
        else:  # the whole prefix again: the layers at every position, the output head at the last one
            x = model.run_layers(model.layers, model.embed(tokens[:, : t + 1]))
            tokens[:, t + 1] = model.output(x[:, -1]).argmax(-1)
        timer.mark()
        if t + 1 in checkpoints:
            snap = {"state_bytes": state_bytes(state)} if state is not None and state_bytes(state) else {}
            if device.type == "cuda":
                snap["cuda_peak_bytes"] = torch.cuda.max_memory_allocated() - baseline
            else:
                snap["rss_bytes"], snap["peak_rss_bytes"] = rss_bytes(), peak_rss_bytes()
            snapshots[t + 1] = snap
    times = timer.intervals()
    return times[1:], times[0], snapshots


def latency_at(times, position, window=32):
    """Median seconds of the steps that produced tokens position-window+1 .. position."""
    return statistics.median(times[max(0, position - window): position])


def bench_generation(section, names, batch_sizes, lengths, args, rows, make, limits=None):
    """Run every model to the longest length once per repeat, report every length as a prefix."""
    names = [n for n in names if not args.models or n in args.models]
    for batch in batch_sizes:
        for name in names:
            n = max(lengths) if limits is None or name not in limits else min(max(lengths), limits[name])
            todo = [L for L in lengths if L <= n]
            if not todo:
                continue
            model, mode = make(name)
            src_for = (lambda L: torch.randint(1, lm_config(args).vocab_size, (batch, L), device=args.device)) \
                if section == "s2s" else (lambda L: None)
            generate(model, mode, batch, min(16, n), args.device, src=src_for(min(16, n)))  # warmup
            # The LM: one run to the longest length, every shorter length is a prefix of it. The translator:
            # one run per length, since its source is as long as its target (Fig. 2).
            plan = [(L, [L]) for L in todo] if section == "s2s" else [(n, todo)]
            latencies = {}
            for n_run, reported in plan:
                runs = [generate(model, mode, batch, n_run, args.device, src=src_for(n_run), checkpoints=set(reported),
                                 seed=args.seed + r) for r in range(args.gen_repeats)]
                times = [statistics.median(ts) for ts in zip(*(r[0] for r in runs))]
                encode = statistics.median(r[1] for r in runs) if section == "s2s" else 0.0
                snapshots = runs[-1][2]
                for L in reported:
                    total = sum(times[:L]) + encode  # encoding the L-token source counts for the translator
                    add = lambda metric, value, unit: rows.append(
                        dict(section=section, model=name, batch=batch, length=L, metric=metric, value=value, unit=unit))
                    add("tokens_per_s", batch * L / total, "tok/s")
                    latencies[L] = latency_at(times, L)
                    add("latency_ms", 1e3 * latencies[L], "ms")
                    if section == "s2s":
                        add("encode_ms", 1e3 * encode, "ms")
                    for metric, reading in snapshots[L].items():
                        add(metric, reading, "B")
            last = todo[-1]
            print(f"{section:4s} {name:17s} B={batch:<3d} L={last:<5d} "
                  f"{value(rows, section, name, batch, last, 'tokens_per_s'):9.0f} tok/s  "
                  f"latency {1e3 * latencies[todo[0]]:.2f} ms @{todo[0]} -> "
                  f"{1e3 * latencies[last]:.2f} ms @{last}", flush=True)
            del model, runs


def bench_memory(args, rows):
    """KV cache against RNN state at memory_length tokens, batch 1: measured and in theory."""
    N = args.memory_length
    config = lm_config(args)
    model, _ = build_lm("softmax_kv", args)
    _, _, snaps = generate(model, "step", 1, N, args.device, checkpoints={N})
    kv = snaps[N]["state_bytes"]
    rows.append(dict(section="memory", model="softmax_kv", batch=1, length=N, metric="state_bytes", value=kv, unit="B"))
    for name, k in (("t2r32", 32), ("t2r4", 4), ("elu", config.d_model // config.n_head), ("rfa32", 32)):
        model, _ = build_lm(name, args)
        _, _, snaps = generate(model, "step", 1, 8, args.device, checkpoints={8})  # constant: a few steps do
        size = snaps[8]["state_bytes"]
        theory = theory_ratio(N, config.d_model, config.n_head, k)
        for metric, value, unit in (("state_bytes", size, "B"), ("kv_over_state", kv / size, "x"),
                                    ("kv_over_state_theory", theory, "x")):
            rows.append(dict(section="memory", model=name, batch=1, length=N, metric=metric, value=value, unit=unit))
        print(f"memory {name:7s} state {size:8d} B  KV cache at {N}: {kv} B  ratio {kv / size:7.1f} "
              f"(theory {theory:7.1f})", flush=True)


# -----------------------------------------------------------------------------
# Training

def train_model(section, name, args):
    kind, chunk = ("softmax", 0) if name.startswith("softmax") else ("t2r", 0 if name == "t2r_quadratic" else 64)
    if section == "train_attn":
        config = lm_config(args)
        if kind == "softmax":
            return SoftmaxAttention(config.d_model, config.n_head, causal=True).to(args.device)
        return LinearAttention(config.d_model, config.n_head, True, "t2r", 32, chunk).to(args.device)
    model = TransformerLM(lm_config(args, attn=kind, feature_size=32, chunk_size=chunk, dropout=0.1))
    return load_fitting(model, args).to(args.device).train()


def sdpa_backend(name):
    if name != "softmax_math":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel(SDPBackend.MATH)


def bench_training(section, args, rows):
    config = lm_config(args)
    for L in args.train_lengths:
        for name in TRAIN_MODELS:
            if name in ("softmax_math", "t2r_quadratic") and L > args.quadratic_max:
                continue
            torch.manual_seed(args.seed)
            model = train_model(section, name, args)
            if section == "train_attn":
                x = torch.randn(args.train_batch, L, config.d_model, device=args.device, requires_grad=True)
                loss_fn = lambda: model(x).float().square().mean()
            else:
                tokens = torch.randint(0, config.vocab_size, (args.train_batch, L + 1), device=args.device)
                loss_fn = lambda: F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())

            def step():
                model.zero_grad(set_to_none=True)
                if section == "train_attn":
                    x.grad = None
                with sdpa_backend(name):
                    loss_fn().backward()

            step()  # warmup
            timer = StepTimer(args.device)
            timer.mark()
            for _ in range(args.repeats):
                step()
                timer.mark()
            ms = 1e3 * statistics.median(timer.intervals())
            if args.device.type == "cuda":
                baseline = cuda_reset(args.device)
                step()
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated() - baseline
            else:
                with PeakMemory() as pm:
                    step()
                peak = pm.peak
            for metric, value, unit in (("ms", ms, "ms"), ("peak_bytes", peak, "B")):
                rows.append(dict(section=section, model=name, batch=args.train_batch, length=L, metric=metric,
                                 value=value, unit=unit))
            print(f"{section:10s} {name:14s} L={L:<5d} {ms:9.1f} ms  peak {peak / 2 ** 20:8.1f} MiB", flush=True)
            del model


# -----------------------------------------------------------------------------
# Report: CSV, markdown with the targets, plots

def value(rows, section, model, batch, length, metric):
    for r in rows:
        if (r["section"], r["model"], r["length"], r["metric"]) == (section, model, length, metric) \
                and (batch is None or r["batch"] == batch):
            return r["value"]
    return None


def fmt(v, metric=""):
    if v is None:
        return ""
    if metric.endswith("bytes"):
        return f"{v / 2 ** 20:.3g}" if v >= 2 ** 20 / 100 else f"{v / 2 ** 20:.2g}"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


def table(rows, section, metric, title, batch=None):
    sel = [r for r in rows if r["section"] == section and r["metric"] == metric and (batch is None or r["batch"] == batch)]
    if not sel:
        return []
    lengths = sorted({r["length"] for r in sel})
    keys = list(dict.fromkeys((r["model"], r["batch"]) for r in sel))
    unit = "MiB" if metric.endswith("bytes") else sel[0]["unit"]
    out = [f"**{title}** ({metric}, {unit})", "", "| model | batch | " + " | ".join(map(str, lengths)) + " |",
           "|---|---|" + "---|" * len(lengths)]
    for model, b in keys:
        cells = [fmt(value(sel, section, model, b, L, metric), metric) for L in lengths]
        out.append(f"| {model} | {b} | " + " | ".join(cells) + " |")
    return out + [""]


def check_targets(rows, args) -> list:
    """The issue's CPU targets, each as (target, measured, pass/fail/n/a)."""
    out = []

    def ratio(a, b):
        return None if a is None or b is None or b == 0 else a / b

    def add(target, measured, ok):
        verdict = "n/a (not measured in this run)" if measured is None else ("pass" if ok(measured) else "MISS")
        out.append((target, "" if measured is None else f"{measured:.2f}", verdict))

    gen_lengths = sorted({r["length"] for r in rows if r["section"] == "gen"})
    for b in args.batch_sizes:
        lo, hi = (gen_lengths[0], gen_lengths[-1]) if gen_lengths else (None, None)
        m = ratio(value(rows, "gen", "t2r32", b, hi, "latency_ms"), value(rows, "gen", "t2r32", b, lo, "latency_ms"))
        add(f"flat: t2r32 latency at {hi} / at {lo}, batch {b} (target 8192 vs 128) <= 1.2", m, lambda v: v <= 1.2)
    for L, need in ((4096, 5), (8192, 9)):
        m = ratio(value(rows, "gen", "t2r32", 16, L, "tokens_per_s"), value(rows, "gen", "softmax_kv", 16, L, "tokens_per_s"))
        add(f"t2r32 / softmax_kv tokens/s at {L}, batch 16 >= {need}", m, lambda v, need=need: v >= need)
    for b in args.batch_sizes:
        hi = gen_lengths[-1] if gen_lengths else None
        for floor in ("floor", "proj_only"):
            m = ratio(value(rows, "gen", floor, b, hi, "tokens_per_s"), value(rows, "gen", "t2r32", b, hi, "tokens_per_s"))
            add(f"t2r32 step / {floor} step (tokens/s at {hi}), batch {b} <= 1.2", m, lambda v: v <= 1.2)
    N = args.memory_length
    measured = value(rows, "memory", "t2r32", 1, N, "kv_over_state")
    theory = value(rows, "memory", "t2r32", 1, N, "kv_over_state_theory")
    add(f"KV cache / t2r32 state at {N} tokens, measured (theory {fmt(theory)}) within 1%", measured,
        lambda v: abs(v / theory - 1) < 0.01)
    sdpa = lambda L, metric: value(rows, "train_attn", "softmax_sdpa", None, L, metric)
    chunk = lambda L, metric: value(rows, "train_attn", "t2r_chunked", None, L, metric)
    add("train attn 8192: softmax_sdpa ms / t2r_chunked ms >= 5", ratio(sdpa(8192, "ms"), chunk(8192, "ms")),
        lambda v: v >= 5)
    add("train attn 8192: t2r_chunked peak / softmax_sdpa peak <= 0.25",
        ratio(chunk(8192, "peak_bytes"), sdpa(8192, "peak_bytes")), lambda v: v <= 0.25)
    math_ = value(rows, "train_attn", "softmax_math", None, args.quadratic_max, "peak_bytes")
    add(f"(not an issue target) train attn {args.quadratic_max}: t2r_chunked peak / softmax_math peak <= 0.25",
        ratio(chunk(args.quadratic_max, "peak_bytes"), math_), lambda v: v <= 0.25)
    add("train attn: t2r_chunked ms at 8192 / at 4096 <= 2.3", ratio(chunk(8192, "ms"), chunk(4096, "ms")),
        lambda v: v <= 2.3)
    return out


def machine_line(args) -> str:
    if args.device.type == "cuda":
        return f"CUDA {torch.cuda.get_device_name(args.device)}, torch {torch.__version__}"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"CPU {cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}, Python {platform.python_version()}"


def write_markdown(rows, args, path, command, seconds):
    lines = ["# bench.py results", "", f"`{command}` on {machine_line(args)}; {seconds / 60:.1f} min.",
             "Sizes in MiB; latency at position = length (median of the last 32 steps); tokens/s for generating "
             "`length` tokens from an empty state (s2s: source length = target length, encoding included).", ""]
    targets = check_targets(rows, args)
    lines += ["## Targets (the issue's, for CPU)", "", "| target | measured | verdict |", "|---|---|---|"]
    lines += [f"| {t} | {m} | {v} |" for t, m, v in targets] + [""]
    lines += ["## Generation, language model", ""]
    lines += table(rows, "gen", "tokens_per_s", "tokens/s") + table(rows, "gen", "latency_ms", "per-token latency")
    lines += table(rows, "gen", "state_bytes", "state (KV cache or S, z)", batch=max(args.batch_sizes))
    lines += table(rows, "gen", "rss_bytes" if args.device.type == "cpu" else "cuda_peak_bytes",
                   "process resident set" if args.device.type == "cpu" else "CUDA peak", batch=max(args.batch_sizes))
    lines += ["## Generation, encoder-decoder (Fig. 2, 3)", ""]
    lines += table(rows, "s2s", "tokens_per_s", "tokens/s") + table(rows, "s2s", "latency_ms", "per-token latency")
    lines += table(rows, "s2s", "state_bytes", "state, self and cross attention")
    lines += ["## Attention state, batch 1", ""] + table(rows, "memory", "state_bytes", "state bytes")
    lines += table(rows, "memory", "kv_over_state", "KV cache / state, measured")
    lines += table(rows, "memory", "kv_over_state_theory", "KV cache / state, theory 2Nh/(rk(d+1))")
    lines += ["## Training, forward + backward", ""]
    for section, what in (("train_attn", "one attention layer"), ("train_lm", "whole LM")):
        lines += table(rows, section, "ms", f"{what}: time") + table(rows, section, "peak_bytes", f"{what}: peak memory")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def write_plots(rows, args, out_dir) -> list:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots (pip install matplotlib)")
        return []

    def series(section, metric, batch=None):
        out = {}
        for r in rows:
            if r["section"] == section and r["metric"] == metric and (batch is None or r["batch"] == batch):
                out.setdefault((r["model"], r["batch"]), []).append((r["length"], r["value"]))
        return {key: sorted(points) for key, points in out.items()}

    def panel(ax, data, title, ylabel, scale=1.0):
        for (model, batch), points in data.items():
            points = [p for p in points if p[1] > 0]  # a floor has no state: nothing to draw on a log scale
            if not points:
                continue
            style = ":" if model in ("floor", "proj_only") else "--" if model.endswith("_unfolded") else "-"
            ax.plot([p[0] for p in points], [p[1] * scale for p in points], style, marker="o", ms=3, label=model)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("length (tokens)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)

    written = []
    plans = {
        "gen_tokens_per_s.png": [("gen", "tokens_per_s", b, f"LM generation, batch {b}", "tokens/s", 1)
                                 for b in args.batch_sizes]
                                + [("s2s", "tokens_per_s", None, "translation, batch 16, source = target", "tokens/s", 1)],
        "gen_latency.png": [("gen", "latency_ms", b, f"LM per-token latency, batch {b}", "ms at position", 1)
                            for b in args.batch_sizes]
                           + [("s2s", "latency_ms", None, "translation per-token latency", "ms at position", 1)],
        "gen_memory.png": [("gen", "state_bytes", max(args.batch_sizes), f"LM state, batch {max(args.batch_sizes)}",
                            "MiB", 2 ** -20),
                           ("s2s", "state_bytes", None, "translation state (self + cross)", "MiB", 2 ** -20),
                           ("gen", "rss_bytes" if args.device.type == "cpu" else "cuda_peak_bytes",
                            max(args.batch_sizes), "process resident set" if args.device.type == "cpu"
                            else "CUDA peak", "MiB", 2 ** -20)],
        "train.png": [("train_attn", "ms", None, "attention layer fwd+bwd", "ms", 1),
                      ("train_attn", "peak_bytes", None, "attention layer peak memory", "MiB", 2 ** -20),
                      ("train_lm", "ms", None, "whole LM fwd+bwd", "ms", 1),
                      ("train_lm", "peak_bytes", None, "whole LM peak memory", "MiB", 2 ** -20)],
    }
    for filename, panels in plans.items():
        panels = [p for p in panels if series(*p[:3])]
        if not panels:
            continue
        fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
        for ax, (section, metric, batch, title, ylabel, scale) in zip(axes[0], panels):
            panel(ax, series(section, metric, batch), title, ylabel, scale)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, filename), dpi=110)
        plt.close(fig)
        written.append(filename)
    return written


# -----------------------------------------------------------------------------

def main(argv=None):
    args = get_args(argv)
    command = "python bench.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                               "cpu" if args.device == "auto" else args.device)
    args.ckpt_config = args.ckpt_state = None
    if args.ckpt:
        if not os.path.isfile(args.ckpt):
            sys.exit(f"error: no checkpoint at {args.ckpt}")
        checkpoint = torch.load(args.ckpt, map_location="cpu", weights_only=True)
        args.ckpt_config, args.ckpt_state = checkpoint["config"], checkpoint["model"]
        print(f"shapes and weights from {args.ckpt} (feature maps of other kinds stay random)")
    torch.manual_seed(args.seed)
    print(f"bench: {machine_line(args)}", flush=True)
    os.makedirs(args.out_dir, exist_ok=True)
    start = time.perf_counter()
    rows = []
    sections = {
        "gen": lambda: bench_generation("gen", LM_MODELS, args.batch_sizes, args.lengths, args, rows,
                                        lambda name: build_lm(name, args),
                                        limits={"softmax_recompute": args.recompute_max}),
        "s2s": lambda: bench_generation("s2s", S2S_MODELS, [args.s2s_batch], args.s2s_lengths, args, rows,
                                        lambda name: (build_s2s(name, args), "step")),
        "memory": lambda: bench_memory(args, rows),
        "train_attn": lambda: bench_training("train_attn", args, rows),
        "train_lm": lambda: bench_training("train_lm", args, rows),
    }
    for section, run in sections.items():
        if section in args.only:
            t0 = time.perf_counter()
            run()
            print(f"-- {section} done in {time.perf_counter() - t0:.0f} s", flush=True)
    seconds = time.perf_counter() - start

    for r in rows:
        r["device"] = args.device.type
    with open(os.path.join(args.out_dir, "bench.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for r in rows:
            writer.writerow({**r, "value": f"{r['value']:.6g}" if isinstance(r["value"], float) else r["value"]})
    write_markdown(rows, args, os.path.join(args.out_dir, "bench.md"), command, seconds)
    plots = write_plots(rows, args, args.out_dir)
    print(f"wrote {args.out_dir}/bench.csv, bench.md{', ' + ', '.join(plots) if plots else ''} in {seconds:.0f} s")
    for target, measured, verdict in check_targets(rows, args):
        print(f"target: {target}: {measured or '-'} {verdict}")


if __name__ == "__main__":
    main()
