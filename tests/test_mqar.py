"""
experiments/mqar.py: the MQAR sequences are what they claim, the accuracy counts what it says, and the experiment
runs end to end (--quick), resumable, with a KV cache that grows and T2R states that do not.

    python -m pytest -q -s tests/test_mqar.py
"""

import csv
import json
import os
import shutil

import pytest
import torch

from conftest import ROOT, assert_one_line_error, run_in_process
from experiments import mqar


@pytest.mark.parametrize("pairs", mqar.PAIRS)
def test_a_sequence_lists_its_pairs_then_asks_each_key_once(pairs):
    x, y = mqar.mqar_batch(16, pairs, torch.Generator().manual_seed(pairs))
    half = mqar.VOCAB // 2
    assert x.shape == y.shape == (16, mqar.length_for(pairs))
    for row, targets in zip(x.tolist(), y.tolist()):
        keys, values = row[0 : 2 * pairs : 2], row[1 : 2 * pairs : 2]
        assert len(set(keys)) == pairs and max(keys) < half <= min(values)
        asked = [t for t, target in enumerate(targets) if target != -100]
        assert len(asked) == pairs and min(asked) >= 2 * pairs  # every key once, after the pairs
        assert sorted(row[t] for t in asked) == sorted(keys)
        assert all(targets[t] == values[keys.index(row[t])] for t in asked)  # the value paired with that key
        rest = [row[t] for t in range(2 * pairs, len(row)) if t not in asked]
        assert min(rest) >= half  # the fillers are never keys


class LookUp(torch.nn.Module):
    """An oracle that reads the pairs (or, with forget=True, only the first half of them) and answers queries."""

    def __init__(self, pairs: int, forget: bool = False):
        super().__init__()
        self.pairs, self.forget = pairs, forget

    def forward(self, x):
        logits = torch.zeros(*x.shape, mqar.VOCAB)
        for b, row in enumerate(x.tolist()):
            known = dict(zip(row[0 : 2 * self.pairs : 2], row[1 : 2 * self.pairs : 2]))
            if self.forget:
                known = dict(list(known.items())[: self.pairs // 2])
            for t in range(2 * self.pairs, len(row)):
                logits[b, t, known.get(row[t], 0)] = 1.0
        return logits


def test_the_accuracy_is_the_share_of_queries_answered():
    x, y = mqar.mqar_batch(8, 16, torch.Generator().manual_seed(0))
    assert mqar.accuracy(LookUp(16), x, y, batch_size=3) == 1.0
    assert mqar.accuracy(LookUp(16, forget=True), x, y) == 0.5  # half the pairs known: half the queries


def test_the_quick_experiment_runs_every_model_and_resumes_from_its_results(tmp_path):
    first = run_in_process("experiments.mqar", "--quick", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    with open(tmp_path / "out/mqar-quick/mqar.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    plan = mqar.plan(mqar.MQAR_SIZES["quick"])
    model_of = {run.name: run.model for run in plan}
    trained = [(r["run"], int(r["pairs"])) for r in rows if r["model"] == model_of[r["run"]]]
    assert trained == [(run.name, n) for run in plan for n in mqar.PAIRS]
    sweep = {r["run"] for r in rows if r["model"] == "softmax from scratch"}
    assert sweep == {"softmax", "softmax from scratch lr 0.004"}  # the teacher is the sweep's run at its own rate
    sizes = {run.name: [int(r["state_bytes"]) for r in rows if r["run"] == run.name] for run in plan}
    print({m: s[-1] for m, s in sizes.items()})
    assert sizes["softmax"][0] < sizes["softmax"][-1]  # a KV cache grows with the sequence (64 -> 256 tokens)
    for name in ("t2r8", "t2r64+transfer", "t2r64+window16", "t2r32 from scratch lr 0.002", "t2r8+conv"):
        assert len(set(sizes[name])) == 1, name  # constant-size states (the convolution's last 2 inputs too)
    assert sizes["t2r8+conv"][0] > sizes["t2r8"][0]  # ... which the convolution adds
    after = {r["run"] for r in rows if r["model"].endswith("(after transfer, before finetuning)")}
    assert after == {run.name for run in plan if run.transfer}  # recall straight after the transfer stage
    for model in {r["model"] for r in rows}:  # one rate of each sweep shown: the lowest validation loss
        mine = [r for r in rows if r["model"] == model and int(r["pairs"]) == 4]
        best = min(mine, key=lambda r: float(r["valid_loss"]))
        assert [r["run"] for r in mine if r["selected"] == "1"] == [best["run"]], model
    records = tmp_path / "out/mqar-quick/records"
    configs = {run.name: json.loads((records / mqar.folder_of(run, "") / "config.json").read_text()) for run in plan}
    assert configs["t2r32 from scratch lr 0.002"]["attn"] == "t2r"  # the model's, where args.json has the loop's flags
    assert configs["t2r8+conv"]["short_conv"] == 3 and "short_conv" not in configs["t2r8"]
    (records / "t2r8" / "config.json").unlink()  # a record kept before config.json was
    kept_t2r64 = (records / "t2r64" / "results.json").read_text()
    for name in os.listdir(records / "t2r64"):  # a run that stopped between its results and its record
        (records / "t2r64" / name).unlink()
    again = run_in_process("experiments.mqar", "--quick", cwd=tmp_path)
    assert again.returncode == 0 and "step 1/" not in again.stdout  # finished runs are read, not trained again
    assert json.loads((records / "t2r8" / "config.json").read_text()) == configs["t2r8"]  # written again from model.pt
    assert (records / "t2r64" / "results.json").read_text() == kept_t2r64
    kept = [json.loads((records / mqar.folder_of(run, "") / "results.json").read_text()) for run in plan]
    where = json.loads((tmp_path / "out/mqar-quick/mqar.json").read_text())  # each run's training once, the teacher's too
    assert where["train_minutes"] == round(sum(round(r["train_minutes"], 2) for r in kept), 1)
    assert {r["lr"] for r in rows if "(after transfer" in r["model"]} == {""}  # the stage trains at --transfer_lr
    elsewhere = run_in_process("experiments.mqar", "--quick", "--out_dir", "fresh", "--records",
                               "out/mqar-quick/records", cwd=tmp_path)  # a new machine: only the records
    assert elsewhere.returncode == 0 and "step 1/" not in elsewhere.stdout, elsewhere.stderr[-2000:]
    assert (tmp_path / "fresh/mqar.csv").read_text() == (tmp_path / "out/mqar-quick/mqar.csv").read_text()


def test_only_trains_the_matching_runs_and_writes_the_table_once_all_have_finished(tmp_path):
    part = run_in_process("experiments.mqar", "--quick", "--only", "^softmax$", cwd=tmp_path)
    assert part.returncode == 0, part.stderr[-2000:]
    plan = mqar.plan(mqar.MQAR_SIZES["quick"])
    trained = {run.name for run in plan if (tmp_path / mqar.folder_of(run, "out/mqar-quick") / "results.json").is_file()}
    assert trained == {"softmax"}
    assert not (tmp_path / "out/mqar-quick/mqar.csv").exists() and "the table waits for: t2r8," in part.stdout


def test_only_a_conversion_without_its_teacher_says_to_include_the_teacher(tmp_path):
    result = run_in_process("experiments.mqar", "--quick", "--only", "^t2r8$", "--out_dir", "out", "--records", "rec",
                            cwd=tmp_path)
    assert_one_line_error(result, "t2r8 converts softmax, which has not finished: include it in --only")


def test_the_results_page_and_summary_read_the_mqar_table(tmp_path):
    """report.py's MQAR section from a made-up mqar.csv: each model's row, and three lines of what conversion keeps
    and loses, computed from the numbers."""
    from experiments import report
    from test_study import MADE_UP_CSVS
    for name, lines in MADE_UP_CSVS.items():
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    accuracy = {"softmax": (1.0, 0.99), "t2r8": (0.9, 0.2), "t2r64": (0.95, 0.5), "t2r32 from scratch": (0.3, 0.05)}
    state = {"softmax": 65536, "t2r8": 9216, "t2r64": 66560, "t2r32 from scratch": 33792}
    rows = [dict(model=m, pairs=n, length=mqar.length_for(n), accuracy=a[i], state_bytes=state[m], steps=800,
                 train_minutes=1.0) for m, a in accuracy.items() for i, n in enumerate((8, 64))]
    mqar.write_csv(str(tmp_path / "mqar.csv"), rows, mqar.COLUMNS)
    (tmp_path / "mqar.json").write_text('{"command": "python -m experiments.mqar", "device": "a CPU", "threads": 2, '
                                        '"torch": "2.13.0+cpu", "date": "2026-11-25", "train_minutes": 58.0}')
    report.write_report(str(tmp_path))
    page, summary = (tmp_path / "README.md").read_text(), (tmp_path / "summary.md").read_text()
    print(page[page.index("## What a fixed state"):page.index("## Feature size")])
    assert "| t2r64 | - | 800 | 66,560 | 0.950 | 0.500 |" in page  # a table from before the sweep
    assert "This table was written before the learning-rate sweep" in page
    assert "`python -m experiments.mqar` on a CPU, 2 threads, torch 2.13.0+cpu, 2026-11-25 (58 minutes" in page
    kept = "- **Kept**: at 8 pairs T2R recalls 0.90-0.95 (k = 8, 64; the teacher 1.00)."
    lost = "- **Lost**: at 64 pairs it recalls 0.20 (k = 8, 9,216 bytes of state) to 0.50 (k = 64, 66,560 bytes of " \
           "state), against the teacher's 0.99 from a 65,536-byte KV cache."
    scratch = "- **From scratch**, for the teacher's steps: t2r32 from scratch 0.30 at 8 pairs and 0.05 at 64."
    assert all(line in page and line in summary for line in (kept, lost, scratch))
    assert (tmp_path / "mqar.png").stat().st_size > 0


@pytest.mark.parametrize("file, state, finished, kept", [("rec/softmax/results.json", "kept", 1, 1),
                                                         ("out/softmax/results.json", "done", 1, 0),
                                                         ("out/softmax/ckpt.pt", "interrupted", 0, 0)])
def test_a_dry_run_shows_each_runs_state_the_kept_ones_as_kept_not_to_train(tmp_path, file, state, finished, kept):
    (tmp_path / file).parent.mkdir(parents=True)
    (tmp_path / file).write_text("{}")
    there = sorted(tmp_path.rglob("*"))
    result = run_in_process("experiments.mqar", "--dry_run", "--out_dir", "out", "--records", "rec", cwd=tmp_path)
    runs = len(mqar.plan(mqar.MQAR_SIZES["full"]))
    assert f"{runs} runs, {finished} finished ({kept} kept in rec: read back, not trained), {runs - finished} to " \
        "train" in result.stdout
    assert f"\nsoftmax: {state} | 10000 steps" in result.stdout and "\nt2r8: todo | 600 steps" in result.stdout
    assert sorted(tmp_path.rglob("*")) == there, "a dry run writes nothing"


ANOTHER_MACHINE = {"device": "another CPU, 8 cores", "threads": 8, "torch": "9.9", "python": "3.99",
                   "date": "2099-01-01"}


def rebuild_from_the_committed_records(tmp_path, monkeypatch, change=None) -> list:
    """mqar.py in a fresh checkout on ANOTHER_MACHINE: out/ empty, a copy of the committed records (change(records)
    first, where given) and of the committed table; nothing may train. The figure's footers, which it draws."""
    results = os.path.join(ROOT, "results")
    shutil.copytree(os.path.join(results, "runs", "mqar"), tmp_path / "rec")
    for name in ("mqar.csv", "mqar.json"):
        shutil.copyfile(os.path.join(results, name), tmp_path / name)
    if change:
        change(tmp_path / "rec")
    monkeypatch.setattr(mqar, "machine", lambda: ANOTHER_MACHINE)
    footers = []
    monkeypatch.setattr(mqar, "plot_mqar", lambda rows, footer, path: footers.append(footer))  # matplotlib's bytes
    monkeypatch.setattr(mqar, "train", lambda *args: pytest.fail("a kept run trained again"))
    mqar.main(["--out_dir", str(tmp_path / "out"), "--records", str(tmp_path / "rec"), "--csv",
               str(tmp_path / "mqar.csv")])
    return footers


def test_a_fresh_checkout_rebuilds_the_committed_table_from_the_records_on_another_machine_and_day(tmp_path,
                                                                                                  monkeypatch):
    """The table comes out the committed one byte for byte, its provenance (mqar.json, the figure's foot) the runs'
    own records, not this machine's."""
    footers = rebuild_from_the_committed_records(tmp_path, monkeypatch)
    results = os.path.join(ROOT, "results")
    for name in ("mqar.csv", "mqar.json"):
        with open(os.path.join(results, name), "rb") as f:
            assert (tmp_path / name).read_bytes() == f.read(), f"results/{name} is not rebuilt"
    with open(os.path.join(results, "mqar.json")) as f:
        assert footers == [mqar.mqar_provenance(json.load(f)).replace("`", "")]


def test_the_provenance_is_the_runs_records_not_the_machine_that_rebuilds_the_table(tmp_path, monkeypatch):
    """mqar.json says where and when the runs trained, from their machine.json: a run recorded on another machine and
    day shows there; the machine that rebuilds the table does not."""
    def another_machine(records):
        path = records / "t2r8" / "machine.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "device": "AMD EPYC, 2 cores", "threads": 2,
                                    "date": "2026-11-20"}))
    rebuild_from_the_committed_records(tmp_path, monkeypatch, another_machine)
    where = json.loads((tmp_path / "mqar.json").read_text())
    print(mqar.mqar_provenance(where))
    assert "AMD EPYC, 2 cores" in where["devices"] and ANOTHER_MACHINE["device"] not in where["devices"]
    planned = len(mqar.plan(mqar.MQAR_SIZES["full"]))
    assert where["dates"][0] == "2026-11-20" and where["recorded"] == where["runs"] == planned


@pytest.mark.parametrize("differs", ["budget", "model", "curriculum"])
def test_a_full_plan_does_not_take_a_quick_plans_runs_for_its_own(tmp_path, differs):
    """--out_dir X after --quick --out_dir X: the quick runs' results were taken as the full table's; now one line,
    before any work. The budget and the curriculum are args.json's; the model's size config.json's (a plan whose
    sizes changed)."""
    folder = tmp_path / "x" / "softmax"
    folder.mkdir(parents=True)
    size = mqar.MQAR_SIZES["quick" if differs == "budget" else "full"]  # what the run's args.json says of its budget
    curriculum = 5 if differs == "curriculum" else size["curriculum"]
    (folder / "args.json").write_text(json.dumps({"max_steps": size["teacher_steps"], "batch_size": size["batch_size"],
                                                  "lr": size["lr"], "transfer_steps": 0, "curriculum": curriculum}))
    (folder / "config.json").write_text(json.dumps({"n_layer": size["n_layer"],
                                                    "d_model": 64 if differs == "model" else size["d_model"]}))
    (folder / "results.json").write_text("{}")
    result = run_in_process("experiments.mqar", "--out_dir", "x", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    said = {"budget": f"max_steps {size['teacher_steps']}", "model": "d_model 64", "curriculum": "curriculum 5"}[differs]
    assert f"x/softmax holds softmax trained with {said}, this plan's is" in result.stderr
    assert "(--quick or not)" in result.stderr and not (tmp_path / "x" / "mqar.csv").exists()


def test_a_rate_that_diverges_is_recorded_never_picked_and_shown_as_diverged(tmp_path, monkeypatch):
    """A NaN loss at one rate of a sweep is one of its results (Zoology's sweeps keep going): recorded, not fatal."""
    from experiments.mqar_report import sweep_table
    from support.training import Diverged
    size = mqar.MQAR_SIZES["quick"]
    high, low = [run for run in mqar.plan(size) if run.name.startswith("t2r32 from scratch lr")][-2:]

    def diverge(task, model, checkpoint):
        raise Diverged("the validation loss is nan at step 2: the weights diverged")
    monkeypatch.setattr(mqar, "train", diverge)
    monkeypatch.chdir(tmp_path)
    results = mqar.train_run(high, size, "out", "rec")
    assert results["diverged"].startswith("the validation loss is nan")
    assert (tmp_path / "rec" / os.path.basename(mqar.folder_of(high, "out")) / "results.json").is_file()
    finished = {"accuracy": {str(n): 0.5 for n in mqar.PAIRS}, "valid_loss": 3.0, "train_minutes": 1.0,
                "state_bytes": {str(mqar.length_for(n)): 100 for n in mqar.PAIRS}}
    rows = mqar.select_rates(mqar.rows_of(high, results, 10) + mqar.rows_of(low, finished, 10))
    assert {r["run"] for r in rows if r["selected"]} == {low.name}
    assert {r["accuracy"] for r in rows if r["run"] == high.name} == {None}
    lines = sweep_table(rows, list(mqar.PAIRS))
    assert f"| t2r32 from scratch | {high.lr:g} | diverged | - | - | |" in lines, lines


@pytest.mark.parametrize("pick, edge", [(1e-2, True), (3e-4, True), (1e-3, False)])
def test_a_sweep_whose_pick_is_its_highest_or_lowest_rate_is_named_at_the_edge(pick, edge):
    from experiments.mqar_report import at_the_edge
    rows = [dict(model="sru++ from scratch", run=f"lr {lr:g}", lr=lr, selected=int(lr == pick), pairs=n)
            for lr in (3e-4, 1e-3, 3e-3, 1e-2) for n in (4, 64)]
    assert at_the_edge(rows, ["sru++ from scratch"]) == ([("sru++ from scratch", pick)] if edge else [])
