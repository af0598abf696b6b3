"""The README's code, as written: every fenced block that is code is checked against the code it shows.

The rule, by the block's fence and the line right above it:

- `<!-- from: PATH -->` on the line right above the opening fence (PATH relative to the repository's root): the block
  quotes PATH. Every non-blank line of it, stripped of its indentation, is a line of PATH, in the same order (lines of
  PATH may be left out between two quoted lines). Any fence (```python, or a plain ``` for other code) can carry it.
- ```python without that line: a runnable example. It runs, and what it says it prints is printed (The API).
- ```bash: commands. Each script a command runs (`python X.py`, `bash X.sh`, `python -m package.module` of this
  repository, `-r requirements.txt`) exists, and each `--flag` given to train_lm.py, train_mt.py, generate.py or
  translate.py is one of that script's flags (its --help).
- A plain ``` block without the line is not code (a formula, a run's expected output), except the file map under
  "## Files", whose paths exist.

"""

import contextlib
import functools
import importlib
import io
import os
import re
import shlex

import pytest

from conftest import ROOT

FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", flags=re.S | re.M)
FROM = re.compile(r"^<!-- from: (\S+) -->$")

# The make_model excerpt as it stood before train_lm.py's main was rewritten; once the README's text changes, the
# block is checked like any other.


def readme_text() -> str:
    return open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


def blocks() -> list:
    """(line number, language, the file it quotes or None, code) of every fenced block in the README."""
    text, found = readme_text(), []
    for match in FENCE.finditer(text):
        before = text[:match.start()].splitlines()
        quoted = FROM.match(before[-1]) if before else None
        found.append((len(before) + 1, match.group(1), quoted and quoted.group(1), match.group(2)))
    return found


def readme_block(heading: str) -> str:
    """The first ```python block under a README heading."""
    section = readme_text().split(f"## {heading}\n", 1)[1]
    return re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)


def block_id(block) -> str:
    return f"README.md:{block[0]}"


QUOTING = [b for b in blocks() if b[2]]
COMMANDS = [b for b in blocks() if b[1] == "bash" and not b[2]]


def test_the_readme_has_the_blocks_this_file_checks():
    kinds = [(language, path is not None) for _, language, path, _ in blocks()]
    assert len(QUOTING) >= 2 and len(COMMANDS) >= 4 and ("python", False) in kinds
    assert not [b for b in blocks() if b[1] not in ("", "python", "bash")], "a new kind of block: say how to check it"


@pytest.mark.parametrize("block", QUOTING, ids=block_id)
def test_a_quoting_snippet_is_lines_of_the_file_it_names_in_order(block):
    line, _, path, code = block
    assert os.path.isfile(os.path.join(ROOT, path)), f"README.md:{line} quotes {path}, which does not exist"
    source = [text.strip() for text in open(os.path.join(ROOT, path), encoding="utf-8")]
    quoted = [text.strip() for text in code.splitlines() if text.strip()]
    at, missing = 0, []
    for text in quoted:  # each line after the one before it
        if text in source[at:]:
            at += source[at:].index(text) + 1
        else:
            missing.append(text)
    assert missing == [], f"README.md:{line}: lines not in {path} (or not in its order): {missing}"


def test_the_api_snippet_runs_and_its_state_is_the_size_it_says():
    runnable = [code for _, language, path, code in blocks() if language == "python" and not path]
    code = readme_block("The API")
    assert runnable == [code], "a ```python block without <!-- from: FILE --> above it runs: give it a test here"
    claimed = int(re.search(r"print\(state_bytes\(state\)\)\s+# (\d+) =", code).group(1))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), {})
    assert printed.getvalue().split() == [str(claimed)]


def commands(code: str) -> list:
    """The commands of a shell block, each a list of words: comments dropped, continued lines joined, pipes and &&
    split."""
    words = [w for text in code.replace("\\\n", " ").splitlines() for w in shlex.split(text, comments=True) + [";"]]
    found, current = [], []
    for word in words:
        if word in ("|", "&&", ";"):
            found, current = found + [current] * bool(current), []
        else:
            current.append(word)
    return found


@functools.cache
def script_flags(script: str) -> set:
    """The --flags of one of the repository's scripts, from its --help."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), pytest.raises(SystemExit):
        importlib.import_module(script[:-3]).get_args(["--help"])
    return set(re.findall(r"--\w+", printed.getvalue()))


@pytest.mark.parametrize("block", COMMANDS, ids=block_id)
def test_a_shell_block_runs_scripts_that_exist_with_their_flags(block):
    line, _, _, code = block
    for words in commands(code):
        files = [w for w in words if w.endswith((".py", ".sh", ".txt")) and not w.startswith("out/")]
        modules = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "-m"]
        files += [m.replace(".", "/") + ".py" for m in modules if os.path.isdir(os.path.join(ROOT, m.split(".")[0]))]
        missing = [f for f in files if not os.path.isfile(os.path.join(ROOT, f))]
        assert missing == [], f"README.md:{line}: `{' '.join(words)}` names {missing}, not in the repository"
        script = next((w for w in words if w in ("train_lm.py", "train_mt.py", "generate.py", "translate.py")), None)
        if script:
            unknown = {w.split("=")[0] for w in words if w.startswith("--")} - script_flags(script)
            assert not unknown, f"README.md:{line}: {script} has no {sorted(unknown)}"


def test_the_file_map_names_files_that_exist():
    """Each line of the map under "## Files" starts with its names; an indented line's are in the folder above."""
    listing = FENCE.search(readme_text().split("## Files\n", 1)[1]).group(2)
    paths, folder = [], ""
    for text in listing.splitlines():
        names = re.split(r",\s*", text.strip().split("  ")[0])
        folder = folder if text.startswith("  ") else names[0] if names[0].endswith("/") else ""
        paths += [(folder if text.startswith("  ") else "") + name for name in names]
    missing = [path for path in paths if not os.path.exists(os.path.join(ROOT, path))]
    assert len(paths) > 20 and missing == [], missing


def test_dated_figures_live_in_results_not_in_the_tutorial():
    """A date beside a figure (a timing, a machine's run) belongs to results/measurements.md or the results summary."""
    tutorial = readme_text().split("\n## Results\n", 1)[0]
    dated = [line for line in tutorial.splitlines() if re.search(r"\b20\d\d-\d\d-\d\d\b", line)]
    assert dated == [], f"move these to results/measurements.md and leave a pointer: {dated}"
