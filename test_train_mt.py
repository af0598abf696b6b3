"""Tests of translation: the corpus extractor and loaders (mt_data.py), decoding with recurrent states against
brute-force references (train_mt.py), and train_mt.py end to end on a tiny corpus, with its one-line errors.

    python -m pytest -q -s test_train_mt.py

CPU, tiny sizes, no downloads: the LibreOffice packages and Multi30k are faked.
"""

import gzip
import json
import os
import random
import subprocess
import sys

import pytest
import torch

import mt_data
import t2r
import train_mt
from conftest import ROOT, assert_one_line_error, report
from mt_data import BOS_ID, EOS_ID, PAD_ID
from t2r import Config, Seq2SeqTransformer

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

    corpus = mt_data.load_parallel("libreoffice", "en", "de", str(tmp_path / "data"), run=fake_run)
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
# Decoding on recurrent states against brute-force references

def tiny_model(kind, seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    config = Config(vocab_size=23, n_layer=2, n_encoder_layer=2, n_head=2, d_model=16, d_ff=32, dropout=0.0,
                    attn=kind, cross_attn=kind, feature_size=4, cross_feature_size=6, chunk_size=4, pad_id=PAD_ID)
    model = Seq2SeqTransformer(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.5 if name.endswith("weight") else 0.2))  # peaky, varied predictions
    return model.to(dtype).eval()


def sources(lengths=(6, 3, 1, 5), seed=1):
    g = torch.Generator().manual_seed(seed)
    return mt_data.pad([torch.randint(4, 23, (n,), generator=g).tolist() + [EOS_ID] for n in lengths])


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_recurrent_equals_greedy_recompute(kind):
    model, src = tiny_model(kind), sources()
    recurrent = train_mt.greedy_decode(model, src, 1.5, 4)
    recompute = train_mt.greedy_decode_recompute(model, src, 1.5, 4)
    print(kind, recurrent)
    assert recurrent == recompute and any(len(h) > 2 for h in recurrent)


def test_greedy_speed_counts_every_generated_token():
    """Table 2's tokens/s: the count is every hypothesis token plus its </s>, over batches of 16 in length order."""
    pairs = [("Click the button to open the dialog.", "Klicken Sie auf die Schaltfläche."),
             ("Change size", "Größe ändern"), ("Open the file", "Datei öffnen")] * 8
    tokenizer = mt_data.train_joint_bpe(pairs, 300)
    torch.manual_seed(0)
    config = Config(vocab_size=tokenizer.get_vocab_size(), n_layer=1, n_encoder_layer=1, n_head=2, d_model=16,
                    d_ff=32, dropout=0.0, attn="t2r", cross_attn="t2r", feature_size=4, cross_feature_size=6,
                    pad_id=PAD_ID)
    model = Seq2SeqTransformer(config).eval()
    sentences = [s for s, _ in pairs][:20] + [""]  # 20 sentences (one batch of 16, one of 4) and an empty line
    speed = train_mt.greedy_speed(model, tokenizer, sentences, torch.device("cpu"), batch_size=16)
    ids = sorted(mt_data.encode(tokenizer, sentences[:20]), key=len)
    expected = sum(len(h) + 1 for start in (0, 16)
                   for h in train_mt.greedy_decode(model, mt_data.pad(ids[start:start + 16])))
    print(speed)
    assert speed["tokens"] == expected and speed["sentences"] == 20 and speed["tokens_per_s"] > 0


@pytest.mark.parametrize("kind", KINDS)
def test_beam_scores_equal_parallel_rescoring(kind):
    """Every hypothesis beam search finishes carries log p(y </s> | x) equal to one teacher-forced pass over it:
    the recurrent states followed the right parents through every reordering."""
    model, src = tiny_model(kind), sources()
    best = train_mt.beam_search(model, src, beam_size=4, lenpen=0.6, max_len_a=1.5, max_len_b=4)
    hyps, scores = [h for h, _, _ in best], [s for _, s, _ in best]
    rescored = train_mt.sequence_log_probs(model, src, hyps)
    diff = max(abs(a - b) for a, b in zip(scores, rescored))
    print(kind, hyps)
    assert report(f"{kind}: beam score vs parallel rescoring", diff) < 1e-9
    for (h, s, normalized) in best:
        assert normalized == pytest.approx(s / (len(h) + 1) ** 0.6)


@pytest.mark.parametrize("kind", KINDS)
def test_beam_search_beats_or_ties_greedy_and_beam_one_is_greedy(kind):
    """Beam 1 is exactly greedy. Wider beams are not guaranteed to beat greedy in general; on these models
    they do, and a beam that lost the greedy hypothesis's score here would point at a pruning bug."""
    model, src = tiny_model(kind), sources()
    greedy = train_mt.greedy_decode(model, src, 1.5, 4)
    beam1 = train_mt.beam_search(model, src, beam_size=1, lenpen=0.0, max_len_a=1.5, max_len_b=4)
    assert [h for h, _, _ in beam1] == greedy
    beam = train_mt.beam_search(model, src, beam_size=5, lenpen=0.0, max_len_a=1.5, max_len_b=4)
    greedy_scores = train_mt.sequence_log_probs(model, src, greedy)
    assert all(b[1] >= g - 1e-12 for b, g in zip(beam, greedy_scores))


@pytest.mark.parametrize("kind", KINDS)
def test_padded_batch_translates_like_one_sentence_at_a_time(kind):
    model, src = tiny_model(kind), sources()
    batch = train_mt.beam_search(model, src, 3, 0.6, 1.5, 4)
    for row in range(src.shape[0]):
        n = int((src[row] != PAD_ID).sum())
        alone = train_mt.beam_search(model, src[row: row + 1, :n], 3, 0.6, 1.5, 4)[0]
        assert alone[0] == batch[row][0]
        assert abs(alone[1] - batch[row][1]) < 1e-9
    greedy = train_mt.greedy_decode(model, src, 1.5, 4)
    assert greedy == [train_mt.greedy_decode(model, src[r: r + 1, : int((src[r] != PAD_ID).sum())], 1.5, 4)[0]
                      for r in range(src.shape[0])]


@pytest.mark.parametrize("kind", KINDS)
def test_reordering_only_self_states_within_sentences_is_exact(kind):
    """Beam search moves only the causal states: the cross-attention state of every beam of a sentence is
    the same, and beams never leave their sentence. Compare with reordering the whole state."""
    model, src = tiny_model(kind), sources((4, 2))
    K = 3
    g = torch.Generator().manual_seed(5)
    state = t2r.reorder_state(model.init_state(src), torch.arange(2).repeat_interleave(K))
    prefix = torch.randint(4, 23, (2 * K, 3), generator=g)
    for t in range(3):
        model.step(prefix[:, t], state)
    index = torch.tensor([2, 2, 0, 4, 3, 3])  # within sentence 0 (rows 0-2) and sentence 1 (rows 3-5)
    whole = t2r.reorder_state(state, index)
    for layer in state["layers"]:
        layer["self"] = t2r.reorder_state(layer["self"], index)
    nxt = torch.randint(4, 23, (2 * K,), generator=g)
    a, b = model.step(nxt, state)[0], model.step(nxt, whole)[0]
    assert report(f"{kind}: self-only vs whole-state reorder", (a - b).abs().max()) == 0
    # and both equal decoding the reordered prefixes from scratch
    fresh = model.init_state(src[torch.arange(2).repeat_interleave(K)[index]])
    for tok in torch.cat([prefix[index], nxt[:, None]], 1).T:
        expected = model.step(tok, fresh)[0]
    assert report(f"{kind}: reordered vs from scratch", (a - expected).abs().max()) < 1e-9


def test_checkpoint_averaging_is_the_mean(tmp_path):
    models = [tiny_model("t2r", seed=s, dtype=torch.float32) for s in range(3)]
    for step, m in enumerate(models, 1):
        train_mt.save_snapshot(m, str(tmp_path), step * 10, keep=2)
    paths = train_mt.snapshot_paths(str(tmp_path))
    assert [os.path.basename(p) for p in paths] == ["snapshot_0000020.pt", "snapshot_0000030.pt"]
    averaged = train_mt.average_snapshots(paths)
    name = "layers.0.self_attn.feature_map.weight"
    expected = (models[1].state_dict()[name] + models[2].state_dict()[name]) / 2
    assert report("averaged vs mean", (averaged[name] - expected).abs().max()) < 1e-7


def test_bleu_detokenized_and_tokenized():
    refs = ["Klicken Sie auf das Text-Feld.", "Das ist gut."]
    perfect = train_mt.bleu_scores(refs, refs, "de")
    assert perfect["bleu"] == 100 and perfect["tok_bleu"] == 100
    tokenize = train_mt.moses_tokenizer("de")
    assert tokenize("das Text-Feld.") == "das Text ##AT##-##AT## Feld ."  # compound splitting
    worse = train_mt.bleu_scores(["Klicken Sie auf das Feld.", "Das ist schlecht."], refs, "de")
    assert 0 < worse["bleu"] < 100 and 0 < worse["tok_bleu"] < 100
    print(worse)


# -----------------------------------------------------------------------------
# train_mt.py end to end, as a user runs it

TINY = ["--n_layer", "2", "--n_encoder_layer", "2", "--n_head", "2", "--d_model", "32", "--d_ff", "64",
        "--vocab_size", "300", "--max_tokens", "256", "--max_len", "40", "--eval_interval", "5",
        "--snapshot_interval", "2", "--average_last", "3", "--log_interval", "5", "--beam", "3",
        "--decode_batch_size", "16", "--cross_feature_size", "8", "--chunk_size", "4"]


def write_parallel(folder, seed=0, n=(400, 30, 30)):
    """A toy translation task: each source word maps to a fixed target word, in reverse order."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(30)]
    os.makedirs(folder, exist_ok=True)
    for split, count in zip(mt_data.SPLITS, n):
        src_lines, tgt_lines = [], []
        for _ in range(count):
            sentence = [rng.choice(words) for _ in range(rng.randint(2, 8))]
            src_lines.append(" ".join(sentence))
            tgt_lines.append(" ".join("z" + w[1:] for w in reversed(sentence)))
        for lang, lines in (("en", src_lines), ("de", tgt_lines)):
            with open(os.path.join(folder, f"{split}.{lang}"), "w") as f:
                f.write("\n".join(lines) + "\n")
    return folder


def run(*args, cwd, check=True, stdin=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, os.path.join(ROOT, "train_mt.py"), *args], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=300, input=stdin)
    if check and result.returncode != 0:
        raise AssertionError(f"train_mt.py {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The main job on a toy corpus: train the softmax translator, convert, finetune, BLEU (under a minute)."""
    tmp = tmp_path_factory.mktemp("mt")
    corpus = write_parallel(str(tmp / "toy"))
    out = run("--init", "pretrained", "--dataset", corpus, "--max_steps", "10", *TINY, cwd=tmp)
    return tmp, corpus, out


def test_main_job_end_to_end(trained):
    tmp, corpus, out = trained
    print(out.stdout[-1200:])
    assert "training it first" in out.stdout and "converted" in out.stdout
    assert "| softmax (pretrained) | - | - |" in out.stdout and "| t2r+pretrain | 8 | 4 |" in out.stdout
    teacher = torch.load(tmp / "out/mt-toy-en-de-softmax-random/model.pt", weights_only=True)
    student = torch.load(tmp / "out/mt-toy-en-de-t2r-pretrained/model.pt", weights_only=True)
    ratio = train_mt.SCHEDULES["random"]["max_steps"] / train_mt.SCHEDULES["pretrained"]["max_steps"]
    assert teacher["step"] == round(10 * ratio) and student["step"] == 10  # the teacher gets more steps
    assert student["averaged_steps"] == [6, 8, 10]
    assert student["config"]["attn"] == ["t2r", "t2r"] and student["config"]["cross_attn"] == "t2r"
    results = json.loads((tmp / "out/mt-toy-en-de-t2r-pretrained/results.json").read_text())
    assert 0 <= results["test"]["bleu"] <= 100 and results["k_causal"] == 4 and results["k_cross"] == 8


def test_translate_stdin_keeps_empty_lines(trained):
    tmp, corpus, _ = trained
    out = run("--translate", "-", "--out_dir", "out/mt-toy-en-de-t2r-pretrained", "--beam", "1", cwd=tmp,
              stdin="w1 w2 w3\n\n   \nw4\n")
    lines = out.stdout.split("\n")
    print(lines)
    assert lines[-1] == "" and "device:" in out.stderr
    translations = lines[:-1]
    assert len(translations) == 4 and translations[1] == translations[2] == ""  # one line per input line


def test_eval_only_reproduces_the_bleu(trained):
    tmp, corpus, _ = trained
    out = run("--eval_only", "--out_dir", "out/mt-toy-en-de-t2r-pretrained", cwd=tmp)
    saved = json.loads((tmp / "out/mt-toy-en-de-t2r-pretrained/results.json").read_text())
    assert f"test: BLEU {saved['test']['bleu']:.2f}" in out.stdout


def test_resume_is_exact(tmp_path):
    corpus = write_parallel(str(tmp_path / "toy"), n=(200, 10, 10))
    common = ["--dataset", corpus, "--max_steps", "8", *TINY, "--bleu_sentences", "2", "--attn", "elu"]
    run(*common, "--out_dir", "straight", cwd=tmp_path)
    stopped = run(*common, "--out_dir", "resumed", "--stop_at", "3", cwd=tmp_path)
    assert "continue with --resume" in stopped.stdout
    run("--resume", "--out_dir", "resumed", cwd=tmp_path)
    a = torch.load(tmp_path / "straight/ckpt.pt", weights_only=True)
    b = torch.load(tmp_path / "resumed/ckpt.pt", weights_only=True)
    diff = max((a["model"][k] - b["model"][k]).abs().max() for k in a["model"])
    assert report("resumed vs straight weights", diff) == 0 and a["best_val"] == b["best_val"]


def test_one_line_errors(trained, tmp_path):
    tmp, corpus, _ = trained
    assert_one_line_error(run("--dataset", str(tmp_path / "nope"), cwd=tmp_path, check=False), "unknown dataset")
    assert_one_line_error(run("--no_such_flag", cwd=tmp_path, check=False), "unrecognized arguments")
    assert_one_line_error(run("--translate", "-", "--out_dir", str(tmp_path / "none"), cwd=tmp_path, check=False),
                          "no checkpoint")
    # a converted model is no teacher, a language model is no translator, a truncated file is corrupt
    student = str(tmp / "out/mt-toy-en-de-t2r-pretrained/model.pt")
    assert_one_line_error(run("--init", "pretrained", "--dataset", corpus, "--pretrained", student, *TINY,
                              "--out_dir", str(tmp_path / "a"), cwd=tmp, check=False), "already converted")
    lm = tmp_path / "lm.pt"
    torch.save({"model": {}, "config": {"vocab_size": 10}}, lm)
    assert_one_line_error(run("--init", "pretrained", "--dataset", corpus, "--pretrained", str(lm), *TINY,
                              "--out_dir", str(tmp_path / "b"), cwd=tmp, check=False), "not a translator")
    teacher = tmp / "out/mt-toy-en-de-softmax-random/model.pt"
    broken = tmp_path / "broken.pt"
    broken.write_bytes(teacher.read_bytes()[:1000])
    assert_one_line_error(run("--init", "pretrained", "--dataset", corpus, "--pretrained", str(broken), *TINY,
                              "--out_dir", str(tmp_path / "c"), cwd=tmp, check=False), "truncated or corrupt")
    assert_one_line_error(run("--init", "pretrained", "--dataset", corpus, "--pretrained", str(teacher), *TINY,
                              "--src", "de", "--tgt", "en", "--out_dir", str(tmp_path / "d"), cwd=tmp, check=False),
                          "translates en-de")
    assert_one_line_error(run("--init", "pretrained", "--dataset", corpus, "--pretrained", str(teacher), *TINY,
                              "--d_model", "64", "--out_dir", str(tmp_path / "e"), cwd=tmp, check=False),
                          "--d_model 64 differs")
    assert_one_line_error(run("--translate", str(tmp_path / "missing.txt"), "--out_dir",
                              "out/mt-toy-en-de-t2r-pretrained", cwd=tmp, check=False), "no such file")


def test_ddp_gloo_two_processes(tmp_path):
    """Two processes on CPU (gloo): each takes its own batches; rank 0 writes the checkpoints and the BLEU."""
    corpus = write_parallel(str(tmp_path / "toy"), n=(200, 10, 10))
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         os.path.join(ROOT, "train_mt.py"), "--dataset", corpus, "--attn", "t2r", "--max_steps", "4", *TINY],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    print(result.stdout[-800:])
    checkpoint = torch.load(tmp_path / "out/mt-toy-en-de-t2r-random/ckpt.pt", weights_only=True)
    assert checkpoint["step"] == 4 and len(checkpoint["rng"]) == 2
    assert (tmp_path / "out/mt-toy-en-de-t2r-random/results.json").is_file()


def test_batch_order_is_a_function_of_the_counter_and_covers_every_batch():
    batches = [[i] for i in range(7)]
    epoch = [train_mt.batch_at(batches, c, seed=3)[0] for c in range(7)]
    assert sorted(epoch) == list(range(7))  # one epoch visits every batch once
    assert [train_mt.batch_at(batches, c, seed=3)[0] for c in range(7, 14)] != epoch  # reshuffled per epoch
    assert train_mt.batch_at(batches, 9, seed=3) == train_mt.batch_at(batches, 9, seed=3)
