"""Checkpoints written before t2r.py gave the checkpoint families a module of their own still load, and generate the
tokens (and logits) they generated then: tests/fixtures/old_checkpoints.pt, written at commit 2c19ca8 by
tests/fixtures/make_old_checkpoints.py."""

import pathlib

import pytest
import torch

from support.checkpoints import model_from_checkpoint, read_checked
from support.inference import inference_model
from t2r import Seq2SeqTransformer

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "old_checkpoints.pt"
OLD = torch.load(FIXTURES, weights_only=True)


@torch.no_grad()
def greedy_from(model, tokens: int = 12):
    """(tokens (B, n), the logits that picked them (B, n, V)): greedy from a fixed prompt, through generate.py's
    inference model (T2R layers folded)."""
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
    for _ in range(tokens):
        logits, state = model.step(token, state)
        token = logits.argmax(-1)
        out.append(token)
        scores.append(logits.float())
    return torch.stack(out, 1), torch.stack(scores, 1)


@pytest.mark.parametrize("name", sorted(OLD))
def test_an_old_checkpoint_loads_and_generates_what_it_did(name, tmp_path):
    path = tmp_path / "model.pt"
    torch.save(OLD[name]["checkpoint"], path)
    model = model_from_checkpoint(read_checked(str(path)), str(path))  # the checksum too: the file is untouched
    tokens, logits = greedy_from(model)
    difference = (logits - OLD[name]["logits"]).abs().max().item()
    print(f"{name}: {type(model).__name__}, max |logit - logit then| {difference:.1e}")
    assert torch.equal(tokens, OLD[name]["tokens"]) and difference < 1e-5
