"""Prompts of different lengths in one batch (generate.py's generate_ragged): no padding enters any state, normaliser,
KV cache or window, so each row's greedy tokens are those of its prompt generated alone, for every kind of model and
both prefills (the model's parallel one, t2r.py's reference a step a token). Tested as flash-linear-attention's
tests/models/test_modeling_base.py::run_test_generation does: rows padded by random amounts, prefill, decode the
rest, each row against itself alone; and the padding changed, every bit the same.

    python -m pytest -q -s tests/test_ragged.py
"""

import zlib
from functools import partial

import pytest
import torch
from torch.utils._pytree import tree_flatten

import generate
from after_t2r import ConvConfig, ConvLM
from conftest import report, tiny_translator
from sru import SRUConfig, SRUppLM
from t2r import fold
from test_prefill import LLAMA, largest_difference, lm, tiny_lm
from translate import reorder_state

# A batch of 3 against batch 1, and a prompt's prefill in chunks against steps: the same float64 sums in another
# order (BLAS blocks a batch's product its own way), each within a few ulps (1e-16 relative) of the exact sums of
# O(1) numbers; 1e-10 leaves room for the layers that follow. Pads fed into a state (a scratch generate_ragged that
# stepped a row's pad slots instead of its picks, or left-padded the prompts) moved the logits by 0.025 to 18 here.
TIGHT = 1e-10
NEW_TOKENS = 4  # after the longest prompt: every row picks at least these

LM_CASES = {  # test_prefill.py's cases (tiny float64 models, chunk_size 4), and the models that prefill by steps
    "t2r": lambda: lm("t2r"),
    "t2r folded": lambda: lm("t2r folded"),
    "elu": lambda: lm("elu"),
    "rfa": lambda: lm("rfa"),
    "softmax (KV cache)": lambda: lm("softmax"),
    "softmax below t2r": lambda: lm("softmax below t2r"),
    "t2r window 3 (last 3 keys and values)": lambda: lm("t2r window"),
    # one key/value head a query's: the window takes no grouped heads
    "t2r window 3, rotary": lambda: tiny_lm("t2r", window=3, **{**LLAMA, "n_kv_head": 0}),
    "Llama's switches (rotary, grouped heads)": lambda: lm("Llama's switches (rotary, grouped heads)"),
    "Llama's switches, softmax": lambda: lm("Llama's switches, softmax"),
    "Llama's switches, softmax below t2r": lambda: lm("Llama's switches, softmax below t2r"),
    "GPT-2's switches (learned positions)": lambda: lm("GPT-2's switches"),
    "short convolution": lambda: shaken(ConvLM(ConvConfig(vocab_size=60, n_layer=2, n_head=2, d_model=16, d_ff=32,
                                                          attn="t2r", feature_size=4, chunk_size=4, short_conv=3,
                                                          dropout=0.0))),
    "SRU++": lambda: shaken(SRUppLM(SRUConfig(vocab_size=60, n_layer=2, d_model=16, attn_every=2, dropout=0.0))),
}
def shaken(model):
    """In float64, off its initialisation (the convolution starts as the identity, SRU++'s attention weight alpha at
    0: a leak into their states would not show)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model.double().eval()


PREFILLS = {  # generate_ragged's prefill of the shortest prompt: the model's, in one pass or in pieces; the reference
    "parallel": lambda model: model.prefill,
    "parallel in pieces of 3": lambda model: partial(model.prefill, chunk=3),
    "step": lambda model: None,
}
def combinations(cases, prefills) -> list:
    return [pytest.param(case, prefill, id=f"{case}-{prefill}") for case in cases for prefill in prefills]


def greedy(logits):
    return logits.argmax(-1)


def padded(prompts: list, seed: int):
    """(B, T) holding each prompt in its first tokens, then random ids in [1, 23): tokens of every vocabulary here,
    never 0 (whose embedding a leak might add little of)."""
    longest = max(map(len, prompts))
    filler = torch.randint(1, 23, (len(prompts), longest), generator=torch.Generator().manual_seed(seed))
    return torch.stack([torch.cat([p, filler[b, len(p):]]) for b, p in enumerate(prompts)])


def random_prompts(vocab_size: int, case: str, count: int = 3, longest: int = 10) -> list:
    """count prompts of different random lengths, 1 to `longest` tokens (across the chunks of 4 and windows of 3 or
    2), drawn for each case its own."""
    g = torch.Generator().manual_seed(zlib.crc32(case.encode()))
    lengths = (torch.randperm(longest, generator=g)[:count] + 1).tolist()
    return [torch.randint(0, vocab_size, (n,), generator=g) for n in lengths]


def run_ragged(model, state, prompt, lengths: list, prefill):
    """generate_ragged to NEW_TOKENS past the longest prompt: each row's picks and the logits that picked them (from its
    prompt's end on), and the state after."""
    longest, first = max(lengths), min(lengths)
    yielded = list(generate.generate_ragged(model, state, prompt, torch.tensor(lengths), NEW_TOKENS, greedy, prefill))
    logits = torch.stack([step_logits for _, step_logits in yielded], 1)  # (B, positions, V)
    tokens = generate.picks([token for token, _ in yielded], lengths, first, longest - first + NEW_TOKENS)
    return tokens, [logits[b, n - first:] for b, n in enumerate(lengths)], state


def alone(model, state, prompt, num_tokens: int):
    """One prompt (1, T) through generate, by steps (the reference): its picks, their logits, the state after."""
    yielded = list(generate.generate(model, state, prompt, num_tokens, greedy))
    return [int(token) for token, _ in yielded], torch.cat([step_logits for _, step_logits in yielded]), state


def row(state, b: int):
    return reorder_state(state, torch.tensor([b]))


def same_bits(a, b) -> bool:
    """Every tensor and number of two states (or lists of logits) bit for bit the same."""
    (leaves_a, spec_a), (leaves_b, spec_b) = tree_flatten(a), tree_flatten(b)
    return spec_a == spec_b and all(torch.equal(x, y) if torch.is_tensor(x) else x == y
                                    for x, y in zip(leaves_a, leaves_b))


def check_rows_alone(name, prompts, together, alone_of):
    """Each row's picks equal its prompt's alone; its logits and its state within TIGHT of alone's."""
    tokens, logits, state = together
    longest = max(map(len, prompts))
    alones = [alone_of(b, longest - len(p) + NEW_TOKENS) for b, p in enumerate(prompts)]
    other_picks = [f"row {b} (a prompt of {len(p)})" for b, p in enumerate(prompts) if tokens[b] != alones[b][0]]
    worst = report(f"{name}: ragged batch - each prompt alone, logits",
                   max((logits[b] - alone_logits).abs().max() for b, (_, alone_logits, _) in enumerate(alones)))
    worst = max(worst, report(f"{name}: ragged batch - each prompt alone, state after", max(
        largest_difference(row(state, b), alone_state) for b, (_, _, alone_state) in enumerate(alones))))
    assert worst < TIGHT and not other_picks, \
        f"{name}: {', '.join(other_picks) or 'none'} picked other tokens than alone"


@pytest.mark.parametrize("case, prefill", combinations(LM_CASES, PREFILLS))
def test_each_row_of_a_ragged_batch_generates_as_its_prompt_alone(case, prefill):
    model = LM_CASES[case]()
    prompts = random_prompts(60, case)
    lengths = [len(p) for p in prompts]
    together = run_ragged(model, model.init_state(3), padded(prompts, 0), lengths, PREFILLS[prefill](model))
    check_rows_alone(f"{case}, prefill {prefill}, lengths {lengths}", prompts, together,
                     lambda b, n: alone(model, model.init_state(1), prompts[b][None], n))


@pytest.mark.parametrize("case, prefill", combinations(LM_CASES, ["parallel", "step"]))
def test_the_padding_leaves_no_trace(case, prefill):
    """Other ids in the pad slots: every pick, logit and number of the state after is the same, bit for bit."""
    model = LM_CASES[case]()
    prompts = random_prompts(60, case)
    lengths = [len(p) for p in prompts]
    runs = [run_ragged(model, model.init_state(3), padded(prompts, seed), lengths, PREFILLS[prefill](model))
            for seed in (0, 1)]
    assert runs[0][0] == runs[1][0] and same_bits(runs[0][1:], runs[1][1:]), f"{case}: the padding changed a row"


# -----------------------------------------------------------------------------
# A translator's decoder: sources of different lengths (padded with pad_id, masked), forced target prefixes of
# different lengths (padded with random ids, never read)

TRANSLATORS = {"t2r folded": lambda: fold(tiny_translator("t2r")),
               "softmax (KV cache)": lambda: tiny_translator("softmax"),
               "elu": lambda: tiny_translator("elu"), "rfa": lambda: tiny_translator("rfa"),
               "t2r window 2": lambda: tiny_translator("t2r", window=2)}


def translator_inputs(case: str):
    """Sources of 6, 2, 7 tokens padded with 0 (the pad_id the encoder and cross attention mask) and target
    prefixes of random lengths."""
    g = torch.Generator().manual_seed(0)
    sources = [torch.randint(1, 23, (n,), generator=g) for n in (6, 2, 7)]
    src = torch.nn.utils.rnn.pad_sequence(sources, batch_first=True, padding_value=0)
    return sources, src, random_prompts(23, case, longest=8)


def self_only(result):
    """A run's picks, logits and its state's self-attention part (the cross states' width is the source's)."""
    tokens, logits, state = result
    return tokens, logits, {"pos": state["pos"], "self": [layer["self"] for layer in state["layers"]]}


@pytest.mark.parametrize("case, prefill", combinations(TRANSLATORS, PREFILLS))
def test_a_translators_ragged_target_prefixes_decode_as_each_sentence_alone(case, prefill):
    model = TRANSLATORS[case]()
    sources, src, prefixes = translator_inputs(case)
    lengths = [len(p) for p in prefixes]
    together = run_ragged(model, model.init_state(src), padded(prefixes, 0), lengths, PREFILLS[prefill](model))
    check_rows_alone(f"translator {case}, prefill {prefill}, prefixes {lengths}", prefixes, self_only(together),
                     lambda b, n: self_only(alone(model, model.init_state(sources[b][None]), prefixes[b][None], n)))


@pytest.mark.parametrize("case, prefill", combinations(TRANSLATORS, ["parallel", "step"]))
def test_a_translators_prefix_padding_leaves_no_trace(case, prefill):
    model = TRANSLATORS[case]()
    _, src, prefixes = translator_inputs(case)
    lengths = [len(p) for p in prefixes]
    runs = [run_ragged(model, model.init_state(src), padded(prefixes, seed), lengths, PREFILLS[prefill](model))
            for seed in (0, 1)]
    assert runs[0][0] == runs[1][0] and same_bits(runs[0][1:], runs[1][1:]), f"{case}: the padding changed a row"
