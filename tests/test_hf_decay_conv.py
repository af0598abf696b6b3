"""
The decaying state (decay.py) and the short convolution (after_t2r.py) added to a Hugging Face model at the swap, in
float64, for each family support/hf.py reads (GPT-2's learned positions; the Llama family's rotary positions and
grouped-query heads, 2 or 1 key/value heads of 4, Qwen2's biases): the student steps and prefills as it runs in
parallel, the convolution starts as the identity, the decay gate decays, convert's every-tensor check counts the new
parts; train_lm.py converts a Llama folder with both and generate.py decodes it. Tiny random models stand in for real
ones (conftest.tiny_gpt2, conftest.tiny_llamas): no network.

    python -m pytest -q -s tests/test_hf_decay_conv.py
"""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from after_t2r import ShortConv, attention_transfer, conv_student  # noqa: E402
from conftest import LLAMA_FAMILY, assert_check_passes, report, run_in_process, step_all  # noqa: E402
from decay import GATE_START, DecayingAttention, decay_student  # noqa: E402
from support import hf  # noqa: E402
from support.configs import build_model  # noqa: E402
from support.inference import prefill_by_steps  # noqa: E402
from t2r import convert, new_tensors  # noqa: E402
from test_prefill import largest_difference  # noqa: E402

FAMILIES = ["gpt2", *LLAMA_FAMILY]  # gpt2: learned positions, H key/value heads; the rest rotary, grouped
PARTS = {"decay": (0, True), "conv4": (4, False), "conv4 and decay": (4, True)}  # (--short_conv, --decay)
# float64 sums of a few dozen O(1) products in another order (chunks, the state's matrix products, the steps' one at a
# time): a few ulps (1e-16) apart; 1e-10 leaves room for the layers that follow. A gate or convolution step gone
# wrong is O(0.1) off (their weights are moved off their start below).
TIGHT = 1e-10


def teacher(request, family: str):
    """The family's tiny random checkpoint read by support/hf.py, in float64: a softmax FamilyLM."""
    folder = request.getfixturevalue("tiny_gpt2")[0] if family == "gpt2" else \
        request.getfixturevalue("tiny_llamas")[family][0]
    return hf.load(folder).double().eval()


def build(short_conv: int, decay: bool):  # support/job.py's student_build for these two flags
    return conv_student(short_conv, decay) or decay_student(decay)


def student(request, family: str, part: str | None, moved: bool = True):
    """The teacher converted to T2R (k = 8, chunks of 4) with the part (None: plain T2R); moved: its decay gates and
    convolutions off their start, so that a step or prefill that skipped them (or the convolution's window) would
    show."""
    softmax = teacher(request, family)  # first: a fixture built now draws from the generator seeded below
    torch.manual_seed(1)
    parts = build(*PARTS[part]) if part else None
    model = convert(softmax, "t2r", feature_size=8, build=parts, chunk_size=4).eval()
    torch.manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if moved and name.endswith(("gate_bias", "conv.weight", "conv.bias")):
                p.normal_(std=0.5 if name.endswith("conv.weight") else 1.0)  # gates of 0.3 to 0.95, mixed inputs
    return model


def tokens(model, shape, seed=0):
    return torch.randint(0, model.config.vocab_size, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("part", PARTS)
@pytest.mark.parametrize("family", FAMILIES)
def test_the_student_steps_as_it_runs_in_parallel(request, family, part):
    """The training forward (chunks of 4 over 19 positions, a partial one last) against model.step a token at a time:
    the rotary angle of each position, the gate of each key/value head, the convolution's last 3 inputs."""
    model = student(request, family, part)
    x = tokens(model, (2, 19))
    with torch.no_grad():
        parallel = model(x)
    diff = (step_all(model, model.init_state(2), x) - parallel).abs().max()
    assert report(f"{family}, {part}: steps - parallel", diff) < TIGHT


@pytest.mark.parametrize("part", PARTS)
@pytest.mark.parametrize("family", FAMILIES)
def test_the_student_prefills_as_it_steps(request, family, part):
    """A prompt of 13 read by prefill in two calls (5, then 8 in pieces of 3: each piece from the state the one before
    left, the convolution's window across them) against prefill_by_steps, the reference: the last logits, the state
    after, and the 4 steps that follow."""
    model = student(request, family, part)
    x = tokens(model, (2, 17))
    expected_logits, reference = prefill_by_steps(model, x[:, :13], model.init_state(2))
    state = model.init_state(2)
    model.prefill(x[:, :5], state)
    logits, state = model.prefill(x[:, 5:13], state, chunk=3)
    diff = max((logits - expected_logits).abs().max().item(), largest_difference(state, reference),
               (step_all(model, state, x[:, 13:]) - step_all(model, reference, x[:, 13:])).abs().max().item())
    assert report(f"{family}, {part}: prefill of 5, then 8 in pieces of 3 - by steps (logits, state, steps)",
                  diff) < TIGHT


@pytest.mark.parametrize("decay", [False, True])
@pytest.mark.parametrize("family", FAMILIES)
def test_at_the_swap_the_convolution_is_the_identity(request, family, decay):
    """With a new convolution the student computes what the same conversion without one does (the same random feature
    maps drawn); the convolutions are its only tensors beyond that conversion's, one weight and bias a layer."""
    part = "conv4 and decay" if decay else "conv4"
    with_conv = student(request, family, part, moved=False)
    without = student(request, family, "decay" if decay else None, moved=False)
    x = tokens(with_conv, (2, 11))
    with torch.no_grad():
        difference = (with_conv(x) - without(x)).abs().max()
    assert report(f"{family}, decay {decay}: with a new convolution - without, at the swap", difference) < 1e-12
    convolutions = {name for name in with_conv.state_dict() if ".conv." in name}
    assert new_tensors(with_conv) - new_tensors(without) == convolutions and len(convolutions) == 2 * 2
    assert all(isinstance(m.conv, ShortConv) and m.conv.kernel == 4 for m in (b.self_attn for b in with_conv.layers))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_gate_of_one_is_the_plain_conversion_and_the_gate_at_its_start_decays(request, family):
    """beta = 40 makes every gate 1 (to 1e-17): the student is the plain T2R conversion; at the swap (beta = 4, g about
    0.98) it is not. The gate reads the key of its key/value head: one beta each (4 for GPT-2, 2 or 1 for the Llamas)."""
    decaying, plain = student(request, family, "decay", moved=False), student(request, family, None, moved=False)
    heads = 4 if family == "gpt2" else LLAMA_FAMILY[family]["num_key_value_heads"]
    assert all(b.self_attn.gate_bias.tolist() == [GATE_START] * heads for b in decaying.layers)
    x = tokens(plain, (2, 30))
    with torch.no_grad():
        at_start = (decaying(x) - plain(x)).abs().max()
        for layer in decaying.layers:
            layer.self_attn.gate_bias.fill_(40.0)
        at_one = (decaying(x) - plain(x)).abs().max()
    assert report(f"{family}: gates of 1 - T2R", at_one) < 1e-12 and report(f"{family}: gates at the start - T2R",
                                                                            at_start) > 1e-3


@pytest.mark.parametrize("part", PARTS)
@pytest.mark.parametrize("family", FAMILIES)
def test_convert_counts_the_new_parts_and_a_saved_config_builds_the_student_again(request, family, part):
    """new_tensors: the feature maps and the part's gates and convolutions, each layer's, nothing else (copy_pretrained
    refused the student otherwise); the saved config builds the same class, which takes the student's tensors."""
    model = student(request, family, part)
    short_conv, decay = PARTS[part]
    per_layer = {"feature_map.weight", "feature_map.bias"} | ({"gate_bias"} if decay else set()) | \
        ({"conv.weight", "conv.bias"} if short_conv else set())
    assert new_tensors(model) == {f"layers.{i}.self_attn.{name}" for i in range(2) for name in per_layer}
    assert all(isinstance(b.self_attn, DecayingAttention) == decay for b in model.layers)
    rebuilt = build_model(model.config.to_dict())
    assert type(rebuilt) is type(model) and [type(b.self_attn) for b in rebuilt.layers] == \
        [type(b.self_attn) for b in model.layers]
    rebuilt.load_state_dict(model.state_dict())


@pytest.mark.parametrize("part", PARTS)
@pytest.mark.parametrize("family", FAMILIES)
def test_attention_transfer_passes_the_teachers_attention_on_and_trains_the_new_parts(request, family, part):
    """The transfer stage (an hf: teacher's default, HF_RECIPE): each layer passes on softmax attention of its own q, k,
    v, read from the convolution (the identity at the swap) with the rotary angles, so the student's logits are the
    teacher's; its error reaches the decay gates, not the convolution (q, k and v are its targets' inputs, fixed)."""
    model = student(request, family, part, moved=False)
    x = tokens(model, (2, 11))
    errors, logits = attention_transfer(model, x)
    with torch.no_grad():
        expected = teacher(request, family)(x)
    assert report(f"{family}, {part}: logits in the transfer - the teacher's", (logits - expected).abs().max()) < TIGHT
    errors.sum().backward()
    grads = {name: p.grad for name, p in model.named_parameters() if name.endswith(("gate_bias", "conv.weight"))}
    assert len(grads) == 2 * sum(map(bool, PARTS[part]))
    assert all(grad.abs().max() > 0 if name.endswith("gate_bias") else grad is None for name, grad in grads.items())


# -----------------------------------------------------------------------------
# The command line: a Llama folder converted with both parts, finetuned, generating

FINETUNE = ["--max_steps", "2", "--block_size", "32", "--batch_size", "4", "--eval_context", "32", "--eval_score", "16",
            "--eval_interval", "2", "--eval_windows", "4", "--log_interval", "1", "--feature_size", "8",
            "--chunk_size", "8", "--transfer_steps", "0"]


def test_train_lm_converts_a_llama_with_decay_and_a_convolution_and_generate_decodes_it(tiny_llamas, tmp_path):
    """--decay --short_conv 4 on an hf: folder (refused before): the row names both, the checkpoint keeps the family's
    switches and both parts; generate.py's recurrent logits are its parallel ones (--check), and its greedy text is
    the same whether the prompt is read in one parallel pass or a step a token."""
    folder, corpus, _ = tiny_llamas["llama"]
    result = run_in_process("train_lm.py", "--init", "pretrained", "--pretrained", f"hf:{folder}", "--dataset", corpus,
                            "--decay", "--short_conv", "4", "--out_dir", str(tmp_path / "run"),
                            "--cache_dir", str(tmp_path / "cache"), *FINETUNE, cwd=tmp_path)
    print(result.stdout[-1500:])
    assert result.returncode == 0, result.stderr
    assert "| t2r+decay+conv4+pretrain |" in result.stdout
    assert "new parameters: feature maps, convolutions, decay gates only" in result.stdout
    checkpoint = torch.load(tmp_path / "run/model.pt", weights_only=True)
    config, weights = checkpoint["config"], checkpoint["model"]
    assert (config["decay"], config["short_conv"], config["n_kv_head"], config["rope_theta"]) == (True, 4, 2, 500.0)
    assert weights["layers.0.self_attn.gate_bias"].shape == (2,) and "layers.1.self_attn.conv.weight" in weights
    texts = {}
    for prefill in ("parallel", "step"):
        gen = run_in_process("generate.py", "--ckpt", str(tmp_path / "run/model.pt"), "--prompt", "w3 w4 w1 w2",
                             "--num_tokens", "12", "--temperature", "0", "--prefill", prefill, "--check", cwd=tmp_path)
        assert gen.returncode == 0, gen.stderr
        assert_check_passes(gen.stdout)
        texts[prefill] = gen.stdout.split("model.pt: ", 1)[1].split("\n", 1)[1].split("\ntime to the first token")[0]
    print(texts)
    assert texts["parallel"] == texts["step"] and texts["parallel"].startswith("w3 w4 w1 w2")
