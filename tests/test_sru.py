"""Tests of SRU++ (sru.py): the recurrence against Eqs. 1-5 written out, the recurrent step against the training
form (outputs and gradients, float64), alpha = 0 against the projection variant, the state, the config; then
SRU++ through the scripts: train_lm.py --arch sru++ resumes exactly, generate.py samples from it, bad flags.

    python -m pytest -q -s tests/test_sru.py
"""

import json
import os

import pytest
import torch

import sru
import train_lm
from conftest import assert_check_passes, assert_one_line_error, report, run_in_process, write_corpus
from sru import SRUConfig, SRUppLM, SRUppLayer

T = 7


def tiny(attn_every=1, seed=0, **overrides):
    """A float64 SRU++ LM in eval mode whose alphas, v and b are non-zero, as after training."""
    torch.manual_seed(seed)
    model = SRUppLM(SRUConfig(**{**dict(vocab_size=29, n_layer=3, d_model=16, attn_every=attn_every, dropout=0.0),
                                 **overrides}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("alpha", ".v", ".b")):
                p.normal_(std=0.5)
    return model.double().eval()


def step_by_step(U, x, c, v, b):
    """sru_cell at every position: the recurrent form of sru_recurrence."""
    hs = []
    for u_t, x_t in zip(U.unbind(1), x.unbind(1)):
        h, c = sru.sru_cell(u_t, x_t, c, v, b)
        hs.append(h)
    return torch.stack(hs, 1), c


@pytest.mark.parametrize("form", [sru.sru_recurrence, step_by_step], ids=["training-form", "cell"])
def test_the_recurrence_is_eqs_1_to_5(form):
    g = torch.Generator().manual_seed(0)
    B, d = 2, 5
    x = torch.randn(B, 3, d, generator=g, dtype=torch.float64)
    W, W1, W2 = (torch.randn(d, d, generator=g, dtype=torch.float64) for _ in range(3))
    v, b = torch.randn(2, d, generator=g, dtype=torch.float64), torch.randn(2, d, generator=g, dtype=torch.float64)
    U = (x @ torch.cat([W, W1, W2]).T).view(B, 3, 3, d)  # Eq. 1: one multiplication for the three
    h, c_last = form(U, x, torch.zeros(B, d, dtype=torch.float64), v, b)
    c = torch.zeros(B, d, dtype=torch.float64)
    for t in range(3):  # the four equations, with their own matrices, element by element
        for i in range(B):
            for j in range(d):
                f = torch.sigmoid(W[j] @ x[i, t] + v[0, j] * c[i, j] + b[0, j])
                r = torch.sigmoid(W1[j] @ x[i, t] + v[1, j] * c[i, j] + b[1, j])
                c[i, j] = f * c[i, j] + (1 - f) * (W2[j] @ x[i, t])
                expected = r * c[i, j] + (1 - r) * x[i, t, j]
                assert abs(h[i, t, j] - expected) < 1e-12
    assert report(f"{form.__name__}: last c vs Eqs. 1-5", (c_last - c).abs().max()) < 1e-12


def test_the_hand_written_backward_equals_autograd_through_the_cell():
    g = torch.Generator().manual_seed(4)
    B, d = 3, 6
    inputs = [torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)
              for shape in ((B, T, 3, d), (B, T, d), (B, d), (2, d), (2, d))]  # U, x, c before the first, v, b
    weight = torch.randn(B, T, d, generator=g, dtype=torch.float64)

    grads = []
    for form in (sru.sru_recurrence, step_by_step):
        h, c = form(*inputs)
        grads.append(torch.autograd.grad((h * weight).sum() + c.sum(), inputs))
    diff = max((a - b).abs().max() for a, b in zip(*grads))
    assert report("gradients of U, x, c, v, b: StateRecurrence vs autograd through sru_cell", diff) < 1e-12


@pytest.mark.parametrize("attn_every", [1, 3, 0], ids=["every-layer", "top-layer", "none"])
def test_the_recurrent_step_equals_the_training_form(attn_every):
    model = tiny(attn_every)
    tokens = torch.randint(0, 29, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        parallel = model(tokens)
    state, steps = model.init_state(2), []
    for t in range(T):
        logits, state = model.step(tokens[:, t], state)
        steps.append(logits)
    diff = (torch.stack(steps, 1) - parallel).abs().max()
    assert report(f"SRU++ attn_every={attn_every}: recurrent vs parallel logits", diff) < 1e-10


@pytest.mark.parametrize("attention", [True, False])
def test_the_steps_gradients_equal_the_training_forms(attention):
    torch.manual_seed(2)
    layer = SRUppLayer(8, 4, attention).double()
    with torch.no_grad():
        for p in (layer.v, layer.b) + ((layer.alpha,) if attention else ()):
            p.normal_(std=0.5)
    x = torch.randn(2, T, 8, dtype=torch.float64)
    weight = torch.randn(2, T, 8, dtype=torch.float64)
    parallel = torch.autograd.grad((layer(x) * weight).sum(), list(layer.parameters()))
    state = layer.init_state(2, x.device, x.dtype)
    out = torch.stack([layer.step(x[:, t], state) for t in range(T)], 1)
    recurrent = torch.autograd.grad((out * weight).sum(), list(layer.parameters()))
    diff = max((a - b).abs().max() for a, b in zip(parallel, recurrent))
    assert report(f"attention={attention}: gradients, step vs training form", diff) < 1e-10


def test_alpha_zero_is_the_projection_variant():
    torch.manual_seed(3)
    with_attention, projection = SRUppLayer(8, 4, True).double(), SRUppLayer(8, 4, False).double()
    projection.load_state_dict({k: v for k, v in with_attention.state_dict().items() if k in
                                projection.state_dict()})
    x = torch.randn(2, T, 8, dtype=torch.float64)
    with torch.no_grad():
        assert report("alpha = 0 vs projection variant", (with_attention(x) - projection(x)).abs().max()) == 0
        with_attention.alpha.fill_(0.7)
        assert (with_attention(x) - projection(x)).abs().max() > 1e-3  # the attention does something


def test_the_state_is_c_per_layer_and_a_cache_in_attention_layers_only():
    model = tiny(attn_every=3)
    state = model.init_state(2)
    for t in range(5):
        model.step(torch.full((2,), t), state)
    kinds = [sorted(layer_state) for layer_state in state["layers"]]
    assert kinds == [["c"], ["c"], ["c", "k", "length", "v"]] and state["layers"][2]["length"] == 5


@pytest.mark.parametrize("overrides, message", [
    (dict(n_layer=2, attn_every=3), "larger than n_layer"),
    (dict(d_attn=-1), "d_attn"),
    (dict(n_layer=0), "n_layer"),
])
def test_a_config_that_cannot_be_is_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        SRUConfig(**overrides)


# -----------------------------------------------------------------------------
# Through the scripts

SRU_TINY = ["--arch", "sru++", "--attn_every", "2", "--n_layer", "2", "--d_model", "32", "--block_size", "32",
            "--batch_size", "4", "--eval_context", "32", "--eval_score", "16", "--eval_interval", "4",
            "--eval_windows", "4", "--log_interval", "2", "--max_steps", "8"]


def weights(path):
    return torch.load(path, weights_only=True)["model"]


@pytest.fixture(scope="module")
def sru_runs(tmp_path_factory):
    """train_lm.py --arch sru++ straight through, and stopped at step 3 then resumed."""
    tmp = tmp_path_factory.mktemp("sru")
    corpus = write_corpus(str(tmp / "tiny"))
    here = os.getcwd()
    os.chdir(tmp)  # in this process, for speed: the runs' relative paths (out/, data/cache) land in tmp
    try:
        for argv in (["--dataset", corpus, *SRU_TINY], ["--dataset", corpus, *SRU_TINY, "--out_dir", "split",
                                                        "--stop_at", "3"], ["--resume", "--out_dir", "split"]):
            train_lm.main(argv)
    finally:
        os.chdir(here)
    return tmp


def test_train_lm_trains_sru_and_resumes_it_exactly(sru_runs):
    straight, resumed = weights(sru_runs / "out/tiny-sru++every2-random/ckpt.pt"), weights(sru_runs / "split/ckpt.pt")
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    results = json.loads((sru_runs / "split/results.json").read_text())
    straight_results = json.loads((sru_runs / "out/tiny-sru++every2-random/results.json").read_text())
    assert results["attn"] == "sru++every2" and results["k"] is None
    assert results["test"] == straight_results["test"] and results["valid"] == straight_results["valid"]


def test_generate_samples_from_sru_with_its_recurrent_state(sru_runs):
    out = run_in_process("generate.py", "--ckpt", "split/model.pt", "--prompt", "w1 w2", "--num_tokens", "40",
                         "--check", cwd=sru_runs, check=True).stdout
    print(out[-400:])
    assert "SRU++ with attention in 1 of 2 layers" in out and "keys and values in the attention layers" in out
    assert "sru.py's own step (it steps its own way: the fast step is for models without rotary positions or " \
           "grouped heads); prompt read in one parallel pass" in out
    assert_check_passes(out)


def test_generate_refuses_to_compile_or_record_the_sru_step(run_here, sru_runs):
    """SRU++ steps with its own step, eager: --compile and --step graph say so before any work."""
    for flags in (["--compile"], ["--step", "graph"]):
        result = run_here("generate.py", "--ckpt", "split/model.pt", *flags, cwd=sru_runs)
        assert_one_line_error(result, "SRUppLM steps with its own step only")


def test_an_sru_checkpoint_is_not_converted(run_here, tmp_path, corpus):
    config = sru.SRUConfig(vocab_size=42, n_layer=2, d_model=8).to_dict()
    torch.save({"config": config, "model": {}, "step": 1, "max_steps": 1}, tmp_path / "sru.pt")
    result = run_here("train_lm.py", "--dataset", corpus, "--init", "pretrained", "--pretrained", "sru.pt",
                      cwd=tmp_path)
    assert_one_line_error(result, "is an SRU++ model")
