"""
How the paper's claims are judged (experiments/claims.py, experiments/claims_attention.py): the verdicts' words, the
rows of one model, the spread of the seeds, an ordering within that spread, and the rank correlation that no single
point can carry.

    python -m pytest -q tests/test_claims.py         # each rule against made-up rows
"""

NOT_MEASURED = "not measured"
STRONG = 0.7  # a strong correlation: rank correlation of at least this (over 5 points rho moves in steps of 0.1)
SIGNIFICANT = 0.05  # ... and a one-sided permutation p below this
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
