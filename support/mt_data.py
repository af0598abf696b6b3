"""Translation data for t2r: parallel corpora -> joint byte-level BPE -> token-bucketed batches.

    corpus = load_parallel("libreoffice", "en", "de")   # offline default: LibreOffice help, English/German
    corpus = load_parallel("multi30k", "en", "de")      # downloads Multi30k (task 1) once
    corpus = load_parallel("my/folder", "en", "de")     # train.en, train.de, valid.en, ... (aligned lines)
    tokenizer = train_joint_bpe(corpus["train"], 8000)  # one vocabulary for both languages (shared embeddings)
    batches = make_batches(encode_pairs(tokenizer, corpus["train"]), max_tokens=4096)

The offline corpus: Debian ships LibreOffice's help as HTML in every language. Paragraphs and headings with
the same id in the English and German page are translations of each other (the help is translated paragraph
by paragraph). `apt-get download` fetches the two .deb files (no install, no dependencies) and `dpkg -x`
unpacks them; nothing outside Debian's package mirror is needed.
"""

from __future__ import annotations

import gzip
import hashlib
import html.parser
import json
import os
import subprocess
from pathlib import Path
from typing import Callable

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from support import corpora
from support.corpora import DataError
from support.runtime import atomic_write

SPLITS = ("train", "valid", "test")
SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")
MIN_BPE_VOCAB = 256 + len(SPECIALS)  # the byte alphabet and the specials: a smaller vocabulary would be this size
PAD_ID, UNK_ID, BOS_ID, EOS_ID = range(4)  # the decoder starts from <s>; every sentence ends with </s>

# LibreOffice help: the Debian packages and the language folders inside them
LIBREOFFICE_PACKAGES = {"en": "libreoffice-help-en-us", "de": "libreoffice-help-de"}
LIBREOFFICE_FOLDERS = {"en": "en-US", "de": "de"}
LIBREOFFICE_HELP = "usr/share/libreoffice/help"
HELD_OUT = 1000  # sentences in each of valid and test (the offline corpus)
PREPARED_FORMAT = 2  # bump when extraction or splitting changes, so old prepared corpora are rebuilt
MIN_SOURCE_WORDS = 3  # pairs whose English side is shorter are menu labels, not sentences

# Multi30k, task 1 (Elliott et al., 2016): 29,000 / 1,014 / 1,000 image captions in English and German
MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}.{lang}.gz"
MULTI30K_FILES = {"train": "train", "valid": "val", "test": "test_2016_flickr"}


# -----------------------------------------------------------------------------
# The offline corpus: LibreOffice help pages, English and German, aligned by paragraph id

class HelpPageParser(html.parser.HTMLParser):
    """Collects {id: text} of the <p> and <h1>..<h6> elements of one help page. Text inside elements marked
    `hidden` (the help's per-platform variants, e.g. the macOS menu names) is skipped in both languages."""

    CAPTURED = {"p", "h1", "h2", "h3", "h4", "h5", "h6"}
    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.texts: dict[str, str] = {}
        self.open: list[tuple[str, bool]] = []  # (tag, hidden) of every open non-void element
        self.capture: tuple[str, int] | None = None  # (id, depth of its element) while inside one
        self.parts: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "br":
            self.handle_data(" ")
        if tag in self.VOID:
            return
        attrs = dict(attrs)
        self.open.append((tag, "hidden" in attrs))
        if self.capture is None and tag in self.CAPTURED and attrs.get("id"):
            self.capture, self.parts = (attrs["id"], len(self.open)), []

    def handle_endtag(self, tag):
        # pop up to the matching open tag (HTML lets some end tags be omitted)
        for depth in range(len(self.open) - 1, -1, -1):
            if self.open[depth][0] == tag:
                if self.capture is not None and depth < self.capture[1]:
                    self.texts.setdefault(self.capture[0], " ".join("".join(self.parts).split()))
                    self.capture = None
                del self.open[depth:]
                return

    def handle_data(self, text):
        if self.capture is not None and not any(hidden for _, hidden in self.open):
            self.parts.append(text)


def page_texts(path: Path) -> dict[str, str]:
    parser = HelpPageParser()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return {key: text for key, text in parser.texts.items() if text}


def extract_help_pairs(help_root: str | Path, src_lang: str = "en", tgt_lang: str = "de") -> list[tuple[str, str]]:
    """Unique (source, target) pairs of paragraphs with the same id in the same page of both languages.
    Drops identical pairs (untranslated text, code, names) and pairs whose English side has fewer than
    MIN_SOURCE_WORDS words. Sorted, so the same packages always give the same list."""
    root = Path(help_root)
    folders = {lang: root / LIBREOFFICE_FOLDERS[lang] for lang in (src_lang, tgt_lang)}
    for lang, folder in folders.items():
        if not folder.is_dir():
            raise DataError(f"no {LIBREOFFICE_FOLDERS[lang]} help pages in {root}: delete the folder and rerun to "
                            f"fetch {LIBREOFFICE_PACKAGES[lang]} again")
    english = "src" if src_lang == "en" else "tgt"
    pairs = set()
    for src_page in sorted(folders[src_lang].rglob("*.html")):
        tgt_page = folders[tgt_lang] / src_page.relative_to(folders[src_lang])
        if not tgt_page.is_file():
            continue
        src_texts, tgt_texts = page_texts(src_page), page_texts(tgt_page)
        for key, src in src_texts.items():
            tgt = tgt_texts.get(key)
            if tgt is None or tgt == src:
                continue
            if len((src if english == "src" else tgt).split()) < MIN_SOURCE_WORDS:
                continue
            pairs.add((src, tgt))
    return sorted(pairs)


def split_pairs(pairs: list[tuple[str, str]], held_out: int = HELD_OUT, key_side: int = 0
                ) -> dict[str, list[tuple[str, str]]]:
    """A deterministic split: order the pairs by a hash of one side (key_side: 0 source, 1 target) and take the
    first `held_out` for test and the next for valid. Hashing one side keeps every translation of a sentence in
    one split; hashing the English side gives en-de and de-en the same test sentences."""
    def key(pair):
        return hashlib.sha1(pair[key_side].encode()).hexdigest(), pair
    ordered = sorted(pairs, key=key)
    if len(ordered) < 3 * held_out:
        held_out = max(1, len(ordered) // 10)
    return {"test": ordered[:held_out], "valid": ordered[held_out: 2 * held_out], "train": ordered[2 * held_out:]}


def run_command(command: list[str], cwd: str | Path) -> None:
    """Run a command, with a one-line error when it is missing or fails. Module level so tests can fake it."""
    try:
        subprocess.run(command, cwd=cwd, check=True, capture_output=True, text=True)
    except FileNotFoundError:
        raise DataError(f"{command[0]} is not installed: the offline corpus needs Debian's apt-get and dpkg "
                        f"(or pass --dataset a folder of aligned text files)") from None
    except subprocess.CalledProcessError as error:
        last = (error.stderr or error.stdout or "").strip().splitlines()[-1:] or ["no output"]
        raise DataError(f"{' '.join(command)} failed ({last[0]}): check that Debian's package lists are "
                        f"reachable (apt-get update), or unpack the packages into the data folder by hand") from None


def fetch_libreoffice_help(folder: Path, langs: tuple[str, ...], run: Callable | None = None) -> Path:
    """Download (not install) the help packages and unpack them into folder; returns the help root."""
    run = run or run_command
    help_root = folder / LIBREOFFICE_HELP
    missing = [lang for lang in langs if not (help_root / LIBREOFFICE_FOLDERS[lang]).is_dir()]
    if not missing:
        return help_root
    debs = folder / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    for lang in missing:
        package = LIBREOFFICE_PACKAGES[lang]
        print(f"fetching {package} with apt-get download (once)")
        run(["apt-get", "download", package], debs)
        found = sorted(debs.glob(f"{package}_*.deb"))
        if not found:
            raise DataError(f"apt-get download {package} left no .deb in {debs}: download it by hand into {debs}")
        run(["dpkg", "-x", str(found[-1].resolve()), str(folder.resolve())], folder)
    return help_root


def libreoffice_corpus(data_dir: Path, src_lang: str, tgt_lang: str, run: Callable | None = None) -> dict:
    for lang in (src_lang, tgt_lang):
        if lang not in LIBREOFFICE_PACKAGES:
            raise DataError(f"the LibreOffice corpus has {' and '.join(LIBREOFFICE_PACKAGES)}, not {lang!r}: "
                            f"use --src en --tgt de or --src de --tgt en")
    help_root = fetch_libreoffice_help(data_dir, (src_lang, tgt_lang), run)
    print(f"extracting aligned paragraphs from {help_root}")
    return split_pairs(extract_help_pairs(help_root, src_lang, tgt_lang), key_side=0 if src_lang == "en" else 1)


# -----------------------------------------------------------------------------
# Corpora with internet (Multi30k) and local folders of aligned files

def multi30k_corpus(data_dir: Path, src_lang: str, tgt_lang: str, fetch: Callable | None = None) -> dict:
    for lang in (src_lang, tgt_lang):
        if lang not in ("en", "de", "fr", "cs"):
            raise DataError(f"Multi30k has en, de, fr and cs captions, not {lang!r}")
    data_dir.mkdir(parents=True, exist_ok=True)
    corpus = {}
    for split, name in MULTI30K_FILES.items():
        sides = []
        for lang in (src_lang, tgt_lang):
            path = data_dir / f"{name}.{lang}.gz"
            if not path.is_file():
                url = MULTI30K_URL.format(name=name, lang=lang)
                try:
                    with atomic_write(path) as tmp:
                        (fetch or corpora.fetch_url)(url, tmp)
                except OSError as error:
                    raise DataError(f"could not download {url} ({error}): put {path.name} in {data_dir} by hand, "
                                    f"or use the offline default --dataset libreoffice") from None
            try:
                with gzip.open(path, "rt", encoding="utf-8-sig", newline="") as f:
                    sides.append(corpora.text_lines(f.read()))
            except (OSError, EOFError) as error:
                raise DataError(f"{path} is corrupt ({error}): delete it and rerun") from None
        corpus[split] = aligned(sides[0], sides[1], f"{data_dir}/{name}.{{{src_lang},{tgt_lang}}}.gz")
    return corpus


def folder_corpus(folder: Path, src_lang: str, tgt_lang: str) -> dict:
    corpus = {}
    for split in SPLITS:
        paths = [folder / f"{split}.{lang}" for lang in (src_lang, tgt_lang)]
        for path in paths:
            if not path.is_file():
                raise DataError(f"{path} is missing: a folder corpus needs train, valid and test files named "
                                f"<split>.{src_lang} and <split>.{tgt_lang} with one sentence a line")
        sides = [corpora.text_lines(read_utf8(path)) for path in paths]
        corpus[split] = aligned(sides[0], sides[1], f"{folder}/{split}.{{{src_lang},{tgt_lang}}}")
    return corpus


def read_utf8(path: Path) -> str:
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:  # lines as text_lines cuts them, \n only
            return f.read()
    except UnicodeDecodeError as error:
        raise DataError(f"{path} is not UTF-8 (byte {error.start}): convert it, e.g. iconv -f latin1 -t utf-8") from None


def aligned(src_lines: list[str], tgt_lines: list[str], name: str) -> list[tuple[str, str]]:
    if len(src_lines) != len(tgt_lines):
        raise DataError(f"{name}: {len(src_lines)} source lines but {len(tgt_lines)} target lines; "
                        f"the two files must be aligned line by line")
    pairs = [(" ".join(s.split()), " ".join(t.split())) for s, t in zip(src_lines, tgt_lines)]
    pairs = [(s, t) for s, t in pairs if s and t]
    if not pairs:
        raise DataError(f"{name} has no sentence pairs")
    return pairs


def load_parallel(dataset: str, src_lang: str, tgt_lang: str, data_dir: str | None = None,
                  run: Callable | None = None, fetch: Callable | None = None) -> dict:
    """{split: [(source, target), ...]} of 'libreoffice' (offline default), 'multi30k' or a folder.
    The prepared pairs are cached as text files in data_dir (default data/mt/<dataset>)."""
    if src_lang == tgt_lang:
        raise DataError(f"source and target are both {src_lang!r}: pick two languages")
    if dataset not in ("libreoffice", "multi30k"):
        if not Path(dataset).is_dir():
            raise DataError(f"unknown dataset {dataset!r}: use libreoffice, multi30k or a folder of aligned files")
        return folder_corpus(Path(dataset), src_lang, tgt_lang)
    cache = prepared_corpus(dataset, src_lang, tgt_lang, data_dir)
    folder = cache.parent
    if cache.is_file():
        try:
            with open(cache, encoding="utf-8") as f:
                return {split: [tuple(p) for p in pairs] for split, pairs in json.load(f).items()}
        except (ValueError, OSError):
            print(f"{cache} is unreadable: preparing the corpus again")
    if dataset == "libreoffice":
        corpus = libreoffice_corpus(folder, src_lang, tgt_lang, run)
    else:
        corpus = multi30k_corpus(folder, src_lang, tgt_lang, fetch)
    with atomic_write(cache) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(corpus, f, ensure_ascii=False)
    return corpus


def prepared_corpus(dataset: str, src_lang: str, tgt_lang: str, data_dir: str | None = None) -> Path:
    """Where load_parallel caches a named corpus's prepared pairs."""
    folder = Path(data_dir or os.path.join("data", "mt", dataset))
    return folder / f"prepared-v{PREPARED_FORMAT}-{src_lang}-{tgt_lang}.json"


def corpus_at_hand(dataset: str, src_lang: str, tgt_lang: str, data_dir: str | None = None) -> bool:
    """Whether load_parallel reads the corpus without downloading or extracting anything: a folder, or a named corpus
    prepared on this machine."""
    if dataset not in ("libreoffice", "multi30k"):
        return Path(dataset).is_dir()
    return prepared_corpus(dataset, src_lang, tgt_lang, data_dir).is_file()


# -----------------------------------------------------------------------------
# Joint BPE: one byte-level vocabulary for source and target, so embeddings can be shared (section 3.2.2)

def train_joint_bpe(pairs: list[tuple[str, str]], vocab_size: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())  # byte level: any input is representable, <unk> is never produced
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator((side for pair in pairs for side in pair), trainer=trainer)
    return tokenizer


def load_tokenizer(text: str) -> Tokenizer:
    """The tokenizer stored (as its JSON string) in a checkpoint."""
    tokenizer = Tokenizer.from_str(text)
    if [tokenizer.token_to_id(t) for t in SPECIALS] != [PAD_ID, UNK_ID, BOS_ID, EOS_ID]:
        raise DataError("the checkpoint's tokenizer lacks <pad> <unk> <s> </s> at ids 0-3: it is not a t2r "
                        "translation checkpoint")
    return tokenizer


def encode(tokenizer: Tokenizer, sentences: list[str]) -> list[list[int]]:
    """Token ids of each sentence followed by </s>; an empty sentence is just [</s>]."""
    encodings = tokenizer.encode_batch([" ".join(s.split()) for s in sentences], add_special_tokens=False)
    return [e.ids + [EOS_ID] for e in encodings]


def decode(tokenizer: Tokenizer, ids) -> str:
    """Text of ids, up to the first </s> (detokenized: byte-level BPE restores the original spacing)."""
    ids = [int(i) for i in ids]
    if EOS_ID in ids:
        ids = ids[: ids.index(EOS_ID)]
    return tokenizer.decode(ids, skip_special_tokens=True).strip()


def encode_pairs(tokenizer: Tokenizer, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    return list(zip(encode(tokenizer, [s for s, _ in pairs]), encode(tokenizer, [t for _, t in pairs])))


# -----------------------------------------------------------------------------
# Batches: sentences of similar length together, at most max_tokens (padding included) per batch

def make_batches(examples: list, max_tokens: int, lengths: Callable | None = None) -> list[list[int]]:
    """Indices of examples grouped into batches, by length. A deterministic list; shuffle its order per epoch."""
    lengths = lengths or (lambda ex: max(len(ex[0]), len(ex[1])))
    order = sorted(range(len(examples)), key=lambda i: (lengths(examples[i]), i))
    batches, batch, longest = [], [], 0
    for i in order:
        n = lengths(examples[i])
        if batch and max(longest, n) * (len(batch) + 1) > max_tokens:
            batches.append(batch)
            batch, longest = [], 0
        batch.append(i)
        longest = max(longest, n)
    if batch:
        batches.append(batch)
    return batches


def collate(examples: list, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(source (B, S), decoder input (B, T) = <s> y, decoder target (B, T) = y </s>), padded with PAD_ID."""
    src = pad([examples[i][0] for i in indices])
    tgt_in = pad([[BOS_ID] + examples[i][1][:-1] for i in indices])
    tgt_out = pad([examples[i][1] for i in indices])
    return src, tgt_in, tgt_out


def pad(sequences: list[list[int]]) -> torch.Tensor:
    out = torch.full((len(sequences), max(map(len, sequences))), PAD_ID, dtype=torch.long)
    for row, seq in enumerate(sequences):
        out[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return out
