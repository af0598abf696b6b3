"""The decaying state (decay.py) in float64: its quadratic reference against the recurrence written out, the chunked
form from a state against the quadratic one, the model's steps and prefill against its parallel form, a gate of 1
against T2R itself, and the conversion that adds it (new gates only; the teacher's outputs as T2R's at the swap when
the gate is 1).

    python -m pytest -q -s tests/test_decay.py
"""

import pytest
import torch

from conftest import lm_config, make, mt_config, report
from decay import (DecayConfig, DecayingAttention, DecayingLM, decay_student, decayed_chunked_sums, decayed_quadratic,
                   decayed_step)
from support.configs import build_model
from t2r import Seq2SeqTransformer, TransformerLM, convert, linear_attention_quadratic, new_tensors, normalize

TIGHT = 1e-10  # float64 sums of a few dozen O(1) products in other orders: a few ulps apart


def random_inputs(T=13, seed=0):
    g = torch.Generator().manual_seed(seed)
    fq, fk = (torch.rand(2, 3, T, 4, generator=g, dtype=torch.float64) for _ in range(2))  # non-negative features
    v = torch.randn(2, 3, T, 5, generator=g, dtype=torch.float64)
    log_g = torch.log(torch.rand(2, 3, T, generator=g, dtype=torch.float64) * 0.5 + 0.5)  # g in [0.5, 1)
    return fq, fk, v, log_g


def test_the_quadratic_form_is_the_recurrence_written_out():
    fq, fk, v, log_g = random_inputs()
    S, z = fk.new_zeros(2, 3, 4, 5), fk.new_zeros(2, 3, 4)
    stepped = torch.stack([decayed_step(fq[:, :, t], fk[:, :, t], v[:, :, t], log_g[:, :, t].exp(), S, z)
                           for t in range(fq.shape[2])], 2)
    difference = (decayed_quadratic(fq, fk, v, log_g) - stepped).abs().max()
    assert report("decayed: quadratic - recurrence", difference) < TIGHT


def test_a_gate_of_one_is_t2rs_additive_state():
    fq, fk, v, _ = random_inputs()
    ones = torch.zeros(fq.shape[:3], dtype=torch.float64)  # log g = 0
    difference = (decayed_quadratic(fq, fk, v, ones) - linear_attention_quadratic(fq, fk, v, causal=True)).abs().max()
    assert report("decayed with g = 1 - T2R", difference) < TIGHT


@pytest.mark.parametrize("chunk", [1, 4, 5, 13, 64])
@pytest.mark.parametrize("split", [0, 6])
def test_the_chunked_form_from_a_state_equals_the_quadratic_form(chunk, split):
    """The first `split` positions read by the quadratic form's recurrence into a state, the rest in chunks from it:
    the outputs and the state after them are those of the whole sequence at once."""
    fq, fk, v, log_g = random_inputs()
    S, z = fk.new_zeros(2, 3, 4, 5), fk.new_zeros(2, 3, 4)
    for t in range(split):
        decayed_step(fq[:, :, t], fk[:, :, t], v[:, :, t], log_g[:, :, t].exp(), S, z)
    rest = slice(split, None)
    numerator, denominator, S, z = decayed_chunked_sums(fq[:, :, rest], fk[:, :, rest], v[:, :, rest],
                                                        log_g[:, :, rest], chunk, S, z)
    out = normalize(numerator, denominator)
    S_all, z_all = fk.new_zeros(2, 3, 4, 5), fk.new_zeros(2, 3, 4)
    for t in range(fq.shape[2]):
        decayed_step(fq[:, :, t], fk[:, :, t], v[:, :, t], log_g[:, :, t].exp(), S_all, z_all)
    diff = max((out - decayed_quadratic(fq, fk, v, log_g)[:, :, rest]).abs().max().item(),
               (S - S_all).abs().max().item(), (z - z_all).abs().max().item())
    assert report(f"chunks of {chunk} after {split} steps - quadratic, and the states", diff) < TIGHT


def test_the_chunked_forms_gradients_are_the_quadratic_forms():
    inputs = [t.requires_grad_() for t in random_inputs()]
    grads = []
    for form in (lambda *x: decayed_quadratic(*x), lambda fq, fk, v, log_g: normalize(*decayed_chunked_sums(
            fq, fk, v, log_g, 4, fk.new_zeros(2, 3, 4, 5), fk.new_zeros(2, 3, 4))[:2])):
        grads.append(torch.autograd.grad(form(*inputs).pow(2).sum(), inputs))
    difference = max((a - b).abs().max().item() for a, b in zip(*grads))
    assert report("decayed: chunked - quadratic, gradients of fq, fk, v, log g", difference) < TIGHT


def decaying_lm(chunk_size=4, kind="t2r"):
    torch.manual_seed(0)
    model = DecayingLM(DecayConfig(**{**lm_config(kind, chunk_size=chunk_size).to_dict(), "decay": True}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gate_bias"):
                p.normal_(std=1.0)  # gates well below 1: a decay that the tests can see
            elif name.endswith("bias"):
                p.normal_(std=0.1)
    return model.double().eval()


@pytest.mark.parametrize("kind, chunk_size", [("t2r", 4), ("t2r", 0), ("elu", 4), ("rfa", 4)])
def test_the_model_steps_and_prefills_as_it_runs_in_parallel(kind, chunk_size):
    model = decaying_lm(chunk_size, kind)
    tokens = torch.randint(0, 37, (2, 15))
    with torch.no_grad():
        parallel = model(tokens)
    state = model.init_state(2)
    model.prefill(tokens[:, :4], state)
    logits, state = model.prefill(tokens[:, 4:9], state)
    stepped = torch.stack([model.step(tokens[:, t], state)[0] for t in range(9, 15)], 1)
    diff = max((logits - parallel[:, 8]).abs().max().item(), (stepped - parallel[:, 9:]).abs().max().item())
    assert report(f"decaying {kind}, chunks {chunk_size}: prefill 4 + 5, 6 steps - parallel", diff) < TIGHT


def test_the_gate_decays():
    """Were the gate left out, the layer would be T2R's: its outputs differ from the same weights' T2R layer."""
    model = decaying_lm()
    plain = build_model({k: v for k, v in model.config.to_dict().items() if k != "decay"}).double().eval()
    assert type(plain) is TransformerLM
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.endswith("gate_bias")})
    tokens = torch.randint(0, 37, (2, 12))
    with torch.no_grad():
        assert (model(tokens) - plain(tokens)).abs().max() > 1e-3


@pytest.mark.parametrize("teacher_of", ["lm", "translator"])
def test_a_conversion_adds_only_the_gates_and_a_saved_config_builds_it_again(teacher_of):
    model_class, config = ((TransformerLM, lm_config()) if teacher_of == "lm" else (Seq2SeqTransformer, mt_config()))
    teacher = make(model_class, config)
    torch.manual_seed(1)
    plain = convert(teacher, "t2r")
    torch.manual_seed(1)
    student = convert(teacher, "t2r", build=decay_student(True))
    gates = new_tensors(student) - new_tensors(plain)
    assert gates == {f"layers.{i}.self_attn.gate_bias" for i in range(config.n_layer)}
    assert all(isinstance(layer.self_attn, DecayingAttention) for layer in student.layers)
    rebuilt = build_model(student.config.to_dict())
    assert type(rebuilt) is type(student)
    rebuilt.load_state_dict(student.state_dict())


@pytest.mark.parametrize("script", ["train_lm.py", "train_mt.py"])
def test_the_trainers_convert_to_a_decaying_state(tmp_path, script):
    """--decay with --init pretrained: the teacher trained first as it would be, the student's causal linear layers
    decaying (named in its row); generate.py checks the recurrent form against the parallel one."""
    from conftest import MT_TINY, TINY, assert_check_passes, run_in_process, write_corpus, write_parallel
    lm = script == "train_lm.py"
    corpus = write_corpus(str(tmp_path / "tiny")) if lm else write_parallel(str(tmp_path / "toy"))
    result = run_in_process(script, "--init", "pretrained", "--dataset", corpus, *(TINY if lm else MT_TINY),
                            "--max_steps", "4", "--decay", "--out_dir", "student", cwd=tmp_path, check=True)
    assert "| t2r+decay+pretrain |" in result.stdout
    assert "new parameters: feature maps, decay gates only" in result.stdout
    student = torch.load(tmp_path / "student/model.pt", weights_only=True)
    assert student["config"]["decay"] is True and "layers.0.self_attn.gate_bias" in student["model"]
    if lm:
        out = run_in_process("generate.py", "--ckpt", "student/model.pt", "--prompt", "w1 w2", "--num_tokens", "8",
                             "--check", cwd=tmp_path, check=True)
        assert_check_passes(out.stdout)


@pytest.mark.parametrize("flags, message", [
    ("--init pretrained --decay --window 8", "--window and --decay each make the model's layers"),
    ("--decay --attn softmax", "--decay makes a linear attention's state decay")])
def test_decay_flags_are_refused_where_they_cannot_work(capsys, flags, message):
    import train_lm
    from conftest import assert_flags_refused
    assert_flags_refused(train_lm.get_args, flags.split(), message, capsys)


def test_a_short_convolution_and_a_decaying_state_go_together():
    """--short_conv with --decay: each causal linear layer reads the convolution's output and its state decays; the
    steps and prefill of that student equal its parallel form, and the new tensors are the gates and convolutions."""
    from after_t2r import ConvDecayingAttention, ShortConv, conv_student
    teacher = make(TransformerLM, lm_config())
    torch.manual_seed(1)
    student = convert(teacher, "t2r", build=conv_student(3, decay=True)).double().eval()
    with torch.no_grad():
        for name, p in student.named_parameters():
            if name.endswith(("gate_bias", "conv.weight")):
                p.normal_(std=0.5)  # off the identity and the start
    assert all(isinstance(layer.self_attn, ConvDecayingAttention) for layer in student.layers)
    assert {n.split(".", 3)[-1] for n in new_tensors(student)} >= {"gate_bias", "conv.weight", "conv.bias"}
    tokens = torch.randint(0, 37, (2, 11))
    with torch.no_grad():
        parallel = student(tokens)
    state = student.init_state(2)
    logits, state = student.prefill(tokens[:, :6], state)
    stepped = torch.stack([student.step(tokens[:, t], state)[0] for t in range(6, 11)], 1)
    diff = max((logits - parallel[:, 5]).abs().max().item(), (stepped - parallel[:, 6:]).abs().max().item())
    assert report("convolution and decaying state: prefill 6, 5 steps - parallel", diff) < TIGHT
    assert type(build_model(student.config.to_dict())) is type(student)
    assert any(isinstance(m, ShortConv) for m in student.modules())
