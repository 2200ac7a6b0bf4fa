"""The sequence-agreement p-value answers underflowing tails without scipy, and equals binomtest."""
import random

from scipy.stats import binomtest

from rankscope.analysis.whatif.sequence import _binomial_tail


def test_binomial_tail_equals_binomtest_including_underflow():
    rng = random.Random(7)
    zeros = 0
    for _ in range(3000):
        n = rng.randint(3, 5000)
        p = rng.uniform(1e-4, 0.9)
        k = rng.randint(1, n)
        ours = _binomial_tail(k, n, p)
        assert ours == float(binomtest(k, n, p, alternative="greater").pvalue), (k, n, p)
        zeros += ours == 0.0
    assert zeros > 100  # the shortcut path was exercised


def test_sequence_skewed_reference_tail_is_zero():
    # OSDI'25 SE: 1,711 agreements in 2,752 (rank, step)s at chance 0.0686
    assert _binomial_tail(1711, 2752, 0.06859384374788736) == 0.0
