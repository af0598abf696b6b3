"""Helpers shared by the tests: run a script as a user would (or in this process, where the process is not what a
test checks: no torch import each), wait on another process's events, check a one-line error, report a difference,
write a tiny word corpus. pytest loads this file before any test file; tests import the names they use.

CPU only, tiny sizes, no downloads.
"""

import contextlib
import fcntl
import io
import json
import os
import random
import runpy
import shutil
import subprocess
import sys
import threading
import time
import warnings
from types import SimpleNamespace

import pytest
import torch

from support.configs import build_model, config_of

ROOT = os.path.dirname(os.path.abspath(__file__))

# A language model small enough to train a few steps in a second (train_lm.py flags).
TINY = ["--n_layer", "2", "--n_head", "2", "--d_model", "32", "--d_ff", "64", "--block_size", "32",
        "--batch_size", "4", "--eval_context", "32", "--eval_score", "16", "--eval_interval", "4",
        "--eval_windows", "4", "--log_interval", "2", "--feature_size", "8", "--chunk_size", "8"]


# The scripts run on one CPU thread in the tests, on a GPU machine too: the tests compare runs bit for bit (a resumed
# run against an uninterrupted one, two processes on gloo), which CUDA's kernels do not promise. The CUDA paths have
# their own tests, in-process (tests/test_step.py).
SCRIPT_ENV = {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}

# Under pytest-xdist (`-n 2`, the README's test command) each worker is one process among several: it keeps to its
# share of the cores, so that the workers do not fight over them (torch would give each one thread per core).
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


# How long a test waits for an event of another process (a line printed, an exit, a file written) before it fails
# saying which. The waits are on events, not on the machine's speed: a Python start that imports torch took 7-15 s on a
# loaded 2-core machine, and 300 s is far beyond any event's time there.
EVENT_TIMEOUT = 300


def wait_for_line(process, starts_with: str, awaited: str) -> str:
    """The first line of process's stdout (a text pipe) that starts with `starts_with`. Fails naming `awaited` if the
    process exits first or EVENT_TIMEOUT passes (the process is then killed)."""
    found = []

    def read():
        for line in process.stdout:
            if line.startswith(starts_with):
                found.append(line)
                return
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(EVENT_TIMEOUT)
    if not found:
        timed_out = reader.is_alive()
        if timed_out:
            process.kill()
        err = process.stderr.read()[-3000:] if process.stderr else ""
        why = f"not within {EVENT_TIMEOUT} s" if timed_out else f"the process exited ({process.wait()}) first"
        raise AssertionError(f"waited for {awaited}: {why}\n{err}")
    return found[0]


def wait_for_exit(process, awaited: str) -> tuple:
    """process.communicate(): (stdout, stderr) once it exits. Fails naming `awaited` if that takes more than
    EVENT_TIMEOUT (the process is then killed)."""
    try:
        return process.communicate(timeout=EVENT_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
        raise AssertionError(f"waited for {awaited}: not within {EVENT_TIMEOUT} s\n{(err or '')[-3000:]}") from None


def wait_until(condition, awaited: str, process=None):
    """Polls condition() until it holds. Fails naming `awaited` if EVENT_TIMEOUT passes or `process` exits first."""
    deadline = time.monotonic() + EVENT_TIMEOUT
    while not condition():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"waited for {awaited}: the process exited ({process.returncode}) first\n"
                                 f"{process.communicate()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"waited for {awaited}: not within {EVENT_TIMEOUT} s")
        time.sleep(0.05)


def command(script) -> list:
    """How a user runs `script`: a root script by its path (train_lm.py), a module of a folder with -m
    (experiments.mqar), which finds the repository's folders on PYTHONPATH when it runs elsewhere."""
    return [os.path.join(ROOT, script)] if script.endswith(".py") else ["-m", script]


def run(script, *args, cwd, check=True, extra_env=None, stdin=None):
    """python <script> <args> in cwd, one CPU thread, as a subprocess; raises with its output if it fails."""
    env = {**os.environ, **SCRIPT_ENV, "PYTHONPATH": ROOT, **(extra_env or {})}
    result = subprocess.run([sys.executable, *command(script), *args], cwd=cwd, env=env, input=stdin,
                            capture_output=True, text=True, timeout=EVENT_TIMEOUT)
    if check and result.returncode != 0:
        raise AssertionError(f"{script} {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def run_in_process(script, *args, cwd, stdin="", check=False):
    """run() in this process: `python <script> <args>` as runpy runs it, on one thread as run() gives a script, with
    the same (returncode, stdout, stderr); stdin is text or bytes; check=True: raises with its output if it fails, as
    run() does. No torch import each: 1.5-3 s saved a run."""
    out, err, threads = io.StringIO(), io.StringIO(), torch.get_num_threads()
    data = stdin.encode() if isinstance(stdin, str) else stdin
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        patch.chdir(cwd)
        patch.setattr(sys, "argv", [script, *map(str, args)])
        patch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
        patch.setattr(torch.cuda, "is_available", lambda: False)  # on the CPU, as run() gives a script (SCRIPT_ENV)
        torch.set_num_threads(1)
        try:
            if script.endswith(".py"):
                runpy.run_path(os.path.join(ROOT, script), run_name="__main__")
            else:  # python -m experiments.mqar (imported already by a test: run afresh, as python would)
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)
                    runpy.run_module(script, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else int(done.code is not None)
        finally:
            torch.set_num_threads(threads)
    if check and code != 0:
        raise AssertionError(f"{script} {' '.join(map(str, args))} failed:\n{out.getvalue()[-3000:]}\n"
                             f"{err.getvalue()[-3000:]}")
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


@pytest.fixture
def run_here():
    """run_in_process, as a fixture: for refusals that come before any work and for runs compared in process."""
    return run_in_process


def run_two_processes(script, *args, cwd):
    """torchrun --nproc_per_node 2 <script> <args> on the CPU (gloo); raises with its output if it fails."""
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             os.path.join(ROOT, script), *args], cwd=cwd, capture_output=True, text=True,
                            timeout=EVENT_TIMEOUT, env={**os.environ, **SCRIPT_ENV})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    print(result.stdout[-800:])
    return result


def assert_one_line_error(result, *fragments):
    """Exit status 2 and exactly one line on stderr, starting with 'error: ' and containing each fragment."""
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    print(lines[0])


def assert_flags_refused(get_args, argv, message, capsys):
    """get_args(argv) exits with status 2 and one line on stderr, 'error: ...' containing message."""
    with pytest.raises(SystemExit) as exit_info:
        get_args(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert message in err, err
    print(err.strip())


# generate.py --check prints the max |recurrent - parallel| logits of a float32 run: 2e-6 to 1.4e-5 on the README's
# models. One tolerance for every test that reads it.
CHECK_TOLERANCE = 1e-4


def assert_check_passes(stdout: str) -> float:
    """The difference generate.py --check printed, asserted below CHECK_TOLERANCE, and returned."""
    line = next((line for line in stdout.splitlines() if line.startswith("check: max |recurrent - parallel|")), None)
    assert line is not None, f"no check line in:\n{stdout[-1000:]}"
    diff = float(line.rsplit("= ", 1)[1])
    assert diff < CHECK_TOLERANCE, line
    print(line)
    return diff


def report(name, diff) -> float:
    """Print a maximum difference (the tests print every one they check) and return it as a float."""
    diff = float(diff.detach()) if torch.is_tensor(diff) else float(diff)
    print(f"{name}: max |diff| = {diff:.3e}")
    return diff


def write_corpus(folder, seed=0, words=40, lines=(600, 60, 60)):
    """train/valid/test.txt of random lines over `words` words: a folder dataset for train_lm.py."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(words)]
    os.makedirs(folder, exist_ok=True)
    for split, n in zip(("train", "valid", "test"), lines):
        with open(os.path.join(folder, f"{split}.txt"), "w") as f:
            for _ in range(n):
                f.write(" ".join(rng.choice(vocab) for _ in range(rng.randint(3, 12))) + "\n")
    return folder


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(str(tmp_path / "tiny"))


# -----------------------------------------------------------------------------
# Translation: a toy parallel corpus, a tiny translator, and one trained by the main job

# A translator small enough to train a few steps in a second (train_mt.py flags).
MT_TINY = ["--n_layer", "2", "--n_encoder_layer", "2", "--n_head", "2", "--d_model", "32", "--d_ff", "64",
           "--vocab_size", "300", "--max_tokens", "256", "--max_len", "40", "--eval_interval", "5",
           "--snapshot_interval", "2", "--average_last", "3", "--log_interval", "5", "--beam", "3",
           "--decode_batch_size", "16", "--cross_feature_size", "8", "--chunk_size", "4"]


def write_parallel(folder, seed=0, n=(400, 30, 30)):
    """A toy translation task: each source word maps to a fixed target word, in reverse order."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(30)]
    os.makedirs(folder, exist_ok=True)
    for split, count in zip(("train", "valid", "test"), n):
        src_lines, tgt_lines = [], []
        for _ in range(count):
            sentence = [rng.choice(words) for _ in range(rng.randint(2, 8))]
            src_lines.append(" ".join(sentence))
            tgt_lines.append(" ".join("z" + w[1:] for w in reversed(sentence)))
        for lang, lines in (("en", src_lines), ("de", tgt_lines)):
            with open(os.path.join(folder, f"{split}.{lang}"), "w") as f:
                f.write("\n".join(lines) + "\n")
    return folder


def tiny_translator(kind, seed=0, dtype=torch.float64, **switches):
    """A random 2+2-layer translator with peaky, varied predictions (so decoding choices matter); switches: its causal
    self-attention's (window=W: the sliding-window hybrid; decay=True: decay.py's state)."""
    torch.manual_seed(seed)
    config = config_of(dict(vocab_size=23, n_layer=2, n_encoder_layer=2, n_head=2, d_model=16, d_ff=32, dropout=0.0,
                            attn=kind, cross_attn=kind, feature_size=4, cross_feature_size=6, chunk_size=4, pad_id=0,
                            **switches))
    model = build_model(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.5 if name.endswith("weight") else 0.2))
    return model.to(dtype).eval()


def built_once(tmp_path_factory, name, build) -> tuple:
    """The folder `name`, filled by build(folder) once for the whole session: under pytest-xdist the workers share
    the base temporary folder, the first to take the lock builds and the others wait for it. Tests only read it.
    Returns (folder, what build returned, kept as JSON)."""
    root = tmp_path_factory.getbasetemp()
    root = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    folder, record = root / name, root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not record.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            record.write_text(json.dumps(build(folder)))
    return folder, json.loads(record.read_text())


def translations_in_process(ckpt, sentences: list, *flags) -> list:
    """What translate.py --ckpt CKPT *flags should print for sentences: translate.translate_sentences on the model
    support/inference.py's inference_model makes of it, with translate.py's flags (its defaults where not given)."""
    import translate
    from support.inference import inference_model
    model, tokenizer, _ = translate.load_translator(str(ckpt))
    return translate.translate_sentences(inference_model(model), tokenizer, sentences,
                                         translate.get_args(list(flags)), torch.device("cpu"))


@pytest.fixture(scope="session")
def trained_translator(tmp_path_factory):
    """The main job on a toy corpus: train the softmax translator, convert, finetune, BLEU (under a minute), once
    for all workers. Returns (folder, corpus, the run's output); tests write their own runs elsewhere."""
    def build(tmp):
        corpus = write_parallel(str(tmp / "toy"))
        out = run_in_process("train_mt.py", "--init", "pretrained", "--dataset", corpus, "--max_steps", "10",
                             *MT_TINY, cwd=tmp)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        return corpus, out.stdout
    tmp, (corpus, stdout) = built_once(tmp_path_factory, "mt", build)
    return tmp, corpus, SimpleNamespace(stdout=stdout)


# -----------------------------------------------------------------------------
# Tiny models for the equivalence tests (test_t2r.py, test_paper_models.py)

def lm_config(kind="softmax", **overrides):
    base = dict(vocab_size=37, n_layer=2, n_head=2, d_model=16, d_ff=32, dropout=0.0, attn=kind,
                feature_size=6, chunk_size=4)
    return config_of({**base, **overrides})  # the paper's Config, or with window / family fields their own


def mt_config(kind="softmax", **overrides):
    base = dict(vocab_size=37, n_layer=2, n_encoder_layer=2, n_head=2, d_model=16, d_ff=32, dropout=0.0,
                attn=kind, cross_attn=kind, feature_size=4, cross_feature_size=6, chunk_size=4)
    return config_of({**base, **overrides})


def make(model_class, config, dtype=torch.float64, seed=0):
    """A model in eval mode whose biases are non-zero, as after training (init sets them to zero)."""
    torch.manual_seed(seed)
    model = build_model(config)  # model_class, or its window or family subclass where the config says so
    assert isinstance(model, model_class)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(std=0.1)
    return model.to(dtype).eval()


def translator_batch(kind, seed, target_length, dtype=torch.float64, **overrides):
    """A tiny translator (make, mt_config(kind, **overrides)) and a batch for it from a generator seeded `seed`:
    padded sources of 7, 4 and 1 tokens, targets of target_length tokens."""
    from t2r import Seq2SeqTransformer
    model = make(Seq2SeqTransformer, mt_config(kind, **overrides), dtype)
    g = torch.Generator().manual_seed(seed)
    src = padded_sources(g)
    return model, src, torch.randint(1, 37, (3, target_length), generator=g)


def step_all(model, state, tokens):
    """Run the recurrent form over tokens (B, T), one position at a time: logits (B, T, V)."""
    return torch.stack([model.step(tokens[:, t], state)[0] for t in range(tokens.shape[1])], dim=1)


def padded_sources(generator, lengths=(7, 4, 1), pad=0, vocab=37):
    src = torch.full((len(lengths), max(lengths)), pad)
    for row, n in enumerate(lengths):
        src[row, :n] = torch.randint(1, vocab, (n,), generator=generator)
    return src


# -----------------------------------------------------------------------------
# A tiny random Hugging Face GPT-2 (test_hf.py): transformers' own model and files, no download

@pytest.fixture(scope="session")
def tiny_gpt2(tmp_path_factory):
    """A 2-layer GPT-2 (h = 64, 4 heads, 128 positions) with random, non-zero weights and biases, saved by
    transformers' save_pretrained (model.safetensors, config.json) beside a byte-level BPE tokenizer.json trained on
    the tiny corpus. Returns (folder, the corpus folder, the transformers model in eval mode, in float32)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    tmp = tmp_path_factory.mktemp("gpt2")
    corpus = write_corpus(str(tmp / "tiny"))
    tokenizer = byte_level_bpe(corpus)
    end = tokenizer.token_to_id("<|endoftext|>")
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=128, vocab_size=tokenizer.get_vocab_size(),
                        bos_token_id=end, eos_token_id=end)
    folder = tmp / "gpt2"
    model = save_randomised(lambda: GPT2LMHeadModel(config), tokenizer, folder)
    return folder, corpus, model


def byte_level_bpe(corpus: str, prefix_space: bool = False):
    """GPT-2's kind of tokenizer (byte level, no prefix space, <|endoftext|> its one special), trained on a corpus;
    prefix_space: one that adds a space before a text's first word, as RoBERTa's and some Llama conversions do."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix_space)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    with open(os.path.join(corpus, "train.txt")) as f:
        tokenizer.train_from_iterator(f.read().splitlines(), trainer=trainer)
    return tokenizer


def sentencepiece_style(corpus: str):
    """A tokenizer of sentencepiece's kind (Llama 2's, Mistral's): spaces become ▁ and one is put before a text's
    first word; the newline is a token of its own. Trained on a corpus, at most 300 tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace("▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace("▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>"], initial_alphabet=["\n"],
                                  show_progress=False)
    with open(os.path.join(corpus, "train.txt")) as f:
        tokenizer.train_from_iterator(f.read().splitlines(), trainer=trainer)
    return tokenizer


TOKENIZERS = {"no prefix space": byte_level_bpe, "prefix space": lambda corpus: byte_level_bpe(corpus, True),
              "sentencepiece": sentencepiece_style}  # the pretrained kinds a line's end is found in


def save_randomised(make, tokenizer, folder, **save):
    """make() with noise on every weight (it starts with zero biases and unit norms: a mapping error would hide
    there), saved by save_pretrained beside tokenizer.json; returned in eval mode."""
    torch.manual_seed(0)
    model = make().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder, **save)
    tokenizer.save(str(folder / "tokenizer.json"))
    return model


# The Llama family's test models: grouped-query attention in each (4 query heads, 2 or 1 key/value heads)
LLAMA_FAMILY = {
    "llama": dict(num_key_value_heads=2, tie_word_embeddings=False, rope_theta=500.0,  # Llama 3.2's stretched rotary
                  rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                    original_max_position_embeddings=16)),
    "qwen2": dict(num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1000.0),  # biases on q, k, v
    "mistral": dict(num_key_value_heads=1, tie_word_embeddings=False, sliding_window=None),
}


@pytest.fixture(scope="session")
def tiny_llamas(tmp_path_factory):
    """{family: (folder, the corpus folder, the transformers model in eval mode)}: 2 layers, h = 32, 4 heads, random
    non-zero weights, saved by save_pretrained (the llama in shards, with their index) beside a byte-level BPE."""
    import transformers
    tmp = tmp_path_factory.mktemp("llamas")
    corpus = write_corpus(str(tmp / "tiny"))
    tokenizer = byte_level_bpe(corpus)
    models = {}
    for family, switches in LLAMA_FAMILY.items():
        name = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral"}[family]
        config = getattr(transformers, f"{name}Config")(
            vocab_size=tokenizer.get_vocab_size(), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=256, **switches)
        folder = tmp / family
        model = save_randomised(lambda: getattr(transformers, f"{name}ForCausalLM")(config), tokenizer, folder,
                                **({"max_shard_size": "30KB"} if family == "llama" else {}))
        models[family] = folder, corpus, model
    return models
