"""
A run's folder, as the training loop keeps it: one run per --out_dir (a lock), the checkpoint --resume continues,
the checks that a resumed or evaluated run is the same run (its data, its processes), and results.json.

    <out_dir>/.lock  args.json  ckpt.pt (every --eval_interval steps)  model.pt, results.json (finished)
             (a checkpoint holds its tokenizer: a language model's since train_lm.py keeps it, a translator's always)
             snapshot_<step>.pt (a translator's, averaged into model.pt)

A run's files are its own: a new run starts only in a folder no run has written outputs to.
"""

import glob
import json
import os
import re

try:
    import fcntl  # the out_dir lock is POSIX only: elsewhere runs go without it
except ImportError:
    fcntl = None

from support.checkpoints import load_checkpoint
from support.runtime import PARTIAL, UserError, fingerprint, write_json


def lock_out_dir(task):
    """One run per out_dir: the main process holds <out_dir>/.lock until it exits, and a second run is refused."""
    out_dir = task.args.out_dir
    try:
        os.makedirs(out_dir, exist_ok=True)
        task.lock = open(os.path.join(out_dir, ".lock"), "w")
    except OSError as error:
        raise UserError(f"cannot write to --out_dir {out_dir} ({error.strerror}): pick a writable folder") from None
    try:
        if fcntl:
            fcntl.flock(task.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released by the system when the process ends
    except BlockingIOError:
        raise UserError(f"another run is using {out_dir} (it holds {out_dir}/.lock): wait for it to finish, "
                        f"or pick another --out_dir") from None
    for stale in own_partial_writes(out_dir):  # a write of ours killed midway; under the lock no other process writes
        os.remove(stale)


def own_partial_writes(out_dir: str) -> list:
    """What writes of this project killed midway left in out_dir: atomic_write's temporaries (<file>.<pid>
    .t2r-partial), and those of the code before them (<file>.<pid>.tmp, <file> one the run writes). A user's file,
    *.tmp included, is never one."""
    ours = glob.glob(os.path.join(glob.escape(out_dir), f"*{PARTIAL}"))
    older = [path for pattern in RUN_OUTPUTS + ("args.json",)
             for path in glob.glob(os.path.join(glob.escape(out_dir), f"{pattern}.*.tmp"))
             if re.fullmatch(r"\d+", path[:-len(".tmp")].rsplit(".", 1)[-1])]
    return ours + older


# What a run leaves in its folder besides args.json (written at its start): a new run starts where none of these is
RUN_OUTPUTS = ("ckpt.pt", "model.pt", "results.json", "snapshot_*.pt")


def earlier_outputs(out_dir: str) -> list:
    return sorted(os.path.basename(p) for pattern in RUN_OUTPUTS
                  for p in glob.glob(os.path.join(glob.escape(out_dir), pattern)))


def open_run(task) -> dict | None:
    """Claim --out_dir for this run (a lock) and return the checkpoint --resume continues; None for a new run, which
    is refused where a run was already started."""
    args = task.args
    if task.ddp.is_main:
        lock_out_dir(task)
    path = os.path.join(args.out_dir, "ckpt.pt")
    if not args.resume and os.path.exists(path):
        raise UserError(f"{path} exists: pass --resume to continue it, --eval_only to evaluate it, "
                        f"or choose another --out_dir")
    left = [] if args.resume else earlier_outputs(args.out_dir)
    if left:  # e.g. a run killed after its first snapshots, before its first ckpt.pt: not this run's
        shown = ", ".join(left[:3]) + (" ..." if len(left) > 3 else "")
        raise UserError(f"{args.out_dir} holds {shown} of an earlier run that cannot be resumed (it has no ckpt.pt): "
                        f"delete them, or choose another --out_dir")
    if args.resume and not os.path.exists(path):  # e.g. stopped before its first checkpoint
        raise UserError(nothing_to_resume(args.out_dir))
    return load_checkpoint(path) if args.resume else None


def nothing_to_resume(out_dir: str) -> str:
    return (f"nothing to resume in {out_dir}: no checkpoint (ckpt.pt) was saved there; to start the run again, run "
            f"the same command without --resume")


def open_finished(task) -> dict:
    """--eval_only: the checkpoint of <out_dir>/model.pt, with --out_dir locked (its results.json is rewritten)."""
    path = os.path.join(task.args.out_dir, "model.pt")
    if not os.path.isfile(path):
        raise UserError(f"no finished model at {path}: finish the run first (--resume --out_dir "
                        f"{task.args.out_dir})")
    checkpoint = load_checkpoint(path, "finished model")
    if task.ddp.is_main:
        lock_out_dir(task)
    return checkpoint


def data_identity(lm) -> dict:
    """A language model's data as a checkpoint's identity keeps it: the tokenizer's hash and the corpus fingerprints
    that data.prepare keeps beside its cache (meta.json)."""
    with open(os.path.join(lm.cache, "meta.json")) as f:
        meta = json.load(f)
    identity = {"tokenizer": meta["tokenizer_sha1"],
                "data": fingerprint(json.dumps(meta["fingerprint"], sort_keys=True))}
    if "content" in meta:  # the whole text's hashes; a checkpoint written before them is checked on "data" alone
        identity["content"] = fingerprint(json.dumps(meta["content"], sort_keys=True))
    if meta["kind"] not in ("word", "bpe"):  # a pretrained tokenizer's ids are the file's own encoding since format 2
        identity["stream"] = f"the tokenizer's encoding of the file (cache format {meta['format']})"
    return identity


def check_identity(checkpoint: dict, current: dict, path: str):
    """Refuse to continue or evaluate a run on another tokenizer, other data, or another number of processes."""
    saved = checkpoint.get("identity", {})
    if "stream" in current and "tokenizer" in saved and "stream" not in saved:
        raise UserError(f"{path} was trained on a pretrained tokenizer's ids of each line's words re-joined, which this "
                        "version no longer makes (it encodes the file as the tokenizer does): train a new run in "
                        "another --out_dir")
    for key in sorted(set(saved) & set(current)):
        if saved[key] == current[key]:
            continue
        if key == "world_size":
            raise UserError(f"{path} was trained by {saved[key]} process(es), this run has {current[key]}: resume "
                            f"with torchrun --nproc_per_node {saved[key]} (each process draws its own batches)")
        what = {"data": "corpus"}.get(key, key)
        raise UserError(f"{path} was trained on another {what} ({saved[key]}, now {current[key]}): the data changed "
                        f"since; pass the --dataset it was trained on, or train a new run in another --out_dir")


def set_aside_shorter_run(out_dir: str, step: int):
    """A finished run trained on for more steps: its model.pt and results.json (of `step`) are kept beside it,
    renamed, and no longer read as the finished run's."""
    for name in ("model.pt", "results.json"):
        path = os.path.join(out_dir, name)
        if os.path.exists(path):
            stem, ext = os.path.splitext(name)
            os.replace(path, os.path.join(out_dir, f"{stem}_step{step}{ext}"))
            print(f"{name} of the run's {step} steps kept as {stem}_step{step}{ext}")


def write_results(task, results: dict) -> dict:
    if task.ddp.is_main and results:
        write_json(os.path.join(task.args.out_dir, "results.json"), results)
    return results


def evaluate_finished(task, model, checkpoint: dict) -> dict:
    """--eval_only: the final evaluation of the finished model (open_finished's checkpoint) again."""
    path = os.path.join(task.args.out_dir, "model.pt")
    model = model.to(task.device)
    check_identity(checkpoint, task.identity(), path)
    results = task.report(model, checkpoint.get("train_seconds", 0.0))
    return write_results(task, {**training_record(task.args.out_dir), **results} if results else results)


def training_record(out_dir: str) -> dict:
    """What results.json says of the training itself (the learning curve, the figures after the transfer stage),
    which evaluating the finished model again must keep: from ckpt.pt, the run's last state."""
    path = os.path.join(out_dir, "ckpt.pt")
    if not os.path.isfile(path):
        return {}
    checkpoint = load_checkpoint(path)
    record = {"curve": checkpoint.get("curve", [])}
    if checkpoint.get("after_transfer"):
        record["after_transfer"] = checkpoint["after_transfer"]
    return record
