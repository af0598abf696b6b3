"""conftest.py's waits on another process: they return on the event, and fail saying what they waited for (and
why: the time passed, or the process exited first). Plain Python processes, no torch: a few tenths of a second."""

import subprocess
import sys

import pytest

import conftest
from conftest import wait_for_exit, wait_for_line, wait_until


def python(code: str):
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_wait_returns_on_its_event():
    process = python("import time; print('ready', flush=True); time.sleep(0.2); print('done')")
    assert wait_for_line(process, "ready", "the ready line") == "ready\n"
    assert wait_for_exit(process, "the process to end") == ("done\n", "") and process.returncode == 0


def test_a_process_that_exits_before_the_line_is_named():
    process = python("import sys; print('something else'); sys.exit('it broke')")
    with pytest.raises(AssertionError, match=r"waited for the ready line: the process exited \(1\) first\nit broke"):
        wait_for_line(process, "ready", "the ready line")


@pytest.mark.parametrize("wait", ["line", "exit", "condition"])
def test_a_wait_past_its_limit_says_what_it_waited_for(monkeypatch, wait):
    monkeypatch.setattr(conftest, "EVENT_TIMEOUT", 0.3)
    process = python("import time; time.sleep(60)")
    with pytest.raises(AssertionError, match=r"waited for the event: not within 0.3 s"):
        if wait == "line":
            wait_for_line(process, "ready", "the event")
        elif wait == "exit":
            wait_for_exit(process, "the event")
        else:
            wait_until(lambda: False, "the event", process)
    process.kill()  # wait_until leaves the process to its caller
    process.wait()
