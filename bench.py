"""
Speed and memory of softmax attention against T2R as the sequence grows (Kasai et al., 2021, section 3.3,
Figs. 2 and 3): generation tokens/s, per-token latency, state bytes and peak memory; the time to the first token
against the prompt's length (prefill); training time and peak memory. Random weights of a small LM and translator, or the shapes and weights of --ckpt; with --mt_runs, trained
translators on their own test sentences; SRU++ (sru.py) beside them; on a GPU, the largest batch that fits at 8192
tokens (section capacity). The models: benchmarks/bench_models.py; the flags: benchmarks/bench_flags.py.

    python bench.py                          # everything (bench.md says how long it took)
    python bench.py --quick --threads 1      # a smoke run of every section in under a minute (--only: a few)
    python bench.py --ckpt out/ptb-t2r-pretrained/ckpt.pt   # shapes and weights of a trained LM
    python bench.py --mt_runs out/mt-libreoffice-en-de-softmax-random,out/mt-libreoffice-en-de-t2r-pretrained
    python bench.py --device cuda --dtype bfloat16   # a GPU: batch 1, 16, 256, training to 16384, capacity
    python bench.py --device cuda --dtype bfloat16 --only train_attn --d_model 1024 --n_head 16 --train_batch 8
                                             # one layer's training where the GPU's arithmetic, not launches, bounds it

Outputs in --out_dir (default results/bench; with --quick, out/bench-quick):
  bench.csv   one row per measurement, columns: section,model,batch,length,metric,value,unit,device
  bench.md    the ratios (T2R against softmax and against the floors), every table, the models, and
              "How it measures" (timers, memory readings); benchmarks/bench_report.py writes it and the plots
  *.png       gen_tokens_per_s, gen_latency, gen_memory, s2s_crossover, train (needs matplotlib)
Run it on an otherwise idle machine: other processes on the same cores distort every number.
"""

import statistics
import sys
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from benchmarks.bench_flags import QUICK_CAPACITY, get_args
from benchmarks.bench_models import (CAPACITY_MODELS, LM_MODELS, PAIRS, S2S_MODELS, SRU_MODELS, TRAIN_MODELS, build_lm,
                                     build_s2s, lm_config, plain_lm, train_model, transformers_twin, translator_name)
from benchmarks.bench_report import machine_line, value, write_all
from benchmarks.bench_tools import (EQ_6_7_OPS, StepTimer, alternating, cuda_reset, largest_batch, latency_at,
                                    measure_step, memory_readings, ratio_rows, row, sru_theory_ratio, step_runner,
                                    steps_per_s, theory_ratio, time_shares)
from layers.states import state_bytes
from support.checkpoints import load_checkpoint
from support.configs import config_of, is_sru
from support.fla_kernel import fla_available
from support.fast_step import eager_decoder
from support.runtime import UserError, decoding_kernels, run_main
from support.inference import prefill_by_steps
from t2r import Config
from translate import decode_speed, load_run


# -----------------------------------------------------------------------------
# Generation and the attention state

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
            snapshots[t + 1] = {**snap, **memory_readings(device, baseline)}
    times = timer.intervals()
    return times[1:], times[0], snapshots


def time_generation(section, name, model, mode, batch, lengths, args, rows) -> dict:
    """Add the rows of one model at every length; returns the latency at each. The LM: one run to the longest
    length, every shorter one is a prefix of it. The translator: one run per length, its source as long as its
    target (Fig. 2), encoding included in tokens/s."""
    src_for = lambda L: (torch.randint(1, lm_config(args).vocab_size, (batch, L), device=args.device)
                         if section == "s2s" else None)
    warm = min(16, lengths[-1])
    generate(model, mode, batch, warm, args.device, src=src_for(warm))
    plan = [(L, [L]) for L in lengths] if section == "s2s" else [(lengths[-1], lengths)]
    latencies = {}
    for n_run, reported in plan:
        runs = [generate(model, mode, batch, n_run, args.device, src=src_for(n_run), checkpoints=set(reported),
                         seed=args.seed + r) for r in range(args.gen_repeats)]
        times = [statistics.median(ts) for ts in zip(*(r[0] for r in runs))]
        encode = statistics.median(r[1] for r in runs) if section == "s2s" else 0.0
        for L in reported:
            latencies[L] = latency_at(times, L)
            readings = {"tokens_per_s": (batch * L / (sum(times[:L]) + encode), "tok/s"),
                        "latency_ms": (1e3 * latencies[L], "ms")}
            if section == "s2s":
                readings["encode_ms"] = (1e3 * encode, "ms")
            readings.update({metric: (reading, "B") for metric, reading in runs[-1][2][L].items()})
            rows += [row(section, name, batch, L, metric, v, unit) for metric, (v, unit) in readings.items()]
    return latencies


def bench_generation(section, names, batch_sizes, lengths, args, rows, make, limits=None, max_tokens=None):
    """Every model (or those of --models) at every batch size and length (up to its limit, and to max_tokens
    tokens in the batch, if any)."""
    for batch in batch_sizes:
        for name in [n for n in names if not args.models or n in args.models]:
            n = min(max(lengths), (limits or {}).get(name, max(lengths)), (max_tokens or batch * max(lengths)) // batch)
            todo = [L for L in lengths if L <= n]
            if not todo:
                continue
            model, mode = make(name)
            latencies = time_generation(section, name, model, mode, batch, todo, args, rows)
            first, last = todo[0], todo[-1]
            print(f"{section:4s} {name:17s} B={batch:<3d} L={last:<5d} "
                  f"{value(rows, section, name, batch, last, 'tokens_per_s'):9.0f} tok/s  "
                  f"latency {1e3 * latencies[first]:.2f} ms @{first} -> {1e3 * latencies[last]:.2f} ms @{last}",
                  flush=True)
            del model


def bench_prefill(args, rows):
    """Time to the first token against the prompt's length, batch 1: softmax_kv and t2r32 reading the prompt with
    their prefill (one parallel pass, in pieces of t2r.PREFILL_CHUNK) and a step a token (*_by_steps: the decoder's
    step, as generation read a prompt before prefill), and, where transformers is installed, a GPT-2 of the LM's
    shape (random weights) in one batched forward with its cache, the last position's logits: its generate()'s
    prefill. The median of --gen_repeats, after a warm-up."""
    c = lm_config(args)
    twin = None if args.quick else transformers_twin("gpt2", c.vocab_size, c.n_layer, c.d_model, c.n_head, c.d_ff,
                                                     max(args.lengths) + 1)  # --quick: the pipeline, not the baseline
    timed = {}
    for name in ("softmax_kv", "t2r32"):
        model = plain_lm(name, args)
        decoder = eager_decoder(model)
        timed[name] = lambda prompt, model=model: model.prefill(prompt, model.init_state(1))[0]
        timed[f"{name}_by_steps"] = lambda prompt, d=decoder: prefill_by_steps(d, prompt, d.init_state(1))[0]
    if twin is not None:
        twin = twin.to(args.device)
        timed["transformers_gpt2"] = lambda prompt: twin(prompt, use_cache=True, logits_to_keep=1).logits[:, -1]
    with torch.no_grad():
        for L in args.lengths:
            prompt = torch.randint(0, c.vocab_size, (1, L), device=args.device)
            for name, prefill in timed.items():
                prefill(prompt[:, :min(L, 16)])  # warm-up
                timer = StepTimer(args.device)
                timer.mark()
                for _ in range(args.gen_repeats):
                    prefill(prompt)
                    timer.mark()
                seconds = statistics.median(timer.intervals())
                rows.append(row("prefill", name, 1, L, "first_token_ms", 1e3 * seconds, "ms"))
            print(f"prefill L={L:<5d} " + "  ".join(f"{name} {value(rows, 'prefill', name, 1, L, 'first_token_ms'):.1f}"
                                                 f" ms" for name in timed), flush=True)


def bench_pairs(args, rows):
    """Each of PAIRS, a step against a step at every batch size: --pair_rounds rounds of --pair_steps greedy steps
    each, the two models taking turns (bench_tools.alternating); the median of the rounds' time ratios, and their
    range. Then a profiled round of each: the first's share of time in the ops of Eqs. 6-7 (EQ_6_7_OPS) beyond the
    second's (its feed-forward relu), and how many more op calls it makes per step."""
    for batch in args.batch_sizes:
        for a, b in PAIRS:
            if args.quick and a.endswith("_compiled"):
                continue
            runs = {name: step_runner(build_lm(name, args)[0], batch, args) for name in (a, b)}
            times = alternating(runs, args.pair_rounds)
            ratios = [x / y for x, y in zip(times[a], times[b])]
            rows += ratio_rows("pairs", f"{a}/{b}", batch, "time_ratio", ratios)
            print(f"pairs {a}/{b} B={batch}: time ratio {statistics.median(ratios):.3f} (median of "
                  f"{len(ratios)} rounds, {min(ratios):.3f} to {max(ratios):.3f})", flush=True)
            if args.device.type == "cpu" and not a.endswith("_compiled"):
                (seconds_a, calls_a), (seconds_b, calls_b) = op_seconds(runs[a]), op_seconds(runs[b])  # b: ffn relu
                share = (seconds_a - seconds_b) / statistics.median(times[a])
                rows += [row("pairs", a, batch, 0, "share_eq_6_7", share, "fraction"),
                         row("pairs", a, batch, 0, "extra_ops_per_step", (calls_a - calls_b) / args.pair_steps, "ops")]


def op_seconds(run) -> tuple:
    """(self CPU seconds of the ops of EQ_6_7_OPS, calls of every op) in one profiled call of run."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        run()
    events = profile.key_averages()
    return sum(e.self_cpu_time_total for e in events if e.key in EQ_6_7_OPS) / 1e6, sum(e.count for e in events)


def bench_memory(args, rows):
    """KV cache against RNN state at --memory_length tokens, batch 1: measured and in theory."""
    N = args.memory_length
    config = lm_config(args)

    def state_after(name, n):
        model, _ = build_lm(name, args)
        return model, generate(model, "step", 1, n, args.device, checkpoints={n})[2][n]["state_bytes"]

    def record(name, size, theory):
        rows.extend([row("memory", name, 1, N, "state_bytes", size, "B"),
                     row("memory", name, 1, N, "kv_over_state", kv / size, "x"),
                     row("memory", name, 1, N, "kv_over_state_theory", theory, "x")])
        print(f"memory {name:7s} state {size:8d} B  KV cache at {N}: {kv} B  ratio {kv / size:7.1f} "
              f"(theory {theory:7.1f})", flush=True)
    _, kv = state_after("softmax_kv", N)
    rows.append(row("memory", "softmax_kv", 1, N, "state_bytes", kv, "B"))
    for name, k in (("t2r32", 32), ("t2r32_window64", 32), ("t2r4", 4), ("elu", config.d_model // config.n_head),
                    ("rfa32", 32)):
        model, size = state_after(name, 8)  # constant
        record(name, size, theory_ratio(N, config.d_model, config.n_head, k, getattr(model.config, "window", 0)))
    for name in SRU_MODELS:  # c is constant, the attention layers' caches grow
        model, size = state_after(name, N)
        record(name, size, sru_theory_ratio(N, model.config))


def bench_capacity(args, rows):
    """The largest batch whose state fits in the GPU's memory at --capacity_length tokens, and its tokens/s there:
    the KV cache's memory against the constant state's."""
    L = args.capacity_length
    for name in [n for n in CAPACITY_MODELS if not args.models or n in args.models]:
        model, _ = build_lm(name, args)
        batch = largest_batch(model, L, args.device, most=QUICK_CAPACITY if args.quick else None)
        tokens_per_s = batch * steps_per_s(model, batch, L, args.device) if batch else 0.0
        rows += [row("capacity", name, batch, L, "largest_batch", batch, "seq"),
                 row("capacity", name, batch, L, "tokens_per_s", tokens_per_s, "tok/s")]
        print(f"capacity {name:10s} at {L} tokens: largest batch {batch}, {tokens_per_s:.0f} tok/s there", flush=True)
        del model


def bench_translators(args, rows):
    """Trained translators (--mt_runs) on their own test sentences, batch 16: greedy and beam 5, --mt_passes passes
    each, the runs taking turns (bench_tools.alternating); each run's median tokens/s, and against a softmax run
    the median of the passes' ratios; then where greedy decoding's time goes."""
    loaded = {run: load_run(run, args.device, args.mt_sentences) for run in args.mt_runs}
    names = {run: translator_name(run) for run in args.mt_runs}
    softmax = next((run for run in args.mt_runs if names[run] == "softmax"), None)
    for beam, metric in ((1, "tokens_per_s"), (5, "beam5_tokens_per_s")):
        passes = alternating({run: decoding(*loaded[run], beam, args) for run in args.mt_runs}, args.mt_passes)
        for run in args.mt_runs:
            rates = [p["tokens_per_s"] for p in passes[run]]
            rows.append(row("mt", names[run], 16, 0, metric, statistics.median(rates), "tok/s"))
            print(f"mt   {names[run]:17s} beam {beam}: {statistics.median(rates):7.0f} tok/s, the median of "
                  + ", ".join(f"{r:.0f}" for r in rates) + f" ({run})", flush=True)
            if softmax and run != softmax:
                ratios = [p["tokens_per_s"] / q["tokens_per_s"] for p, q in zip(passes[run], passes[softmax])]
                rows += ratio_rows("mt", f"{names[run]}/softmax", 16, metric + "_ratio", ratios)
    for run in args.mt_runs if args.device.type == "cpu" else []:  # the profile reads CPU time; CUDA is async
        shares = profile_greedy(run, args)
        rows += [row("mt", names[run], 16, 0, f"share_{part}", share, "fraction") for part, share in shares.items()]
        print(f"mt   {names[run]:17s} greedy time: " + ", ".join(f"{p} {s:.0%}" for p, s in shares.items()),
              flush=True)


def decoding(model, tokenizer, sentences, saved: dict, beam: int, args):
    """A function decoding the test sentences once (translate.decode_speed) with the run's own length limits."""
    return lambda: decode_speed(model, tokenizer, sentences, args.device, 16, beam, saved["max_len_a"],
                                saved["max_len_b"], saved.get("lenpen", 0.6))


def profile_greedy(run, args) -> dict:
    """Greedy decoding's time in parts (bench_tools.time_shares): one pass timed, one more under the profiler."""
    model, tokenizer, sentences, saved = load_run(run, args.device, args.mt_sentences)
    decode = lambda: decode_speed(model, tokenizer, sentences, args.device, 16, 1, saved["max_len_a"],
                                  saved["max_len_b"])
    start = time.perf_counter()
    decode()  # timed whole, as the profiled pass sees it (decode_speed's untimed first batch included)
    seconds = time.perf_counter() - start
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as profile:
        decode()
    return time_shares(profile.key_averages(group_by_input_shape=True), model.config.vocab_size, seconds)


# -----------------------------------------------------------------------------
# Training

def training_step(section, name, L, args):
    """A function running one forward + backward of `name` on L tokens: one attention layer (a mean-square
    loss) or the whole LM (cross-entropy, dropout on)."""
    torch.manual_seed(args.seed)
    model = train_model(section, name, args)
    config = lm_config(args)
    if section == "train_attn":
        x = torch.randn(args.train_batch, L, config.d_model, device=args.device, requires_grad=True)
        loss_fn = lambda: model(x).float().square().mean()
    else:
        tokens = torch.randint(0, config.vocab_size, (args.train_batch, L + 1), device=args.device)
        loss_fn = lambda: F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    backend = nullcontext
    if name == "softmax_math":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = lambda: sdpa_kernel(SDPBackend.MATH)
    autocast = torch.autocast(args.device.type, torch.bfloat16, enabled=args.dtype == "bfloat16")

    def step():
        model.zero_grad(set_to_none=True)
        if section == "train_attn":
            x.grad = None
        with backend(), autocast:
            loss_fn().backward()
    return step


def skipped(section, name, L, args) -> bool:
    """The quadratic forms only up to --quadratic_max; an SRU++ layer is not an attention layer; fla's kernel runs
    on CUDA only, where the package is installed."""
    return ((name in ("softmax_math", "t2r_quadratic") and L > args.quadratic_max)
            or (name in SRU_MODELS and section == "train_attn")
            or (name == "t2r_fla" and not (section == "train_attn" and args.device.type == "cuda" and fla_available())))


def bench_training(section, args, rows):
    for L in args.train_lengths:
        for name in [n for n in TRAIN_MODELS if not skipped(section, n, L, args)]:
            ms, peak = measure_step(training_step(section, name, L, args), args)
            rows += [row(section, name, args.train_batch, L, "ms", ms, "ms"),
                     row(section, name, args.train_batch, L, "peak_bytes", peak, "B")]
            print(f"{section:10s} {name:14s} L={L:<5d} {ms:9.1f} ms  peak {peak / 2 ** 20:8.1f} MiB", flush=True)


# -----------------------------------------------------------------------------

def main(argv=None):
    args = get_args(argv)
    decoding_kernels()
    command = "python bench.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                               "cpu" if args.device == "auto" else args.device)
    args.ckpt_config = args.ckpt_state = None
    if args.ckpt:
        checkpoint = load_checkpoint(args.ckpt)
        if is_sru(checkpoint["config"]):
            raise UserError(f"{args.ckpt} is an SRU++ model: --ckpt takes the shapes of a transformer LM "
                            f"(the SRU++ rows take the same width and depth)")
        if checkpoint["config"].get("n_encoder_layer"):
            raise UserError(f"{args.ckpt} is a translator: --ckpt takes the shapes of a language model (pass "
                            f"a finished train_mt.py run to --mt_runs)")
        config = config_of(checkpoint["config"])
        if type(config) is not Config:  # bench.py builds the paper's models: their parts would be left random
            raise UserError(f"{args.ckpt} holds a {type(config).__name__} model (a Hugging Face family's, or the window hybrid): "
                            f"--ckpt takes the paper's model; python -m experiments.gpt2_cost and "
                            f"experiments.llama_cost measure GPT-2 and Llama shapes")
        args.ckpt_config, args.ckpt_state = checkpoint["config"], checkpoint["model"]
        print(f"shapes and weights from {args.ckpt} (feature maps of other kinds stay random)")
    torch.manual_seed(args.seed)
    print(f"bench: {machine_line(args.device)}", flush=True)
    c = lm_config(args)
    print(f"the LM: {c.n_layer} layers, d_model {c.d_model}, {c.n_head} heads, d_ff {c.d_ff}, vocabulary "
          f"{c.vocab_size}", flush=True)
    start = time.perf_counter()
    rows, lm_models = [], [n for n in LM_MODELS if not (n.endswith("_graph") and args.device.type != "cuda")
                           and not (n.endswith("_compiled") and args.quick)]
    sections = {
        "gen": lambda: bench_generation("gen", [*lm_models, *SRU_MODELS], args.batch_sizes, args.lengths, args, rows,
                                        lambda name: build_lm(name, args),
                                        limits={"softmax_recompute": args.recompute_max}),
        "prefill": lambda: bench_prefill(args, rows),
        "pairs": lambda: bench_pairs(args, rows),
        "s2s": lambda: bench_generation("s2s", S2S_MODELS, args.s2s_batch_sizes, args.s2s_lengths, args, rows,
                                        lambda name: build_s2s(name, args), max_tokens=args.s2s_max_tokens),
        "memory": lambda: bench_memory(args, rows),
        "capacity": lambda: bench_capacity(args, rows),
        "train_attn": lambda: bench_training("train_attn", args, rows),
        "train_lm": lambda: bench_training("train_lm", args, rows),
        "mt": lambda: bench_translators(args, rows),
    }
    for section, run in sections.items():
        if section in args.only:
            t0 = time.perf_counter()
            run()
            print(f"-- {section} done in {time.perf_counter() - t0:.0f} s", flush=True)
    models = {"gen": {name: spec[-1] for name, spec in {**LM_MODELS, **SRU_MODELS}.items()},
              "s2s": {name: spec[-1] for name, spec in S2S_MODELS.items()}, "train": TRAIN_MODELS}
    write_all(rows, args, command, time.perf_counter() - start, models)


if __name__ == "__main__":
    run_main(main)
