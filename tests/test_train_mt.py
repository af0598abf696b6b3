"""Tests of the translator's data (support/mt_data.py: the corpus extractor and loaders) and of train_mt.py end to end
on a tiny corpus: the main job, exact resume, DDP, snapshot averaging and the one-line errors.
Decoding is tested in test_translate.py.

    python -m pytest -q -s tests/test_train_mt.py

CPU, tiny sizes, no downloads: the LibreOffice packages and Multi30k are faked.
"""

import gzip
import json
import os
import shutil

import pytest
import sacrebleu
import torch

import train_mt as train_mt_module
from conftest import (MT_TINY, assert_one_line_error, report, run_in_process, run_two_processes, tiny_translator,
                      write_parallel)
from support import job, mt_data
from support.mt_data import BOS_ID, EOS_ID
from support.runtime import serializable

KINDS = ["softmax", "t2r", "elu", "rfa"]


# -----------------------------------------------------------------------------
# The LibreOffice help extractor, on a tiny HTML fixture

EN_PAGE = """<html><body><div id="DisplayArea">
<h1 id="hd_1" dir="auto">The Load/Save options</h1>
<p id="par_1" class="paragraph">Specifies general <span class="emph">Load/Save</span> settings.</p>
<p id="par_2">Choose <span hidden="true" class="MAC">LibreOffice - Preferences</span><span class="WIN">Tools - Options</span> to open it.</p>
<p id="par_3">OK</p>
<p id="par_4">Identical text stays out.</p>
<p id="par_5">Only in English here.</p>
<p id="par_6">Line<br>break &amp; entity here.</p>
</div></body></html>"""
DE_PAGE = """<html><body><div id="DisplayArea">
<h1 id="hd_1" dir="auto">Optionen Laden/Speichern</h1>
<p id="par_1" class="paragraph">Legt allgemeine <span class="emph">Lade-/Speicher</span>-Einstellungen fest.</p>
<p id="par_2">Wählen Sie <span hidden="true" class="MAC">LibreOffice - Einstellungen</span><span class="WIN">Extras - Optionen</span>, um es zu öffnen.</p>
<p id="par_3">OK-Knopf</p>
<p id="par_4">Identical text stays out.</p>
<p id="par_6">Zeilen<br>umbruch &amp; Entität hier.</p>
</div></body></html>"""


def write_help(root, pages):
    for lang, folder in (("en", "en-US"), ("de", "de")):
        for name, texts in pages.items():
            path = root / folder / "text" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(texts[lang], encoding="utf-8")


def test_extractor_aligns_paragraphs_by_id(tmp_path):
    write_help(tmp_path, {"shared/page.html": {"en": EN_PAGE, "de": DE_PAGE}})
    (tmp_path / "en-US" / "text" / "only_english.html").write_text(EN_PAGE)  # no German page: skipped
    pairs = mt_data.extract_help_pairs(tmp_path, "en", "de")
    for pair in pairs:
        print(pair)
    assert pairs == sorted([
        ("The Load/Save options", "Optionen Laden/Speichern"),
        ("Specifies general Load/Save settings.", "Legt allgemeine Lade-/Speicher-Einstellungen fest."),
        ("Choose Tools - Options to open it.", "Wählen Sie Extras - Optionen, um es zu öffnen."),  # hidden skipped
        ("Line break & entity here.", "Zeilen umbruch & Entität hier."),
    ])  # "OK" (fewer than 3 English words), identical pairs and English-only ids are dropped
    reverse = mt_data.extract_help_pairs(tmp_path, "de", "en")
    assert sorted((t, s) for s, t in reverse) == pairs  # de-en: the same pairs, sides swapped


def test_both_directions_hold_out_the_same_sentences(tmp_path):
    pages = {f"p{i}.html": {"en": EN_PAGE.replace("here", f"here {i}"), "de": DE_PAGE.replace("hier", f"hier {i}")}
             for i in range(40)}
    write_help(tmp_path / mt_data.LIBREOFFICE_HELP, pages)
    en_de = mt_data.libreoffice_corpus(tmp_path, "en", "de")
    de_en = mt_data.libreoffice_corpus(tmp_path, "de", "en")
    for split in mt_data.SPLITS:
        assert sorted((t, s) for s, t in de_en[split]) == sorted(en_de[split])


def test_split_is_deterministic_and_keeps_a_source_in_one_split():
    pairs = [(f"sentence number {i % 500}", f"Satz {i}") for i in range(5000)]
    a, b = mt_data.split_pairs(pairs, held_out=300), mt_data.split_pairs(list(reversed(pairs)), held_out=300)
    assert a == b and len(a["test"]) == len(a["valid"]) == 300 and len(a["train"]) == 4400
    sources = {split: {s for s, _ in a[split]} for split in a}
    assert not (sources["train"] & sources["test"]) and not (sources["valid"] & sources["test"])
    # whole groups share one hash, so a held-out set never splits the translations of one source
    print({split: len(s) for split, s in sources.items()})


def test_libreoffice_corpus_with_a_faked_apt_get(tmp_path):
    """apt-get download + dpkg -x, faked: the commands are right, the corpus is split and cached."""
    calls = []
    pages = {f"p{i}.html": {"en": EN_PAGE.replace("here", f"here {i}"), "de": DE_PAGE.replace("hier", f"hier {i}")}
             for i in range(40)}

    def fake_run(command, cwd):
        calls.append(command)
        if command[:2] == ["apt-get", "download"]:
            (cwd / f"{command[2]}_7.4_all.deb").write_bytes(b"deb")
        elif command[:2] == ["dpkg", "-x"]:
            write_help(tmp_path / "data" / mt_data.LIBREOFFICE_HELP, pages)

    at_hand = lambda: mt_data.corpus_at_hand("libreoffice", "en", "de", str(tmp_path / "data"))
    assert not at_hand()  # the study's results stage reads it only then: downloading is training's
    corpus = mt_data.load_parallel("libreoffice", "en", "de", str(tmp_path / "data"), run=fake_run)
    assert at_hand()
    assert [c for c in calls if c[0] == "apt-get"] == [["apt-get", "download", "libreoffice-help-en-us"],
                                                        ["apt-get", "download", "libreoffice-help-de"]]
    assert [os.path.basename(c[2]) for c in calls if c[0] == "dpkg"] == ["libreoffice-help-en-us_7.4_all.deb",
                                                                         "libreoffice-help-de_7.4_all.deb"]
    assert sum(len(v) for v in corpus.values()) == 3 + 40  # 3 shared pairs + one numbered pair per page
    assert (tmp_path / "data" / f"prepared-v{mt_data.PREPARED_FORMAT}-en-de.json").is_file()
    again = mt_data.load_parallel("libreoffice", "en", "de", str(tmp_path / "data"), run=None)  # from the cache
    assert again == corpus


def test_missing_apt_get_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no apt-get on PATH
    with pytest.raises(mt_data.DataError) as error:
        mt_data.load_parallel("libreoffice", "en", "de", str(tmp_path / "data"))
    print(error.value)
    assert "apt-get is not installed" in str(error.value) and "\n" not in str(error.value)


def test_multi30k_with_a_faked_fetch(tmp_path):
    def fake_fetch(url, dest):
        name = url.rsplit("/", 1)[1]
        lang = name.split(".")[1]
        with gzip.open(dest, "wt", encoding="utf-8") as f:
            f.write("\n".join(f"{lang} caption {i} of {name}" for i in range(5)) + "\n")

    corpus = mt_data.load_parallel("multi30k", "de", "en", str(tmp_path), fetch=fake_fetch)
    assert corpus["test"][0] == ("de caption 0 of test_2016_flickr.de.gz", "en caption 0 of test_2016_flickr.en.gz")
    assert [len(corpus[s]) for s in mt_data.SPLITS] == [5, 5, 5]

    def failing_fetch(url, dest):
        raise OSError("network unreachable")
    with pytest.raises(mt_data.DataError, match="by hand"):
        mt_data.load_parallel("multi30k", "en", "fr", str(tmp_path / "other"), fetch=failing_fetch)


def test_folder_corpus_checks_alignment(tmp_path):
    for split in mt_data.SPLITS:
        (tmp_path / f"{split}.en").write_text("a b\nc d\n")
        (tmp_path / f"{split}.de").write_text("x y\nz w\n")
    assert mt_data.load_parallel(str(tmp_path), "en", "de")["valid"] == [("a b", "x y"), ("c d", "z w")]
    (tmp_path / "test.de").write_text("only one line\n")
    with pytest.raises(mt_data.DataError, match="aligned line by line"):
        mt_data.load_parallel(str(tmp_path), "en", "de")


def test_a_corpus_line_is_cut_at_newlines_only_and_loses_its_byte_order_mark(tmp_path):
    """U+0085, U+2028 and a form feed inside a line are no line ends (str.splitlines would cut there and misalign
    the corpus); a Windows \\r\\n is one; a byte-order mark at the start is not part of the first word."""
    for split in mt_data.SPLITS:
        (tmp_path / f"{split}.en").write_bytes("\ufeffa\x85b\r\nc\u2028d\x0ce\n".encode())
        (tmp_path / f"{split}.de").write_bytes(b"x y\nz w\n")
    pairs = mt_data.load_parallel(str(tmp_path), "en", "de")["train"]
    assert pairs == [("a b", "x y"), ("c d e", "z w")]

def test_joint_bpe_round_trips_and_batches_respect_max_tokens():
    pairs = [("Click the button to open the dialog.", "Klicken Sie auf die Schaltfläche, um den Dialog zu öffnen."),
             ("Größe ändern", "Change size")] * 20
    tokenizer = mt_data.train_joint_bpe(pairs, 300)
    for text in ("Klicken Sie auf Öffnen.", "unseen wörds ✓"):
        ids = mt_data.encode(tokenizer, [text])[0]
        assert ids[-1] == EOS_ID and mt_data.decode(tokenizer, ids) == text  # byte level: exact detokenization
    examples = mt_data.encode_pairs(tokenizer, pairs)
    batches = mt_data.make_batches(examples, max_tokens=64)
    assert sorted(i for b in batches for i in b) == list(range(len(examples)))
    for b in batches:
        src, tgt_in, tgt_out = mt_data.collate(examples, b)
        assert src.numel() <= 64 and tgt_out.numel() <= 64
        assert (tgt_in[:, 0] == BOS_ID).all() and (tgt_in[:, 1:] == tgt_out[:, :-1]).all()


# -----------------------------------------------------------------------------
# Snapshot averaging

def test_checkpoint_averaging_is_the_mean(tmp_path):
    models = [tiny_translator("t2r", seed=s, dtype=torch.float32) for s in range(3)]
    for step, m in enumerate(models, 1):
        train_mt_module.save_snapshot(m, str(tmp_path), step * 10, keep=2)
    paths = train_mt_module.snapshot_paths(str(tmp_path))
    assert [os.path.basename(p) for p in paths] == ["snapshot_0000020.pt", "snapshot_0000030.pt"]
    averaged = train_mt_module.average_snapshots(paths)
    name = "layers.0.self_attn.feature_map.weight"
    expected = (models[1].state_dict()[name] + models[2].state_dict()[name]) / 2
    assert report("averaged vs mean", (averaged[name] - expected).abs().max()) < 1e-7



# -----------------------------------------------------------------------------
# train_mt.py end to end, as a user runs it

def train_mt(*args, cwd, check=True):
    """train_mt.py in this process (no torch import each); raises with its output if it fails and check is set."""
    result = run_in_process("train_mt.py", *args, cwd=cwd)
    assert not check or result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def test_the_conversion_job_end_to_end(trained_translator):
    tmp, corpus, out = trained_translator
    print(out.stdout[-1200:])
    assert "training it first" in out.stdout and "converted" in out.stdout
    assert "| softmax (pretrained) | - | - |" in out.stdout and "| t2r+pretrain | 8 | 4 |" in out.stdout
    teacher = torch.load(tmp / "out/mt-toy-en-de-softmax-random/model.pt", weights_only=True)
    student = torch.load(tmp / "out/mt-toy-en-de-t2r-pretrained/model.pt", weights_only=True)
    assert teacher["step"] == round(10 * 1100 / 450) and student["step"] == 10  # the paper's pretrain/finetune ratio
    assert student["averaged_steps"] == [6, 8, 10]
    assert student["config"]["attn"] == ["t2r", "t2r"] and student["config"]["cross_attn"] == "t2r"
    results = json.loads((tmp / "out/mt-toy-en-de-t2r-pretrained/results.json").read_text())
    assert results["k_causal"] == 4 and results["k_cross"] == 8
    assert f"| t2r+pretrain | 8 | 4 | {results['valid']['bleu']:.2f} | {results['test']['bleu']:.2f} |" in out.stdout


def test_the_translations_scored_are_saved_a_line_each(trained_translator):
    tmp, corpus, _ = trained_translator
    run_dir = tmp / "out/mt-toy-en-de-t2r-pretrained"
    results = json.loads((run_dir / "results.json").read_text())
    references = (open(os.path.join(corpus, "test.de"), encoding="utf-8").read().splitlines())
    hyps = (run_dir / "test.hyp").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(hyps) == results["test"]["sentences"] == len(references)
    assert round(sacrebleu.corpus_bleu(hyps, [references]).score, 2) == results["test"]["bleu"]  # SacreBLEU itself


def test_eval_only_reproduces_the_bleu(trained_translator, tmp_path):
    tmp, _, _ = trained_translator
    shutil.copytree(tmp / "out/mt-toy-en-de-t2r-pretrained", tmp_path / "r")  # the shared run stays as it is
    out = train_mt("--eval_only", "--out_dir", str(tmp_path / "r"), cwd=tmp)
    saved = json.loads((tmp / "out/mt-toy-en-de-t2r-pretrained/results.json").read_text())
    assert f"test: BLEU {saved['test']['bleu']:.2f}" in out.stdout


def test_eval_only_keeps_the_learning_curve(trained_translator, tmp_path):
    tmp, _, _ = trained_translator
    shutil.copytree(tmp / "out/mt-toy-en-de-t2r-pretrained", tmp_path / "r")
    before = json.loads((tmp_path / "r/results.json").read_text())
    train_mt("--eval_only", "--out_dir", "r", cwd=tmp_path)
    after = json.loads((tmp_path / "r/results.json").read_text())
    print("curve:", after.get("curve"))
    assert after["curve"] == before["curve"] and len(after["curve"]) >= 2
    assert after["test"]["bleu"] == before["test"]["bleu"]


def test_softmax_control_continues_the_teacher(trained_translator, tmp_path):
    """--init pretrained --attn softmax: the teacher trained on for the finetuning budget, no swap."""
    tmp, corpus, _ = trained_translator
    teacher = tmp / "out/mt-toy-en-de-softmax-random/model.pt"
    out = train_mt("--init", "pretrained", "--attn", "softmax", "--dataset", corpus, "--pretrained", str(teacher),
                   "--max_steps", "2", *MT_TINY, "--bleu_sentences", "2", "--out_dir", str(tmp_path / "c"), cwd=tmp)
    assert "unchanged (softmax)" in out.stdout
    control = torch.load(tmp_path / "c/model.pt", weights_only=True)
    assert control["config"]["attn"] == "softmax" and control["config"]["cross_attn"] == "softmax"


def test_resume_is_exact_and_keeps_the_decoding_flags(tmp_path, run_here):
    corpus = write_parallel(str(tmp_path / "toy"), n=(200, 10, 10))
    common = ["--dataset", corpus, "--max_steps", "8", *MT_TINY, "--bleu_sentences", "2", "--attn", "elu", "--beam", "2"]
    in_process = lambda *argv: run_here("train_mt.py", *argv, cwd=tmp_path)  # no subprocess: no torch import each
    assert in_process(*common, "--out_dir", "straight").returncode == 0
    stopped = in_process(*common, "--out_dir", "resumed", "--stop_at", "3")
    assert "continue with --resume" in stopped.stdout
    assert in_process("--resume", "--out_dir", "resumed").returncode == 0
    a = torch.load(tmp_path / "straight/ckpt.pt", weights_only=True)
    b = torch.load(tmp_path / "resumed/ckpt.pt", weights_only=True)
    diff = max((a["model"][k] - b["model"][k]).abs().max() for k in a["model"])
    assert report("resumed vs straight weights", diff) == 0 and a["best_val"] == b["best_val"]
    results = json.loads((tmp_path / "resumed/results.json").read_text())
    assert results["beam"] == 2 and results["test"]["sentences"] == 2  # the run's decoding flags, not defaults


def test_a_finished_run_trained_on_equals_the_longer_run(tmp_path, run_here):
    """The inverse square-root schedule ignores --max_steps: --resume --max_steps 8 of a 5-step run is the 8-step run
    (its average leaves out the 5-step run's last snapshot, off the grid of 2), and the 5-step run's model.pt and
    results.json are kept aside."""
    corpus = write_parallel(str(tmp_path / "toy"), n=(200, 10, 10))
    common = ["--dataset", corpus, *MT_TINY, "--bleu_sentences", "2", "--warmup_steps", "2"]
    for argv in ([*common, "--max_steps", "8", "--out_dir", "straight"], [*common, "--max_steps", "5", "--out_dir",
                 "longer"], ["--resume", "--out_dir", "longer", "--max_steps", "8"]):
        assert run_here("train_mt.py", *argv, cwd=tmp_path).returncode == 0  # in process: no torch import each
    a = torch.load(tmp_path / "straight/model.pt", weights_only=True)
    b = torch.load(tmp_path / "longer/model.pt", weights_only=True)
    diff = max((a["model"][k] - b["model"][k]).abs().max() for k in a["model"])
    assert report("trained on vs straight model.pt", diff) == 0 and b["averaged_steps"] == [4, 6, 8]
    assert torch.load(tmp_path / "longer/model_step5.pt", weights_only=True)["step"] == 5
    assert json.loads((tmp_path / "longer/results_step5.json").read_text())["curve"][-1][0] == 5


def test_a_resumed_preset_run_keeps_the_flags_it_was_given(tmp_path):
    """--preset fills the flags not given when a run starts; resumed, the run's own values stand."""
    args = train_mt_module.get_args(["--preset", "wmt14", "--init", "pretrained", "--max_steps", "25000",
                                     "--out_dir", str(tmp_path)])
    (tmp_path / "args.json").write_text(json.dumps(serializable(vars(args))))
    resumed = train_mt_module.get_args(["--resume", "--out_dir", str(tmp_path)])
    assert (resumed.max_steps, resumed.lr) == (25000, 2e-4)


def test_a_shorter_run_on_resume_is_refused(run_here, tmp_path):
    corpus = write_parallel(str(tmp_path / "toy"), n=(200, 10, 10))
    train_mt("--dataset", corpus, *MT_TINY, "--bleu_sentences", "2", "--max_steps", "4", "--stop_at", "2",
             "--out_dir", "r", cwd=tmp_path)
    result = run_here("train_mt.py", "--resume", "--out_dir", "r", "--max_steps", "3", cwd=tmp_path)
    assert_one_line_error(result, "trained with --max_steps 4, the flags say 3")


def test_a_truncated_snapshot_is_a_one_line_error(run_here, trained_translator, tmp_path):
    """A finished run resumed rewrites model.pt from its snapshots: a damaged one is named, not a traceback."""
    tmp, _, _ = trained_translator
    shutil.copytree(tmp / "out/mt-toy-en-de-t2r-pretrained", tmp_path / "r")
    snapshot = sorted((tmp_path / "r").glob("snapshot_*.pt"))[-1]
    snapshot.write_bytes(snapshot.read_bytes()[:100])
    result = run_here("train_mt.py", "--resume", "--out_dir", "r", cwd=tmp_path)
    assert_one_line_error(result, f"snapshot r/{snapshot.name} is unreadable")


def test_a_latin1_corpus_is_a_one_line_error(tmp_path):
    corpus = write_parallel(str(tmp_path / "toy"), n=(200, 10, 10))
    with open(os.path.join(corpus, "train.en"), "ab") as f:
        f.write(b"caf\xe9\n")
    with open(os.path.join(corpus, "train.de"), "a") as f:
        f.write("Kaffee\n")
    assert_one_line_error(train_mt("--dataset", corpus, cwd=tmp_path, check=False), "train.en is not UTF-8")


def teacher_flags(tmp, corpus, out_dir, pretrained="out/mt-toy-en-de-softmax-random/model.pt"):
    return ["--init", "pretrained", "--dataset", corpus, "--pretrained", str(tmp / pretrained), *MT_TINY,
            "--out_dir", str(out_dir)]


@pytest.mark.parametrize("extra, message", [
    (["--src", "de", "--tgt", "en"], "translates en-de"),
    (["--d_model", "64"], "--d_model 64 differs"),
    (["--post_norm"], "is a pre-norm translator"),
    (["--vocab_size", "400"], "tokenizer was trained with --vocab_size 300 and the student keeps it"),
])
def test_a_teacher_of_another_shape_is_refused(run_here, trained_translator, tmp_path, extra, message):
    tmp, corpus, _ = trained_translator
    result = run_here("train_mt.py", *teacher_flags(tmp, corpus, tmp_path / "x"), *extra, cwd=tmp)
    assert_one_line_error(result, message)


def test_a_converted_model_is_no_teacher(run_here, trained_translator, tmp_path):
    tmp, corpus, _ = trained_translator
    flags = teacher_flags(tmp, corpus, tmp_path / "x", pretrained="out/mt-toy-en-de-t2r-pretrained/model.pt")
    assert_one_line_error(run_here("train_mt.py", *flags, cwd=tmp), "already converted")


def test_a_language_model_is_no_teacher(run_here, trained_translator, tmp_path):
    tmp, corpus, _ = trained_translator
    torch.save({"model": {}, "config": {"vocab_size": 10}}, tmp_path / "lm.pt")
    flags = teacher_flags(tmp, corpus, tmp_path / "x", pretrained=tmp_path / "lm.pt")
    result = run_here("train_mt.py", *flags, cwd=tmp)
    assert_one_line_error(result, "not a translator")


def test_a_truncated_teacher_is_corrupt(run_here, trained_translator, tmp_path):
    tmp, corpus, _ = trained_translator
    teacher = tmp / "out/mt-toy-en-de-softmax-random/model.pt"
    (tmp_path / "broken.pt").write_bytes(teacher.read_bytes()[:1000])
    flags = teacher_flags(tmp, corpus, tmp_path / "x", pretrained=tmp_path / "broken.pt")
    assert_one_line_error(run_here("train_mt.py", *flags, cwd=tmp), "truncated or corrupt")


def test_the_paper_preset_finetunes_with_the_teachers_batch_warmup_and_averaging():
    """Appendix Tables 5 and 6: finetuning keeps the teacher's model, batch, warmup and averaging; only the rate and
    the number of updates drop. A teacher trained first by --init pretrained gets the teacher's preset flags back."""
    teacher, student = (train_mt_module.get_args(["--preset", "wmt14", "--init", init]) for init in ("random",
                                                                                                   "pretrained"))
    changed = {k for k, v in vars(teacher).items() if vars(student)[k] != v}
    assert changed == {"init", "attn", "out_dir", "lr", "max_steps"}
    assert student.lr < teacher.lr and student.max_steps < teacher.max_steps
    trained_first = job.teacher_run_args(student, train_mt_module.SCHEDULES,
                                     train_mt_module.MTTask.teacher_overrides(student))
    names = ("lr", "max_steps", "warmup_steps", "grad_accum", "max_tokens", "average_last", "post_norm")
    assert [getattr(trained_first, n) for n in names] == [getattr(teacher, n) for n in names]
    assert train_mt_module.model_config(student, 100).pre_norm is False  # the paper's translator is post-norm


@pytest.mark.parametrize("flags, message", [
    ("--dataset nope", "unknown dataset"),
    ("--eval_only --out_dir none", "no checkpoint"),
])
def test_bad_runs_are_one_line_errors(run_here, tmp_path, flags, message):
    assert_one_line_error(run_here("train_mt.py", *flags.split(), cwd=tmp_path), message)


def test_ddp_gloo_two_processes_train_as_one_process_accumulating_their_batches(tmp_path):
    """Two processes on CPU (gloo) take the batches of counters 2s and 2s + 1 at step s and average their gradients:
    one process with --grad_accum 2 takes the same two batches and averages the same way. Without dropout the
    weights agree up to the order of float32 sums; rank 0 alone writes the checkpoints and the BLEU."""
    corpus = write_parallel(str(tmp_path / "toy"), n=(200, 10, 10))
    flags = ["--dataset", corpus, "--attn", "t2r", "--max_steps", "4", *MT_TINY, "--dropout", "0"]
    run_two_processes("train_mt.py", *flags, "--out_dir", "ddp", cwd=tmp_path)
    train_mt(*flags, "--grad_accum", "2", "--out_dir", "one", cwd=tmp_path)
    ddp, one = (torch.load(tmp_path / f"{name}/ckpt.pt", weights_only=True) for name in ("ddp", "one"))
    assert ddp["step"] == one["step"] == 4 and len(ddp["rng"]) == 2
    diff = max((ddp["model"][k] - one["model"][k]).abs().max().item() for k in one["model"])
    assert report("two processes vs one accumulating, weights after 4 steps", diff) < 1e-5
    assert (tmp_path / "ddp/results.json").is_file()


def test_batch_order_is_a_function_of_the_counter_and_covers_every_batch():
    batches = [[i] for i in range(7)]
    epoch = [train_mt_module.batch_at(batches, c, seed=3)[0] for c in range(7)]
    assert sorted(epoch) == list(range(7))  # one epoch visits every batch once
    assert [train_mt_module.batch_at(batches, c, seed=3)[0] for c in range(7, 14)] != epoch  # reshuffled per epoch
    assert train_mt_module.batch_at(batches, 9, seed=3) == train_mt_module.batch_at(batches, 9, seed=3)


def test_a_new_run_refuses_another_runs_snapshots(run_here, trained_translator, tmp_path):
    """A run killed after its first snapshots, before its first ckpt.pt: a new run in that out_dir would average them
    into its model.pt. It is refused, and the snapshot is left as it was."""
    tmp, corpus, _ = trained_translator
    (tmp_path / "r").mkdir()
    left = tmp_path / "r/snapshot_0000030.pt"
    shutil.copy(sorted((tmp / "out/mt-toy-en-de-t2r-pretrained").glob("snapshot_*.pt"))[-1], left)
    result = run_here("train_mt.py", "--dataset", corpus, *MT_TINY, "--max_steps", "2", "--out_dir", "r", cwd=tmp_path)
    assert_one_line_error(result, "r holds snapshot_0000030.pt of an earlier run", "delete them")
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == [".lock", "snapshot_0000030.pt"]


def test_a_finished_run_without_its_snapshots_is_a_one_line_error(run_here, trained_translator, tmp_path):
    tmp, _, _ = trained_translator
    shutil.copytree(tmp / "out/mt-toy-en-de-t2r-pretrained", tmp_path / "r")
    for path in [*(tmp_path / "r").glob("snapshot_*.pt"), tmp_path / "r/model.pt"]:
        path.unlink()
    result = run_here("train_mt.py", "--resume", "--out_dir", "r", cwd=tmp_path)
    assert_one_line_error(result, "r has no snapshot_*.pt left to average into model.pt")


def test_a_redirected_log_gets_no_progress_bar_lines(trained_translator, tmp_path):
    """Like the trainers' bars, the BLEU pass's is drawn on a terminal only: stderr here is a file."""
    tmp, _, _ = trained_translator
    shutil.copytree(tmp / "out/mt-toy-en-de-t2r-pretrained", tmp_path / "r")
    out = train_mt("--eval_only", "--out_dir", str(tmp_path / "r"), cwd=tmp)
    assert "test: BLEU" in out.stdout and "translate:" not in out.stderr, out.stderr


def test_a_bleu_pass_too_wide_to_fit_is_refused_before_training(run_here, trained_translator, tmp_path):
    tmp, corpus, _ = trained_translator
    result = run_here("train_mt.py", "--dataset", corpus, *MT_TINY, "--max_steps", "2", "--beam", "100000000",
                      "--out_dir", "r", cwd=tmp_path)
    assert_one_line_error(result, "with --beam 100000000 would take about")
    assert not (tmp_path / "r/ckpt.pt").exists()


def test_memory_estimates_count_the_batches_the_corpus_can_make(run_here, trained_translator, tmp_path):
    """--decode_batch_size 1000000000 with 8 scored sentences, and --max_tokens 100000000 on a toy corpus: the
    batches can hold no more than the data, and the run goes (both were refused as hundreds of GiB)."""
    tmp, corpus, _ = trained_translator
    flags = [f for f in MT_TINY if f not in ("--max_tokens", "256", "--decode_batch_size", "16")]
    result = run_here("train_mt.py", "--dataset", corpus, *flags, "--max_tokens", "100000000", "--decode_batch_size",
                      "1000000000", "--bleu_sentences", "8", "--max_steps", "1", "--eval_interval", "1",
                      "--snapshot_interval", "1", "--average_last", "1", "--out_dir", str(tmp_path / "big"), cwd=tmp)
    assert result.returncode == 0, result.stderr[-2000:]
