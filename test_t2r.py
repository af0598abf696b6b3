"""Tests of t2r.py: the forms of each attention kind agree, conversion and folding keep what they should.

    python -m pytest -q -s test_t2r.py     # -s shows the max differences each test saw

CPU, tiny sizes, no downloads. Equivalences are checked in float64 to 1e-9 and in float32 to 1e-4. The file stands
alone: torch, pytest and the model files, with its few helpers below.
"""

import pytest
import torch
import torch.nn.functional as F

import t2r
from layers.states import state_bytes
from t2r import Seq2SeqTransformer, TransformerLM

KINDS = ["softmax", "t2r", "elu", "rfa"]
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4}


# -----------------------------------------------------------------------------
# Tiny models, and the few helpers the tests share

def lm_config(kind="softmax", **overrides) -> t2r.Config:
    """A language model of 2 layers, 37 words, h = 16 in 2 heads (d = 8), k = 6, chunks of 4."""
    return t2r.Config(**{**dict(vocab_size=37, n_layer=2, n_head=2, d_model=16, d_ff=32, dropout=0.0, attn=kind,
                                feature_size=6, chunk_size=4), **overrides})


def mt_config(kind="softmax") -> t2r.Config:
    """A translator: 2 encoder layers more, the decoder's self- and cross-attention of one kind (k = 4 and 6)."""
    return lm_config(kind, n_encoder_layer=2, cross_attn=kind, feature_size=4, cross_feature_size=6)


def make(model_class, config, dtype=torch.float64):
    """A model in eval mode whose biases are non-zero, as after training (init sets them to zero)."""
    torch.manual_seed(0)
    model = model_class(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(std=0.1)
    return model.to(dtype).eval()


def padded_sources(generator, lengths=(7, 4, 1)):
    """Source sentences of these lengths (words 1 to 36), padded with 0, the pad_id, to the longest."""
    src = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for row, n in enumerate(lengths):
        src[row, :n] = torch.randint(1, 37, (n,), generator=generator)
    return src


def translator_batch(kind, seed, target_length, dtype=torch.float64):
    """A tiny translator, padded sources of 7, 4 and 1 words, and targets of target_length words."""
    g = torch.Generator().manual_seed(seed)
    model = make(Seq2SeqTransformer, mt_config(kind), dtype)
    return model, padded_sources(g), torch.randint(1, 37, (3, target_length), generator=g)


def step_all(model, state, tokens):
    """The recurrent form over tokens (B, T), one position at a time: logits (B, T, V)."""
    return torch.stack([model.step(tokens[:, t], state)[0] for t in range(tokens.shape[1])], dim=1)


def report(name, diff) -> float:
    """Print a maximum difference (every test prints the ones it checks) and return it as a float."""
    diff = float(torch.as_tensor(diff).detach())
    print(f"{name}: max |diff| = {diff:.3e}")
    return diff


def is_new(name: str) -> bool:  # what a conversion adds: the feature maps
    return ".feature_map." in name


# -----------------------------------------------------------------------------
# Recurrent form == parallel form

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kind", KINDS)
def test_lm_recurrent_equals_parallel(kind, dtype):
    model = make(TransformerLM, lm_config(kind), dtype)
    tokens = torch.randint(0, 37, (3, 11), generator=torch.Generator().manual_seed(1))  # 11: not a chunk multiple
    with torch.no_grad():
        parallel = model(tokens)
    recurrent = step_all(model, model.init_state(3), tokens)
    assert report(f"LM {kind} {dtype} recurrent vs parallel", (recurrent - parallel).abs().max()) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kind", KINDS)
def test_seq2seq_recurrent_equals_parallel_with_padded_sources(kind, dtype):
    model, src, tgt = translator_batch(kind, seed=2, target_length=9, dtype=dtype)
    with torch.no_grad():
        parallel = model(src, tgt)
    recurrent = step_all(model, model.init_state(src), tgt)
    assert report(f"seq2seq {kind} {dtype} recurrent vs parallel", (recurrent - parallel).abs().max()) < TOLERANCE[dtype]


@pytest.mark.parametrize("kind", KINDS)
def test_seq2seq_padding_changes_nothing(kind):
    """A sentence in a padded batch gets the logits it gets alone."""
    model, src, tgt = translator_batch(kind, seed=3, target_length=5)
    with torch.no_grad():
        batched = model(src, tgt)
        worst = 0.0
        for row in range(3):
            alone = model(src[row : row + 1, : int((src[row] != 0).sum())], tgt[row : row + 1])
            worst = max(worst, (alone[0] - batched[row]).abs().max().item())
    assert report(f"seq2seq {kind} padded vs alone", worst) < 1e-9


# -----------------------------------------------------------------------------
# The parallel forms agree with each other, outputs and gradients

def random_features(B, H, T, k, d, generator, dtype=torch.float64):
    fq = torch.rand(B, H, T, k, generator=generator, dtype=dtype)
    fk = torch.rand(B, H, T, k, generator=generator, dtype=dtype)
    v = torch.randn(B, H, T, d, generator=generator, dtype=dtype)
    return [t.requires_grad_() for t in (fq, fk, v)]


def outputs_and_grads(fn, inputs, weight):
    out = fn(*inputs)
    grads = torch.autograd.grad((out * weight).sum(), inputs)
    return out, grads


@pytest.mark.parametrize("T", [1, 4, 5, 16, 23])
def test_chunked_equals_quadratic(T):
    g = torch.Generator().manual_seed(T)
    inputs = random_features(2, 3, T, 5, 7, g)
    weight = torch.randn(2, 3, T, 7, generator=g, dtype=torch.float64)
    ref, ref_grads = outputs_and_grads(lambda *x: t2r.linear_attention_quadratic(*x, causal=True), inputs, weight)
    out, grads = outputs_and_grads(lambda *x: t2r.linear_attention_chunked(*x, chunk_size=4), inputs, weight)
    diff = max([(out - ref).abs().max()] + [(a - b).abs().max() for a, b in zip(grads, ref_grads)])
    assert report(f"chunked vs quadratic T={T} (outputs and grads)", diff) < 1e-9


def run_reference_step(fq, fk, v):
    """Eqs. 6-7 as the paper writes them, S and z apart, one position at a time -> (B, H, T, d)."""
    (B, H, T, k), d = fq.shape, v.shape[-1]
    S, z = fq.new_zeros(B, H, k, d), fq.new_zeros(B, H, k)
    return torch.stack([t2r.linear_attention_step(fq[:, :, i], fk[:, :, i], v[:, :, i], S, z) for i in range(T)], 2)


@pytest.mark.parametrize("T", [1, 6, 23])
def test_the_reference_step_equals_the_chunked_and_quadratic_forms(T):
    with torch.no_grad():
        inputs = random_features(2, 3, T, 5, 7, torch.Generator().manual_seed(T))
        step = run_reference_step(*inputs)
        quadratic = t2r.linear_attention_quadratic(*inputs, causal=True)
        chunked = t2r.linear_attention_chunked(*inputs, chunk_size=4)
    diff = max((step - quadratic).abs().max(), (step - chunked).abs().max())
    assert report(f"reference step (S, z apart) vs quadratic and chunked, T={T}", diff) < 1e-12


def test_chunked_model_equals_quadratic_model_with_gradients():
    torch.manual_seed(0)
    chunked = TransformerLM(lm_config("t2r", chunk_size=4)).double()
    quadratic = TransformerLM(lm_config("t2r", chunk_size=0)).double()
    quadratic.load_state_dict(chunked.state_dict())
    tokens = torch.randint(0, 37, (2, 13))
    losses = [F.cross_entropy(m(tokens).flatten(0, 1), tokens.flatten()) for m in (chunked, quadratic)]
    for loss, model in zip(losses, (chunked, quadratic)):
        loss.backward()
    diff = max((a.grad - b.grad).abs().max() for a, b in zip(chunked.parameters(), quadratic.parameters()))
    diff = max(diff, (losses[0] - losses[1]).abs())
    assert report("LM chunked vs quadratic (loss and every gradient)", diff) < 1e-9


def test_noncausal_equals_quadratic_with_mask():
    g = torch.Generator().manual_seed(5)
    fq, _, _ = random_features(3, 2, 6, 5, 7, g)
    _, fk, v = random_features(3, 2, 9, 5, 7, g)
    mask = torch.arange(9)[None, :] < torch.tensor([9, 4, 1])[:, None]
    weight = torch.randn(3, 2, 6, 7, generator=g, dtype=torch.float64)
    inputs = (fq, fk, v)
    ref, ref_grads = outputs_and_grads(lambda *x: t2r.linear_attention_quadratic(*x, False, mask), inputs, weight)
    out, grads = outputs_and_grads(lambda *x: t2r.linear_attention_noncausal(*x, mask), inputs, weight)
    diff = max([(out - ref).abs().max()] + [(a - b).abs().max() for a, b in zip(grads, ref_grads)])
    assert report("non-causal vs masked quadratic (outputs and grads)", diff) < 1e-9


def test_quadratic_equals_eq2_with_features():
    """The quadratic reference is Eq. 4 written out: weights sim_ij / sum_l sim_il."""
    g = torch.Generator().manual_seed(6)
    fq, fk, v = (t.detach() for t in random_features(1, 1, 5, 3, 2, g))
    out = t2r.linear_attention_quadratic(fq, fk, v, causal=True)[0, 0]
    expected = torch.stack([
        sum((fq[0, 0, i] @ fk[0, 0, j]) * v[0, 0, j] for j in range(i + 1))
        / sum(fq[0, 0, i] @ fk[0, 0, j] for j in range(i + 1))
        for i in range(5)])
    assert report("quadratic vs Eq. 4 loop", (out - expected).abs().max()) < 1e-12


# -----------------------------------------------------------------------------
# Softmax attention is the teacher of Eq. 2

def test_softmax_attention_equals_explicit_formula():
    torch.manual_seed(0)
    attn = t2r.SoftmaxAttention(t2r.Config(d_model=16, n_head=2), causal=True).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    source = torch.randn(2, 5, 16, dtype=torch.float64)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])

    def explicit(x, source, allowed):
        q, k, v = attn.project(x, source)
        scores = q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5)  # Eq. 2b: exp(q.k / sqrt(d))
        weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)  # Eq. 2a
        return attn.merge(weights @ v)

    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    diff_causal = (attn(x) - explicit(x, x, causal)).abs().max()
    diff_cross = (attn(x, source, mask) - explicit(x, source, mask[:, None, None, :])).abs().max()
    assert report("softmax causal vs explicit", diff_causal) < 1e-12
    assert report("softmax cross (masked) vs explicit", diff_cross) < 1e-12


# -----------------------------------------------------------------------------
# Folding (Eq. 8)

@pytest.mark.parametrize("model_class", [TransformerLM, Seq2SeqTransformer])
def test_fold_equals_unfolded(model_class):
    config = lm_config("t2r") if model_class is TransformerLM else mt_config("t2r")
    model = make(model_class, config)
    folded = t2r.fold(model)
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(1, 37, (2, 9), generator=g)
    args = (tokens,) if model_class is TransformerLM else (padded_sources(g, (6, 3)), tokens)
    state_arg = 2 if model_class is TransformerLM else args[0]
    with torch.no_grad():
        diff = (folded(*args) - model(*args)).abs().max()
    diff = max(diff, (step_all(folded, folded.init_state(state_arg), tokens)
                      - step_all(model, model.init_state(state_arg), tokens)).abs().max())
    assert report(f"{model_class.__name__} folded vs unfolded (parallel and recurrent)", diff) < 1e-9
    attention = folded.layers[0].self_attn
    # q and k are never formed: the folded projections output r*k features, not r*d
    assert attention.q_proj.out_features == config.n_head * config.feature_size
    assert isinstance(attention.feature_map, t2r.FoldedT2RFeatureMap)


# -----------------------------------------------------------------------------
# Causality

@pytest.mark.parametrize("kind", KINDS)
def test_causality(kind):
    model = make(TransformerLM, lm_config(kind))
    tokens = torch.randint(0, 37, (1, 12), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        base = model(tokens)
        worst = 0.0
        for t in range(11):
            changed = tokens.clone()
            changed[0, t + 1] = (changed[0, t + 1] + 1) % 37
            worst = max(worst, (model(changed)[0, : t + 1] - base[0, : t + 1]).abs().max().item())
            assert (model(changed)[0, t + 1 :] - base[0, t + 1 :]).abs().max() > 0  # the change is seen later
    assert report(f"{kind}: outputs up to t after changing token t+1", worst) == 0


# -----------------------------------------------------------------------------
# Conversion (section 2.2)

def new_parameter_count(teacher, student):
    names = dict(teacher.named_parameters())
    return sum(p.numel() for n, p in student.named_parameters() if n not in names)


@pytest.mark.parametrize("kind", ["t2r", "elu", "rfa"])
def test_convert_copies_every_pretrained_weight(kind):
    teacher = make(TransformerLM, lm_config("softmax", n_layer=4), torch.float32)
    student = t2r.convert(teacher, kind, feature_size=8)
    teacher_params = dict(teacher.named_parameters())
    worst = 0.0
    for name, p in student.named_parameters():
        if is_new(name):
            continue
        worst = max(worst, (p - teacher_params[name]).abs().max().item())
    assert report(f"convert to {kind}: student vs teacher weights", worst) == 0
    r, d, k = 2, 8, 8
    expected_new = {"t2r": r * k * (d + 1), "elu": 0, "rfa": r}[kind] * 4  # per converted attention, 4 layers
    assert new_parameter_count(teacher, student) == expected_new
    assert student.config.layer_kinds() == [kind] * 4
    print(f"convert to {kind}: {new_parameter_count(teacher, student)} new parameters")


@pytest.mark.parametrize("start, kept", [
    ("nth", [0, 4]),  # the 4th and 8th from the top (layer 7 is the top)
    ("top", [3, 7]),  # the top one and the 5th from the top
])
def test_convert_keep_softmax_every(start, kept):
    teacher = make(TransformerLM, lm_config("softmax", n_layer=8))
    student = t2r.convert(teacher, "t2r", feature_size=4, keep_softmax_every=4, keep_softmax_from=start)
    kinds = student.config.layer_kinds()
    assert kinds == ["softmax" if i in kept else "t2r" for i in range(8)]
    assert [type(layer.self_attn).__name__ for layer in student.layers] == [
        "SoftmaxAttention" if k == "softmax" else "LinearAttention" for k in kinds]
    assert new_parameter_count(teacher, student) == 6 * 2 * 4 * (8 + 1)


def test_keeping_every_nth_layer_past_the_top_is_refused():
    with pytest.raises(ValueError, match="counts past the 2 layers: none stays softmax"):
        t2r.converted_kinds(2, "t2r", keep_softmax_every=5)
    assert t2r.converted_kinds(2, "t2r", keep_softmax_every=5, keep_softmax_from="top") == ["t2r", "softmax"]


def test_convert_seq2seq_defaults_and_encoder_untouched():
    teacher = make(Seq2SeqTransformer, mt_config("softmax"))
    student = t2r.convert(teacher, "t2r")
    assert student.config.feature_size == 4 and student.config.cross_feature_size == 32
    layer = student.layers[0]
    assert layer.self_attn.feature_map.weight.shape == (2, 4, 8)
    assert layer.cross_attn.feature_map.weight.shape == (2, 32, 8)
    assert all(isinstance(block.self_attn, t2r.SoftmaxAttention) for block in student.encoder)
    r, d = 2, 8
    assert new_parameter_count(teacher, student) == 2 * (r * 4 * (d + 1) + r * 32 * (d + 1))
    for (name, a), (_, b) in zip(teacher.encoder.state_dict().items(), student.encoder.state_dict().items()):
        assert torch.equal(a, b), name


def test_convert_refuses_a_converted_model():
    student = t2r.convert(make(TransformerLM, lm_config("softmax")), "t2r")
    with pytest.raises(ValueError, match="already converted"):
        t2r.convert(student, "t2r")
    with pytest.raises(ValueError, match="t2r, elu, rfa"):
        t2r.convert(make(TransformerLM, lm_config("softmax")), "softmax")


def test_copy_pretrained_refuses_mismatched_models():
    teacher = make(TransformerLM, lm_config("softmax"))
    with pytest.raises(ValueError, match="shape"):
        t2r.copy_pretrained(teacher, make(TransformerLM, lm_config("t2r", vocab_size=40)))
    with pytest.raises(ValueError, match="do not match"):
        t2r.copy_pretrained(teacher, make(TransformerLM, lm_config("t2r", n_layer=3)))


# -----------------------------------------------------------------------------
# Recurrent state: size and reordering

@pytest.mark.parametrize("kind", KINDS)
def test_state_size(kind):
    model = make(TransformerLM, lm_config(kind), torch.float32)
    state = model.init_state(2)
    sizes = []
    for t in range(40):
        model.step(torch.zeros(2, dtype=torch.long), state)
        sizes.append(state_bytes(state))
    print(f"{kind}: state bytes after steps 1, 20, 40: {sizes[0]}, {sizes[19]}, {sizes[-1]}")
    if kind == "softmax":
        assert sizes[-1] > sizes[0] and sorted(sizes) == sizes
    else:
        k = 8 if kind == "elu" else 6  # elu: k = d = 8
        assert sizes == [2 * 2 * 2 * (k * 8 + k) * 4] * 40  # layers * batch * heads * (S + z) * float32


# -----------------------------------------------------------------------------
# Numerics

# The all-zero case tests the normaliser, not the length: a shorter run shows it as well and keeps the suite fast.
@pytest.mark.parametrize("all_zero_query, steps", [(False, 4096), (True, 512)])
def test_bf16_autocast_long_recurrence_stays_finite(all_zero_query, steps):
    model = make(TransformerLM, lm_config("t2r", n_layer=1), torch.float32)
    if all_zero_query:  # relu(W x + b) = 0 for every query and key: the normaliser is 0
        model.layers[0].self_attn.feature_map.bias.data.fill_(-1e4)
    state = model.init_state(1)
    tokens = torch.randint(0, 37, (steps,), generator=torch.Generator().manual_seed(10))
    worst = 0.0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for t in range(steps):
            logits, state = model.step(tokens[t : t + 1], state)
            assert torch.isfinite(logits).all(), f"non-finite logits at step {t}"
            worst = max(worst, logits.abs().max().item())
    S, z = state["layers"][0]["self"]["S"], state["layers"][0]["self"]["z"]
    assert S.dtype == z.dtype == torch.float32
    print(f"bf16 {steps} steps (all-zero phi: {all_zero_query}): max |logit| {worst:.2f}, state {S.dtype}")


@pytest.mark.parametrize("form", ["quadratic", "chunked", "noncausal", "step"])
def test_all_zero_features_give_zero_not_nan(form):
    fq, fk = torch.zeros(1, 1, 5, 3), torch.zeros(1, 1, 5, 3)
    v = torch.randn(1, 1, 5, 2)
    out = {
        "quadratic": lambda: t2r.linear_attention_quadratic(fq, fk, v, causal=True),
        "chunked": lambda: t2r.linear_attention_chunked(fq, fk, v, chunk_size=2),
        "noncausal": lambda: t2r.linear_attention_noncausal(fq, fk, v),
        "step": lambda: t2r.linear_attention_step(fq[:, :, 0], fk[:, :, 0], v[:, :, 0], torch.zeros(1, 1, 3, 2),
                                                  torch.zeros(1, 1, 3)),
    }[form]()
    assert torch.equal(out, torch.zeros_like(out))


def test_autocast_parallel_keeps_linear_attention_in_float32():
    model = make(TransformerLM, lm_config("t2r"), torch.float32)
    tokens = torch.randint(0, 37, (2, 9))
    with torch.no_grad():
        reference = model(tokens)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            attention = model.layers[0].self_attn
            q, k, v = attention.project(torch.randn(2, 9, 16), torch.randn(2, 9, 16))
            out = attention.attend(q, k, v, cross=False)
            low = model(tokens)
    assert q.dtype == torch.bfloat16 and out.dtype == torch.float32
    # bf16 keeps 8 bits of mantissa (relative error ~4e-3 per rounding); logits here are O(1): 1.2e-2 measured
    assert report("bf16 autocast vs float32 logits", (low.float() - reference).abs().max()) < 5e-2


# -----------------------------------------------------------------------------
# RFA randomness and the Config

def test_rfa_redraws_in_training_and_is_fixed_in_eval():
    model = make(TransformerLM, lm_config("rfa"), torch.float32)
    tokens = torch.randint(0, 37, (1, 8))
    with torch.no_grad():
        assert torch.equal(model(tokens), model(tokens))
        model.train()
        assert not torch.equal(model(tokens), model(tokens))


@pytest.mark.parametrize("overrides, message", [
    (dict(d_model=15), "divisible"),
    (dict(attn="relu"), "unknown attention kind"),
    (dict(attn=["t2r"]), "n_layer"),
    (dict(attn="rfa", feature_size=5), "even"),
])
def test_config_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        lm_config(**overrides)


def test_config_saves_as_a_plain_dict(tmp_path):
    """to_dict gives what torch.load(weights_only=True) reads back, and Config(**it) is the same config."""
    config = lm_config(["t2r", "softmax"])
    torch.save(config.to_dict(), tmp_path / "config.pt")
    assert t2r.Config(**torch.load(tmp_path / "config.pt", weights_only=True)) == config


@pytest.mark.parametrize("layers, kinds", [((0,), ["softmax", "t2r"]), ((1,), ["t2r", "softmax"]),
                                           ((), ["t2r", "t2r"])])
def test_convert_keeps_the_layers_it_is_given_softmax(layers, kinds):
    """keep_softmax_layers (0: the bottom layer): the seam for layers chosen by data; out of range: refused."""
    teacher = make(TransformerLM, lm_config("softmax"))
    student = t2r.convert(teacher, "t2r", feature_size=6, keep_softmax_layers=layers)
    assert student.config.layer_kinds() == kinds
    with pytest.raises(ValueError, match="the layers are 0 to 1"):
        t2r.convert(teacher, "t2r", keep_softmax_layers=(2,))
