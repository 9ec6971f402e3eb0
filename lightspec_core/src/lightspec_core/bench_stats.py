"""Statistics of ``lightspec bench``: paired speed ratios with confidence intervals, the
one-sided paired t test of "slower", and Holm's step-down procedure over a family of
cells (``scripts/bench_targets.py`` judges the batch targets with them)."""

from __future__ import annotations

import math

# two-sided 95% quantiles of Student's t for 1..30 degrees of freedom (then the normal's)
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def paired_speedup(a, b) -> tuple[float, float, float] | None:
    """``a``'s speed relative to ``b``'s from their paired rounds: (geometric mean of the
    per-round ratios, and its 95% confidence interval from Student's t on their logs).

    In lockstep both methods ran every round's prompts at the same time, so a slow second
    of the shared machine hits both rounds alike and cancels in their ratio; what is left
    varies from round to round, and the interval says how far the mean can be trusted.
    A ratio whose interval holds 1 is not measurably different.  None with fewer than 2
    paired rounds (or rounds that did not produce the same tokens)."""
    n = len(a.round_seconds)
    if n < 2 or n != len(b.round_seconds) or a.round_tokens != b.round_tokens:
        return None
    logs = [math.log(tb / ta) for ta, tb in zip(a.round_seconds, b.round_seconds) if ta > 0 and tb > 0]
    return ratio_interval(logs) if len(logs) == n else None


def ratio_interval(logs: list[float]) -> tuple[float, float, float] | None:
    """From the logs of paired ratios: (geometric mean, its 95% confidence interval by
    Student's t), None with fewer than 2."""
    n = len(logs)
    if n < 2:
        return None
    mean, sd = _mean_sd(logs)
    half = (_T95[n - 2] if n - 1 <= len(_T95) else 1.96) * sd / math.sqrt(n)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1) of two or more values."""
    mean = sum(xs) / len(xs)
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))


def slower_p_value(logs: list[float]) -> float | None:
    """The one-sided p-value that a method is slower than its reference, from the logs of
    its paired speed ratios (``log(t_ref / t_method)`` per round, as ``paired_speedup``
    takes them): Student's t test of "mean log ratio >= 0" against "< 0".  Small means the
    rounds would rarely come out this slow if the method were not slower.  None with
    fewer than 2 logs; 0.5 when every round measured the same."""
    n = len(logs)
    if n < 2:
        return None
    mean, sd = _mean_sd(logs)
    if sd == 0:
        return 0.5 if mean == 0 else (0.0 if mean < 0 else 1.0)
    return _student_t_cdf(mean / (sd / math.sqrt(n)), n - 1)


def holm_rejected(p_values: dict[str, float], alpha: float = 0.05) -> list[str]:
    """The keys whose hypotheses Holm's step-down procedure rejects at family-wise error
    ``alpha``: sorted by p, the i-th smallest (from 0) is rejected while p <= alpha / (m - i).

    Why a family-wise test: a claim about many cells at once ("no strategy is slower on any
    workload") tested cell by cell at 5% each flags about one cell in twenty by chance
    alone, however equal the methods are (50 cells: ~2.5 two-sided, ~1.25 one-sided)."""
    ordered = sorted(p_values.items(), key=lambda kv: kv[1])
    m = len(ordered)
    out = []
    for i, (key, p) in enumerate(ordered):
        if p > alpha / (m - i):
            break
        out.append(key)
    return out


def _student_t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom, from the regularized
    incomplete beta function: P(|T| > |t|) = I_x(df/2, 1/2) with x = df / (df + t^2)."""
    tail = 0.5 * _incomplete_beta(df / (df + t * t), df / 2.0, 0.5)
    return tail if t < 0 else 1.0 - tail


def _incomplete_beta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1, by its continued
    fraction (modified Lentz), evaluated on the side of ``x`` where it converges fast."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _incomplete_beta(1.0 - x, b, a)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * f / a
