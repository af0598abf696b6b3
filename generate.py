"""
Sample from a language-model checkpoint with the recurrent form: constant memory per token.

    python generate.py                                       # the T2R model of `train_lm.py --init pretrained`
    python generate.py --ckpt out/ptb-softmax-random/model.pt # the softmax teacher, with a KV cache
    python generate.py --prompt "the company said" --num_tokens 100 --temperature 0.8 --top_k 40
    python generate.py --prompt "the" --prompt "a new york bank said"   # a batch: greedy, each as it would be alone
    python generate.py --mode recompute                      # re-run the whole prefix at every token, to compare
    python generate.py --check                               # recurrent logits against one parallel pass
    python generate.py --compile --num_tokens 2000           # the recurrent step through torch.compile
    python generate.py --ckpt out/ptb-t2r-gpt2/model.pt      # GPT-2 converted (support/hf.py): at most 1024 positions
    python generate.py --prefill step                        # read the prompt a step a token, to compare
    python generate.py --step model                          # t2r.py's step as the paper writes it, to compare

The prompt is read by the model's prefill, in one parallel pass as a transformer reads it (t2r.py: the chunked form
of Eq. 4, its state handed to the step; a softmax layer's KV cache filled at once); the time to the first token and
the decoding speed after it are printed apart. The recurrent step is t2r.py's (`model.step`, Eqs. 6-7 on S and z;
--step model runs it as written), run fast by default (support/fast_step.py's FlatStep: its layers without module
calls, S and z fused as [S | z]; the same logits within rounding); on CUDA it is recorded once as a CUDA graph and
replayed at every token. Models that step their own way (a family's with rotary positions or grouped heads, SRU++) run
their own step, and the first line printed says so. T2R checkpoints are folded first (Eq. 8): the feature map is
merged into W_q, W_k. SRU++ checkpoints (`train_lm.py --arch sru++`) generate the same way: their state is c per
layer, plus the keys and values of their attention layers.
"""

import time
from dataclasses import dataclass
from functools import partial

import torch

from sru import SRUppLM
from support import data
from support.checkpoints import load_checkpoint, model_from_checkpoint
from support.fast_step import CapturedStep, FlatStep, compile_step, eager_decoder
from support.inference import inference_model, is_folded, prefill_by_steps
from support.run_files import check_identity
from support.runtime import (Parser, UserError, check_fits, decoding_kernels, device_name, get_device,
                             non_negative_float, non_negative_int, positive_int, run_main, seed)
from layers.states import state_bytes
from t2r import PREFILL_CHUNK, TransformerBase


# -----------------------------------------------------------------------------
# The RNN loop

def generate(model, state, prompt, num_tokens: int, pick, prefill=None):
    """The RNN way: the prompt read into the state, then each new token through model.step once, the state carrying
    the prefix (nothing grows with num_tokens). prompt (B, T): one prompt, a row per sample (or prompts of one length);
    state: model.init_state(B), updated in place (without autograd). prefill(prompt, state) -> (the last position's
    logits, state): the model's prefill (one parallel pass, as a transformer reads a prompt), by default t2r.py's
    reference, a step a token. Yields each new token (B,) and the logits (B, V) that picked it."""
    logits, state = (prefill or partial(prefill_by_steps, model))(prompt, state)
    for i in range(num_tokens):
        token = pick(logits)
        yield token, logits
        if i + 1 < num_tokens:
            logits, state = model.step(token, state)  # every layer's recurrent step (Eqs. 5-7), then the output layer


def sample(logits, temperature: float, top_k: int, generator: torch.Generator, tokens: int | None = None):
    """logits (B, V) -> next tokens (B,). Temperature 0, or one that float32 cannot tell from 0, is argmax. tokens:
    the tokenizer's count, where the model's table has rows past it (Qwen2.5 pads it): those are never picked."""
    logits = logits[..., :tokens]
    if temperature < torch.finfo(torch.float32).tiny:  # 1e-300 is 0 in float32: the division would give NaN
        return logits.argmax(-1)
    logits = logits.float()
    logits = (logits - logits.amax(-1, keepdim=True)) / temperature  # <= 0 first: a tiny temperature cannot overflow
    if top_k:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)[:, 0]


# -----------------------------------------------------------------------------
# A batch of prompts of different lengths, and the baseline that keeps no state

def generate_ragged(model, state, prompt, lengths, num_tokens: int, pick, prefill=None):
    """generate for prompts of different lengths: prompt (B, T) holds row b's prompt in its first lengths[b] tokens
    (lengths (B,); the rest is never read). The same loop from the shortest prompt's end on, with a pick that hands a
    row still in its prompt its prompt's next token: every row feeds its own tokens, no padding enters a state, so a
    greedy pick is the one the prompt gets alone (a sampled one draws from the same distribution). Yields every row's
    token at positions shortest to longest + num_tokens - 1: row b's picks are at lengths[b] onwards (see picks). The
    shortest prompt's length is prefilled, the rest of the longer prompts stepped."""
    shortest, longest = int(lengths.min()), prompt.shape[1]  # read once: the loop never waits on the device
    positions = iter(range(shortest, longest + num_tokens))  # of the tokens picked, in turn

    def pick_or_prompt(logits):  # no pick (no random draw) before the shortest prompt's end
        token, position = pick(logits), next(positions)
        return torch.where(lengths <= position, token, prompt[:, position]) if position < longest else token
    return generate(model, state, prompt[:, :shortest], longest - shortest + num_tokens, pick_or_prompt, prefill)


def picks(kept_tokens: list, lengths: list, first: int, num_tokens: int) -> list:
    """Each row's picks, from the tokens (B,) a loop yielded at every position from `first` on (read back once)."""
    kept = torch.stack(kept_tokens, 1).tolist()  # (B, steps)
    return [kept[b][length - first:][:num_tokens] for b, length in enumerate(lengths)]


@torch.no_grad()
def generate_recompute(model, prompt, num_tokens: int, pick):
    """The transformer way without a cache: run the whole sequence again for every new token (it grows: the
    baseline). Prompts of one length; yields as generate does; no state."""
    sequence = prompt
    for _ in range(num_tokens):
        logits = model(sequence)[:, -1]
        token = pick(logits)
        yield token, logits
        sequence = torch.cat([sequence, token[:, None]], dim=1)


# -----------------------------------------------------------------------------
# --check: the logits the loop picked with, against one parallel pass

@torch.no_grad()
def check(model, rows, picked, kept_logits, first: int) -> float:
    """The largest difference between each row's generation logits and one parallel pass over its prompt and picks;
    kept_logits[i] chose the tokens at position first + i."""
    logits, worst = torch.stack(kept_logits, 1), 0.0  # (B, steps, V)
    for b, (ids, new) in enumerate(zip(rows, picked)):
        sequence = torch.tensor([ids + new[:-1]], device=logits.device)
        parallel = model(sequence)[0, len(ids) - 1:]
        worst = max(worst, (parallel - logits[b, len(ids) - first: len(ids) - first + len(new)]).abs().max().item())
    return worst


# -----------------------------------------------------------------------------
# SRU++ beside t2r.py's models. Both have init_state and step, all the loops above need; what the rest of
# generate.py reads of a model is read here, the one place that says how SRU++ (sru.py) differs.

@dataclass
class Traits:
    """What generate.py reads of a model besides init_state and step."""
    what: str           # what generates (the first line)
    form: str           # the state its recurrent form keeps
    kv_layers: int      # layers whose state is a KV cache, which grows with the length
    kv_width: int       # a layer's keys' width (and its values'): grouped-query attention keeps n_kv_head heads
    max_positions: int  # where learned positions (GPT-2's) end; 0: no end
    own_step: bool      # it steps with its own step only: no step_layers to compile or record as a CUDA graph


def traits(model) -> Traits:
    """A t2r.py model's traits, or SRU++'s: it describes itself, steps eagerly, has no positions (the recurrence
    orders) and no KV-cache layers counted (its attention layers' keys, d' wide, are left out of the estimate); its
    state is set beside the KV cache of a transformer of its depth and width d."""
    c = model.config
    if isinstance(model, SRUppLM):
        return Traits(*model.describe(), kv_layers=0, kv_width=c.d_model, max_positions=0, own_step=True)
    kinds, window = c.layer_kinds(), getattr(c, "window", 0)  # a family's config (families.py) or the hybrid's
    window = f" with a softmax window of {window}" if window else ""
    folded = " (folded, Eq. 8)" if is_folded(model) else ""
    form = "KV cache" if set(kinds) == {"softmax"} else "recurrent state (RNN)"
    kv_width = c.kv_width() if hasattr(c, "kv_width") else c.d_model  # grouped-query heads keep fewer
    return Traits(f"attention {', '.join(sorted(set(kinds)))}{window}{folded}", form, kinds.count("softmax"),
                  kv_width, getattr(c, "max_positions", 0), own_step=False)


# -----------------------------------------------------------------------------
# What runs the step (support/fast_step.py)

def make_decoder(model, args, length: int):
    """What runs the recurrent step (--step, --compile): the model's step as written (--step model), compiled, the
    fast step (FlatStep, or the model's own where it steps its own way), or that recorded as a CUDA graph of `length`
    steps. SRU++ runs its own step, eager."""
    if traits(model).own_step:
        if args.step == "graph" or args.compile:
            raise UserError(f"{type(model).__name__} steps with its own step only: use --step eager, without --compile")
        return model
    if args.compile:
        return compile_step(model)
    if args.step == "model":
        return model
    if args.step == "eager":
        return eager_decoder(model)
    try:
        return CapturedStep(model, length)
    except ValueError as error:
        if args.step == "graph":
            raise UserError(f"--step graph: {error}") from None
        return eager_decoder(model)  # auto: a KV cache grows, so it cannot be recorded; the eager step runs it


# -----------------------------------------------------------------------------
# The command line

def get_args(argv=None):
    p = Parser(prog="generate.py", description="Generate text from a t2r language-model checkpoint.")
    p.add_argument("--ckpt", default="out/ptb-t2r-pretrained/model.pt", help="model.pt (or ckpt.pt) written by train_lm.py")
    p.add_argument("--prompt", action="append", help="text to continue, fed as a line of the corpus: after an end of "
                   "line, with the leading space its lines have (words outside the vocabulary become <unk>); repeat "
                   "it for a batch of prompts, each continued as alone: greedy, the same tokens; sampled, from the "
                   "same distribution (default: the)")
    p.add_argument("--num_tokens", type=positive_int, default=100, help="tokens to generate per sample")
    p.add_argument("--num_samples", type=positive_int, default=1, help="samples, generated as one batch")
    p.add_argument("--temperature", type=non_negative_float, default=1.0, help="softmax temperature; 0 means greedy (argmax)")
    p.add_argument("--top_k", type=non_negative_int, default=0, help="sample among the k most likely tokens (0: all)")
    p.add_argument("--seed", type=seed, default=1337, help="seed of the sampling generator")
    p.add_argument("--mode", default="recurrent", choices=["recurrent", "recompute"],
                   help="recurrent: one step per token with a state (RNN or KV cache); recompute: whole prefix each time")
    p.add_argument("--step", default="auto", choices=["auto", "model", "eager", "graph"],
                   help="how the recurrent step runs: model, t2r.py's step as written (model.step, S and z apart); "
                   "eager, the fast step (support/fast_step.py: unrolled, [S | z] fused) where the model fits it, else "
                   "its own; graph, the eager step recorded once as a CUDA graph and replayed (CUDA only); auto: graph "
                   "where it can run, else eager")
    p.add_argument("--compile", action="store_true", help="torch.compile t2r.py's step (--step model, eager or auto)")
    p.add_argument("--prefill", default="parallel", choices=["parallel", "step"],
                   help="how the prompt is read into the state: parallel, in one pass as a transformer reads it (the "
                   "model's prefill); step, a step a token (prefill_by_steps, the reference, to compare)")
    p.add_argument("--prefill_chunk", type=positive_int, default=PREFILL_CHUNK,
                   help="--prefill parallel reads a longer prompt in pieces of this many tokens (bounded memory)")
    p.add_argument("--no_fold", action="store_true", help="keep the T2R feature map separate (Eq. 8 not applied; "
                   "the fast step still folds a copy of decay.py's layers, which never fold themselves: --step model "
                   "for none)")
    p.add_argument("--check", action="store_true", help="compare the generation logits with one parallel pass")
    p.add_argument("--device", type=device_name, default="auto", help="auto, cpu, cuda, mps")
    args = p.parse_args(argv)
    args.prompt = args.prompt or ["the"]
    try:
        [prompt.encode("utf-8") for prompt in args.prompt]
    except UnicodeEncodeError:  # bytes that are not UTF-8 reach argv as lone surrogates
        p.error("--prompt is not UTF-8 text: pass it in UTF-8 (e.g. convert with iconv -t utf-8)")
    if args.compile and args.step == "graph":
        p.error("--compile compiles t2r.py's step: it cannot go with --step graph")
    if args.mode == "recompute" and (args.step != "auto" or args.compile):
        p.error("--step and --compile choose the recurrent step: they need --mode recurrent")
    if args.mode == "recompute" and args.prefill != "parallel":
        p.error("--prefill chooses how a state reads the prompt: it needs --mode recurrent")
    return args


def load_model(args, device):
    """The checkpoint's language model (folded, Eq. 8, unless --no_fold) in eval mode, its tokenizer, and the length
    of the sequences it was trained on (None where its flags do not say)."""
    checkpoint = load_checkpoint(args.ckpt)
    if checkpoint["config"].get("n_encoder_layer"):
        raise UserError(f"{args.ckpt} is a translation model, not a language model")
    model = model_from_checkpoint(checkpoint, args.ckpt).to(device).eval()
    model = model if args.no_fold else inference_model(model)
    lm = load_tokenizer(checkpoint)
    if lm.vocab_size > model.config.vocab_size:  # fewer is a table padded past the tokenizer (Qwen2.5's): its rows stay
        raise UserError(f"the tokenizer has {lm.vocab_size} tokens, {args.ckpt} has {model.config.vocab_size}: "
                        f"its data cache changed; retrain or restore the cache")
    check_identity(checkpoint, {"tokenizer": lm.tokenizer_sha1}, args.ckpt)  # same words, same ids
    trained = checkpoint.get("args", {}).get("block_size")  # the longest sequence it was trained on
    return model, lm, trained if isinstance(trained, int) and not isinstance(trained, bool) else None


SAVED_DATA_FLAGS = {"dataset": (str,), "data_dir": (str, type(None)), "tokenizer": (str,), "cache_dir": (str,),
                    "vocab_size": (int, type(None))}  # what load_tokenizer reads of a checkpoint's flags


def load_tokenizer(checkpoint):
    """The checkpoint's own tokenizer (train_lm.py keeps it with the weights), or for a run of earlier code the one
    in the token cache its training wrote."""
    if "tokenizer" in checkpoint:
        try:
            return data.saved_codec(checkpoint["tokenizer"])
        except data.DataError as error:
            raise UserError(f"the checkpoint's tokenizer is damaged ({error}): restore a good copy, or "
                            f"retrain") from None
    saved = checkpoint.get("args", {})
    wrong = next((name for name, kinds in SAVED_DATA_FLAGS.items() if name in saved
                  and (not isinstance(saved[name], kinds) or isinstance(saved[name], bool))), None)
    if wrong:
        kind = SAVED_DATA_FLAGS[wrong][0].__name__
        raise UserError(f"the checkpoint's saved --{wrong} is {saved[wrong]!r}, not a {kind}: it is damaged or "
                        f"hand-made; retrain, or restore a good copy")
    try:
        return data.read_prepared(saved.get("dataset", "ptb"), saved.get("data_dir"),
                                  tokenizer=saved.get("tokenizer", "word"),
                                  vocab_size=saved.get("vocab_size") if saved.get("tokenizer") == "bpe" else None,
                                  cache_dir=saved.get("cache_dir", "data/cache"))
    except data.DataError as error:
        raise UserError(f"cannot read the checkpoint's tokenizer from the token cache its training wrote ({error}); "
                        f"relative paths are read from the folder generate.py runs in: run it where the model was "
                        f"trained") from None


def prompt_rows(model, lm, args, device, trained: int | None = None) -> list:
    """Each --prompt's ids once per sample, a row each, after the checks that they can be generated. A prompt is
    encoded as a line of the corpus (data.TextCodec.encode_prompt): its row starts with the end of a line."""
    try:
        prompts = [lm.encode_prompt(text) for text in args.prompt]
        empty = lm.encode_prompt("")  # the end of a line alone
    except data.DataError as error:
        raise UserError(str(error)) from None
    if empty in prompts:
        raise UserError("a --prompt is empty: give at least one word to continue")
    if lm.line_prefix and any(text and not text[0].isspace() for text in args.prompt):
        print(f"each --prompt is encoded as a line of the corpus, after a line's end and starting with "
              f"{lm.line_prefix!r} as its lines do")
    if args.mode == "recompute" and len(set(map(len, prompts))) > 1:
        raise UserError("--mode recompute runs prompts of one length (it keeps no state per row): use --mode "
                        "recurrent, or one --prompt")
    longest = max(map(len, prompts))
    check_positions(traits(model).max_positions, longest, args)
    note_past_training(trained, longest, args)
    check_generation_fits(model, args, device, longest, len(prompts) * args.num_samples)
    return [ids for ids in prompts for _ in range(args.num_samples)]


def check_positions(limit: int, prompt_length: int, args):
    """Learned positions (GPT-2's) end at `limit` (0: no end): the prompt and all but the last new token are fed in."""
    if limit and prompt_length + args.num_tokens - 1 > limit:
        room = f"use --num_tokens {limit + 1 - prompt_length} at most" if prompt_length <= limit else "shorten --prompt"
        raise UserError(f"the prompt's {prompt_length} tokens and --num_tokens {args.num_tokens} run past the {limit} "
                        f"positions {args.ckpt} has learned: {room}")


def note_past_training(trained: int | None, prompt_length: int, args):
    """Positions past the training's sequences are not refused where nothing ends there (sinusoids, rotary angles,
    a recurrence), but nothing was learned there either: said once, before generating."""
    last = prompt_length + args.num_tokens - 1  # the positions fed in: the prompt and all but the last new token
    if trained and last > trained:
        print(f"note: the prompt's {prompt_length} tokens and --num_tokens {args.num_tokens} run to position {last}, "
              f"past the {trained} tokens {args.ckpt} was trained on (its --block_size): what it generates there, "
              f"it was never trained to")


def check_generation_fits(model, args, device, prompt_length: int, rows: int):
    """What generation holds, refused in one line where it cannot fit. Each row (a prompt's sample): its state at the
    last token (a KV cache grows, and doubles when full) and a step's logits with sampling's copies (3 x 4 bytes a
    word); with several rows the tokens kept to print them (8 bytes each), with --check every step's logits too."""
    c, t, element = model.config, traits(model), next(model.parameters()).element_size()
    length = prompt_length + args.num_tokens
    state = state_bytes(model.init_state(1)) + t.kv_layers * 2 * 2 * length * t.kv_width * element
    kept = 8 * args.num_tokens * (rows > 1 or args.check) + 4 * c.vocab_size * (length - 1) * args.check
    check_fits(rows * (state + 3 * 4 * c.vocab_size + kept), device, f"--num_samples {args.num_samples} of "
               f"--num_tokens {args.num_tokens}" + (f" for {len(args.prompt)} prompts" if len(args.prompt) > 1 else ""),
               "lower --num_samples, --num_tokens or the prompts")


def text_of(lm, ids) -> str:
    """A row's text, without the end of a line it starts with."""
    return lm.decode(ids).removeprefix("\n")


def first_line(model, decoder, args) -> str:
    """What generates, in which --mode, and (recurrent) the state it keeps and what runs its step: t2r.py's as written,
    compiled, the fast one, or a model's own (one that steps its own way: a Llama's, SRU++'s)."""
    t = traits(model)
    if args.mode == "recompute":
        return f"{args.ckpt}: {t.what}, mode recompute"
    recorded = isinstance(decoder, CapturedStep)
    if isinstance(decoder.decoder if recorded else decoder, FlatStep):
        step = "the fast step (support/fast_step.py's FlatStep: t2r.py's step unrolled, [S | z] fused)"
    elif type(model).step is TransformerBase.step:
        step = "t2r.py's step as written (model.step, S and z apart)"
    else:
        step = f"{type(model).__module__}.py's own step (it steps its own way: the fast step is for models without " \
               "rotary positions or grouped heads)"
    step = f"CUDA graph of {step}" if recorded else f"{step}, compiled" if args.compile else step
    prefill = "prompt read in one parallel pass" if args.prefill == "parallel" else "prompt read a step a token"
    return f"{args.ckpt}: {t.what}, mode recurrent with a {t.form}, {step}; {prefill}"


def token_stream(decoder, state, rows, args, pick, device, model=None):
    """What --mode generates from the rows: the RNN loop (over prompts of different lengths where they are), or the
    whole prefix again at every token. The rows are padded with 0s, never read. --prefill parallel reads the prompt
    with model's prefill (the decoder's weights, in one pass), step with the decoder's step."""
    longest = max(map(len, rows))
    prompt = torch.tensor([ids + [0] * (longest - len(ids)) for ids in rows], device=device)
    if args.mode == "recompute":
        return generate_recompute(decoder, prompt, args.num_tokens, pick)
    prefill = (partial(model.prefill, chunk=args.prefill_chunk) if args.prefill == "parallel" and model is not None
               else partial(prefill_by_steps, decoder))
    if len(set(map(len, rows))) == 1:
        return generate(decoder, state, prompt, args.num_tokens, pick, prefill)
    lengths = torch.tensor([len(ids) for ids in rows], device=device)
    return generate_ragged(decoder, state, prompt, lengths, args.num_tokens, pick, prefill)


class Stream:
    """What the loop's picks become: what each adds to the decoded text, printed as it comes (one row: BPE pieces join
    up, <eos> is a new line), and only what the end needs kept: several rows' tokens, printed then, and for --check
    every step's logits. No row's token is read back while the loop runs (it would wait for the device), but the one
    row's that is printed. first_at: when the first token was picked (clock(): seconds, once the device is done)."""

    def __init__(self, rows, lm, args, clock):
        self.rows, self.lm, self.args, self.clock = rows, lm, args, clock
        self.recent, self.kept_tokens, self.kept_logits, self.first_at = list(rows[0][-7:]), [], [], None

    def take(self, token, logits):
        self.first_at = self.first_at if self.first_at is not None else self.clock()  # the prompt read, a pick made
        if len(self.rows) == 1:  # a short window is decoded: O(1) a token
            before = self.lm.decode(self.recent)
            self.recent.append(int(token[0]))
            print(self.lm.decode(self.recent)[len(before):], end="", flush=True)
            del self.recent[:-7]
        if len(self.rows) > 1 or self.args.check:
            self.kept_tokens.append(token)
        if self.args.check:
            self.kept_logits.append(logits)


def report(model, lm, rows, args, seconds: float, state, kept_tokens: list, kept_logits: list, first: float):
    """Several rows' texts, the time to the first token and the decoding speed after it, the state's size beside a
    KV cache's, and --check's difference."""
    shortest = min(map(len, rows))  # the position of the first token kept: the shortest prompt's end
    picked = picks(kept_tokens, [len(ids) for ids in rows], shortest, args.num_tokens) if kept_tokens else []
    for b, ids in enumerate(rows if len(rows) > 1 else []):
        which = f"prompt {b // args.num_samples}, " if len(args.prompt) > 1 else ""
        print(f"--- {which}sample {b % args.num_samples}\n{text_of(lm, ids + picked[b])}")
    how = ("recomputed" if args.mode == "recompute" else "read in one parallel pass" if args.prefill == "parallel"
           else "read a step a token")
    print(f"\ntime to the first token: {first:.3f} s (the prompt's {max(map(len, rows))} tokens {how})")
    if args.num_tokens > 1:
        rest = len(rows) * (args.num_tokens - 1)
        print(f"decoding: {rest / max(seconds - first, 1e-9):,.1f} tokens/s ({len(rows)} x {args.num_tokens - 1} "
              f"tokens after the first in {seconds - first:.2f} s)")
    if state is not None:
        print_state_size(model, state, len(rows), max(map(len, rows)) + args.num_tokens)
    if args.check:
        print(f"check: max |recurrent - parallel| logits = {check(model, rows, picked, kept_logits, shortest):.2e}")


def print_state_size(model, state, batch_size: int, length: int):
    """The recurrent state beside what a KV cache of the same length would hold (K and V, every layer)."""
    c, p = model.config, next(model.parameters())
    kv_bytes = 2 * c.n_layer * batch_size * length * traits(model).kv_width * p.element_size()
    print(f"state after {length} tokens: {state_bytes(state) / 1024:,.1f} KiB; "
          f"a KV cache of that length holds {kv_bytes / 1024:,.1f} KiB")


def main():
    args = get_args()
    decoding_kernels()
    device = get_device(args.device)
    model, lm, trained = load_model(args, device)
    rows = prompt_rows(model, lm, args, device, trained)  # each prompt's samples
    recurrent = args.mode == "recurrent"
    decoder = make_decoder(model, args, max(map(len, rows)) + args.num_tokens) if recurrent else model
    print(first_line(model, decoder, args))
    pick = partial(sample, temperature=args.temperature, top_k=args.top_k, tokens=lm.vocab_size,
                   generator=torch.Generator(device=device).manual_seed(args.seed))
    if len(rows) == 1:
        print(text_of(lm, rows[0]), end="", flush=True)
    start = time.time()

    def clock():  # seconds since start, once the device has done what it was given
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.time() - start
    state = decoder.init_state(len(rows)) if recurrent else None
    stream = Stream(rows, lm, args, clock)
    for token, logits in token_stream(decoder, state, rows, args, pick, device, model):  # the loop: the RNN's
        stream.take(token, logits)
    seconds = clock()
    print()
    report(model, lm, rows, args, seconds, state, stream.kept_tokens, stream.kept_logits, stream.first_at)


if __name__ == "__main__":
    run_main(main)
