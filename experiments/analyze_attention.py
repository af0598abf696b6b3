"""
Attention analysis of section 4 (Figs. 5 and 6): how close a converted model's attention distributions
are to its softmax teacher's, and how peaky they are.

    python -m experiments.analyze_attention out/ptb-t2r-pretrained/ckpt.pt --teacher out/ptb-softmax-random/ckpt.pt
    python -m experiments.analyze_attention out/ptb-t2r-pretrained/ckpt.pt --teacher out/ptb-softmax-random/ckpt.pt \\
        --before 32 --csv attention.csv     # also the teacher swapped to T2R (k=32) before any finetuning

On `--windows` disjoint validation windows of `--context` tokens, each model predicts the next word after
the whole window; its attention distribution over the window at that last position is taken for every
layer and head (the paper: "predicting a word given the preceding 512 words"). Two averages over windows,
layers and heads:
    distance : Euclidean distance ||a - a_teacher||_2 to the teacher's distribution of the same layer and head
               (an empty row, see below, counts as the zero vector: its output is 0, far from the teacher's)
               (Fig. 5; only for models converted from that teacher, whose heads line up with its heads: the
               --before models and checkpoints whose run converted --teacher)
    entropy  : -sum_j a_j log a_j in nats (Fig. 6); log(T) for a uniform distribution over T positions
A T2R query whose ReLU features are all zero attends to nothing: such empty rows are counted (empty_rows)
and left out of the entropy. RFA's weights can be negative (sin/cos features); its entropy counts the
positive part, renormalised.
"""


if __package__ in (None, ""):  # run as a file: the project's modules are found from its root, as a module
    raise SystemExit("error: run it from the repository's root as a module: python -m experiments.analyze_attention")

import math
import os

import numpy as np
import torch

from after_t2r import WindowAttention, window_weights
from support import data
from support.checkpoints import load_checkpoint, model_from_checkpoint
from support.configs import feature_sizes
from support.configs import is_sru
from support.runtime import Parser, UserError, get_device, print_config, run_main, seed, write_csv
from layers.states import full_precision, state_dtype
from t2r import SoftmaxAttention, convert, linear_attention_quadratic, normalize


# -----------------------------------------------------------------------------
# The measures

def attention_weights(attn, x):
    """The causal weights of a self-attention layer on its input x (B, T, h) as a (B, H, T, T) matrix: the
    distributions of Eq. 2 for softmax; sim~(q_i, k_j) / sum_l sim~(q_i, k_l) of Eq. 4 for linear attention, with
    the forms' epsilon rule (in float32); the hybrid's weights for a window layer. The forms never build it."""
    if isinstance(attn, SoftmaxAttention):
        q, k, _ = attn.project(x, x)
        scores = q @ k.transpose(-1, -2) / math.sqrt(attn.d_head)  # (B, H, T, T)
        future = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).triu(1)
        return scores.masked_fill(future, float("-inf")).softmax(-1)
    q, k, _ = (t.to(state_dtype(t.dtype)) for t in attn.project(x, x))
    with full_precision(x.device):
        fq, fk = attn.feature_map(q, k)
        if isinstance(attn, WindowAttention):
            weights = window_weights(q, k, fq, fk, attn.window, attn.window_gate.to(q.dtype).exp())
            return normalize(weights, weights.sum(-1))
        values = torch.eye(x.shape[1], dtype=fq.dtype, device=x.device)  # v_j = e_j: out_i is row i of the weights
        return linear_attention_quadratic(fq, fk, values, causal=True)


@torch.no_grad()
def last_query_attention(model, windows: torch.Tensor, batch_size: int = 16) -> torch.Tensor:
    """(N, L, H, T): for each window, layer and head, the attention distribution of the last position
    over the window's T positions. Each layer's input is captured with a hook, then re-attended."""
    model.eval()
    device = next(model.parameters()).device
    inputs = []
    hooks = [layer.self_attn.register_forward_hook(lambda module, args, out: inputs.append(args[0]))
             for layer in model.layers]
    rows = []
    try:
        for i in range(0, len(windows), batch_size):
            inputs.clear()
            model(windows[i : i + batch_size].to(device))
            per_layer = [attention_weights(layer.self_attn, x)[:, :, -1, :].float().cpu()  # (B, H, T)
                         for layer, x in zip(model.layers, inputs)]
            rows.append(torch.stack(per_layer, dim=1))  # (B, L, H, T)
    finally:
        for hook in hooks:
            hook.remove()
    return torch.cat(rows)


def mean_distance(a: torch.Tensor, teacher: torch.Tensor) -> float:
    """Fig. 5: Euclidean distance per (window, layer, head), averaged."""
    if a.shape != teacher.shape:
        raise UserError(f"attention of shape {tuple(a.shape)} cannot be compared with the teacher's "
                        f"{tuple(teacher.shape)}: compare models converted from that teacher")
    return (a.double() - teacher.double()).norm(dim=-1).mean().item()


def mean_entropy(a: torch.Tensor) -> tuple[float, float]:
    """Fig. 6: -sum_j a_j log a_j per (window, layer, head), averaged (0 log 0 = 0), and the fraction of
    empty rows: a T2R query whose ReLU features are all zero attends to nothing (its output is 0, the
    epsilon rule), has no distribution and is left out of the average."""
    p = a.double().clamp_min(0)
    mass = p.sum(-1, keepdim=True)
    empty = mass.squeeze(-1) == 0
    p = p / mass.clamp_min(1e-300)
    entropy = -(torch.xlogy(p, p)).sum(-1)
    mean = entropy[~empty].mean().item() if (~empty).any() else float("nan")
    return mean, empty.double().mean().item()


def validation_windows(ids, context: int, n: int) -> torch.Tensor:
    """n disjoint windows of `context` tokens from the start of the split: (n, context) int64."""
    available = len(ids) // context
    if available < 1:
        raise UserError(f"the split has {len(ids)} tokens, fewer than --context {context}: lower --context")
    n = min(n, available)
    return torch.from_numpy(np.asarray(ids[: n * context], dtype=np.int64)).view(n, context)


def starting_point(checkpoint: dict, path: str, feature_size: int, seed: int):
    """The T2R model that `train_lm.py --init pretrained --feature_size K --seed S` starts finetuning from.
    train_lm.py seeds, rebuilds the teacher from its checkpoint (which draws random numbers for the
    initialisation it then overwrites), then converts: the same draws in the same order give the same
    fresh feature maps (test_study.py checks this against a run stopped at step 0)."""
    torch.manual_seed(seed)
    teacher = model_from_checkpoint(checkpoint, path)
    return convert(teacher, "t2r", feature_size)


def describe(model) -> tuple[str, int | None]:
    """(attention kind, k) as the results tables write them: "softmax+t2r" for a hybrid."""
    kinds = sorted(set(model.config.layer_kinds()))
    linear = [k for k in kinds if k != "softmax"]
    name = "+".join(kinds) if len(kinds) > 1 else kinds[0]
    return name, feature_sizes(model.config)[0] if linear else None


def load_lm(path: str, device):
    checkpoint = load_checkpoint(path)
    if checkpoint["config"].get("n_encoder_layer") or is_sru(checkpoint["config"]):
        raise UserError(f"{path} is not a transformer language model: the analysis runs on those")
    return model_from_checkpoint(checkpoint, path).to(device), checkpoint.get("args", {})


# -----------------------------------------------------------------------------

def get_args(argv=None):
    p = Parser(prog="python -m experiments.analyze_attention", description="Distance to the teacher's attention and entropy (Figs. 5-6).")
    p.add_argument("checkpoints", nargs="*", help="language-model checkpoints (ckpt.pt) to analyse")
    p.add_argument("--teacher", default=None, help="the softmax checkpoint they were converted from (for distances)")
    p.add_argument("--before", type=int, nargs="*", default=[], metavar="K",
                   help="also analyse the teacher swapped to T2R with feature size K, before any finetuning")
    p.add_argument("--seed", type=seed, default=0, help="seed of the fresh feature maps of --before (train_lm.py's --seed)")
    p.add_argument("--dataset", default=None, help="dataset of the validation windows (default: the checkpoints')")
    p.add_argument("--data_dir", default=None, help="where the dataset lives (default: the checkpoints')")
    p.add_argument("--split", default="valid", choices=["valid", "test"], help="which split the windows come from")
    p.add_argument("--windows", type=int, default=100, help="number of disjoint windows")
    p.add_argument("--context", type=int, default=512, help="tokens per window (the paper: 512)")
    p.add_argument("--batch_size", type=int, default=16, help="windows per forward pass")
    p.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda, mps")
    p.add_argument("--csv", default=None, help="also write the table to this CSV file")
    args = p.parse_args(argv)
    if not args.checkpoints and not args.teacher:
        p.error("give at least one checkpoint, or --teacher")
    if args.before and not args.teacher:
        p.error("--before converts the --teacher: give --teacher")
    if args.windows < 1 or args.context < 2 or args.batch_size < 1:
        p.error("--windows and --batch_size must be at least 1, --context at least 2")
    return args


def models_to_analyse(args, device) -> list:
    """(stage, name, model): the teacher and its starting points before finetuning (--before), then each checkpoint,
    'finetuned' where it was converted from this teacher (only then is a distance to it meaningful)."""
    models = []
    if args.teacher:
        teacher, _ = load_lm(args.teacher, device)
        if set(teacher.config.layer_kinds()) != {"softmax"}:
            raise UserError(f"--teacher {args.teacher} is not a softmax model")
        models.append(("teacher", args.teacher, teacher))
        for k in args.before:
            student = starting_point(load_checkpoint(args.teacher), args.teacher, k, args.seed)
            models.append(("before finetuning", f"{args.teacher} -> t2r k={k}", student.to(device)))
    for path in args.checkpoints:
        model, saved = load_lm(path, device)
        # distances only mean something for a model converted from this teacher: its heads are the teacher's
        converted = bool(args.teacher and saved.get("init") == "pretrained" and saved.get("pretrained")
                         and os.path.isfile(saved["pretrained"]) and os.path.samefile(saved["pretrained"], args.teacher))
        if args.teacher and saved.get("init") == "pretrained" and not converted:
            print(f"note: {path} was converted from {saved.get('pretrained')}, not found as --teacher: no distance")
        models.append(("finetuned" if converted else "checkpoint", path, model))
    return models


def analyse(args) -> list[dict]:
    device = get_device(args.device)
    paths = ([args.teacher] if args.teacher else []) + args.checkpoints
    for path in paths:
        if not os.path.isfile(path):
            raise UserError(f"no checkpoint at {path}: train one with train_lm.py, or fix the path")
    _, saved = load_lm(paths[0], "cpu")
    dataset = args.dataset or saved.get("dataset", "ptb")
    try:
        lm_data = data.prepare(dataset, args.data_dir or saved.get("data_dir"), tokenizer=saved.get("tokenizer", "word"),
                               vocab_size=saved.get("vocab_size") if saved.get("tokenizer") == "bpe" else None,
                               cache_dir=saved.get("cache_dir", "data/cache"))
    except data.DataError as error:
        raise UserError(str(error)) from None
    windows = validation_windows(getattr(lm_data, args.split), args.context, args.windows)
    print(f"{len(windows)} {args.split} windows of {args.context} tokens")

    rows, reference = [], None
    for stage, name, model in models_to_analyse(args, device):
        if model.config.vocab_size != lm_data.vocab_size:
            raise UserError(f"{name} has a vocabulary of {model.config.vocab_size}, the data {lm_data.vocab_size}: "
                            f"pass the --dataset it was trained on")
        a = last_query_attention(model, windows, args.batch_size)
        if stage == "teacher":
            reference = a
        attn, k = describe(model)
        distance = None
        if stage in ("before finetuning", "finetuned"):
            distance = mean_distance(a, reference)
        entropy, empty = mean_entropy(a)
        rows.append(dict(model=name, stage=stage, attn=attn, k=k, distance=distance, entropy=entropy,
                         empty_rows=empty, windows=len(windows)))
        dist_text = "-" if distance is None else f"{distance:.4f}"
        print(f"{name}: {attn} k={k or '-'} | distance {dist_text} | entropy {entropy:.4f} | "
              f"empty rows {100 * empty:.1f}%", flush=True)
    return rows


def main():
    args = get_args()
    print_config("experiments.analyze_attention", {k: v for k, v in vars(args).items()})
    rows = analyse(args)
    if args.csv:
        write_csv(args.csv, rows)
        print(f"wrote {args.csv}")


if __name__ == "__main__":
    run_main(main)
