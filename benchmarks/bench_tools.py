"""The instruments of bench.py: the floors (models whose self-attention is removed, or reduced to its
projections), a row of a measurement and the theory of the state sizes, a step timer, memory readings and a
peak-memory tracer for CPU training (bench.md, "How it measures", says what each number is). benchmarks/bench_report.py
writes the report."""

import copy
import os
import statistics
import resource
import sys
import time
import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from layers.states import stacked_by_head
from translate import synchronize


# -----------------------------------------------------------------------------
# Floors: the LM without its attention, to see what the attention itself costs

class NoAttention(nn.Module):
    """The floor: a self-attention whose output is zero; the rest of the model runs as usual."""

    def init_state(self, batch_size, device, dtype):
        return {}

    def step(self, x, state):
        return torch.zeros_like(x)

    def forward(self, x, key_mask=None):
        return torch.zeros_like(x)


class ProjectionsOnly(nn.Module):
    """The q | k | v | 1 projection of t2r.py's linear-attention step and the output projection of v, without
    Eqs. 6-7: what the step costs for its weights alone."""

    def __init__(self, attn):
        super().__init__()
        self.attn = attn

    def init_state(self, batch_size, device, dtype):
        attn = self.attn
        self.stacked = stacked_by_head((attn.q_proj, attn.k_proj, attn.v_proj), attn.n_head, append_one=True)
        return {}

    def step(self, x, state):  # unrolled, as support/fast_step.py's FlatStep runs t2r.py's step
        attn = self.attn
        qkv1 = F.linear(x, *self.stacked).view(x.shape[0], attn.n_head, 1, -1)  # [q | k | v | 1] by head
        v = qkv1[..., -attn.d_head - 1:-1]
        return F.linear(v.flatten(1), attn.out_proj.weight, attn.out_proj.bias)  # W_o v


def replace_self_attention(model, make):
    model = copy.deepcopy(model)
    for layer in model.layers:
        layer.self_attn = make(layer.self_attn)
    return model


# -----------------------------------------------------------------------------
# Rows and theory

def theory_ratio(n: int, d_model: int, n_head: int, k: int, window: int = 0) -> float:
    """KV cache over RNN state, per layer: 2 N h (keys and values) / (r (k (d + 1) + 2 W d)) (S: k x d and z: k
    per head, and a window's ring buffer of W keys and values)."""
    d = d_model // n_head
    return 2 * n * d_model / (n_head * (k * (d + 1) + 2 * window * d))


def sru_theory_ratio(n: int, config) -> float:
    """KV cache of the transformer over the state of SRU++ (config: an SRUConfig): 2 N h L / (L h + a 2 N d')
    (c per layer, and the keys and values of the a attention layers)."""
    attending = sum(config.has_attention(i) for i in range(config.n_layer))
    h, L = config.d_model, config.n_layer
    return 2 * n * h * L / (L * h + attending * 2 * n * config.d_attn)


def row(section, model, batch, length, metric, value, unit) -> dict:
    return dict(section=section, model=model, batch=batch, length=length, metric=metric, value=value, unit=unit)


def ratio_rows(section, name, batch, metric, ratios: list) -> list:
    """The median of paired ratios (metric) and their range (metric_min, metric_max)."""
    return [row(section, name, batch, 0, metric + suffix, f(ratios), "x")
            for suffix, f in (("", statistics.median), ("_min", min), ("_max", max))]


def alternating(runs: dict, rounds: int) -> dict:
    """name -> a function returning one measurement; -> name -> its `rounds` measurements, taken in turns (forward
    in even rounds, backward in odd ones). A slow spell of a shared machine then hits both sides of a ratio taken
    round by round, and no side always runs first."""
    out = {name: [] for name in runs}
    for r in range(rounds):
        for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            out[name].append(runs[name]())
    return out


def step_runner(model, batch: int, args):
    """A function timing --pair_steps greedy steps of model, each call going on from where the last stopped (the
    position only grows by rounds x steps); one untimed call first (a compiled model compiles)."""
    state, token = model.init_state(batch), torch.zeros(batch, dtype=torch.long, device=args.device)

    def run() -> float:
        nonlocal state, token
        synchronize(args.device)
        start = time.perf_counter()
        for _ in range(args.pair_steps):
            logits, state = model.step(token, state)
            token = logits.argmax(-1)
        synchronize(args.device)
        return time.perf_counter() - start
    run()
    return run


def latency_at(times, position, window=32):
    """Median seconds of the steps that produced tokens position-window+1 .. position."""
    return statistics.median(times[max(0, position - window): position])


# -----------------------------------------------------------------------------
# Instruments: timer, memory readings, the CPU peak-memory tracer

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


def measure_step(step, args) -> tuple:
    """(median ms of --repeats steps after a warmup, peak bytes of one more step)."""
    step()
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
        return ms, torch.cuda.max_memory_allocated() - baseline
    with PeakMemory() as pm:
        step()
    return ms, pm.peak


# The parts of a translator's decoding time (bench.py's profiled pass): a matrix product with the vocabulary as one
# dimension is the output head; the other matrix products are the projections and feed-forward layers; the fused
# softmax attention kernel (SDPA) of one new token over the KV caches is what T2R replaces (the encoder, softmax in
# both, reads the whole source at once); the rest is everything else.
TIME_PARTS = ("head", "linear", "sdpa", "rest")
# The ops of Eqs. 6-7 in t2r.py's linear-attention step (the feature map, [S | z] += ..., phi(q)^T [S | z],
# the normalization): what a T2R step runs beyond the same weights' projections (bench.py's section pairs).
EQ_6_7_OPS = ("aten::relu", "aten::addcmul_", "aten::bmm", "aten::abs", "aten::clamp_min", "aten::div")


def time_shares(events, vocab_size: int, seconds: float) -> dict:
    """Each part's share of `seconds` (a pass timed without the profiler, whose own cost is left out), from
    torch.profiler's key_averages(group_by_input_shape=True): self CPU time, so an op inside another counts once."""
    spent = dict.fromkeys(TIME_PARTS[:-1], 0.0)
    for event in events:
        if event.key in ("aten::addmm", "aten::mm"):
            part = "head" if any(vocab_size in shape for shape in event.input_shapes) else "linear"
        elif "scaled_dot_product" in event.key and event.input_shapes and event.input_shapes[0][2:3] == [1]:
            part = "sdpa"  # q: (B, H, 1, d)
        else:
            continue
        spent[part] += event.self_cpu_time_total / 1e6
    shares = {part: t / seconds for part, t in spent.items()}
    return {**shares, "rest": 1 - sum(shares.values())}


def memory_readings(device, baseline: int) -> dict:
    """CUDA: the peak allocated since cuda_reset, less its baseline. CPU: the resident set now (Linux, else 0)
    and the process's peak resident set so far (it only grows during a run)."""
    if device.type == "cuda":
        return {"cuda_peak_bytes": torch.cuda.max_memory_allocated() - baseline}
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        rss = 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"rss_bytes": rss, "peak_rss_bytes": peak if sys.platform == "darwin" else peak * 1024}  # B / KiB


def cuda_reset(device) -> int:
    """Empty the CUDA cache and reset its peak; returns the bytes allocated now (0 on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    return 0


class PeakMemory(TorchDispatchMode):
    """Peak bytes of the tensor storages created inside the `with` block, on CPU. Sees every aten op (forward
    and backward), adds the bytes of each new output storage and subtracts them when it is freed: the peak of
    activations, saved tensors, gradients and temporaries; not scratch space inside one kernel, nor the inputs
    and weights that existed before the block."""

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


# -----------------------------------------------------------------------------
# Capacity: the largest batch whose generation state fits on the GPU at a given length

def state_at(state: dict, length: int) -> dict:
    """A fresh generation state made to look as after `length` tokens: the position advanced, and each KV cache
    holding `length` entries in the capacity its doubling has reached by then (zeros: only the memory matters).
    A constant-size state is already as large as it will ever be."""
    state["pos"] = length
    for layer in state["layers"]:
        cache = layer["self"]
        if "k" in cache:
            capacity = max(16, 1 << (length - 1).bit_length())  # the power of two append_to_cache grows to
            cache["k"], cache["v"] = (t.new_zeros(*t.shape[:2], capacity, t.shape[3]) for t in (cache["k"], cache["v"]))
            cache["length"] = length
    return state


def fits(model, batch: int, length: int, device) -> bool:
    """Whether the state of `batch` sequences at position length - 1 and the step that writes token `length` fit
    in the GPU's memory."""
    state = tokens = None
    try:
        state = state_at(model.init_state(batch), length - 1)
        tokens = torch.zeros(batch, dtype=torch.long, device=device)
        model.step(tokens, state)
        torch.cuda.synchronize(device)
        return True
    except torch.OutOfMemoryError:
        return False
    finally:
        state = tokens = None  # an out-of-memory traceback holds this frame: drop its tensors before emptying the cache
        torch.cuda.empty_cache()


def largest_batch(model, length: int, device, most: int | None = None) -> int:
    """Doubling, then bisection to within 1/64: the largest batch that fits (0 if not even one sequence), or `most`
    if that fits (--quick: a smoke test must not take the whole GPU from the tests beside it)."""
    if most and fits(model, most, length, device):
        return most
    low, high = 0, 1
    while fits(model, high, length, device):
        low, high = high, 2 * high
    while high - low > max(1, low // 64):
        middle = (low + high) // 2
        low, high = (middle, high) if fits(model, middle, length, device) else (low, middle)
    return low


def steps_per_s(model, batch: int, length: int, device, steps: int = 5) -> float:
    """Steps per second of `batch` sequences at position length - 1 (the state is reused: timing only)."""
    state = state_at(model.init_state(batch), length - 1)
    tokens = torch.zeros(batch, dtype=torch.long, device=device)
    model.step(tokens, state)
    timer = StepTimer(device)
    timer.mark()
    for _ in range(steps):
        state["pos"] -= 1  # the same position again, so the KV cache does not grow past its capacity
        for cache in (layer["self"] for layer in state["layers"] if "length" in layer["self"]):
            cache["length"] -= 1
        model.step(tokens, state)
        timer.mark()
    return 1 / statistics.median(timer.intervals())
