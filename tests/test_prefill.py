"""Prefill: a prompt read in one parallel pass, from a state and into it (t2r.py's `prefill`), against the reference,
a step a token (`prefill_by_steps`): the last position's logits, the state after it and the steps that follow, in
float64 for every kind and switch; a prefill continued from a state against one prefill of the whole; pieces of any
size; a translator's forced target prefix; float32 against the float64 truth.

    python -m pytest -q -s tests/test_prefill.py
"""

import copy

import pytest
import torch

from after_t2r import ConvConfig, ConvLM
from conftest import report, tiny_translator
from support.configs import build_model, config_of
from sru import SRUConfig, SRUppLM
from support.inference import prefill_by_steps
from t2r import fold

# float64 sums of up to 30 products of O(1) numbers, in another order than the steps' (chunks, one matrix product for
# the state): both are within a few ulps (1e-16) of the exact sums, 1e-10 leaves room for the layers that follow
TIGHT = 1e-10
LLAMA = dict(norm="rmsnorm", ffn="swiglu", bias="none", n_head=4, n_kv_head=2, rope_theta=1000.0,
             scale_embedding=False)  # 2 query heads a key/value head
LM_CASES = {
    "t2r": dict(attn="t2r"),
    "t2r folded": dict(attn="t2r", fold=True),
    "t2r quadratic (chunk_size 0)": dict(attn="t2r", chunk_size=0),
    "elu": dict(attn="elu"),
    "rfa": dict(attn="rfa"),
    "softmax": dict(attn="softmax"),
    "softmax below t2r": dict(attn=["softmax", "t2r"], fold=True),
    "t2r post-norm": dict(attn="t2r", pre_norm=False),
    "adaptive input and softmax": dict(attn="t2r", adaptive_cutoffs=[20, 40], fold=True),
    # families.py's: the rotary angles of the prompt's positions, grouped heads, learned positions
    "Llama's switches (rotary, grouped heads)": dict(attn="t2r", **LLAMA),
    "Llama's switches, softmax": dict(attn="softmax", **LLAMA),
    "Llama's switches, softmax below t2r": dict(attn=["softmax", "t2r"], **LLAMA),
    "GPT-2's switches": dict(attn="t2r", max_positions=64, activation="gelu_tanh", scale_embedding=False, fold=True),
    # the sliding-window hybrid (after_t2r.py): its ring of the last W keys and values, S and z of those before
    "t2r window": dict(attn="t2r", window=3),
    "t2r window, rotary": dict(attn="t2r", window=3, **{**LLAMA, "n_kv_head": 0}),
}


def tiny_lm(attn="t2r", fold_it=False, dtype=torch.float64, **switches):
    torch.manual_seed(0)
    config = config_of({**dict(vocab_size=60, n_layer=2, n_head=2, d_model=16, d_ff=32, dropout=0.0, attn=attn,
                                feature_size=4, chunk_size=4), **switches})
    model = build_model(config).to(dtype).eval()  # with a window or a family's switches: its subclass
    return fold(model) if fold_it else model


def lm(case: str, dtype=torch.float64):
    switches = dict(LM_CASES[case])
    return tiny_lm(fold_it=switches.pop("fold", False), dtype=dtype, **switches)


def steps(model, tokens, state):
    """The logits (B, T, V) of model.step over tokens (B, T)."""
    return torch.stack([model.step(tokens[:, t], state)[0] for t in range(tokens.shape[1])], 1)


def largest_difference(a, b) -> float:
    """Max |a - b| over two states' tensors (the same structure; a KV cache compared up to its length)."""
    if torch.is_tensor(a) and a.dtype == torch.bool:  # a source's mask
        return 0.0 if torch.equal(a, b) else float("inf")
    if torch.is_tensor(a):
        return (a - b).abs().max().item() if a.numel() else 0.0
    if isinstance(a, dict):
        if "length" in a:  # a KV cache: its capacity beyond the length holds nothing (the rest of the state is kept)
            assert a["length"] == b["length"]
            a, b = ({k: v[..., :s["length"], :] if k in ("k", "v") else v for k, v in s.items()} for s in (a, b))
        return max((largest_difference(a[k], b[k]) for k in a if not isinstance(a[k], (int, float))), default=0.0)
    if isinstance(a, list):
        return max((largest_difference(x, y) for x, y in zip(a, b)), default=0.0)
    assert a == b
    return 0.0


@pytest.mark.parametrize("case", LM_CASES)
def test_prefill_then_steps_equals_a_step_a_token(case):
    model = lm(case)
    tokens = torch.randint(0, 60, (3, 19))  # 19: chunks of 4 and a partial one
    prompt, rest = tokens[:, :11], tokens[:, 11:]
    reference = model.init_state(3)
    expected = steps(model, tokens, reference)
    state = model.init_state(3)
    logits, state = model.prefill(prompt, state)
    after = steps(model, rest, state)
    diff = max((logits - expected[:, 10]).abs().max().item(), (after - expected[:, 11:]).abs().max().item(),
               largest_difference(state, reference))
    assert report(f"{case}: prefill of 11 then 8 steps - 19 steps (logits, state)", diff) < TIGHT


@pytest.mark.parametrize("case", ["t2r", "t2r folded", "softmax", "softmax below t2r", "rfa",
                                  "Llama's switches (rotary, grouped heads)", "Llama's switches, softmax", "t2r window",
                                  "t2r window, rotary"])
@pytest.mark.parametrize("split", [1, 4, 7])
def test_a_prefill_continued_from_a_state_equals_one_prefill_of_the_whole(case, split):
    model = lm(case)
    tokens = torch.randint(0, 60, (2, 13))
    whole_logits, whole = model.prefill(tokens, model.init_state(2))
    state = model.init_state(2)
    model.prefill(tokens[:, :split], state)
    logits, state = model.prefill(tokens[:, split:], state)
    diff = max((logits - whole_logits).abs().max().item(), largest_difference(state, whole))
    assert report(f"{case}: prefill of {split} then {13 - split} - prefill of 13", diff) < TIGHT


@pytest.mark.parametrize("case", ["t2r", "rfa", "Llama's switches (rotary, grouped heads)", "t2r window"])
@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_a_long_prompt_in_pieces_equals_it_at_once(case, chunk):
    model = lm(case)
    tokens = torch.randint(0, 60, (2, 23))
    at_once, state_at_once = model.prefill(tokens, model.init_state(2), chunk=23)
    logits, state = model.prefill(tokens, model.init_state(2), chunk=chunk)
    diff = max((logits - at_once).abs().max().item(), largest_difference(state, state_at_once))
    assert report(f"{case}: prefill in pieces of {chunk} - at once", diff) < TIGHT


@pytest.mark.parametrize("kinds, piece", [("t2r", 8), (["softmax", "t2r"], 23), ("softmax", 23)])
def test_a_model_with_a_kv_cache_reads_the_prompt_at_once(kinds, piece):
    """Pieces bound the memory of a state of fixed size; a softmax layer's cache holds every position anyway, and its
    fused causal kernel is faster than a masked piece after cached positions."""
    from layers.states import prefill_piece
    assert prefill_piece(tiny_lm(attn=kinds).config, 23, 8) == piece


@pytest.mark.parametrize("model_of", [
    pytest.param(lambda: ConvLM(ConvConfig(vocab_size=60, n_layer=2, n_head=2, d_model=16, d_ff=32, attn="t2r",
                                           feature_size=4, short_conv=3, dropout=0.0)), id="short convolution"),
    pytest.param(lambda: SRUppLM(SRUConfig(vocab_size=60, n_layer=2, d_model=16, attn_every=2, dropout=0.0)),
                 id="SRU++")])
def test_the_short_convolution_and_sru_prefill_as_they_step(model_of):
    torch.manual_seed(0)
    model = model_of().double().eval()
    with torch.no_grad():  # off their initialisation: the convolution starts as the identity, SRU++'s alpha at 0
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    tokens = torch.randint(0, 60, (2, 9))
    reference = model.init_state(2)
    expected = steps(model, tokens, reference)
    state = model.init_state(2)
    model.prefill(tokens[:, :3], state)
    logits, state = model.prefill(tokens[:, 3:7], state)  # continued from a state, the convolution's window across
    after = steps(model, tokens[:, 7:], state)
    diff = max((logits - expected[:, 6]).abs().max().item(), (after - expected[:, 7:]).abs().max().item(),
               largest_difference(state, reference))
    assert report(f"{type(model).__name__}: prefill of 3, then 4, then 2 steps - 9 steps", diff) < TIGHT


@pytest.mark.parametrize("kind, window", [("t2r", 0), ("softmax", 0), ("elu", 0), ("t2r", 2)])
def test_a_translators_target_prefix_prefills_as_it_steps(kind, window):
    model = tiny_translator(kind, window=window)
    model = fold(model) if kind == "t2r" else model
    src = torch.randint(1, 23, (3, 7))
    src[0, 5:] = 0  # padding, masked out of the cross attention
    target = torch.randint(0, 23, (3, 10))
    reference = model.init_state(src)
    expected = steps(model, target, reference)
    logits, state = model.prefill(target[:, :6], model.init_state(src))
    after = steps(model, target[:, 6:], state)
    diff = max((logits - expected[:, 5]).abs().max().item(), (after - expected[:, 6:]).abs().max().item(),
               largest_difference(state, reference))
    assert report(f"translator {kind}, window {window}: prefill of 6 then 4 steps - 10 steps", diff) < TIGHT


@pytest.mark.parametrize("case", ["t2r folded", "softmax", "rfa"])
def test_a_float32_prefill_is_as_close_to_the_float64_truth_as_float32_steps(case):
    """float32 rounds each sum in its own order: prefill and steps are each held to the float64 model's logits, and
    prefill's error is at most a few times the steps' own (8x, and 1e-5 absolute: both are ~1e-6 here)."""
    model = lm(case)
    single = copy.deepcopy(model).float()
    tokens = torch.randint(0, 60, (2, 30))
    truth = steps(model, tokens, model.init_state(2))[:, -1]
    by_steps = steps(single, tokens, single.init_state(2))[:, -1].double()
    prefilled = single.prefill(tokens, single.init_state(2))[0].double()
    step_error = report(f"{case}: float32 steps - float64", (by_steps - truth).abs().max())
    prefill_error = report(f"{case}: float32 prefill - float64", (prefilled - truth).abs().max())
    assert prefill_error < max(8 * step_error, 1e-5)


@pytest.mark.parametrize("case", ["t2r folded", "softmax", "softmax below t2r",
                                  "Llama's switches (rotary, grouped heads)"])
@pytest.mark.parametrize("precision", ["bf16 weights", "float32 under bf16 autocast"])
def test_a_bf16_prefill_is_as_close_to_the_float64_truth_as_bf16_steps(case, precision):
    """bf16 keeps 8 significant bits (relative error 4e-3 a rounding): prefill and steps each round otherwise, both
    with their state in float32. Each is held to the float64 model's last logits: prefill's error at most 4x the steps'
    own, and 0.05 absolute (both are ~1e-2 here, logits of size ~1)."""
    model = lm(case)
    tokens = torch.randint(0, 60, (2, 30))
    truth = steps(model, tokens, model.init_state(2))[:, -1]
    low = copy.deepcopy(model).to(torch.bfloat16 if precision == "bf16 weights" else torch.float32)
    with torch.autocast("cpu", torch.bfloat16, enabled=precision != "bf16 weights"):
        by_steps = steps(low, tokens, low.init_state(2))[:, -1].double()
        prefilled = low.prefill(tokens, low.init_state(2))[0].double()
    step_error = report(f"{case}, {precision}: steps - float64", (by_steps - truth).abs().max())
    prefill_error = report(f"{case}, {precision}: prefill - float64", (prefilled - truth).abs().max())
    assert prefill_error < max(4 * step_error, 0.05)


def test_prefill_by_steps_is_the_reference_every_prefill_is_held_to():
    model = lm("t2r")
    tokens = torch.randint(0, 60, (2, 6))
    logits, state = prefill_by_steps(model, tokens, model.init_state(2))
    assert torch.equal(logits, steps(model, tokens, model.init_state(2))[:, -1]) and state["pos"] == 6


def test_prefill_refuses_a_model_in_training_mode():
    model = lm("t2r").train()
    with pytest.raises(ValueError, match="call model.eval"):
        model.prefill(torch.zeros(1, 3, dtype=torch.long), model.init_state(1))


def test_the_first_token_experiment_times_every_model_against_transformers(capsys):
    """experiments/first_token.py's pipeline at toy lengths: transformers' Llama and ours on its weights, a row per
    model and length with its ratio to transformers' time (the figures themselves are the machine's)."""
    pytest.importorskip("transformers")
    from experiments import first_token
    first_token.main(["--quick", "--families", "llama", "--only", "transformers,t2r"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| Llama |")]
    print("\n".join(rows))
    assert [row.split(" | ")[1:3] for row in rows] == [["16", "transformers"], ["16", "t2r"], ["64", "transformers"],
                                                       ["64", "t2r"]]
    assert all(row.split(" | ")[4] == "1.00x" for row in rows[::2])


def test_ours_read_transformers_weights_and_give_its_logits():
    """The models first_token.py pairs are the same model: our softmax teacher, read from transformers' folder,
    gives its logits (float32: within 1e-4 of logits of size ~1, a sum of 256 products a layer)."""
    pytest.importorskip("transformers")
    from experiments import first_token
    chosen = first_token.models("llama", 32)
    prompt = torch.randint(0, first_token.SHAPE["vocab"], (1, 20))
    with torch.no_grad():
        theirs = chosen["transformers"](prompt).logits[:, -1]
        ours, _ = chosen["softmax"].prefill(prompt, chosen["softmax"].init_state(1))
    assert report("first_token's Llama: ours - transformers, last logits", (ours - theirs).abs().max()) < 1e-4
