"""The study's runner (experiments/study.py execute): several runs at a time, a conversion only after its teacher,
and Ctrl-C reaching every run once, so that each saves. Stand-in trainers, a second or two each."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import EVENT_TIMEOUT, ROOT, wait_for_exit, wait_for_line, wait_until
from experiments import runs, study
from experiments.records import Records

# A stand-in for train_lm.py: notes when it ran, whether its teacher was done and how many Ctrl-Cs it got (a real
# run saves on the first and quits without saving on a second), then writes its results or exits 130.
FAKE_TRAINER = """
import json, os, signal, sys, time
flags = dict(zip(sys.argv[1::2], sys.argv[2::2]))
out, teacher = flags["--out_dir"], os.path.dirname(flags.get("--pretrained", ""))
signals = []
signal.signal(signal.SIGINT, lambda *_: signals.append(1))
if any(name.startswith("snapshot_") for name in os.listdir(out)):  # as train_mt.py refuses an earlier run's outputs
    sys.exit(2)
time.sleep(float(flags.get("--slow_start", 0)))  # as a Python start on a loaded machine
start = time.time()
open(os.path.join(out, "started"), "w").close()
with open(os.path.join(out, "args.json"), "w") as f:
    json.dump({name[2:]: value for name, value in flags.items()}, f)
if flags.get("--interrupt_self"):
    os.kill(os.getpid(), signal.SIGINT)
while time.time() - start < float(flags["--seconds"]) and not signals:
    time.sleep(0.02)
if "--wait_for" in flags:  # another run's file: it started while this one ran (with a limit, should it never come)
    while not os.path.exists(flags["--wait_for"]) and time.time() - start < float(flags["--wait_limit"]):
        time.sleep(0.02)
if signals:
    time.sleep(0.3)  # time for a second Ctrl-C to arrive, if one is sent
with open(os.path.join(out, "trace.json"), "w") as f:
    json.dump({"start": start, "end": time.time(), "signals": len(signals),
               "teacher_done": not teacher or os.path.isfile(os.path.join(teacher, "results.json"))}, f)
if signals:
    sys.exit(130)
if "--weights_from" in flags:  # a checkpoint the test wrote (one weight), for the records' digests: it stands for
    import shutil              # what the same flags trained (the same, or not); copied, so no torch to import here
    for name in ("ckpt.pt", "model.pt"):
        shutil.copyfile(flags["--weights_from"], os.path.join(out, name))
with open(os.path.join(out, "results.json"), "w") as f:
    json.dump({"valid": {"ppl": 1.0}, "test": {"ppl": 1.0}, "train_minutes": 0.0}, f)
"""

# The study itself on such a plan, in a process of its own, to be interrupted
DRIVER = """
from experiments import study
from support.runtime import run_main
run = lambda name, **flags: study.Run(name, {script!r}, {{"seconds": {seconds}, **flags,
                                                          "out_dir": {tmp!r} + "/" + name}})
run_main(lambda: study.execute([run("teacher"), run("other")], dry_run=False, jobs=2))
"""


def fake_plan(tmp_path, seconds):
    """A teacher, its conversion and an independent run, in the order a plan lists them."""
    script = tmp_path / "fake_trainer.py"
    script.write_text(FAKE_TRAINER)
    run = lambda name, **flags: study.Run(name, str(script), {"seconds": seconds, **flags,
                                                              "out_dir": str(tmp_path / name)})
    return [run("teacher"), run("student", pretrained=str(tmp_path / "teacher" / "ckpt.pt")), run("other")]


def trace(run):
    with open(os.path.join(run.out_dir, "trace.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("slow_start", [0, 1])
def test_a_conversion_starts_after_its_teacher_and_independent_runs_overlap(tmp_path, slow_start):
    teacher, student, other = fake_plan(tmp_path, seconds=0.1)
    other.flags["slow_start"] = slow_start
    teacher.flags.update(wait_for=os.path.join(other.out_dir, "started"), wait_limit=EVENT_TIMEOUT)  # not a race
    study.execute([teacher, student, other], dry_run=False, jobs=2)
    assert trace(student)["teacher_done"] and trace(student)["start"] >= trace(teacher)["end"]
    assert trace(other)["start"] < trace(teacher)["end"]  # it did not wait for the teacher
    assert all(runs.run_state(r.out_dir) == "done" for r in (teacher, student, other))


def test_one_job_runs_the_plan_in_its_order(tmp_path):
    plan = fake_plan(tmp_path, seconds=0.1)
    study.execute(plan, dry_run=False, jobs=1)
    starts = [trace(r)["start"] for r in plan]
    assert starts == sorted(starts)


def test_a_run_interrupted_on_its_own_stops_the_study_saying_it_saved(tmp_path):
    teacher = fake_plan(tmp_path, seconds=30)[0]
    teacher.flags["interrupt_self"] = 1  # as `kill -INT` of the run itself
    with pytest.raises(study.Interrupted, match="teacher was interrupted and saved its checkpoint"):
        study.execute([teacher], dry_run=False, jobs=1)


def test_a_failed_run_is_an_error_naming_its_log(tmp_path):
    teacher = fake_plan(tmp_path, seconds="not a number")[0]
    with pytest.raises(study.UserError, match="teacher failed .*teacher/train.log"):
        study.execute([teacher], dry_run=False, jobs=2)


def test_a_start_killed_before_its_first_checkpoint_starts_again_without_its_snapshots(tmp_path, capsys):
    teacher = fake_plan(tmp_path, seconds=0.1)[0]
    os.makedirs(teacher.out_dir)
    for step in (20, 40):  # what a translator killed at step 50 leaves (SIGKILL: no ckpt.pt)
        open(os.path.join(teacher.out_dir, f"snapshot_{step:07d}.pt"), "w").close()
    study.execute([teacher], dry_run=False, jobs=1)
    assert runs.run_state(teacher.out_dir) == "done" and not list((tmp_path / "teacher").glob("snapshot_*"))
    assert "teacher: removed 2 snapshot_*.pt of a start killed before its first checkpoint" in capsys.readouterr().out


@pytest.mark.parametrize("kept_in", ["out", "its record"])
def test_a_finished_run_the_plan_has_changed_since_is_refused(tmp_path, kept_in):
    plan, records = kept_plan(tmp_path)
    study.execute(plan, dry_run=False, jobs=1, records=records)
    if kept_in == "its record":
        shutil.rmtree(tmp_path / "out")  # a new machine
    plan[1].flags["seconds"] = 0.2
    with pytest.raises(study.UserError, match=r"out/student was trained with other flags than the plan's: "
                       r"--seconds 0.1 \(the plan: 0.2\); delete it"):
        study.execute(plan, dry_run=False, jobs=1, records=records)


def test_output_into_a_closed_pipe_stops_without_a_traceback():
    printer = subprocess.Popen([sys.executable, "-c", "from support.runtime import run_main\n"
                                "run_main(lambda: [print(i, flush=True) for i in range(10**6)])"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_line(printer, "0", "the printer's first line")
    printer.stdout.close()  # as `| head -1` does
    _, stderr = wait_for_exit(printer, "the printer to stop on the closed pipe")
    assert printer.returncode == 1 and stderr == "", stderr


def test_dry_run_starts_nothing(tmp_path):
    plan = fake_plan(tmp_path, seconds=0.5)
    study.execute(plan, dry_run=True, jobs=2)
    assert not any(os.path.exists(r.out_dir) for r in plan)


@pytest.mark.parametrize("started_in_the_background", [False, True])
def test_ctrl_c_reaches_each_running_run_once_and_stops_the_study_in_one_line(tmp_path, started_in_the_background):
    """As Ctrl-C in a terminal, or `kill -INT` of a study started with `nohup ... &`, where the shell makes the
    study start with SIGINT ignored. The runs have sessions of their own: the study passes the signal on once."""
    fake_plan(tmp_path, seconds=60)  # writes the stand-in trainer
    driver = DRIVER.format(script=str(tmp_path / "fake_trainer.py"), tmp=str(tmp_path), seconds=EVENT_TIMEOUT)
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if started_in_the_background else None
    process = subprocess.Popen([sys.executable, "-c", driver], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, preexec_fn=ignore)
    wait_until(lambda: all((tmp_path / name / "started").exists() for name in ("teacher", "other")),
               "both runs to start", process)
    process.send_signal(signal.SIGINT)
    _, stderr = wait_for_exit(process, "the study to stop on Ctrl-C (its runs run until interrupted)")
    assert process.returncode == 130
    assert stderr.strip().splitlines() == ["study interrupted: every run saved its checkpoint; rerun the same "
                                           "command to continue"]
    assert [json.loads((tmp_path / name / "trace.json").read_text())["signals"] for name in ("teacher", "other")] \
        == [1, 1]


def test_a_ctrl_c_as_a_run_starts_reaches_that_run_and_starts_no_other(tmp_path, monkeypatch):
    """The signal lands between a run's start and the study's note of it (as it can on a loaded machine): the run
    still gets it once and saves, and the next run of the plan is not started."""
    teacher, _, other = fake_plan(tmp_path, seconds=60)  # each runs until it is interrupted
    started = study.start

    def start_then_ctrl_c(run, threads):
        launched = started(run, threads)
        wait_until(lambda: os.path.exists(os.path.join(run.out_dir, "started")), f"{run.name} to start", launched[0])
        os.kill(os.getpid(), signal.SIGINT)
        return launched
    monkeypatch.setattr(study, "start", start_then_ctrl_c)
    with pytest.raises(study.Interrupted, match="study interrupted"):
        study.execute([teacher, other], dry_run=False, jobs=2)
    assert trace(teacher)["signals"] == 1 and not os.path.exists(other.out_dir)


def test_a_teacher_given_more_steps_trains_on_before_its_conversions(tmp_path):
    """A translator's plan may give its finished teacher more steps: the teacher is "shorter" and resumed, and its
    conversion waits for it."""
    teacher, student, _ = fake_plan(tmp_path, seconds=0.1)
    study.execute([teacher], dry_run=False, jobs=1)
    (tmp_path / "teacher" / "args.json").write_text(json.dumps({"max_steps": 4}))
    teacher.flags["max_steps"] = 8
    assert runs.state(teacher) == "done", "a language model's cosine schedule cannot be trained on"
    teacher.script = "train_mt.py"  # a translator's can
    assert runs.state(teacher) == "shorter" and study.command(teacher)[-1] == "--resume"
    assert not study.ready(student, [teacher, student])


@pytest.mark.parametrize("teacher_since", ["trains on", "finished"])
def test_a_conversion_of_an_older_teacher_is_refused(tmp_path, teacher_since):
    teacher, student, _ = fake_plan(tmp_path, seconds=0.1)
    study.execute([teacher, student], dry_run=False, jobs=1)
    (tmp_path / "student" / "ckpt.pt").write_bytes(b"")
    if teacher_since == "trains on":
        saved = json.loads((tmp_path / "teacher" / "args.json").read_text())
        (tmp_path / "teacher" / "args.json").write_text(json.dumps({**saved, "max_steps": 4}))
        teacher.flags["max_steps"] = 8
        teacher.script = "train_mt.py"
    else:
        model = tmp_path / "teacher" / "ckpt.pt"  # the plan's --pretrained
        model.write_bytes(b"")
        os.utime(model, (time.time() + 5, time.time() + 5))
    with pytest.raises(study.UserError, match="student converted an earlier model of a teacher .*delete it"):
        study.execute([teacher, student], dry_run=False, jobs=1)


# -----------------------------------------------------------------------------
# Probes and records: a run is probed right after it trains; a finished run's record lets a new out/ continue

PROBE = """
import os, sys, time
with open(os.path.join(sys.argv[1], "probe.txt"), "w") as f:
    f.write(str(time.time()))
"""


def test_a_run_is_probed_after_it_trains_and_done_only_then(tmp_path):
    teacher = fake_plan(tmp_path, seconds=0.1)[0]
    teacher.flags["weights_from"] = write_weights(tmp_path / "weights.pt", 1.0)  # the probe reads them
    (tmp_path / "probe.py").write_text(PROBE)
    teacher.probes = [("probe.txt", [str(tmp_path / "probe.py"), teacher.out_dir])]
    study.execute([teacher], dry_run=False, jobs=1)
    assert float((tmp_path / "teacher" / "probe.txt").read_text()) >= trace(teacher)["end"]
    os.remove(tmp_path / "teacher" / "probe.txt")
    assert runs.trained(teacher) == "done" and runs.state(teacher) == "probe"


def write_weights(path, value: float) -> str:
    """A checkpoint of one weight, which the stand-in trainer copies as its ckpt.pt and model.pt."""
    torch.save({"model": {"w": torch.tensor([value])}}, path)
    return str(path)


def kept_plan(tmp_path, teacher_weights=1.0, students=("student",)):
    """A teacher with weights and its conversions, under tmp_path/out, their records under tmp_path/records."""
    script = tmp_path / "fake_trainer.py"
    script.write_text(FAKE_TRAINER)
    out, weights = tmp_path / "out", write_weights(tmp_path / "weights.pt", teacher_weights)
    run = lambda name, **flags: study.Run(name, str(script), {"seconds": 0.1, "weights_from": str(weights), **flags,
                                                              "out_dir": str(out / name)})
    plan = [run("teacher")] + [run(name, pretrained=str(out / "teacher" / "ckpt.pt")) for name in students]
    return plan, Records(str(out), str(tmp_path / "records"))


def test_a_lost_out_dir_is_restored_from_the_records_and_nothing_retrains(tmp_path):
    plan, records = kept_plan(tmp_path)
    study.execute(plan, dry_run=False, jobs=1, records=records)
    assert json.loads((tmp_path / "records" / "student" / "weights.json").read_text())["teacher"] == \
        json.loads((tmp_path / "records" / "teacher" / "weights.json").read_text())["ckpt.pt"]
    shutil.rmtree(tmp_path / "out")  # a new machine
    study.execute(plan, dry_run=False, jobs=1, records=records)
    assert all(runs.state(r) == "done" and not os.path.exists(os.path.join(r.out_dir, "trace.json")) for r in plan)


def test_a_kept_teacher_trains_again_for_a_new_conversion_into_its_recorded_weights(tmp_path):
    plan, records = kept_plan(tmp_path)
    study.execute(plan, dry_run=False, jobs=1, records=records)
    shutil.rmtree(tmp_path / "out")
    plan, _ = kept_plan(tmp_path, students=("student", "new"))
    study.execute(plan, dry_run=False, jobs=1, records=records)
    teacher, student, new = plan
    assert os.path.exists(os.path.join(teacher.out_dir, "trace.json")), "the teacher trained again"
    assert not os.path.exists(os.path.join(student.out_dir, "trace.json")) and trace(new)["teacher_done"]
    assert not os.path.exists(tmp_path / "records" / "teacher" / "retrained"), "the same weights: nothing set aside"


def digests(folder) -> dict:
    return json.loads((folder / "weights.json").read_text())


def test_a_teacher_trained_again_into_other_weights_keeps_its_record_and_sets_the_new_ones_aside(tmp_path, capsys):
    """Another machine's float sums: the same flags, other weights. The record (what the tables and the earlier
    conversions came from) stays; the new training's files go to retrained/; a new conversion starts from them."""
    plan, records = kept_plan(tmp_path)
    study.execute(plan, dry_run=False, jobs=1, records=records)
    first = digests(tmp_path / "records" / "teacher")
    shutil.rmtree(tmp_path / "out")
    plan, _ = kept_plan(tmp_path, teacher_weights=2.0, students=("student", "new"))
    study.execute(plan, dry_run=False, jobs=1, records=records)
    retrained = digests(tmp_path / "records" / "teacher" / "retrained")
    assert "teacher trained again with its recorded flags gives other weights" in capsys.readouterr().out
    assert digests(tmp_path / "records" / "teacher") == first == digests(tmp_path / "out" / "teacher")
    assert retrained["model.pt"] != first["model.pt"] and retrained == digests(tmp_path / "out/teacher/retrained")
    assert digests(tmp_path / "records" / "new")["teacher"] == retrained["ckpt.pt"]
    assert digests(tmp_path / "records" / "student")["teacher"] == first["ckpt.pt"]
    shutil.rmtree(tmp_path / "out")  # a third machine: both restore, nothing trains, nothing is stale
    study.execute(plan, dry_run=False, jobs=1, records=records)
    assert digests(tmp_path / "out/teacher/retrained") == retrained
    assert not any(os.path.exists(os.path.join(r.out_dir, "trace.json")) for r in plan)


def test_a_run_trained_with_other_flags_than_its_record_replaces_the_record(tmp_path):
    """Only the record's own flags make a retraining: a translator given more steps is a new record (and its
    conversions are then stale), not one set aside."""
    plan, records = kept_plan(tmp_path)
    study.execute(plan, dry_run=False, jobs=1, records=records)
    teacher, first = plan[0], digests(tmp_path / "records/teacher")["model.pt"]
    teacher.flags["max_steps"] = 8
    (tmp_path / "out/teacher/args.json").write_text(json.dumps({**teacher.flags, "max_steps": 8}))
    for name in ("model.pt", "ckpt.pt"):
        write_weights(tmp_path / "out/teacher" / name, 2.0)
    os.remove(tmp_path / "out/teacher/weights.json")
    records.keep(teacher)
    assert digests(tmp_path / "records/teacher")["model.pt"] == digests(tmp_path / "out/teacher")["model.pt"] != first
    assert not os.path.exists(tmp_path / "records/teacher/retrained")
    assert study.converted_from_an_older_teacher(plan[1], plan, records), "its conversion is stale"


def test_a_run_that_finished_as_the_study_stopped_is_noted_as_trained_here(tmp_path):
    teacher = fake_plan(tmp_path, seconds=0.1)[0]
    study.execute([teacher], dry_run=False, jobs=1)
    os.remove(tmp_path / "teacher" / "machine.json")  # the study stopped before it wrote it
    study.execute([teacher], dry_run=False, jobs=1)
    machine = json.loads((tmp_path / "teacher" / "machine.json").read_text())
    assert machine["threads"] >= 1 and "device" in machine and "wall_seconds" not in machine
