"""Every script refuses a bad flag, or flags it cannot run together, before any work: one line on stderr,
`error: ...`, saying what to do, and exit status 2 (argparse's own errors too). Each case is the flags as a user
types them and a fragment of the line.

    python -m pytest -q -s tests/test_flags.py
"""

import os
import subprocess
import sys

import pytest

import generate
import train_lm
import train_mt
from conftest import EVENT_TIMEOUT, ROOT, assert_flags_refused
from support.runtime import run_main

GET_ARGS = {"train_lm.py": train_lm.get_args, "train_mt.py": train_mt.get_args, "generate.py": generate.get_args}


@pytest.mark.parametrize("script, flags, message", [
    # train_lm.py: each flag's kind and range
    ("train_lm.py", "--no_such_flag", "unrecognized arguments: --no_such_flag"),
    ("train_lm.py", "--max_steps many", "--max_steps: 'many' is not a number"),
    ("train_lm.py", "--eval_score 600", "--eval_score must be between 1 and --eval_context"),
    ("train_lm.py", "--n_layer 0", "--n_layer: 0 is not a positive integer"),
    ("train_lm.py", "--n_head -1", "--n_head: -1 is not a positive integer"),
    ("train_lm.py", "--lr inf", "--lr: inf is not a positive finite number"),
    ("train_lm.py", "--lr nan", "--lr: nan is not a positive finite number"),
    ("train_lm.py", "--min_lr_ratio -5", "--min_lr_ratio: -5 is not in [0, 1]"),
    ("train_lm.py", "--dropout 1", "--dropout: 1 is not in [0, 1)"),
    ("train_lm.py", "--log_interval 0", "--log_interval: 0 is not a positive integer"),
    ("train_lm.py", "--eval_windows 0", "--eval_windows: 0 is not a positive integer"),
    ("train_lm.py", "--chunk_size -1", "--chunk_size: -1 is not an integer >= 0"),
    ("train_lm.py", "--device foo", "--device: 'foo' is no device"),
    ("train_lm.py", "--keep_softmax_every 4", "--keep_softmax_every picks which of the teacher's layers stay softmax"),
    ("train_lm.py", "--init pretrained --keep_softmax_from top", "--keep_softmax_from says where --keep_softmax_every"),
    ("train_lm.py", "--vocab_size 500", "add --tokenizer bpe"),
    ("train_lm.py", "--tokenizer bpe --vocab_size 10", "at least 257 tokens"),
    ("train_lm.py", "--seed 100000000000000000000000", "is not a seed from 0 to 2**63 - 1"),
    ("train_lm.py", "--lr 1e39", "--lr 1e+39 is beyond float32's largest number"),
    # the conversion: swap, attention transfer, window, kept softmax layers
    ("train_lm.py", "--window -1", "--window"),
    ("train_lm.py", "--transfer_steps 5", "add --init pretrained"),
    ("train_lm.py", "--init pretrained --attn softmax --transfer_steps 5", "not softmax"),
    ("train_lm.py", "--attn softmax --window 8", "not softmax"),
    ("train_lm.py", "--init pretrained --transfer_steps 5 --freeze_feature_map", "drop one"),
    ("train_mt.py", "--transfer_steps 5", "add --init pretrained"),
    ("train_mt.py", "--transfer_lr 0", "--transfer_lr"),
    ("train_lm.py", "--pretrained teacher.pt", "add --init pretrained"),
    ("train_lm.py", "--init pretrained --transfer_lr 0.1", "add --transfer_steps"),
    ("train_lm.py", "--init pretrained --attn elu --transfer_steps 5", "would train nothing"),
    ("train_lm.py", "--init pretrained --attn rfa --feature_size 7", "must be even"),
    ("train_mt.py", "--init pretrained --attn rfa --cross_feature_size 7", "must be even"),
    ("train_lm.py", "--init pretrained --keep_softmax_every 1", "which is the teacher"),
    ("train_lm.py", "--init pretrained --attn softmax --keep_softmax_every 2", "add --attn"),
    ("train_lm.py", "--init pretrained --attn elu --freeze_feature_map", "no feature-map weights"),
    ("train_lm.py", "--init pretrained --window 512", "softmax throughout"),
    # SRU++ (--arch sru++) and the transformer's flags
    ("train_lm.py", "--arch sru++ --init pretrained", "trains from scratch"),
    ("train_lm.py", "--arch sru++ --attn_every 5", "--attn_every 5 is larger than the 4 layers"),
    ("train_lm.py", "--arch sru++ --n_layer 2 --attn_every 3", "larger than the 2 layers"),
    ("train_lm.py", "--arch sru++ --window 8", "--window is a transformer flag"),
    ("train_lm.py", "--arch sru++ --n_head 2", "--n_head is a transformer flag"),
    ("train_lm.py", "--attn_every 2", "--attn_every is an SRU++ flag: add --arch sru++"),
    ("train_lm.py", "--arch rnn", "invalid choice: 'rnn'"),
    # GPT-2 from Hugging Face
    ("train_lm.py", "--pretrained hf:gpt2", "is a model to convert: add --init pretrained"),
    ("train_lm.py", "--init pretrained --pretrained hf:gpt2 --tokenizer bpe", "--tokenizer: hf:gpt2 cuts the data"),
    # train_mt.py
    ("train_mt.py", "--no_such_flag", "unrecognized arguments"),
    ("train_mt.py", "--max_tokens 10 --max_len 40", "cannot hold one sentence"),
    ("train_mt.py", "--lenpen nan", "--lenpen: nan is not a finite number"),
    ("train_mt.py", "--bleu_sentences -5", "--bleu_sentences: -5 is not an integer >= 0"),
    ("train_mt.py", "--max_len_a -1", "--max_len_a: -1 is not a number from 0 to 10000"),
    ("train_mt.py", "--max_len_b 0", "--max_len_b: 0 is not an integer from 1 to 1000000"),
    ("train_mt.py", "--label_smoothing 1", "--label_smoothing: 1 is not in [0, 1)"),
    ("train_mt.py", "--vocab_size 100", "at least 260 tokens"),
    # generate.py
    ("generate.py", "--temperature nan", "--temperature: nan is not a finite number >= 0"),
    ("generate.py", "--num_tokens 0", "--num_tokens: 0 is not a positive integer"),
    ("generate.py", "--prompt caf\udce9", "--prompt is not UTF-8 text"),  # b"caf\xe9" in argv, as Python decodes it
    # generate.py: the step
    ("generate.py", "--step graph --compile", "--compile compiles t2r.py's step"),
    ("generate.py", "--mode recompute --step eager", "they need --mode recurrent"),
])
def test_bad_flags_are_refused_before_any_work(capsys, script, flags, message):
    assert_flags_refused(GET_ARGS[script], flags.split(), message, capsys)


EXPERIMENTS = ["analyze_attention", "conversion", "first_token", "from_scratch", "gpt2_cost", "llama_cost", "mqar",
               "probes", "report", "study"]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_an_experiment_run_as_a_file_says_to_run_it_as_a_module(name):
    """python experiments/mqar.py --help ended in ModuleNotFoundError: the project's modules are found from the
    repository's root, with -m."""
    result = subprocess.run([sys.executable, os.path.join("experiments", f"{name}.py"), "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=EVENT_TIMEOUT)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip() == f"error: run it from the repository's root as a module: python -m experiments.{name}"


def test_a_module_commands_error_names_it_once(capsys):
    from experiments import mqar
    with pytest.raises(SystemExit):
        mqar.get_args(["--no_such_flag"])
    assert "(see python -m experiments.mqar --help)" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [(["--only", "("], "is not a regular expression"),
                                           (["--only", "no such run", "--dry_run"], "matches none of the runs")])
def test_mqar_refuses_an_only_that_cannot_choose_runs(capsys, argv, message):
    from experiments import mqar
    with pytest.raises(SystemExit):
        run_main(lambda: mqar.main(argv))
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="/dev/full (a disk that is always full) is Linux's")
def test_output_to_a_full_disk_is_one_line(monkeypatch, capsys):
    """`script > /dev/full`: every write of the output fails with ENOSPC. One error line, exit status 2, and nothing
    more at exit (what is left in the output's buffer is dropped, not flushed again into a traceback)."""
    with open("/dev/full", "w") as full:
        monkeypatch.setattr(sys, "stdout", full)
        with pytest.raises(SystemExit) as exit_info:
            run_main(lambda: print("a line of output"))
        full.write("more")  # the exit's own flush: it must not raise
        full.flush()
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == ("error: no space left on the device writing the output: free some space, or "
                                       "write somewhere else\n")
