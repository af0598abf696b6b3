"""Tests of support/corpora.py and support/data.py: corpora, tokenizers, the token cache, the WikiText-103 download
(on a fake archive, never the network) and the batches. CPU, a few seconds.

    python -m pytest -q -s tests/test_data.py
"""

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import ROOT, wait_for_exit
from support import corpora, data, run_files


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any real download attempt fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("a test tried to use the network")
    monkeypatch.setattr(urllib.request, "urlopen", refuse)


@pytest.fixture(scope="module")
def ptb(tmp_path_factory):
    start = time.time()
    lm = data.prepare("ptb", cache_dir=str(tmp_path_factory.mktemp("cache")))
    print(f"\nPTB word level: cache built in {time.time() - start:.2f} s")
    return lm


def write_corpus(folder, lines=None, names=("train.txt", "valid.txt", "test.txt")):
    lines = lines or {"train": ["the cat sat on the mat", "", "a dog sat on a log"] * 20,
                      "valid": ["the dog sat", "a cat on the log"], "test": ["the mat sat on a cat"]}
    os.makedirs(folder, exist_ok=True)
    for name, split in zip(names, data.SPLITS):
        with open(os.path.join(folder, name), "w") as f:
            f.write("\n".join(lines[split]) + "\n")
    return str(folder)


def assert_one_line(error: data.DataError, *fragments):
    message = str(error)
    assert "\n" not in message and message, message
    for fragment in fragments:
        assert fragment in message, message
    print("DataError:", message)


# -----------------------------------------------------------------------------
# Penn Treebank

def test_ptb_counts_vocabulary_and_eos(ptb):
    texts = corpora.load_corpus("ptb")
    words = {split: len(text.split()) for split, text in texts.items()}
    lines = {split: sum(1 for line in text.split("\n") if line.strip()) for split, text in texts.items()}
    assert words == {"train": 887_521, "valid": 70_390, "test": 78_669}
    for split in data.SPLITS:
        ids = getattr(ptb, split)
        assert int((ids == ptb.eos_id).sum()) == lines[split]  # no spurious <eos> from the trailing "\n\n"
        assert len(ids) == ptb.n_words[split] == words[split] + lines[split]
    assert ptb.vocab_size == 10_000 and ptb.train.dtype == np.uint16
    assert ptb.kind == "word" and int(ptb.train.max()) < ptb.vocab_size
    print(f"PTB words {words}, <eos> = non-empty lines {lines}, vocabulary {ptb.vocab_size:,} "
          f"(9,999 words incl. <unk>, + <eos>), tokens {[len(getattr(ptb, s)) for s in data.SPLITS]}")


def test_word_round_trip_and_unknown_words(ptb):
    valid = corpora.load_corpus("ptb")["valid"].split("\n")[:200]
    for line in valid:
        line = " ".join(line.split())
        assert ptb.decode(ptb.encode(line)) == line
    two_lines = "the company said\nit will pay"
    assert ptb.decode(ptb.encode(two_lines)) == two_lines and ptb.encode(two_lines)[3] == ptb.eos_id
    unk = ptb.tokenizer.token_to_id("<unk>")
    assert ptb.encode("the zyzzyvaqx said") == [ptb.encode("the")[0], unk, ptb.encode("said")[0]]
    # The fast dict lookup gives exactly what the tokenizers WordLevel + WhitespaceSplit model gives.
    text = corpora.load_corpus("ptb")["valid"]
    start = time.time()
    by_tokenizer = ptb.tokenizer.encode(text.replace("\n", " <eos> ")).ids
    seconds = time.time() - start
    assert by_tokenizer == ptb.valid.tolist()
    print(f"round trip on 200 PTB lines; unknown word -> <unk> ({unk}); dict lookup == tokenizer.encode "
          f"on valid ({len(by_tokenizer):,} tokens, tokenizer {seconds:.2f} s)")


# -----------------------------------------------------------------------------
# Cache

def test_an_edit_in_the_middle_of_a_large_corpus_rebuilds_the_cache(tmp_path):
    """A 3 MB train.txt edited in its middle, the size the same: the first and last MB are unchanged, so only a
    hash of the whole text sees it."""
    corpus, cache = tmp_path / "big", str(tmp_path / "cache")
    corpus.mkdir()
    line = "the cat sat on the mat and the dog sat on the log\n"
    (corpus / "train.txt").write_text(line * (3_000_000 // len(line)))
    for split in ("valid", "test"):
        (corpus / f"{split}.txt").write_text(line * 4)
    first = data.prepare(str(corpus), cache_dir=cache)
    text = (corpus / "train.txt").read_text()
    middle = len(text) // 2 - len(text) // 2 % len(line)  # a line's start, 1.5 MB in
    (corpus / "train.txt").write_text(text[:middle] + line.replace("cat", "dog") + text[middle + len(line):])
    assert (corpus / "train.txt").stat().st_size == len(text)
    again = data.prepare(str(corpus), cache_dir=cache)
    cats = [int((lm.train == lm.tokenizer.token_to_id("cat")).sum()) for lm in (first, again)]  # ids by frequency
    print(f"cat tokens: {cats[0]} before the edit, {cats[1]} after")
    assert cats[1] == cats[0] - 1


def test_a_cache_of_the_code_before_content_hashes_is_read_and_rebuilt_for_training(tmp_path, monkeypatch):
    """A cache whose meta.json has no content hashes (written before them): generate.py reads it as it is; training
    rebuilds it once, and the data's identity keeps the key ("data") its checkpoints were written with."""
    corpus, cache = write_corpus(tmp_path / "tiny"), str(tmp_path / "cache")
    built = data.prepare(corpus, cache_dir=cache)
    old_identity = {key: value for key, value in run_files.data_identity(built).items() if key != "content"}
    meta = json.loads((Path(built.cache) / "meta.json").read_text())
    del meta["content"]
    (Path(built.cache) / "meta.json").write_text(json.dumps(meta))
    assert data.read_prepared(corpus, cache_dir=cache).vocab_size == built.vocab_size  # read as it is
    calls = []
    real = data.train_tokenizer
    monkeypatch.setattr(data, "train_tokenizer", lambda *a, **k: calls.append(1) or real(*a, **k))
    rebuilt = data.prepare(corpus, cache_dir=cache)
    assert calls == [1] and np.array_equal(rebuilt.train, built.train)
    new_identity = run_files.data_identity(rebuilt)
    assert {key: new_identity[key] for key in old_identity} == old_identity and "content" in new_identity


def test_cache_is_reused_and_rebuilt_when_damaged(tmp_path, monkeypatch):
    corpus, cache = write_corpus(tmp_path / "tiny"), str(tmp_path / "cache")
    first = data.prepare(corpus, cache_dir=cache)
    folder = first.cache
    assert sorted(os.listdir(folder)) == [".lock", "meta.json", "test.bin", "tokenizer.json", "train.bin", "valid.bin"]

    calls = []
    real = data.train_tokenizer
    monkeypatch.setattr(data, "train_tokenizer", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = data.prepare(corpus, cache_dir=cache)
    assert calls == [] and isinstance(again.train, np.memmap)  # loaded, no tokenizer built
    assert np.array_equal(again.train, first.train) and again.vocab_size == first.vocab_size

    damages = {
        "truncated memmap": lambda: open(os.path.join(folder, "train.bin"), "r+b").truncate(10),
        "garbage meta.json": lambda: open(os.path.join(folder, "meta.json"), "w").write("{not json"),
        "garbage tokenizer.json": lambda: open(os.path.join(folder, "tokenizer.json"), "w").write("oops"),
        "meta from another pipeline": lambda: rewrite_meta(folder, format=-1),
        "changed corpus": lambda: open(os.path.join(corpus, "train.txt"), "a").write("a new line\n"),
    }
    for what, damage in damages.items():
        damage()
        rebuilt = data.prepare(corpus, cache_dir=cache)
        assert len(calls) == 1, what  # rebuilt once...
        calls.clear()
        data.prepare(corpus, cache_dir=cache)
        assert calls == [], what  # ...then loaded again
        print(f"{what}: rebuilt, train {len(rebuilt.train)} tokens")
    assert not [name for name in os.listdir(folder) if name.endswith((".tmp", ".t2r-partial"))]

    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(data.DataError) as error:
        data.prepare(corpus, cache_dir=str(blocker / "cache"))
    assert_one_line(error.value, "cache_dir")


def test_concurrent_prepare_builds_once(tmp_path):
    """torchrun's ranks call prepare() at the same moment: one builds, the others wait and load."""
    corpus, cache = write_corpus(tmp_path / "tiny"), str(tmp_path / "cache")
    code = (f"from support import data; "
            f"lm = data.prepare({corpus!r}, tokenizer='bpe', vocab_size=280, cache_dir={cache!r}); "
            f"print('tokens', len(lm.train), int(lm.train.sum()))")
    runs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]
    outputs = [wait_for_exit(run, "prepare() in each process") for run in runs]
    assert all(run.returncode == 0 for run in runs), outputs
    assert sum(out.count("building the token cache") for out, _ in outputs) == 1, outputs
    assert len({out.splitlines()[-1] for out, _ in outputs}) == 1  # all see the same ids
    print(f"2 processes at once: built once, all loaded {outputs[0][0].splitlines()[-1]}")


def rewrite_meta(folder, **changes):
    path = os.path.join(folder, "meta.json")
    meta = json.load(open(path))
    meta.update(changes)
    json.dump(meta, open(path, "w"))


# -----------------------------------------------------------------------------
# Folder datasets and their errors

def test_folder_dataset(tmp_path):
    corpus = write_corpus(tmp_path / "tiny")
    lm = data.prepare(corpus, cache_dir=str(tmp_path / "cache"))
    assert lm.vocab_size == 2 + 8  # <unk>, <eos>, 8 words
    assert len(lm.train) == 20 * (6 + 1 + 0 + 1 + 6 + 1)  # blank lines are an <eos> each
    assert lm.decode(lm.test) == "the mat sat on a cat\n"
    print(f"folder dataset: vocabulary {lm.vocab_size}, train {len(lm.train)} tokens")


def test_a_byte_order_mark_is_not_glued_to_the_first_word(tmp_path):
    corpus = write_corpus(tmp_path / "tiny")
    train = os.path.join(corpus, "train.txt")
    text = open(train, encoding="utf-8").read()
    open(train, "w", encoding="utf-8").write("\ufeff" + text)  # as Windows editors save UTF-8
    lm = data.prepare(corpus, cache_dir=str(tmp_path / "cache"))
    assert lm.vocab_size == 2 + 8 and lm.decode(lm.train[:3]) == "the cat sat"

@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="/dev/full (a disk that is always full) is Linux's")
def test_a_full_disk_while_the_cache_is_written_is_a_one_line_error(tmp_path, monkeypatch):
    """tokenizer.json goes to /dev/full, as to a full disk: "No space left on device" in one line (the tokenizers
    library's own save raised a bare Exception)."""
    atomic_write = data.atomic_write

    @contextlib.contextmanager
    def full_for_the_tokenizer(path):
        if str(path).endswith("tokenizer.json"):
            yield "/dev/full"
        else:
            with atomic_write(path) as tmp:
                yield tmp
    monkeypatch.setattr(data, "atomic_write", full_for_the_tokenizer)
    with pytest.raises(data.DataError, match="cannot write the token cache .* \\(No space left on device\\)"):
        data.prepare(write_corpus(tmp_path / "tiny"), cache_dir=str(tmp_path / "cache"))


def test_wikitext_file_names_are_accepted(tmp_path):
    wiki_style = write_corpus(tmp_path / "wiki", names=("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens"))
    assert corpora.load_corpus(wiki_style)["valid"] == "the dog sat\na cat on the log\n"


def no_valid_split(corpus):
    os.remove(os.path.join(corpus, "valid.txt"))


def empty_valid_split(corpus):
    open(os.path.join(corpus, "valid.txt"), "w").close()


def latin1_valid_split(corpus):
    open(os.path.join(corpus, "valid.txt"), "wb").write(b"caf\xe9\n")


@pytest.mark.parametrize("damage, fragments", [
    (no_valid_split, ["valid.txt"]),
    (empty_valid_split, ["empty"]),
    (latin1_valid_split, ["UTF-8"]),
])
def test_a_damaged_folder_is_a_one_line_error(tmp_path, damage, fragments):
    corpus = write_corpus(tmp_path / "tiny")
    damage(corpus)
    with pytest.raises(data.DataError) as error:
        corpora.load_corpus(corpus)
    assert_one_line(error.value, *fragments)


@pytest.mark.parametrize("dataset, tokenizer, fragments", [
    ("missing", "word", ["missing", "--dataset ptb"]),
    ("tiny", "chars", ["word or bpe"]),
])
def test_bad_prepare_arguments_are_one_line_errors(tmp_path, dataset, tokenizer, fragments):
    write_corpus(tmp_path / "tiny")
    with pytest.raises(data.DataError) as error:
        data.prepare(str(tmp_path / dataset), tokenizer=tokenizer, cache_dir=str(tmp_path / "cache"))
    assert_one_line(error.value, *fragments)


# -----------------------------------------------------------------------------
# WikiText-103 download, on a fake archive

def fake_wikitext_zip(path):
    texts = {"train": " = Title = \n \n the cat sat on the mat \n \n a dog sat on a log \n",
             "valid": " \n the dog sat \n", "test": " \n a cat on the log \n"}
    with zipfile.ZipFile(path, "w") as z:
        for split, text in texts.items():
            z.writestr(f"wikitext-103/wiki.{split}.tokens", text)
    return hashlib.sha256(open(path, "rb").read()).hexdigest(), texts


def test_wikitext103_download_from_mirrors(tmp_path):
    archive = tmp_path / "fake.zip"
    sha256, texts = fake_wikitext_zip(archive)
    tried = []

    def fetch(url, dest):
        tried.append(url)
        if "dead" in url:
            raise urllib.error.URLError("Name or service not known")
        if "liar" in url:
            open(dest, "wb").write(b"PK not the archive")
            return
        open(dest, "wb").write(archive.read_bytes())

    folder = tmp_path / "wikitext103"
    mirrors = ("https://dead.example/w.zip", "https://liar.example/w.zip", "https://good.example/w.zip")
    corpora.download_wikitext103(folder, mirrors=mirrors, sha256=sha256, fetch=fetch)
    assert tried == list(mirrors)
    assert sorted(os.listdir(folder)) == ["wiki.test.tokens", "wiki.train.tokens", "wiki.valid.tokens",
                                          "wikitext-103-v1.zip"]  # no .tmp left behind
    assert corpora.load_corpus("wikitext103", str(folder)) == texts
    lm = data.prepare("wikitext103", str(folder), cache_dir=str(tmp_path / "cache"))
    assert lm.decode(lm.train) == "= Title =\n\nthe cat sat on the mat\n\na dog sat on a log\n"
    assert lm.n_words["train"] == 15 + 5  # words + one <eos> a line, blank lines included
    print(f"fake WikiText-103: mirrors tried {tried}, checksum verified, {lm.n_words} tokens")

    (folder / "wiki.train.tokens").unlink()  # the verified zip in data_dir is reused, not downloaded
    corpora.download_wikitext103(folder, mirrors=(), sha256=sha256, fetch=fetch)
    assert (folder / "wiki.train.tokens").read_text() == texts["train"] and len(tried) == 3
    with pytest.raises(data.DataError) as error:
        corpora.download_wikitext103(folder, mirrors=(), sha256="0" * 64, fetch=fetch)
    assert_one_line(error.value, "delete it")


def test_wikitext103_offline_explains_manual_download(tmp_path, monkeypatch):
    def offline(url, dest):
        raise urllib.error.URLError("Temporary failure in name resolution")
    monkeypatch.setattr(corpora, "fetch_url", offline)  # load_corpus uses the real mirrors and checksum
    folder = tmp_path / "wikitext103"
    with pytest.raises(data.DataError) as error:
        corpora.load_corpus("wikitext103", str(folder))
    assert_one_line(error.value, "by hand", "wikitext-103-v1.zip", "wiki.train.tokens", str(folder))
    assert os.listdir(folder) == []
    (folder / "wikitext-103-v1.zip").write_bytes(b"this is not a zip")
    with pytest.raises(data.DataError) as error:
        corpora.load_corpus("wikitext103", str(folder))
    assert_one_line(error.value, "delete it")


# -----------------------------------------------------------------------------
# BPE

def test_bpe_trains_counts_words_and_round_trips(tmp_path):
    corpus = write_corpus(tmp_path / "tiny")
    lm = data.prepare(corpus, tokenizer="bpe", vocab_size=300, cache_dir=str(tmp_path / "cache"))
    assert lm.kind == "bpe" and lm.vocab_size <= 300 and lm.train.dtype == np.uint16
    assert lm.n_words == {"train": 20 * (6 + 1 + 0 + 1 + 6 + 1), "valid": 3 + 1 + 5 + 1, "test": 6 + 1}
    assert lm.decode(lm.valid) == "the dog sat\na cat on the log\n"
    for text in ["the cat sat on the mat", "an unseen wörd ☃ and\nnew line", ""]:
        assert lm.decode(lm.encode(text)) == text
    again = data.prepare(corpus, tokenizer="bpe", vocab_size=300, cache_dir=str(tmp_path / "cache"))
    assert again.cache == lm.cache and np.array_equal(again.train, lm.train)
    other = data.prepare(corpus, tokenizer="bpe", vocab_size=280, cache_dir=str(tmp_path / "cache"))
    assert other.cache != lm.cache  # each vocabulary size has its own cache
    print(f"BPE: vocabulary {lm.vocab_size}, tokens {len(lm.train)} for {lm.n_words['train']} words, "
          f"round trips including unseen characters")


# -----------------------------------------------------------------------------
# Batches

def test_get_batch_is_reproducible_and_resumable():
    ids = np.arange(1000, dtype=np.uint16)
    a = data.get_batch(ids, 4, 16, torch.Generator().manual_seed(0))
    b = data.get_batch(ids, 4, 16, torch.Generator().manual_seed(0))
    c = data.get_batch(ids, 4, 16, torch.Generator().manual_seed(1))
    x, y = a
    assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and not torch.equal(a[0], c[0])
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y, x + 1)  # contiguous windows, shifted by one
    generator = torch.Generator().manual_seed(3)
    data.get_batch(ids, 4, 16, generator)
    state = generator.get_state()
    expected = data.get_batch(ids, 4, 16, generator)[0]
    generator.set_state(state)
    assert torch.equal(data.get_batch(ids, 4, 16, generator)[0], expected)
    edge = data.get_batch(np.arange(17), 64, 16, torch.Generator().manual_seed(0))[0]
    assert torch.equal(edge, torch.arange(16).expand(64, 16))  # the only window that fits
    with pytest.raises(data.DataError):
        data.get_batch(np.arange(16), 1, 16, torch.Generator())
    print("get_batch: same seed, same batches; a saved generator state resumes the stream")


@pytest.mark.parametrize("n,context,score", [(1000, 64, 32), (1000, 64, 64), (50, 64, 32), (65, 64, 32),
                                             (66, 64, 32), (333, 512, 256), (2, 8, 4), (1, 8, 4), (100, 10, 3)])
def test_eval_windows_score_every_token_once(n, context, score):
    ids = np.arange(n, dtype=np.int64) + 7
    for bos in (None, 5):
        counts = np.zeros(n, dtype=int)
        windows = list(data.eval_windows(ids, context, score, bos=bos))
        for k, (x, y, mask) in enumerate(windows):
            assert len(x) == len(y) == len(mask) <= context
            assert k == 0 or len(x) == context  # only the first window may be shorter
            assert k == 0 or not mask[: context - score].any()  # later windows keep >= context-score of history
            if k == 0:
                assert mask.all()
            assert torch.equal(x[1:], y[:-1])
            for target in y[mask].tolist():
                counts[target - 7] += 1
        scored = counts if bos is not None else counts[1:]  # without bos, token 0 has no history
        assert (scored == 1).all() and (bos is not None or counts[0] == 0)
    print(f"n={n} context={context} score={score}: {len(windows)} windows, each token scored once")


@pytest.mark.parametrize("context, score", [(64, 0), (64, 65)])
def test_eval_windows_rejects_bad_sizes(context, score):
    with pytest.raises(data.DataError) as error:
        next(data.eval_windows(np.arange(100), context, score))
    assert_one_line(error.value, "--eval_score")


def test_a_pretrained_tokenizer_is_one_cache_whatever_its_path(tmp_path, monkeypatch):
    """Two folders holding the same tokenizer.json (a model and its copy), or one reached through a symlink, share
    one token cache: the second run rebuilt it under its own path and the first run's generate.py found none."""
    from conftest import byte_level_bpe
    corpus, cache = write_corpus(tmp_path / "tiny"), str(tmp_path / "cache")
    (tmp_path / "model").mkdir()
    byte_level_bpe(corpus).save(str(tmp_path / "model" / "tokenizer.json"))
    shutil.copytree(tmp_path / "model", tmp_path / "copy")
    (tmp_path / "link").symlink_to(tmp_path / "model")
    first = data.prepare(corpus, tokenizer=str(tmp_path / "model" / "tokenizer.json"), cache_dir=cache)
    calls = []
    real = data.train_tokenizer
    monkeypatch.setattr(data, "train_tokenizer", lambda *a, **k: calls.append(1) or real(*a, **k))
    for other in ("copy", "link"):
        again = data.prepare(corpus, tokenizer=str(tmp_path / other / "tokenizer.json"), cache_dir=cache)
        assert again.cache == first.cache and np.array_equal(again.train, first.train)
    assert calls == []  # never rebuilt
    assert data.read_prepared(corpus, tokenizer=str(tmp_path / "model" / "tokenizer.json"), cache_dir=cache)


PTB_STYLE = {"train": [" the cat sat on the mat ", " a dog sat on a log ", "", " the mat is  on a  cat "] * 10,
             "valid": [" the dog sat ", " a cat on the log "], "test": [" the mat sat on a cat ", "  two spaces "]}


def test_a_pretrained_bpe_sees_the_file_as_its_tokenizer_encodes_it(tmp_path):
    """A byte-level BPE without a prefix space (GPT-2's, Qwen2's): the project's stream of each split is the
    tokenizer's own encoding of the file's text, id for id (its leading spaces and newlines as they are)."""
    from conftest import byte_level_bpe
    corpus = write_corpus(tmp_path / "ptb", PTB_STYLE)
    tokenizer = byte_level_bpe(corpus)
    path = str(tmp_path / "tokenizer.json")
    tokenizer.save(path)
    lm = data.prepare(corpus, tokenizer=path, cache_dir=str(tmp_path / "cache"))
    for split in data.SPLITS:
        raw = Path(corpus, f"{split}.txt").read_text()
        assert lm.__dict__[split].tolist() == tokenizer.encode(raw, add_special_tokens=False).ids, split
        assert lm.n_words[split] == len(raw.split()) + raw.count("\n")  # word-level perplexity's denominator
    raw = Path(corpus, "test.txt").read_text()
    assert lm.decode(lm.test) == raw and lm.encode(raw) == lm.test.tolist()


def test_a_pretrained_word_level_tokenizer_ends_each_line_with_its_eos(tmp_path):
    """A word-level tokenizer.json (WordLevel + whitespace split drops newlines): each line's words as it encodes
    them, then its <eos>; unknown words its unk_token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    corpus = write_corpus(tmp_path / "ptb", PTB_STYLE)
    words = ["[UNK]", data.EOS, "the", "cat", "sat", "on", "mat", "a", "dog", "log", "is"]
    tokenizer = Tokenizer(models.WordLevel({w: i + 3 for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = str(tmp_path / "tokenizer.json")
    tokenizer.save(path)
    from support import hf
    assert hf.tokenizer_file(str(tmp_path)) == path  # accepted: it has an <eos>
    lm = data.prepare(corpus, tokenizer=path, cache_dir=str(tmp_path / "cache"))
    eos = tokenizer.token_to_id(data.EOS)
    for split in data.SPLITS:
        lines = Path(corpus, f"{split}.txt").read_text().split("\n")[:-1]
        expected = [i for line in lines for i in tokenizer.encode(line).ids + [eos]]
        assert lm.__dict__[split].tolist() == expected, split
    assert lm.decode(lm.test).split("\n")[1] == "[UNK] [UNK]"  # "two spaces": words it does not know


def test_a_word_level_tokenizer_without_eos_is_refused_in_one_line(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from support import hf, runtime
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "the": 1}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(runtime.UserError, match=r"is a word-level tokenizer without <eos>: each line ends with <eos>"):
        hf.tokenizer_file(str(tmp_path))


def test_a_pretrained_bpe_that_merges_across_newlines_sees_the_same_ids(tmp_path):
    """WikiText-shaped text, blank lines included, and a byte-level BPE trained on the whole file (so it has merges
    such as " \\n \\n"): the stream is still the tokenizer's encoding of the file, id for id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    lines = [" = Valkyria = ", " ", " Senjo no Valkyria is a game . ", " ", " = = Gameplay = = ", " ", " It is . "] * 8
    corpus = write_corpus(tmp_path / "wiki", {"train": lines, "valid": lines[:7], "test": lines[:5]})
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer, tokenizer.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tokenizer.train_from_iterator([Path(corpus, "train.txt").read_text()], trainers.BpeTrainer(
        vocab_size=320, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    assert any("Ċ" in token and len(token) > 2 for token in tokenizer.get_vocab())  # merges over a newline
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    lm = data.prepare(corpus, tokenizer=str(tmp_path / "tokenizer.json"), cache_dir=str(tmp_path / "cache"))
    for split in data.SPLITS:
        assert lm.__dict__[split].tolist() == tokenizer.encode(Path(corpus, f"{split}.txt").read_text()).ids, split


def test_a_pretrained_word_level_tokenizer_keeps_its_normalizer_and_its_ids(tmp_path):
    """Its normalizer (lowercase here) and pre-tokenizer apply, and ids that do not count from 0 without gaps size
    the embedding table by the largest one."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    corpus = write_corpus(tmp_path / "c", {"train": ["The Cat sat", "a DOG"] * 5, "valid": ["the dog"], "test": ["Cat"]})
    tokenizer = Tokenizer(models.WordLevel({"<unk>": 0, data.EOS: 1, "the": 5, "cat": 6, "sat": 7, "a": 8, "dog": 20},
                                           unk_token="<unk>"))
    tokenizer.normalizer, tokenizer.pre_tokenizer = normalizers.Lowercase(), pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    lm = data.prepare(corpus, tokenizer=str(tmp_path / "tokenizer.json"), cache_dir=str(tmp_path / "cache"))
    assert lm.train.tolist()[:6] == [5, 6, 7, 1, 8, 20] and lm.test.tolist() == [6, 1]
    assert lm.vocab_size == 21  # the largest id + 1, not the 7 tokens


def test_a_run_on_the_old_pretrained_token_stream_is_refused_in_one_line():
    """Before the file was encoded as its tokenizer does, each line's words were re-joined: a checkpoint of that
    stream must not be continued on the new one (same tokenizer, same text, other ids)."""
    from support import runtime
    current = {"tokenizer": "abc", "data": "d", "stream": "the tokenizer's encoding of the file (cache format 2)"}
    run_files.check_identity({"identity": current}, current, "run/ckpt.pt")  # the same stream: fine
    with pytest.raises(runtime.UserError, match="^run/ckpt.pt was trained on a pretrained tokenizer's ids of each"):
        run_files.check_identity({"identity": {"tokenizer": "abc", "data": "d"}}, current, "run/ckpt.pt")


# -----------------------------------------------------------------------------
# A line's end and a prompt, for every kind of tokenizer: as the corpus's encoding gives them

WORDS = [" ".join(f"w{(7 * i + j) % 23}" for j in range(3 + i % 5)) for i in range(60)]  # lines of 3 to 7 words


def tokenizer_of(kind: str, corpus: str, folder: Path) -> str:
    """--tokenizer for data.prepare: word or bpe (the project's), else the path of a pretrained tokenizer.json."""
    from conftest import TOKENIZERS
    from tokenizers import Tokenizer, models, pre_tokenizers
    if kind in ("word", "bpe"):
        return kind
    if kind == "word level":
        tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", data.EOS] + sorted(
            {w for line in WORDS for w in line.split()}))}, unk_token="[UNK]"))
        tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    else:
        tokenizer = TOKENIZERS[kind](corpus)
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    return str(folder / "tokenizer.json")


@pytest.mark.parametrize("kind", ["no prefix space", "prefix space", "sentencepiece"])
def test_a_line_end_is_the_one_token_a_tokenizer_makes_of_a_newline_within_a_text(tmp_path, kind):
    """A tokenizer that adds a prefix space (or ▁) to a string's start makes 2 tokens of "\\n" alone, one of a newline
    within a text: it converts, and that token is the corpus's <eos> (it was refused)."""
    from support import hf
    corpus = write_corpus(tmp_path / "c", {"train": WORDS, "valid": WORDS[:5], "test": WORDS[5:9]})
    path = tokenizer_of(kind, corpus, tmp_path / "model")
    assert hf.tokenizer_file(str(tmp_path / "model")) == path
    lm = data.prepare(corpus, tokenizer=path, cache_dir=str(tmp_path / "cache"))
    assert lm.tokenizer.id_to_token(lm.eos_id) in ("Ċ", "\n")  # byte level's newline, sentencepiece-style's
    assert lm.test.tolist().count(lm.eos_id) == 4  # one a line


@pytest.mark.parametrize("lead", ["", " "])
@pytest.mark.parametrize("kind", ["no prefix space", "prefix space", "sentencepiece", "word level", "word", "bpe"])
def test_a_prompt_is_encoded_as_the_corpus_encodes_a_line(tmp_path, kind, lead):
    """Each line of the test split, given as a prompt without its leading space, gets the ids the corpus's stream has
    for it: the end of the line before, then its words, with the leading space the corpus's lines start with (PTB's
    do: "the" became the word piece "the", not "Ġthe", after GPT-2's newline)."""
    lines = [lead + line for line in WORDS]
    corpus = write_corpus(tmp_path / "c", {"train": lines, "valid": lines[:5], "test": lines[5:12]})
    lm = data.prepare(corpus, tokenizer=tokenizer_of(kind, corpus, tmp_path / "model"),
                      cache_dir=str(tmp_path / "cache"))
    test = lines[5:12]
    prompts = [lm.encode_prompt(line.lstrip()) for line in test[1:]]
    assert lm.test.tolist() == lm.encode(test[0]) + [i for ids in prompts for i in ids] + [lm.eos_id]
    assert lm.line_prefix == (lead if kind in ("no prefix space", "prefix space", "sentencepiece") else "")
