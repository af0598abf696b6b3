"""
What the study measures on a trained run, beside its perplexity or BLEU: each probe reads the run's own weights
and writes one small file into its folder, right after the run trains, so that a later session needs the results
and never the weights (experiments/records.py keeps the results in the repository, not the weights).

    attention.csv  experiments/analyze_attention.py: the entropy of its attention (Fig. 6) and, for a model converted from the
                   teacher, the distance to the teacher's (Fig. 5); the teacher's own file adds the teacher
                   swapped to T2R at every k, before any finetuning
    speed.json     translate.measure_run: a translator's greedy tokens/s at batch 16 on its test sentences

    python -m experiments.probes speed out/study/mt/t2r-pretrained-s0    # the speed probe alone, on one run
"""


if __package__ in (None, ""):  # run as a file: the project's modules are found from its root, as a module
    raise SystemExit("error: run it from the repository's root as a module: python -m experiments.probes")

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from support.runtime import Parser, UserError, get_device, run_main, write_json

FEATURE_SIZES = (4, 8, 16, 32, 64)  # Fig. 4's k, and the "before finetuning" points of Fig. 5
MAIN_K = 32  # T2R's k in Table 1
ATTENTION_STAGES = {("t2r", "pretrained"): "finetuned", ("t2r-frozen", "pretrained"): "mlp_frozen",
                    ("t2r", "random"): "random_init"}  # (model, init) -> the stage experiments/analyze_attention.py names
SPEED_BATCH = 16  # Fig. 2: greedy decoding, batch 16
SPEED_PASSES = 3  # over the whole test set; tokens/s is their median, their range the noise


def attention_checkpoints(runs: list) -> list:
    """(stage, k, run) for every T2R language model of the plan whose attention is analysed (seed 0)."""
    return [(ATTENTION_STAGES[(r.row["model"], r.row["init"])], r.row["k"], r) for r in runs
            if (r.row["model"], r.row["init"]) in ATTENTION_STAGES and r.row["seed"] == 0]


def attention_probe(run, teacher, stage: str | None, quick: bool) -> tuple:
    """("attention.csv", argv): the teacher analysed with its starting points at every k; a converted model beside
    the teacher (for the distance); a model trained from scratch alone (entropy only: its heads are not the
    teacher's)."""
    path = os.path.join(run.out_dir, "attention.csv")
    windows = ["--windows", "4", "--context", "64"] if quick else ["--windows", "100", "--context", "512"]
    teacher_ckpt = os.path.join(teacher.out_dir, "ckpt.pt")
    if run is teacher:
        models = ["--teacher", teacher_ckpt, "--before", *map(str, FEATURE_SIZES), "--seed", "0"]
    else:
        models = [os.path.join(run.out_dir, "ckpt.pt")] + (["--teacher", teacher_ckpt] if stage != "random_init"
                                                            else [])
    return "attention.csv", ["-m", "experiments.analyze_attention", *models, *windows, "--csv", path]


def speed_probe(run) -> tuple:
    return "speed.json", ["-m", "experiments.probes", "speed", run.out_dir]


def add_probes(lm_plan: list, mt_plan: list, quick: bool):
    """Give every run of the plans its probes (run.probes: [(file, argv)]): the attention analysis of the LM
    teacher and its T2R models, the translators' speed."""
    teacher = lm_plan[0]
    stages = {id(r): stage for stage, _, r in attention_checkpoints(lm_plan)}
    for run in [teacher] + [r for _, _, r in attention_checkpoints(lm_plan)]:
        run.probes.append(attention_probe(run, teacher, stages.get(id(run)), quick))
    for run in mt_plan:
        run.probes.append(speed_probe(run))


def measure_speed(out_dir: str):
    """speed.json: greedy tokens/s at batch 16 on the run's test sentences, the median of three passes."""
    from experiments.records import machine
    from translate import measure_run
    if not os.path.isfile(os.path.join(out_dir, "model.pt")):
        raise UserError(f"no model.pt in {out_dir}: give the folder of a finished train_mt.py run")
    result = measure_run(out_dir, get_device("auto"), SPEED_BATCH, SPEED_PASSES)
    write_json(os.path.join(out_dir, "speed.json"), {**result, **machine()})
    rates = ", ".join(f"{r:.0f}" for r in result["tokens_per_s_passes"])
    print(f"speed: {result['tokens_per_s']:.0f} tokens/s, the median of {rates} "
          f"({result['tokens']} tokens in {result['seconds']:.1f} s)", flush=True)


def main(argv=None):
    p = Parser(prog="python -m experiments.probes", description="A probe of one finished run (the study runs them all).")
    p.add_argument("probe", choices=["speed"], help="speed: a translator's greedy tokens/s (speed.json)")
    p.add_argument("out_dir", help="the finished train_mt.py run's folder")
    args = p.parse_args(argv)
    measure_speed(args.out_dir)


if __name__ == "__main__":
    run_main(main)
