"""A model trained elsewhere is measured as its owner would: the teacher perplexity train_lm.py reports for an hf:
checkpoint equals a `transformers` evaluation of the same model on the tokenizer's own encoding of the file, under
the protocol the teacher line states (a BPE Llama; a word-level GPT-2)."""

import json

import pytest

from conftest import run_in_process, save_randomised, write_corpus
from experiments.hf_recipe import owner_perplexity
from test_hf import FINETUNE


def teacher_row(folder, corpus, tmp_path):
    argv = ["--init", "pretrained", "--pretrained", f"hf:{folder}", "--dataset", corpus, "--out_dir",
            str(tmp_path / "run"), "--cache_dir", str(tmp_path / "cache"), *FINETUNE, "--max_steps", "1"]
    result = run_in_process("train_lm.py", *argv, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    line = next(line for line in result.stdout.splitlines() if "as it is (softmax, not finetuned); perplexity" in line)
    print(line)
    return json.loads((tmp_path / "run" / "teacher_results.json").read_text()), line


def word_level_gpt2(tmp_path):
    """A tiny GPT-2 over a word-level tokenizer.json of the corpus (<eos> ends each line), saved by save_pretrained."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel
    corpus = write_corpus(str(tmp_path / "tiny"))
    words = sorted({w for split in ("train", "valid", "test") for w in open(f"{corpus}/{split}.txt").read().split()})
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["<unk>", "<eos>", *words])}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    config = GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=64, vocab_size=tokenizer.get_vocab_size())
    model = save_randomised(lambda: GPT2LMHeadModel(config), tokenizer, tmp_path / "gpt2")
    return tmp_path / "gpt2", corpus, model, tokenizer


@pytest.mark.parametrize("kind", ["llama (byte-level BPE)", "gpt2 (word level)"])
def test_the_teacher_perplexity_is_its_owners(kind, tiny_llamas, tmp_path):
    if kind.startswith("llama"):
        folder, corpus, model = tiny_llamas["llama"]
        from tokenizers import Tokenizer
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        encode = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # the file as it is
    else:
        folder, corpus, model, tokenizer = word_level_gpt2(tmp_path)
        eos = tokenizer.token_to_id("<eos>")
        encode = lambda text: [i for line in text.split("\n")[:-1] for i in tokenizer.encode(line).ids + [eos]]
    results, line = teacher_row(folder, corpus, tmp_path)
    first = int(line.split("the first token predicted after token ")[1].split(" ")[0])
    for split in ("valid", "test"):
        ids = encode(open(f"{corpus}/{split}.txt").read())
        theirs = owner_perplexity(model.float().eval(), ids, 32, 16, first)
        print(f"{kind} {split}: ours {results[split]['ppl']:.6f}, transformers {theirs:.6f}")
        assert results[split]["ppl"] == pytest.approx(theirs, rel=1e-4)
