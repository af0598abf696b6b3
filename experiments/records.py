"""
The study's record of each finished run, kept in the repository (results/runs/): what the results tables need
(its results.json, flags, machine, probes, translations) and a digest of its weights, but not the weights. The
runs train under out/, which a new machine or a clean checkout does not have: the study then restores the records
and trains only what is missing, and its results stage reads the records where out/ lacks a run. A teacher is
trained again only where a run still to do needs its weights; the same flags on the same machine and thread count give
the same weights, and the digests check that they did. On another machine the float sums may round otherwise: the
teacher's record then stays (its numbers are the ones its earlier conversions started from), and the new training's
files are kept beside it, in retrained/.
"""

import dataclasses
import hashlib
import json
import os
import platform
import shutil
import time

from support.runtime import atomic_write, write_json

# The flags a run's args.json may differ in from the plan's: paths that name another machine's checkout (the teacher
# is checked by its digest instead), and --resume, which the study adds
UNCHECKED = ("out_dir", "pretrained", "resume")
RETRAINED = "retrained"  # the files of a kept run trained again for its weights, which came out other than its record's
KEPT = ("args.json", "results.json", "machine.json", "weights.json", "attention.csv", "speed.json", "decode.json",
        "teacher_results.json", "softmax_layers.json", "valid.hyp", "test.hyp")


def machine() -> dict:
    """Where a run ran: its minutes and tokens/s only compare with runs on the same machine."""
    import torch
    cpu = platform.processor() or platform.machine()
    if os.path.isfile("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"{cpu}, {os.cpu_count()} cores"
    return {"device": device, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}


def digest(path: str) -> str:
    """A checkpoint's weights as 16 hex digits: its tensors' names and bytes (not the file, which holds times)."""
    import torch
    state = torch.load(path, map_location="cpu", weights_only=True)["model"]
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def weights_of(run) -> dict:
    """weights.json: the digest of each checkpoint the run left, and of the teacher's it was converted from."""
    found = {name: digest(os.path.join(run.out_dir, name)) for name in ("model.pt", "ckpt.pt")
             if os.path.isfile(os.path.join(run.out_dir, name))}
    teacher = run.flags.get("pretrained")
    return {**found, **({"teacher": digest(teacher)} if teacher and os.path.isfile(teacher) else {})}


def same_value(saved, planned) -> bool:
    """A flag's value as args.json saved it against another's (or the plan's): 3 and 3.0 are the same."""
    if planned is True or saved is None:
        return saved is planned
    try:
        return float(saved) == float(planned)
    except (TypeError, ValueError):
        return str(saved) == str(planned)


def read(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


class Records:
    """The records of the runs under `out`, in the same layout under `root` (results/runs/lm/softmax-random-s0)."""

    def __init__(self, out: str, root: str):
        self.out, self.root = out, root

    def folder(self, run) -> str:
        return os.path.join(self.root, os.path.relpath(run.out_dir, self.out))

    def keep(self, run):
        """Copy the finished run's small files into its record (weights.json first written where missing), unless
        the run trained again, with its record's flags, into other weights: those files go to retrained/."""
        if not os.path.isfile(os.path.join(run.out_dir, "weights.json")):
            write_json(os.path.join(run.out_dir, "weights.json"), weights_of(run))
        if self.trained_again_otherwise(run):
            self.set_aside(run)
        for name in KEPT:
            source, target = os.path.join(run.out_dir, name), os.path.join(self.folder(run), name)
            if os.path.isfile(source) and not same_file(source, target):
                copy(source, target)

    def trained_again_otherwise(self, run) -> bool:
        """The run's weights are not its record's, though it trained with the record's flags (the plan's)."""
        record, here = (read(os.path.join(folder, "weights.json")) for folder in (self.folder(run), run.out_dir))
        if None in (record.get("model.pt"), here.get("model.pt")) or record["model.pt"] == here["model.pt"]:
            return False  # the same weights, or weights no longer there to compare
        flags, kept_flags = (read(os.path.join(folder, "args.json")) for folder in (run.out_dir, self.folder(run)))
        return all(same_value(flags.get(name), kept_flags.get(name)) for name in run.flags if name not in UNCHECKED)

    def set_aside(self, run):
        """The new training's files move to retrained/ (in the record and the out_dir), and the out_dir reads as
        the record again; its checkpoints stay the new ones, which retrained/weights.json names."""
        for name in KEPT:
            source = os.path.join(run.out_dir, name)
            if os.path.isfile(source):
                for folder in (self.folder(run), run.out_dir):
                    copy(source, os.path.join(folder, RETRAINED, name))
                os.remove(source)
            if os.path.isfile(os.path.join(self.folder(run), name)):
                copy(os.path.join(self.folder(run), name), source)
        was, now = (self.digest_of(run, "model.pt", *sub) for sub in ((), (RETRAINED,)))
        print(f"{run.name} trained again with its recorded flags gives other weights ({now}, the record's {was}: "
              f"float sums round otherwise on another machine); its record stays, the new training's files are "
              f"in {RETRAINED}/, and what converts it now starts from the new weights", flush=True)

    def kept(self, run) -> bool:
        return os.path.isfile(os.path.join(self.folder(run), "results.json"))

    def or_record(self, run):
        """The run as the results tables read it: itself where its out_dir has its results, else, where it is kept,
        the same run with its record's folder as out_dir (a new machine's out/ is empty; the tables need no weights)."""
        if os.path.isfile(os.path.join(run.out_dir, "results.json")) or not self.kept(run):
            return run
        return dataclasses.replace(run, flags={**run.flags, "out_dir": self.folder(run)})

    def restore(self, run) -> bool:
        """Bring a kept run's files (and its retrained/ ones) back into an out_dir that has neither results nor a
        checkpoint."""
        if not self.kept(run) or any(os.path.exists(os.path.join(run.out_dir, f)) for f in ("results.json", "ckpt.pt")):
            return False
        for sub in ("", RETRAINED):
            for name in KEPT:
                if os.path.isfile(os.path.join(self.folder(run), sub, name)):
                    copy(os.path.join(self.folder(run), sub, name), os.path.join(run.out_dir, sub, name))
        return True

    def unrestore(self, run):
        """Remove the restored files of a teacher whose weights are needed again: it trains anew (its record stays,
        to check the new weights against)."""
        for name in KEPT:
            path = os.path.join(run.out_dir, name)
            if os.path.isfile(path):
                os.remove(path)

    def teacher_digest(self, run) -> str | None:
        """The digest of the teacher's weights the conversion `run` started from, as its record says."""
        return read(os.path.join(self.folder(run), "weights.json")).get("teacher")

    def digest_of(self, run, checkpoint: str, *sub: str) -> str | None:
        """The digest of run's `checkpoint` (model.pt or ckpt.pt) as its record (or its retrained/) says."""
        return read(os.path.join(self.folder(run), *sub, "weights.json")).get(checkpoint)

    def digests_of(self, run, checkpoint: str) -> set:
        """Every weights of run's `checkpoint` a conversion may have started from: its record's, and its retrained/."""
        return {self.digest_of(run, checkpoint, *sub) for sub in ((), (RETRAINED,))} - {None}


def copy(source: str, target: str):
    with atomic_write(target) as tmp:
        shutil.copyfile(source, tmp)


def same_file(a: str, b: str) -> bool:
    if not os.path.isfile(b) or os.path.getsize(a) != os.path.getsize(b):
        return False
    with open(a, "rb") as f, open(b, "rb") as g:
        return f.read() == g.read()
