"""
The paper's numbers and its claims, each tested against the study's results (experiments/report.py shows
them). A claim is (what the paper says, the paper's numbers, ours, the verdict), the verdict one of: yes,
**no**, within noise, inconclusive, n/a or not measured (verdict_legend() says what each means).
Here: Table 1, Table 2, Fig. 2's speed and the teachers' convergence; Figs. 4-6 in experiments/claims_attention.py,
each verdict's rule, dated, in experiments/rules.py (its thresholds there only), the statistics in
experiments/verdicts.py.

The rows here are results/*.csv rows as report.read_results() returns them: dicts with None for an empty cell.

    python -m experiments.report                     # every claim, judged, on results/README.md
"""

import math
from dataclasses import dataclass

from experiments.claims_attention import feature_claims
from experiments.records import RETRAINED
from experiments import rules
from experiments.rules import COMPARABLE_BLEU, CONVERGED, FEATURE_MARGIN, SINGLE_RUN_NOISE, STRONG, beside
from experiments.verdicts import (NOT_MEASURED, exact_permutation_p, group, half_range, ordering, two_arms, verdict,
                                  welch)


@dataclass(frozen=True)
class PaperLM:
    valid: float  # WikiText-103 perplexity (Table 1)
    test: float
    hours: int | None  # train time, GPU hours; of a + pretrain row the finetuning only


# The paper's numbers, typed once. Table 1 (WikiText-103) and Table 2 (WMT14 EN-DE test BLEU), by (model, init);
# the speed of section 3.3 (Fig. 2).
PAPER_LM = {("elu", "random"): PaperLM(22.0, 22.8, 470), ("rfa", "random"): PaperLM(20.4, 21.3, 512),
            ("t2r", "random"): PaperLM(20.1, 20.8, 474), ("elu", "pretrained"): PaperLM(21.5, 22.2, 97),
            ("rfa", "pretrained"): PaperLM(20.8, 21.6, 104), ("t2r", "pretrained"): PaperLM(19.0, 19.6, 98),
            ("t2r75", "pretrained"): PaperLM(17.9, 18.5, 95), ("softmax", "random"): PaperLM(17.9, 18.5, None)}
PAPER_MT = {("softmax", "random"): 28.9, ("t2r", "pretrained"): 28.7, ("t2r", "random"): 27.5,
            ("elu", "pretrained"): 28.4, ("rfa", "pretrained"): 27.6}
PAPER_SPEED = "15%+ over ELU; over softmax from short lengths on"

NAMES = {"softmax": "Transformer (softmax, the teacher)", "elu": "ELU", "rfa": "RFA", "t2r": "T2R", "t2r75": "T2R 75%",
         "t2r75top": "T2R 75%, top layer kept", "t2r-transfer": "T2R + transfer", "t2r-window": "T2R + window",
         "t2r-transfer-window": "T2R + transfer + window", "sru++": "SRU++"}
HYBRIDS = {"t2r75": "every 4th layer from the top kept: of 4, the bottom one", "t2r75top": "the top layer kept"}
LONGER = "t2r-longer"  # T2R from scratch for the conversion's total steps: experiments/study.py's control
DOUBLED = "2x"  # the suffix of a model trained at twice every budget (teacher, finetuning, T2R from scratch)
LONGER_SEEDS = (0, 1, 2)  # the equal-budget control's seeds (at twice the budget: seed 0)
TEACHERS = (0, 1, 2)  # the 1x teacher's seeds: each converted once, T2R + pretrain's arm at equal budgets
RETRAINED_TEACHER = f"softmax-{RETRAINED}"  # the teacher trained again (same flags, another machine: other weights)


def doubled(model: str) -> bool:
    return model.endswith(f"-{DOUBLED}")


def model_name(model: str, init: str) -> str:
    """A table row's name: "T2R + pretrain", "ELU + random init", the teacher, the softmax control."""
    if doubled(model):
        return f"{model_name(model.removesuffix('-' + DOUBLED), init)}, at twice every budget"
    if (model, init) == ("softmax", "pretrained"):
        return "Transformer trained on for the finetuning steps (control)"
    if model == RETRAINED_TEACHER:
        return "Transformer trained again, the same flags on another machine (the control's start)"
    if model == LONGER:
        return "T2R + random init, trained for the teacher's and the finetuning's steps (control)"
    if model == "sru++":
        return "SRU++ (from scratch, not in the paper)"
    return NAMES[model] + ("" if model == "softmax" else (" + pretrain" if init == "pretrained" else " + random init"))


def mean_of(rows: list, column: str):
    values = [r[column] for r in rows if r.get(column) is not None]
    return sum(values) / len(values) if values else None


# -----------------------------------------------------------------------------
# Table 1

def lm_claims(lm: list, curves: list = ()) -> list:
    """Table 1's claims, one check per sentence of the paper, each on the paper's own comparison (test perplexity,
    means over the seeds; the spread: half the range of the seeds). The study's controls: lm_controls."""
    test, spread, paper = lm_readers(lm)
    claims = []
    t2r, elu, rfa = test("t2r", "pretrained"), test("elu", "pretrained"), test("rfa", "pretrained")
    if None not in (t2r, elu, rfa):
        held = min((ordering(t2r, test(other, "pretrained"), spread("t2r") + spread(other)) for other in ("elu", "rfa")),
                   key=["**no**", "within noise", "yes"].index)
        claims.append(("T2R + pretrain beats ELU + pretrain and RFA + pretrain (test ppl, mean of the seeds)",
                       f"{paper('t2r')} vs {paper('elu')} and {paper('rfa')}", f"{t2r:.2f} vs {elu:.2f} and {rfa:.2f}",
                       held))
    return claims + pretraining_claims(test, spread, paper, curves) + teacher_gap_claims(test, spread, paper)


def lm_readers(lm: list) -> tuple:
    """test(model, init): the mean test ppl of the seeds; spread(model, init): half their range; paper(model, init)."""
    test = lambda model, init: mean_of(group(lm, model=model, init=init), "test_ppl")
    spread = lambda model, init="pretrained": half_range([r["test_ppl"] for r in group(lm, model=model, init=init)])
    paper = lambda model, init="pretrained": PAPER_LM[(model, init)].test
    return test, spread, paper


def pretraining_claims(test, spread, paper, curves: list = ()) -> list:
    """Pretraining helps T2R (with the tokens the finetuning took to pass T2R-from-scratch's final perplexity:
    reported, not judged apart, because a conversion that ends below the from-scratch run crosses it within its
    fifth of the steps), and helps it more than ELU and RFA: three verdicts, each with the seeds' spread."""
    gains = {m: (test(m, "random"), test(m, "pretrained")) for m in ("t2r", "elu", "rfa")}
    gains = {m: g for m, g in gains.items() if None not in g}
    if "t2r" not in gains:
        return []
    (scratch, converted), noise = gains["t2r"], lambda m: spread(m) + spread(m, "random")
    claims = [("pretraining helps T2R: converted and finetuned (a fifth of the steps) it beats T2R trained from "
               "scratch with the teacher's budget (test ppl)", f"{paper('t2r')} vs {paper('t2r', 'random')}",
               f"{converted:.2f} vs {scratch:.2f} (spread {noise('t2r'):.2f}); {conversion_tokens(curves)}",
               ordering(converted, scratch, noise("t2r")))]
    gain = {m: g[0] - g[1] for m, g in gains.items()}
    paper_gain = lambda m: paper(m, "random") - paper(m)
    for other in (m for m in ("elu", "rfa") if m in gain):
        claims.append((f"pretraining helps T2R more than {NAMES[other]} (test ppl gained, random -> pretrain)",
                       f"{paper_gain('t2r'):.1f} vs {paper_gain(other):.1f}",
                       f"{gain['t2r']:.2f} vs {gain[other]:.2f} ({NAMES[other]} {gains[other][0]:.2f} -> "
                       f"{gains[other][1]:.2f}; spread {noise('t2r') + noise(other):.2f})",
                       ordering(gain[other], gain["t2r"], noise("t2r") + noise(other))))
    return claims


def conversion_tokens(curves: list) -> str:
    """The training tokens the finetuning took to reach T2R-from-scratch's final validation perplexity (at its first
    evaluation there: an upper bound), against the tokens the from-scratch run took (the paper: 98 against 474 GPU
    hours). Wall-clock minutes on a shared machine are not a cost measure: runs of the same steps took 64 to 109."""
    from_scratch = sorted(group(curves, task="lm", model="t2r", init="random"), key=lambda r: r["step"])
    converted = sorted(group(curves, task="lm", model="t2r", init="pretrained"), key=lambda r: r["step"])
    if not (from_scratch and converted):
        return "no learning curves to read its tokens from"
    target, total = from_scratch[-1]["valid_loss"], from_scratch[-1]["tokens"]
    reached = next((r for r in converted if r["valid_loss"] <= target), None)
    if reached is None:
        return f"from scratch's final valid ppl {math.exp(target):.2f} not reached"
    return (f"it passed from scratch's final valid ppl {math.exp(target):.2f} after {reached['tokens'] / 1e6:.2f}M of "
            f"its tokens against {total / 1e6:.2f}M ({total / reached['tokens']:.1f}x fewer)")


def teacher_gap_claims(test, spread, paper) -> list:
    """The paper's comparisons with its teacher: a gap remains between T2R + pretrain and the teacher, and the 75%
    hybrid (its main reading: of 4 layers, the bottom one kept softmax) matches the teacher; the hybrid is set
    against the softmax control too, trained for its steps (hybrid_verdict)."""
    teacher, t2r, control = test("softmax", "random"), test("t2r", "pretrained"), test("softmax", "pretrained")
    if None in (teacher, t2r):
        return []
    noise = spread("t2r") + spread("softmax", "random")
    earlier = ""
    if control is not None:  # before its runs the gap was read against the control where it had run
        control_noise = spread("t2r") + spread("softmax")
        earlier = beside("gap-to-softmax-model", rules.gap_to_softmax_model(t2r, control, control_noise))
    claims = [("a gap remains between T2R + pretrain and the teacher (test ppl)",
               f"{paper('t2r')} vs {paper('softmax', 'random')}",
               f"{t2r:.2f} vs {teacher:.2f} (spread {noise:.2f}){earlier}", ordering(teacher, t2r, noise))]
    if test("t2r75", "pretrained") is not None:
        claims.append(hybrid_check(test, spread, paper, "t2r75"))
    return claims


def hybrid_check(test, spread, paper, model: str, note: str = "") -> tuple:
    """The 75% hybrid against the teacher, as the paper compares it, and against the softmax control, which trained
    for the hybrid's total steps (the teacher's plus the finetuning's): hybrid_verdict."""
    hybrid, teacher, control = test(model, "pretrained"), test("softmax", "random"), test("softmax", "pretrained")
    to_teacher = spread(model) + spread("softmax", "random")
    ours = f"{hybrid:.2f} vs the teacher's {teacher:.2f} ({hybrid - teacher:+.2f}, spread {to_teacher:.2f})"
    if control is None:
        held = rules.hybrid_teacher_one_sided(hybrid, teacher, to_teacher)
    else:
        to_control = spread(model) + spread("softmax")
        ours += (f"; vs the softmax control's {control:.2f}, the same total steps ({hybrid - control:+.2f}, spread "
                 f"{to_control:.2f})")
        held = hybrid_verdict(hybrid - teacher <= to_teacher, hybrid - control <= to_control)
        t2r = test("t2r", "pretrained")
        if t2r is not None and t2r > control:
            ours += beside("hybrid-most-of-gap", rules.hybrid_most_of_gap(t2r, hybrid, control))
        ours += beside("hybrid-teacher-one-sided", rules.hybrid_teacher_one_sided(hybrid, teacher, to_teacher))
    return (f"the 75% hybrid ({HYBRIDS[model]}) matches the teacher (test ppl{note})",
            f"{paper('t2r75')} vs {paper('softmax', 'random')}", ours, held)


def hybrid_verdict(matches_teacher: bool, matches_control: bool) -> str:
    """Matching is one-sided (no more than the spread behind): yes where the hybrid matches both the teacher and the
    softmax control trained for its steps, **no** where neither, inconclusive where they part (a teacher that
    trained fewer steps is easier to match)."""
    if matches_teacher and matches_control:
        return "yes"
    if not (matches_teacher or matches_control):
        return "**no**"
    return ("inconclusive: it matches the teacher, not the softmax control of its steps" if matches_teacher else
            "inconclusive: it matches the softmax control of its steps, not the teacher")


def lm_controls(lm: list) -> list:
    """The study's own checks, which the paper did not make: pretraining against T2R from scratch at equal total
    steps (three seeds; and at twice every budget), the gap to the teacher trained on for the finetuning's steps
    (the softmax control) and the 75% hybrid closing it, and the other reading of the hybrid (the top layer kept)."""
    test, spread, paper = lm_readers(lm)
    checks = [equal_budget_check(lm, suffix) for suffix in ("", f"-{DOUBLED}")]
    control, teacher, t2r = test("softmax", "pretrained"), test("softmax", "random"), test("t2r", "pretrained")
    if None in (control, t2r):
        return checks
    noise = spread("t2r") + spread("softmax")
    gap = ordering(control, t2r, noise)
    checks.append(("a gap remains between T2R + pretrain and the softmax control (test ppl)", "-",
                   f"{t2r:.2f} vs {control:.2f} (spread {noise:.2f})", gap))
    for model, reading in HYBRIDS.items():
        hybrid = test(model, "pretrained")
        if hybrid is None:
            continue
        if gap != "yes":
            ours, held = f"T2R {t2r:.2f} is not behind the control's {control:.2f} by more than the spread", "n/a"
        else:  # closed: what is left of the gap is inside the seeds' spread
            closed, left, noise = (t2r - hybrid) / (t2r - control), hybrid - control, spread(model) + spread("softmax")
            ours = f"{t2r:.2f} -> {hybrid:.2f}, the control {control:.2f}: {100 * closed:.0f}% of the gap closed, " \
                   f"{left:.2f} left (spread {noise:.2f})"
            held = verdict(left <= noise)
            ours += beside("hybrid-most-of-gap", rules.hybrid_most_of_gap(t2r, hybrid, control))
        checks.append((f"the 75% hybrid ({reading}) closes the gap to the softmax control (test ppl)", "-", ours, held))
        if model != "t2r75" and teacher is not None:  # the other reading, against the teacher as the paper's
            checks.append(hybrid_check(test, spread, paper, model, "; the other reading"))
    return checks


def equal_budget_check(lm: list, suffix: str) -> tuple:
    """T2R + pretrain against T2R from scratch for the teacher's and the finetuning's steps together: the gap
    against the seeds' spread of both (suffix "-2x": at twice every budget), with how many seeds each side has."""
    budget = ", at twice every budget" if suffix else ""
    claim = (f"pretraining helps T2R at equal total steps{budget}: converted and finetuned it beats T2R trained from "
             "scratch for the teacher's and the finetuning's steps together (test ppl)")
    numbers = equal_budget_numbers(lm, suffix)
    if numbers is None:
        return claim, "not compared at equal budgets", "running: its runs are not all finished", NOT_MEASURED
    converted, scratch, noise, borrowed, (n, m) = numbers
    missing = (1 if suffix else len(LONGER_SEEDS)) - m
    running = f"; {missing} more seed{'s' * (missing > 1)} of it running" if missing > 0 else ""
    if not suffix:  # the rule set before its runs read the gap against Table 1's T2R seeds alone
        _, spread, _ = lm_readers(lm)
        running += beside("equal-budget-t2r-spread",
                          rules.ordered(converted, scratch, spread("t2r") + spread("t2r", "random")))
    spread = f"spread {noise:.2f}" + (", the 1x seeds'" if borrowed else "")
    return (claim, "not compared at equal budgets", f"{converted:.2f} ({n} seed{'s' * (n > 1)}) vs {scratch:.2f} "
            f"({m}) ({spread}){running}", ordering(converted, scratch, noise))


def equal_budget_numbers(lm: list, suffix: str) -> tuple | None:
    """(T2R + pretrain's mean test ppl, T2R from scratch's, the noise: their seeds' spreads added, whether a side
    took its 1x model's spread, each side's seeds); None until both sides have run. At twice the budget (suffix
    "-2x") a side with one seed has no spread of its own: it takes its 1x model's."""
    test, spread, _ = lm_readers(lm)
    sides = [(f"t2r{suffix}", "pretrained"), (f"{LONGER}{suffix}", "random")]
    means, seeds = [test(*side) for side in sides], [len(group(lm, model=m, init=i)) for m, i in sides]
    if None in means:
        return None
    borrowed = [bool(suffix) and n == 1 for n in seeds]
    noise = sum(spread(m.removesuffix(suffix) if b else m, i) for (m, i), b in zip(sides, borrowed))
    return means[0], means[1], noise, any(borrowed), tuple(seeds)


def equal_budget_gaps(lm: list) -> list:
    """(budget multiple, T2R + pretrain's mean test ppl minus from scratch's, their half ranges added), for each
    budget whose two sides have run, T2R + pretrain one conversion a teacher: what equal_budget.png draws."""
    numbers = [(multiple, equal_budget_numbers(equal_budget_rows(lm, suffix), suffix))
               for multiple, suffix in ((1, ""), (2, f"-{DOUBLED}"))]
    return [(multiple, n[0] - n[1], n[2]) for multiple, n in numbers if n is not None]


# -----------------------------------------------------------------------------
# Equal budgets with one conversion a teacher: the 1x teacher trained with each of TEACHERS and each converted once,
# with its own seed (experiments/study.py's teacher_seed_runs), against T2R from scratch's seeds.

def table1(lm: list) -> list:
    """Table 1's rows: every run but the conversions of the teacher's other seeds (a row's `teacher`: the seed of the
    teacher it converted; empty from random init, and in an older CSV without the column). Its + pretrain rows are
    the seed-0 teacher's, as ELU's and RFA's are; its teacher's row every seed of the teacher."""
    return [r for r in lm if not r.get("teacher")]


def conversion_arm(lm: list, suffix: str = "") -> list:
    """T2R + pretrain's runs at equal budgets: one conversion a teacher, the one finetuned with its teacher's seed
    (at 1x the teacher's seeds 0, 1 and 2; at twice the budget, suffix "-2x", one teacher and one conversion)."""
    return [r for r in group(lm, model=f"t2r{suffix}", init="pretrained")
            if (r.get("teacher") or 0) == (r.get("seed") or 0)]


def equal_budget_rows(lm: list, suffix: str) -> list:
    """Table 1's rows with T2R + pretrain's (at the budget of suffix) the comparison's arm instead."""
    arm = (f"t2r{suffix}", "pretrained")
    return [r for r in table1(lm) if (r["model"], r["init"]) != arm] + conversion_arm(lm, suffix)


def conversions_of(arm: list, budget: int = 1) -> str:
    """"3 runs: a conversion of each of the teacher's seeds 0, 1, 2": the arm's runs by the teacher they converted."""
    teacher = "the teacher" if budget == 1 else f"the {budget}x teacher"
    seeds = ", ".join(str(r.get("teacher") or 0) for r in arm)
    if len(arm) < 2:
        return f"1 run: the conversion of {teacher}, seed {seeds}" if arm else "0 runs"
    return f"{len(arm)} runs: a conversion of each of {teacher}'s seeds {seeds}"


def p_value(p: float) -> str:
    """Two decimals, or two significant digits below 0.1: 0.11, 0.10, 0.024."""
    return f"{p:.2f}" if p >= 0.1 else f"{p:.2g}"


def equal_budget_arms_check(lm: list) -> tuple:
    """The equal-budget comparison at 1x, one conversion a teacher against T2R from scratch's seeds, judged by the
    two-arms rule (verdicts.two_arms, set before the conversions of the teacher's seeds 1 and 2 ran), with Welch's
    t and the exact permutation p; beside it the verdicts of the rules before it on the same runs: equal-budget (the
    means against each side's half range, added) and equal-budget-t2r-spread (against Table 1's T2R spreads)."""
    claim, paper, waiting, earlier = equal_budget_check(equal_budget_rows(lm, ""), "")
    if earlier == NOT_MEASURED:
        return claim, paper, waiting, earlier
    arm = conversion_arm(lm)
    converted, scratch = [r["test_ppl"] for r in arm], [r["test_ppl"] for r in group(lm, model=LONGER, init="random")]
    mean = lambda values: sum(values) / len(values)
    listed = lambda values: ", ".join(f"{v:.2f}" for v in values)
    ours = (f"{mean(converted):.2f} ({listed(converted)}; {conversions_of(arm)}) vs {mean(scratch):.2f} "
            f"({listed(scratch)}; {len(scratch)} seed{'s' * (len(scratch) > 1)})")
    for n, one, more in ((len(TEACHERS) - len(arm), "teacher's conversion", "teachers' conversions"),
                         (len(LONGER_SEEDS) - len(scratch), "seed from scratch", "seeds from scratch")):
        ours += f"; {n} more {one if n == 1 else more} running" if n > 0 else ""
    if min(len(converted), len(scratch)) < 2:
        held = NOT_MEASURED
        ours += "; the two-arms rule needs two runs a side"
    else:
        held = two_arms(converted, scratch)
        t, df, p = welch(converted, scratch)
        smallest = (2 if len(converted) == len(scratch) else 1) / math.comb(len(converted) + len(scratch), len(scratch))
        ours += (f"; Welch's t {t:.2f} (df {df:.1f}), two-sided p {p_value(p)}; exact permutation p "
                 f"{exact_permutation_p(converted, scratch):.2f} (at least {smallest:.2f}, {len(converted)} runs "
                 f"against {len(scratch)})")
    _, spread, _ = lm_readers(table1(lm))
    first = rules.ordered(mean(converted), mean(scratch), spread("t2r") + spread("t2r", "random"))
    return (claim, paper, ours + beside("equal-budget", earlier) + beside("equal-budget-t2r-spread", first), held)


# -----------------------------------------------------------------------------
# Table 2

def mt_claims(mt: list, pairs: list = ()) -> list:
    """Table 2's claims, on the paper's comparisons; `pairs` (gather.mt_pair_rows) give each difference its
    paired-bootstrap 95% interval. The study's controls: mt_controls."""
    get = lambda model, init: (group(mt, model=model, init=init) or [None])[0]
    soft, t2r, t2r_rand = get("softmax", "random"), get("t2r", "pretrained"), get("t2r", "random")
    elu = get("elu", "pretrained")
    paper = lambda model, init="pretrained": PAPER_MT[(model, init)]
    interval = lambda a, b: bootstrap_interval(pairs, a, b)
    claims = []
    if soft and t2r:
        claims.append(reaches_bleu(t2r, soft, "the teacher", interval))
    if t2r and not t2r_rand:
        claims.append(("T2R benefits from pretraining (test BLEU)", f"{paper('t2r')} vs {paper('t2r', 'random')} "
                       "(random init)", "no T2R translator from random init yet", NOT_MEASURED))
    if t2r and t2r_rand:
        text, low, high = interval(t2r, t2r_rand)
        noise = low is not None and low <= 0 <= high  # the interval holds no difference: either way, within noise
        claims.append(("T2R benefits from pretraining (test BLEU)",
                       f"{paper('t2r')} vs {paper('t2r', 'random')} (random init)",
                       f"{t2r['bleu']:.2f} vs {t2r_rand['bleu']:.2f}{text}",
                       "within noise" if noise else verdict(t2r["bleu"] > t2r_rand["bleu"])))
    if t2r and elu:
        text, low, high = interval(elu, t2r)
        difference = elu["bleu"] - t2r["bleu"]
        if low is not None:
            text += beside("elu-comparable-point",
                           rules.within_on_the_point(difference, -COMPARABLE_BLEU, COMPARABLE_BLEU))
        claims.append(("ELU + pretrain is comparable to T2R + pretrain (within 1 BLEU)",
                       f"{paper('elu')} vs {paper('t2r')}", f"{elu['bleu']:.2f} vs {t2r['bleu']:.2f}{text}",
                       inside(difference, low, high, -COMPARABLE_BLEU, COMPARABLE_BLEU)))
    return claims


def reaches_bleu(t2r: dict, other: dict, whom: str, interval) -> tuple:
    text, low, high = interval(t2r, other)
    if low is not None and whom == "the teacher":  # the rule before the translators' runs: the point alone
        point = rules.within_on_the_point(t2r["bleu"] - other["bleu"], -COMPARABLE_BLEU, math.inf)
        text += beside("bleu-point", point)
    return (f"T2R + pretrain reaches the transformer's BLEU ({whom}; within 1 point; ours sacreBLEU, the paper's "
            "tokenized BLEU)", f"{PAPER_MT[('t2r', 'pretrained')]} vs {PAPER_MT[('softmax', 'random')]}",
            f"{t2r['bleu']:.2f} vs {other['bleu']:.2f}{text}{other.get('note', '')}",
            inside(t2r["bleu"] - other["bleu"], low, high, -COMPARABLE_BLEU, math.inf))


def mt_controls(mt: list, pairs: list = ()) -> list:
    """The study's own checks on the translators: the decoding speed on the test sentences (the paper's Table 2
    points to Fig. 2 for speed, which length_claims test), T2R + pretrain against the teacher trained on for the
    finetuning's steps (the softmax control), and against T2R from scratch for the teacher's and the finetuning's
    steps."""
    get = lambda model, init: (group(mt, model=model, init=init) or [None])[0]
    t2r, control, longer = get("t2r", "pretrained"), get("softmax", "pretrained"), get(LONGER, "random")
    interval = lambda a, b: bootstrap_interval(pairs, a, b)
    if not t2r:
        return []
    start = get(RETRAINED_TEACHER, "random")  # where the control started, if not the teacher's own weights
    if control and start:
        text = bootstrap_interval(pairs, control, start)[0]
        control = {**control, "note": f"; the control trained on from the teacher trained again, whose test BLEU is "
                                      f"{start['bleu']:.2f}: {control['bleu']:.2f} vs {start['bleu']:.2f}{text}"}
    elu, soft = get("elu", "pretrained"), get("softmax", "random")
    speed = [speed_claim(soft, t2r, elu)] if elu and soft and None not in (
        t2r["tokens_per_s"], elu["tokens_per_s"], soft["tokens_per_s"]) else []
    checks = speed + [reaches_bleu(t2r, control, "the softmax control", interval) if control else
              ("T2R + pretrain reaches the transformer's BLEU (the softmax control)", "-", "not trained yet",
               NOT_MEASURED)]
    claim = ("T2R benefits from pretraining at equal total steps: T2R + pretrain against T2R trained from scratch for "
             "the teacher's and the finetuning's steps together (test BLEU)")
    if not longer:
        return checks + [(claim, "not compared at equal budgets", "running: its run is not finished", NOT_MEASURED)]
    text, low, high = interval(t2r, longer)
    noise = low is not None and low <= 0 <= high
    return checks + [(claim, "not compared at equal budgets", f"{t2r['bleu']:.2f} vs {longer['bleu']:.2f}{text}",
                      "within noise" if noise else verdict(t2r["bleu"] > longer["bleu"]))]


def inside(difference: float, low, high, least: float, most: float) -> str:
    """Is a BLEU difference within [least, most] (on the numbers as reported, two decimals)? With its bootstrap
    interval (low, high): yes when all of the interval is, **no** when none of it is, else inconclusive."""
    within_bounds = lambda d: least <= round(d, 2) <= most
    if low is None:
        return verdict(within_bounds(difference))
    if within_bounds(low) and within_bounds(high):
        return "yes"
    if round(high, 2) < least or round(low, 2) > most:
        return "**no**"
    return f"inconclusive, its 95% interval crossing {COMPARABLE_BLEU:g} BLEU"


def speed_claim(soft: dict, t2r: dict, elu: dict) -> tuple:
    """On the test sentences: yes only when every T2R pass beats every pass of the others, **no** when another
    model's every pass beats every T2R pass, else inconclusive at that length (the paper's claim is about long
    sequences: length_claims judges the trend)."""
    low = lambda r: r["tokens_per_s"] if r.get("speed_low") is None else r["speed_low"]
    high = lambda r: r["tokens_per_s"] if r.get("speed_high") is None else r["speed_high"]
    length = t2r.get("tokens_per_sentence")
    if low(t2r) > max(high(elu), high(soft)):
        held = "yes"
    elif high(t2r) < max(low(elu), low(soft)):
        held = "**no**"
    else:
        held = f"inconclusive at {length:.0f} tokens" if length else "inconclusive at this length"
    passes = t2r.get("speed_passes")
    ks = (elu.get("k_cross"), t2r.get("k_cross"), t2r.get("k_causal"))
    # the paper's ELU has k = its head size, 64, twice T2R's 32: at a head size of 32 ELU's k equals T2R's cross k
    heads = (f"; ELU's k is the head size, {ks[0]}, against T2R's {ks[1]} (cross) and {ks[2]} (causal): "
             + ("only the decoder's causal k is smaller" if ks[0] == ks[1] else "smaller in both" if ks[0] > ks[1]
                else "T2R's cross k is the larger")
             if None not in ks else "")
    return ("T2R decodes faster than ELU (smaller k) and than the transformer: greedy, batch 16, on the "
            "test sentences" + (f" ({length:.0f} tokens on average)" if length else ""), PAPER_SPEED,
            f"{t2r['tokens_per_s']:.0f} vs {elu['tokens_per_s']:.0f} (ELU) and {soft['tokens_per_s']:.0f} "
            f"(softmax) tokens/s" + (f", medians of {passes} passes" if passes and passes > 1 else "") + heads, held)


# -----------------------------------------------------------------------------
# Fig. 2: decoding speed against length, from bench.py's translator rows (bench.csv, section s2s)

BENCH_MODELS = {"softmax": "softmax_kv", "t2r": "t2r32-4", "elu": "elu", "rfa": "rfa32-4"}
FIG2_BATCH = 16  # the batch size of the paper's Fig. 2
# bench.py's translator has heads of 64, as the paper's: ELU's k is twice T2R's cross k (benchmarks/bench_models.py)
BENCH_FEATURES = {"elu": "; heads of 64: ELU's k = 64 against T2R's 32 (cross) and 4 (causal), as in the paper",
                  "rfa": "; RFA's 32 (cross) and 4 (causal) projections, T2R's k"}


def length_claims(bench: list) -> list:
    """Tokens/s of T2R over softmax, ELU and RFA at every source = target length bench.py measured (at Fig. 2's
    batch size if it was measured, else at its largest), read from its CSV rows. Without them the claims are
    listed as not measured, so that a report never drops them silently."""
    rows = [r for r in bench if r["section"] == "s2s" and r["metric"] == "tokens_per_s"]
    batch = FIG2_BATCH if any(r["batch"] == FIG2_BATCH for r in rows) or not rows else max(r["batch"] for r in rows)
    speed = {(r["model"], r["length"]): r["value"] for r in rows if r["batch"] == batch}
    lengths = sorted({length for model, length in speed if model == BENCH_MODELS["t2r"]})
    ratio = {other: {n: speed[(BENCH_MODELS["t2r"], n)] / speed[(BENCH_MODELS[other], n)] for n in lengths
                     if (BENCH_MODELS[other], n) in speed} for other in ("softmax", "elu", "rfa")}
    over = lambda other: ", ".join(f"{n}: {x:.2f}x" for n, x in ratio[other].items()) or "-"
    lead = (f"Fig. 2: T2R's lead over the transformer grows with the length (longest against shortest; greedy, "
            f"batch {batch}, source = target length, bench.py)", "faster from short lengths on, the gap growing")
    soft = list(ratio["softmax"].values())
    claims = [(*lead, over("softmax"), verdict(soft[-1] > soft[0] and soft[-1] > 1)) if len(soft) >= 2 else
              (*lead, "no bench.py translator rows in bench/bench.csv", NOT_MEASURED)]
    for other in ("elu", "rfa"):
        ratios = list(ratio[other].values())
        held = speed_verdict(ratios) if ratios else NOT_MEASURED
        earlier = beside("fig2-margin", rules.margin_at_every_length(ratios)) if ratios else ""
        claims.append((f"Fig. 2: T2R decodes at least {100 * (FEATURE_MARGIN - 1):.0f}% faster than {NAMES[other]} "
                       f"at every length (greedy, batch {batch}, bench.py)", f"15%+ over {NAMES[other]}",
                       over(other) + BENCH_FEATURES[other] + earlier, held))
    return claims


def speed_verdict(ratios: list) -> str:
    """At least FEATURE_MARGIN at every length, judged on single unpaired timings: yes only where even the lowest
    ratio clears the margin by their noise, no where some ratio falls short of it by more, else inconclusive."""
    if min(ratios) >= FEATURE_MARGIN * (1 + SINGLE_RUN_NOISE):
        return "yes"
    return "**no**" if min(ratios) * (1 + SINGLE_RUN_NOISE) < FEATURE_MARGIN else "inconclusive"


# -----------------------------------------------------------------------------
# Were the teachers trained to convergence? (The paper's were; a teacher still improving has less to hand over.)


def plateau_gain(curve: list):
    """How much the last fifth of a run (by step) lowered its best validation perplexity, relative; None when
    the curve is too short to tell. The fifth starts at the last evaluation at or before 80% of the run (the study's
    intervals put one there for the translator; 1900 of 2400 steps for the language model). curve: curves.csv rows
    of one run (step, valid_loss)."""
    last = max(r["step"] for r in curve)
    before = [r["valid_loss"] for r in curve if r["step"] <= 0.8 * last]
    if not before:
        return None
    best_before, best = min(before), min(r["valid_loss"] for r in curve)
    return 1 - math.exp(best - best_before)  # losses are log-perplexities


def convergence_checks(curves: list) -> list:
    """(which teacher, the measured gain over its last fifth, converged or not) for the LM and MT teachers."""
    checks = []
    for task, name in (("lm", "the language-model teacher"), ("mt", "the translation teacher")):
        curve = group(curves, task=task, model="softmax", init="random")
        gain = plateau_gain(curve) if curve else None
        if gain is not None:
            checks.append((name, f"{100 * gain:.1f}% lower validation perplexity over the last fifth of its "
                                 f"{max(r['step'] for r in curve)} steps", "converged" if gain < CONVERGED else
                           "**not converged**"))
    return checks


def bootstrap_interval(pairs: list, a: dict, b: dict) -> tuple:
    """(" (difference d, 95% interval lo to hi)" or "", the interval's ends or None) of rows a and b."""
    found = group(pairs, model=a["model"], init=a["init"], against_model=b["model"], against_init=b["init"])
    if not found:
        return "", None, None
    p = found[0]
    return f" (difference {p['delta']:+.2f}, 95% interval {p['low']:+.2f} to {p['high']:+.2f})", p["low"], p["high"]


def verdict_legend() -> str:
    """What each verdict means, and the study's own lines where the paper's words are qualitative."""
    return ("Verdicts: yes; **no**; within noise: the two sides differ by no more than the spread (half the range "
            "of each side's seeds, added; a side with one seed adds 0, but at twice the equal budget, where a side of "
            "one run takes its 1x seeds' spread, as its row says); inconclusive: a 95% interval, the timing "
            f"passes, or single timings give or take their {SINGLE_RUN_NOISE:.0%} noise, straddle the line; n/a: "
            "nothing to judge; not measured: its runs are not made yet. Neither of the last two is counted; the "
            "headline counts within noise as inconclusive. Where the "
            f"paper's words are qualitative the lines are the study's: similar or comparable BLEU within "
            f"{COMPARABLE_BLEU:g} point; a strong correlation: Spearman's rho above {STRONG} with any one point left "
            f"out (the rule set before Fig. 6's runs); much closer attention: the distance at least halved (Fig. 5's, "
            f"the same); a 15%+ "
            f"speedup: {FEATURE_MARGIN:.2f}x or more at every length; a converged teacher: less than "
            f"{CONVERGED:.0%} better over the last fifth of its run.")


def all_claims(results: dict) -> list:
    """The paper's claims, one check per claim, each on the paper's own comparison, in the paper's order: Table 1,
    Figs. 4-6, Table 2, Fig. 2."""
    lm = table1(results["lm"])  # the + pretrain rows of the seed-0 teacher; the teacher's row all its seeds
    return (lm_claims(lm, results.get("curves", [])) + feature_claims(results["fs"], results["att"], lm)
            + mt_claims(results["mt"], results.get("mt_pairs", [])) + length_claims(results.get("bench", [])))


def all_controls(results: dict) -> list:
    """The study's own checks beside the paper's: its controls (equal budgets, the teacher trained on) and the
    ablation of the 75% hybrid's other reading. At 1x the equal budgets' check is one conversion a teacher's, by the
    two-arms rule (equal_budget_arms_check), in the place of lm_controls' first check (the rule before, on Table 1's
    seeds of one teacher: its verdict on the new arm stands beside)."""
    _, *rest = lm_controls(table1(results["lm"]))
    return [equal_budget_arms_check(results["lm"]), *rest] + mt_controls(results["mt"], results.get("mt_pairs", []))
