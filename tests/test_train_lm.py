"""End-to-end tests of train_lm.py and generate.py on a tiny corpus: the main job, exact resume, DDP,
and the one-line errors. Each runs the scripts as a user would, in a fresh folder.

    python -m pytest -q -s tests/test_train_lm.py
"""

import builtins
import gc
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import warnings
from types import SimpleNamespace

import pytest
import torch

import generate
import support.fast_step
import t2r
import train_lm
from support import checkpoints, data, runtime, training
from t2r import Config, TransformerLM, fold

from conftest import (ROOT, SCRIPT_ENV, TINY, assert_check_passes, assert_one_line_error, report, run_in_process,
                      run_two_processes, wait_for_exit, wait_for_line, write_corpus)


def test_the_conversion_job_end_to_end(tmp_path, corpus, run_here):
    """--init pretrained alone, as a user runs it: pretrain the teacher, convert, finetune, evaluate both; then
    generate, refuse a second run, evaluate again (those in process: no torch import each)."""
    out = run_here("train_lm.py", "--init", "pretrained", "--dataset", corpus, "--max_steps", "6", *TINY, cwd=tmp_path,
                   check=True)
    print(out.stdout[-1500:])
    assert "training it first" in out.stdout
    assert "| softmax (pretrained) | - |" in out.stdout and "| t2r+pretrain | 8 |" in out.stdout
    assert "\nmodel: vocab_size=" in out.stdout and "rope_theta" not in out.stdout  # what differs from the defaults
    teacher = torch.load(tmp_path / "out/tiny-softmax-random/ckpt.pt", weights_only=True)
    student = torch.load(tmp_path / "out/tiny-t2r-pretrained/ckpt.pt", weights_only=True)
    assert teacher["step"] == 12 and student["step"] == 6  # the teacher gets twice the finetuning steps
    assert student["config"]["attn"] == ["t2r", "t2r"]
    # generate past the training length (32 tokens) with the folded recurrent form, and check it
    student_ckpt = "out/tiny-t2r-pretrained/model.pt"
    sample = ["--ckpt", student_ckpt, "--prompt", "w1 w2 w3", "--num_tokens", "80", "--temperature", "0.8",
              "--top_k", "5"]
    gen = run_here("generate.py", *sample, "--check", cwd=tmp_path)
    print(gen.stdout[-600:])
    assert "folded, Eq. 8" in gen.stdout and "tokens/s" in gen.stdout
    assert_check_passes(gen.stdout)
    same = run_here("generate.py", *sample, cwd=tmp_path)
    assert same.stdout.split("\n")[1] == gen.stdout.split("\n")[1]  # seeded sampling is reproducible
    softmax = run_here("generate.py", "--ckpt", "out/tiny-softmax-random/model.pt", "--mode", "recompute",
                       "--temperature", "0", "--num_tokens", "5", cwd=tmp_path)
    assert "KV cache" not in softmax.stdout.split("\n")[0] and "mode recompute" in softmax.stdout
    again = run_here("train_lm.py", "--init", "pretrained", "--dataset", corpus, "--max_steps", "6", *TINY,
                     cwd=tmp_path)
    assert_one_line_error(again, "exists", "--resume")
    # --eval_only takes the run's flags from its folder and labels it as the run it evaluates
    evaluated = run_here("train_lm.py", "--eval_only", "--out_dir", "out/tiny-t2r-pretrained", cwd=tmp_path)
    assert "valid ppl" in evaluated.stdout
    results = json.loads((tmp_path / "out/tiny-t2r-pretrained/results.json").read_text())
    assert results["attn"] == "t2r+pretrain" and results["k"] == 8


def test_the_conversion_table_gives_the_softmax_controls_command_then_its_row(run_here, trained, tmp_path):
    """The teacher's row is the model before finetuning, which alone improves a briefly trained teacher: the table
    says so and gives the fair comparison's command, the softmax control (the same flags, --attn softmax, its own
    folder); once the control has run, a conversion of the same budget shows its row."""
    tmp, corpus = trained
    flags = ["--init", "pretrained", "--pretrained", str(tmp / "out/tiny-softmax-random/model.pt"), "--dataset", corpus,
             "--max_steps", "2", *TINY]
    converted = run_here("train_lm.py", *flags, cwd=tmp_path)
    note = converted.stdout.strip().splitlines()[-1]
    print(note)
    assert note.startswith("softmax (pretrained) is the teacher before finetuning")
    command = shlex.split(note.split(": python ", 1)[1])
    assert command[0] == "train_lm.py" and command[-4:] == ["--attn", "softmax", "--out_dir",
                                                            "out/tiny-softmax-pretrained"]
    assert "--feature_size" not in command and "--chunk_size" not in command  # the conversion's own: not the control's
    assert run_here(*command, cwd=tmp_path).returncode == 0
    control = json.loads((tmp_path / "out/tiny-softmax-pretrained/results.json").read_text())
    converted_again = run_here("train_lm.py", *flags, "--attn", "elu", cwd=tmp_path)  # another conversion, the same steps
    print(converted_again.stdout[-700:])
    assert f"| softmax+pretrain (control) | - | {control['valid']['ppl']:.2f} |" in converted_again.stdout
    assert "the fair comparison is softmax+pretrain (control)" in converted_again.stdout.strip().splitlines()[-1]


def test_a_resumed_conversion_ends_with_its_table_and_the_control_line(run_here, trained, tmp_path):
    """A conversion stopped and continued with --resume prints the table and the line on the teacher's row as one
    run straight through does (it printed neither); the control's command is the run's own, which a resumed run
    cannot tell from its defaults: said so."""
    tmp, corpus = trained
    flags = ["--init", "pretrained", "--pretrained", str(tmp / "out/tiny-softmax-random/model.pt"), "--dataset", corpus,
             "--max_steps", "4", *TINY, "--out_dir", "split"]
    assert run_here("train_lm.py", *flags, "--stop_at", "2", cwd=tmp_path).returncode == 0
    resumed = run_here("train_lm.py", "--resume", "--out_dir", "split", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    lines = resumed.stdout.strip().splitlines()
    print("\n".join(lines[-5:]))
    assert any(line.startswith("| softmax (pretrained) |") for line in lines)
    assert lines[-3].startswith("| t2r+pretrain |")
    assert lines[-1].endswith("the softmax control finetuned as long: the command that started this run, with --attn "
                              "softmax --out_dir tiny-softmax-pretrained")  # beside the run's folder


def final_state(path):
    checkpoint = torch.load(path, weights_only=True)
    return checkpoint["model"], checkpoint["optimizer"]["state"]


@pytest.mark.parametrize("attn, flags", [
    ("softmax", ["--dtype", "bfloat16", "--eval_context", "24", "--log_interval", "3"]),  # the run's own settings
    ("rfa", []),  # random features redrawn every step must resume too
])
def test_resume_is_exact_and_restores_every_flag(tmp_path, corpus, attn, flags, run_here):
    common = ["--dataset", corpus, "--attn", attn, "--max_steps", "8", "--dropout", "0.1", *TINY, *flags]
    in_process = lambda *argv: run_here("train_lm.py", *argv, cwd=tmp_path)  # no subprocess: no torch import each
    assert in_process(*common, "--out_dir", "straight").returncode == 0
    stopped = in_process(*common, "--out_dir", "split", "--stop_at", "3")
    assert "stopped at step 3 of 8" in stopped.stdout
    assert in_process("--resume", "--out_dir", "split").returncode == 0  # every other flag comes from the run
    assert json.loads((tmp_path / "split/args.json").read_text())["dtype"] == ("bfloat16" if flags else "auto")
    a, opt_a = final_state(tmp_path / "straight/ckpt.pt")
    b, opt_b = final_state(tmp_path / "split/ckpt.pt")
    diff = max((a[k].double() - b[k].double()).abs().max().item() for k in a)
    print(f"{attn}: max |straight - resumed| parameter = {diff}")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(torch.equal(opt_a[i]["exp_avg"], opt_b[i]["exp_avg"]) for i in opt_a)
    # the learning curve, one point per evaluation, survives the interruption
    curve = lambda run: json.loads((tmp_path / run / "results.json").read_text())["curve"]
    steps, tokens, _ = zip(*curve("straight"))
    assert curve("split") == curve("straight") and steps[-1] == 8 and tokens[-1] == 8 * tokens[0] / steps[0]


def test_more_processes_than_gpus_is_refused_before_joining(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(runtime.UserError, match="more processes on this machine than it has GPUs"):
        runtime.setup_distributed()  # raised before init_process_group, which would wait for the other process


DDP_FLAGS = ["--attn", "t2r", "--max_steps", "4", *TINY, "--dropout", "0"]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """A finished run of two processes on CPU (gloo), as torchrun starts them."""
    tmp = tmp_path_factory.mktemp("ddp")
    corpus = write_corpus(str(tmp / "tiny"))
    run_two_processes("train_lm.py", "--dataset", corpus, *DDP_FLAGS, "--out_dir", "ddp", cwd=tmp)
    return tmp, corpus


def test_ddp_gloo_two_processes_train_as_one_process_accumulating_their_batches(ddp_run, monkeypatch):
    """Process r draws its batches from its own generator (seed + r) and the two average their gradients. One
    process with --grad_accum 2, its micro-batch m drawn from generator seed + m (as process m would), averages the
    same two gradients: the weights agree up to the order of float32 sums."""
    tmp, corpus = ddp_run
    generators = [torch.Generator().manual_seed(1337 + rank) for rank in range(2)]  # --seed 1337, the default
    draws = []

    def as_two_processes(ids, batch_size, block_size, generator):
        draws.append(1)
        return get_batch(ids, batch_size, block_size, generators[(len(draws) - 1) % 2])
    get_batch = data.get_batch
    monkeypatch.setattr(data, "get_batch", as_two_processes)
    one = run_in_process("train_lm.py", "--dataset", corpus, *DDP_FLAGS, "--grad_accum", "2", "--out_dir", "one",
                         cwd=tmp)
    assert one.returncode == 0, one.stderr
    ddp, one = (torch.load(tmp / f"{name}/ckpt.pt", weights_only=True) for name in ("ddp", "one"))
    assert ddp["step"] == one["step"] == 4 and len(ddp["rng"]) == 2 and len(draws) == 8  # each process's stream saved
    diff = max((ddp["model"][k] - one["model"][k]).abs().max().item() for k in one["model"])
    assert report("two processes vs one accumulating, weights after 4 steps", diff) < 1e-5


def test_a_changed_process_count_on_resume_is_refused(run_here, ddp_run):
    tmp, _ = ddp_run
    assert_one_line_error(run_here("train_lm.py", "--resume", "--out_dir", "ddp", cwd=tmp),
                          "was trained by 2 process(es), this run has 1")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished softmax run and a finished T2R run from scratch on the tiny corpus."""
    tmp = tmp_path_factory.mktemp("lm")
    corpus = write_corpus(str(tmp / "tiny"))
    for attn in ("softmax", "t2r"):
        result = run_in_process("train_lm.py", "--dataset", corpus, "--attn", attn, "--max_steps", "2", *TINY, cwd=tmp)
        assert result.returncode == 0, result.stderr
    return tmp, corpus


def test_a_truncated_checkpoint_is_refused_and_kept(run_here, trained, tmp_path):
    tmp, corpus = trained
    good = (tmp / "out/tiny-softmax-random/ckpt.pt").read_bytes()
    (tmp_path / "run").mkdir()
    ckpt = tmp_path / "run/ckpt.pt"
    ckpt.write_bytes(good[: len(good) // 2])  # truncated, as by a full disk
    result = run_here("train_lm.py", "--dataset", corpus, "--resume", "--out_dir", str(tmp_path / "run"), *TINY,
                      cwd=tmp)
    assert_one_line_error(result, "truncated or corrupt")
    assert ckpt.read_bytes() == good[: len(good) // 2]  # nothing was overwritten
    assert_one_line_error(run_here("generate.py", "--ckpt", str(ckpt), cwd=tmp), "truncated or corrupt")


@pytest.mark.parametrize("name, flags, message", [
    ("another vocabulary", ["--init", "pretrained", "--pretrained", "out/tiny-softmax-random/model.pt",
                            "--dataset", "other"], "vocabulary"),
    ("a converted teacher", ["--init", "pretrained", "--pretrained", "out/tiny-t2r-random/model.pt"],
     "already converted"),
    ("another size on resume", ["--resume", "--out_dir", "out/tiny-softmax-random", "--n_layer", "3"], "n_layer"),
    # the cosine schedule decays to its --max_steps: a longer run is another run
    ("a longer run on resume", ["--resume", "--out_dir", "out/tiny-softmax-random", "--max_steps", "99"], "max_steps"),
    ("heads that do not divide the width", ["--n_head", "3"], "divisible"),
    ("a block longer than the data", ["--block_size", "100000"], "--block_size"),
    ("a finished run again", ["--out_dir", "out/tiny-softmax-random"], "exists"),
])
def test_train_lm_refuses(trained, tmp_path, monkeypatch, name, flags, message):
    """In process, for speed: main raises the UserError that run_main prints as one line (tested above)."""
    tmp, corpus = trained
    write_corpus(str(tmp / "other"), seed=1, words=25)
    flags = [f if f != "other" else str(tmp / "other") for f in flags]
    defaults = ["--dataset", corpus, *TINY, "--max_steps", "2", "--out_dir", str(tmp_path / "new")]
    given = {f for f in flags if f.startswith("--")}
    argv = [a for i, a in enumerate(defaults) if not (a in given or (i and defaults[i - 1] in given))] + flags
    monkeypatch.chdir(tmp)
    with pytest.raises(runtime.UserError, match=message) as error:
        train_lm.main(argv)
    print(error.value)


def test_a_missing_dataset_is_a_one_line_error(run_here, tmp_path):
    assert_one_line_error(run_here("train_lm.py", "--dataset", "missing", cwd=tmp_path), "missing")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_on_a_machine_without_it_is_refused(capsys):
    with pytest.raises(SystemExit):
        train_lm.get_args(["--device", "cuda"])
    assert "no such CUDA device" in capsys.readouterr().err


def test_a_run_prints_the_model_fields_that_differ_from_the_defaults(capsys):
    """A run's `model:` line names the config's class unless it is the paper's Config, then what was chosen."""
    from after_t2r import WindowConfig
    from families import FamilyConfig
    from sru import SRUConfig
    for config in (Config(n_head=2, d_model=128, attn="t2r"), Config(), FamilyConfig(max_positions=1024),
                   WindowConfig(window=8, attn="t2r", adaptive_cutoffs=[5000]), SRUConfig(d_model=128, attn_every=4)):
        runtime.print_config("model", config)
    assert capsys.readouterr().out.splitlines() == [
        "model: n_head=2, d_model=128, attn=t2r", "model: the defaults", "model (FamilyConfig): max_positions=1024",
        "model (WindowConfig): attn=t2r, adaptive_cutoffs=[5000], window=8",
        "model (SRUConfig): d_model=128, d_attn=32, attn_every=4"]  # d_attn: d_model // 4 when not given


@pytest.mark.parametrize("temperature", [1e-40, 1e-300])  # 30 / 1e-40 overflows float32; 1e-300 is 0 in float32
def test_sampling_at_a_tiny_temperature_is_argmax(temperature):
    logits = torch.randn(4, 50) * 30
    picked = generate.sample(logits, temperature, 0, torch.Generator().manual_seed(0))
    assert torch.equal(picked, logits.argmax(-1))


@pytest.mark.parametrize("flags, message", [
    (["--batch_size", "100000000"], "on 3,200,000,000 tokens a step would take about"),
    (["--d_model", "1000000", "--n_head", "1"], "lower --d_model, --d_ff, --n_layer or --feature_size"),
    (["--init", "pretrained", "--pretrained", "out/tiny-softmax-random/model.pt", "--feature_size", "100000000"],
     "lower --d_model, --d_ff, --n_layer or --feature_size"),  # the conversion, tried on the meta device
])
def test_a_run_that_cannot_fit_in_memory_is_refused_before_it_allocates(run_here, trained, tmp_path, flags, message,
                                                                          monkeypatch):
    """The model (built on the meta device: shapes, no memory), its gradients and Adam state and a step's activations
    against the memory free (24 GiB, the 2-core CI machine's, whatever this one has): each used to fail minutes later,
    or be killed."""
    monkeypatch.setattr(runtime, "free_memory", lambda device: 24 * 2 ** 30)
    tmp, corpus = trained
    result = run_here("train_lm.py", "--dataset", corpus, *TINY, *flags, "--out_dir", tmp_path / "r", cwd=tmp)
    assert_one_line_error(result, message, "GiB free on this cpu")
    assert not (tmp_path / "r/ckpt.pt").exists()


def test_too_many_samples_to_fit_are_refused_before_they_are_allocated(run_here, trained):
    tmp, _ = trained
    result = run_here("generate.py", "--ckpt", "out/tiny-t2r-random/model.pt", "--num_samples", "1000000000", cwd=tmp)
    assert_one_line_error(result, "--num_samples 1000000000 of --num_tokens 100 would take about", "lower --num_samples")


def test_a_teachers_adaptive_cutoffs_are_not_overridden(run_here, trained, tmp_path):
    tmp, corpus = trained
    result = run_here("train_lm.py", "--dataset", corpus, *TINY, "--init", "pretrained", "--pretrained",
                      "out/tiny-softmax-random/model.pt", "--adaptive_cutoffs", "20", "--out_dir", tmp_path, cwd=tmp)
    assert_one_line_error(result, "--adaptive_cutoffs [20] differs from the pretrained model's []")


def test_a_tokenizer_whose_data_folder_is_elsewhere_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(runtime.UserError, match="dataset folder tiny does not exist.*run it where the model was trained"):
        generate.load_tokenizer({"args": {"dataset": "tiny"}})


def test_an_unfinished_teacher_is_not_resumed_with_other_flags(run_here, tmp_path):
    corpus = write_corpus(str(tmp_path / "tiny"))
    assert run_here("train_lm.py", "--dataset", corpus, *TINY, "--max_steps", "10", "--stop_at", "1",
                    cwd=tmp_path).returncode == 0
    again = run_here("train_lm.py", "--dataset", corpus, *TINY, "--init", "pretrained", "--max_steps", "2",
                     cwd=tmp_path)  # its teacher: another schedule
    assert_one_line_error(again, "out/tiny-softmax-random holds an unfinished softmax teacher trained with --",
                          "finish it first (python train_lm.py --resume --out_dir out/tiny-softmax-random)")
    assert torch.load(tmp_path / "out/tiny-softmax-random/ckpt.pt", weights_only=True)["step"] == 1  # untouched


def test_an_unfinished_teacher_is_finished_with_the_vocabulary_its_args_json_records(run_here, tmp_path):
    """args.json records a word-level run's own vocabulary (42 words here), not --vocab_size's 8000, which sizes a
    BPE: the teacher of a student with the same flags is still the same teacher, finished, then converted."""
    corpus = write_corpus(str(tmp_path / "tiny"))
    assert run_here("train_lm.py", "--dataset", corpus, *TINY, "--max_steps", "12", "--warmup_steps", "2",
                    "--stop_at", "1", cwd=tmp_path).returncode == 0  # the student's teacher's flags
    assert json.loads((tmp_path / "out/tiny-softmax-random/args.json").read_text())["vocab_size"] == 42
    student = run_here("train_lm.py", "--dataset", corpus, *TINY, "--init", "pretrained", "--max_steps", "6",
                       cwd=tmp_path)
    assert student.returncode == 0, student.stderr
    assert torch.load(tmp_path / "out/tiny-softmax-random/model.pt", weights_only=True)["step"] == 12


def test_a_run_of_the_other_trainer_is_not_resumed(tmp_path):
    (tmp_path / "args.json").write_text(json.dumps({name: 1 for name in ("src", "tgt", "max_len", "max_tokens")}))
    with pytest.raises(runtime.UserError, match="is not a train_lm.py run .* the script that trained it"):
        train_lm.get_args(["--resume", "--out_dir", str(tmp_path)])


def test_resuming_a_run_stopped_before_it_saved_its_flags_says_to_start_again(tmp_path):
    """As a conversion stopped while its Hugging Face teacher is evaluated: the folder holds that evaluation only.
    (Stopped after its flags, before its first checkpoint: tests/test_transfer.py.)"""
    (tmp_path / "teacher_results.json").write_text("{}")
    with pytest.raises(runtime.UserError, match="nothing to resume in .*: .* the same command without --resume"):
        train_lm.get_args(["--resume", "--out_dir", str(tmp_path)])


@pytest.mark.parametrize("argv, message", [
    (["--ckpt", "nope.pt"], "no checkpoint"),
    (["--ckpt", "out/tiny-softmax-random/model.pt", "--prompt", "  "], "empty"),
])
def test_generate_refuses(run_here, trained, argv, message):
    tmp, _ = trained
    assert_one_line_error(run_here("generate.py", *argv, cwd=tmp), message)


def test_generate_by_default_samples_what_train_lm_init_pretrained_writes(run_here, trained):
    """The README's `python train_lm.py --init pretrained && python generate.py`: generate.py's default --ckpt is the
    model.pt in the default run's folder (here a tiny run copied there)."""
    tmp, _ = trained
    default_run = train_lm.get_args(["--init", "pretrained"]).out_dir
    assert os.path.dirname(generate.get_args([]).ckpt) == default_run
    shutil.copytree(tmp / "out/tiny-t2r-random", tmp / default_run)  # where the run trained: its token cache is there
    result = run_here("generate.py", "--num_tokens", "5", "--temperature", "0", cwd=tmp)
    assert result.returncode == 0, result.stderr
    assert f"{default_run}/model.pt" in result.stdout and "t2r.py's step" in result.stdout


def test_generate_elsewhere_reads_the_checkpoints_tokenizer_and_builds_no_token_cache(run_here, trained, tmp_path):
    """The tokenizer is kept in the checkpoint: run from another folder than the training's (whose data/cache is
    relative to where it ran), generate.py generates, and leaves no data/cache behind (it used to build one, then
    to refuse: "run it where the model was trained")."""
    tmp, _ = trained
    result = run_here("generate.py", "--ckpt", str(tmp / "out/tiny-t2r-random/model.pt"), "--num_tokens", "5",
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "data").exists()


def test_generate_decodes_a_softmax_model_with_its_kv_cache(run_here, trained):
    tmp, _ = trained
    result = run_here("generate.py", "--ckpt", "out/tiny-softmax-random/model.pt", "--prompt", "w1 w2", "--num_tokens",
                      "30", "--check", cwd=tmp)
    assert result.returncode == 0, result.stderr
    assert "attention softmax, mode recurrent with a KV cache" in result.stdout
    assert_check_passes(result.stdout)


def test_one_prompt_is_printed_once_then_the_same_greedy_picks_in_either_mode(run_here, trained):
    """The streamed text is the prompt, then each pick once: the recurrent form's prefill prints nothing, and the KV
    cache's picks are the ones recomputing the whole sequence for every token makes."""
    tmp, _ = trained
    texts = []
    for mode in ("recurrent", "recompute"):
        result = run_here("generate.py", "--ckpt", "out/tiny-softmax-random/model.pt", "--prompt", "w1 w2 w3",
                          "--num_tokens", "12", "--temperature", "0", "--mode", mode, "--check", cwd=tmp)
        assert_check_passes(result.stdout)
        texts.append(result.stdout.split(", mode ", 1)[1].split("\n", 1)[1].split("\n\n")[0])
    print(texts)
    assert texts[0] == texts[1] and texts[0].startswith("w1 w2 w3 ")
    assert len(texts[0].split()) + texts[0].count("\n") == 3 + 12  # <eos> prints as a new line


def test_generate_samples_several_continuations_as_one_batch(run_here, trained):
    tmp, _ = trained
    result = run_here("generate.py", "--ckpt", "out/tiny-t2r-random/model.pt", "--prompt", "w1 w2", "--num_tokens",
                      "6", "--num_samples", "3", "--seed", "3", "--temperature", "2", cwd=tmp)  # its 2 steps put 0.9
    assert result.returncode == 0, result.stderr  # on its last word after a line's end: flattened, samples differ
    samples = result.stdout.split("--- sample ")[1:]
    assert [s.split("\n")[0] for s in samples] == ["0", "1", "2"]
    texts = [s.split("\n", 1)[1].split("\n\n")[0].split() for s in samples]  # its words, an <eos> a new line
    assert all(t[:2] == ["w1", "w2"] and len(t) >= 3 for t in texts) and len({" ".join(t) for t in texts}) > 1
    assert "3 x 5 tokens after the first" in result.stdout  # the first's time is the prompt's: said apart


def test_t2r_with_softmax_layers_kept_converts_trains_and_generates(run_here, trained):
    """The paper's "T2R 75%" at two layers (--keep_softmax_every 2: the second layer from the top, the bottom one,
    stays softmax): the run keeps that layer, and its mixed state (a KV cache below a T2R state) generates."""
    tmp, corpus = trained
    result = run_here("train_lm.py", "--dataset", corpus, *TINY, "--init", "pretrained", "--pretrained",
                      "out/tiny-softmax-random/model.pt", "--keep_softmax_every", "2", "--max_steps", "2",
                      "--out_dir", "t2r50", cwd=tmp)
    assert result.returncode == 0, result.stderr
    assert torch.load(tmp / "t2r50/model.pt", weights_only=True)["config"]["attn"] == ["softmax", "t2r"]
    gen = run_here("generate.py", "--ckpt", "t2r50/model.pt", "--num_tokens", "20", "--check", cwd=tmp)
    assert "attention softmax, t2r (folded, Eq. 8)" in gen.stdout
    assert_check_passes(gen.stdout)


def test_a_bpe_language_model_reports_word_level_perplexity_from_the_same_nll(run_here, corpus, tmp_path):
    """--tokenizer bpe: the test split's NLL over its tokens gives ppl, over its words (whitespace words plus one
    <eos> a line, counted here from the text) word_ppl."""
    result = run_here("train_lm.py", "--dataset", corpus, *TINY, "--tokenizer", "bpe", "--vocab_size", "280",
                      "--max_steps", "2", "--out_dir", "bpe", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    test = json.loads((tmp_path / "bpe/results.json").read_text())["test"]
    lines = open(os.path.join(corpus, "test.txt")).read().splitlines()
    words = sum(len(line.split()) + 1 for line in lines)
    nll = math.log(test["ppl"]) * test["tokens"]
    assert test["tokens"] > words  # BPE cuts words into pieces
    assert math.log(test["word_ppl"]) * words == pytest.approx(nll, rel=1e-6)  # ppl: exp in float32; a word off: 2e-3


@pytest.mark.parametrize("step, first_line", [("auto", "the fast step (support/fast_step.py's FlatStep"),
                                              ("model", "t2r.py's step as written (model.step, S and z apart)")])
@pytest.mark.parametrize("prefill, steps", [("parallel", 4), ("step", 3 + 4)])
def test_generate_runs_the_step_it_names(run_here, trained, monkeypatch, prefill, steps, step, first_line):
    """generate.py decodes with the fast step (support/fast_step.py, Eq. 7 its read_state) by default, with t2r.py's
    as written (linear_attention_step) under --step model, and says which: one call per layer and token stepped of the
    one, none of the other; every new token but the last is stepped, and with --prefill step the prompt's tokens too (a
    line's end, w1, w2; --prefill parallel reads them in one pass, t2r.py's linear_attention_prefill)."""
    tmp, _ = trained
    calls = {"fast": 0, "model": 0}

    def counting(name, function):
        def counted(*args):
            calls[name] += 1
            return function(*args)
        return counted
    monkeypatch.setattr(support.fast_step, "read_state", counting("fast", support.fast_step.read_state))
    monkeypatch.setattr(t2r, "linear_attention_step", counting("model", t2r.linear_attention_step))
    result = run_here("generate.py", "--ckpt", "out/tiny-t2r-random/model.pt", "--prompt", "w1 w2", "--num_tokens",
                      "5", "--prefill", prefill, "--step", step, cwd=tmp)
    assert result.returncode == 0, result.stderr
    assert first_line in result.stdout
    ran = "model" if step == "model" else "fast"
    assert calls == {ran: 2 * steps, ("fast" if ran == "model" else "model"): 0}  # 2 layers


def test_a_reader_follows_step_model_from_main_to_eq_6_in_five_calls(run_here, trained):
    """With --step model the path from generate.py's main to Eq. 6 (t2r.py's linear_attention_step) is at most 5
    calls, every one of them in generate.py or t2r.py: main -> generate -> the model's step -> a layer's -> its
    attention's -> Eq. 6. (The calls of the first time Eq. 6 runs, recorded by a profile hook.)"""
    tmp, _ = trained
    stack, path = [], []

    def record(frame, event, arg):
        if event == "call":
            stack.append((os.path.basename(frame.f_code.co_filename), frame.f_code.co_name))
            if frame.f_code.co_name == "linear_attention_step" and not path:
                path.extend(stack)
        elif event == "return" and stack:
            stack.pop()
    sys.setprofile(record)
    try:
        result = run_here("generate.py", "--ckpt", "out/tiny-t2r-random/model.pt", "--prompt", "w1 w2",
                          "--num_tokens", "3", "--step", "model", cwd=tmp)
    finally:
        sys.setprofile(None)
    assert result.returncode == 0, result.stderr
    start = max(i for i, (file, name) in enumerate(path) if (file, name) == ("generate.py", "main"))
    calls = path[start + 1:]
    print(" -> ".join(f"{file}:{name}" for file, name in path[start:]))
    assert len(calls) <= 5 and all(file in ("generate.py", "t2r.py") for file, _ in calls)


# -----------------------------------------------------------------------------
# A run is one run: resumed whole, on the same data, by one trainer at a time; nothing silent, nothing lost

SMALL = [*TINY, "--max_steps", "8"]


def weights(path):
    return torch.load(path, weights_only=True)["model"]


def assert_same_weights(a, b):
    a, b = weights(a), weights(b)
    diff = max((a[k].double() - b[k].double()).abs().max().item() for k in a)
    print(f"max |straight - resumed| parameter = {diff}")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_another_flag_on_resume_is_refused(run_here, trained):
    tmp, _ = trained
    result = run_here("train_lm.py", "--resume", "--out_dir", "out/tiny-t2r-random", "--eval_context", "16", cwd=tmp)
    assert_one_line_error(result, "trained with --eval_context 32")


def reorder_vocabulary(corpus):
    """Append lines of frequent words: the vocabulary keeps its size, but word ids (by frequency) change."""
    with open(os.path.join(corpus, "train.txt"), "a") as f:
        f.write("w39 w38 w37 w36\n" * 300)


@pytest.fixture(scope="module")
def run_on_changed_data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("changed")
    corpus = write_corpus(str(tmp / "tiny"))
    assert run_in_process("train_lm.py", "--dataset", corpus, *SMALL, "--out_dir", "r", cwd=tmp).returncode == 0
    reorder_vocabulary(corpus)
    return tmp


@pytest.mark.parametrize("script, argv", [
    ("train_lm.py", ["--resume", "--out_dir", "r"]),
    ("train_lm.py", ["--eval_only", "--out_dir", "r"]),
])
def test_a_run_on_changed_data_is_refused(run_here, run_on_changed_data, script, argv):
    result = run_here(script, *argv, cwd=run_on_changed_data)
    assert_one_line_error(result, "trained on another")


def test_generate_keeps_the_vocabulary_a_model_was_trained_with(run_here, run_on_changed_data, tmp_path):
    """The checkpoint keeps its tokenizer: a corpus whose word ids changed since does not change the words it
    generates. A run of earlier code reads the token cache, which it was not trained on: refused."""
    result = run_here("generate.py", "--ckpt", "r/model.pt", "--prompt", "w39 w38", "--num_tokens", "5",
                      "--temperature", "0", cwd=run_on_changed_data)
    assert result.returncode == 0, result.stderr
    assert "--- " not in result.stdout and "\nw39 w38" in result.stdout
    earlier = torch.load(run_on_changed_data / "r/model.pt", weights_only=True)
    del earlier["tokenizer"], earlier["checksum_all"]
    torch.save(earlier, tmp_path / "model.pt")
    # the changed corpus's token cache (any run on it since builds it): what a checkpoint without its tokenizer reads
    data.prepare(str(run_on_changed_data / "tiny"), cache_dir=str(run_on_changed_data / "data" / "cache"))
    result = run_here("generate.py", "--ckpt", str(tmp_path / "model.pt"), cwd=run_on_changed_data)
    assert_one_line_error(result, "trained on another tokenizer")


def test_a_second_trainer_on_the_same_out_dir_is_refused(run_here, tmp_path, corpus):
    first = subprocess.Popen([sys.executable, os.path.join(ROOT, "train_lm.py"), "--dataset", corpus, *TINY,
                              "--max_steps", "100000", "--out_dir", "r"], cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, env={**os.environ, **SCRIPT_ENV})
    try:
        wait_for_line(first, "parameters", "the first trainer's 'parameters' line (it holds the lock then)")
        second = run_here("train_lm.py", "--dataset", corpus, *SMALL, "--out_dir", "r", cwd=tmp_path)
        assert_one_line_error(second, "another run is using r")
    finally:
        first.kill()
        first.wait()


def test_ctrl_c_saves_and_the_resumed_run_is_exact(run_here, tmp_path, corpus):
    """The interrupted run is a process of its own (it gets the signal); the others run here, on its one thread."""
    flags = ["--dataset", corpus, *TINY, "--max_steps", "40", "--eval_interval", "40"]
    assert run_here("train_lm.py", *flags, "--out_dir", "straight", cwd=tmp_path).returncode == 0
    interrupted = subprocess.Popen([sys.executable, os.path.join(ROOT, "train_lm.py"), *flags, "--out_dir", "split"],
                                   cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env={**os.environ, **SCRIPT_ENV})
    wait_for_line(interrupted, "step 2/", "the run's 'step 2/' line (training has begun)")
    interrupted.send_signal(signal.SIGINT)
    _, err = wait_for_exit(interrupted, "the interrupted run to save and exit")
    print(err.strip())
    assert interrupted.returncode == 130 and "Traceback" not in err and "saved split/ckpt.pt" in err, \
        f"exit status {interrupted.returncode}, expected 130 (had the run's 40 steps finished before Ctrl-C came?)"
    assert run_here("train_lm.py", "--resume", "--out_dir", "split", cwd=tmp_path).returncode == 0
    assert_same_weights(tmp_path / "straight/ckpt.pt", tmp_path / "split/ckpt.pt")


def test_a_second_ctrl_c_stops_at_once_in_one_line(capsys):
    """The first Ctrl-C asks for a save after the step; a second one, before it comes, stops at once: one line on
    stderr and exit status 130, not a KeyboardInterrupt traceback."""
    def press_twice():
        with training.CtrlC() as ctrl_c:
            ctrl_c.handle(signal.SIGINT, None)
            ctrl_c.handle(signal.SIGINT, None)
    with pytest.raises(SystemExit) as exit_info:
        runtime.run_main(press_twice)
    err = capsys.readouterr().err
    print(err)
    assert exit_info.value.code == 130 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == "Ctrl-C again: stopped at once, without saving; the last checkpoint saved " \
                                           "is kept"


def test_ctrl_c_during_generation_stops_in_one_line(trained, tmp_path):
    tmp, _ = trained
    generating = subprocess.Popen([sys.executable, os.path.join(ROOT, "generate.py"), "--ckpt",
                                   "out/tiny-t2r-random/model.pt", "--num_tokens", "100000000"], cwd=tmp,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, **SCRIPT_ENV})
    wait_for_line(generating, "", "generate.py's first line, which says what generates (the loop has begun)")
    generating.send_signal(signal.SIGINT)
    _, err = wait_for_exit(generating, "generate.py to stop on Ctrl-C")
    print(err)
    assert generating.returncode == 130 and err.strip() == "stopped by Ctrl-C"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="/dev/full (a disk that is always full) is Linux's")
def test_generating_into_a_full_disk_is_one_line(trained):
    """`generate.py > /dev/full` ended in an OSError traceback."""
    tmp, _ = trained
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, os.path.join(ROOT, "generate.py"), "--ckpt",
                                 "out/tiny-t2r-random/model.pt", "--num_tokens", "5"], cwd=tmp, stdout=full,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, **SCRIPT_ENV}, timeout=300)
    assert_one_line_error(result, "no space left on the device writing the output")


def test_a_loss_that_turns_nan_stops_without_saving(run_here, tmp_path, corpus):
    result = run_here("train_lm.py", "--dataset", corpus, *TINY, "--max_steps", "20", "--lr", "1e30", "--grad_clip",
                      "0", "--out_dir", "r", cwd=tmp_path)
    assert_one_line_error(result, "NaN or inf")
    assert not (tmp_path / "r/ckpt.pt").exists()  # no NaN weights were saved (the first save was due at step 4)


def test_a_nan_teacher_is_not_converted(run_here, trained, tmp_path):
    tmp, corpus = trained
    teacher = torch.load(tmp / "out/tiny-softmax-random/model.pt", weights_only=True)
    next(iter(teacher["model"].values())).fill_(float("nan"))
    del teacher["checksum"], teacher["checksum_all"]  # as a checkpoint from elsewhere, or from before them, has none
    torch.save(teacher, tmp_path / "nan.pt")
    result = run_here("train_lm.py", "--init", "pretrained", "--pretrained", str(tmp_path / "nan.pt"),
                      "--dataset", corpus, *SMALL, "--out_dir", str(tmp_path / "x"), cwd=tmp)
    assert_one_line_error(result, "NaN or inf weights")


def test_weights_that_turn_nan_are_not_saved(run_here, tmp_path, corpus):
    """One step at --lr 1e30: the loss before the update is finite, the model after it is not (its weights near
    1e30, its outputs overflow). The run stops at its evaluation in one line; no checkpoint, no model.pt (it used to
    finish with valid ppl nan and exit 0)."""
    result = run_here("train_lm.py", "--dataset", corpus, *TINY, "--max_steps", "1", "--lr", "1e30", "--grad_clip",
                      "0", "--out_dir", "r", cwd=tmp_path)
    assert_one_line_error(result, "the validation loss is nan at step 1", "lower --lr, then --resume")
    assert sorted(os.listdir(tmp_path / "r")) == [".lock", "args.json"]


def test_weights_holding_nan_or_inf_are_never_saved(tmp_path):
    with pytest.raises(runtime.UserError, match="not saving .*ckpt.pt: its weights hold NaN or inf \\(w;"):
        checkpoints.save_checkpoint(str(tmp_path / "ckpt.pt"), {"model": {"w": torch.tensor([1.0, float("inf")])}})
    assert os.listdir(tmp_path) == []


def test_the_documented_recovery_resumes_at_a_lower_learning_rate(run_here, tmp_path, corpus):
    """The error's advice, "lower --lr, then --resume", is taken: --lr may go down on --resume (and only down), and
    the run goes on from its last checkpoint with the new rate, which args.json keeps."""
    flags = ["--dataset", corpus, *TINY, "--max_steps", "4", "--out_dir", "r"]
    assert run_here("train_lm.py", *flags, "--lr", "0.01", "--stop_at", "2", cwd=tmp_path).returncode == 0
    higher = run_here("train_lm.py", "--resume", "--out_dir", "r", "--lr", "0.1", cwd=tmp_path)
    assert_one_line_error(higher, "trained with --lr 0.01, the flags say 0.1")
    lower = run_here("train_lm.py", "--resume", "--out_dir", "r", "--lr", "0.001", cwd=tmp_path)
    assert lower.returncode == 0, lower.stderr
    assert "--lr 0.001: r, trained with --lr 0.01, goes on at the lower value" in lower.stdout
    assert json.loads((tmp_path / "r/args.json").read_text())["lr"] == 0.001
    assert torch.load(tmp_path / "r/ckpt.pt", weights_only=True)["step"] == 4


def test_a_checkpoint_whose_weights_changed_on_disk_is_refused(run_here, trained, tmp_path):
    """400 bytes of the embedding flipped inside model.pt: the zip still opens and torch.load does not check its
    CRCs, but the tensors no longer match the checksum saved with them."""
    tmp, _ = trained
    good = (tmp / "out/tiny-t2r-random/model.pt").read_bytes()
    embedding = torch.load(tmp / "out/tiny-t2r-random/model.pt", weights_only=True)["model"]["embed.tok.weight"]
    start = good.index(embedding.numpy().tobytes()[:64])  # the tensor's bytes, stored as they are in the zip
    damaged = bytearray(good)
    damaged[start + 100 : start + 500] = bytes(b ^ 0xFF for b in damaged[start + 100 : start + 500])
    (tmp_path / "model.pt").write_bytes(bytes(damaged))
    result = run_here("generate.py", "--ckpt", "model.pt", cwd=tmp_path)
    assert_one_line_error(result, "model.pt is corrupt: its tensors do not match the checksum saved with them")


def test_a_model_with_nan_weights_does_not_generate(run_here, trained, tmp_path):
    tmp, _ = trained
    checkpoint = torch.load(tmp / "out/tiny-t2r-random/model.pt", weights_only=True)
    checkpoint["model"]["embed.tok.weight"][3, 0] = float("nan")
    del checkpoint["checksum"], checkpoint["checksum_all"]  # hand-made, or from before checksums
    torch.save(checkpoint, tmp_path / "model.pt")
    result = run_here("generate.py", "--ckpt", "model.pt", "--temperature", "0", cwd=tmp_path)
    assert_one_line_error(result, "holds NaN or inf weights (embed.tok.weight)")


def test_a_teachers_unreadable_results_are_found_before_the_student_trains(run_here, trained, tmp_path):
    """The final table shows the teacher's row from its results.json: a damaged one is a one-line error before any
    work (it was a traceback after the student had trained)."""
    tmp, corpus = trained
    shutil.copytree(tmp / "out/tiny-softmax-random", tmp_path / "teacher")
    (tmp_path / "teacher/results.json").write_text("{")
    result = run_here("train_lm.py", "--dataset", corpus, *TINY, "--init", "pretrained", "--pretrained",
                      "teacher/model.pt", "--max_steps", "2", "--out_dir", "student", cwd=tmp_path)
    assert_one_line_error(result, "teacher/results.json is unreadable (JSONDecodeError)")
    assert not (tmp_path / "student/ckpt.pt").exists()


def test_a_checkpoint_whose_args_are_no_dict_is_refused(run_here, trained, tmp_path):
    tmp, _ = trained
    checkpoint = torch.load(tmp / "out/tiny-t2r-random/model.pt", weights_only=True)
    checkpoint["args"] = ["--dataset", "tiny"]  # hand-made: no checksum of everything
    del checkpoint["checksum_all"]
    torch.save(checkpoint, tmp_path / "model.pt")
    assert_one_line_error(run_here("generate.py", "--ckpt", "model.pt", cwd=tmp_path), "its args, is not a dict")


@pytest.mark.parametrize("where, value", [("config", 0.655), ("args", "other")])
def test_a_checkpoint_whose_config_or_flags_changed_on_disk_is_refused(run_here, trained, tmp_path, where, value):
    """A flipped bit in model.pt's config (dropout 0 -> 0.655) or flags, its tensors untouched: the checksum of
    everything it holds no longer matches (the tensors' alone did)."""
    tmp, _ = trained
    checkpoint = torch.load(tmp / "out/tiny-t2r-random/model.pt", weights_only=True)
    checkpoint[where]["dropout" if where == "config" else "dataset"] = value  # both checksums kept as they were
    torch.save(checkpoint, tmp_path / "model.pt")
    assert_one_line_error(run_here("generate.py", "--ckpt", "model.pt", cwd=tmp_path),
                          "model.pt is corrupt: what it holds besides its tensors")


@pytest.mark.parametrize("config", [{"n_head": 0}, "a string"])
def test_a_hand_made_checkpoint_with_a_bad_config_is_refused(run_here, tmp_path, config):
    if isinstance(config, dict):
        config = {**Config(vocab_size=10, n_layer=1, d_model=8, n_head=2).to_dict(), **config}
    torch.save({"model": {}, "config": config}, tmp_path / "bad.pt")
    assert_one_line_error(run_here("generate.py", "--ckpt", "bad.pt", cwd=tmp_path), "bad.pt")


def test_an_unreadable_args_json_is_a_one_line_error(run_here, trained, tmp_path):
    tmp, _ = trained
    shutil.copytree(tmp / "out/tiny-softmax-random", tmp_path / "r")
    (tmp_path / "r/args.json").write_text("{")  # as a crash of an older version could leave it
    result = run_here("train_lm.py", "--resume", "--out_dir", "r", cwd=tmp_path)
    assert_one_line_error(result, "args.json is unreadable")


def test_an_out_dir_that_is_a_file_is_refused(run_here, tmp_path, corpus):
    (tmp_path / "taken").write_text("")
    result = run_here("train_lm.py", "--dataset", corpus, *SMALL, "--out_dir", "taken", cwd=tmp_path)
    assert_one_line_error(result, "cannot write to --out_dir taken")


@pytest.mark.parametrize("left", ["ckpt.pt.99999.t2r-partial", "ckpt.pt.99999.tmp"])  # today's name, and before
def test_a_write_killed_midway_leaves_no_temporary_file_once_the_run_goes_on(run_here, trained, tmp_path, left):
    """kill -9 during a save leaves ckpt.pt.<pid>.t2r-partial (atomic_write's name; .tmp before); the next run to
    hold the folder's lock removes it: no other process can be writing there."""
    tmp, _ = trained
    shutil.copytree(tmp / "out/tiny-t2r-random", tmp_path / "r")
    (tmp_path / "r" / left).write_bytes(b"half a checkpoint")
    assert run_here("train_lm.py", "--eval_only", "--out_dir", "r", cwd=tmp_path).returncode == 0
    assert not (tmp_path / "r" / left).exists()


@pytest.mark.parametrize("name", ["notes.tmp", "model.pt.tmp", "draft.123.tmp", "results.json.old.tmp"])
def test_a_users_own_files_in_the_out_dir_are_left_alone(run_here, trained, tmp_path, name):
    tmp, _ = trained
    shutil.copytree(tmp / "out/tiny-t2r-random", tmp_path / "r")
    (tmp_path / "r" / name).write_text("precious")
    assert run_here("train_lm.py", "--eval_only", "--out_dir", "r", cwd=tmp_path).returncode == 0
    assert (tmp_path / "r" / name).read_text() == "precious"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="/dev/full (a disk that is always full) is Linux's")
def test_a_full_disk_says_so_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    """The save's temporary file goes to /dev/full, where every write fails with ENOSPC, as on a full disk: the
    error says "No space left on device" (torch.save to a path said "unexpected pos 704 vs 598")."""
    path = tmp_path / "ckpt.pt"
    checkpoints.save_checkpoint(str(path), {"model": {"w": torch.ones(2)}, "step": 1})

    def full_disk(name, mode="r", *rest, **kwargs):
        return builtins.open("/dev/full" if str(name).endswith(runtime.PARTIAL) else name, mode, *rest, **kwargs)
    monkeypatch.setattr(checkpoints, "open", full_disk, raising=False)
    with pytest.raises(runtime.UserError, match=r"could not write .*ckpt.pt \(No space left on device\)") as error:
        checkpoints.save_checkpoint(str(path), {"model": {"w": torch.ones(1000)}, "step": 2})
    print(error.value)
    monkeypatch.undo()
    assert checkpoints.read_checked(str(path))["step"] == 1 and os.listdir(tmp_path) == ["ckpt.pt"]


def test_a_table_written_over_a_folder_is_a_one_line_error(tmp_path):
    (tmp_path / "table.csv").mkdir()  # e.g. experiments/analyze_attention.py --csv DIR
    with pytest.raises(runtime.UserError, match="could not write .*table.csv"):
        runtime.write_csv(str(tmp_path / "table.csv"), [{"a": 1}])
    assert os.listdir(tmp_path) == ["table.csv"]  # no temporary file left beside it


def live_tensor_bytes() -> int:
    """Bytes of every CPU tensor storage alive in this process (each storage once, views included); a compiled
    model's fake tensors, left by another test in this worker, hold no storage and are passed over."""
    storages = {}
    with warnings.catch_warnings():  # looking at every object touches torch's deprecated aliases
        warnings.simplefilter("ignore", FutureWarning)
        for obj in gc.get_objects():
            if type(obj) in (torch.Tensor, torch.nn.Parameter) and obj.device.type == "cpu":
                storages[obj.untyped_storage().data_ptr()] = obj.untyped_storage().nbytes()
    return sum(storages.values())


def test_generation_holds_the_same_memory_whatever_the_number_of_tokens_asked_for():
    """The RNN's promise, for generate.py's loop: 20 steps into a request for 10**8 tokens, the tensors alive take
    what they take 20 steps into a request for 30 (one sample streams its tokens; nothing is kept per token)."""
    torch.manual_seed(0)
    model = fold(TransformerLM(Config(vocab_size=50, n_layer=1, n_head=1, d_model=8, d_ff=8, attn="t2r",
                                      feature_size=4, dropout=0.0)).eval())

    def held_at_step_20(num_tokens):
        tokens = generate.generate(model, model.init_state(1), torch.tensor([[1]]), num_tokens,
                                   lambda logits: logits.argmax(-1))
        for step, _ in enumerate(tokens, 1):
            if step == 20:
                return live_tensor_bytes()
    small, large = held_at_step_20(30), held_at_step_20(10**8)
    print(f"tensors alive at step 20 of 30 tokens: {small:,} B; of 10**8 tokens: {large:,} B")
    assert large == small


def test_tokens_per_second_leaves_out_evaluation(run_here, corpus, tmp_path, monkeypatch):
    """On a clock where a step takes 1 s and an evaluation 100 s, every logged rate is one step's 4 x 32 tokens a
    second, also in the intervals an evaluation falls into (--eval_interval 3, --log_interval 2)."""
    clock = [0.0]

    def after(function, seconds):
        def timed(*args, **kwargs):
            clock[0] += seconds
            return function(*args, **kwargs)
        return timed
    monkeypatch.setattr(training, "time", SimpleNamespace(time=lambda: clock[0]))
    monkeypatch.setattr(training, "optimizer_step", after(training.optimizer_step, 1.0))
    monkeypatch.setattr(training, "validate", after(training.validate, 100.0))
    result = run_here("train_lm.py", "--dataset", corpus, "--max_steps", "8", "--out_dir", tmp_path / "run", *TINY,
                      "--eval_interval", "3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rates = [line.split(" tok/s")[0].rsplit("| ", 1)[1] for line in result.stdout.splitlines() if "tok/s" in line]
    print("logged tok/s:", rates)
    assert rates == ["128"] * 4


@pytest.mark.parametrize("flag, value", [("dataset", ["ptb"]), ("cache_dir", 3), ("vocab_size", "big")])
def test_a_checkpoint_whose_saved_data_flags_are_damaged_is_refused(run_here, trained, tmp_path, flag, value):
    """A saved args.dataset that is not a string was a traceback in generate.py (a run of earlier code, whose
    checkpoint has no tokenizer of its own: generate.py finds it with those flags)."""
    tmp, _ = trained
    checkpoint = torch.load(tmp / "out/tiny-t2r-random/model.pt", weights_only=True)
    checkpoint["args"][flag] = value  # hand-made: no checksum of everything
    del checkpoint["checksum_all"], checkpoint["tokenizer"]
    torch.save(checkpoint, tmp_path / "model.pt")
    assert_one_line_error(run_here("generate.py", "--ckpt", "model.pt", cwd=tmp_path), f"saved --{flag} is {value!r}")


@pytest.mark.parametrize("change", [{"eos_id": "1"}, {"vocab_size": 3}, {"tokenizer_json": "{"}])
def test_a_checkpoint_whose_tokenizer_is_damaged_is_refused(run_here, trained, tmp_path, change):
    tmp, _ = trained
    checkpoint = torch.load(tmp / "out/tiny-t2r-random/model.pt", weights_only=True)
    checkpoint["tokenizer"].update(change)  # hand-made: no checksum of everything
    del checkpoint["checksum_all"]
    torch.save(checkpoint, tmp_path / "model.pt")
    assert_one_line_error(run_here("generate.py", "--ckpt", "model.pt", cwd=tmp_path), "tokenizer is damaged")


def test_the_address_space_limit_counts_as_memory(monkeypatch):
    """Under `ulimit -v` an allocation fails past the limit however much memory is free: a batch whose estimate
    fitted MemAvailable but not the limit was a traceback; the estimate is now held against both."""
    import resource
    real = resource.getrlimit
    monkeypatch.setattr(resource, "getrlimit", lambda which: (8 * 2**30, resource.RLIM_INFINITY)
                        if which == resource.RLIMIT_AS else real(which))
    room = runtime.address_space_left()
    assert room is not None and runtime.free_memory(torch.device("cpu")) <= room < 8 * 2**30
    with pytest.raises(runtime.UserError, match="would take about 8.0 GiB"):
        runtime.check_fits(8 * 2**30, torch.device("cpu"), "a batch", "lower it")
