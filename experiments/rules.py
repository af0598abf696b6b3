"""
Every verdict's rule, in one place and dated: what it says, the thresholds it reads (defined here, and only here),
the commit that set it, and whether the runs it judges had finished by then. A rule set after its runs' numbers
were known shows, beside its verdict on the results page, the verdict of the rule in force before them; where the
study follows the rule set before its runs (Figs. 5 and 6), the later rule's verdict stands beside it instead. A rule
replaced on one check may stay in force on another (equal-budget: in force at twice the budget, beside two-arms at
1x).

Each entry keeps a fingerprint of its rule (its words, its thresholds and the source of the functions that judge):
tests/test_claims.py fails when a rule changes without a new dated entry here.

    python -m experiments.rules                      # each rule's fingerprint as the code reads now
"""

import hashlib
import importlib
import inspect
from dataclasses import dataclass

# -----------------------------------------------------------------------------
# The thresholds, where the paper's words are qualitative (the study's lines, not the paper's)

STRONG = 0.7  # a strong correlation: rank correlation of at least this (over 5 points rho moves in steps of 0.1)
SIGNIFICANT = 0.05  # ... and a one-sided permutation p below this
COMPARABLE_BLEU = 1.0  # "similar BLEU": within this many points
FEATURE_MARGIN = 1.15  # "a 15%+ speedup over ELU and RFA"
SINGLE_RUN_NOISE = 0.4  # one unpaired timing each: on this shared machine single runs vary by up to 40%
CONVERGED = 0.01  # converged: the last fifth of the run lowered the best validation perplexity by less than 1%
SEPARATED = 0.05  # two arms apart: Welch's two-sided p below this, and the permutation p the smallest possible
MUCH_CLOSER = 0.5  # "much closer" (Fig. 5), as set before its runs: the distance at least halved at every k
MOST_OF_THE_GAP = 0.5  # "closes most of the gap" (the 75% hybrid), as set before its runs
NEAR_CONTROL = 0.02  # since T2R: an all-linear conversion "within 2% of the softmax control"
MQAR_RECALL = 0.95  # since T2R: an all-linear conversion "recalls at least 0.95" at 64 pairs

THRESHOLDS = dict(STRONG=STRONG, SIGNIFICANT=SIGNIFICANT, COMPARABLE_BLEU=COMPARABLE_BLEU,
                  FEATURE_MARGIN=FEATURE_MARGIN, SINGLE_RUN_NOISE=SINGLE_RUN_NOISE, CONVERGED=CONVERGED,
                  SEPARATED=SEPARATED, MUCH_CLOSER=MUCH_CLOSER, MOST_OF_THE_GAP=MOST_OF_THE_GAP,
                  NEAR_CONTROL=NEAR_CONTROL, MQAR_RECALL=MQAR_RECALL)

# When the runs each group of checks reads finished (the dates of their results/runs/*/machine.json; bench.csv's
# header for Fig. 2). A rule committed before that date was set before its numbers were known.
LM_RUNS = "2026-11-24"  # Table 1's models, Figs. 4-6's sweep and attention analysis (second edition)
MT_RUNS = "2026-11-24"  # Table 2's translators
BENCH_RUNS = "2026-11-24 and 2026-11-25"  # bench.py on the translators (5599d11, then cfc21bf, which the page reads)
SINCE_MT_RUNS = "the translator's: 2026-11-28 and later"  # results/since_t2r.md's translator
SINCE_RUNS = "2026-11-28, but five recipes' first seed before"  # results/since_t2r.md's PTB and MQAR


@dataclass(frozen=True)
class Rule:
    id: str
    check: str  # a pattern the start of the check's text on the results page matches (re.match)
    words: str  # the rule, as the page says it
    judges: tuple  # "module.function": the code that applies it
    thresholds: tuple  # the names in THRESHOLDS it reads
    commit: str  # the commit that set it, and its date
    date: str
    runs: str  # when the runs it judges finished
    before_runs: bool  # set before those runs' numbers were known
    fingerprint: str  # of words, thresholds and the judges' source: fingerprint(rule) must equal it
    in_force: bool = True  # False: replaced, or set after its runs and not followed; its verdict shown beside
    beside: tuple = ()  # the rules whose verdicts the page shows beside this one's


def fingerprint(rule: Rule) -> str:
    """12 hex digits of a SHA-256 over the rule's words, its thresholds' names and values, and the source of its
    judges: any change to what decides the verdict changes it."""
    parts = [rule.words, *(f"{name}={THRESHOLDS[name]!r}" for name in rule.thresholds)]
    for name in rule.judges:
        module, function = name.rsplit(".", 1)
        parts.append(inspect.getsource(getattr(importlib.import_module(module), function)))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


P = "experiments.claims."  # the judges' modules
A = "experiments.claims_attention."
V = "experiments.verdicts."
R = "experiments.rules."
S = "experiments.since_t2r."

RULES = [
    # ---- Table 1
    Rule("t2r-beats-elu-rfa", r"T2R \+ pretrain beats ELU \+ pretrain and RFA \+ pretrain",
         "each gap against the two sides' seeds' spread, added; the weaker of the two verdicts",
         (V + "ordering", P + "lm_claims"), (), "e567dc8", "2026-11-23", LM_RUNS, True, "18c695e90e5d"),
    Rule("pretraining-helps-t2r", r"pretraining helps T2R: converted",
         "T2R + pretrain below T2R from scratch by more than their seeds' spread (the tokens reported, not judged)",
         (V + "ordering", P + "pretraining_claims"), (), "e567dc8", "2026-11-23", LM_RUNS, True, "e33e6337a9a9"),
    Rule("helps-more", r"pretraining helps T2R more than",
         "T2R's gain (random -> pretrain) above the other model's by more than the four runs' spreads",
         (V + "ordering", P + "pretraining_claims"), (), "e567dc8", "2026-11-23", LM_RUNS, True, "03b37b2c1e1b"),
    Rule("gap-to-teacher", r"a gap remains between T2R \+ pretrain and the teacher",
         "T2R + pretrain behind the teacher by more than their seeds' spread",
         (V + "ordering", P + "teacher_gap_claims"), (), "b011617", "2026-11-26", LM_RUNS, False, "4c6c94e7b470",
         beside=("gap-to-softmax-model",)),
    Rule("gap-to-softmax-model", r"a gap remains between T2R \+ pretrain and the teacher",
         "T2R + pretrain behind the softmax control (the teacher trained on) by more than their seeds' spread",
         (R + "gap_to_softmax_model",), (), "e567dc8", "2026-11-23", LM_RUNS, True, "c43bac9ea586", in_force=False),
    Rule("hybrid-teacher-and-control", r"the 75% hybrid \(.*\) matches the teacher",
         "matches the teacher (no more than the spread behind it) and the softmax control trained for its steps: "
         "yes where both, **no** where neither, inconclusive where they part",
         (P + "hybrid_verdict",), (), "3b7bd9f", "2026-11-28", LM_RUNS, False, "e43c6ecb9b36",
         beside=("hybrid-most-of-gap", "hybrid-teacher-one-sided")),
    Rule("hybrid-teacher-one-sided", r"the 75% hybrid \(.*\) matches the teacher",
         "no more than the seeds' spread behind the teacher (one-sided: any lead counts)",
         (R + "hybrid_teacher_one_sided",), (), "e9b67df", "2026-11-25", LM_RUNS, False, "e07967d5b696",
         in_force=False),
    Rule("hybrid-most-of-gap", r"the 75% hybrid \(.*\) matches the teacher",
         "closes more than half the gap between T2R + pretrain and the softmax control",
         (R + "hybrid_most_of_gap",), ("MOST_OF_THE_GAP",), "3cecc7a", "2026-11-23", LM_RUNS, True, "06dd9cf5383d",
         in_force=False),
    # ---- Figs. 4-6
    Rule("fig4-trend-and-spread", r"Fig\. 4: pretraining beats random init",
         "every gap beyond the seeds' spread of Table 1's same runs, and a strong negative rank correlation of the "
         "gap with k with the ends apart by more than that spread; **no** the other way; else inconclusive",
         (A + "small_k_verdict",), ("STRONG",), "deba8f6", "2026-11-25", LM_RUNS, False, "64dd701e15c6",
         beside=("fig4-ends",)),
    Rule("fig4-ends", r"Fig\. 4: pretraining beats random init",
         "every gap above 0, and the smallest k's gap above the largest k's",
         (R + "fig4_ends",), (), "a2be54e", "2026-11-23", LM_RUNS, True, "6c58413503a9", in_force=False),
    Rule("fig5-halved", r"Fig\. 5: finetuning makes the attention much closer",
         "the distance to the teacher's attention at least halved at every k",
         (A + "much_closer",), ("MUCH_CLOSER",), "3cecc7a", "2026-11-23", LM_RUNS, True, "d6fac2d81d7e",
         beside=("fig5-direction",)),
    Rule("fig5-direction", r"Fig\. 5: finetuning makes the attention much closer",
         "the distance lower at every k by more than half the range of the distances before finetuning; the size "
         "reported, not judged",
         (A + "closer_at_every_k",), (), "b011617", "2026-11-26", LM_RUNS, False, "a58c404cdb4d", in_force=False),
    Rule("fig5-k-trend", r"Fig\. 5: the distance shrinks as k grows",
         "the largest k's distance below the smallest k's by more than half the range of the starting distances",
         (V + "ordering",), (), "3cecc7a", "2026-11-23", LM_RUNS, True, "4be29396059f"),
    Rule("fig5-frozen", r"Fig\. 5: with the MLP frozen", "the frozen run's distance above full finetuning's at every k",
         (A + "frozen_farther",), (), "a2be54e", "2026-11-23", LM_RUNS, True, "cd1c7c0871d4"),
    Rule("fig6-peakier-wander", r"Fig\. 6: pretraining gives peakier",
         "pretrain's entropy below random init's at every k by more than the two lines wander between neighbouring "
         "k; **no** where one k is the other way by more; else inconclusive",
         (A + "peakier", A + "wander"), (), "52a525f", "2026-11-25", LM_RUNS, False, "74f4361cec78",
         beside=("fig6-peakier-all",)),
    Rule("fig6-peakier-all", r"Fig\. 6: pretraining gives peakier", "pretrain's entropy below random init's at every k",
         (R + "peakier_at_every_k",), (), "a2be54e", "2026-11-23", LM_RUNS, True, "bc02a1f9a01a", in_force=False),
    Rule("fig6-falls-wander", r"Fig\. 6: entropy falls as k grows",
         "on each line measured at two k or more: a strong negative rank correlation with k and the ends apart by "
         "more than the line wanders; **no** rising the same way; else inconclusive",
         (A + "falling", A + "wander", A + "entropy_trend_claim"), ("STRONG",), "52a525f", "2026-11-25", LM_RUNS,
         False, "e138fb162a56", beside=("fig6-falls-ends",)),
    Rule("fig6-falls-ends", r"Fig\. 6: entropy falls as k grows",
         "both lines' largest k below their smallest k", (R + "falls_at_the_ends",), (), "a2be54e", "2026-11-23",
         LM_RUNS, True, "12d2f4bac64b", in_force=False),
    Rule("fig6-correlation-one-point", r"Fig\. 6: entropy correlates with validation perplexity",
         f"Spearman's rho above {STRONG} with any one point left out; carried by one point (inconclusive) where "
         "only all the points reach it; **no** below (c639d58 read a rho at the line as reaching it, after the runs' "
         "numbers: not followed)",
         (A + "strong_without_any_one_point",), ("STRONG",), "e567dc8", "2026-11-23", LM_RUNS, True, "c9f43fff1b8f",
         beside=("fig6-correlation-p",)),
    Rule("fig6-correlation-p", r"Fig\. 6: entropy correlates with validation perplexity",
         f"Spearman's rho, as reported to two decimals, at least {STRONG}, with a one-sided permutation p below "
         f"{SIGNIFICANT}", (A + "strong_and_significant", V + "permutation_p"), ("STRONG", "SIGNIFICANT"), "b011617",
         "2026-11-26", LM_RUNS, False, "d1b5f11584cd", in_force=False),
    # ---- Table 2
    Rule("bleu-interval", r"T2R \+ pretrain reaches the transformer's BLEU \(the teacher",
         "the difference's paired-bootstrap 95% interval all within the line (1 BLEU): yes; all beyond it: **no**; "
         "else inconclusive", (P + "inside", P + "reaches_bleu"), ("COMPARABLE_BLEU",), "c639d58", "2026-11-24",
         MT_RUNS, False, "b44bc619cb2b", beside=("bleu-point",)),
    Rule("bleu-point", r"T2R \+ pretrain reaches the transformer's BLEU \(the teacher",
         "the difference, read at two decimals, within the line (1 BLEU)", (R + "within_on_the_point",),
         ("COMPARABLE_BLEU",), "e567dc8", "2026-11-23", MT_RUNS, True, "8db713b5195b", in_force=False),
    Rule("bleu-pretraining", r"T2R benefits from pretraining \(test BLEU\)",
         "T2R + pretrain above T2R from scratch; within noise where the bootstrap interval holds 0",
         (P + "mt_claims",), (), "b7e9871", "2026-11-23", MT_RUNS, True, "46e88af95ac1"),
    Rule("elu-comparable-interval", r"ELU \+ pretrain is comparable to T2R \+ pretrain",
         "the difference's paired-bootstrap 95% interval all within 1 BLEU either way: yes; all beyond: **no**; "
         "else inconclusive", (P + "inside",), ("COMPARABLE_BLEU",), "c639d58", "2026-11-24", MT_RUNS, False,
         "0f2606d8cd97",
         beside=("elu-comparable-point",)),
    Rule("elu-comparable-point", r"ELU \+ pretrain is comparable to T2R \+ pretrain",
         "the difference, read at two decimals, within 1 BLEU either way", (R + "within_on_the_point",),
         ("COMPARABLE_BLEU",), "e567dc8", "2026-11-23", MT_RUNS, True, "07db5f8f6ca2", in_force=False),
    # ---- Fig. 2
    Rule("fig2-lead-grows", r"Fig\. 2: T2R's lead over the transformer grows",
         "T2R's speed over softmax's higher at the longest length than at the shortest, and above 1 there",
         (P + "length_claims",), (), "3cecc7a", "2026-11-23", BENCH_RUNS, True, "9d6714dd5a87"),
    Rule("fig2-margin-noise", r"Fig\. 2: T2R decodes at least 15% faster than",
         "yes where the lowest ratio clears 1.15 by the single timings' 40% noise, **no** where one falls short by "
         "more, else inconclusive", (P + "speed_verdict",), ("FEATURE_MARGIN", "SINGLE_RUN_NOISE"), "e9b67df",
         "2026-11-25", BENCH_RUNS, False, "5d1c0270339b", beside=("fig2-margin",)),
    Rule("fig2-margin", r"Fig\. 2: T2R decodes at least 15% faster than", "every length's ratio at least 1.15",
         (R + "margin_at_every_length",), ("FEATURE_MARGIN",), "3cecc7a", "2026-11-23", BENCH_RUNS, True,
         "852ecb788bfd",
         in_force=False),
    # ---- The study's controls, listed with their outcomes (not counted with the paper's claims)
    Rule("speed-test-sentences", r"T2R decodes faster than ELU \(smaller k\) and than the transformer",
         "every T2R timing pass above every pass of the others: yes; below: **no**; else inconclusive at that "
         "length", (P + "speed_claim",), (), "3cecc7a", "2026-11-23", MT_RUNS, True, "7efd506a8936"),
    Rule("equal-budget", r"pretraining helps T2R at equal total steps, at twice every budget",
         "the means against both sides' seeds' spread, added (at twice the budget a side with one seed takes its "
         "1x seeds' spread)", (P + "equal_budget_check", P + "equal_budget_numbers"), (), "c8adb91", "2026-11-27",
         "2026-11-25 (1x, seed 0) to 2026-11-27", False, "a2e9caf5e1ee", beside=("equal-budget-t2r-spread",)),
    Rule("equal-budget-t2r-spread", r"pretraining helps T2R at equal total steps",
         "the means against the spread of Table 1's T2R + pretrain and T2R from scratch", (R + "ordered",), (),
         "77339bc", "2026-11-25", "2026-11-25 (1x, seed 0) to 2026-11-27", True, "474085e62aa2", in_force=False),
    Rule("gap-to-control", r"a gap remains between T2R \+ pretrain and the softmax control",
         "T2R + pretrain behind the control by more than their seeds' spread", (V + "ordering", P + "lm_controls"),
         (), "e567dc8", "2026-11-23", LM_RUNS, True, "210091cdb81d"),
    Rule("hybrid-closes-gap", r"the 75% hybrid \(.*\) closes the gap",
         "what is left of the gap to the control within the hybrid's and the control's seeds' spread",
         (P + "lm_controls",), (), "c639d58", "2026-11-24", LM_RUNS, False, "74d210596dd8",
         beside=("hybrid-most-of-gap",)),
    Rule("bleu-control", r"T2R \+ pretrain reaches the transformer's BLEU \(the softmax control",
         "as bleu-interval, against the teacher trained on for the finetuning's steps",
         (P + "inside", P + "reaches_bleu", P + "mt_controls"), ("COMPARABLE_BLEU",), "77339bc", "2026-11-25",
         "2026-11-25", True, "251c7b30bcac"),
    Rule("bleu-equal-budget", r"T2R benefits from pretraining at equal total steps",
         "as bleu-pretraining, against T2R from scratch for the same total steps", (P + "mt_controls",), (),
         "b011617", "2026-11-26", "2026-11-27", True, "e00ee79546ea"),
    Rule("two-arms", r"pretraining helps T2R at equal total steps: converted",
         "yes (or **no**) only where every run of one arm is beyond every run of the other and Welch's two-sided p "
         f"is below {SEPARATED}; within noise otherwise: for the equal-budget comparison with one conversion a "
         "teacher",
         (V + "two_arms", V + "welch", V + "exact_permutation_p"), ("SEPARATED",), "c0016fe", "2026-11-28",
         "the conversions of the teacher's seeds 1 and 2, 2026-11-28; its other four runs 2026-11-25 to 27", True,
         "2bd26704d36a", beside=("equal-budget", "equal-budget-t2r-spread")),
    # ---- Since T2R (results/since_t2r.md): set before the runs they judge but the five first-look runs
    Rule("since-near-control", r"an all-linear conversion within 2% of the softmax control",
         f"an all-linear recipe's mean test perplexity over its seeds at most {NEAR_CONTROL:.0%} above the mean of "
         "the softmax control finetuned from the same teacher as long", (S + "near_control",), ("NEAR_CONTROL",),
         "6644ad4", "2026-11-28", SINCE_RUNS, True, "7878a3faafb2"),
    Rule("since-part-helps", r"a part added to T2R lowers its perplexity",
         "the two-arms rule over the seeds: every run of one recipe beyond every run of the other and Welch's "
         f"two-sided p below {SEPARATED}; within noise otherwise", (S + "part_helps", V + "two_arms"),
         ("SEPARATED",), "6644ad4", "2026-11-28", SINCE_RUNS, True, "74f6416d6299"),
    Rule("since-chosen-layers", r"the softmax layers chosen by data beat every-k-th",
         "where the ranking keeps the layers every-k-th keeps, the same model: no verdict; otherwise the two-arms "
         "rule over the seeds", (S + "chosen_beats_every_kth", V + "two_arms"), ("SEPARATED",), "6644ad4",
         "2026-11-28", SINCE_RUNS, True, "6f2a592d8dfd"),
    Rule("since-mqar-recall", r"an all-linear k = 32 conversion recalls at 64 pairs",
         f"its recall at 64 pairs at least {MQAR_RECALL}", (S + "recalls",), ("MQAR_RECALL",), "6644ad4",
         "2026-11-28", "2026-11-28, after the rule", True, "23fd5ce71339"),
    Rule("since-mqar-recall-longer", r"t2r\+decay\+conv4\+distill finetuned 4x as long recalls",
         f"the mean over its 3 seeds of its recall at 64 pairs at least {MQAR_RECALL}", (S + "recalls",),
         ("MQAR_RECALL",), "fa952c5", "2026-11-28", "2026-11-28, but its first seed (0.991) before", True,
         "4ed22cd8431d"),
    Rule("since-mt-near-control", r"an all-linear conversion within 1 BLEU of the softmax control",
         f"the test BLEU of the best all-linear recipe at most {COMPARABLE_BLEU:g} below the softmax control "
         "finetuned from the same teacher as long (one seed each)", (S + "translates_near_control",),
         ("COMPARABLE_BLEU",), "e41feca", "2026-11-28", SINCE_MT_RUNS, True, "95e4661882c5"),
    Rule("teacher-converged", r"the language-model teacher",
         f"the last fifth of its run lowered its best validation perplexity by less than {CONVERGED:.0%}",
         (P + "plateau_gain",), ("CONVERGED",), "4ec76e2", "2026-11-23", LM_RUNS, True, "54b981829b10"),
]
BY_ID = {rule.id: rule for rule in RULES}


def when(rule: Rule) -> str:
    """"set 2026-11-23 (3cecc7a), before its runs": the words the page gives a rule."""
    order = "before" if rule.before_runs else "after"
    return f"set {rule.date} ({rule.commit}), {order} its runs ({rule.runs})"


def beside(rule_id: str, held: str) -> str:
    """The text a check's numbers end with where the page shows a second rule's verdict beside its own."""
    rule = BY_ID[rule_id]
    order = "before" if rule.before_runs else "after"
    return f"; by rule {rule_id} (set {rule.date}, {order} its runs): {held.split(':')[0]}"


def rules_table() -> list:
    """Every rule on the results page: in force or shown beside, with the commit and date that set it."""
    lines = ["| rule | check | the rule | set | status |", "|---|---|---|---|---|"]
    for rule in RULES:
        shown = [r.id for r in RULES if rule.id in r.beside]
        status = "; ".join((["in force"] if rule.in_force else []) + ([f"shown beside {', '.join(shown)}"] if shown
                                                                      else []))
        check = rule.check.replace("\\", "").replace("(.*)", "(...)")  # the pattern as words
        lines.append(f"| {rule.id} | {check} | {rule.words} | {when(rule)} | {status} |")
    return lines


# -----------------------------------------------------------------------------
# The rules no longer in force, kept to give their verdicts beside the rules that replaced them

def _verdict(held: bool) -> str:
    return "yes" if held else "**no**"


def ordered(low: float, high: float, spread: float) -> str:
    """"low is below high" beyond the spread (verdicts.ordering, as it read when these rules were set)."""
    if abs(high - low) <= spread:
        return "within noise"
    return _verdict(low < high)


def gap_to_softmax_model(t2r: float, control: float, noise: float) -> str:
    return ordered(control, t2r, noise)


def hybrid_teacher_one_sided(hybrid: float, teacher: float, noise: float) -> str:
    return _verdict(hybrid - teacher <= noise)


def hybrid_most_of_gap(t2r: float, hybrid: float, control: float) -> str:
    return _verdict((t2r - hybrid) / (t2r - control) > MOST_OF_THE_GAP)


def fig4_ends(gaps: dict) -> str:
    ks = sorted(gaps)
    return _verdict(all(g > 0 for g in gaps.values()) and gaps[ks[0]] > gaps[ks[-1]])


def peakier_at_every_k(tuned: dict, rand: dict) -> str:
    return _verdict(all(tuned[k] < rand[k] for k in set(tuned) & set(rand)))


def falls_at_the_ends(tuned: dict, rand: dict) -> str:
    ks = sorted(set(tuned) & set(rand))
    return _verdict(tuned[ks[-1]] < tuned[ks[0]] and rand[ks[-1]] < rand[ks[0]])


def within_on_the_point(difference: float, least: float, most: float) -> str:
    return _verdict(least <= round(difference, 2) <= most)


def margin_at_every_length(ratios: list) -> str:
    return _verdict(min(ratios) >= FEATURE_MARGIN)


if __name__ == "__main__":
    for rule in RULES:
        print(f"{rule.id}: {fingerprint(rule)}" + ("" if fingerprint(rule) == rule.fingerprint else "  (changed)"))
