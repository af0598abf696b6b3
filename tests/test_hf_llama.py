"""
Tests of support/hf.py's Llama family (Llama, Qwen2, Mistral): a checkpoint read into t2r.TransformerLM computes
transformers' own logits and gradients, in float32 and float64, from one file or from shards, from bf16 weights too;
every setting it cannot compute is a one-line error. Tiny random models (conftest.tiny_llamas) stand in for real
ones: no network.

    python -m pytest -q -s tests/test_hf_llama.py
"""

import copy
import json
import shutil

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402 (installed with transformers)

from conftest import LLAMA_FAMILY, report
from support import hf, runtime

FAMILIES = list(LLAMA_FAMILY)


def tokens(vocab_size, shape=(2, 40), seed=0):  # past the llama's original 16 positions: its stretched rotary
    return torch.randint(0, vocab_size, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.float64, 1e-5)])
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_transformers(tiny_llamas, family, dtype, tolerance):
    """float64 is as close as float32: transformers computes RMSNorm and the rotary angles in float32 either way."""
    folder, _, reference = tiny_llamas[family]
    ours, theirs = hf.load(folder).to(dtype).eval(), reference.to(dtype)
    x = tokens(reference.config.vocab_size)
    with torch.no_grad():
        diff = (ours(x) - theirs(x).logits).abs().max()
    reference.float()
    assert report(f"{family} {dtype}: our logits vs transformers'", diff) < tolerance


@pytest.mark.parametrize("family", FAMILIES)
def test_gradients_equal_transformers(tiny_llamas, family):
    folder, _, reference = tiny_llamas[family]
    ours = hf.load(folder).eval()
    x, y = tokens(reference.config.vocab_size), tokens(reference.config.vocab_size, seed=1)
    reference.zero_grad()
    for logits in (ours(x), reference(x).logits):
        F.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
    theirs = dict(reference.named_parameters())
    pairs = {"embed_tokens": (ours.embed.tok.weight, "model.embed_tokens.weight"),
             "layers.1.k_proj": (ours.layers[1].self_attn.k_proj.weight, "model.layers.1.self_attn.k_proj.weight"),
             "layers.0.gate_proj": (ours.layers[0].ffn.gate.weight, "model.layers.0.mlp.gate_proj.weight"),
             "layers.0.input_layernorm": (ours.layers[0].norm1.weight, "model.layers.0.input_layernorm.weight")}
    for name, (mine, their_name) in pairs.items():
        assert report(f"{family}: gradient of {name}", (mine.grad - theirs[their_name].grad).abs().max()) < 1e-5


def test_the_llama_is_read_from_its_shards(tiny_llamas):
    folder, _, _ = tiny_llamas["llama"]
    shards = sorted(p.name for p in folder.glob("model-*.safetensors"))
    assert len(shards) > 1 and (folder / "model.safetensors.index.json").is_file()
    assert len(hf.weight_files(folder)) == len(shards)


def test_bf16_weights_load_into_a_float32_model(tiny_llamas, tmp_path):
    folder, _, reference = tiny_llamas["qwen2"]
    half = tmp_path / "bf16"
    copy.deepcopy(reference).to(torch.bfloat16).save_pretrained(half)  # a copy: bf16 and back would round the shared one
    shutil.copy(folder / "tokenizer.json", half / "tokenizer.json")
    ours, exact = hf.load(half), hf.load(folder)
    assert ours.embed.tok.weight.dtype == torch.float32
    diff = (ours.layers[0].self_attn.q_proj.weight - exact.layers[0].self_attn.q_proj.weight).abs().max()
    assert 0 < diff < 0.01  # bf16's rounding of weights of about 0.1, no more


@pytest.mark.parametrize("family", FAMILIES)
def test_the_config_keeps_each_familys_switches(tiny_llamas, family):
    config = hf.read_config(tiny_llamas[family][0])
    heads = LLAMA_FAMILY[family]["num_key_value_heads"]
    assert (config.norm, config.ffn, config.n_kv_head, config.scale_embedding) == ("rmsnorm", "swiglu", heads, False)
    assert config.bias == ("qkv" if family == "qwen2" else "none")
    assert config.tie_embeddings == LLAMA_FAMILY[family]["tie_word_embeddings"]
    assert (config.rope_scaling or {}).get("rope_type") == ("llama3" if family == "llama" else None)


def test_a_quantized_checkpoint_is_refused_not_cast(tiny_llamas, tmp_path, capsys):
    """A weight stored as int8 was cast to float and converted as if it were the weights."""
    folder = changed(tiny_llamas, tmp_path, "qwen2")
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.0.mlp.up_proj.weight"] = tensors["model.layers.0.mlp.up_proj.weight"].to(torch.int8)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(SystemExit) as exit_info:
        runtime.run_main(lambda: hf.load(folder))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "model.layers.0.mlp.up_proj.weight is stored as torch.int8" in err, err


def changed(tiny_llamas, tmp_path, family, settings=None, drop_shard=False):
    folder = tiny_llamas[family][0]
    out = tmp_path / family
    shutil.copytree(folder, out)
    if settings:
        config = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps({**config, **settings}))
    if drop_shard:
        next(out.glob("model-*.safetensors")).unlink()
    return out


@pytest.mark.parametrize("family, settings, message", [
    ("llama", {"attention_bias": True}, "has attention_bias=true (biases on q, k, v and o alone)"),
    ("mistral", {"sliding_window": 16}, "attends within a sliding window of 16 tokens"),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 16}, "attends within a sliding window of 16 tokens"),
    ("llama", {"head_dim": 16}, "has heads of 16 dimensions, not hidden_size / num_attention_heads"),
    ("llama", {"hidden_act": "gelu"}, "has hidden_act='gelu', which our model does not compute (ours: 'silu')"),
    ("llama", {"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 10.0}},
     "rope_scaling={'factor': 2.0, 'rope_type': 'yarn'}: supported are"),
    ("qwen2", {"num_key_value_heads": 3}, "not a usable qwen2 config (n_kv_head=3 must divide n_head=4"),
    ("llama", None, "lacks model-"),
    # read through one checker of types and values before anything is built (each a traceback, or silent, before)
    ("qwen2", {"rope_parameters": None, "rope_theta": 0}, "has rope_theta=0: the rotary base is a positive number"),
    ("qwen2", {"rope_parameters": {"rope_theta": 0, "rope_type": "default"}}, "has rope_theta=0: the rotary base"),
    ("qwen2", {"rope_parameters": "default"}, "has rope_parameters='default': an object of rotary settings"),
    ("qwen2", {"rope_scaling": ["linear", 2.0]}, "has rope_scaling=['linear', 2.0]: an object of rotary settings"),
    ("qwen2", {"attention_dropout": 1.5}, "has attention_dropout=1.5: a dropout is a number in [0, 1)"),
    ("qwen2", {"attention_dropout": "0.1"}, "has attention_dropout='0.1': a dropout is a number in [0, 1)"),
    ("qwen2", {"num_hidden_layers": 1_000_000}, "config.json says 1000000 layers, its tensors hold 2"),
])
def test_what_our_model_cannot_compute_is_a_one_line_error(tiny_llamas, tmp_path, capsys, family, settings, message):
    folder = changed(tiny_llamas, tmp_path, family, settings, drop_shard=settings is None)
    with pytest.raises(SystemExit) as exit_info:
        runtime.run_main(lambda: hf.load(folder))
    err = capsys.readouterr().err
    print(err.strip())
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert message in err, err


# -----------------------------------------------------------------------------
# The job: convert a Llama with grouped-query attention through the command line, finetune, generate

FINETUNE = ["--max_steps", "4", "--block_size", "32", "--batch_size", "4", "--eval_context", "32", "--eval_score", "16",
            "--eval_interval", "4", "--eval_windows", "4", "--log_interval", "2", "--feature_size", "8",
            "--chunk_size", "8", "--transfer_steps", "0", "--no-decay"]  # T2R's own: the recipe's transfer stage
# and its decaying state (HF_PARTS) are tested on their own


@pytest.fixture(scope="module")
def finetuned_llama(tiny_llamas, tmp_path_factory):
    from conftest import run_in_process
    folder, corpus, _ = tiny_llamas["llama"]
    out = tmp_path_factory.mktemp("finetuned-llama")
    result = run_in_process("train_lm.py", "--init", "pretrained", "--pretrained", f"hf:{folder}", "--dataset", corpus,
                            "--out_dir", str(out / "run"), "--cache_dir", str(out / "cache"), *FINETUNE, cwd=out)
    print(result.stdout[-1500:])
    assert result.returncode == 0, result.stderr
    return out / "run", result.stdout


def test_a_converted_llama_keeps_its_switches_and_a_state_of_its_kv_heads(finetuned_llama):
    run_dir, stdout = finetuned_llama
    checkpoint = torch.load(run_dir / "model.pt", weights_only=True)
    config = checkpoint["config"]
    assert (config["attn"], config["n_kv_head"], config["norm"], config["rope_scaling"]["rope_type"]) == \
        (["t2r", "t2r"], 2, "rmsnorm", "llama3")
    assert checkpoint["model"]["layers.0.self_attn.feature_map.weight"].shape == (2, 8, 8)  # one map per kv head
    assert "| t2r+pretrain | 8 |" in stdout


def test_generate_checks_a_converted_llama_recurrent_against_parallel(finetuned_llama):
    from conftest import assert_check_passes, run_in_process
    run_dir, _ = finetuned_llama
    gen = run_in_process("generate.py", "--ckpt", str(run_dir / "model.pt"), "--prompt", "w1 w2 w3", "--num_tokens",
                         "40", "--check", cwd=run_dir, check=True)
    print(gen.stdout[-600:])
    assert_check_passes(gen.stdout)
    # rotary: nothing folds; a KV cache of 2 key/value heads of 8: 2 layers x (k, v) x 16 floats x 47 tokens (a line's
    # end, the prompt's 6, 40 new) x 4 B
    assert "folded, Eq. 8" not in gen.stdout and "a KV cache of that length holds 11.8 KiB" in gen.stdout
    assert "mode recurrent with a recurrent state (RNN), families.py's own step (it steps its own way" in gen.stdout


def test_a_run_of_earlier_code_generates_from_its_token_cache(finetuned_llama, tmp_path):
    """A Llama converted before checkpoints kept their tokenizer, whose token cache is of PRETRAINED_FORMAT 1 (each
    line's words re-joined): generate.py reads the tokenizer from that cache, as it did then, and generates what the
    run generates now (it failed: "format changed")."""
    from conftest import run_in_process
    from support.checkpoints import load_checkpoint, save_checkpoint
    run_dir, _ = finetuned_llama
    checkpoint = load_checkpoint(str(run_dir / "model.pt"))
    shutil.copytree(run_dir.parent / "cache", tmp_path / "cache")
    for meta in (tmp_path / "cache").glob("*/meta.json"):
        meta.write_text(json.dumps({**json.loads(meta.read_text()), "format": 1}))
    del checkpoint["tokenizer"], checkpoint["checksum"], checkpoint["checksum_all"]
    save_checkpoint(str(tmp_path / "model.pt"), {**checkpoint, "args": {**checkpoint["args"],
                                                                         "cache_dir": str(tmp_path / "cache")}})
    texts = []
    for ckpt in (run_dir / "model.pt", tmp_path / "model.pt"):
        result = run_in_process("generate.py", "--ckpt", str(ckpt), "--prompt", "w3 w4", "--num_tokens", "16",
                                "--temperature", "0", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        texts.append(result.stdout.split("model.pt: ", 1)[1].split("\n", 1)[1].split("\n\n")[0])
    print(texts)
    assert texts[0] == texts[1] and texts[0].startswith("w3 w4")


def test_a_converted_llama_reads_its_prompt_in_one_pass_and_generates_as_a_step_a_token(finetuned_llama, tmp_path):
    """--prefill parallel (rotary angles from the prompt's positions, grouped heads) against --prefill step: the same
    greedy text; the first line says how the prompt was read."""
    from conftest import run_in_process
    run_dir, _ = finetuned_llama
    outputs = {}
    for prefill in ("parallel", "step"):
        result = run_in_process("generate.py", "--ckpt", str(run_dir / "model.pt"), "--prompt", "w3 w4 w1 w2 w3",
                                "--num_tokens", "12", "--temperature", "0", "--prefill", prefill, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        what, text = result.stdout.split("model.pt: ", 1)[1].split("\n", 1)
        outputs[prefill] = (what, text.split("\ntime to the first token")[0])
    print(outputs)
    assert outputs["parallel"][0].endswith("; prompt read in one parallel pass")
    assert outputs["step"][0].endswith("; prompt read a step a token")
    assert outputs["parallel"][1] == outputs["step"][1]


@pytest.mark.parametrize("num_tokens, past", [(8, False), (40, True)])
def test_generating_past_the_trained_length_is_said_once(finetuned_llama, tmp_path, num_tokens, past):
    """Rotary angles have no end, so nothing refuses position 33 of a model finetuned on 32-token sequences; it says
    so once, before generating, and only then."""
    from conftest import run_in_process
    run_dir, _ = finetuned_llama
    result = run_in_process("generate.py", "--ckpt", str(run_dir / "model.pt"), "--prompt", "w3 w4", "--num_tokens",
                            str(num_tokens), "--temperature", "0", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stdout.splitlines() if line.startswith("note: ")]
    print(notes)
    assert len(notes) == int(past) and all("past the 32 tokens" in note and "--block_size" in note for note in notes)


def continuations(model, prompts, num_tokens=6):
    """Greedy continuations of prompts (lists of ids) generated as one batch, and the logits of their picks."""
    import generate
    lengths = [len(p) for p in prompts]
    prompt = torch.tensor([p + [0] * (max(lengths) - len(p)) for p in prompts])
    first = min(lengths)  # the position of the first token yielded
    steps = list(generate.generate_ragged(model, model.init_state(len(prompts)), prompt, torch.tensor(lengths),
                                          num_tokens, lambda x: x.argmax(-1)))
    logits = torch.stack([step_logits for _, step_logits in steps], 1)  # (B, steps, V)
    return (generate.picks([token for token, _ in steps], lengths, first, num_tokens),
            [logits[b, length - first: length - first + num_tokens] for b, length in enumerate(lengths)])


@pytest.mark.parametrize("kind", ["softmax", "t2r"])
def test_a_batch_of_prompts_of_different_lengths_continues_each_as_alone(tiny_llamas, kind):
    """Padding never enters a state: each row of the batch feeds its own prompt, then its own picks."""
    import t2r
    folder, _, _ = tiny_llamas["llama"]
    torch.manual_seed(0)
    model = hf.load(folder).double().eval()
    model = model if kind == "softmax" else t2r.convert(model, "t2r", 8).eval()
    prompts = [[5, 9, 13, 2, 7, 11], [3], [8, 4, 6]]
    together, together_logits = continuations(model, prompts)
    for prompt, tokens, logits in zip(prompts, together, together_logits):
        alone, (alone_logits,) = continuations(model, [prompt])
        assert tokens == alone[0] and (logits - alone_logits).abs().max() < 1e-10


def test_generate_takes_a_batch_of_prompts_and_checks_each(finetuned_llama):
    from conftest import assert_check_passes, run_in_process
    run_dir, _ = finetuned_llama
    gen = run_in_process("generate.py", "--ckpt", str(run_dir / "model.pt"), "--prompt", "w1 w2 w3 w4 w5", "--prompt",
                         "w2", "--num_tokens", "12", "--temperature", "0", "--check", cwd=run_dir, check=True)
    print(gen.stdout[-800:])
    assert_check_passes(gen.stdout)
    assert "--- prompt 0, sample 0\nw1 w2 w3 w4 w5" in gen.stdout and "--- prompt 1, sample 0\nw2" in gen.stdout


def test_smollm2s_cost_figures_come_from_its_shapes():
    """SmolLM2-135M: transformers' own model of its config has the parameters ours has before conversion; T2R adds
    one k x (d + 1) feature map per key/value head and layer, and its state is one k x (d + 1) [S | z] for each."""
    from experiments import gpt2_cost, llama_cost
    settings = {k: v for k, v in llama_cost.SMOLLM2_135M.items() if k != "model_type"}
    with torch.device("meta"):
        theirs = transformers.LlamaForCausalLM(transformers.LlamaConfig(**settings)).num_parameters()
    config = hf.llama_config(llama_cost.SMOLLM2_135M, "SmolLM2-135M")
    figures = gpt2_cost.memory(config)
    per_head = 32 * (64 + 1)  # k x (d + 1)
    print(f"{theirs:,} parameters", {k: f"{v:,}" for k, v in figures.items()})
    assert theirs == 134_515_008 and figures["weights"] == 4 * (theirs + 30 * 3 * per_head)
    assert figures["t2r_state"] == 4 * 30 * 3 * per_head and figures["kv_cache_1024"] == 4 * 2 * 30 * 1024 * 3 * 64


def test_a_hub_name_fetches_the_config_the_tokenizer_and_every_shard(tiny_llamas, tmp_path, monkeypatch):
    """hf:NAME through a faked snapshot_download that serves the tiny llama's folder, file by file, as the hub would
    for the patterns asked: what it fetches loads (its shards and their index included), and nothing else comes."""
    import fnmatch
    import huggingface_hub
    folder, _, reference = tiny_llamas["llama"]
    asked = {}

    def snapshot_download(name, allow_patterns):
        asked[name] = allow_patterns
        out = tmp_path / "hub" / name
        out.mkdir(parents=True)
        for path in folder.iterdir():
            if any(fnmatch.fnmatch(path.name, pattern) for pattern in allow_patterns):
                shutil.copy(path, out / path.name)
        return str(out)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    fetched = hf.folder_of("hf:HuggingFaceTB/SmolLM2-135M")
    names = sorted(p.name for p in (tmp_path / "hub" / "HuggingFaceTB/SmolLM2-135M").iterdir())
    print(names)
    assert "generation_config.json" not in names and "model.safetensors.index.json" in names
    x = tokens(reference.config.vocab_size)
    with torch.no_grad():
        assert (hf.load(fetched)(x) - reference(x).logits).abs().max() < 1e-5
    assert hf.tokenizer_file(fetched).endswith("tokenizer.json")


def test_the_window_hybrid_on_a_grouped_query_llama_is_a_one_line_error(tiny_llamas, tmp_path):
    from conftest import assert_one_line_error, run_in_process
    folder, corpus, _ = tiny_llamas["llama"]
    result = run_in_process("train_lm.py", "--init", "pretrained", "--pretrained", f"hf:{folder}", "--dataset", corpus,
                            "--window", "4", "--out_dir", str(tmp_path / "run"), "--cache_dir", str(tmp_path / "cache"),
                            *FINETUNE, cwd=tmp_path)
    assert_one_line_error(result, "the sliding-window hybrid takes one key/value head per query head")


def test_a_batch_that_cannot_fit_is_refused_before_the_teacher_is_evaluated(tiny_llamas, tmp_path):
    """--batch_size 10000000 was refused only after the teacher's evaluation (hours for a real model)."""
    from conftest import assert_one_line_error, run_in_process
    folder, corpus, _ = tiny_llamas["llama"]
    flags = FINETUNE[:4] + ["--batch_size", "10000000"] + FINETUNE[6:]
    result = run_in_process("train_lm.py", "--init", "pretrained", "--pretrained", f"hf:{folder}", "--dataset", corpus,
                            "--out_dir", "run", "--cache_dir", "cache", *flags, cwd=tmp_path)
    assert_one_line_error(result, "would take about", "lower --batch_size")
    assert "as it is (softmax, not finetuned)" not in result.stdout


def test_a_table_padded_past_the_tokenizer_converts_and_never_samples_the_padding(tiny_llamas, tmp_path):
    """Qwen2.5 pads its embedding table past its tokenizer (151,936 rows, 151,665 tokens): it was refused. The rows
    are kept, the model converts and finetunes, and generation picks tokens of the tokenizer only, however likely
    a padding row is made."""
    from conftest import run_in_process
    import generate
    folder, corpus, reference = tiny_llamas["qwen2"]
    padded = tmp_path / "padded"
    shutil.copytree(folder, padded)
    tokens = reference.config.vocab_size
    model = transformers.Qwen2ForCausalLM(copy.deepcopy(reference.config))  # resizing writes to its config: a copy
    model.load_state_dict(reference.state_dict())
    model.resize_token_embeddings(tokens + 36)
    model.save_pretrained(padded)
    result = run_in_process("train_lm.py", "--init", "pretrained", "--pretrained", f"hf:{padded}", "--dataset", corpus,
                            "--out_dir", "run", "--cache_dir", "cache", *FINETUNE, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    saved = torch.load(tmp_path / "run/model.pt", weights_only=True)
    assert saved["config"]["vocab_size"] == tokens + 36  # the padding rows kept
    out = run_in_process("generate.py", "--ckpt", "run/model.pt", "--num_tokens", "8", "--seed", "3", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    logits = torch.zeros(4, tokens + 36)
    logits[:, tokens:] = 1e4  # the padding rows far the likeliest
    for temperature in (0.0, 1.0):
        picked = generate.sample(logits, temperature, 0, torch.Generator().manual_seed(0), tokens=tokens)
        assert (picked < tokens).all()
