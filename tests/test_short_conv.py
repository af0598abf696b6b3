"""The short convolution before attention (after_t2r.py; MQAR's Zoology baselines): its recurrent step against its
parallel form, in float64, alone and in a model, converted to T2R too."""

import pytest
import torch

from after_t2r import ConvConfig, ConvLM, ShortConv, conv_student
from conftest import report
from support.configs import build_model
from t2r import convert


def random_conv(kernel: int):
    """A convolution of 6 channels off its initialisation (the identity), its input (2, 9, 6), its empty state."""
    torch.manual_seed(0)
    conv = ShortConv(6, kernel).double()
    torch.nn.init.normal_(conv.weight)
    torch.nn.init.normal_(conv.bias)
    return conv, torch.randn(2, 9, 6, dtype=torch.float64), conv.init_state(2, "cpu", torch.float64)


@pytest.mark.parametrize("kernel", [1, 2, 3, 5])
def test_the_short_convolution_s_step_equals_its_parallel_form(kernel):
    conv, x, last = random_conv(kernel)
    stepped = torch.stack([conv.step(x[:, t], last) for t in range(9)], 1)
    assert last.shape == (2, kernel - 1, 6)  # the last K - 1 inputs, whatever the length
    assert report(f"K={kernel}: step - parallel", (stepped - conv(x)).abs().max().item()) < 1e-12


@pytest.mark.parametrize("kernel", [1, 2, 3, 5])
def test_the_short_convolution_s_prefill_in_pieces_equals_its_parallel_form(kernel):
    """Pieces of 1, 3 and 5 positions: each reads the last K - 1 inputs the one before left (fewer than K - 1 at
    first: zeros, as the parallel form pads)."""
    conv, x, last = random_conv(kernel)
    pieces = torch.cat([conv.prefill(x[:, a:b], last) for a, b in ((0, 1), (1, 4), (4, 9))], 1)
    assert torch.equal(last, x[:, 9 - (kernel - 1):]) if kernel > 1 else last.shape == (2, 0, 6)
    assert report(f"K={kernel}: prefill in pieces - parallel", (pieces - conv(x)).abs().max().item()) < 1e-12


def test_a_causal_convolution_does_not_see_the_future():
    conv = ShortConv(4, 3).double()
    torch.nn.init.normal_(conv.weight)
    x = torch.randn(1, 8, 4, dtype=torch.float64)
    changed = x.clone()
    changed[:, 5:] += 1.0
    assert torch.equal(conv(x)[:, :5], conv(changed)[:, :5]) and not torch.equal(conv(x)[:, 5:], conv(changed)[:, 5:])


def tiny(attn="softmax"):
    torch.manual_seed(0)
    model = ConvLM(ConvConfig(vocab_size=30, n_layer=2, n_head=2, d_model=16, d_ff=32, attn=attn, feature_size=8,
                              dropout=0.0)).double().eval()
    for conv in (m for m in model.modules() if isinstance(m, ShortConv)):
        torch.nn.init.normal_(conv.weight, std=0.5)  # not the identity it starts as
    return model


@pytest.mark.parametrize("converted", [False, True])
def test_a_conv_model_generates_with_its_recurrent_step_as_it_runs_in_parallel(converted):
    model = convert(tiny(), "t2r", feature_size=8).double().eval() if converted else tiny()
    assert type(model) is ConvLM  # convert keeps the teacher's class, its convolutions copied
    tokens = torch.randint(0, 30, (2, 12))
    state, logits = model.init_state(2), []
    for t in range(12):
        out, state = model.step(tokens[:, t], state)
        logits.append(out)
    diff = (torch.stack(logits, 1) - model(tokens)).abs().max().item()
    assert report(f"{'T2R' if converted else 'softmax'} with short convolutions: step - parallel", diff) < 1e-10


def test_a_saved_conv_config_builds_the_conv_model():
    model = tiny()
    rebuilt = build_model(model.config.to_dict())
    assert type(rebuilt) is ConvLM and rebuilt.config.short_conv == 3
    rebuilt.load_state_dict(model.state_dict())  # the same tensors, the convolutions included


# -----------------------------------------------------------------------------
# The convolution as a part a conversion adds (--short_conv; conv_student, convert's build=)

@pytest.mark.parametrize("teacher_of", ["lm", "translator"])
def test_a_conversion_adds_the_convolution_as_the_identity(teacher_of):
    """At the swap the student with a new convolution computes what the plain conversion does (the identity: the
    same logits in float64, the same random feature maps drawn), the convolutions are its only tensors beyond the
    feature maps (copy_pretrained's every-tensor check accepts them), and a translator has them in its decoder's
    self-attention alone."""
    from conftest import lm_config, make, mt_config
    from t2r import Seq2SeqTransformer, TransformerLM, new_tensors
    model_class, config = ((TransformerLM, lm_config()) if teacher_of == "lm" else (Seq2SeqTransformer, mt_config()))
    teacher = make(model_class, config)
    torch.manual_seed(1)
    plain = convert(teacher, "t2r").eval()
    torch.manual_seed(1)
    student = convert(teacher, "t2r", build=conv_student(3)).eval()
    inputs = (torch.randint(1, 37, (2, 9)),) if teacher_of == "lm" else (torch.randint(1, 37, (2, 7)),
                                                                          torch.randint(1, 37, (2, 5)))
    with torch.no_grad():
        difference = (student(*inputs) - plain(*inputs)).abs().max()
    assert report(f"{teacher_of}: with a new convolution - without, at the swap", difference) < 1e-12
    convolutions = {name for name in student.state_dict() if ".conv." in name}
    assert new_tensors(student) - new_tensors(plain) == convolutions
    assert len(convolutions) == 2 * config.n_layer and all(name.startswith("layers.") for name in convolutions)


def test_a_translator_with_convolutions_steps_and_prefills_as_it_runs_in_parallel():
    from conftest import tiny_translator
    teacher = tiny_translator("softmax")
    student = convert(teacher, "t2r", build=conv_student(3)).double().eval()
    for conv in (m for m in student.modules() if isinstance(m, ShortConv)):
        torch.nn.init.normal_(conv.weight, std=0.5)  # off the identity
    src, target = torch.randint(1, 23, (2, 6)), torch.randint(1, 23, (2, 9))
    with torch.no_grad():
        parallel = student(src, target)
    state = student.init_state(src)
    logits, state = student.prefill(target[:, :4], state)
    stepped = torch.stack([student.step(target[:, t], state)[0] for t in range(4, 9)], 1)
    diff = max((logits - parallel[:, 3]).abs().max().item(), (stepped - parallel[:, 4:]).abs().max().item())
    assert report("translator with convolutions: prefill of 4 then 5 steps - parallel", diff) < 1e-10
    assert state["layers"][0]["self"]["conv"].shape == (2, 2, 16)  # the last K - 1 inputs of each decoder layer


def test_attention_transfer_reads_the_convolutions_output():
    """During the transfer a layer passes on softmax attention of its own q, k, v: those of the convolution's output,
    so the model's logits are the softmax teacher's exactly (had the transfer skipped the convolution, they would
    not be: it is off the identity here)."""
    from after_t2r import attention_transfer
    teacher = tiny()
    student = convert(teacher, "t2r", feature_size=8).double()
    tokens = torch.randint(0, 30, (2, 10))
    with torch.no_grad():
        _, logits = attention_transfer(student, tokens)
        expected = teacher(tokens)
    difference = (logits - expected).abs().max()  # float64 (3e-10 measured); the convolution skipped: O(1)
    assert report("transfer with convolutions: logits - the teacher's", difference) < 1e-8


@pytest.mark.parametrize("script", ["train_lm.py", "train_mt.py"])
def test_the_trainers_convert_with_a_short_convolution(tmp_path, script):
    """--short_conv 3 with --init pretrained: the teacher trained first without one, the student with one (new, and
    named in the run's row); generate.py checks its recurrent form against the parallel one."""
    from conftest import MT_TINY, TINY, assert_check_passes, run_in_process, write_corpus, write_parallel
    lm = script == "train_lm.py"
    corpus = write_corpus(str(tmp_path / "tiny")) if lm else write_parallel(str(tmp_path / "toy"))
    result = run_in_process(script, "--init", "pretrained", "--dataset", corpus, *(TINY if lm else MT_TINY),
                            "--max_steps", "4", "--short_conv", "3", "--out_dir", "student", cwd=tmp_path, check=True)
    assert "| t2r+conv3+pretrain |" in result.stdout
    assert "new parameters: feature maps, convolutions only" in result.stdout
    teacher = torch.load(next(tmp_path.glob("out/*softmax-random/model.pt")), weights_only=True)
    student = torch.load(tmp_path / "student/model.pt", weights_only=True)
    assert "short_conv" not in teacher["config"] and student["config"]["short_conv"] == 3
    if script == "train_lm.py":
        out = run_in_process("generate.py", "--ckpt", "student/model.pt", "--prompt", "w1 w2", "--num_tokens", "8",
                             "--check", cwd=tmp_path, check=True)
        assert_check_passes(out.stdout)
