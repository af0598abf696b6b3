"""
The switches of Llama-family checkpoints in t2r.py (RMSNorm, SwiGLU, biases, grouped-query attention, rotary
positions): the defaults leave the paper's model as it was, and every form of every attention kind still agrees
with the others under each switch (float64).

    python -m pytest -q -s tests/test_model_switches.py
"""

import math

import pytest
import torch
import torch.nn.functional as F

import t2r
import families
from after_t2r import WindowConfig, convert_to_window
from families import FamilyConfig
from support.configs import build_model
from layers.states import state_bytes
from support.inference import is_folded
from t2r import Config, Seq2SeqTransformer, TransformerLM, convert, fold

LLAMA = dict(norm="rmsnorm", ffn="swiglu", bias="none", n_kv_head=2, rope_theta=10_000.0, scale_embedding=False)


def tiny(**switches) -> FamilyConfig:
    return FamilyConfig(**{**dict(vocab_size=50, n_layer=2, n_head=4, d_model=32, d_ff=48, dropout=0.0, chunk_size=4),
                     **switches})


def test_the_defaults_keep_the_papers_state_dict_keys():
    keys = set(TransformerLM(Config(vocab_size=10, n_layer=1, n_head=2, d_model=8, d_ff=16)).state_dict())
    layer = [f"layers.0.{m}.{p}" for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                           "self_attn.out_proj", "norm1", "norm2", "ffn.0", "ffn.3")
             for p in ("weight", "bias")]
    assert keys == {"embed.tok.weight", "lm_head.weight", "final_norm.weight", "final_norm.bias", *layer}


def test_a_llama_layer_has_the_llama_tensors_and_no_biases():
    keys = set(build_model(tiny(**LLAMA)).state_dict())
    assert {k for k in keys if k.startswith("layers.0.")} == {
        f"layers.0.{m}.weight" for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                         "self_attn.out_proj", "norm1", "norm2", "ffn.gate", "ffn.up", "ffn.down")}
    model = build_model(tiny(**LLAMA))
    assert model.layers[0].self_attn.k_proj.weight.shape == (2 * 8, 32)  # 2 key/value heads of 8
    qwen = build_model(tiny(**{**LLAMA, "bias": "qkv"})).layers[0].self_attn
    assert [p.bias is not None for p in (qwen.q_proj, qwen.k_proj, qwen.v_proj, qwen.out_proj)] == [True] * 3 + [False]


def test_rmsnorm_and_swiglu_compute_their_formulas():
    torch.manual_seed(0)
    model = build_model(tiny(**LLAMA)).double()
    block, x = model.layers[0], torch.randn(2, 5, 32, dtype=torch.float64)
    norm = block.norm1
    expected = norm.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)
    ffn = block.ffn
    swiglu = ffn.down(F.silu(ffn.gate(x)) * ffn.up(x))
    print(f"rmsnorm {(norm(x) - expected).abs().max():.1e}, swiglu {(ffn(x) - swiglu).abs().max():.1e}")
    assert torch.allclose(norm(x), expected, atol=1e-14) and torch.allclose(ffn(x), swiglu, atol=1e-14)


def test_rotary_scores_depend_on_the_distance_alone():
    torch.manual_seed(0)
    q, k = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    inv_freq = families.rope_frequencies(FamilyConfig(n_head=1, d_model=16, rope_theta=100.0))
    cos, sin = families.rotary_angles(torch.arange(40), inv_freq, torch.float64)
    score = lambda i, j: families.rotate(q, cos[i], sin[i]) @ families.rotate(k, cos[j], sin[j])
    assert abs(score(7, 3) - score(36, 32)) < 1e-12 and abs(score(7, 3) - score(7, 4)) > 1e-3


KINDS = ["softmax", "t2r", "elu", "rfa"]
SWITCHES = {"gqa": dict(n_kv_head=2), "rope": dict(rope_theta=500.0, scale_embedding=False), "llama": LLAMA,
            "mqa": {**LLAMA, "n_kv_head": 1}}


def model_of(kind: str, switches: dict, **extra) -> TransformerLM:
    torch.manual_seed(0)
    teacher = build_model(tiny(**switches, **extra)).double().eval()
    return teacher if kind == "softmax" else convert(teacher, kind, 8).eval()


@pytest.mark.parametrize("switches", SWITCHES)
@pytest.mark.parametrize("kind", KINDS)
def test_the_recurrent_step_equals_the_parallel_forms(kind, switches):
    model, tokens = model_of(kind, SWITCHES[switches]), torch.randint(0, 50, (3, 11))
    parallel = model(tokens)  # chunked: chunks of 4
    quadratic = model_of(kind, SWITCHES[switches], chunk_size=0)(tokens)
    state, steps = model.init_state(3), []
    for t in range(tokens.shape[1]):
        logits, state = model.step(tokens[:, t], state)
        steps.append(logits)
    steps = torch.stack(steps, 1)
    print(f"{kind} {switches}: |step - chunked| {(steps - parallel).abs().max():.1e}, "
          f"|quadratic - chunked| {(quadratic - parallel).abs().max():.1e}")
    assert torch.allclose(steps, parallel, atol=1e-10) and torch.allclose(quadratic, parallel, atol=1e-10)


def as_multi_head(model: TransformerLM) -> TransformerLM:
    """The same model with every key/value head (and a linear layer's feature map) repeated for each query head of
    its group: plain multi-head attention, the reference grouped-query attention must equal."""
    config = model.config
    group = config.n_head // config.n_kv_head
    wide = type(model)(FamilyConfig(**{**config.to_dict(), "n_kv_head": 0})).double().eval()
    state = {}
    for name, tensor in model.state_dict().items():
        if name.endswith(("k_proj.weight", "v_proj.weight", "k_proj.bias", "v_proj.bias")):
            tensor = tensor.view(config.n_kv_head, -1, *tensor.shape[1:]).repeat_interleave(group, 0).flatten(0, 1)
        elif "feature_map" in name:
            tensor = tensor.repeat_interleave(group, 0)
        state[name] = tensor
    wide.load_state_dict(state)
    return wide


@pytest.mark.parametrize("kind", KINDS)
def test_grouped_query_attention_is_multi_head_attention_with_its_kv_heads_repeated(kind):
    model, tokens = model_of(kind, SWITCHES["llama"]), torch.randint(0, 50, (2, 9))
    if kind == "rfa":  # the random projections too, drawn per key/value head
        for layer in model.layers:
            layer.self_attn.feature_map.omega.normal_()
    wide = as_multi_head(model)
    difference = (model(tokens) - wide(tokens)).abs().max()
    print(f"{kind}: grouped-query against multi-head {difference:.1e}")
    assert difference < 1e-12


@pytest.mark.parametrize("kind", ["softmax", "t2r"])
def test_a_grouped_query_state_holds_the_key_value_heads(kind):
    model = model_of(kind, SWITCHES["gqa"])
    state = model.init_state(1)
    for t in range(5):
        _, state = model.step(torch.tensor([t]), state)
    cache = 2 * 2 * 2 * 16 * 8 * 8  # layers x (k and v) x key/value heads x 16 tokens (its capacity) x d x 8 bytes
    t2r_state = 2 * 2 * 8 * (8 + 1) * 8  # layers x key/value heads x k x (d + 1) x 8 bytes, at any length
    expected = cache if kind == "softmax" else t2r_state
    assert state_bytes(state) == expected


def test_fold_merges_a_grouped_feature_map_into_every_query_head():
    model, tokens = model_of("t2r", SWITCHES["gqa"]), torch.randint(0, 50, (2, 9))
    folded = fold(model)
    assert is_folded(folded) and (folded(tokens) - model(tokens)).abs().max() < 1e-12


def test_with_rotary_positions_nothing_folds():
    model, tokens = model_of("t2r", SWITCHES["rope"]), torch.randint(0, 50, (2, 9))
    folded = fold(model)
    assert not is_folded(folded) and torch.equal(folded(tokens), model(tokens))


@pytest.mark.parametrize("switches, message", [
    (dict(norm="batchnorm"), "norm='batchnorm': choose one of layernorm, rmsnorm"),
    (dict(n_kv_head=3), "n_kv_head=3 must divide n_head=4"),
    (dict(rope_theta=10.0, max_positions=64), "rotary positions (rope_theta > 0) are a language model's only"),
    (dict(rope_theta=10.0, rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_scaling={'rope_type': 'yarn'"),
    (dict(n_kv_head=2, n_encoder_layer=1), "the checkpoint families are language models"),
])
def test_a_switch_that_cannot_be_is_one_line(switches, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)").replace("'", ".")
                       .replace("[", r"\[").replace("{", r"\{")) as error:
        tiny(**switches)
    assert "\n" not in str(error.value)


def test_a_window_hybrid_with_grouped_query_heads_is_one_line():
    with pytest.raises(ValueError, match="^the sliding-window hybrid takes one key/value head per query head"):
        WindowConfig(**tiny(n_kv_head=2).to_dict(), window=4)


def test_llama3_frequencies_keep_the_short_waves_and_stretch_the_long_ones():
    scaling = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64)
    plain = families.rope_frequencies(FamilyConfig(n_head=1, d_model=32, rope_theta=10_000.0))
    stretched = families.rope_frequencies(FamilyConfig(n_head=1, d_model=32, rope_theta=10_000.0, rope_scaling=scaling))
    wavelength = 2 * math.pi / plain
    short, long = wavelength < 64 / 4, wavelength > 64 / 1
    assert torch.equal(stretched[short], plain[short]) and torch.allclose(stretched[long], plain[long] / 8)
    assert short.any() and long.any() and (~short & ~long).any()


@pytest.mark.parametrize("switches", ["rope", "llama-mha"])
def test_the_window_hybrid_steps_as_it_runs_in_parallel_under_the_switches(switches):
    torch.manual_seed(0)
    config = {**LLAMA, "n_kv_head": 0} if switches == "llama-mha" else SWITCHES["rope"]
    model = convert_to_window(build_model(tiny(**config)).double(), 3, "t2r", feature_size=8).eval()
    tokens = torch.randint(0, 50, (2, 10))
    state, steps = model.init_state(2), []
    for t in range(tokens.shape[1]):
        logits, state = model.step(tokens[:, t], state)
        steps.append(logits)
    assert (torch.stack(steps, 1) - model(tokens)).abs().max() < 1e-10


def test_attention_transfer_passes_the_teachers_output_on_under_the_switches():
    from after_t2r import attention_transfer
    torch.manual_seed(0)
    teacher = build_model(tiny(**LLAMA)).double().eval()
    student, tokens = convert(teacher, "t2r", 8), torch.randint(0, 50, (2, 9))
    errors, logits = attention_transfer(student, tokens)
    assert errors.shape == (2,) and (errors > 0).all() and (logits - teacher(tokens)).abs().max() < 1e-12



def training_estimate_and_saved(ffn: str) -> tuple:
    """support/job.py's activation bytes for a step of 2 x 16 tokens, and the bytes autograd saves for it."""
    from support.job import training_bytes
    model, tokens, saved = build_model(tiny(**{**LLAMA, "ffn": ffn})), torch.randint(0, 50, (2, 16)), []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel() * t.element_size()) or t,
                                                  lambda t: t):
        model(tokens)[0].logsumexp(-1).sum().backward()
    estimate = training_bytes(model, tokens.numel(), element=4)[1]
    print(f"{ffn}: estimate {estimate:,} bytes, autograd saved {sum(saved):,}")
    return estimate, sum(saved)


@pytest.mark.parametrize("ffn", ["mlp", "swiglu"])
def test_the_training_memory_estimate_stays_below_what_backward_keeps(ffn):
    """A run that cannot fit is refused from an estimate that must be low, never high, yet not far off."""
    estimate, saved = training_estimate_and_saved(ffn)
    assert 0.3 * saved < estimate <= saved


def test_the_training_memory_estimate_counts_swiglus_third_map():
    (mlp, mlp_saved), (swiglu, swiglu_saved) = map(training_estimate_and_saved, ("mlp", "swiglu"))
    assert 0 < swiglu - mlp <= swiglu_saved - mlp_saved
