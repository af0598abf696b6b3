"""Softmax layers chosen by data (support/choose_layers.py, --keep_softmax N): the ranking's arithmetic, that it
leaves the run's batches as they were, that it can find the layer that matters, and the trainers' runs that use it.

    python -m pytest -q -s tests/test_choose_layers.py
"""

import json
from types import SimpleNamespace

import pytest
import torch

from conftest import MT_TINY, TINY, assert_flags_refused, lm_config, make, run_in_process, write_corpus, write_parallel
from support.choose_layers import distilled_kl, rank_layers
from t2r import TransformerLM, convert


class RandomTokens:
    """A task of random token windows from its own generator, as LMTask's batches are drawn."""

    def __init__(self, vocab: int = 37):
        self.args, self.device, self.vocab = SimpleNamespace(seed=0, lr=1e-3), torch.device("cpu"), vocab
        self.generator = torch.Generator().manual_seed(5)

    def batch(self, counter):
        x = torch.randint(0, self.vocab, (4, 12), generator=self.generator)
        return (x,), x, None


def test_the_ranking_scores_every_layer_against_none_and_leaves_the_batches_alone():
    teacher = make(TransformerLM, lm_config("softmax", n_layer=3), torch.float32)
    task = RandomTokens()
    before = task.generator.get_state()
    ranking = rank_layers(teacher, task, dict(attn="t2r", feature_size=6), steps=3, batches=2)
    again = rank_layers(teacher, task, dict(attn="t2r", feature_size=6), steps=3, batches=2)
    print(ranking)
    assert sorted(layer for layer, _, _ in ranking) == [0, 1, 2]
    assert [gain for _, _, gain in ranking] == sorted((gain for _, _, gain in ranking), reverse=True)
    assert ranking == again and torch.equal(task.generator.get_state(), before)
    torch.manual_seed(task.args.seed)  # the all-linear student, distilled on its own: every gain is against its KL
    all_linear = distilled_kl(convert(teacher, attn="t2r", feature_size=6).train(), teacher, RandomTokens(), 3, 2)
    for layer, kl, gain in ranking:
        assert abs(kl + gain - all_linear) < 1e-6, (layer, kl + gain, all_linear)


def test_the_ranking_finds_the_layer_whose_attention_the_teacher_needs():
    """A teacher whose top layer's attention is sharp (its q and k scaled up) and whose bottom layer's is blurred to
    nearly uniform: keeping the sharp one softmax gains the most."""
    teacher = make(TransformerLM, lm_config("softmax", n_layer=2), torch.float32)
    with torch.no_grad():
        for layer, scale in ((teacher.layers[0], 0.01), (teacher.layers[1], 6.0)):
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                proj.weight.mul_(scale), proj.bias.mul_(scale)
    ranking = rank_layers(teacher, RandomTokens(), dict(attn="t2r", feature_size=6), steps=10, batches=4)
    print(ranking)
    assert ranking[0][0] == 1 and ranking[0][2] > 0


@pytest.mark.parametrize("script", ["train_lm.py", "train_mt.py"])
def test_the_trainers_keep_the_layer_the_ranking_chose(tmp_path, script):
    lm = script == "train_lm.py"
    corpus = write_corpus(str(tmp_path / "tiny")) if lm else write_parallel(str(tmp_path / "toy"))
    result = run_in_process(script, "--init", "pretrained", "--dataset", corpus, *(TINY if lm else MT_TINY),
                            "--max_steps", "4", "--keep_softmax", "1", "--out_dir", "student", cwd=tmp_path, check=True)
    saved = json.loads((tmp_path / "student/softmax_layers.json").read_text())
    kinds = torch.load(tmp_path / "student/model.pt", weights_only=True)["config"]["attn"]
    print(saved)
    assert saved["kept"] == [saved["ranking"][0]["layer"]] and kinds[saved["kept"][0]] == "softmax"
    assert kinds.count("softmax") == 1 and "softmax layers chosen by data" in result.stdout
    assert "| t2r+chosen1+pretrain |" in result.stdout


@pytest.mark.parametrize("flags, message", [
    ("--keep_softmax 1", "--keep_softmax keeps some of a converted model's layers softmax"),
    ("--init pretrained --keep_softmax 1 --keep_softmax_every 4", "--keep_softmax chooses the layers by data")])
def test_keep_softmax_is_refused_where_it_cannot_work(capsys, flags, message):
    import train_lm
    assert_flags_refused(train_lm.get_args, flags.split(), message, capsys)
