"""The README's code, as written: its API snippet runs and prints the state size it claims."""

import contextlib
import io
import os
import re

from conftest import ROOT


def readme_block(heading: str) -> str:
    """The first ```python block under a README heading."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = text.split(f"## {heading}\n", 1)[1]
    return re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)


def test_the_api_snippet_runs_and_its_state_is_the_size_it_says():
    code = readme_block("The API")
    claimed = int(re.search(r"print\(state_bytes\(state\)\)\s+# (\d+) =", code).group(1))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), {})
    assert printed.getvalue().split() == [str(claimed)]


def test_the_idea_in_code_quotes_t2r_py_line_for_line():
    """The README's excerpt of the feature map and the recurrent step: every line of it is a line of t2r.py."""
    excerpt = readme_block("The idea in code")
    source = {line.strip() for line in open(os.path.join(ROOT, "t2r.py"))}
    quoted = [line.strip() for line in excerpt.splitlines() if line.strip()]
    assert len(quoted) > 10 and [line for line in quoted if line not in source] == []
