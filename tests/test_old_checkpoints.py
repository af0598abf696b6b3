"""Checkpoints written before t2r.py gave the checkpoint families a module of their own still load, and generate the
tokens (and logits) they generated then: tests/fixtures/old_checkpoints.pt, written at commit 2c19ca8 by
tests/fixtures/make_old_checkpoints.py.

The logits are compared with float64 references (tests/fixtures/old_checkpoints_float64.pt, written by
tests/fixtures/make_float64_references.py), never with the float32 logits saved then: those are one CPU's float32
bits, and another CPU's kernels, summing in another order, round otherwise (by 4.3e-4 for RFA on an AMD EPYC)."""

import pathlib

import pytest
import torch

from conftest import report
from support.checkpoints import model_from_checkpoint, read_checked
from support.inference import inference_model
from t2r import Seq2SeqTransformer

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
OLD = torch.load(FIXTURES / "old_checkpoints.pt", weights_only=True)
REFERENCE_PATH = FIXTURES / "old_checkpoints_float64.pt"
REFERENCE = torch.load(REFERENCE_PATH, weights_only=True) if REFERENCE_PATH.exists() else {}

# The float64 run against the float64 reference made on another CPU. They differ only by float64 rounding: the
# float32 errors below, scaled by the ratio of the unit roundoffs (2^-53 / 2^-24, about 2e-9), are at most about 1e-12,
# and a one-ulp jitter of every float64 weight moves the logits by at most 1.2e-12 (RFA; 1e-14 elsewhere).
# 1e-9 leaves a thousandfold margin for another CPU's order of summation, and any change to what is computed (a norm's
# eps, a feature map's scale) moves the logits by far more.
FLOAT64_BOUND = 1e-9

# The float32 run against the float64 reference: float32 rounding (unit roundoff 6e-8 of logits up to 14) grows
# through the layers and, in RFA, along the sequence (on the AMD EPYC: 4e-6 at the first step, 4.3e-4 at
# the twelfth). Measured: at most 1.25e-4 from the reference on an Intel Xeon, 5.5e-4 over ten one-ulp jitters of the
# float32 weights (as another CPU's rounding), 4.3e-4 between the Xeon's float32 logits and an AMD EPYC's; 2e-6 to
# 3.4e-5 for the others. 2e-3 leaves a fourfold margin over the largest.
FLOAT32_TOLERANCE = 2e-3


@torch.no_grad()
def greedy_from(model, tokens: int = 12, forced=None):
    """(tokens (B, n), the logits that picked them (B, n, V), in the model's dtype): greedy from a fixed prompt,
    through generate.py's inference model (T2R layers folded). forced (B, n): the tokens fed back instead of the
    model's own picks (the logits then compare position by position with a run that picked them)."""
    model = inference_model(model)
    prompt = torch.tensor([[1, 5, 9], [2, 3, 4]])
    if isinstance(model, Seq2SeqTransformer):
        state, token = model.init_state(torch.tensor([[5, 6, 7, 8, 0], [9, 10, 0, 0, 0]])), prompt[:, 0]
    else:
        state, token = model.init_state(2), prompt[:, 0]
        for t in range(prompt.shape[1] - 1):
            model.step(prompt[:, t], state)
        token = prompt[:, -1]
    out, scores = [], []
    for i in range(tokens):
        logits, state = model.step(token, state)
        out.append(logits.argmax(-1))
        token = out[-1] if forced is None else forced[:, i]
        scores.append(logits)
    return torch.stack(out, 1), torch.stack(scores, 1)


def loaded(name, tmp_path):
    """The old checkpoint `name` as generate.py loads it: from its file, its checksum checked (it is untouched)."""
    path = tmp_path / "model.pt"
    torch.save(OLD[name]["checkpoint"], path)
    return model_from_checkpoint(read_checked(str(path)), str(path))


def jittered(model, seed):
    """model with every weight moved one ulp up or down, at random: rounding of the size another CPU's order of
    summation makes, without another CPU."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            away = torch.where(torch.rand(p.shape, generator=generator) < 0.5, -torch.inf, torch.inf).to(p.dtype)
            p.copy_(torch.nextafter(p, away))
    return model


def assert_float64_run_is_the_reference(model, name):
    tokens, logits = greedy_from(model.double())
    assert torch.equal(tokens, REFERENCE[name]["tokens"]), f"{name} picks other tokens than it did"
    assert report(f"{name}, float64 run - float64 reference", (logits - REFERENCE[name]["logits"]).abs().max()) \
        < FLOAT64_BOUND


def assert_float32_run_is_within_rounding(model, name):
    """The float32 run, fed the reference's tokens, within FLOAT32_TOLERANCE of its logits, and picking its tokens
    wherever its top two logits are more than twice the tolerance apart (there float32's error cannot swap them)."""
    reference = REFERENCE[name]
    tokens, logits = greedy_from(model.float(), forced=reference["tokens"])
    assert logits.dtype == torch.float32
    assert report(f"{name}, float32 run - float64 reference", (logits.double() - reference["logits"]).abs().max()) \
        < FLOAT32_TOLERANCE
    top_two = reference["logits"].topk(2, dim=-1).values
    decided = top_two[..., 0] - top_two[..., 1] > 2 * FLOAT32_TOLERANCE
    print(f"{name}: {int(decided.sum())} of {decided.numel()} picks decided beyond float32's error")
    assert torch.equal(tokens[decided], reference["tokens"][decided]), f"{name} in float32 picks other tokens"


def test_every_old_checkpoint_has_a_float64_reference_of_the_tokens_it_generated_then():
    assert sorted(REFERENCE) == sorted(OLD), "run tests/fixtures/make_float64_references.py"
    for name in OLD:
        assert torch.equal(REFERENCE[name]["tokens"], OLD[name]["tokens"]) and REFERENCE[name]["logits"].dtype == \
            torch.float64
        assert report(f"{name}, saved float32 - float64 reference",
                      (OLD[name]["logits"].double() - REFERENCE[name]["logits"]).abs().max()) < FLOAT32_TOLERANCE


@pytest.mark.parametrize("name", sorted(OLD))
def test_an_old_checkpoint_loads_and_generates_what_it_did(name, tmp_path):
    model = loaded(name, tmp_path)
    print(f"{name}: {type(model).__name__}")
    assert_float64_run_is_the_reference(model, name)


@pytest.mark.parametrize("name", sorted(OLD))
def test_an_old_checkpoint_in_float32_generates_what_it_did_within_float32_rounding(name, tmp_path):
    assert_float32_run_is_within_rounding(loaded(name, tmp_path), name)


@pytest.mark.parametrize("name", ["lm-rfa", "llama-softmax"])  # the two that another CPU's float32 bits failed
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_another_cpus_rounding_passes(name, dtype):
    """The bounds hold for rounding other than this CPU's: one-ulp jitters of the weights stand for another CPU's
    order of summation (they moved RFA's float32 logits by 4e-4 from this CPU's, as an AMD EPYC's kernels did)."""
    for seed in range(3):
        model = jittered(model_from_checkpoint(OLD[name]["checkpoint"]).to(dtype), seed)
        if dtype == torch.float64:
            assert_float64_run_is_the_reference(model, name)
        else:
            assert_float32_run_is_within_rounding(model, name)
