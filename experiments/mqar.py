"""
What a fixed-size state forgets, where it can be seen: multi-query associative recall (MQAR; Arora et al., 2023,
"Zoology"). A sequence lists N key-value pairs, then asks for the keys again at random later positions; the model
must answer each with its value. Softmax attention looks the key up in its KV cache; a T2R state (S, z) of k x d
numbers a head must hold all N pairs at once.

    python -m experiments.mqar               # the experiment, resumable: 35 runs, 15 of them for the teacher's
                                             # 10,000 steps (40 to 70 minutes each at one thread, 2-core EPYC and
                                             # Xeon, 2026-11-25/26), 20 conversions of 2-9 minutes: 11-20 CPU-hours
    python -m experiments.mqar --quick       # a smoke run of every model, tiny and short (out/mqar-quick)
    python -m experiments.mqar --dry_run     # the runs: done, kept (read back from the records) or to train
    python -m experiments.mqar --only conv & python -m experiments.mqar --only '^(?!.*conv)'   # two at once

The runs, each a run folder in --out_dir trained by support/training.py's loop (exact resume, one run per folder):
the softmax teacher; its conversions to T2R at k = 8, 16, 32, 64 (section 2.2), also after attention transfer (output
matching into T2R's ReLU feature map; its recall right after the transfer is kept too) and with a sliding softmax
window (after_t2r.py); softmax, T2R and SRU++ trained from scratch for the teacher's budget and curriculum, at each
learning rate of a sweep, the one with the lowest validation loss reported (as Zoology trains its baselines). All of
it again with a short convolution before each attention layer (after_t2r.ConvLM; Zoology's baselines all have one),
but the window hybrid (its model class has none) and SRU++ (its own architecture). Every model is scored on the same
fixed sequences at 4 to 64 pairs, and its state measured after each length: results/mqar.csv, results/mqar.png. A
finished run's results.json, config.json (the model's, from its checkpoint), args.json (the loop's flags: train_lm.py's,
whose --attn and --pretrained defaults do not describe the model) and machine.json are kept in results/runs/mqar/ (a
new machine reads them, trains nothing, and rebuilds the committed table; results/mqar.json says where and when the
runs trained, from their machine.json).

The data differs from Zoology's generator in two ways: the queries sit at uniformly random positions after the pairs
(Zoology draws their gaps from a power law), and the other positions hold random values, never keys (a random key
there would read as one more pair).
"""


if __package__ in (None, ""):  # run as a file: the project's modules are found from its root, as a module
    raise SystemExit("error: run it from the repository's root as a module: python -m experiments.mqar")

import argparse
import json
import os
import re
import time
from dataclasses import dataclass

import torch

import train_lm
from support.checkpoints import load_checkpoint, model_from_checkpoint
from support.choose_layers import chosen_softmax_layers
from support.distill import DistilledFrom
from support.job import finetuning, trained_on
from support.run_files import open_run
from experiments.plots import plot_mqar
from experiments.provenance import mqar_provenance
from experiments.records import machine, read
from experiments.sizes import MQAR_SIZES
from support.runtime import (Distributed, Parser, UserError, atomic_write, fingerprint, pattern, run_main, write_csv,
                             write_json)
from support.training import Diverged, Task, train
from support.transfer import TransferFirst
from sru import SRUConfig, SRUppLM
from layers.states import state_bytes
from after_t2r import ConvConfig, ConvLM, convert_to_window
from t2r import Config, TransformerLM, convert

PAIRS = (4, 8, 16, 32, 64)  # key-value pairs per sequence; each is asked for once
VOCAB = 256  # keys from 0..127, values from 128..255
COLUMNS = ["model", "run", "lr", "conv", "selected", "pairs", "length", "accuracy", "state_bytes", "steps",
           "valid_loss", "train_minutes"]
RECORDS = os.path.join("results", "runs", "mqar")  # each finished run's KEPT files
KEPT = ("results.json", "config.json", "args.json", "machine.json", "softmax_layers.json")


def length_for(pairs: int) -> int:
    """The sequence length at N pairs: room for the pairs and as many queries among random tokens (64 to 256)."""
    return max(64, 4 * pairs)


def mqar_batch(batch: int, pairs: int, generator: torch.Generator, vocab: int = VOCAB) -> tuple:
    """(x, y), both (batch, length_for(pairs)): x is k1 v1 ... kN vN, then random values with each key once more at
    a random position; y holds the key's value at its query (what the model must predict there), -100 elsewhere."""
    length, half = length_for(pairs), vocab // 2
    keys = torch.rand(batch, half, generator=generator).argsort(-1)[:, :pairs]  # (B, N) distinct keys
    values = torch.randint(half, vocab, (batch, pairs), generator=generator)
    x = torch.randint(half, vocab, (batch, length), generator=generator)  # fillers: values only, never keys
    x[:, 0 : 2 * pairs : 2], x[:, 1 : 2 * pairs : 2] = keys, values
    slots = 2 * pairs + torch.rand(batch, length - 2 * pairs, generator=generator).argsort(-1)[:, :pairs]
    x.scatter_(1, slots, keys)
    y = torch.full_like(x, -100).scatter_(1, slots, values)
    return x, y


def fixed_sets(count: int, seed: int) -> dict:
    """{pairs: (x, y)}, the same sequences for every model."""
    return {n: mqar_batch(count, n, torch.Generator().manual_seed(seed + n)) for n in PAIRS}


@torch.no_grad()
def accuracy(model, x, y, batch_size: int = 64) -> float:
    """The share of queries whose value is the model's top prediction."""
    hits = 0
    for xs, ys in zip(x.split(batch_size), y.split(batch_size)):
        asked = ys != -100
        hits += (model(xs).argmax(-1)[asked] == ys[asked]).sum().item()
    return hits / (y != -100).sum().item()


@torch.no_grad()
def state_sizes(model) -> dict:
    """{length: bytes of the generation state after that many tokens}, stepping one sequence through."""
    lengths, sizes = sorted({length_for(n) for n in PAIRS}), {}
    state = model.init_state(1)
    for t in range(1, max(lengths) + 1):
        _, state = model.step(torch.tensor([t % VOCAB]), state)
        if t in lengths:
            sizes[t] = state_bytes(state)
    return sizes


# -----------------------------------------------------------------------------
# The runs

@dataclass
class Run:
    name: str  # its folder's name
    arch: str = "transformer"  # or sru++
    attn: str = "softmax"
    k: int = 0  # T2R's feature size
    converted: bool = False  # from the teacher (section 2.2), else from random initialisation
    transfer: bool = False  # attention transfer before the finetuning
    window: int = 0  # the sliding softmax window of after_t2r.py
    conv: bool = False  # a short convolution before each attention layer (after_t2r.ConvLM)
    lr: float = 0.0  # its peak learning rate; 0: the size's, the teacher's
    steps: int = 0  # its training steps; 0: the size's (finetune_steps for a conversion, teacher_steps otherwise)
    model: str = ""  # its row in the tables: the runs of one learning-rate sweep share it (default: the name)
    parts: tuple = ()  # a conversion's train_lm.py flags since T2R (--decay, --short_conv K, --distill_weight W,
    # --keep_softmax N, --keep_softmax_every N): converted as train_lm.py converts (experiments/since_t2r.py's runs)

    def __post_init__(self):
        self.model = self.model or self.name


def steps_of(run: Run, size: dict) -> int:
    return run.steps or (size["finetune_steps"] if run.converted else size["teacher_steps"])


FROM_SCRATCH = (("softmax", "transformer", "softmax", 0), ("t2r32", "transformer", "t2r", 32), ("sru++", "sru++", "", 0))


def plan(size: dict) -> list:
    """The teacher, its conversions, and every model from scratch at each rate of the sweep (the teacher is the
    softmax one at the size's rate); then the same with the short convolution, but the window and SRU++."""
    runs = []
    for conv in (False, True):
        tag = "+conv" if conv else ""
        runs.append(Run(f"softmax{tag}", conv=conv))
        for k in size["ks"]:
            runs += [Run(f"t2r{k}{tag}", attn="t2r", k=k, converted=True, conv=conv),
                     Run(f"t2r{k}+transfer{tag}", attn="t2r", k=k, converted=True, transfer=True, conv=conv)]
            runs += [] if conv else [Run(f"t2r{k}+window{size['window']}", attn="t2r", k=k, converted=True,
                                         window=size["window"])]
        for model, arch, attn, k in FROM_SCRATCH:  # the teacher is the softmax sweep's run at its rate (rows_of)
            runs += [Run(f"{model} from scratch{tag} lr {lr:g}", arch, attn, k, conv=conv, lr=lr,
                         model=f"{model} from scratch{tag}")
                     for lr in size["lrs"] if not (arch == "sru++" and conv) and (model, lr) != ("softmax", size["lr"])]
    return runs


def teacher_of(run: Run) -> str:
    return "softmax+conv" if run.conv else "softmax"


# A model trained from scratch sees only the shortest sequences for its first `curriculum` steps (experiments/sizes.py
# says why): these pair counts (4, 8, 16)
SHORT = [n for n in PAIRS if length_for(n) == length_for(PAIRS[0])]


class MQARTask(Task):
    """MQAR for the shared training loop: a micro-batch is a function of its counter (the pair counts take turns),
    so a resumed run sees exactly the batches it would have."""

    def __init__(self, args, ddp, eval_sequences: int, curriculum: int = 0):
        super().__init__(args, ddp)
        self.curriculum = curriculum  # the first steps see SHORT pair counts only
        self.valid = fixed_sets(max(8, eval_sequences // 4), seed=1_000_000)
        self.test = fixed_sets(eval_sequences, seed=2_000_000)

    def load_data(self, checkpoint):
        pass  # generated: nothing to read

    def identity(self):
        return {"data": fingerprint(f"mqar {VOCAB} {PAIRS} {[length_for(n) for n in PAIRS]}")}

    BATCH_FLAGS = "--batch_size"

    def tokens_per_step(self):  # the same at every length (batch): what the memory check reads
        return self.args.batch_size * length_for(PAIRS[0])

    lr = train_lm.LMTask.lr  # the language model's warmup and cosine decay
    objective = train_lm.LMTask.objective  # its cross-entropy, which skips the -100 targets: only queries count

    def batch(self, counter):
        generator = torch.Generator().manual_seed(self.args.seed * 1_000_003 + counter)
        pairs = SHORT[counter % len(SHORT)] if counter < self.curriculum else PAIRS[counter % len(PAIRS)]
        batch = max(1, self.args.batch_size * length_for(PAIRS[0]) // length_for(pairs))  # the same tokens a step
        x, y = mqar_batch(batch, pairs, generator)
        return (x.to(self.device),), y.to(self.device), None

    def validation_loss(self, model):
        model.eval()
        with torch.no_grad():
            losses = [self.objective(model(x.to(self.device)), y.to(self.device)).item() for x, y in self.valid.values()]
        model.train()
        return sum(losses) / len(losses)

    def report(self, model, train_seconds):
        valid_loss = self.validation_loss(model)  # what the learning-rate sweep picks by
        model = model.eval()
        scores = {n: accuracy(model, x.to(self.device), y.to(self.device)) for n, (x, y) in self.test.items()}
        print(f"{self.args.out_dir}: accuracy " + ", ".join(f"{n} pairs {a:.3f}" for n, a in scores.items()))
        return {"accuracy": scores, "state_bytes": state_sizes(model.cpu()), "train_minutes": train_seconds / 60,
                "valid_loss": valid_loss}


def run_args(run: Run, size: dict, out_dir: str, teacher: str, resume: bool) -> argparse.Namespace:
    """train_lm.py's flags for the loop (its checks included), with the run's budget; a conversion's --pretrained
    is the teacher's model.pt."""
    steps = steps_of(run, size)
    flags = ["--dataset", "mqar", "--out_dir", out_dir, "--max_steps", str(steps), "--batch_size",
             str(size["batch_size"]), "--lr", str(run.lr or size["lr"]), "--warmup_steps", str(max(1, steps // 20)),
             "--dropout", "0", "--eval_interval", str(max(1, steps // 4)), "--log_interval", str(max(1, steps // 10)),
             "--weight_decay", "0", "--device", "cpu"]
    if run.converted:
        flags += ["--init", "pretrained", "--pretrained", teacher]
    if run.transfer:
        flags += ["--transfer_steps", str(size["transfer_steps"])]
    flags += [str(part) for part in run.parts]
    args = train_lm.get_args(flags + (["--resume"] if resume else []))
    args.curriculum = curriculum_of(run, size)  # not a flag of train_lm.py's: kept in args.json beside them
    return args


def curriculum_of(run: Run, size: dict) -> int:  # the first steps on the shortest sequences: training from scratch only
    return 0 if run.converted else size["curriculum"]


def make_model(run: Run, size: dict, checkpoint, args, task):
    torch.manual_seed(1337)
    if checkpoint is not None:
        return model_from_checkpoint(checkpoint)
    if run.arch == "sru++":
        return SRUppLM(SRUConfig(vocab_size=VOCAB, n_layer=size["n_layer"], d_model=size["d_model"], dropout=0.0))
    if run.converted and run.parts and args.attn == "softmax":  # a control: the teacher trained on unchanged, as train_lm.py does
        return trained_on(load_teacher(args), finetuning(args))
    if run.converted and run.parts:  # the parts since T2R: as train_lm.py converts (its layers chosen by data too)
        teacher, conversion = load_teacher(args), train_lm.conversion(args)
        kept = chosen_softmax_layers(teacher, task, conversion, args.keep_softmax) if args.keep_softmax else ()
        return convert(teacher, **conversion, keep_softmax_layers=kept)
    if run.converted:  # a ConvLM teacher gives a ConvLM student, its convolutions copied
        return convert_to_window(load_teacher(args), run.window, "t2r", feature_size=run.k)  # window 0: t2r.convert
    fields = dict(vocab_size=VOCAB, n_layer=size["n_layer"], n_head=size["n_head"], d_model=size["d_model"],
                  d_ff=2 * size["d_model"], dropout=0.0, attn=run.attn, feature_size=run.k or 32)
    if run.conv:
        return ConvLM(ConvConfig(**fields, short_conv=size["short_conv"]))
    return TransformerLM(Config(**fields))


def load_teacher(args):
    return model_from_checkpoint(load_checkpoint(args.pretrained, "MQAR teacher"))


def train_run(run: Run, size: dict, out_dir: str, records: str | None, teachers: tuple | None = None) -> dict:
    """The run's results: read if it finished (here, or kept in records), else trained (resumed where it stopped),
    and kept in records. teachers: (out_dir, records) where a conversion's teacher is, if not beside it."""
    folder = folder_of(run, out_dir)
    teacher_dir, teacher_records = teachers or (out_dir, records)
    results = os.path.join(folder, "results.json")
    if records and not os.path.isfile(results) and os.path.isfile(os.path.join(records, os.path.basename(folder),
                                                                                "results.json")):
        copy_files(os.path.join(records, os.path.basename(folder)), folder)  # kept: nothing to train
    if not os.path.isfile(results):
        teacher = os.path.join(folder_of(Run(teacher_of(run)), teacher_dir), "model.pt")
        if run.converted and not finished(Run(teacher_of(run)), teacher_dir, teacher_records):
            raise UserError(f"{run.name} converts {teacher_of(run)}, which has not finished: include it in --only, "
                            f"or train it first")
        if run.converted and not os.path.isfile(teacher):
            raise UserError(f"{run.name} converts {teacher}, which is kept in {teacher_records} without its weights: "
                            f"delete {os.path.join(teacher_records or '', teacher_of(run))} to train the teacher "
                            f"again")
        started = time.time()
        args = run_args(run, size, folder, teacher, resume=os.path.isfile(os.path.join(folder, "ckpt.pt")))
        task = MQARTask(args, Distributed(), size["eval_sequences"], args.curriculum)
        checkpoint = open_run(task)
        model = make_model(run, size, checkpoint, args, task)
        if args.distill_weight:  # KL to the teacher's logits in the finetuning's loss, as train_lm.py mixes it
            task = DistilledFrom(task, load_teacher(args), model)
        try:
            train(TransferFirst(task, checkpoint) if run.transfer else task, model, checkpoint)  # transfer: first
        except Diverged as e:  # a rate of a sweep that diverges is one of its results, as in Zoology's sweeps
            print(f"{run.name}: diverged, recorded as such ({e})")
            write_json(results, {"diverged": str(e), "train_minutes": (time.time() - started) / 60})
        finally:
            task.lock.close()
        write_json(os.path.join(folder, "machine.json"), {**machine(), "wall_seconds": round(time.time() - started)})
    if records:  # also a run that stopped between its results and its record
        record = os.path.join(records, os.path.basename(folder))
        if not os.path.isfile(os.path.join(record, "results.json")):
            copy_files(folder, record)
        write_config(folder, record)
    with open(results) as f:
        return json.load(f)


def write_config(folder: str, record: str):
    """The model's config, read from its checkpoint, into the run's record where it has none (records kept before
    config.json was: written whenever the run's weights are at hand)."""
    model_pt, kept = os.path.join(folder, "model.pt"), os.path.join(record, "config.json")
    recorded = os.path.isfile(os.path.join(record, "results.json"))
    if os.path.isfile(model_pt) and recorded and not os.path.isfile(kept):
        write_json(kept, load_checkpoint(model_pt, "MQAR model")["config"])


def finished(run: Run, out_dir: str, records: str | None) -> bool:
    return any(os.path.isfile(os.path.join(folder_of(run, where), "results.json")) for where in (out_dir, records)
               if where)


def progress(run: Run, out_dir: str, records: str | None) -> str:
    """done (its results in out_dir), kept (in the records: read back, not trained), interrupted (resumed from its
    checkpoint) or todo."""
    if os.path.isfile(os.path.join(folder_of(run, out_dir), "results.json")):
        return "done"
    if finished(run, out_dir, records):
        return "kept"
    return "interrupted" if os.path.isfile(os.path.join(folder_of(run, out_dir), "ckpt.pt")) else "todo"


def copy_files(source: str, target: str):
    """The KEPT files of a run's folder, each written atomically."""
    os.makedirs(target, exist_ok=True)
    for name in KEPT:
        if os.path.isfile(os.path.join(source, name)):
            with open(os.path.join(source, name), "rb") as f, atomic_write(os.path.join(target, name)) as tmp, \
                    open(tmp, "wb") as out:
                out.write(f.read())


def where_trained(runs: list, out_dir: str, records: str | None) -> dict:
    """What the runs' machine.json say (out_dir's, else the record's): their machines, their thread counts (runs at
    each), their first and last dates and torch versions."""
    places = [place for place in (out_dir, records) if place]
    kept = [next((m for m in (read(os.path.join(folder_of(run, p), "machine.json")) for p in places) if m), {})
            for run in runs]
    known = [m for m in kept if m]
    threads = sorted({m.get("threads") for m in known} - {None})
    dates = sorted(m["date"] for m in known if "date" in m)
    return {"runs": len(runs), "recorded": len(known), "devices": sorted({m.get("device", "?") for m in known}),
            "threads": {str(t): sum(m.get("threads") == t for m in known) for t in threads},
            "dates": [dates[0], dates[-1]] if dates else [], "torch": sorted({m.get("torch", "?") for m in known})}


def folder_of(run: Run, out_dir: str) -> str:
    return os.path.join(out_dir, run.name.replace(" ", "-"))


def check_planned(run: Run, size: dict, folder: str):
    """A run folder already there (finished or not) was trained to this plan's budget, curriculum and model size: a
    --quick run is not taken for a full one, nor the other way round. Else one line, before any work. What a file
    does not say (no config.json, no curriculum: written before they were kept) is not checked."""
    steps = steps_of(run, size)
    planned = {"args.json": {"max_steps": steps, "batch_size": size["batch_size"], "lr": run.lr or size["lr"],
                             "transfer_steps": size["transfer_steps"] if run.transfer else 0,
                             "curriculum": curriculum_of(run, size)},
               "config.json": {"n_layer": size["n_layer"], "d_model": size["d_model"]}}
    for file, fields in planned.items():
        try:
            with open(os.path.join(folder, file)) as f:
                saved = json.load(f)
        except FileNotFoundError:
            continue
        except (OSError, ValueError):
            raise UserError(f"{folder}/{file} is unreadable: delete {folder}, or pass another --out_dir") from None
        for name, value in fields.items():
            if name in saved and saved[name] != value:
                raise UserError(f"{folder} holds {run.name} trained with {name} {saved.get(name)}, this plan's is "
                                f"{value} (--quick or not): pass another --out_dir, or delete {folder}")


def rows_of(run: Run, results: dict, steps: int, transfer_steps: int = 0, teacher_lr: float = 0.0) -> list:
    """The run's rows at every pair count; after attention transfer, also its recall right after the stage; the
    teacher's again as a member of the softmax sweep. teacher_lr: the size's rate, every run's but the sweep's."""
    def row(model, found, n, steps):  # a diverged run found nothing: empty cells
        accuracy = found["accuracy"].get(str(n))
        return dict(model=model, run=run.name, lr=run.lr or teacher_lr or None, conv=int(run.conv), selected=1,
                    pairs=n, length=length_for(n), accuracy=None if accuracy is None else round(accuracy, 4),
                    state_bytes=found["state_bytes"].get(str(length_for(n))), steps=steps,
                    valid_loss=found.get("valid_loss"), train_minutes=round(results["train_minutes"], 2))
    if results.get("diverged"):
        return [row(run.model, {"accuracy": {}, "state_bytes": {}}, n, steps) for n in PAIRS]
    rows = [row(run.model, results, n, steps) for n in PAIRS]
    if run.name == teacher_of(run) and teacher_lr:  # "softmax", "softmax+conv": trained from scratch too
        rows += [{**r, "model": f"softmax from scratch{'+conv' if run.conv else ''}"} for r in rows]
    if results.get("after_transfer"):  # the transfer stage's model, before any finetuning
        rows += [{**row(f"{run.model} (after transfer, before finetuning)", results["after_transfer"], n,
                        transfer_steps), "lr": None} for n in PAIRS]  # the stage's rate is --transfer_lr's
    return rows


def select_rates(rows: list) -> list:
    """Of the runs that share a model (a learning-rate sweep), only the one with the lowest validation loss is
    selected; the others stay in the table, marked (a diverged one is never selected)."""
    loss = {}
    for r in rows:
        if r["valid_loss"] is not None:
            loss.setdefault(r["model"], {})[r["run"]] = r["valid_loss"]
    best = {model: min(runs, key=runs.get) for model, runs in loss.items()}
    pick = lambda r: r["accuracy"] is not None and (r["model"] not in best or best[r["model"]] == r["run"])
    return [{**r, "selected": int(pick(r))} for r in rows]


def get_args(argv=None):
    p = Parser(prog="python -m experiments.mqar", description="Multi-query associative recall: what conversion keeps.")
    p.add_argument("--out_dir", default=None, help="the runs' folders (default out/mqar; --quick: out/mqar-quick)")
    p.add_argument("--csv", default=None, help="the table (default results/mqar.csv; --quick: in --out_dir)")
    p.add_argument("--records", default=None, help="where finished runs are kept and read back (default "
                   f"{RECORDS}; --quick: records/ in --out_dir)")
    p.add_argument("--quick", action="store_true", help="tiny models and a few steps: a smoke run of every model")
    p.add_argument("--dry_run", action="store_true", help="print the runs and their budgets, train nothing")
    p.add_argument("--only", type=pattern, default="", help="train only the runs whose name matches this regular expression, so "
                   "that two processes can share the plan (the table is written once every run has finished)")
    args = p.parse_args(argv)
    args.out_dir = args.out_dir or ("out/mqar-quick" if args.quick else "out/mqar")
    args.csv = args.csv or (os.path.join(args.out_dir, "mqar.csv") if args.quick else "results/mqar.csv")
    args.records = args.records or (os.path.join(args.out_dir, "records") if args.quick else RECORDS)
    if os.path.isdir(args.csv):  # found before training, not after it
        p.error(f"--csv {args.csv} is a folder: name the table's file, e.g. {os.path.join(args.csv, 'mqar.csv')}")
    return args


def main(argv=None):
    args = get_args(argv)
    size = MQAR_SIZES["quick" if args.quick else "full"]
    runs = plan(size)
    chosen = [run for run in runs if re.search(args.only, run.name)]
    if not chosen:
        raise UserError(f"--only {args.only!r} matches none of the runs: python -m experiments.mqar --dry_run "
                        "lists them")
    if args.dry_run:
        states = [progress(run, args.out_dir, args.records) for run in chosen]
        done = sum(state in ("done", "kept") for state in states)
        print(f"{len(chosen)} runs, {done} finished ({states.count('kept')} kept in {args.records}: read back, not "
              f"trained), {len(chosen) - done} to train")
        for run, state in zip(chosen, states):
            steps = steps_of(run, size)
            print(f"{run.name}: {state} | {steps} steps at lr {run.lr or size['lr']:g}" +
                  (f" ({size['transfer_steps']} of transfer first)" if run.transfer else ""))
        return
    for run in runs:  # every saved run of this plan's, here or kept, before any work
        check_planned(run, size, folder_of(run, args.out_dir))
        check_planned(run, size, folder_of(run, args.records))
    rows, t0 = [], time.time()
    for run in chosen:  # trained, or read; then the others, if every one has finished
        print(f"--- {run.name}", flush=True)
        train_run(run, size, args.out_dir, args.records)
    waiting = [run.name for run in runs if not finished(run, args.out_dir, args.records)]
    if waiting:
        print(f"{len(runs) - len(waiting)} of {len(runs)} runs finished; the table waits for: {', '.join(waiting)}")
        return
    for run in runs:
        steps = (size["transfer_steps"] if run.transfer else 0) + steps_of(run, size)
        rows += rows_of(run, train_run(run, size, args.out_dir, args.records), steps,
                        size["transfer_steps"] if run.transfer else 0, size["lr"])
    rows = select_rates(rows)
    write_csv(args.csv, rows, COLUMNS)
    # where and when, for the figure's foot and the results page: the runs' own records (the machines, threads and
    # dates they trained on), their training minutes summed; the same again from the same records, wherever rebuilt
    command = "python -m experiments.mqar" + (" --quick" if args.quick else "")
    minutes = {r["run"]: r["train_minutes"] for r in rows}  # once a run: its transfer's and sweep rows repeat it
    where = {"command": command, "train_minutes": round(sum(minutes.values()), 1),
             **where_trained(runs, args.out_dir, args.records)}
    write_json(os.path.splitext(args.csv)[0] + ".json", where)
    figure = os.path.splitext(args.csv)[0] + ".png"
    try:  # matplotlib is imported as the figure is drawn
        plot_mqar([r for r in rows if r["selected"]], mqar_provenance(where).replace("`", ""), figure)
    except ImportError:
        figure = "no figure (pip install matplotlib)"
    print(f"wrote {args.csv}, {figure} ({(time.time() - t0) / 60:.1f} minutes this time); python -m "
          f"experiments.report puts them on the results page")


if __name__ == "__main__":
    run_main(main)
