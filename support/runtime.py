"""
What every script needs around the model: one-line errors, the command line, the device and precision,
data-parallel processes, files written atomically, memory checks. Checkpoints: support/checkpoints.py.
"""

import argparse
import contextlib
import copy
import csv
import errno
import hashlib
import json
import math
import re
import os
import sys
from contextlib import nullcontext
from dataclasses import MISSING, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist

from t2r import Config


# -----------------------------------------------------------------------------
# Errors and the command line

class UserError(Exception):
    """Bad input (flags, data, checkpoint): main() prints the one-line message and exits with status 2."""


class Interrupted(Exception):
    """Ctrl-C or SIGTERM during training: the run saved its checkpoint and stops (exit status 130, as for SIGINT)."""


def run_main(main):
    """Call main(); a UserError or a bad flag becomes one line on stderr instead of a traceback, and so do Ctrl-C
    (exit status 130, as for SIGINT) and a full disk (the output redirected to it, or a file written there)."""
    try:
        main()
        sys.stdout.flush()  # here, not at exit: a full disk under `> file` is then caught below
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except Interrupted as message:
        print(message, file=sys.stderr)
        sys.exit(130)
    except KeyboardInterrupt:  # Ctrl-C where nothing is left to save (generation, decoding, a second Ctrl-C)
        print("\nstopped by Ctrl-C", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:  # the reader went away (`... | head`): stop quietly, as a shell tool does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that the exit's flush cannot fail again
        sys.exit(1)
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = f" writing {error.filename}" if error.filename else " writing the output"
        print(f"error: no space left on the device{where}: free some space, or write somewhere else",
              file=sys.stderr)
        try:
            sys.stdout.flush()
        except OSError:  # the output is what is full: what is left of it goes nowhere, so the exit's flush cannot fail
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(2)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: unknown or malformed flags are rejected with a hint."""

    def error(self, message):  # prog is a script's name (train_lm.py) or a module's command (python -m ...)
        command = self.prog if self.prog.startswith("python ") else f"python {self.prog}"
        self.exit(2, f"error: {message} (see {command} --help)\n")


# Flag types: the rule sits beside each flag (type=positive_int, ...), and argparse refuses a value that breaks
# it with a one-line error before any work starts.

def _number(kind, rule: str, holds):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (math.isfinite(value) and holds(value)):
            raise argparse.ArgumentTypeError(f"{text} is not {rule}")
        return value
    parse.__name__ = rule  # argparse names the type in some messages
    return parse


positive_int = _number(int, "a positive integer", lambda v: v >= 1)
non_negative_int = _number(int, "an integer >= 0", lambda v: v >= 0)
positive_float = _number(float, "a positive finite number", lambda v: v > 0)
non_negative_float = _number(float, "a finite number >= 0", lambda v: v >= 0)
finite_float = _number(float, "a finite number", lambda v: True)
fraction = _number(float, "in [0, 1)", lambda v: 0 <= v < 1)
unit_interval = _number(float, "in [0, 1]", lambda v: 0 <= v <= 1)
seed = _number(int, "a seed from 0 to 2**63 - 1", lambda v: 0 <= v < 2**63)  # what torch and numpy both take
# a decoding's length limit, a * source length + b tokens: a count, never an overflow of int64
length_factor = _number(float, "a number from 0 to 10000", lambda v: 0 <= v <= 10_000)
length_term = _number(int, "an integer from 1 to 1000000", lambda v: 1 <= v <= 1_000_000)


def pattern(text: str) -> str:
    """A regular expression (--only's): refused where re cannot compile it."""
    try:
        re.compile(text)
    except re.error as error:
        raise argparse.ArgumentTypeError(f"{text!r} is not a regular expression ({error})") from None
    return text


def increasing_ints(text: str) -> list:
    """Comma-separated positive integers in increasing order ("" for none): e.g. vocabulary cutoffs."""
    values = [positive_int(part) for part in text.split(",")] if text.strip() else []
    if values != sorted(set(values)):
        raise argparse.ArgumentTypeError(f"{text!r} is not increasing")
    return values


def device_name(text: str) -> str:
    """auto, cpu, cuda, cuda:N or mps, and only a device this machine has."""
    if text == "auto":
        return text
    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{text!r} is no device: use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not (torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count()):
        raise argparse.ArgumentTypeError(f"{text}: this machine has no such CUDA device (use cpu or auto)")
    if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise argparse.ArgumentTypeError(f"{text}: this machine has no MPS device (use cpu or auto)")
    if device.type not in ("cpu", "cuda", "mps"):
        raise argparse.ArgumentTypeError(f"{text}: use auto, cpu, cuda, cuda:N or mps")
    return text


def print_config(title: str, values):
    """One line, `title: name=value, ...`. values: a dict, or a model's config (a dataclass): then only the fields that
    differ from its class's defaults, and the class named unless it is the paper's Config."""
    if is_dataclass(values):
        title, values = (title if type(values) is Config else f"{title} ({type(values).__name__})",
                         changed_fields(values))
    print(f"{title}: " + (", ".join(f"{k}={v}" for k, v in values.items()) or "the defaults"))


def changed_fields(config) -> dict:
    """{field: value} of a config's fields whose value is not its class's default."""
    defaults = {f.name: f.default_factory() if f.default is MISSING else f.default for f in fields(config)}
    return {k: v for k, v in config.to_dict().items() if k not in defaults or v != defaults[k]}


def explicit_flags(parser, argv) -> set:
    """The flags given on the command line (not left at their defaults)."""
    quiet = copy.deepcopy(parser)
    for action in quiet._actions:
        action.default = argparse.SUPPRESS
    return set(vars(quiet.parse_args(argv)))


def serializable(values: dict) -> dict:
    return {k: v for k, v in values.items() if isinstance(v, (int, float, str, bool, type(None)))}


def fingerprint(text: str) -> str:
    """A short hash that tells two tokenizers or corpora apart."""
    return hashlib.sha1(text.encode()).hexdigest()[:16]


# -----------------------------------------------------------------------------
# Device and precision

def decoding_kernels():
    """Before decoding with a KV cache, on CUDA: scaled_dot_product_attention picks a kernel per call, and cuDNN's,
    which it may prefer for bf16 on recent GPUs, builds a plan for every new shape; a KV cache has a new key length at
    every token, a translator a new source length at every batch. Flash, memory-efficient and math kernels take any
    shape as it comes, so the decoding scripts turn cuDNN's off (for the process: it is a global switch)."""
    torch.backends.cuda.enable_cudnn_sdp(False)


def resolve_device(requested: str = "auto") -> torch.device:
    """cuda, then mps, then cpu."""
    if requested == "auto":
        if torch.cuda.is_available():
            requested = "cuda"
        elif getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            requested = "mps"
        else:
            requested = "cpu"
    return torch.device(requested)


def get_device(requested: str = "auto") -> torch.device:
    """resolve_device, saying what it chose."""
    device = resolve_device(requested)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} threads"
    print(f"device: {device} ({name})")
    return device


def resolve_dtype(requested: str, device: torch.device) -> str:
    """Mixed precision only on CUDA: bf16 where supported, else fp16 with a GradScaler. CPU trains in fp32."""
    if requested != "auto":
        return requested
    if device.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "float32"


def autocast_context(device: torch.device, dtype: str):
    if dtype == "float32":
        return nullcontext()
    return torch.autocast(device.type, dtype=getattr(torch, dtype))


def make_scaler(device: torch.device, dtype: str):
    return torch.amp.GradScaler(device.type, enabled=(dtype == "float16"))


# -----------------------------------------------------------------------------
# Distributed data parallel (torchrun)

@dataclass
class Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_distributed() -> Distributed:
    """Under torchrun (WORLD_SIZE > 1): one process per device, NCCL on CUDA and gloo on CPU."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return Distributed()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl" and local_rank >= torch.cuda.device_count():
        raise UserError(f"torchrun started more processes on this machine than it has GPUs "
                        f"({torch.cuda.device_count()}): use --nproc_per_node {torch.cuda.device_count()} or fewer, "
                        f"or CUDA_VISIBLE_DEVICES= to train on the CPU (gloo)")
    dist.init_process_group(backend)
    info = Distributed(dist.get_rank(), world_size, local_rank)
    if backend == "nccl":
        torch.cuda.set_device(info.local_rank)
    return info


def all_reduce_sum(values: torch.Tensor, ddp: Distributed) -> torch.Tensor:
    if ddp.enabled:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


# -----------------------------------------------------------------------------
# Checkpoints: written atomically, loaded with weights_only=True, resumed exactly

def rng_state(generator: torch.Generator | None = None) -> dict:
    """The global (dropout) RNG, and the data generator of trainers that draw batches from one."""
    state = {"torch": torch.get_rng_state()}
    if generator is not None:
        state["data"] = generator.get_state()
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()  # this process's device only
    return state


def set_rng_state(state: dict, generator: torch.Generator | None = None):
    torch.set_rng_state(state["torch"])
    if generator is not None:
        generator.set_state(state["data"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def gather_rng(state: dict, ddp: Distributed) -> list:
    """Every process's RNG state, so a resumed data-parallel run continues each stream."""
    if not ddp.enabled:
        return [state]
    states = [None] * ddp.world_size
    dist.all_gather_object(states, state)
    return states


PARTIAL = ".t2r-partial"  # atomic_write's temporary files end so, which no file of a user's does


@contextlib.contextmanager
def atomic_write(path: str | Path) -> Iterator[str]:
    """The one way this project writes a file: yield a temporary name to write, then rename it over path
    once complete. An interrupted write never leaves a half-written file under the real name, and a
    failed one leaves nothing (the temporary file is removed). Used for checkpoints, tables and caches.

        with atomic_write("results.json") as tmp:
            Path(tmp).write_text(text)
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}{PARTIAL}"  # the pid: two processes never write the same temporary file
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_json(path: str, values: dict):
    with writable(path), atomic_write(path) as tmp, open(tmp, "w") as f:
        json.dump(values, f, indent=1)


def write_csv(path: str, rows: list[dict], columns: list[str] | None = None):
    """A results table; None becomes an empty cell."""
    with writable(path), atomic_write(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns or list(rows[0]), extrasaction="ignore")
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in row.items()} for row in rows)


@contextlib.contextmanager
def writable(path: str):
    """A file that cannot be written (a folder of that name, a read-only place) is a one-line error."""
    try:
        yield
    except OSError as error:
        raise UserError(f"could not write {path} ({error.strerror or error}): pick another path") from None


def free_memory(device: torch.device) -> int | None:
    """Bytes that can still be allocated on device: the GPU's free memory, else the system's MemAvailable (None
    where it is unknown: no check)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            free = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        free = None
    room = address_space_left()  # under `ulimit -v` an allocation fails past the limit, however much memory is free
    return room if free is None else free if room is None else min(free, room)


def address_space_left() -> int | None:
    """Bytes this process may still map under its address-space limit (ulimit -v), None where there is none."""
    try:
        import resource
        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit == resource.RLIM_INFINITY:
            return None
        with open("/proc/self/status") as f:
            used = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        return max(0, limit - used)
    except (ImportError, OSError, StopIteration, ValueError):
        return None


def check_fits(needed: int, device: torch.device, what: str, fix: str):
    """Refuse in one line, before it is allocated, what cannot fit: `needed` bytes (an estimate, rather low than
    high) against the memory free on device."""
    free = free_memory(device)
    if free is not None and needed > free:
        raise UserError(f"{what} would take about {needed / 2**30:,.1f} GiB, more than the {free / 2**30:,.1f} GiB "
                        f"free on this {device.type}: {fix}")


def unwrap(model):
    """The plain module under DDP and torch.compile, whose state dict has the clean names."""
    model = getattr(model, "module", model)
    return getattr(model, "_orig_mod", model)
