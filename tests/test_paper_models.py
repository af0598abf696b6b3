"""Tests of the paper-scale options of t2r.py at tiny sizes: the post-norm translator (appendix Table 5) and the
adaptive input and softmax of the WikiText-103 model (section 3.2.1), the latter against torch's own
AdaptiveLogSoftmaxWithLoss loaded with the same weights; the --preset wt103 model's shapes, on the meta device. And
the paper's model as code outside t2r.py reads it: a saved config rebuilt by support/configs.build_model, the attention
weights of section 4's analysis (experiments/analyze_attention.py).

    python -m pytest -q -s tests/test_paper_models.py
"""

import pytest
import torch

import t2r
from conftest import (TINY, assert_check_passes, assert_flags_refused, lm_config, make, report, step_all,
                      translator_batch, write_corpus)
from experiments import analyze_attention
from support import configs
from t2r import TransformerLM

KINDS = ["softmax", "t2r", "elu", "rfa"]
ADAPTIVE = dict(vocab_size=37, adaptive_cutoffs=[8, 20], adaptive_factor=2)  # bands of 8, 12 and 17 words


@pytest.mark.parametrize("kind", KINDS)
def test_post_norm_translator_recurrent_equals_parallel(kind):
    """The paper's translator is post-norm (fairseq's transformer_vaswani_en_de_big): the RNN form must hold there too."""
    model, src, tgt = translator_batch(kind, seed=3, target_length=9, pre_norm=False)
    with torch.no_grad():
        parallel = model(src, tgt)
    recurrent = step_all(model, model.init_state(src), tgt)
    assert report(f"post-norm seq2seq {kind} recurrent vs parallel", (recurrent - parallel).abs().max()) < 1e-9


def test_post_norm_block_is_layernorm_of_the_residual_sum():
    """Post-norm: x <- LN(x + sublayer(x)) for each sublayer, with no LayerNorm after the last layer."""
    model = make(TransformerLM, lm_config("softmax", pre_norm=False, n_layer=1))
    block, x = model.layers[0], torch.randn(2, 5, 16, dtype=torch.float64)
    with torch.no_grad():
        h = block.norm1(x + block.self_attn(x))
        expected = block.norm2(h + block.ffn(h))
        assert report("post-norm block vs LN(x + f(x))", (block(x) - expected).abs().max()) < 1e-12
        assert isinstance(model.final_norm, torch.nn.Identity)


# -----------------------------------------------------------------------------
# Adaptive input and softmax

def test_adaptive_softmax_probabilities_sum_to_one():
    model = make(TransformerLM, lm_config("softmax", **ADAPTIVE))
    with torch.no_grad():
        log_p = model(torch.randint(0, 37, (3, 11), generator=torch.Generator().manual_seed(0)))
    assert log_p.shape == (3, 11, 37) and log_p.dtype == torch.float64
    assert report("adaptive softmax: |sum p - 1|", (log_p.exp().sum(-1) - 1).abs().max()) < 1e-12


def test_adaptive_softmax_equals_torch_with_the_same_weights():
    """torch's AdaptiveLogSoftmaxWithLoss: a head (the first band's words, then one entry per other band) and,
    per other band, two bias-free linear maps h -> d_i -> V_i. Ours shares them with the input: the head's word
    rows are E_0 W_0^T, band i's maps W_i^T and E_i."""
    model = make(TransformerLM, lm_config("softmax", **ADAPTIVE))
    tied = model.embed.tok
    reference = torch.nn.AdaptiveLogSoftmaxWithLoss(16, 37, cutoffs=[8, 20], div_value=2.0).double()
    with torch.no_grad():
        reference.head.weight.copy_(torch.cat([tied.bands[0].weight @ tied.projections[0].weight.T,
                                               model.lm_head.band_entries.weight]))
        for i, tail in enumerate(reference.tail, start=1):
            tail[0].weight.copy_(tied.projections[i].weight.T)
            tail[1].weight.copy_(tied.bands[i].weight)
        x = torch.randn(5, 16, dtype=torch.float64)
        diff = (model.lm_head(x) - reference.log_prob(x)).abs().max()
    assert report("adaptive softmax vs torch.nn.AdaptiveLogSoftmaxWithLoss", diff) < 1e-12


def test_adaptive_input_embeds_each_band_with_its_own_table():
    model = make(TransformerLM, lm_config("softmax", **ADAPTIVE))
    tied, tokens = model.embed.tok, torch.tensor([[0, 7, 8, 19, 20, 36]])
    expected = torch.stack([tied.projections[b](tied.bands[b].weight[t - lo]) for t, (b, lo) in
                            zip(tokens[0].tolist(), [(0, 0), (0, 0), (1, 8), (1, 8), (2, 20), (2, 20)])])
    assert [band.embedding_dim for band in tied.bands] == [16, 8, 4]
    assert report("adaptive input vs each band by hand", (tied(tokens)[0] - expected).abs().max()) < 1e-12


@pytest.mark.parametrize("kind", ["t2r", "elu", "rfa"])
def test_conversion_keeps_the_adaptive_softmax(kind):
    """The swap copies the bands, projections and band entries, keeps them tied, and still gives probabilities;
    the converted model's recurrent and folded forms agree with its parallel form."""
    teacher = make(TransformerLM, lm_config("softmax", **ADAPTIVE))
    student = t2r.convert(teacher, kind, feature_size=4)
    assert student.lm_head.tied is student.embed.tok and student.config.adaptive_cutoffs == [8, 20]
    kept = [name for name, _ in teacher.named_parameters()]
    assert all(torch.equal(teacher.state_dict()[n], student.state_dict()[n]) for n in kept)
    tokens = torch.randint(0, 37, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        parallel = student(tokens)
    recurrent = step_all(t2r.fold(student), t2r.fold(student).init_state(2), tokens)
    assert report(f"adaptive {kind}: |sum p - 1|", (parallel.exp().sum(-1) - 1).abs().max()) < 1e-12
    assert report(f"adaptive {kind}: folded recurrent vs parallel", (recurrent - parallel).abs().max()) < 1e-9


@pytest.mark.parametrize("overrides, message", [
    (dict(adaptive_cutoffs=[20, 8]), "must increase strictly"),
    (dict(adaptive_cutoffs=[8, 37]), "must increase strictly"),
    (dict(adaptive_cutoffs=[8, 20], adaptive_factor=8), "leaves the last band no dimension"),
    (dict(adaptive_cutoffs=[8], tie_embeddings=False), "tied language model"),
])
def test_bad_adaptive_configs_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        lm_config("softmax", **overrides)


def test_train_lm_with_adaptive_softmax_trains_and_generates(run_here, tmp_path):
    """--adaptive_cutoffs end to end on the tiny corpus (its ids are in order of frequency), then generate.py's
    recurrent form checked against the parallel one."""
    corpus = write_corpus(str(tmp_path / "tiny"))
    trained = run_here("train_lm.py", "--dataset", corpus, *TINY, "--adaptive_cutoffs", "8,20", "--adaptive_factor",
                       "2", "--max_steps", "4", "--out_dir", "adaptive", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr
    checkpoint = torch.load(tmp_path / "adaptive/model.pt", weights_only=True)
    assert checkpoint["config"]["adaptive_cutoffs"] == [8, 20] and "lm_head.band_entries.weight" in checkpoint["model"]
    gen = run_here("generate.py", "--ckpt", "adaptive/model.pt", "--num_tokens", "20", "--check", cwd=tmp_path)
    assert_check_passes(gen.stdout)


@pytest.mark.parametrize("keep_softmax_every, converted", [(0, 32), (4, 24)])  # T2R, and T2R 75%
def test_the_wt103_preset_is_the_papers_model_and_t2r_adds_r_k_d_plus_1_a_layer(keep_softmax_every, converted):
    """--preset wt103 (section 3.2.1): 32 layers, 8 heads of 128 dimensions, 1024 model and 4096 feed-forward
    dimensions, dropout and LayerDrop 0.2. Converting it (k = 32) adds r k (d + 1) parameters to each converted
    layer (section 2.2), r heads of d dimensions, and nothing else. Built on the meta device: shapes, no memory."""
    import train_lm
    args = train_lm.get_args(["--preset", "wt103", "--dataset", "wikitext103", "--attn", "softmax"])
    with torch.device("meta"):
        teacher = TransformerLM(train_lm.model_config(args, vocab_size=267_744))  # WikiText-103's ~268K words
        student = t2r.convert(teacher, "t2r", feature_size=32, keep_softmax_every=keep_softmax_every)
    c = teacher.config
    assert (c.n_layer, c.n_head, c.d_model // c.n_head, c.d_model, c.d_ff) == (32, 8, 128, 1024, 4096)
    assert (c.dropout, c.layer_dropout, args.block_size) == (0.2, 0.2, 512)
    count = lambda model: sum(p.numel() for p in model.parameters())
    added = count(student) - count(teacher)
    print(f"teacher {count(teacher):,} parameters; T2R adds {added:,} ({100 * added / count(teacher):.2f}%)")
    assert added == converted * 8 * 32 * (128 + 1)


def test_layerdrop_skips_every_layer_at_probability_one_in_training_only():
    """--layer_dropout (the paper's WikiText-103 model): at p = 1 a training forward is the embedding through the
    final norm and head alone; in eval every layer runs."""
    model = make(TransformerLM, lm_config("t2r", layer_dropout=1.0, dropout=0.0))
    tokens = torch.randint(0, 37, (2, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        skipped = model.output(model.embed(tokens))
        assert report("training forward vs no layers", (model.train()(tokens) - skipped).abs().max()) == 0
        assert (model.eval()(tokens) - skipped).abs().max() > 1e-3


@pytest.mark.parametrize("value", ["20,8", "8,x", "0,8"])
def test_bad_adaptive_cutoffs_are_refused_before_any_work(capsys, value):
    import train_lm
    assert_flags_refused(train_lm.get_args, ["--adaptive_cutoffs", value], "--adaptive_cutoffs", capsys)


# -----------------------------------------------------------------------------
# A saved config rebuilds its model: support/configs.build_model picks the class

def test_config_round_trips_as_a_plain_dict(tmp_path):
    config = lm_config(["t2r", "softmax"])
    model = TransformerLM(config)
    torch.save({"config": config.to_dict(), "model": model.state_dict()}, tmp_path / "ckpt.pt")
    checkpoint = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    rebuilt = configs.build_model(checkpoint["config"])
    rebuilt.load_state_dict(checkpoint["model"])
    assert rebuilt.config == config and isinstance(rebuilt, TransformerLM)


# -----------------------------------------------------------------------------
# Attention weights for the analysis of section 4: rows are distributions, and weights @ v is the output

@pytest.mark.parametrize("kind", KINDS)
def test_attention_weights_reproduce_the_attention_output(kind):
    """The (T, T) matrix the analysis reads is the one each form uses implicitly: merge(A v) equals the
    module's output (the fused softmax kernel, the chunked linear form), and causal rows sum to 1."""
    model = make(TransformerLM, lm_config(kind, feature_size=6, chunk_size=4))
    attn = model.layers[0].self_attn
    x = torch.randn(2, 11, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    weights = analyze_attention.attention_weights(attn, x)  # (B, H, T, T)
    _, _, v = attn.project(x, x)
    diff = (attn.merge(weights @ v) - attn(x)).abs().max()
    assert report(f"{kind}: merge(weights @ v) vs forward", diff) < 1e-12
    assert weights.triu(1).abs().max() == 0, "a position attends to the future"
    mass = weights.sum(-1)
    if kind == "rfa":  # sin/cos features: the shared rule divides by |denominator|, so a row sums to +-1
        mass = mass.abs()
    # a T2R query whose ReLU features are all zero attends to nothing (the epsilon rule gives output 0)
    empty = mass == 0 if kind == "t2r" else torch.zeros_like(mass, dtype=torch.bool)
    assert report(f"{kind}: rows sum to 1 ({int(empty.sum())} empty)", (mass - 1)[~empty].abs().max()) < 1e-12
    if kind in ("softmax", "t2r", "elu"):
        assert weights.min() >= 0
