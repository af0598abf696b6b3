"""
experiments/since_t2r.py: its plan is what its page says it measures, its MQAR conversions carry their parts, its
verdicts follow their rules, and the committed table and page rebuild from the records alone.

    python -m pytest -q tests/test_since_t2r.py
"""

import os

import pytest
import torch

import train_lm
from conftest import ROOT, assert_one_line_error, run_in_process
from decay import DecayingAttention
from experiments import decoding, mqar, since_t2r
from experiments.sizes import LM_SIZES, MQAR_SIZES, MT_SIZES


def plan(tmp_path):
    return since_t2r.ptb_runs(str(tmp_path / "study"), str(tmp_path / "since"), LM_SIZES["full"])


def test_the_ptb_plan_runs_every_recipe_with_every_seed_once_t2r_seed_1_being_the_studys(tmp_path):
    rows = since_t2r.rows_of(str(tmp_path / "study"), str(tmp_path / "since"), LM_SIZES["full"])
    pairs = sorted((run.row["recipe"], run.row["seed"]) for run, _ in rows)
    assert pairs == sorted((recipe, seed) for recipe in since_t2r.RECIPES for seed in since_t2r.SEEDS[recipe])
    assert [run.name for run, owner in rows if owner == "study"] == ["t2r-pretrained-k32-from-s1"]
    assert len({run.out_dir for run, _ in rows}) == len(rows)


@pytest.mark.parametrize("recipe", list(since_t2r.RECIPES))
def test_each_recipe_is_the_studys_conversion_with_its_parts_as_train_lm_reads_them(tmp_path, recipe):
    run = next(r for r in plan(tmp_path) if r.row["recipe"] == recipe)
    argv = []
    for name, value in run.flags.items():
        argv += [f"--{name}"] if value is True else [f"--{name}", str(value)]
    args = train_lm.get_args(argv)
    assert args.pretrained.endswith("softmax-random-s1/ckpt.pt") and args.max_steps == 480 and args.lr == 1e-3
    assert args.attn == ("softmax" if recipe == "softmax control" else "t2r")
    assert (args.decay, args.short_conv, args.distill_weight, args.keep_softmax) == (
        "decay" in recipe, 4 if "conv4" in recipe else 0, 0.5 if "distill" in recipe else 0.0,
        1 if "chosen1" in recipe else 0)


@pytest.mark.parametrize("recipe", list(since_t2r.RECIPES))
def test_each_translator_recipe_is_the_studys_conversion_of_the_teacher_trained_here(tmp_path, recipe):
    import train_mt
    runs = since_t2r.mt_runs(str(tmp_path / "since"), MT_SIZES["full"])
    teacher, run = runs[0], next(r for r in runs if r.row["recipe"] == recipe)
    assert teacher.flags["max_steps"] == 4800 and teacher.flags["seed"] == since_t2r.MT_SEED
    argv = []
    for name, value in run.flags.items():
        argv += [f"--{name}"] if value is True else [f"--{name}", str(value)]
    args = train_mt.get_args(argv)
    assert args.pretrained == os.path.join(teacher.out_dir, "model.pt")
    assert (args.max_steps, args.lr, args.seed) == (3200, 8e-4, since_t2r.MT_SEED)
    assert args.attn == ("softmax" if recipe == "softmax control" else "t2r")
    assert (args.decay, args.short_conv, args.distill_weight, args.keep_softmax) == (
        "decay" in recipe, 4 if "conv4" in recipe else 0, 0.5 if "distill" in recipe else 0.0,
        1 if "chosen1" in recipe else 0)


def test_a_translators_decoding_record_counts_one_sentences_state(trained_translator, monkeypatch):
    """T2R's state is its size whatever the tokens: per decoder layer S and z of the causal attention (k = 4) and of
    the cross attention (k = 8), float32; the softmax teacher's KV cache grows with them."""
    tmp, _, _ = trained_translator
    n_layer, heads, head_size, k, k_cross = 2, 2, 16, 4, 8  # conftest's MT_TINY
    found = {}
    for tokens in (8, 40):
        monkeypatch.setattr(decoding, "MT_STATE_TOKENS", tokens)
        kinds = ("t2r-pretrained", "softmax-random")
        found[tokens] = dict(zip(kinds, decoding.measure_translations([str(tmp / "out" / f"mt-toy-en-de-{kind}")
                                                                         for kind in kinds])))
        assert found[tokens]["t2r-pretrained"]["state_bytes"] == \
            n_layer * heads * (k * head_size + k + k_cross * head_size + k_cross) * 4
    assert found[40]["softmax-random"]["state_bytes"] > found[8]["softmax-random"]["state_bytes"]
    t2r = found[8]["t2r-pretrained"]
    assert t2r["tokens_per_s"] > 0 and len(t2r["tokens_per_s_passes"]) == 3


@pytest.fixture(scope="module")
def mqar_quick(tmp_path_factory):
    """The quick MQAR teacher, and three of the recipes converted from it (their records beside)."""
    where = tmp_path_factory.mktemp("mqar")
    size = MQAR_SIZES["quick"]
    runs = {run.model: run for run in since_t2r.mqar_runs()}
    results = {"teacher": mqar.train_run(mqar.Run("softmax"), size, str(where / "out"), str(where / "records"))}
    for recipe in ("softmax control", "t2r+decay+conv4+distill", "t2r+chosen1"):
        results[recipe] = mqar.train_run(runs[recipe], size, str(where / "out"), str(where / "records"))
    return where, runs, results


def model_of(where, run):
    return mqar.model_from_checkpoint(mqar.load_checkpoint(os.path.join(mqar.folder_of(run, str(where / "out")),
                                                                        "model.pt")))


def test_an_mqar_conversion_since_t2r_carries_its_parts(mqar_quick):
    where, runs, results = mqar_quick
    model = model_of(where, runs["t2r+decay+conv4+distill"])
    assert any(isinstance(m, DecayingAttention) for m in model.modules())
    assert model.config.short_conv == 4
    sizes = results["t2r+decay+conv4+distill"]["state_bytes"]
    assert len(set(sizes.values())) == 1  # all linear: a state of one size at every length


@pytest.mark.parametrize("recipe", since_t2r.LONGER)
def test_a_longer_mqar_run_is_its_recipe_with_more_steps_and_a_folder_of_its_own(tmp_path, recipe):
    size, runs = MQAR_SIZES["full"], since_t2r.mqar_runs()
    base = next(r for r in runs if r.model == recipe)
    longer = next(r for r in runs if r.model == f"{recipe}, {since_t2r.MQAR_LONGER * size['finetune_steps']} steps")
    args, base_args = (vars(mqar.run_args(r, size, str(tmp_path), "teacher.pt", False)) for r in (longer, base))
    assert args["max_steps"] == since_t2r.MQAR_LONGER * base_args["max_steps"]
    scaled = ("max_steps", "warmup_steps", "eval_interval", "log_interval")  # with the budget
    assert {k: v for k, v in args.items() if k not in scaled} == {k: v for k, v in base_args.items() if k not in scaled}
    assert mqar.folder_of(longer, "r") != mqar.folder_of(base, "r")


def test_the_mqar_softmax_control_is_the_teacher_trained_on_unchanged(mqar_quick):
    where, runs, results = mqar_quick
    teacher, control = model_of(where, mqar.Run("softmax")), model_of(where, runs["softmax control"])
    assert type(control) is type(teacher) and control.config.attn == "softmax"
    assert results["softmax control"]["state_bytes"] == results["teacher"]["state_bytes"]  # a KV cache, as its
    changed = [n for n, p in control.state_dict().items() if not torch.equal(p, teacher.state_dict()[n])]
    assert changed  # ... and finetuned


def test_an_mqar_chosen_layer_is_ranked_saved_and_kept_in_the_record(mqar_quick):
    where, runs, _ = mqar_quick
    record = os.path.join(mqar.folder_of(runs["t2r+chosen1"], str(where / "records")), "softmax_layers.json")
    kept = since_t2r.read_json(record)
    assert len(kept["kept"]) == 1 and len(kept["ranking"]) == MQAR_SIZES["quick"]["n_layer"]
    assert since_t2r.kept_layers(os.path.dirname(record), 2, "t2r+chosen1") == 1


@pytest.mark.parametrize("values, verdict", [(([120.0, 121.0, 122.0], [130.0, 131.0, 132.0]), "yes"),
                                             (([130.0, 131.0, 132.0], [120.0, 121.0, 122.0]), "**no**"),
                                             (([120.0, 131.0, 125.0], [124.0, 130.0, 126.0]), "within noise")])
def test_a_part_helps_by_the_two_arms_rule(values, verdict):
    assert since_t2r.part_helps(*values) == verdict


@pytest.mark.parametrize("all_linear, verdict", [([129.8, 130.2], "yes"), ([130.0, 130.4], "**no**")])
def test_near_the_control_means_within_two_percent_of_its_mean(all_linear, verdict):
    assert since_t2r.near_control(all_linear, [127.0, 128.0]) == verdict  # 127.5 * 1.02 = 130.05: means 130.0 and 130.2


def test_chosen_layers_that_every_kth_keeps_too_are_not_judged_as_a_comparison():
    assert since_t2r.chosen_beats_every_kth([1.0, 2.0, 3.0], [7.0, 8.0, 9.0], {0}, {0}) == "the same layers"
    assert since_t2r.chosen_beats_every_kth([1.0, 2.0, 3.0], [7.0, 8.0, 9.0], {1}, {0}) == "yes"


def test_the_gaps_are_to_the_tasks_own_teacher_and_control():
    rows = [dict(task="ptb", recipe="teacher", value=130.0, metric="test_ppl"),
            dict(task="ptb", recipe="softmax control", value=128.0, metric="test_ppl"),
            dict(task="ptb", recipe="t2r", value=135.5, metric="test_ppl"),
            dict(task="mqar64", recipe="teacher", value=1.0, metric="recall"),
            dict(task="mqar64", recipe="t2r", value=0.4291, metric="recall")]
    gaps = {(r["task"], r["recipe"]): (r["gap_to_teacher"], r["gap_to_control"]) for r in since_t2r.with_gaps(rows)}
    assert gaps[("ptb", "t2r")] == (5.5, 7.5) and gaps[("ptb", "teacher")] == (None, 2.0)
    assert gaps[("mqar64", "t2r")] == (-0.5709, None)


@pytest.mark.parametrize("all_linear, verdict", [(29.0, "yes"), (28.5, "yes"), (28.49, "**no**")])
def test_a_translator_near_the_control_means_within_one_bleu_of_it(all_linear, verdict):
    assert since_t2r.translates_near_control(all_linear, 29.5) == verdict


def row(task, recipe, value, sd, seeds):
    return dict(task=task, recipe=recipe, value=value, sd=sd, seeds=seeds)


def test_the_seed_rule_asks_for_three_where_two_rows_are_closer_than_twice_their_spread():
    rows = [row("ptb", "teacher", 130.0, None, 1), row("ptb", "a", 125.0, 0.5, 2), row("ptb", "b", 125.9, 0.2, 2),
            row("ptb", "c", 127.0, 0.5, 3), row("ptb", "d", 135.0, None, 1), row("ptb", "e", 134.1, None, 1),
            row("mt", "a", 20.0, None, 1), row("mt", "b", 20.1, None, 1)]
    wanted = since_t2r.seeds_wanted(rows)
    # a-b: 0.9 < 2 x 0.5; b-c: 1.1 < 1.0? no; a-c: 2.0, no; d-e: 0.9 < 2 x 0.5 (one seed: the task's largest SD)
    assert wanted["ptb"] == {"a": (2, ["b"]), "b": (2, ["a"]), "d": (1, ["e"]), "e": (1, ["d"])}
    assert wanted["mt"] is None  # no spread measured


def test_a_longer_mqar_run_is_shown_apart_not_judged_summarised_or_asked_for_seeds():
    longer = since_t2r.longer_name("t2r+decay+conv4+distill")
    rows = [row(task, recipe, value, sd, seeds) for task in ("mqar8", "mqar64") for recipe, value, sd, seeds in
            (("teacher", 1.0, None, 1), ("softmax control", 1.0, 0.001, 3), ("t2r", 0.43, 0.01, 3),
             ("t2r+decay+conv4+distill", 0.54, 0.01, 3), (longer, 0.97, None, 1))]
    for r in rows:
        r.update(softmax_layers=2 if r["recipe"] in ("teacher", "softmax control") else 0, state_bytes=1, runs="x")
    summary = " ".join(since_t2r.summary_lines(rows))
    assert "conversion, t2r+decay+conv4+distill, 0.5400" in summary and "as long, t2r+decay+conv4+distill: 0.9700 (1" \
        in summary
    assert not since_t2r.seeds_wanted(rows)["mqar64"]
    lines = since_t2r.mqar_lines(rows)
    verdict = next(line for line in lines if "recalls at least 0.95" in line)
    assert "0.5400" in verdict and "**no**" in verdict and not any(line.startswith(f"| {longer} ") for line in lines)
    assert any("4x as long (" in line and "0.9700 (1 seed; against 0.5400 at 600 steps)" in line for line in lines)


@pytest.mark.parametrize("seeds, value, verdict", [(1, 0.97, "not judged until its 3 seeds are in (1 so far)"),
                                                   (3, 0.97, "yes"), (3, 0.90, "**no**")])
def test_the_longer_recipe_is_judged_on_its_three_seeds_alone(seeds, value, verdict):
    rows = [dict(row(task, recipe, v, None, n), softmax_layers=0, state_bytes=1, runs="x")
            for task in ("mqar8", "mqar64") for recipe, v, n in
            (("t2r", 0.43, 3), ("t2r+decay+conv4+distill", 0.54, 3),
             (since_t2r.longer_name(since_t2r.LONGER_JUDGED), value, seeds))]
    line, = [line for line in since_t2r.mqar_lines(rows) if "rule since-mqar-recall-longer" in line]
    assert f"{value:.4f} ({seeds} seed" in line and f": {verdict} (rule" in line


def test_the_committed_table_and_page_rebuild_from_the_records(tmp_path):
    size = LM_SIZES["full"]
    since_t2r.write_results(os.path.join(ROOT, "out", "study"), os.path.join(ROOT, "out", "since_t2r"), size,
                            str(tmp_path))
    for name in ("since_t2r.csv", "since_t2r.md"):
        with open(os.path.join(ROOT, "results", name)) as committed:
            assert (tmp_path / name).read_text() == committed.read(), name


def test_a_bad_only_pattern_is_one_line_before_any_work(tmp_path):
    result = run_in_process("experiments.since_t2r", "--stage", "mqar", "--only", "(", cwd=tmp_path)
    assert_one_line_error(result, "--only: '(' is not a regular expression")


def test_the_translator_plan_runs_each_recipes_seeds_once_its_first_in_the_folder_it_always_had(tmp_path):
    runs = since_t2r.mt_runs(str(tmp_path / "since"), MT_SIZES["full"])[1:]
    pairs = sorted((run.row["recipe"], run.row["seed"]) for run in runs)
    assert pairs == sorted((recipe, seed) for recipe in since_t2r.RECIPES
                           for seed in since_t2r.MT_SEEDS.get(recipe, (since_t2r.MT_SEED,)))
    assert all(run.flags["seed"] == run.row["seed"] for run in runs) and len({r.out_dir for r in runs}) == len(runs)
    firsts = [run for run in runs if run.row["seed"] == since_t2r.MT_SEED]
    assert [run.name for run in firsts] == [since_t2r.FOLDERS[recipe] for recipe in since_t2r.RECIPES]


@pytest.mark.parametrize("only, folders", [("mt", ["since/mt"]), ("ptb", ["since/ptb", "study/lm"]),
                                           ("hf", ["since/hf-llama"]), ("mqar", ["since/mqar"])])
def test_decode_with_only_visits_that_tasks_rows_alone(tmp_path, capsys, only, folders):
    """Each row it visits is in the task's folders (PTB's T2R row is the study's run)."""
    since_t2r.probe_decoding(str(tmp_path / "study"), str(tmp_path / "since"), LM_SIZES["full"], only)
    lines = capsys.readouterr().out.splitlines()  # no weights in tmp_path: each row it visits says so
    assert lines and all(any(f"{tmp_path / f}{os.sep}" in line for f in folders) for line in lines), lines


def test_decode_refuses_an_only_that_names_no_task_before_timing_anything(tmp_path):
    result = run_in_process("experiments.since_t2r", "--stage", "decode", "--only", "llama-hf", cwd=tmp_path)
    assert_one_line_error(result, "--only: 'llama-hf' matches none of the tasks decode times (ptb, hf-llama, mt, mqar)")


def test_the_hf_runs_are_the_recipe_with_each_part_and_the_control_without_transfer(tmp_path):
    from train_lm import HF_RECIPE
    runs = {run.row["recipe"]: run.flags for run in since_t2r.hf_runs(str(tmp_path / "hf"), str(tmp_path / "out"))}
    assert list(runs) == list(since_t2r.RECIPES)
    for recipe, flags in runs.items():
        assert flags["pretrained"] == f"hf:{tmp_path / 'hf' / 'llama'}"
        assert flags["max_steps"] == str(HF_RECIPE["max_steps"])
        assert flags["transfer_steps"] == ("0" if recipe == "softmax control" else str(HF_RECIPE["transfer_steps"]))
        assert flags["decay"] is ("decay" in recipe)  # --no-decay where not: train_lm.py's HF_PARTS would add it
        assert flags.get("short_conv") == ("4" if "conv4" in recipe else None)
        assert flags.get("distill_weight") == ("0.5" if "distill" in recipe else None)


def test_the_readme_quotes_the_pages_summary():
    with open(os.path.join(ROOT, "results", "since_t2r.md")) as f:
        page = f.read().splitlines()
    start = page.index("In short (the README quotes these lines):") + 2
    summary = page[start:page.index("", start)]
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    assert summary and all(line.startswith("- ") and line in readme for line in summary), \
        "the README's since-T2R lines are the page's summary: copy them from results/since_t2r.md"


def test_the_decoding_probe_counts_each_models_state_after_the_prompt_and_the_new_tokens(tmp_path):
    """measure_decoding: a row per model, in the order given, DECODE_PASSES timed passes each, and the bytes of the
    state after the prompt and the new tokens: a KV cache's grows with both (its capacity doubles past 16 positions),
    a T2R state's does not."""
    from conftest import lm_config, make
    from layers.states import state_bytes
    from t2r import TransformerLM, fold
    paths = []
    for kind in ("softmax", "t2r"):
        model = make(TransformerLM, lm_config(kind, vocab_size=19), torch.float32)
        paths.append(str(tmp_path / f"{kind}.pt"))
        torch.save({"config": model.config.to_dict(), "model": model.state_dict()}, paths[-1])
    softmax, t2r = decoding.measure_decoding(paths, length=6, new=12)
    for found, kind in ((softmax, "softmax"), (t2r, "t2r")):
        model = fold(make(TransformerLM, lm_config(kind, vocab_size=19), torch.float32).eval())
        logits, state = model.prefill(torch.zeros(1, 6, dtype=torch.long), model.init_state(1))
        for _ in range(12):
            logits, state = model.step(logits.argmax(-1), state)
        assert found["state_bytes"] == state_bytes(state) and (found["prompt"], found["new_tokens"]) == (6, 12)
        assert len(found["tokens_per_s_passes"]) == decoding.DECODE_PASSES and found["tokens_per_s"] > 0
    assert softmax["state_bytes"] > t2r["state_bytes"]


def test_the_decoding_probes_models_take_turns_a_pass_each(monkeypatch):
    """So that the machine's drift over a task's minutes falls on every row alike: an untimed round, then
    DECODE_PASSES rounds, each model one pass a round, the order reversed every other round."""
    calls = []

    class Logged:  # a model and its decoder: each pass prefills once
        def __init__(self, name):
            self.name = name

        def prefill(self, prompt, state, chunk):
            calls.append(self.name)
            return torch.zeros(1, 3), state

        def init_state(self, batch_size):
            return {}

        def step(self, token, state):
            return torch.zeros(1, 3), state

    monkeypatch.setattr(decoding, "decoding_setup", lambda name, length: (Logged(name), Logged(name), None))
    monkeypatch.setattr(decoding, "state_bytes", lambda state: 0)
    found = decoding.measure_decoding(["a", "b", "c"], length=2, new=2)
    rounds = [calls[i:i + 3] for i in range(0, len(calls), 3)]  # forward, then backward: none always first
    assert rounds == [["a", "b", "c"][::-1 if r % 2 else 1] for r in range(1 + decoding.DECODE_PASSES)]
    assert [len(f["tokens_per_s_passes"]) for f in found] == [decoding.DECODE_PASSES] * 3
