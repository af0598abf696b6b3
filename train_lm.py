"""
Train a language model, or convert a trained softmax one into an RNN and finetune it (T2R, section 2.2).

    python train_lm.py                              # pretrain the softmax transformer on PTB (CPU default)
    python train_lm.py --init pretrained            # the main job: pretrain if needed, swap to T2R, finetune,
                                                    # evaluate both and print the table
    python train_lm.py --attn t2r                   # T2R from random initialisation, for comparison
    python train_lm.py --resume --out_dir out/ptb-t2r-pretrained   # continue exactly where it stopped
    torchrun --nproc_per_node 2 train_lm.py ...     # data parallel (NCCL on GPUs, gloo on CPU)
    python train_lm.py --preset wt103 --dataset wikitext103        # the paper's model, for GPUs
    python train_lm.py --arch sru++ --attn_every 4  # SRU++ from scratch (sru.py), attention in 1 layer of 4
    python train_lm.py --init pretrained --pretrained hf:gpt2      # GPT-2 from Hugging Face as the teacher (support/hf.py):
                                                    # evaluated as it is, converted, finetuned with its tokenizer
                                                    # (HF_RECIPE: transfer first, then 600 steps at lr 1e-3;
                                                    # HF_PARTS: a decaying state)
    python train_lm.py --init pretrained --pretrained hf:HuggingFaceTB/SmolLM2-135M   # a Llama (or Qwen2, Mistral)

Evaluation follows section 3.2.1: windows of 512 tokens, only the last 256 of each scored.
train_run() reads top to bottom: the teacher first when missing, the run, the data, the model (resumed, converted
with t2r.convert, or new), then support/training.py's loop.
"""

import itertools
import os

import torch
import torch.nn.functional as F

from sru import SRUConfig, SRUppLM
from support import data, hf
from support.checkpoints import model_from_checkpoint
from support.configs import build_model, config_of, feature_sizes
from support.choose_layers import chosen_softmax_layers
from support.distill import DistilledFrom
from support.flags import (add_data_flags, add_model_flags, add_run_flags, adopt_defaults, adopt_saved_run,
                           apply_preset, resolve_run_flags)
from support.job import (TEACHER_RESULTS, announce_conversion, check_teacher, check_training_fits, conversion_errors,
                         finetuning, freeze_feature_maps, load_teacher, meta_twin, model_name, needs_teacher,
                         new_model, print_conversion_table, print_flags, processes, student_build, teacher_run_args,
                         trained_on)
from support.run_files import data_identity, evaluate_finished, open_finished, open_run
from support.runtime import (Parser, UserError, all_reduce_sum, autocast_context, fraction, increasing_ints,
                             non_negative_int, positive_int, run_main, unit_interval, write_json)
from support.training import Task, get_lr, train
from support.transfer import TransferFirst
from layers.config_rules import KEEP_SOFTMAX_FROM
from t2r import Config, convert

# The paper's WikiText-103 model (section 3.2.1, appendix Table 3), for GPU users.
# batch 6 x 512 = 3072 tokens per GPU and update-freq 3: on 8 GPUs the paper's ~74K tokens per update.
PRESETS = {
    "wt103": dict(n_layer=32, n_head=8, d_model=1024, d_ff=4096, dropout=0.2, layer_dropout=0.2,
                  feature_size=32, block_size=512, batch_size=6, grad_accum=3,
                  adaptive_cutoffs=[20000, 60000], adaptive_factor=4),  # fairseq's transformer_lm_wiki103
}
PRESET_FINETUNE = dict(grad_accum=1)  # appendix Table 4: update-freq 1 when finetuning
MODEL_FLAGS = ("n_layer", "n_head", "d_model", "d_ff")
# What SRU++ has no use for: it has no heads, feed-forward layers or linear attention, and nothing to convert
TRANSFORMER_FLAGS = ("attn", "n_head", "d_ff", "feature_size", "chunk_size", "window", "preset", "layer_dropout",
                     "adaptive_cutoffs", "adaptive_factor",
                     "keep_softmax_every", "keep_softmax_from", "freeze_feature_map", "pretrained", "transfer_steps", "transfer_lr")
SRU_FLAGS = ("attn_every", "d_attn")

# Pretraining schedule of the CPU default, and the finetuning one. Appendix Table 4 against Table 3:
# finetuning halves the peak learning rate, the warmup and the number of updates.
SCHEDULES = {
    "random": dict(max_steps=1200, lr=1e-3),
    "pretrained": dict(max_steps=600, lr=5e-4),
}
# A model trained elsewhere (--pretrained hf:...) converts with the recipe experiments/hf_recipe.py measured on a
# Llama trained with transformers (README, "Converting a Hugging Face model"): every layer linear, attention transfer
# first (T2R's feature maps, unless frozen; other kinds start without), then twice the steps of the sweep's base; and
# a T2R conversion with the parts since T2R that python -m experiments.since_t2r --stage hf measured best on it
# (results/since_t2r.md: a decaying state; --no-decay for T2R's own)
HF_RECIPE = dict(max_steps=600, lr=1e-3, transfer_steps=100)
HF_PARTS = dict(decay=True)


def get_args(argv=None):
    p = Parser(prog="train_lm.py", description="Pretrain a transformer LM, or convert one to T2R and finetune.")
    g = add_data_flags(p, "ptb", "ptb (offline default), wikitext103, or a folder of train/valid/test text files",
                       "where the dataset lives or is downloaded (wikitext103: data/wikitext103)")
    g.add_argument("--tokenizer", default="word", choices=["word", "bpe"], help="word-level (the paper's setting) or BPE (--pretrained hf:... brings its own)")
    g.add_argument("--vocab_size", type=positive_int, default=8000, help="BPE vocabulary size (word level uses every training word)")
    g.add_argument("--cache_dir", default="data/cache", help="where token ids are cached as numpy memmaps")
    g = add_model_flags(p, dict(n_layer=4, n_head=4, d_model=256, d_ff="4 * d_model"), dropout=0.3, feature_size=32)
    g.add_argument("--preset", default=None, choices=sorted(PRESETS), help="the paper's WikiText-103 model (32 layers, 1024/4096)")
    g.add_argument("--layer_dropout", type=fraction, default=0.0, help="LayerDrop: probability of skipping a layer in training")
    g.add_argument("--adaptive_cutoffs", type=increasing_ints, default=[], help="adaptive input and softmax: vocabulary cutoffs by frequency, e.g. 20000,60000 (word level; default none)")
    g.add_argument("--adaptive_factor", type=positive_int, default=4, help="with --adaptive_cutoffs: each band has 1/factor the dimensions of the one before")
    g.add_argument("--keep_softmax_every", type=non_negative_int, default=0, help="with --init pretrained: keep every n-th layer from the top softmax (4: 'T2R 75%%')")
    g.add_argument("--keep_softmax_from", default="nth", choices=KEEP_SOFTMAX_FROM, help="with --keep_softmax_every n: the first layer kept is the n-th from the top (nth) or the top one (top)")
    g.add_argument("--freeze_feature_map", action="store_true", help="finetune with the feature-map MLP frozen (the paper's 'T2R MLP frozen' analysis)")
    g.add_argument("--arch", default="transformer", choices=["transformer", "sru++"], help="sru++: the SRU++ RNN of sru.py, trained from scratch")
    g.add_argument("--attn_every", type=non_negative_int, default=1, help="SRU++: attention in every k-th layer (0: none)")
    g.add_argument("--d_attn", type=non_negative_int, default=0, help="SRU++: attention size d' (default d_model / 4)")
    g = add_run_flags(p, SCHEDULES, weight_decay=0.01, log_interval=25, eval_interval=250)
    g.add_argument("--batch_size", type=positive_int, default=8, help="sequences per micro-batch (per process)")
    g.add_argument("--block_size", type=positive_int, default=512, help="tokens per training sequence")
    g.add_argument("--min_lr_ratio", type=unit_interval, default=0.1, help="final learning rate as a fraction of the peak")
    g = p.add_argument_group("evaluation")
    g.add_argument("--eval_windows", type=positive_int, default=40, help="validation windows used by the periodic evaluation (the final one uses all)")
    g.add_argument("--eval_context", type=positive_int, default=512, help="tokens of context per evaluation window")
    g.add_argument("--eval_score", type=positive_int, default=256, help="tokens scored at the end of each window (stride)")
    g.add_argument("--eval_batch_size", type=positive_int, default=8, help="windows per evaluation batch")
    args = adopt_saved_run(p, argv, saved_run_dir)
    check_arch_flags(args, p)
    if hf.is_hf(args.pretrained):
        check_gpt2_flags(args, p)
        transfer = args.attn in (None, "t2r") and not args.freeze_feature_map  # it trains T2R's feature maps
        parts = HF_PARTS if transfer and not args.window else {}  # measured on T2R alone, its feature maps trained
        adopt_defaults(args, {**HF_RECIPE, **parts} if transfer else {**HF_RECIPE, "transfer_steps": 0})
    if args.arch == "sru++":
        args.attn = sru_name(args)  # names the run and its row in the tables
        args.compile = False if args.compile is None else args.compile  # a loop over time: compile would unroll it
    apply_preset(args, PRESETS, PRESET_FINETUNE)
    resolve_run_flags(args, p, SCHEDULES, warmup_divisor=10, default_out_dir=default_out_dir)
    if not 0 < args.eval_score <= args.eval_context:
        p.error("--eval_score must be between 1 and --eval_context")
    check_data_flags(args, p)
    return args


def check_data_flags(args, parser):
    """The flags that --tokenizer or --window would otherwise quietly ignore."""
    if "vocab_size" in args.explicit and args.tokenizer == "word":
        parser.error("--vocab_size sizes a BPE vocabulary (word level keeps every training word): add --tokenizer bpe")
    if args.tokenizer == "bpe" and args.vocab_size < data.MIN_BPE_VOCAB:
        parser.error(f"--vocab_size {args.vocab_size}: a byte-level BPE has at least {data.MIN_BPE_VOCAB} tokens "
                     f"(256 bytes and <eos>)")
    if args.window and args.window >= max(args.block_size, args.eval_context):
        parser.error(f"--window {args.window} covers every training and evaluation context (--block_size "
                     f"{args.block_size}, --eval_context {args.eval_context}): that model is softmax throughout; "
                     f"use a smaller window")


def check_arch_flags(args, parser):
    given = [name for name in (TRANSFORMER_FLAGS if args.arch == "sru++" else SRU_FLAGS) if name in args.explicit]
    if args.arch == "sru++" and args.init == "pretrained":
        parser.error("--arch sru++ trains from scratch (there is no SRU++ teacher to convert): drop --init pretrained")
    if given and args.arch == "sru++":
        parser.error(f"--{given[0]} is a transformer flag, which SRU++ does not use: drop it")
    if given:
        parser.error(f"--{given[0]} is an SRU++ flag: add --arch sru++")
    if args.attn_every > (args.n_layer or 4):
        parser.error(f"--attn_every {args.attn_every} is larger than the {args.n_layer or 4} layers: no layer would "
                     f"attend (use 0 for none, or {args.n_layer or 4} for the top layer only)")


def check_gpt2_flags(args, parser):
    if args.init != "pretrained":
        parser.error(f"--pretrained {args.pretrained} is a model to convert: add --init pretrained")
    given = [name for name in ("tokenizer", "vocab_size") if name in args.explicit]
    if given:
        parser.error(f"--{given[0]}: {args.pretrained} cuts the data with its own tokenizer (its tokenizer.json): "
                     "drop the flag")


def sru_name(args) -> str:
    """sru++ (attention in every layer), sru++every4 (in every 4th), sru++noattn (none)."""
    return {1: "sru++", 0: "sru++noattn"}.get(args.attn_every, f"sru++every{args.attn_every}")


def default_out_dir(args, attn: str, init: str) -> str:
    """out/<dataset>-<attn>-<init>; a Hugging Face model's conversion is named after it: out/ptb-t2r-gpt2."""
    if init == "pretrained" and hf.is_hf(args.pretrained):
        init = os.path.basename(os.path.normpath(args.pretrained.removeprefix(hf.PREFIX)))
    return os.path.join("out", f"{os.path.basename(os.path.normpath(args.dataset))}-{attn}-{init}")


def saved_run_dir(args, attn: str, init: str) -> str:
    """The folder --resume continues when no --out_dir is given: an SRU++ run's is named by sru_name."""
    return default_out_dir(args, sru_name(args) if args.arch == "sru++" else attn, init)


def sru_config(args, vocab_size: int) -> SRUConfig:
    return SRUConfig(vocab_size=vocab_size, n_layer=args.n_layer or 4, d_model=args.d_model or 256,
                     d_attn=args.d_attn, attn_every=args.attn_every, dropout=args.dropout)


def model_config(args, vocab_size: int) -> Config:
    d_model = args.d_model or 256
    return config_of(dict(vocab_size=vocab_size, n_layer=args.n_layer or 4, n_head=args.n_head or 4, d_model=d_model,
                          d_ff=args.d_ff or 4 * d_model, dropout=args.dropout, layer_dropout=args.layer_dropout,
                          attn=args.attn, feature_size=args.feature_size, chunk_size=args.chunk_size,
                          window=args.window, short_conv=args.short_conv, decay=args.decay,
                          adaptive_cutoffs=args.adaptive_cutoffs, adaptive_factor=args.adaptive_factor))


# -----------------------------------------------------------------------------
# The run: how the model is made, then the loop

def main(argv=None):
    args = get_args(argv)
    with processes(args) as ddp:  # one, or torchrun's
        return train_run(args, ddp)


def train_run(args, ddp) -> dict:
    """One run, in order: the softmax teacher (trained first where --init pretrained finds none), the run's folder,
    the data, the model (resumed, converted from the teacher, or new), then the loop, or --eval_only's evaluation."""
    teacher_results = None
    if needs_teacher(args):  # --init pretrained finds no finished teacher: its own run, in its own out_dir, first
        teacher_results = train_run(teacher_run_args(args, SCHEDULES, LMTask.teacher_overrides(args)), ddp)
    task = LMTask(args, ddp)
    checkpoint = open_finished(task) if args.eval_only else open_run(task)  # None: a new run in --out_dir
    task.load_data(checkpoint)  # may fit --block_size and --eval_context to a checkpoint's positions
    print_flags(args, ddp)
    torch.manual_seed(args.seed)  # the same initialisation on every process
    if checkpoint is not None:  # --resume, --eval_only: the run in --out_dir
        model = model_from_checkpoint(checkpoint, args.out_dir)
    elif args.init == "pretrained" and args.attn == "softmax":  # a control: the teacher trained on, not swapped
        model = trained_on(load_lm_teacher(args, task), finetuning(args))
        announce_conversion(model, args)
    elif args.init == "pretrained":  # section 2.2: swap a trained softmax model's attention, then finetune
        teacher = load_lm_teacher(args, task)
        with conversion_errors(args):  # one line for what the teacher refuses (--keep_softmax_every past its layers)
            check_training_fits(task, lambda: convert(meta_twin(teacher), **conversion(args)))  # its shapes first
            kept = chosen_softmax_layers(teacher, task, conversion(args), args.keep_softmax) if args.keep_softmax else ()
            model = convert(teacher, **conversion(args), keep_softmax_layers=kept)  # kept: layers chosen by data
        announce_conversion(model, args)
    elif args.arch == "sru++":  # SRU++ (sru.py), from random initialisation
        model = new_model(task, SRUppLM, sru_config, task.data.vocab_size)
    else:  # a transformer from random initialisation: softmax, or T2R from scratch
        model = new_model(task, build_model, model_config, task.data.vocab_size)
    freeze_feature_maps(model, args.freeze_feature_map)
    if args.eval_only:
        return evaluate_finished(task, model, checkpoint)
    if args.distill_weight:  # KL to the teacher's logits mixed into the finetuning's loss: support/distill.py
        task = DistilledFrom(task, distillation_teacher(args), model)
    if args.transfer_steps:  # attention transfer first (after_t2r.py), a stage of its own: support/transfer.py
        task = TransferFirst(task, checkpoint)
    results = train(task, model, checkpoint)
    if args.init == "pretrained":  # a resumed conversion's too (--eval_only returned above)
        print_conversion_table(LMTask, args, ddp, teacher_results, results, default_out_dir)
    return results


def conversion(args) -> dict:
    """t2r.convert's arguments for these flags: the kind and k, the layers kept softmax, the finetuning's dropout,
    chunks and LayerDrop, and with --window, --short_conv or --decay the student that has them (student_build)."""
    return dict(attn=args.attn, feature_size=args.feature_size, keep_softmax_every=args.keep_softmax_every,
                keep_softmax_from=args.keep_softmax_from, build=student_build(args), **finetuning(args))


# -----------------------------------------------------------------------------
# What the training loop needs to know about a language model

class LMTask(Task):
    SCHEDULES = SCHEDULES
    BATCH_FLAGS = "--batch_size or --block_size"

    def tokens_per_step(self):  # of one micro-batch: --grad_accum's run one after another
        return self.args.batch_size * self.args.block_size

    def __init__(self, args, ddp):
        super().__init__(args, ddp)
        self.generator = torch.Generator().manual_seed(args.seed + ddp.rank)  # a batch order per process

    def load_data(self, checkpoint):
        args = self.args
        if checkpoint is None and args.init == "pretrained" and hf.is_hf(args.pretrained):  # GPT-2 brings its own
            folder = hf.folder_of(args.pretrained)  # tokenizer, kept with the run's flags (generate.py finds it)
            fit_positions(*hf.context_limit(folder), args, args.pretrained)  # before any work
            args.tokenizer = hf.tokenizer_file(folder)
            if self.ddp.is_main:
                print(hf.describe(folder, args.tokenizer))
        elif checkpoint is not None:
            fit_positions(checkpoint["config"].get("max_positions"), "its learned positions", args, args.out_dir)
        self.data = load_data(args)
        if len(self.data.train) <= args.block_size:
            raise UserError(f"the training split has {len(self.data.train)} tokens, not more than --block_size "
                            f"{args.block_size}: use a smaller --block_size or more data")
        if checkpoint is not None and checkpoint["config"]["vocab_size"] != self.data.vocab_size:
            raise UserError(f"{args.out_dir} has a vocabulary of {checkpoint['config']['vocab_size']}, the data has "
                            f"{self.data.vocab_size}: pass the --dataset and --tokenizer it was trained with")
        if args.tokenizer != "bpe":  # --vocab_size sizes a BPE: a word or a pretrained vocabulary is the data's own,
            args.vocab_size = self.data.vocab_size  # which args.json records

    def checkpoint_extras(self):  # the tokenizer travels with the weights: generate.py needs no token cache
        return {"tokenizer": self.data.saved()}

    def identity(self):
        return data_identity(self.data)

    def lr(self, step):
        a = self.args
        return get_lr(step, a.lr, a.lr * a.min_lr_ratio, a.warmup_steps, a.max_steps)

    def batch(self, counter):
        x, y = data.get_batch(self.data.train, self.args.batch_size, self.args.block_size, self.generator)
        return (x.to(self.device, non_blocking=True),), y.to(self.device, non_blocking=True), None

    def objective(self, logits, y):
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    @property
    def validation_name(self) -> str:  # the periodic figure is a part of the final one: said so
        return f"validation loss (its first {self.args.eval_windows} windows)"

    def validation_loss(self, model):
        r = evaluate(model, self.data.valid, self.data.eos_id, self.args, self.device, self.dtype, self.ddp,
                     self.args.eval_windows)
        return r["nll"] / r["tokens"]

    def report(self, model, train_seconds, name: str | None = None):
        """The final evaluation (results.json), printed under `name` (default: the run's folder)."""
        args = self.args
        results = {split: perplexities(evaluate(model, getattr(self.data, split), self.data.eos_id, args, self.device,
                                                self.dtype, self.ddp), self.data.n_words.get(split), args.tokenizer)
                   for split in ("valid", "test")}
        k = feature_sizes(model.config)[0] if isinstance(model.config, Config) else None
        results.update(train_minutes=train_seconds / 60, k=k,
                       attn=model_name(args))
        if self.ddp.is_main:
            line = f"valid ppl {results['valid']['ppl']:.2f} | test ppl {results['test']['ppl']:.2f}"
            if "word_ppl" in results["test"]:
                line += f" | word-level valid {results['valid']['word_ppl']:.2f} test {results['test']['word_ppl']:.2f}"
            print(f"{name or args.out_dir}: {line} | {results['train_minutes']:.1f} train minutes")
        return results

    @staticmethod
    def teacher_overrides(args):
        if args.preset and "grad_accum" not in args.explicit:
            return {"grad_accum": PRESETS[args.preset]["grad_accum"]}  # Table 3's update-freq, not Table 4's
        return {}

    @staticmethod
    def print_table(rows):
        words = all("word_ppl" in r["test"] for _, r in rows)  # token-level ppl beside word-level, for BPE
        print("\n| model | k | valid ppl | test ppl |" + (" valid word ppl | test word ppl |" if words else "")
              + " train minutes |\n|---|---|---|---|" + ("---|---|" if words else "") + "---|")
        for name, r in rows:
            word_columns = f" {r['valid']['word_ppl']:.2f} | {r['test']['word_ppl']:.2f} |" if words else ""
            print(f"| {name} | {r['k'] or '-'} | {r['valid']['ppl']:.2f} | {r['test']['ppl']:.2f} |{word_columns} "
                  f"{r['train_minutes']:.1f} |")


def fit_positions(limit: int | None, setting: str, args, source: str):
    """A checkpoint's context (GPT-2's learned positions end at n_positions; a rotary model was trained up to its
    max_position_embeddings): --block_size and --eval_context left at their defaults shrink to it (and --eval_score
    to half of it); every flag given past it is refused, all in one line."""
    if not limit:
        return
    longer = [f for f in ("block_size", "eval_context", "eval_score") if getattr(args, f) > limit]
    given = [f for f in longer if f in args.explicit]
    if given:
        named = ", ".join(f"--{f} {getattr(args, f)}" for f in given)
        raise UserError(f"{named} {'is' if len(given) == 1 else 'are'} longer than the {limit} positions {source} "
                        f"supports ({setting}): use at most {limit}")
    for flag in longer:
        setattr(args, flag, limit)
    if longer and "eval_score" not in args.explicit:  # at most half the context: a scored token sees half of it
        args.eval_score = min(args.eval_score, args.eval_context // 2)
    if longer:
        print(f"{source} supports {limit} positions ({setting}): " +
              ", ".join(f"--{f} {getattr(args, f)}" for f in longer))


def protocol(args, lm) -> str:
    """How a perplexity here is measured, in words: what its owner's evaluation must do to give the same number."""
    return (f"perplexity over every token of each split, each predicted once with up to {args.eval_context} tokens of "
            f"context (windows advancing by {args.eval_score}, their last {args.eval_score} scored); the first "
            f"token predicted after token {lm.eos_id} ({lm.tokenizer.id_to_token(lm.eos_id)!r}, the end of a line)")


def distillation_teacher(args):
    """The softmax teacher --distill_weight distils, read again as it is (a resumed run's too: nothing of it is
    saved with the student)."""
    if hf.is_hf(args.pretrained):
        return hf.load(hf.folder_of(args.pretrained))
    return model_from_checkpoint(load_teacher(args, "pretrained checkpoint"), args.pretrained)


def load_lm_teacher(args, task):
    """The softmax language model --init pretrained converts: a Hugging Face GPT-2 (evaluated as it is first: the
    table's teacher row), or a model.pt of ours."""
    lm = task.data
    if hf.is_hf(args.pretrained):
        teacher = hf.load(hf.folder_of(args.pretrained))
        if teacher.config.vocab_size < lm.vocab_size:  # more is a table padded past the tokenizer (Qwen2.5's): kept
            raise UserError(f"{args.pretrained} has {teacher.config.vocab_size} token embeddings, its tokenizer.json "
                            f"{lm.vocab_size} tokens: they must be the same model's")
        check_teacher({"config": teacher.config.to_dict()}, args, MODEL_FLAGS)
        if "dropout" not in args.explicit:
            args.dropout = teacher.config.dropout  # GPT-2's own (resid_pdrop), not the small model's default
        check_training_fits(task, lambda: meta_twin(teacher))  # before its evaluation (hours for a large model)
        print(f"{args.pretrained} as it is (softmax, not finetuned); {protocol(args, lm)}:")
        results = task.report(teacher.to(task.device), 0.0, name=args.pretrained)  # not under the student's folder
        if task.ddp.is_main:
            write_json(os.path.join(args.out_dir, TEACHER_RESULTS), {**results, "attn": f"{args.pretrained} (softmax)"})
        return teacher
    checkpoint = load_teacher(args, "pretrained checkpoint")
    if checkpoint["config"].get("n_encoder_layer"):
        raise UserError(f"{args.pretrained} is a translation model, not a language model")
    if checkpoint["config"]["vocab_size"] != lm.vocab_size:
        raise UserError(f"{args.pretrained} has a vocabulary of {checkpoint['config']['vocab_size']}, the data has "
                        f"{lm.vocab_size}: pretrain on the same --dataset and --tokenizer, or pass the matching --pretrained")
    check_teacher(checkpoint, args, MODEL_FLAGS, given_flags=("adaptive_cutoffs", "adaptive_factor"))
    teacher_tokenizer = checkpoint.get("identity", {}).get("tokenizer")
    if teacher_tokenizer not in (None, data_identity(lm)["tokenizer"]):
        raise UserError(f"{args.pretrained} was trained with another tokenizer than this data's (its corpus changed "
                        f"since, or it is another corpus of the same size): pretrain on this --dataset")
    return model_from_checkpoint(checkpoint, args.pretrained)


def load_data(args):
    try:
        return data.prepare(args.dataset, args.data_dir, tokenizer=args.tokenizer,
                            vocab_size=args.vocab_size if args.tokenizer == "bpe" else None, cache_dir=args.cache_dir)
    except data.DataError as error:
        raise UserError(str(error)) from None


# -----------------------------------------------------------------------------
# Evaluation (section 3.2.1)

@torch.no_grad()
def evaluate(model, ids, eos_id, args, device, dtype, ddp, max_windows=None) -> dict:
    """Negative log-likelihood of every token, each predicted with up to eval_context tokens of context
    and scored once (the last eval_score tokens of each window). Returns the summed NLL and counts."""
    model.eval()
    # bos=<eos>: the first token is predicted after an end of line, so every token is scored once
    windows = data.eval_windows(ids, args.eval_context, args.eval_score, bos=eos_id)
    windows = list(itertools.islice(windows, max_windows))[ddp.rank :: ddp.world_size]
    totals = torch.zeros(2, dtype=torch.float64, device=device)  # summed NLL, scored tokens (on device for NCCL)
    for i in range(0, len(windows), args.eval_batch_size):
        batch = windows[i : i + args.eval_batch_size]
        for x, y, mask in group_by_length(batch):
            x, y, mask = x.to(device), y.to(device), mask.to(device)
            with autocast_context(device, dtype):
                logits = model(x)
            nll = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none")
            totals[0] += (nll * mask.flatten()).sum()
            totals[1] += mask.sum()
    model.train()
    totals = all_reduce_sum(totals, ddp)
    return {"nll": totals[0].item(), "tokens": int(totals[1].item())}


def group_by_length(windows):
    """Stack windows of equal length (only the first window of a split can be shorter)."""
    by_length = {}
    for x, y, mask in windows:
        by_length.setdefault(len(x), []).append((x, y, mask))
    for same in by_length.values():
        yield tuple(torch.stack([torch.as_tensor(w[j]) for w in same]) for j in range(3))


def perplexities(result: dict, n_words: int | None, tokenizer: str) -> dict:
    """Token-level ppl = exp(NLL / scored tokens); with subword tokens (BPE, GPT-2's), word-level ppl too, comparable
    with the literature and across tokenizers: exp(NLL / n_words), n_words being the split's whitespace-separated
    words plus one <eos> a line (PTB's test set: 82,430). evaluate() scores every token of the split once, so the
    NLL sums over exactly the text whose words n_words counts."""
    out = {"ppl": float(torch.tensor(result["nll"] / result["tokens"]).exp()), "tokens": result["tokens"]}
    if tokenizer != "word" and n_words:
        out["word_ppl"] = float(torch.tensor(result["nll"] / n_words).exp())
    return out


if __name__ == "__main__":
    run_main(main)
