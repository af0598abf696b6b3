"""
How the paper's claims are judged (experiments/claims.py, experiments/claims_attention.py): the verdicts' words, the
rows of one model, the spread of the seeds, an ordering within that spread, and the rank correlation that no single
point can carry.

    python -m pytest -q tests/test_claims.py         # each rule against made-up rows
"""

from experiments.rules import SEPARATED  # the thresholds live in experiments/rules.py

NOT_MEASURED = "not measured"
PERMUTATIONS = 10_000  # shuffles of one side for a permutation p (seeded: the same p every time)


def group(rows: list, **match) -> list:
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def half_range(values: list) -> float:
    """The spread we report for two seeds: half the range, not a confidence interval."""
    return (max(values) - min(values)) / 2 if values else 0.0


def verdict(held: bool) -> str:
    return "yes" if held else "**no**"


def ordering(low: float, high: float, spread: float) -> str:
    """The verdict on "low is below high": within noise when they differ by no more than `spread`, either way;
    else yes or **no**."""
    if abs(high - low) <= spread:
        return "within noise"
    return "yes" if low < high else "**no**"


def pearson(xs, ys) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    return sxy / (sxx * syy) ** 0.5 if sxx and syy else float("nan")


def ranks(values) -> list:
    """Ranks from 1, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    rank = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for m in range(i, j + 1):
            rank[order[m]] = (i + j) / 2 + 1
        i = j + 1
    return rank


def spearman(xs, ys) -> float:
    """Spearman's rank correlation: Pearson's on the ranks, so that no single point can carry it."""
    return pearson(ranks(xs), ranks(ys))


def permutation_p(xs, ys, statistic=None, rounds: int = PERMUTATIONS) -> float:
    """One-sided: the share of shuffles of ys whose statistic (Spearman's rho) is at least the observed one, the
    observed pairing counted as one shuffle (so never 0). Seeded, so that a page rebuilt reads the same p."""
    import random
    statistic = statistic or spearman
    observed, shuffled, rng = statistic(xs, ys), list(ys), random.Random(0)
    hits = 1
    for _ in range(rounds):
        rng.shuffle(shuffled)
        hits += statistic(xs, shuffled) >= observed - 1e-12
    return hits / (rounds + 1)


# -----------------------------------------------------------------------------
# Two arms of a few seeds each: the equal-budget comparison with one conversion a teacher. The rule below was set on
# 2026-11-28, while the teachers of seeds 1 and 2 trained and before either conversion ran (experiments/study.py's
# --stage teachers); a change after their numbers are known goes to the page beside the verdict it replaced.

def student_t_two_sided(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with df degrees of freedom (any df > 0): the regularised incomplete beta
    I_x(df / 2, 1 / 2) at x = df / (df + t^2), by its continued fraction (Lentz's method)."""
    import math
    x, a, b = df / (df + t * t), df / 2, 0.5
    if x <= 0 or x >= 1:  # |t| infinite, or t = 0
        return 0.0 if x <= 0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    return min(1.0, front * fraction)  # x < (a + 1) / (a + b + 2) at every df here: the fraction converges


def welch(xs: list, ys: list) -> tuple:
    """Welch's t test of mean(xs) against mean(ys): (t, degrees of freedom, two-sided p)."""
    mean = lambda v: sum(v) / len(v)
    var = lambda v: sum((x - mean(v)) ** 2 for x in v) / (len(v) - 1)
    a, b = var(xs) / len(xs), var(ys) / len(ys)
    t = (mean(xs) - mean(ys)) / (a + b) ** 0.5
    df = (a + b) ** 2 / (a ** 2 / (len(xs) - 1) + b ** 2 / (len(ys) - 1))
    return t, df, student_t_two_sided(t, df)


def exact_permutation_p(xs: list, ys: list) -> float:
    """Two-sided: the share of all splits of the pooled runs into groups of their sizes whose |difference of means|
    is at least the observed one (3 against 3: 20 splits, a split and its mirror alike, so never below 2 / 20 =
    0.10; 2 against 3: 10 splits, at best 1 / 10)."""
    from itertools import combinations
    pooled, n = xs + ys, len(xs)
    gap = lambda chosen: abs(sum(pooled[i] for i in chosen) / n -
                             sum(pooled[i] for i in range(len(pooled)) if i not in chosen) / len(ys))
    observed, splits = gap(range(n)), list(combinations(range(len(pooled)), n))
    return sum(gap(chosen) >= observed - 1e-12 for chosen in splits) / len(splits)


def two_arms(low: list, high: list) -> str:
    """The verdict on "the runs of `low` are below those of `high`": yes (or **no**, the other way) only where every run
    of one arm is beyond every run of the other (the exact permutation p at the smallest the arms' sizes can give)
    and Welch's two-sided p is below SEPARATED; within noise otherwise."""
    from math import comb
    smallest = (2 if len(low) == len(high) else 1) / comb(len(low) + len(high), len(low))
    separated = exact_permutation_p(low, high) <= smallest + 1e-12 and welch(low, high)[2] < SEPARATED
    if not separated:
        return "within noise"
    return "yes" if sum(low) / len(low) < sum(high) / len(high) else "**no**"
