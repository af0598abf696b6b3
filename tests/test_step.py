"""t2r.py's recurrent step (`model.step`, S and z apart) and the fast one generate.py, translate.py and bench.py run
(support/fast_step.py: unrolled, [S | z] fused): the logits of one parallel pass at every position, in float64, for
every attention kind and model switch, and the fast step's within a stated tolerance of `model.step`'s; the
translator's decodings against the parallel form; the path a CUDA graph records (a position tensor), the compiled layers
without graph breaks, and CUDA graphs where CUDA exists."""

import subprocess
import sys
import time

import pytest
import torch

from conftest import EVENT_TIMEOUT, ROOT, report, tiny_translator
from support.runtime import decoding_kernels
from layers.states import state_bytes
from sru import SRUConfig, SRUppLM
from support.configs import build_model, config_of
from support.fast_step import CapturedStep, FlatStep, eager_decoder
from t2r import fold

LM_CASES = {
    "t2r": dict(attn="t2r"),
    "t2r folded": dict(attn="t2r", fold=True),
    "elu": dict(attn="elu"),
    "rfa": dict(attn="rfa"),
    "softmax": dict(attn="softmax"),
    "t2r window": dict(attn="t2r", window=3),
    "t2r post-norm": dict(attn="t2r", pre_norm=False),
    "softmax below t2r": dict(attn=["softmax", "t2r"], fold=True),
    "GPT-2's switches": dict(attn="t2r", max_positions=64, activation="gelu_tanh",
                             scale_embedding=False, fold=True),
    "adaptive input and softmax": dict(attn="t2r", adaptive_cutoffs=[20, 40], fold=True),
    "t2r decaying": dict(attn="t2r", decay=True),
    "elu decaying": dict(attn="elu", decay=True),
    "softmax below t2r decaying": dict(attn=["softmax", "t2r"], decay=True),
    "t2r short conv": dict(attn="t2r", short_conv=3),
    "t2r short conv folded": dict(attn="t2r", short_conv=3, fold=True),
    "softmax below t2r short conv decaying": dict(attn=["softmax", "t2r"], short_conv=4, decay=True),
}


def tiny_lm(attn="t2r", fold_it=False, dtype=torch.float64, **switches):
    torch.manual_seed(0)
    config = config_of(dict(vocab_size=60, n_layer=2, n_head=2, d_model=16, d_ff=32, dropout=0.0, attn=attn,
                            feature_size=4, **switches))
    model = build_model(config).to(dtype).eval()  # with a window or GPT-2's switches: its subclass
    with torch.no_grad():  # a short convolution starts as the identity: taps on the past inputs, so the shift counts
        for name, p in model.named_parameters():
            p.add_(0.3 * torch.randn_like(p) if ".conv." in name else 0)
    return fold(model) if fold_it else model


def step_against(reference, model, tokens, state=None):
    """Max |logits difference| of model.step over the columns of tokens (B, T) against reference (B, T, V)."""
    state = state if state is not None else model.init_state(tokens.shape[0])
    diff = 0.0
    for t in range(tokens.shape[1]):
        logits, state = model.step(tokens[:, t], state)
        diff = max(diff, (reference[:, t] - logits).abs().max().item())
    return diff, state


def parallel(model, *inputs):
    with torch.no_grad():
        return model(*inputs)


@pytest.mark.parametrize("case", LM_CASES)
def test_the_step_equals_the_parallel_form(case):
    switches = dict(LM_CASES[case])
    model = tiny_lm(fold_it=switches.pop("fold", False), **switches)
    tokens = torch.randint(0, 60, (3, 40))
    diff, _ = step_against(parallel(model, tokens), model, tokens)
    assert report(f"{case}: recurrent step - parallel form, logits over 40 positions", diff) < 1e-9


@pytest.mark.parametrize("kind", ["t2r", "softmax", "elu"])
def test_the_step_of_a_translator_equals_the_parallel_form(kind):
    model = tiny_translator(kind)
    model = fold(model) if kind == "t2r" else model
    src = torch.randint(1, 23, (3, 7))
    src[0, 5:] = 0  # padding, masked out of the cross attention
    tgt = torch.randint(0, 23, (3, 12))
    diff, _ = step_against(parallel(model, src, tgt), model, tgt, model.init_state(src))
    assert report(f"translator {kind}: recurrent step - parallel form", diff) < 1e-12


@pytest.mark.parametrize("attn", ["t2r", "softmax"])
def test_each_sequence_steps_with_the_weights_of_its_init_state(attn):
    """The fast step stacks W_q, W_k, W_v for one product at init_state: weights loaded between two sequences are the
    second one's."""
    model, other = tiny_lm(attn), tiny_lm(attn)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    tokens, flat = torch.randint(0, 60, (2, 10)), FlatStep(model)
    step_against(parallel(model, tokens), flat, tokens)
    model.load_state_dict(other.state_dict())
    diff, _ = step_against(parallel(other, tokens), flat, tokens)
    assert report(f"{attn}: second sequence after load_state_dict - parallel form of the new weights", diff) < 1e-9


def test_a_model_folded_mid_sequence_steps_on_with_its_new_projections():
    """fold replaces W_q and W_k (Eq. 8) and keeps the outputs, so a state carries over; the folded copy's first step
    restacks its projections instead of using the ones stacked before."""
    model, tokens = tiny_lm(), torch.randint(0, 60, (2, 12))
    reference = parallel(model, tokens)
    state = model.init_state(2)
    first, state = step_against(reference[:, :6], model, tokens[:, :6], state)
    then, _ = step_against(reference[:, 6:], fold(model), tokens[:, 6:], state)
    assert report("unfolded then folded steps - parallel form", max(first, then)) < 1e-9


def test_a_position_tensor_gives_the_same_logits():
    """What CapturedStep records: the position a tensor on the device, incremented in place by the step."""
    model = tiny_lm(fold_it=True)
    tokens = torch.randint(0, 60, (2, 30))
    state = model.init_state(2)
    state["pos"] = torch.zeros((), dtype=torch.long)
    diff, state = step_against(parallel(model, tokens), model, tokens, state)
    assert report("position tensor: recurrent step - parallel form", diff) < 1e-12
    assert int(state["pos"]) == 30


# The fast step generate.py runs (support/fast_step.py) against t2r.py's: the same arithmetic in another order
# (q, k, v from one stacked product, Eqs. 6-7 on [S | z] at once), so not the same bits. In float64 (unit roundoff
# 1.1e-16) the logits, O(1), of 40 steps through 2 layers differ by rounding alone, ~1e-15 measured; 1e-12 leaves
# room for that and none for a wrong term (a missing position or weight moves them by 1e-3 and more).
FAST_TOLERANCE = 1e-12
FLAT_CASES = list(LM_CASES)  # families.py's models too, where they have no rotary positions or grouped heads


def model_step_logits(model, tokens):  # (B, T) -> model.step's logits (B, T, V), from a fresh state
    state = model.init_state(tokens.shape[0])
    return torch.stack([model.step(t, state)[0] for t in tokens.T], 1)


@pytest.mark.parametrize("case", FLAT_CASES)
def test_the_flat_step_gives_the_model_steps_logits(case):
    switches = dict(LM_CASES[case])
    model = tiny_lm(fold_it=switches.pop("fold", False), **switches)
    tokens = torch.randint(0, 60, (3, 40))
    diff, state = step_against(model_step_logits(model, tokens), FlatStep(model), tokens)
    assert report(f"{case}: flat step - model.step, float64 logits over 40 positions", diff) < FAST_TOLERANCE
    assert state["pos"] == 40


@pytest.mark.parametrize("kind, switches", [("t2r", {}), ("softmax", {}), ("elu", {}), ("t2r", dict(decay=True)),
                                            ("t2r", dict(short_conv=3))])
def test_the_flat_step_of_a_translator_gives_the_model_steps_logits(kind, switches):
    model = tiny_translator(kind, **switches)
    model = fold(model) if kind == "t2r" else model  # a decaying layer does not fold (decay.py)
    src, tgt = torch.randint(1, 23, (3, 7)), torch.randint(0, 23, (3, 12))
    src[0, 5:] = 0
    state = model.init_state(src)
    reference = torch.stack([model.step(t, state)[0] for t in tgt.T], 1)
    flat = FlatStep(model)
    diff, _ = step_against(reference, flat, tgt, flat.init_state(src))
    assert report(f"translator {kind} {switches}: flat step - model.step, float64", diff) < FAST_TOLERANCE


@pytest.mark.parametrize("case", ["t2r folded", "elu", "t2r decaying"])
def test_the_flat_step_of_bf16_weights_sums_in_float32(case):
    """bf16 weights: the fast step's logits within the bf16 tolerance (below) of the float64 model's parallel form,
    as model.step's are, its [S | z] in float32."""
    switches = dict(LM_CASES[case])
    fold_it = switches.pop("fold", False)
    model, exact = (tiny_lm(fold_it=fold_it, dtype=dtype, **switches) for dtype in (torch.bfloat16, torch.float64))
    tokens = torch.randint(0, 60, (2, 20))
    diff, state = step_against(parallel(exact, tokens), FlatStep(model), tokens)
    assert state["layers"][0]["self"]["Sz"].dtype == torch.float32
    assert report(f"{case} bf16: flat step - float64 parallel form", diff) < BF16_TOLERANCE[case]


@pytest.mark.parametrize("fold_it", [False, True])
def test_the_flat_step_under_autocast_keeps_its_sums_in_float32(fold_it):
    """float32 weights under bf16 autocast: q, k, v come out in bf16, the sums stay float32, W_o runs under autocast;
    the logits within the bf16 tolerance of the float64 parallel form (bf16's 8 bits, ~0.03 measured, as model.step)."""
    model, exact = (tiny_lm(fold_it=fold_it, dtype=dtype) for dtype in (torch.float32, torch.float64))
    tokens = torch.randint(0, 60, (2, 15))
    with torch.autocast("cpu", torch.bfloat16):
        diff, state = step_against(parallel(exact, tokens), FlatStep(model), tokens)
    assert state["layers"][0]["self"]["Sz"].dtype == torch.float32
    assert report(f"t2r {'folded ' if fold_it else ''}under autocast: flat step - float64 parallel form", diff) < 0.1


@pytest.mark.parametrize("case", ["t2r folded", "softmax below t2r"])
def test_the_model_prefill_reads_a_prompt_into_the_flat_steps_state(case):
    """generate.py reads the prompt with the model's prefill (on S and z) into the fast step's state ([S | z]; S and z
    are views of it), then steps it: the logits of one parallel pass."""
    switches = dict(LM_CASES[case])
    model = tiny_lm(fold_it=switches.pop("fold", False), **switches)
    tokens, flat = torch.randint(0, 60, (2, 30)), FlatStep(model)
    reference, state = parallel(model, tokens), flat.init_state(2)
    logits, state = model.prefill(tokens[:, :20], state)
    diff, state = step_against(reference[:, 20:], flat, tokens[:, 20:], state)
    diff = max(diff, (logits - reference[:, 19]).abs().max().item())
    assert report(f"{case}: model prefill then flat steps - parallel form, float64", diff) < 1e-12


def test_the_flat_steps_state_counts_its_bytes_once():
    """The fast state holds [S | z] and S and z as views of it: state_bytes counts the views' bytes once."""
    model = tiny_lm(attn=["softmax", "t2r"], fold_it=True)
    assert state_bytes(FlatStep(model).init_state(3)) == state_bytes(model.init_state(3)) > 0


@pytest.mark.parametrize("kind", ["t2r", "softmax", "elu"])
def test_the_flat_step_of_a_translator_equals_the_parallel_form(kind):
    model = tiny_translator(kind)
    model = fold(model) if kind == "t2r" else model
    src, tgt = torch.randint(1, 23, (3, 7)), torch.randint(0, 23, (3, 12))
    src[0, 5:] = 0
    flat = FlatStep(model)
    diff, _ = step_against(parallel(model, src, tgt), flat, tgt, flat.init_state(src))
    assert report(f"translator {kind}: flat step - parallel form", diff) < 1e-12


@pytest.mark.parametrize("attn", ["t2r", "softmax"])
@pytest.mark.parametrize("model_kind", ["LM", "translator"])
def test_the_flat_step_calls_no_module_of_t2r_py_but_the_embedding(attn, model_kind):
    """What makes it faster: of t2r.py's modules only the embedding (and its table) is called; the layers, the
    translator's cross attention and the head are tensor functions on the same weights."""
    model = tiny_lm(attn, fold_it=attn == "t2r") if model_kind == "LM" else tiny_translator(attn)
    flat = FlatStep(fold(model) if attn == "t2r" and model_kind != "LM" else model)
    state = flat.init_state(1 if model_kind == "LM" else torch.randint(1, 23, (1, 5)))
    assert modules_called(flat, state) == ["Embedding", "Embedding"]  # layers/embedding.py's, and its nn.Embedding


@pytest.mark.parametrize("switches", [dict(decay=True), dict(short_conv=3), dict(short_conv=3, decay=True)])
def test_the_flat_step_of_a_decaying_state_or_a_convolution_calls_no_module_but_the_embedding(switches):
    flat = FlatStep(tiny_lm(**switches))  # a family's model (decay.py's, after_t2r.py's) without rotary positions
    assert modules_called(flat, flat.init_state(1)) == ["Embedding", "FamilyEmbedding"]


def modules_called(flat, state) -> list:  # the type names of the modules one step calls
    called = []
    hook = torch.nn.modules.module.register_module_forward_hook(lambda module, *_: called.append(type(module).__name__))
    try:
        flat.step(torch.zeros(1, dtype=torch.long), state)
    finally:
        hook.remove()
    return sorted(called)


@pytest.mark.parametrize("switches", [dict(norm="rmsnorm", ffn="swiglu", n_kv_head=1, rope_theta=10_000.0),
                                      dict(rope_theta=10_000.0), dict(n_kv_head=1),
                                      dict(rope_theta=10_000.0, decay=True), dict(rope_theta=10_000.0, window=3)])
def test_a_family_model_with_rotary_positions_or_grouped_heads_decodes_with_its_own_step(switches):
    model = tiny_lm(**switches)  # its step passes each layer the position's rotation (families.py)
    assert eager_decoder(model) is model
    with pytest.raises(ValueError, match="steps its own way"):
        FlatStep(model)


def test_sru_decodes_with_its_own_step():
    """SRU++ is no t2r.py model: the fast step says so in one line (it raised AttributeError, no step_layers)."""
    model = SRUppLM(SRUConfig(vocab_size=29, n_layer=2, d_model=16, dropout=0.0)).eval()
    assert eager_decoder(model) is model
    with pytest.raises(ValueError, match="SRUppLM steps its own way"):
        FlatStep(model)


def test_the_flat_step_refuses_a_model_in_training_mode():
    with pytest.raises(ValueError, match="eval"):
        FlatStep(tiny_lm().train())
    model = tiny_lm()
    flat, state = FlatStep(model), model.init_state(1)
    model.train()  # after it was built: dropout would apply to the embedding alone
    with pytest.raises(ValueError, match="eval"):
        flat.step(torch.zeros(1, dtype=torch.long), state)


def test_the_compiled_layers_have_no_graph_break():
    """torch.compile(fullgraph=True) refuses a graph break; the eager backend traces without compiling C++."""
    model = tiny_lm(fold_it=True, dtype=torch.float32)
    tokens = torch.randint(0, 60, (2, 12))
    reference = parallel(model, tokens)
    model.step_layers = torch.compile(model.step_layers, backend="eager", fullgraph=True)
    diff, _ = step_against(reference, model, tokens)
    assert report("traced step - parallel form (float32)", diff) < 1e-5


def test_learned_positions_end_where_the_table_ends():
    """A step past the learned table is refused, not read out of bounds."""
    model = tiny_lm(max_positions=8, fold_it=True)
    state = model.init_state(1)
    for _ in range(8):
        model.step(torch.tensor([1]), state)
    with pytest.raises(ValueError, match="position 8 is past the 8 learned positions"):
        model.step(torch.tensor([1]), state)


def held_bytes(model) -> int:
    """Bytes of every tensor a model holds: parameters, buffers, and any tensor kept on a module between calls."""
    held = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    for module in model.modules():
        for value in vars(module).values():
            for t in (value if isinstance(value, tuple) else (value,)):
                if torch.is_tensor(t):
                    held[id(t)] = t
    return sum(t.numel() * t.element_size() for t in held.values())


def test_generation_memory_does_not_grow_with_the_position():
    """Nothing grows with the tokens generated: after 5000 steps the model and the state hold what they held
    after 10 (a table of positions kept for the steps would grow)."""
    model = tiny_lm(fold_it=True, dtype=torch.float32)
    state = model.init_state(1)
    for _ in range(10):
        model.step(torch.tensor([1]), state)
    held, state_size = held_bytes(model), state_bytes(state)
    for _ in range(4990):
        model.step(torch.tensor([1]), state)
    assert (held_bytes(model), state_bytes(state)) == (held, state_size)


def test_decoding_turns_cudnn_attention_off_and_importing_t2r_does_not():
    """cuDNN's attention plans every new shape anew, and decoding makes a new key length at every token: the decoding
    scripts switch it off (runtime.decoding_kernels), for their process only; importing t2r.py switches nothing."""
    code = ("import torch, t2r; print(torch.backends.cuda.cudnn_sdp_enabled()); "
            "from support.runtime import decoding_kernels; decoding_kernels(); b = torch.backends.cuda; "
            "print(b.cudnn_sdp_enabled(), b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=EVENT_TIMEOUT)
    assert out.stdout.split() == ["True", "False", "True", "True"], out.stderr


@pytest.mark.parametrize("attn, switches, recordable", [("t2r", {}, True), ("elu", {}, True), ("softmax", {}, False),
                                                         ("t2r", dict(window=3), False),
                                                         ("t2r", dict(decay=True), True)])
def test_what_a_cuda_graph_may_record(monkeypatch, attn, switches, recordable):
    """Only a constant-size state without a window can be recorded: the check CapturedStep runs after its device's
    (here the device check is passed by pretending the model is on CUDA)."""
    model = tiny_lm(attn=attn, fold_it=attn == "t2r" and not switches, **switches)
    monkeypatch.setattr(type(next(model.parameters())), "device", property(lambda self: torch.device("cuda")))
    if recordable:
        assert CapturedStep(model, 16).length == 16
    else:
        with pytest.raises(ValueError, match="constant-size state"):
            CapturedStep(model, 16)


def test_the_step_refuses_a_model_in_training_mode():
    """The recurrent form generates: in training mode its dropout would apply, silently."""
    model = tiny_lm().train()
    with pytest.raises(ValueError, match="model.eval"):
        model.step(torch.tensor([1]), model.init_state(1))


def test_cuda_graphs_refuse_a_cpu_model():
    with pytest.raises(ValueError, match="CUDA device"):
        CapturedStep(tiny_lm(fold_it=True), 16)


# -----------------------------------------------------------------------------
# bf16 weights (bench.py --dtype bfloat16) keep the state in float32; CUDA: the graph replays the eager step

# bf16 against float64 weights, max |logit difference|: t2r, elu, window 0.02-0.03 measured. Not rfa: its random
# projections rounded to bf16 move sin(Wx) by ~1e-2, which the |denominator| rule can amplify (1.2-5.6 measured)
BF16_TOLERANCE = {"t2r": 0.1, "t2r folded": 0.1, "elu": 0.1, "t2r window": 0.1, "t2r decaying": 0.1}


@pytest.mark.parametrize("case", BF16_TOLERANCE)
def test_bf16_weights_step_in_a_float32_state(case):
    switches = dict(LM_CASES[case])
    fold_it = switches.pop("fold", False)
    model, exact = (tiny_lm(fold_it=fold_it, dtype=dtype, **switches) for dtype in (torch.bfloat16, torch.float64))
    tokens = torch.randint(0, 60, (3, 40))
    diff, state = step_against(parallel(exact, tokens), model, tokens)  # the bf16 model against float64 weights
    assert state["layers"][0]["self"]["S"].dtype == state["layers"][0]["self"]["z"].dtype == torch.float32
    assert report(f"{case}: bf16 step - float64 parallel form, logits", diff) < BF16_TOLERANCE[case]

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
@pytest.mark.parametrize("case", ["t2r folded", "t2r decaying", "GPT-2's switches"])
def test_cuda_graph_replays_the_eager_step(case):
    switches = dict(LM_CASES[case])
    model = tiny_lm(fold_it=switches.pop("fold", False), dtype=torch.float32, **switches).cuda()
    tokens = torch.randint(0, 60, (4, 50), device="cuda")
    captured = CapturedStep(model, 50)
    for _ in range(2):  # a second init_state starts again from position 0
        diff, _ = step_against(parallel(model, tokens), captured, tokens)
        assert report(f"{case}: CUDA graph - parallel form", diff) < 1e-5
    with pytest.raises(ValueError, match="positions end at 50"):
        captured.step(tokens[:, 0], captured.state)


@cuda
def test_cuda_graphs_refuse_a_growing_kv_cache():
    with pytest.raises(ValueError, match="constant-size state"):
        CapturedStep(tiny_lm(attn="softmax", dtype=torch.float32).cuda(), 16)


@cuda
def test_bf16_step_keeps_a_float32_state_on_cuda():
    model = tiny_lm(fold_it=True, dtype=torch.bfloat16).cuda()
    tokens = torch.randint(0, 60, (4, 64), device="cuda")
    diff, state = step_against(parallel(model, tokens), model, tokens)
    assert state["layers"][0]["self"]["S"].dtype == torch.float32
    assert report("bf16 on CUDA: recurrent step - parallel form", diff) < 0.1


@cuda
def test_bf16_kv_cache_decoding_does_not_stall():
    """A KV cache has a new key length at every token. In bf16 on an H100, SDPA's cuDNN kernel built a plan for
    each one and 8192 tokens did not finish in 220 s; the decoding scripts turn that kernel off. 1024 steps: seconds."""
    decoding_kernels()
    model = tiny_lm(attn="softmax", dtype=torch.bfloat16).cuda()
    tokens, state, start = torch.zeros(16, dtype=torch.long, device="cuda"), model.init_state(16), time.perf_counter()
    for _ in range(1024):
        logits, state = model.step(tokens, state)
        tokens = logits.argmax(-1)
    torch.cuda.synchronize()
    assert report("seconds for 1024 bf16 KV-cache steps, batch 16", time.perf_counter() - start) < 60
