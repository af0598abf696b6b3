"""Tests of translate.py: greedy and beam search on recurrent states against brute-force references
(recomputing the prefix, rescoring in parallel, one sentence at a time), BLEU, and the command line.

    python -m pytest -q -s tests/test_translate.py
"""

import os
import subprocess
import sys

import pytest
import torch

import translate
from conftest import (ROOT, SCRIPT_ENV, assert_one_line_error, report, run, step_all, tiny_translator,
                      translations_in_process, translator_batch)
from support import mt_data
from support.mt_data import EOS_ID, PAD_ID
from t2r import fold

KINDS = ["softmax", "t2r", "elu", "rfa"]


# -----------------------------------------------------------------------------
# Decoding on recurrent states against brute-force references

def sources(lengths=(6, 3, 1, 5), seed=1):
    g = torch.Generator().manual_seed(seed)
    return mt_data.pad([torch.randint(4, 23, (n,), generator=g).tolist() + [EOS_ID] for n in lengths])


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_recurrent_equals_greedy_recompute(kind):
    model, src = tiny_translator(kind), sources()
    recurrent = translate.greedy_decode(model, src, 1.5, 4)
    recompute = translate.greedy_decode_recompute(model, src, 1.5, 4)
    print(kind, recurrent)
    assert recurrent == recompute and any(len(h) > 2 for h in recurrent)


PREFIX = [7, 9, 12]  # token ids a translation is forced to start with


@pytest.mark.parametrize("kind", ["softmax", "t2r", "t2r window 2"])
@pytest.mark.parametrize("beam", [1, 3])
def test_a_forced_prefix_read_in_one_pass_decodes_as_read_by_steps(kind, beam):
    """--prefix: the decoder reads <s> and the prefix with its prefill (parallel) or a step a token; the translations
    are the same, each starts with the prefix, and greedy's first token after it is the parallel form's argmax."""
    model = fold(tiny_translator(kind.split()[0], window=2 if "window" in kind else 0))
    src = sources()
    decode = lambda prefill: (translate.greedy_decode(model, src, 1.5, 4, PREFIX, prefill) if beam == 1 else
                              [h[0] for h in translate.beam_search(model, src, beam, 0.6, 1.5, 4, PREFIX, prefill)])
    parallel, by_steps = decode(model.prefill), decode(None)
    print(kind, beam, parallel)
    assert parallel == by_steps and all(h[:3] == PREFIX for h in parallel)
    if beam == 1:
        with torch.no_grad():
            start = torch.tensor([[mt_data.BOS_ID, *PREFIX]] * src.shape[0])
            expected = translate.never_emit(model(src, start)[:, -1]).argmax(-1).tolist()
        assert [h[3] if len(h) > 3 else EOS_ID for h in parallel] == expected


@pytest.mark.parametrize("kind, window", [(kind, 0) for kind in KINDS] + [("t2r", 2)],
                         ids=KINDS + ["t2r window 2"])
def test_beam_scores_equal_parallel_rescoring(kind, window):
    """Every hypothesis beam search finishes carries log p(y </s> | x) equal to one teacher-forced pass over it:
    the recurrent states (a window layer's ring buffer too) followed the right parents through every reordering."""
    model, src = tiny_translator(kind, window=window), sources()
    best = translate.beam_search(model, src, beam_size=4, lenpen=0.6, max_len_a=1.5, max_len_b=4)
    hyps, scores = [h for h, _, _ in best], [s for _, s, _ in best]
    rescored = translate.sequence_log_probs(model, src, hyps)
    diff = max(abs(a - b) for a, b in zip(scores, rescored))
    print(kind, hyps)
    assert report(f"{kind}: beam score vs parallel rescoring", diff) < 1e-9
    for (h, s, normalized) in best:
        assert normalized == pytest.approx(s / (len(h) + 1) ** 0.6)


@pytest.mark.parametrize("kind", KINDS)
def test_beam_search_beats_or_ties_greedy_and_beam_one_is_greedy(kind):
    """Beam 1 is exactly greedy. Wider beams are not guaranteed to beat greedy in general; on these models
    they do, and a beam that lost the greedy hypothesis's score here would point at a pruning bug."""
    model, src = tiny_translator(kind), sources()
    greedy = translate.greedy_decode(model, src, 1.5, 4)
    beam1 = translate.beam_search(model, src, beam_size=1, lenpen=0.0, max_len_a=1.5, max_len_b=4)
    assert [h for h, _, _ in beam1] == greedy
    beam = translate.beam_search(model, src, beam_size=5, lenpen=0.0, max_len_a=1.5, max_len_b=4)
    greedy_scores = translate.sequence_log_probs(model, src, greedy)
    assert all(b[1] >= g - 1e-12 for b, g in zip(beam, greedy_scores))


@pytest.mark.parametrize("kind", KINDS)
def test_padded_batch_translates_like_one_sentence_at_a_time(kind):
    model, src = tiny_translator(kind), sources()
    batch = translate.beam_search(model, src, 3, 0.6, 1.5, 4)
    for row in range(src.shape[0]):
        n = int((src[row] != PAD_ID).sum())
        alone = translate.beam_search(model, src[row: row + 1, :n], 3, 0.6, 1.5, 4)[0]
        assert alone[0] == batch[row][0]
        assert abs(alone[1] - batch[row][1]) < 1e-9
    greedy = translate.greedy_decode(model, src, 1.5, 4)
    assert greedy == [translate.greedy_decode(model, src[r: r + 1, : int((src[r] != PAD_ID).sum())], 1.5, 4)[0]
                      for r in range(src.shape[0])]


@pytest.mark.parametrize("kind", KINDS)
def test_reordering_only_self_states_within_sentences_is_exact(kind):
    """Beam search moves only the causal states: the cross-attention state of every beam of a sentence is
    the same, and beams never leave their sentence. Compare with reordering the whole state."""
    model, src = tiny_translator(kind), sources((4, 2))
    K = 3
    g = torch.Generator().manual_seed(5)
    state = translate.reorder_state(model.init_state(src), torch.arange(2).repeat_interleave(K))
    prefix = torch.randint(4, 23, (2 * K, 3), generator=g)
    for t in range(3):
        model.step(prefix[:, t], state)
    index = torch.tensor([2, 2, 0, 4, 3, 3])  # within sentence 0 (rows 0-2) and sentence 1 (rows 3-5)
    whole = translate.reorder_state(state, index)
    for layer in state["layers"]:
        layer["self"] = translate.reorder_state(layer["self"], index)
    nxt = torch.randint(4, 23, (2 * K,), generator=g)
    a, b = model.step(nxt, state)[0], model.step(nxt, whole)[0]
    assert report(f"{kind}: self-only vs whole-state reorder", (a - b).abs().max()) == 0
    # and both equal decoding the reordered prefixes from scratch
    fresh = model.init_state(src[torch.arange(2).repeat_interleave(K)[index]])
    for tok in torch.cat([prefix[index], nxt[:, None]], 1).T:
        expected = model.step(tok, fresh)[0]
    assert report(f"{kind}: reordered vs from scratch", (a - expected).abs().max()) < 1e-9


def test_bleu_detokenized_and_tokenized():
    refs = ["Klicken Sie auf das Text-Feld.", "Das ist gut."]
    perfect = translate.bleu_scores(refs, refs, "de")
    assert perfect["bleu"] == 100 and perfect["tok_bleu"] == 100
    tokenize = translate.moses_tokenizer("de")
    assert tokenize("das Text-Feld.") == "das Text ##AT##-##AT## Feld ."  # compound splitting
    worse = translate.bleu_scores(["Klicken Sie auf das Feld.", "Das ist schlecht."], refs, "de")
    assert 0 < worse["bleu"] < 100 and 0 < worse["tok_bleu"] < 100
    print(worse)


# -----------------------------------------------------------------------------
# The command line, on the translator the main job trained

STUDENT = "out/mt-toy-en-de-t2r-pretrained/model.pt"


def test_translate_stdin_keeps_empty_lines(trained_translator, run_here):
    tmp, _, _ = trained_translator
    out = run_here("translate.py", "--ckpt", STUDENT, "--beam", "1", cwd=tmp, stdin="w1 w2 w3\n\n   \nw4\n")
    lines = out.stdout.split("\n")
    print(lines)
    assert lines[-1] == "" and "device:" in out.stderr
    expected = translations_in_process(tmp / STUDENT, ["w1 w2 w3", "w4"], "--beam", "1")
    assert lines[:-1] == [expected[0], "", "", expected[1]]  # one line per input line


def test_translate_file_equals_stdin(trained_translator, tmp_path, run_here):
    tmp, _, _ = trained_translator
    (tmp_path / "in.en").write_text("w1 w2 w3\nw5 w6\n")
    from_file = run_here("translate.py", str(tmp_path / "in.en"), "--ckpt", STUDENT, cwd=tmp)
    from_stdin = run_here("translate.py", "-", "--ckpt", STUDENT, cwd=tmp, stdin="w1 w2 w3\nw5 w6\n")
    assert from_file.stdout == from_stdin.stdout and len(from_file.stdout.splitlines()) == 2


@pytest.mark.parametrize("argv, message", [
    (["--ckpt", "none/model.pt"], "no finished translator"),
    (["missing.txt", "--ckpt", STUDENT], "no such file"),
    (["--ckpt", STUDENT, "--beam", "0"], "--beam: 0 is not a positive integer"),
    (["--ckpt", STUDENT, "--lenpen", "nan"], "--lenpen: nan is not a finite number"),
    (["--ckpt", STUDENT, "--max_len_a", "1e300"], "--max_len_a: 1e300 is not a number from 0 to 10000"),  # both
    (["--ckpt", STUDENT, "--max_len_a", "1e300", "--beam", "2"], "--max_len_a: 1e300 is not a number from 0 to"),
    (["--ckpt", STUDENT, "--max_len_b", str(10**20)], f"--max_len_b: {10**20} is not an integer from 1 to 1000000"),
])
def test_translate_errors_are_one_line(run_here, trained_translator, argv, message):
    tmp, _, _ = trained_translator
    assert_one_line_error(run_here("translate.py", *argv, cwd=tmp, stdin=""), message)


def test_a_folder_with_only_model_pt_translates(trained_translator, tmp_path):
    tmp, _, _ = trained_translator
    (tmp_path / "model.pt").write_bytes((tmp / STUDENT).read_bytes())  # the documented artifact, alone
    out = run("translate.py", "--ckpt", str(tmp_path / "model.pt"), cwd=tmp_path, stdin="w1 w2\n")
    assert out.stdout.splitlines() == translations_in_process(tmp_path / "model.pt", ["w1 w2"])


def test_the_prefix_flag_starts_every_translation_whichever_way_it_is_read(trained_translator):
    tmp, _, _ = trained_translator
    outputs = [translations_in_process(tmp / STUDENT, ["w1 w2", "w3"], "--prefix", "w5 w6", "--prefill", prefill)
               for prefill in ("parallel", "step")]
    print(outputs)
    assert outputs[0] == outputs[1] and all(line.startswith("w5 w6") for line in outputs[0])


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="/dev/full (a disk that is always full) is Linux's")
def test_translating_into_a_full_disk_is_one_line(trained_translator):
    """`translate.py > /dev/full` ended in an OSError traceback."""
    tmp, _, _ = trained_translator
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, os.path.join(ROOT, "translate.py"), "--ckpt", STUDENT], cwd=tmp,
                                input="w1 w2\n", stdout=full, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, **SCRIPT_ENV}, timeout=300)
    print(result.stderr)  # its stderr also says which device translates
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1].startswith("error: no space left on the device writing the output")


def test_latin1_input_is_a_one_line_error(trained_translator, run_here):
    tmp, _, _ = trained_translator
    result = run_here("translate.py", "--ckpt", STUDENT, cwd=tmp, stdin=b"caf\xe9\n")
    assert_one_line_error(result, "stdin is not UTF-8")


@pytest.mark.parametrize("kind", KINDS)
def test_reorder_state_moves_the_right_rows(kind):
    model, src, tokens = translator_batch(kind, seed=9, target_length=7)
    prefix, next_tokens = tokens[:, :4], tokens[:, 4:]
    state = model.init_state(src)
    step_all(model, state, prefix)
    index = torch.tensor([2, 0, 0])
    reordered = translate.reorder_state(state, index)
    got = step_all(model, reordered, next_tokens)
    # reference: each chosen hypothesis decoded again from scratch
    fresh = model.init_state(src[index])
    expected = step_all(model, fresh, torch.cat([prefix[index], next_tokens], dim=1))[:, 4:]
    assert report(f"{kind}: reordered state vs recomputed", (got - expected).abs().max()) < 1e-9


def test_one_output_line_per_input_line_whatever_the_line_holds(trained_translator, run_here):
    """A form feed, U+2028 or U+0085 inside a line is no line end: two lines in, two out (str.splitlines made 3)."""
    tmp, _, _ = trained_translator
    lines = ["w1\x0cw2 w3", "w4\u2028w5\x85w6"]
    out = run_here("translate.py", "--ckpt", STUDENT, "--beam", "1", cwd=tmp, stdin="\n".join(lines) + "\n")
    assert out.stdout.split("\n")[:-1] == translations_in_process(tmp / STUDENT, lines, "--beam", "1")


def test_a_decoding_batch_counts_the_sentences_there_are(trained_translator, run_here):
    """One sentence with --decode_batch_size 1000000000 was refused as 6,705.5 GiB: the batch holds one."""
    tmp, _, _ = trained_translator
    result = run_here("translate.py", "--ckpt", STUDENT, "--decode_batch_size", "1000000000", cwd=tmp, stdin="w1 w2\n")
    assert result.returncode == 0 and len(result.stdout.splitlines()) == 1, result.stderr


def test_a_beam_too_wide_to_fit_is_refused_before_decoding(trained_translator, run_here):
    tmp, _, _ = trained_translator
    result = run_here("translate.py", "--ckpt", STUDENT, "--beam", "100000000", cwd=tmp, stdin="w1 w2\n")
    assert_one_line_error(result, "decoding 1 sentence with --beam 100000000 would take about",
                          "lower --beam or --decode_batch_size")
