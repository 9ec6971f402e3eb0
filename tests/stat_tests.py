"""The two-sample chi-square test the sampling-distribution tests share (core and plugins):
do two lists of sampled outcomes (tokens, or tuples of tokens) come from one distribution?"""

from __future__ import annotations

import math
from collections import Counter


def two_sample_chi2(a: list, b: list) -> tuple[float, int]:
    """Chi-square statistic and degrees of freedom of a two-sample homogeneity test;
    categories with < 10 pooled counts are merged into one bin."""
    ca, cb = Counter(a), Counter(b)
    bins, rest_a, rest_b = [], 0, 0
    for c in set(ca) | set(cb):
        if ca[c] + cb[c] >= 10:
            bins.append((ca[c], cb[c]))
        else:
            rest_a += ca[c]
            rest_b += cb[c]
    if rest_a + rest_b:
        bins.append((rest_a, rest_b))
    na, nb = len(a), len(b)
    stat = 0.0
    for x, y in bins:
        ea, eb = (x + y) * na / (na + nb), (x + y) * nb / (na + nb)
        stat += (x - ea) ** 2 / ea + (y - eb) ** 2 / eb
    return stat, len(bins) - 1


def chi2_sf(stat: float, df: int) -> float:
    """Survival function of chi-square(df) (Wilson-Hilferty approximation)."""
    if df <= 0:
        return 1.0
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


def two_sample_p(a: list, b: list) -> float:
    """p-value of ``two_sample_chi2``."""
    return chi2_sf(*two_sample_chi2(a, b))
