"""
Translate with a trained translator: batched beam search or greedy decoding on recurrent states, and BLEU.

    echo "Click OK." | python translate.py --ckpt out/mt-libreoffice-en-de-t2r-pretrained/model.pt
    python translate.py input.en --beam 1 > output.de        # greedy; one line out per line in
    python translate.py --ckpt out/mt-libreoffice-en-de-softmax-random/model.pt   # the teacher, with a KV cache
    echo "Click OK." | python translate.py --prefix "Klicken"   # every translation starts so: read in one pass

T2R, ELU and RFA decoders step with constant-size states (S, z); softmax keeps a KV cache. T2R models are
folded first (Eq. 8). A forced --prefix is read after <s> by the decoder's prefill, in one parallel pass (--prefill
step: a step a token), then decoding goes on from its state. train_mt.py uses the same functions for its BLEU scores.
"""

import contextlib
import json
import os
import sys
import time
from functools import partial

import sacrebleu
import torch
import torch.nn.functional as F
from tqdm import tqdm

from support import mt_data
from support.checkpoints import load_checkpoint, model_from_checkpoint
from support.corpora import text_lines
from support.fast_step import compile_step, eager_decoder
from support.inference import inference_model, prefill_by_steps
from support.mt_data import BOS_ID, EOS_ID, PAD_ID
from support.runtime import (Parser, UserError, atomic_write, check_fits, decoding_kernels, device_name, finite_float,
                             get_device, length_factor, length_term, positive_int, resolve_device,
                             run_main)


# -----------------------------------------------------------------------------
# Decoding. Every function takes src (B, S), padded with PAD_ID, and returns token lists without </s>.

def max_lengths(src, max_len_a: float, max_len_b: int) -> torch.Tensor:
    """(B,) the longest hypothesis of each sentence, </s> included."""
    return ((src != PAD_ID).sum(1).float() * max_len_a).long() + max_len_b


def started(model, src, prefix: list, prefill=None) -> tuple:
    """The decoder's state once it has read <s> and the forced prefix (token ids: the start every translation
    takes), and the logits of the token after them: prefill(tokens (B, n), state), the model's in one parallel
    pass, or by default t2r.py's reference, a step a token. The encoder runs once, in init_state."""
    state = model.init_state(src)  # the encoder and the cross-attention states: once per sentence
    start = torch.tensor([[BOS_ID, *prefix]] * src.shape[0], dtype=torch.long, device=src.device)
    return (prefill or partial(prefill_by_steps, model))(start, state)


@torch.no_grad()
def greedy_decode(model, src, max_len_a=1.5, max_len_b=10, prefix: list = (), prefill=None) -> list:
    """Argmax decoding with the recurrent form: one step per token, after <s> and the forced prefix (started);
    the prefix begins every translation."""
    limits = max_lengths(src, max_len_a, max_len_b)
    logits, state = started(model, src, list(prefix), prefill)
    out, done = [], torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
    for t in range(int(limits.max())):
        tokens = never_emit(logits).argmax(-1)
        tokens = torch.where(t + 1 >= limits, torch.full_like(tokens, EOS_ID), tokens)  # force </s> at the limit
        tokens = torch.where(done, torch.full_like(tokens, PAD_ID), tokens)
        out.append(tokens)
        done |= tokens == EOS_ID
        if done.all():  # every sentence ended (at the last limit at the latest)
            break
        logits, state = model.step(tokens, state)
    return [list(prefix) + strip(row) for row in torch.stack(out, 1).tolist()]


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


def reorder_state(state, index):
    """Select batch rows of a recurrent state (beam search reorders hypotheses)."""
    if torch.is_tensor(state):
        return state.index_select(0, index)
    if isinstance(state, dict):
        return {key: reorder_state(value, index) for key, value in state.items()}
    if isinstance(state, list):
        return [reorder_state(value, index) for value in state]
    return state  # positions and lengths are shared by the whole batch


@torch.no_grad()
def beam_search(model, src, beam_size=5, lenpen=0.6, max_len_a=1.5, max_len_b=10, prefix: list = (),
                prefill=None) -> list:
    """Batched beam search on recurrent states. Returns per sentence the best finished hypothesis as
    (tokens, log p(tokens + </s>), log p / (len + 1)^lenpen), the last being what beams are ranked by.

    Each sentence keeps beam_size live hypotheses as rows b * K + j of the state. At each step the 2K best
    extensions are taken; those ending in </s> among the top K are finished, the first K others live on, and
    the self-attention states are reordered to follow their parents. Every hypothesis starts with <s> and the forced
    prefix, read once per sentence (started), before the K beams part."""
    B, K = src.shape[0], beam_size
    limits = max_lengths(src, max_len_a, max_len_b).tolist()
    logits, state = started(model, src, list(prefix), prefill)
    rows = torch.arange(B, device=src.device).repeat_interleave(K)
    logits, state = logits[rows], reorder_state(state, rows)  # (B * K) rows
    tokens = torch.tensor([[BOS_ID, *prefix]] * (B * K), dtype=torch.long, device=src.device)
    scores = None  # (B, K) log p of each live hypothesis, in float32 (float64 for a float64 model)
    finished = [[] for _ in range(B)]
    for t in range(max(limits)):
        if t:
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
            keep = next_beams(b, K, V, top_scores_l[b], top_l[b], tokens, finished[b], lenpen)
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


def next_beams(b: int, K: int, V: int, top_scores: list, top: list, tokens, finished: list, lenpen: float) -> list:
    """Sentence b's live beams for the next step, (parent row, token, score), from its 2K best extensions (scores,
    flat indices beam * V + token): those ending in </s> among the top K join `finished` instead."""
    keep = []
    for j, (score, flat) in enumerate(zip(top_scores, top)):
        beam, token = divmod(flat, V)
        if token == EOS_ID:
            if j < K and len(finished) < K and score > float("-inf"):
                hypothesis = tokens[b * K + beam, 1:].tolist()  # the forced prefix and what follows it
                finished.append((hypothesis, score, score / (len(hypothesis) + 1) ** lenpen))
        elif len(keep) < K:
            keep.append((b * K + beam, token, score))
    return keep


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
    """Detokenized translations of sentences, in order. Empty lines give empty translations.
    args: beam (1: greedy), lenpen, max_len_a, max_len_b, decode_batch_size, compile (train_mt.py's
    --compile, which compiles training too)."""
    decoding_kernels()
    decoder = compile_step(model.eval()) if args.compile else eager_decoder(model.eval())
    prefix = mt_data.encode(tokenizer, [args.prefix])[0] if getattr(args, "prefix", "") else []
    prefill = model.prefill if getattr(args, "prefill", "parallel") == "parallel" else None  # None: a step a token
    todo = [i for i, s in enumerate(sentences) if s.strip()]
    ids = mt_data.encode(tokenizer, [sentences[i] for i in todo])
    order = sorted(range(len(todo)), key=lambda i: len(ids[i]))  # similar lengths together: less padding
    out = [""] * len(sentences)
    starts = range(0, len(order), args.decode_batch_size)
    bar = progress and sys.stderr.isatty()  # as the trainers' bars: a redirected log gets no bar lines
    for start in tqdm(starts, desc="translate", disable=not bar, dynamic_ncols=True, mininterval=2):
        chunk = order[start: start + args.decode_batch_size]
        src = mt_data.pad([ids[i] for i in chunk]).to(device)
        if args.beam == 1:
            hyps = greedy_decode(decoder, src, args.max_len_a, args.max_len_b, prefix, prefill)
        else:
            hyps = [h[0] for h in beam_search(decoder, src, args.beam, args.lenpen, args.max_len_a, args.max_len_b,
                                              prefix, prefill)]
        for i, hyp in zip(chunk, hyps):
            out[todo[i]] = mt_data.decode(tokenizer, hyp)
    return out


def synchronize(device):
    """Wait for queued GPU work, so that a clock read after it measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def decode_speed(model, tokenizer, sentences: list, device, batch_size: int = 16, beam: int = 1, max_len_a=1.5,
                 max_len_b=10, lenpen=0.6) -> dict:
    """Decoding speed on real sentences (greedy, or beam search of size beam): output tokens (</s> included,
    padding not) per second of decoding, encoder included. Sentences go in order of length, as
    translate_sentences batches them; the first batch runs once untimed (one-time costs: allocator, kernels)."""
    decoding_kernels()
    decoder = eager_decoder(model.eval())  # as translate_sentences decodes
    decode = (lambda src: greedy_decode(decoder, src, max_len_a, max_len_b)) if beam == 1 else \
        (lambda src: [h[0] for h in beam_search(decoder, src, beam, lenpen, max_len_a, max_len_b)])
    ids = sorted(mt_data.encode(tokenizer, [s for s in sentences if s.strip()]), key=len)
    if ids:
        decode(mt_data.pad(ids[:batch_size]).to(device))
    tokens, seconds = 0, 0.0
    for start in range(0, len(ids), batch_size):
        src = mt_data.pad(ids[start: start + batch_size]).to(device)
        synchronize(device)
        t0 = time.perf_counter()
        hyps = decode(src)
        synchronize(device)
        seconds += time.perf_counter() - t0
        tokens += sum(len(h) + 1 for h in hyps)  # + </s>
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds if seconds else float("nan"),
            "sentences": len(ids), "batch_size": batch_size, "beam": beam,
            "step": type(decoder).__name__}  # FlatStep: t2r.py's step unrolled; a model's name: its own step


def load_run(out_dir: str, device, max_sentences: int = 0):
    """A finished train_mt.py run, ready to decode its own test sentences (its --bleu_sentences, or the first
    max_sentences): (the inference model, its tokenizer, the sentences, the run's args.json)."""
    with open(os.path.join(out_dir, "args.json")) as f:
        args = json.load(f)
    model, tokenizer, _ = load_translator(os.path.join(out_dir, "model.pt"))
    try:
        corpus = mt_data.load_parallel(args["dataset"], args["src"], args["tgt"], args["data_dir"])
    except mt_data.DataError as error:
        raise UserError(str(error)) from None
    sentences = [s for s, _ in corpus["test"][: max_sentences or args["bleu_sentences"] or None]]
    return inference_model(model.to(device)), tokenizer, sentences, args


def measure_run(out_dir: str, device, batch_size: int = 16, passes: int = 3, beam: int = 1, max_sentences: int = 0):
    """decode_speed of a finished train_mt.py run on its own test sentences with its length limits (load_run): the
    median of `passes` passes (one pass of ~15 s on a CPU varies by several percent), and every pass's tokens/s."""
    model, tokenizer, sentences, args = load_run(out_dir, device, max_sentences)
    runs = [decode_speed(model, tokenizer, sentences, device, batch_size, beam, args["max_len_a"], args["max_len_b"],
                         args.get("lenpen", 0.6)) for _ in range(passes)]
    median = sorted(runs, key=lambda p: p["tokens_per_s"])[len(runs) // 2]
    return {**median, "tokens_per_s_passes": [p["tokens_per_s"] for p in runs]}


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


def evaluate_bleu(model, tokenizer, corpus: dict, args, device, splits=("valid", "test"), out_dir=None) -> dict:
    """BLEU of each split; with out_dir, the translations too, a line each in <out_dir>/<split>.hyp (for a paired
    comparison of two runs on the same sentences)."""
    results = {}
    for split in splits:
        pairs = corpus[split][: args.bleu_sentences or None]
        t0 = time.time()
        hyps = translate_sentences(model, tokenizer, [s for s, _ in pairs], args, device, progress=True)
        if out_dir:
            with atomic_write(os.path.join(out_dir, f"{split}.hyp")) as tmp, \
                    open(tmp, "w", encoding="utf-8", newline="") as f:  # newline="": a "\r" stays in its line
                f.writelines(h.replace("\n", " ") + "\n" for h in hyps)
        results[split] = bleu_scores(hyps, [t for _, t in pairs], args.tgt)
        results[split]["decode_seconds"] = round(time.time() - t0, 1)
        results[split]["sentences"] = len(pairs)
        print(f"{split}: BLEU {results[split]['bleu']:.2f} (detokenized, sacrebleu 13a), tokenized BLEU "
              f"{results[split]['tok_bleu']:.2f}; {len(pairs)} sentences, beam {args.beam}, "
              f"{results[split]['decode_seconds']:.0f} s")
    return results


# -----------------------------------------------------------------------------
# Loading a finished translator, and the command line

def load_translator(path: str):
    """model.pt of a finished train_mt.py run: the model, its tokenizer and the checkpoint."""
    if not os.path.isfile(path):
        raise UserError(f"no finished translator at {path}: finish training first "
                        f"(python train_mt.py --resume --out_dir {os.path.dirname(path) or '.'})")
    checkpoint = load_checkpoint(path, "translator")
    if "tokenizer" not in checkpoint or not checkpoint["config"].get("n_encoder_layer"):
        raise UserError(f"{path} is not a translator checkpoint (no tokenizer or encoder in it)")
    try:
        tokenizer = mt_data.load_tokenizer(checkpoint["tokenizer"])
    except Exception as error:  # DataError (no specials), or JSON the tokenizers library rejects
        raise UserError(f"{path} holds an unreadable tokenizer ({error}): retrain it") from None
    return model_from_checkpoint(checkpoint, path), tokenizer, checkpoint


def add_decoding_flags(p):
    """The decoding flags, shared with train_mt.py (which decodes for its BLEU scores); returns their group."""
    g = p.add_argument_group("decoding")
    g.add_argument("--beam", type=positive_int, default=5, help="beam size (1: greedy decoding)")
    g.add_argument("--lenpen", type=finite_float, default=0.6, help="length penalty: hypotheses are ranked by log p / length^lenpen")
    g.add_argument("--max_len_a", type=length_factor, default=1.5, help="a hypothesis has at most a * source length + b tokens")
    g.add_argument("--max_len_b", type=length_term, default=10, help="see --max_len_a")
    g.add_argument("--decode_batch_size", type=positive_int, default=64, help="sentences decoded together")
    return g


def get_args(argv=None):
    p = Parser(prog="translate.py", description="Translate text with a model.pt written by train_mt.py.")
    p.add_argument("input", nargs="?", default="-", help="file to translate, one sentence per line (- or none: stdin)")
    p.add_argument("--ckpt", default="out/mt-libreoffice-en-de-t2r-pretrained/model.pt", help="model.pt of train_mt.py")
    p.add_argument("--device", type=device_name, default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:1, mps")
    p.add_argument("--compile", action="store_true", help="run the decoder's step through torch.compile "
                   "(the first batches compile, the rest run faster)")
    p.add_argument("--prefix", default="", help="target text every translation starts with (an interactive "
                   "translator's: the decoder reads it after <s>, then goes on)")
    p.add_argument("--prefill", default="parallel", choices=["parallel", "step"], help="how the decoder reads <s> "
                   "and --prefix: parallel, in one pass (the model's prefill); step, a step a token (to compare)")
    add_decoding_flags(p)
    return p.parse_args(argv)


def read_lines(path: str) -> list:
    """The lines to translate, from a UTF-8 file or stdin, cut as `wc -l` counts them: one output line per line."""
    if path != "-" and not os.path.isfile(path):
        raise UserError(f"{path}: no such file (use - for stdin)")
    try:
        if path == "-":
            return text_lines(sys.stdin.buffer.read().decode("utf-8-sig"))
        with open(path, encoding="utf-8-sig", newline="") as f:
            return text_lines(f.read())
    except UnicodeDecodeError as error:
        raise UserError(f"{'stdin' if path == '-' else path} is not UTF-8 (byte {error.start}): convert it, "
                        f"e.g. iconv -f latin1 -t utf-8") from None


def check_decoding_fits(vocab_size: int, args, device, sentences: int):
    """A batch of --decode_batch_size sentences (no more than there are) of --beam hypotheses each takes, at the
    least, a step's logits and their log-softmax and scores (3 x 4 bytes a word of the vocabulary): refused in one
    line where that cannot fit."""
    batch = min(args.decode_batch_size, max(1, sentences))
    check_fits(batch * args.beam * 3 * 4 * vocab_size, device, f"decoding {batch} sentence{'s' * (batch != 1)} with "
               f"--beam {args.beam}", "lower --beam or --decode_batch_size")


def main():
    """Translations on stdout, one line per input line, and nothing else there (so `> out.txt` is clean)."""
    args = get_args()
    model, tokenizer, _ = load_translator(args.ckpt)
    lines = read_lines(args.input)
    check_decoding_fits(model.config.vocab_size, args, resolve_device(args.device), len(lines))  # before any output
    with contextlib.redirect_stdout(sys.stderr):
        device = get_device(args.device)
    model = inference_model(model.to(device))
    for line in translate_sentences(model, tokenizer, lines, args, device, progress=len(lines) > 100):
        print(line)


if __name__ == "__main__":
    run_main(main)
