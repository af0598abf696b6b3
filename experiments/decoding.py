"""
Each recipe's decoding speed and state, measured on its own weights, the models of a task taking turns
(benchmarks/bench_tools.py's alternating): a language model's greedy tokens/s at batch 1 after a prompt read by
prefill, a translator's at batch 16 on its test sentences (translate.decode_speed, the study's speed probe), and the
bytes its recurrent state (or KV cache) holds then. experiments/since_t2r.py's --stage decode runs them.
"""

import statistics
import time
from functools import partial

import torch

from benchmarks.bench_tools import alternating
from experiments.probes import SPEED_BATCH, SPEED_PASSES
from generate import traits
from layers.states import state_bytes
from support import mt_data
from support.checkpoints import load_checkpoint, model_from_checkpoint
from support.fast_step import eager_decoder
from support.inference import inference_model
from t2r import PREFILL_CHUNK
from translate import decode_speed, load_run, started

DECODE_PROMPT, DECODE_TOKENS, DECODE_PASSES = 512, 256, 5  # a block-long prompt, then greedy steps; median of passes


@torch.no_grad()
def measure_decoding(model_pts: list, length: int = DECODE_PROMPT, new: int = DECODE_TOKENS) -> list:
    """Each model's decode.json: greedy tokens/s at batch 1 after a `length`-token prompt read by prefill, `new`
    tokens (the steps alone timed, each pass's prompt the same random ids), the median of DECODE_PASSES passes after
    an untimed one, and the bytes of the state after the prompt and the new tokens (a KV cache grows; a T2R state does
    not). The models take turns, a pass each (bench_tools.alternating), so that the machine's drift falls on every
    row alike: timed one after another, a row's figure moved by up to 20% between runs of the stage on 2 cores."""
    runs = {i: partial(decoding_pass, *decoding_setup(model_pt, length), new) for i, model_pt in enumerate(model_pts)}
    passes = alternating(runs, 1 + DECODE_PASSES)  # the first round warms the kernels and the allocator up: untimed
    return [{"tokens_per_s": statistics.median(rate for rate, _ in found[1:]),
             "tokens_per_s_passes": [rate for rate, _ in found[1:]], "state_bytes": found[-1][1], "prompt": length,
             "new_tokens": new, "threads": torch.get_num_threads()} for found in passes.values()]


def decoding_setup(model_pt: str, length: int) -> tuple:
    """The model (for inference, as generate.py builds it), what steps it, and the prompt."""
    model = inference_model(model_from_checkpoint(load_checkpoint(model_pt), model_pt).eval())
    decoder = model if traits(model).own_step else eager_decoder(model)  # what generate.py's --step eager runs
    prompt = torch.randint(model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
    return model, decoder, prompt


def decoding_pass(model, decoder, prompt, new: int) -> tuple:
    """The prompt prefilled, then `new` greedy steps: (their tokens/s, the state's bytes after them)."""
    logits, state = model.prefill(prompt, decoder.init_state(1), chunk=PREFILL_CHUNK)
    start = time.perf_counter()
    for _ in range(new):
        logits, state = decoder.step(logits.argmax(-1), state)
    return new / (time.perf_counter() - start), state_bytes(state)


MT_STATE_TOKENS = 64  # a translator's state is counted for one sentence after this many target tokens


@torch.no_grad()
def measure_translations(out_dirs: list) -> list:
    """Each translator's decode.json: greedy tokens/s at batch 16 on its test sentences (the study's speed probe,
    translate.decode_speed, with the run's own length limits), the median of SPEED_PASSES passes, the translators
    taking turns (bench_tools.alternating); and the bytes of one sentence's decoder state (the cross-attention's of
    its first test sentence, and the self-attention's after MT_STATE_TOKENS steps: a KV cache grows, a T2R state
    does not)."""
    cpu, loaded = torch.device("cpu"), {out_dir: load_run(out_dir, torch.device("cpu")) for out_dir in out_dirs}

    def decoding(model, tokenizer, sentences, saved):
        return lambda: decode_speed(model, tokenizer, sentences, cpu, SPEED_BATCH, 1, saved["max_len_a"],
                                    saved["max_len_b"], saved.get("lenpen", 0.6))
    passes = alternating({out_dir: decoding(*loaded[out_dir]) for out_dir in out_dirs}, SPEED_PASSES)
    found = []
    for out_dir, runs in passes.items():
        median = sorted(runs, key=lambda p: p["tokens_per_s"])[len(runs) // 2]
        found.append({**median, "tokens_per_s_passes": [p["tokens_per_s"] for p in runs],
                      "state_bytes": translator_state_bytes(out_dir), "state_tokens": MT_STATE_TOKENS,
                      "threads": torch.get_num_threads()})
    return found


@torch.no_grad()
def translator_state_bytes(out_dir: str) -> int:
    model, tokenizer, sentences, _ = load_run(out_dir, torch.device("cpu"), 1)
    decoder = eager_decoder(model)  # as translate.py decodes
    logits, state = started(decoder, mt_data.pad(mt_data.encode(tokenizer, sentences)), [])
    for _ in range(MT_STATE_TOKENS - 1):
        logits, state = decoder.step(logits.argmax(-1), state)
    return state_bytes(state)
