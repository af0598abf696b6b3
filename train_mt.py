"""
Train a translator, or convert a trained softmax translator's decoder into an RNN and finetune it (T2R, 3.2.2).

    python train_mt.py                              # train the softmax translator on the offline corpus (en-de)
    python train_mt.py --init pretrained            # the main job: train the softmax model if needed, swap its
                                                    # decoder to T2R (causal k=4, cross k=32), finetune, BLEU table
    python train_mt.py --attn t2r                   # T2R from random initialisation, for comparison
    python train_mt.py --resume --out_dir out/mt-libreoffice-en-de-t2r-pretrained   # continue exactly
    torchrun --nproc_per_node 2 train_mt.py ...     # data parallel (NCCL on GPUs, gloo on CPU)
    echo "Click OK." | python translate.py --ckpt out/mt-libreoffice-en-de-t2r-pretrained/model.pt

The offline corpus is the LibreOffice help in English and German (support/mt_data.py). The final model averages the
last snapshots (model.pt); BLEU comes from translate.py's beam search on recurrent states.
train_run() reads top to bottom: the teacher first when missing, the run, the data, the model (resumed, converted
with t2r.convert, or new), then support/training.py's loop.
"""

import glob
import os

import torch
import torch.nn.functional as F

from support import mt_data
from support.checkpoints import model_from_checkpoint, read_checked, save_checkpoint
from support.configs import build_model, config_of, feature_sizes
from support.choose_layers import chosen_softmax_layers
from support.distill import DistilledFrom
from support.flags import (add_data_flags, add_model_flags, add_run_flags, adopt_saved_run, apply_preset,
                           resolve_run_flags)
from support.inference import inference_model
from support.job import (announce_conversion, check_teacher, check_training_fits, finetuning, load_teacher, meta_twin,
                         model_name, needs_teacher, new_model, print_conversion_table, print_flags, processes,
                         student_build, teacher_run_args, trained_on)
from support.mt_data import PAD_ID
from support.runtime import (Parser, UserError, all_reduce_sum, autocast_context, fingerprint, fraction,
                             non_negative_int, positive_int, run_main)
from support.run_files import evaluate_finished, open_finished, open_run
from support.training import Task, get_lr_inverse_sqrt, train
from support.transfer import TransferFirst
from t2r import Config, convert
from translate import add_decoding_flags, check_decoding_fits, evaluate_bleu

# Schedules of the CPU default. Appendix Tables 5 and 6: finetuning lowers the peak learning rate (5e-4 -> 2e-4)
# and the number of updates (30K -> 20K), with the same inverse square-root warmup.
SCHEDULES = {
    "random": dict(max_steps=1100, lr=1e-3),
    "pretrained": dict(max_steps=450, lr=4e-4),
}
MODEL_FLAGS = ("n_layer", "n_encoder_layer", "n_head", "d_model", "d_ff")
MODEL_DEFAULTS = dict(n_layer=3, n_encoder_layer=3, n_head=4, d_model=256, d_ff=1024)
# The paper's translator, appendix Table 5 (fairseq's transformer_vaswani_en_de_big: post-norm), for 8 GPUs:
# 3584 tokens x 16 accumulated x 8 processes ~ 460K tokens per update; the last five epochs averaged (an epoch of
# WMT14 en-de is ~300 such updates). With --init pretrained, Table 6: the same batch and averaging, a lower rate
# and fewer updates.
PRESETS = {"wmt14": dict(n_layer=6, n_encoder_layer=6, n_head=16, d_model=1024, d_ff=4096, dropout=0.3, post_norm=True,
                         max_tokens=3584, grad_accum=16, weight_decay=0.0, lr=5e-4, warmup_steps=4000,
                         max_steps=30000, average_last=5, snapshot_interval=300)}
PRESET_FINETUNE = dict(lr=2e-4, max_steps=20000)


def get_args(argv=None):
    p = Parser(prog="train_mt.py", description="Train a translator, or convert its decoder to T2R and finetune.")
    g = add_data_flags(p, "libreoffice", "libreoffice (offline default), multi30k, or a folder with train/valid/test.<lang> files",
                       "where the corpus is fetched and prepared (default data/mt/<dataset>)")
    g.add_argument("--src", default="en", help="source language (libreoffice: en or de)")
    g.add_argument("--tgt", default="de", help="target language")
    g.add_argument("--vocab_size", type=positive_int, default=8000, help="joint BPE vocabulary size (source and target share it)")
    g.add_argument("--max_len", type=positive_int, default=128, help="training pairs with a side longer than this (tokens) are skipped")
    g = add_model_flags(p, MODEL_DEFAULTS, dropout=0.1, feature_size=4)  # the paper: dropout 0.3
    g.add_argument("--n_encoder_layer", type=positive_int, default=None, help="encoder layers (default 3; the encoder is always softmax)")
    g.add_argument("--cross_feature_size", type=positive_int, default=32, help="k of the decoder's cross attention")
    g.add_argument("--post_norm", action="store_true", help="LayerNorm after each residual sum (Vaswani et al.; the paper's translator) instead of before")
    g.add_argument("--preset", default=None, choices=sorted(PRESETS), help="the paper's translator (6+6 layers, 1024/4096, post-norm) with its batch, schedule and averaging, for 8 GPUs")
    g = add_run_flags(p, SCHEDULES, weight_decay=0.0, log_interval=50, eval_interval=100)
    g.add_argument("--max_tokens", type=positive_int, default=2048, help="tokens (padding included) per batch, source or target side")
    g.add_argument("--label_smoothing", type=fraction, default=0.1, help="label smoothing epsilon")
    g.add_argument("--average_last", type=positive_int, default=5, help="the final model averages the last N snapshots (1: the last weights)")
    g.add_argument("--snapshot_interval", type=positive_int, default=20, help="steps between the snapshots that --average_last averages")
    g = add_decoding_flags(p)  # for the BLEU of the final model
    g.add_argument("--bleu_sentences", type=non_negative_int, default=0, help="score only the first N valid/test sentences (0: all)")
    # the inverse square-root schedule does not depend on --max_steps: --resume --max_steps N (larger) trains a
    # run on, towards its plateau, exactly as a run started with N steps (and the same --warmup_steps) would go
    args = adopt_saved_run(p, argv, default_out_dir, growable=("max_steps",))
    apply_preset(args, PRESETS, PRESET_FINETUNE)
    resolve_run_flags(args, p, SCHEDULES, warmup_divisor=8, default_out_dir=default_out_dir)
    if args.max_tokens < args.max_len + 1:
        p.error(f"--max_tokens {args.max_tokens} cannot hold one sentence of --max_len {args.max_len}")
    if args.vocab_size < mt_data.MIN_BPE_VOCAB:
        p.error(f"--vocab_size {args.vocab_size}: a byte-level BPE has at least {mt_data.MIN_BPE_VOCAB} tokens "
                f"(256 bytes and {len(mt_data.SPECIALS)} specials)")
    return args


def default_out_dir(args, attn: str, init: str) -> str:
    name = os.path.basename(os.path.normpath(args.dataset))
    return os.path.join("out", f"mt-{name}-{args.src}-{args.tgt}-{attn}-{init}")


def model_config(args, vocab_size: int) -> Config:
    sizes = {name: getattr(args, name) or MODEL_DEFAULTS[name] for name in MODEL_FLAGS}
    return config_of(dict(vocab_size=vocab_size, **sizes, dropout=args.dropout, attn=args.attn,
                          feature_size=args.feature_size, cross_attn=args.attn,
                          cross_feature_size=args.cross_feature_size, chunk_size=args.chunk_size, window=args.window,
                          short_conv=args.short_conv, decay=args.decay, pre_norm=not args.post_norm, pad_id=PAD_ID,
                          tie_embeddings=True))


# -----------------------------------------------------------------------------
# What the training loop needs to know about a translator

class MTTask(Task):
    SCHEDULES = SCHEDULES
    BATCH_FLAGS = "--max_tokens"

    def tokens_per_step(self):  # a batch's tokens on each side, source and target: --max_tokens, or the largest
        longest = lambda batch: len(batch) * max(max(map(len, self.train_examples[i])) for i in batch)  # batch there is
        return 2 * min(self.args.max_tokens, max(map(longest, self.train_batches)))

    def load_data(self, checkpoint):
        """The corpus and the tokenizer: the checkpoint's, the teacher's (--init pretrained: its checkpoint is read and
        checked here, kept for take_teacher), or a new one."""
        args, tokenizer_text = self.args, None
        if checkpoint is not None:
            if "tokenizer" not in checkpoint:
                raise UserError(f"{args.out_dir} holds a language model, not a translator")
            tokenizer_text = checkpoint["tokenizer"]
        elif args.init == "pretrained":
            self.teacher = load_translator_teacher(args)
            tokenizer_text = self.teacher["tokenizer"]
        self.corpus, self.tokenizer, self.train_examples, valid = load_data(args, tokenizer_text)
        scored = max(len(self.corpus[split][: args.bleu_sentences or None]) for split in ("valid", "test"))
        check_decoding_fits(self.tokenizer.get_vocab_size(), args, self.device, scored)  # the BLEU pass, found now
        self.train_batches = mt_data.make_batches(self.train_examples, args.max_tokens)
        self.valid = valid, mt_data.make_batches(valid, args.max_tokens)
        print(f"{len(self.train_batches)} training batches of <= {args.max_tokens} tokens")

    def take_teacher(self):
        """The softmax translator --init pretrained converts, built from the checkpoint load_data read (its tensors
        are not kept through the training)."""
        teacher = model_from_checkpoint(self.teacher, self.args.pretrained)
        del self.teacher
        return teacher

    def identity(self):
        pairs = "\n".join(f"{s}\t{t}" for split in ("train", "valid", "test") for s, t in self.corpus[split])
        return {"tokenizer": fingerprint(self.tokenizer.to_str()), "data": fingerprint(pairs)}

    def lr(self, step):
        return get_lr_inverse_sqrt(step, self.args.lr, self.args.warmup_steps)

    def batch(self, counter):
        batch = batch_at(self.train_batches, counter, self.args.seed)
        src, tgt_in, tgt_out = (t.to(self.device) for t in mt_data.collate(self.train_examples, batch))
        return (src, tgt_in), tgt_out, tgt_out != PAD_ID

    def objective(self, logits, tgt_out):
        return F.cross_entropy(logits.float().flatten(0, 1), tgt_out.flatten(), ignore_index=PAD_ID,
                               label_smoothing=self.args.label_smoothing)

    def validation_loss(self, model):
        return validation_loss(model, *self.valid, self.device, self.dtype, self.ddp)

    def checkpoint_extras(self):
        return {"tokenizer": self.tokenizer.to_str()}

    def after_step(self, model, step):
        if self.ddp.is_main and (step % self.args.snapshot_interval == 0 or step == self.steps):
            save_snapshot(model, self.args.out_dir, step, self.args.average_last, self.snapshot_steps)

    def snapshot_steps(self, step: int) -> bool:
        """Snapshots on the --snapshot_interval grid, and the last step's. A run trained on (--resume --max_steps)
        drops its shorter run's last snapshot where that was off the grid: a run started longer never took it."""
        return step % self.args.snapshot_interval == 0 or step == self.steps

    def final_model(self, model):
        """The average of the last --average_last snapshots (the paper averages the last five epochs)."""
        if not self.ddp.is_main:  # only the main process writes snapshots, and only it decodes
            return model, {}
        paths = snapshot_paths(self.args.out_dir, self.snapshot_steps)[-self.args.average_last:]
        if not paths:
            raise UserError(f"{self.args.out_dir} has no snapshot_*.pt left to average into model.pt: restore them, "
                            f"or train a new run in another --out_dir")
        final = build_model(model.config)
        final.load_state_dict(average_snapshots(paths))
        steps = [int(os.path.basename(p)[9:16]) for p in paths]
        print(f"model.pt: the average of the snapshots at steps {steps}")
        return final.to(self.device), {"averaged_steps": steps}

    def report(self, model, train_seconds):
        if not self.ddp.is_main:
            return {}
        args = self.args
        results = evaluate_bleu(inference_model(model), self.tokenizer, self.corpus, args, self.device,
                                out_dir=args.out_dir)
        k_causal, k_cross = feature_sizes(model.config)
        results.update(attn=model_name(args), k_causal=k_causal,
                       k_cross=k_cross, train_minutes=round(train_seconds / 60, 2), beam=args.beam, lenpen=args.lenpen)
        return results

    @staticmethod
    def teacher_overrides(args) -> dict:
        """--preset: the teacher trained first gets Table 5's own rate and updates, not the default schedules' ratio
        to the finetuning run's."""
        if not args.preset:
            return {}
        return {key: PRESETS[args.preset][key] for key in ("lr", "max_steps", "warmup_steps")
                if key not in args.explicit}

    @staticmethod
    def print_table(rows):
        print("\n| model | k cross | k causal | valid BLEU | test BLEU | test tok. BLEU | train minutes |\n"
              "|---|---|---|---|---|---|---|")
        for name, r in rows:
            print(f"| {name} | {r['k_cross'] or '-'} | {r['k_causal'] or '-'} | {r['valid']['bleu']:.2f} | "
                  f"{r['test']['bleu']:.2f} | {r['test']['tok_bleu']:.2f} | {r['train_minutes']:.1f} |")


# -----------------------------------------------------------------------------
# The run: how the model is made, then the loop

def main(argv=None):
    args = get_args(argv)
    with processes(args) as ddp:  # one, or torchrun's
        return train_run(args, ddp)


def train_run(args, ddp) -> dict:
    """One run, in order: the softmax teacher (trained first where --init pretrained finds none), the run's folder,
    the data (with --init pretrained, the teacher's tokenizer), the translator (resumed, its decoder converted from
    the teacher's, or new), then the loop, or --eval_only's evaluation."""
    teacher_results = None
    if needs_teacher(args):  # --init pretrained finds no finished teacher: its own run, in its own out_dir, first
        teacher_results = train_run(teacher_run_args(args, SCHEDULES, MTTask.teacher_overrides(args)), ddp)
    task = MTTask(args, ddp)
    checkpoint = open_finished(task) if args.eval_only else open_run(task)  # None: a new run in --out_dir
    task.load_data(checkpoint)  # may fit --block_size and --eval_context to a checkpoint's positions
    print_flags(args, ddp)
    torch.manual_seed(args.seed)  # the same initialisation on every process
    if checkpoint is not None:  # --resume, --eval_only: the run in --out_dir
        model = model_from_checkpoint(checkpoint, args.out_dir)
    elif args.init == "pretrained" and args.attn == "softmax":  # a control: the teacher trained on, not swapped
        model = trained_on(task.take_teacher(), finetuning(args))
        announce_conversion(model, args)
    elif args.init == "pretrained":  # section 2.2: the decoder's attention swapped (causal k=4, cross k=32)
        teacher = task.take_teacher()
        check_training_fits(task, lambda: convert(meta_twin(teacher), **conversion(args)))  # its shapes first
        kept = chosen_softmax_layers(teacher, task, conversion(args), args.keep_softmax) if args.keep_softmax else ()
        model = convert(teacher, **conversion(args), keep_softmax_layers=kept)  # kept: layers chosen by data
        announce_conversion(model, args)
    else:  # random initialisation
        model = new_model(task, build_model, model_config, task.tokenizer.get_vocab_size())
    if args.eval_only:
        return evaluate_finished(task, model, checkpoint)
    if args.distill_weight:  # KL to the teacher's logits mixed into the finetuning's loss: support/distill.py
        teacher = model_from_checkpoint(load_translator_teacher(args), args.pretrained)  # read again, as it is
        task = DistilledFrom(task, teacher, model)
    if args.transfer_steps:  # attention transfer first (after_t2r.py), a stage of its own: support/transfer.py
        task = TransferFirst(task, checkpoint)
    results = train(task, model, checkpoint)
    if args.init == "pretrained":  # a resumed conversion's too (--eval_only returned above)
        print_conversion_table(MTTask, args, ddp, teacher_results, results, default_out_dir)
    return results


def conversion(args) -> dict:
    """t2r.convert's arguments for these flags: the kind, the causal and cross k, the finetuning's dropout and chunks,
    and with --window, --short_conv or --decay the student that has them (student_build: the decoder's layers)."""
    return dict(attn=args.attn, feature_size=args.feature_size, cross_feature_size=args.cross_feature_size,
                build=student_build(args), **finetuning(args))


def load_translator_teacher(args):
    """The checkpoint of the softmax translator that --init pretrained converts (its tokenizer in it), checked."""
    checkpoint = load_teacher(args, "pretrained translator")
    if not checkpoint["config"].get("n_encoder_layer") or "tokenizer" not in checkpoint:
        raise UserError(f"{args.pretrained} is a language model, not a translator: pass a model.pt of train_mt.py")
    check_teacher(checkpoint, args, MODEL_FLAGS)
    if args.post_norm and checkpoint["config"]["pre_norm"]:
        raise UserError(f"{args.pretrained} is a pre-norm translator and the student keeps its layers: drop "
                        f"--post_norm{' (set by --preset)' if args.preset else ''}")
    saved = checkpoint.get("args", {})
    if "vocab_size" in args.explicit and saved.get("vocab_size", args.vocab_size) != args.vocab_size:
        raise UserError(f"--vocab_size {args.vocab_size}: {args.pretrained}'s tokenizer was trained with --vocab_size "
                        f"{saved['vocab_size']} and the student keeps it: drop the flag")
    if (saved.get("src"), saved.get("tgt")) not in ((args.src, args.tgt), (None, None)):
        raise UserError(f"{args.pretrained} translates {saved['src']}-{saved['tgt']}, not {args.src}-{args.tgt}: "
                        f"pass --src {saved['src']} --tgt {saved['tgt']} or another --pretrained")
    return checkpoint


# -----------------------------------------------------------------------------
# Snapshots and their average

def snapshot_paths(out_dir: str, wanted=lambda step: True) -> list:
    """The snapshots in out_dir at the steps `wanted` accepts, oldest first."""
    paths = sorted(glob.glob(os.path.join(out_dir, "snapshot_*.pt")))
    return [p for p in paths if wanted(int(os.path.basename(p)[9:16]))]


def save_snapshot(model, out_dir: str, step: int, keep: int, wanted=lambda step: True):
    """Save this step's snapshot; delete the ones `wanted` rejects and all but the last `keep` of the others."""
    save_checkpoint(os.path.join(out_dir, f"snapshot_{step:07d}.pt"), {"model": model.state_dict(), "step": step})
    kept = snapshot_paths(out_dir, wanted)[-keep:]
    for old in set(snapshot_paths(out_dir)) - set(kept):
        os.remove(old)


def load_snapshot(path: str) -> dict:
    return read_checked(path, "snapshot", "delete it, then --resume the run to write model.pt from the snapshots "
                        "left")["model"]


def average_snapshots(paths: list) -> dict:
    """The element-wise mean of the snapshots' parameters (in float64, then cast back)."""
    states = [load_snapshot(p) for p in paths]
    return {name: (sum(s[name].double() for s in states) / len(states)).to(tensor.dtype)
            if tensor.is_floating_point() else tensor for name, tensor in states[-1].items()}


# -----------------------------------------------------------------------------
# Data: the corpus, the joint BPE (stored in every checkpoint) and the batches

def load_corpus(args) -> dict:
    try:
        return mt_data.load_parallel(args.dataset, args.src, args.tgt, args.data_dir)
    except mt_data.DataError as error:
        raise UserError(str(error)) from None


def load_data(args, tokenizer_text: str | None):
    """The corpus, the tokenizer (trained on the training pairs for a new model, else the checkpoint's),
    and the encoded training and validation pairs."""
    corpus = load_corpus(args)
    if tokenizer_text is None:
        print(f"training a joint BPE of {args.vocab_size} tokens on {len(corpus['train']):,} training pairs")
        tokenizer = mt_data.train_joint_bpe(corpus["train"], args.vocab_size)
    else:
        tokenizer = mt_data.load_tokenizer(tokenizer_text)
    train = mt_data.encode_pairs(tokenizer, corpus["train"])
    kept = [ex for ex in train if max(len(ex[0]), len(ex[1])) <= args.max_len]
    print(f"pairs: train {len(corpus['train']):,} ({len(train) - len(kept)} longer than {args.max_len} tokens "
          f"skipped), valid {len(corpus['valid']):,}, test {len(corpus['test']):,}")
    if not kept:
        raise UserError(f"no training pair fits --max_len {args.max_len}: raise it")
    return corpus, tokenizer, kept, mt_data.encode_pairs(tokenizer, corpus["valid"])


def batch_at(batches: list, counter: int, seed: int) -> list:
    """The counter-th batch of training: epoch counter // n in an order shuffled per epoch. A function of the
    counter alone, so a resumed run (or another process under DDP) sees exactly the batches it should."""
    epoch, index = divmod(counter, len(batches))
    order = torch.randperm(len(batches), generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    return batches[order[index]]


@torch.no_grad()
def validation_loss(model, examples, batches, device, dtype, ddp) -> float:
    """Mean negative log-likelihood per target token (no label smoothing) of the validation pairs."""
    model.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=device)
    for indices in batches[ddp.rank:: ddp.world_size]:
        src, tgt_in, tgt_out = (t.to(device) for t in mt_data.collate(examples, indices))
        with autocast_context(device, dtype):
            logits = model(src, tgt_in)
        totals[0] += F.cross_entropy(logits.float().flatten(0, 1), tgt_out.flatten(), ignore_index=PAD_ID,
                                     reduction="sum")
        totals[1] += (tgt_out != PAD_ID).sum()
    model.train()
    totals = all_reduce_sum(totals, ddp)
    return (totals[0] / totals[1]).item()


if __name__ == "__main__":
    run_main(main)
