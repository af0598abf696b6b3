"""Tests of support/hf.py: a Hugging Face GPT-2 read into t2r.TransformerLM computes transformers' own logits and
gradients, converts, finetunes and generates like a teacher of ours, and every bad input is a one-line error. A tiny
random GPT-2 (conftest.tiny_gpt2) stands in for the real one: no network.

    python -m pytest -q -s tests/test_hf.py
"""

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import sys

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

import generate
import t2r
import train_lm
from after_t2r import convert_to_window
from families import FamilyConfig
from conftest import assert_check_passes, assert_one_line_error, lm_config, report, run_in_process, step_all
from support import configs, hf, job, runtime
from safetensors.torch import load_file, save_file
from experiments import gpt2_cost

# train_lm.py flags for the tiny GPT-2: its sizes come from its config.json
FINETUNE = ["--max_steps", "4", "--block_size", "32", "--batch_size", "4", "--eval_context", "32", "--eval_score", "16",
            "--eval_interval", "4", "--eval_windows", "4", "--log_interval", "2", "--feature_size", "8",
            "--chunk_size", "8", "--transfer_steps", "0", "--no-decay"]  # T2R's own: the recipe's transfer stage
# and its decaying state (HF_PARTS) are tested on their own


def tokens(vocab_size, shape=(2, 23), seed=0):
    return torch.randint(0, vocab_size, shape, generator=torch.Generator().manual_seed(seed))


def variant(tiny_gpt2, tmp_path, layout="safetensors", change_tensors=None, change_config=None):
    """A copy of the tiny GPT-2's folder, its weights saved as `layout` and optionally changed:
    "safetensors" as save_pretrained writes them (transformer. prefix), "bin" as GPT-2's own release does
    (pytorch_model.bin, no prefix, no lm_head, and the causal mask buffers attn.bias and attn.masked_bias)."""
    folder, _, _ = tiny_gpt2
    out = tmp_path / f"variant-{layout}"
    out.mkdir()
    shutil.copy(folder / "tokenizer.json", out / "tokenizer.json")
    config = {**json.loads((folder / "config.json").read_text()), **(change_config or {})}
    (out / "config.json").write_text(json.dumps(config))
    tensors = load_file(folder / "model.safetensors")
    if layout == "bin":
        tensors = {name.removeprefix("transformer."): t for name, t in tensors.items()}
        n = config["n_positions"]
        for i in range(config["n_layer"]):
            tensors[f"h.{i}.attn.bias"] = torch.ones(n, n, dtype=torch.uint8).tril()[None, None]
            tensors[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    if change_tensors:
        change_tensors(tensors)
    if layout == "bin":
        torch.save(tensors, out / "pytorch_model.bin")
    else:
        save_file({k: t.contiguous() for k, t in tensors.items()}, out / "model.safetensors")
    return out


# -----------------------------------------------------------------------------
# The same function as transformers' GPT-2

@pytest.mark.parametrize("layout", ["safetensors", "bin"])
def test_logits_equal_transformers(tiny_gpt2, tmp_path, layout):
    _, _, reference = tiny_gpt2
    ours = hf.load(variant(tiny_gpt2, tmp_path, layout)).eval()
    x = tokens(reference.config.vocab_size, (2, 128))  # every one of the 128 learned positions
    with torch.no_grad():
        diff = (ours(x) - reference(x).logits).abs().max()
    assert report(f"{layout}: our logits vs transformers' GPT2LMHeadModel", diff) < 1e-5


def test_gradients_equal_transformers(tiny_gpt2):
    """The same loss gives the same gradients, in GPT-2's layout: c_attn's is q's, k's and v's side by side."""
    folder, _, reference = tiny_gpt2
    ours = hf.load(folder).eval()
    x, y = tokens(reference.config.vocab_size), tokens(reference.config.vocab_size, seed=1)
    for logits in (ours(x), reference(x).logits):
        F.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
    theirs = dict(reference.named_parameters())
    layer = ours.layers[1].self_attn
    c_attn = torch.cat([p.weight.grad for p in (layer.q_proj, layer.k_proj, layer.v_proj)]).T  # (in, 3h), as Conv1D
    pairs = {"wte": (ours.embed.tok.weight.grad, theirs["transformer.wte.weight"].grad),
             "wpe": (ours.embed.pos.weight.grad, theirs["transformer.wpe.weight"].grad),
             "h.1.attn.c_attn": (c_attn, theirs["transformer.h.1.attn.c_attn.weight"].grad),
             "h.0.mlp.c_fc": (ours.layers[0].ffn[0].weight.grad.T, theirs["transformer.h.0.mlp.c_fc.weight"].grad)}
    for name, (a, b) in pairs.items():
        assert report(f"gradient of {name}", (a - b).abs().max()) < 1e-5


@pytest.mark.parametrize("window", [0, 4])
def test_the_conversion_keeps_gpt2s_positions_and_gelu(tiny_gpt2, window):
    """Swapped to T2R (with a softmax window, or without and folded): GPT-2's learned positions, GELU and unscaled
    embedding stay, and the recurrent form, which embeds position t at step t, equals the parallel one."""
    folder, _, reference = tiny_gpt2
    student = convert_to_window(hf.load(folder), window, "t2r", feature_size=8).double().eval()
    c = student.config
    assert (c.max_positions, c.activation, c.scale_embedding) == (128, "gelu_tanh", False)
    assert torch.equal(student.embed.pos.weight, reference.transformer.wpe.weight.double())
    generating = student if window else t2r.fold(student)
    x = tokens(c.vocab_size, (2, 40))
    with torch.no_grad():
        parallel = student(x)
    recurrent = step_all(generating, generating.init_state(2), x)
    assert report(f"window {window}: recurrent vs parallel", (recurrent - parallel).abs().max()) < 1e-9


def test_a_config_that_names_its_positions_loads_and_keeps_only_max_positions():
    """Checkpoints written before max_positions alone said it carry positions="learned" (or "sinusoidal"): their
    configs still load, and what is kept is max_positions alone (the kind of positions follows from it)."""
    config = configs.build_model({**lm_config(max_positions=16).to_dict(), "positions": "learned"}).config
    assert config.max_positions == 16 and "positions" not in config.to_dict()
    assert configs.build_model({**lm_config().to_dict(), "positions": "sinusoidal"}).config.max_positions == 0


def test_the_switches_add_one_table_and_leave_todays_models_alone():
    """Today's models keep their state_dict keys (sinusoidal positions have no table); learned positions add one."""
    today = set(t2r.TransformerLM(lm_config()).state_dict())
    gpt2_like = set(configs.build_model(lm_config(max_positions=16, activation="gelu_tanh",
                                                  scale_embedding=False)).state_dict())
    assert gpt2_like - today == {"embed.pos.weight"} and today <= gpt2_like


@pytest.mark.parametrize("switches, message", [
    (dict(positions="rotary"), "positions='rotary': choose one of sinusoidal, learned"),
    (dict(activation="swiglu"), "activation='swiglu': choose one of relu, gelu_tanh"),
    (dict(positions="learned"), "a learned table needs its length"),
    (dict(positions="sinusoidal", max_positions=64), "sinusoidal positions take 0"),
    (dict(scale_embedding="no"), "scale_embedding='no' must be True or False"),
])
def test_bad_switches_are_refused(switches, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        lm_config(**switches)


# -----------------------------------------------------------------------------
# The job: evaluate GPT-2 as it is, convert, finetune, generate

@pytest.fixture(scope="module")
def finetuned(tiny_gpt2, tmp_path_factory):
    """train_lm.py --init pretrained --pretrained hf:FOLDER on the tiny corpus, in this process (for speed), with an
    attention-transfer stage. Returns (its folder, its stdout)."""
    folder, corpus, _ = tiny_gpt2
    out = tmp_path_factory.mktemp("finetuned")
    argv = ["--init", "pretrained", "--pretrained", f"hf:{folder}", "--dataset", corpus, "--out_dir", str(out / "run"),
            "--cache_dir", str(out / "cache"), *FINETUNE, "--transfer_steps", "2"]
    result = run_in_process("train_lm.py", *argv, cwd=out)
    print(result.stdout[-1500:])
    assert result.returncode == 0, result.stderr
    return out / "run", result.stdout


def test_the_job_prints_the_teachers_row_and_word_level_perplexity(tiny_gpt2, finetuned):
    folder, corpus, _ = tiny_gpt2
    run_dir, stdout = finetuned
    teacher = json.loads((run_dir / job.TEACHER_RESULTS).read_text())
    student = json.loads((run_dir / "results.json").read_text())
    assert "| valid word ppl | test word ppl |" in stdout
    assert f"| hf:{folder} (softmax, not finetuned) | - | {teacher['valid']['ppl']:.2f} |" in stdout
    assert f"| t2r+transfer+pretrain | 8 | {student['valid']['ppl']:.2f} |" in stdout
    lines = open(os.path.join(corpus, "test.txt")).read().splitlines()
    words = sum(len(line.split()) + 1 for line in lines)  # whitespace words and one end of line each
    for results in (teacher, student):  # the test split's one NLL, over its tokens (ppl) and over its words
        test = results["test"]
        assert math.log(test["word_ppl"]) * words == pytest.approx(math.log(test["ppl"]) * test["tokens"], rel=1e-6)


def test_the_teachers_score_is_printed_under_the_teachers_name(tiny_gpt2, finetuned):
    folder, _, _ = tiny_gpt2
    run_dir, stdout = finetuned
    lines = stdout.splitlines()
    announced = next(i for i, line in enumerate(lines) if line.startswith(f"hf:{folder} as it is (softmax"))
    print(lines[announced + 1])
    assert lines[announced + 1].startswith(f"hf:{folder}: valid ppl ")  # not the student's folder, run_dir
    assert sum(line.startswith(f"{run_dir}: valid ppl ") for line in lines) == 2  # after the transfer, finetuned


def test_the_checkpoint_keeps_gpt2s_switches_and_its_tokenizer(finetuned):
    run_dir, _ = finetuned
    checkpoint = torch.load(run_dir / "model.pt", weights_only=True)
    assert checkpoint["config"]["max_positions"] == 128 and checkpoint["config"]["activation"] == "gelu_tanh"
    assert checkpoint["args"]["tokenizer"].endswith("tokenizer.json") and checkpoint["args"]["dropout"] == 0.1


def test_generate_checks_recurrent_against_parallel(finetuned):
    run_dir, _ = finetuned
    gen = run_in_process("generate.py", "--ckpt", str(run_dir / "model.pt"), "--prompt", "w1 w2 w3", "--num_tokens",
                         "60", "--check", cwd=run_dir, check=True)
    print(gen.stdout[-500:])
    assert "folded, Eq. 8" in gen.stdout
    assert_check_passes(gen.stdout)


def test_generating_past_the_learned_positions_is_refused(finetuned, monkeypatch):
    run_dir, _ = finetuned
    monkeypatch.setattr(sys, "argv", ["generate.py", "--ckpt", str(run_dir / "model.pt"), "--num_tokens", "200"])
    with pytest.raises(runtime.UserError, match="run past the 128 positions") as error:
        generate.main()
    print(error.value)


@pytest.mark.parametrize("num_tokens, fits", [(126, True), (127, False)])
def test_the_position_limit_is_exact(num_tokens, fits):
    """A 3-token prompt and n new tokens feed positions 0 .. 3 + n - 2: the last new token is never fed in."""
    config = FamilyConfig(vocab_size=10, n_layer=1, n_head=1, d_model=8, max_positions=128)
    with contextlib.nullcontext() if fits else pytest.raises(runtime.UserError):
        generate.check_positions(config.max_positions, 3, argparse.Namespace(num_tokens=num_tokens, ckpt="model.pt"))


def test_an_hf_run_says_what_it_converts_and_not_the_flags_it_ignores(tiny_gpt2, tmp_path):
    """Its first line leaves out the sizes, tokenizer and dropout the checkpoint decides; the next names the family,
    sizes and tokenizer; an ELU conversion adds no parameters and says so; the periodic validation says it is
    partial."""
    folder, corpus, _ = tiny_gpt2
    argv = ["--init", "pretrained", "--pretrained", f"hf:{folder}", "--dataset", corpus, "--attn", "elu",
            "--out_dir", str(tmp_path / "run"), "--cache_dir", str(tmp_path / "cache"), *FINETUNE]
    result = run_in_process("train_lm.py", *argv, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    flags = next(line for line in result.stdout.splitlines() if line.startswith("train_lm.py: "))
    print(flags)
    assert not re.search(r"\b(tokenizer|vocab_size|dropout|d_model|feature_size)=", flags)  # ELU's k is the head size
    assert f"{folder}: gpt2, 2 layers, d_model 64, 4 heads, vocabulary " in result.stdout
    assert "128 positions (n_positions); tokenizer: BPE, " in result.stdout
    assert "to elu: causal k=16; no new parameters" in result.stdout
    assert "validation loss (its first 4 windows)" in result.stdout


def test_the_flags_printed_are_those_fitted_to_the_learned_positions(tiny_gpt2, tmp_path):
    """--block_size and --eval_context left at their defaults (512) shrink to the checkpoint's 128 positions before
    the run's flags are printed: the printed line is what the run uses, as args.json is."""
    folder, corpus, _ = tiny_gpt2
    shortened = [flag for flag in FINETUNE if flag not in ("--block_size", "32", "--eval_context")]
    argv = ["--init", "pretrained", "--pretrained", f"hf:{folder}", "--dataset", corpus, "--out_dir",
            str(tmp_path / "run"), "--cache_dir", str(tmp_path / "cache"), *shortened, "--batch_size", "1"]
    result = run_in_process("train_lm.py", *argv, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    flags = [line for line in result.stdout.splitlines() if line.startswith("train_lm.py: ")]
    print(flags)
    saved = json.loads((tmp_path / "run" / "args.json").read_text())
    assert len(flags) == 1 and "block_size=128," in flags[0] and "eval_context=128," in flags[0]
    assert (saved["block_size"], saved["eval_context"]) == (128, 128)


@pytest.mark.parametrize("flag", ["--block_size", "--eval_context"])
def test_windows_longer_than_the_learned_positions_are_refused(tiny_gpt2, tmp_path, flag):
    folder, corpus, _ = tiny_gpt2
    argv = ["--init", "pretrained", "--pretrained", f"hf:{folder}", "--dataset", corpus, "--out_dir",
            str(tmp_path / "run"), "--cache_dir", str(tmp_path / "cache"), *FINETUNE, flag, "200"]
    with pytest.raises(runtime.UserError, match=f"{flag} 200 is longer than the 128 positions") as error:
        train_lm.main(argv)
    print(error.value)
    assert not (tmp_path / "cache").exists()  # refused before the corpus was tokenised


def test_every_window_flag_past_the_positions_is_refused_in_one_message(tiny_gpt2, tmp_path):
    folder, corpus, _ = tiny_gpt2
    argv = ["--init", "pretrained", "--pretrained", f"hf:{folder}", "--dataset", corpus, "--out_dir",
            str(tmp_path / "run"), "--cache_dir", str(tmp_path / "cache"), *FINETUNE, "--block_size", "200",
            "--eval_context", "300", "--eval_score", "150"]
    with pytest.raises(runtime.UserError, match="--block_size 200, --eval_context 300, --eval_score 150 are longer "
                                                r"than the 128 positions .* supports \(n_positions\)"):
        train_lm.main(argv)


@pytest.mark.parametrize("limit, expected", [(100, (100, 100, 50)), (300, (300, 300, 150)), (1024, (512, 512, 256))])
def test_the_windows_default_to_what_the_checkpoint_supports(limit, expected, tmp_path, capsys):
    """A rotary model's max_position_embeddings (or GPT-2's n_positions) shorter than the defaults becomes them:
    --block_size, --eval_context, and --eval_score at most half the context."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": limit}))
    args = train_lm.get_args(["--init", "pretrained", "--pretrained", f"hf:{tmp_path}"])
    train_lm.fit_positions(*hf.context_limit(str(tmp_path)), args, "the model")
    assert (args.block_size, args.eval_context, args.eval_score) == expected
    assert ("max_position_embeddings" in capsys.readouterr().out) == (limit < 512)


# -----------------------------------------------------------------------------
# One-line errors

def drop(name):
    return lambda tensors: tensors.pop(name)


def add(name):
    return lambda tensors: tensors.update({name: torch.zeros(3)})


def untie(tensors):
    tensors["transformer.wte.weight"] = tensors["transformer.wte.weight"].clone()
    tensors["lm_head.weight"] = tensors["transformer.wte.weight"] + 1


def narrow(tensors):
    tensors["transformer.h.0.attn.c_attn.weight"] = tensors["transformer.h.0.attn.c_attn.weight"][:, :-3]


def nan(tensors):
    tensors["transformer.h.1.mlp.c_proj.weight"][0, 0] = float("nan")


@pytest.mark.parametrize("change_tensors, change_config, message", [
    (drop("transformer.h.1.mlp.c_fc.bias"), None, "lacks the tensor h.1.mlp.c_fc.bias"),
    (add("transformer.h.0.attn.rotary"), None, "has the tensor h.0.attn.rotary"),
    (untie, None, "lm_head.weight is not wte.weight"),
    (narrow, None, "h.0.attn.c_attn.weight has shape (64, 189)"),
    (None, {"model_type": "gemma"}, "describes a 'gemma' model: gpt2, llama, qwen2, mistral convert"),
    (None, {"model_type": "llama"}, "has num_hidden_layers=None: a size is a positive whole number"),
    (None, {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx=True"),
    (None, {"layer_norm_epsilon": 1e-6}, "layer_norm_epsilon=1e-06"),
    (None, {"n_head": 5}, "not a usable GPT-2 config"),
    (nan, None, "holds NaN or inf weights (transformer.h.1.mlp.c_proj.weight)"),
    (None, {"n_head": True}, "has n_head=True: a GPT-2 size is a positive whole number"),
    (None, {"n_embd": 200000, "n_head": 4}, "wte.weight has shape (288, 64), not what config.json"),  # none allocated
], ids=["missing tensor", "extra tensor", "untied output", "wrong shape", "gemma", "a llama of gpt-2 settings",
        "layer-scaled attention",
        "another epsilon", "heads that do not divide", "nan weights", "a true head count", "a config too wide"])
def test_a_checkpoint_that_is_not_gpt2s_is_a_one_line_error(tiny_gpt2, tmp_path, capsys, change_tensors,
                                                            change_config, message):
    folder = variant(tiny_gpt2, tmp_path, change_tensors=change_tensors, change_config=change_config)
    with pytest.raises(SystemExit) as exit_info:
        runtime.run_main(lambda: hf.load(folder))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert message in err, err
    print(err.strip())


def test_a_config_that_is_no_json_object_is_a_one_line_error(tiny_gpt2, tmp_path):
    folder = variant(tiny_gpt2, tmp_path)
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(runtime.UserError, match="config.json holds a JSON list, not an object of settings"):
        hf.read_config(folder)


def test_an_unreachable_hub_is_a_one_line_error_that_says_what_to_do(tmp_path, corpus, monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def offline(*args, **kwargs):
        raise LocalEntryNotFoundError("Cannot reach the Hugging Face Hub and the files are not in the local cache")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    monkeypatch.chdir(tmp_path)
    argv = ["--init", "pretrained", "--pretrained", "hf:gpt2", "--dataset", corpus, *FINETUNE]
    with pytest.raises(runtime.UserError, match="could not download gpt2") as error:
        train_lm.main(argv)
    message = str(error.value)
    print(message)
    assert "LocalEntryNotFoundError" in message and "--pretrained hf:./gpt2" in message and "\n" not in message


def test_a_folder_that_is_not_there_is_a_one_line_error(run_here, tmp_path, corpus):
    argv = ["--init", "pretrained", "--pretrained", "hf:./nowhere", "--dataset", corpus, *FINETUNE]
    assert_one_line_error(run_here("train_lm.py", *argv, cwd=tmp_path), "there is no folder './nowhere'")


def test_the_memory_figures_come_from_gpt2s_shapes():
    """124,439,808 parameters (GPT-2 small, tied), and T2R's 12 x 12 x 32 x 32 feature maps and biases."""
    figures = gpt2_cost.memory(hf.gpt2_config(hf.GPT2, "GPT-2"))
    assert figures["weights"] == 4 * (124_439_808 + 12 * 12 * 32 * (64 + 1))
    assert figures["t2r_state"] == 4 * 12 * 12 * 32 * (64 + 1)  # S (k x d) and z (k) per head and layer
    assert figures["kv_cache_1024"] == 4 * 2 * 12 * 1024 * 768
    print({k: f"{v:,}" for k, v in figures.items()})


# -----------------------------------------------------------------------------
# A converted model's run folder holds all it needs to generate

def greedy_text(ckpt, cwd, prompt="w1 w2") -> str:
    """generate.py's greedy continuation of prompt (its output but the timings), run in process in cwd."""
    result = run_in_process("generate.py", "--ckpt", str(ckpt), "--prompt", prompt, "--num_tokens", "24",
                            "--temperature", "0", cwd=cwd)
    assert result.returncode == 0, result.stderr
    text = result.stdout.split("model.pt: ", 1)[1].split("\n", 1)[1]  # after the line that says what generates
    return text.split("\ntime to the first token")[0]


@pytest.mark.parametrize("kind", ["no prefix space", "prefix space", "sentencepiece"])
def test_a_moved_run_folder_generates_the_same_tokens_without_the_model_folder(tiny_gpt2, tmp_path, kind):
    """Converted from hf:FOLDER, then the run's folder moved elsewhere and FOLDER and the token cache deleted: it
    generates what it did (it failed: "run it where the model was trained"), for each kind of tokenizer."""
    from conftest import TOKENIZERS
    folder, corpus, _ = tiny_gpt2
    shutil.copytree(folder, tmp_path / "hf")
    TOKENIZERS[kind](corpus).save(str(tmp_path / "hf" / "tokenizer.json"))  # at most 300 tokens: GPT-2's table
    result = run_in_process("train_lm.py", "--init", "pretrained", "--pretrained", f"hf:{tmp_path / 'hf'}",
                            "--dataset", corpus, "--out_dir", "run", "--cache_dir", "cache", *FINETUNE,
                            "--max_steps", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    before = greedy_text("run/model.pt", tmp_path)
    (tmp_path / "elsewhere").mkdir()
    shutil.move(tmp_path / "run", tmp_path / "elsewhere" / "run")
    shutil.rmtree(tmp_path / "hf"), shutil.rmtree(tmp_path / "cache")
    after = greedy_text(tmp_path / "elsewhere/run/model.pt", tmp_path / "elsewhere")
    print(kind, repr(before))
    assert after == before and before.startswith("w1 w2") and len(before) > len("w1 w2")


def test_args_json_records_the_vocabulary_of_the_tokenizer(tiny_gpt2, finetuned):
    """--vocab_size sizes the project's BPE: a pretrained tokenizer's own size is what args.json says (it said 8000,
    the flag's default, for a model of 288 tokens)."""
    from tokenizers import Tokenizer
    run_dir, _ = finetuned
    saved = json.loads((run_dir / "args.json").read_text())
    tokens = Tokenizer.from_file(str(tiny_gpt2[0] / "tokenizer.json")).get_vocab_size()
    assert saved["vocab_size"] == tokens == torch.load(run_dir / "model.pt", weights_only=True)["config"]["vocab_size"]


def test_a_prompt_starts_after_the_end_of_a_line_and_prints_as_given(finetuned):
    """generate.py feeds a prompt as a line of the corpus: the end of a line (GPT-2's newline token), then its words
    as they follow one; the text printed is the prompt's own."""
    run_dir, _ = finetuned
    args = generate.get_args(["--ckpt", str(run_dir / "model.pt"), "--prompt", "w1 w2"])
    model, lm, _ = generate.load_model(args, torch.device("cpu"))
    rows = generate.prompt_rows(model, lm, args, torch.device("cpu"))
    newline = lm.tokenizer.token_to_id("Ċ")
    assert rows == [[newline] + lm.tokenizer.encode("w1 w2").ids] and generate.text_of(lm, rows[0]) == "w1 w2"
