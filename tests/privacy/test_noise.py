"""Optimal (epsilon, delta) noise (ALGORITHM.md §9): oracles 22-24 and the API of Algorithm 1."""

import numpy as np
import pytest
from scipy import integrate, stats

from kahm_dask._random import child_seed_sequence
from kahm_dask.privacy.noise import (
    add_blocked_optimal_noise,
    add_optimal_noise,
    blocked_optimal_noise,
    optimal_noise_cdf,
    optimal_noise_inverse_cdf,
    optimal_noise_pdf,
    sample_optimal_noise,
)

PARAMS = [(1.0, 0.01, 1.0), (0.5, 1e-5, 2.0), (5.0, 0.3, 0.1)]  # (epsilon, delta, d)


# ---------------------------------------------------------------------------------------------
# pdf / cdf / inverse cdf
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("epsilon, delta, d", PARAMS)
def test_oracle22_inverse_cdf(epsilon, delta, d):
    lo, hi = 0.5 * (1 - delta), 0.5 * (1 + delta)
    t = np.concatenate(
        [
            np.linspace(1e-12, 1 - 1e-12, 200_001),
            np.geomspace(1e-300, 1e-3, 1000),
            1 - np.geomspace(1e-16, 1e-3, 1000),
            lo + np.linspace(-1e-9, 1e-9, 101),
            hi + np.linspace(-1e-9, 1e-9, 101),
            [lo, hi],
        ]
    )
    t = np.sort(t)
    v = optimal_noise_inverse_cdf(t, epsilon, delta, d)
    assert np.all(np.diff(v) >= 0)  # non-decreasing
    inside = (t >= lo) & (t <= hi)
    assert np.all(v[inside] == 0.0)
    assert np.all(v[t < lo] < 0) and np.all(v[t > hi] > 0)
    # F(F^{-1}(t)) = t outside the atom; relative error in the tail probability min(t, 1 - t).
    tail = np.minimum(t, 1 - t)[~inside]
    err = np.abs(optimal_noise_cdf(v[~inside], epsilon, delta, d) - t[~inside])
    assert np.all(err <= 1e-12 * tail + 1e-16)


@pytest.mark.parametrize("epsilon, delta, d", PARAMS)
def test_cdf_jump_and_limits(epsilon, delta, d):
    assert optimal_noise_cdf(0.0, epsilon, delta, d) == pytest.approx((1 + delta) / 2, rel=1e-15)
    assert optimal_noise_cdf(-1e-300, epsilon, delta, d) == pytest.approx(
        (1 - delta) / 2, rel=1e-15
    )
    assert optimal_noise_cdf(-np.inf, epsilon, delta, d) == 0.0
    assert optimal_noise_cdf(np.inf, epsilon, delta, d) == 1.0
    v = np.linspace(-20 * d / epsilon, 20 * d / epsilon, 4001)
    assert np.all(np.diff(optimal_noise_cdf(v, epsilon, delta, d)) >= 0)
    assert optimal_noise_cdf(v.reshape(1, -1), epsilon, delta, d).shape == (1, v.size)


@pytest.mark.parametrize("epsilon, delta, d", PARAMS)
def test_pdf_is_the_continuous_part(epsilon, delta, d):
    assert optimal_noise_pdf(0.0, epsilon, delta, d) == pytest.approx(
        (1 - delta) * epsilon / (2 * d)
    )
    mass = sum(
        integrate.quad(lambda x: optimal_noise_pdf(x, epsilon, delta, d), a, b)[0]
        for a, b in ((-np.inf, 0.0), (0.0, np.inf))
    )
    assert mass == pytest.approx(1 - delta, rel=1e-8)  # the atom delta is not in the density
    v = np.array([-3.0, -0.7, 0.4, 2.5]) * d / epsilon
    h = 1e-6 * d / epsilon
    slope = (
        optimal_noise_cdf(v + h, epsilon, delta, d) - optimal_noise_cdf(v - h, epsilon, delta, d)
    ) / (2 * h)
    np.testing.assert_allclose(slope, optimal_noise_pdf(v, epsilon, delta, d), rtol=1e-6)


@pytest.mark.parametrize("bad_t", [0.0, 1.0, -0.1, 1.5, np.nan])
def test_inverse_cdf_rejects_t_outside_open_unit_interval(bad_t):
    with pytest.raises(ValueError, match="t must lie strictly between 0 and 1"):
        optimal_noise_inverse_cdf(np.array([0.3, bad_t]), 1.0, 0.01, 1.0)


# ---------------------------------------------------------------------------------------------
# Sampling statistics (oracles 23, 24)
# ---------------------------------------------------------------------------------------------


def test_oracle23_sample_statistics():
    epsilon, delta, d, n = 1.0, 0.01, 1.0, 2_000_000
    v = sample_optimal_noise(n, epsilon, delta, d, random_state=20230)
    scale = d / epsilon
    # atom at 0: binomial 5-sigma band
    n_zero = np.count_nonzero(v == 0.0)
    assert abs(n_zero / n - delta) <= 5 * np.sqrt(delta * (1 - delta) / n)
    # E|v| = (1 - delta) d / eps, Var|v| = 2 (1 - delta) s^2 - (1 - delta)^2 s^2
    var_abs = (2 * (1 - delta) - (1 - delta) ** 2) * scale**2
    assert abs(np.abs(v).mean() - (1 - delta) * scale) <= 5 * np.sqrt(var_abs / n)
    # mean 0, Var v = 2 (1 - delta) s^2
    assert abs(v.mean()) <= 5 * np.sqrt(2 * (1 - delta) * scale**2 / n)
    # symmetry: signs are fair coins and both tails have the same magnitude law
    nonzero = v[v != 0.0]
    n_pos = np.count_nonzero(nonzero > 0)
    assert abs(n_pos - nonzero.size / 2) <= 5 * np.sqrt(nonzero.size / 4)
    assert stats.ks_2samp(nonzero[nonzero > 0], -nonzero[nonzero < 0]).pvalue > 1e-3
    # v | v != 0 is Laplace(0, d / eps)
    assert stats.kstest(nonzero, "laplace", args=(0.0, scale)).pvalue > 1e-3


@pytest.mark.parametrize("epsilon, delta, d", [(1.0, 0.01, 1.0), (0.5, 0.05, 2.0)])
def test_oracle24_empirical_dp_on_one_entry(epsilon, delta, d):
    """P[Y+V in O] <= e^eps P[Y'+V in O] + delta for |Y - Y'| = d, on all intervals O of a grid."""
    n = 1_000_000
    y, y_adj = 0.0, d
    sample = y + sample_optimal_noise(n, epsilon, delta, d, random_state=1)
    sample_adj = y_adj + sample_optimal_noise(n, epsilon, delta, d, random_state=2)
    eta = 1e-9 * d  # half-width of the intervals around the atoms at Y and Y'
    grid = np.array([-6, -4, -3, -2, -1.5, -1, -0.5, 0.5, 1.5, 2, 2.5, 3, 4, 6, 8]) * d
    atoms = np.array([-eta, eta, d - eta, d + eta])
    edges = np.sort(np.concatenate([[-np.inf, np.inf], grid, atoms]))
    # empirical probabilities of every interval [e_i, e_j), i < j, from cumulative counts
    cum = np.searchsorted(np.sort(sample), edges, side="left") / n
    cum_adj = np.searchsorted(np.sort(sample_adj), edges, side="left") / n
    i, j = np.triu_indices(edges.size, k=1)
    p, q = cum[j] - cum[i], cum_adj[j] - cum_adj[i]
    e = np.exp(epsilon)
    for a, b in ((p, q), (q, p)):  # both directions of adjacency
        se = np.sqrt((a * (1 - a) + e**2 * b * (1 - b)) / n + 1.0 / n**2)
        assert np.all(a - e * b - delta <= 5 * se)
    # The check has power: the atom interval around Y needs the delta slack (pure eps-DP fails),
    # and the half-line (-inf, 0) is tight for the Laplace part (ratio e^eps).
    (atom,) = np.flatnonzero((edges[i] == -eta) & (edges[j] == eta))
    assert p[atom] - e * q[atom] > delta - 5 * np.sqrt(delta / n)
    (half_line,) = np.flatnonzero((edges[i] == -np.inf) & (edges[j] == -eta))
    assert p[half_line] / q[half_line] == pytest.approx(e, rel=0.02)


# ---------------------------------------------------------------------------------------------
# Algorithm 1 API
# ---------------------------------------------------------------------------------------------


def test_add_optimal_noise_shape_dtype_and_no_in_place_change():
    Y = np.arange(12, dtype=np.float64).reshape(4, 3)
    Y_copy = Y.copy()
    out = add_optimal_noise(Y, epsilon=1.0, delta=0.01, d=1.0, random_state=0)
    assert out.shape == Y.shape and out.dtype == np.float64 and out is not Y
    np.testing.assert_array_equal(Y, Y_copy)
    assert add_optimal_noise(Y.astype(np.int64), 1.0, random_state=0).dtype == np.float64
    assert add_optimal_noise(np.zeros((0, 3)), 1.0, random_state=0).shape == (0, 3)


def test_add_optimal_noise_is_y_plus_sampled_noise():
    Y = np.zeros((50, 4))
    out = add_optimal_noise(Y, 2.0, 0.01, 0.5, random_state=3)
    np.testing.assert_array_equal(
        out, sample_optimal_noise((50, 4), 2.0, 0.01, 0.5, random_state=3)
    )


def test_add_optimal_noise_reproducible_and_seed_dependent():
    Y = np.random.default_rng(0).normal(size=(100, 5))
    a = add_optimal_noise(Y, 1.0, random_state=7)
    np.testing.assert_array_equal(a, add_optimal_noise(Y, 1.0, random_state=7))
    np.testing.assert_array_equal(
        a, add_optimal_noise(Y, 1.0, random_state=np.random.SeedSequence(7))
    )
    np.testing.assert_array_equal(
        a, add_optimal_noise(Y, 1.0, random_state=np.random.default_rng(7))
    )
    assert not np.array_equal(a, add_optimal_noise(Y, 1.0, random_state=8))


def test_sample_redraws_exact_zero_uniforms():
    class ZeroFirst(np.random.Generator):
        """A Generator whose first `random` call returns exact zeros at two positions."""

        def __init__(self):
            super().__init__(np.random.PCG64(0))
            self.calls = 0

        def random(self, size=None, *args, **kwargs):
            out = super().random(size, *args, **kwargs)
            self.calls += 1
            if self.calls == 1:
                out.flat[[1, 4]] = 0.0
            return out

    rng = ZeroFirst()
    v = sample_optimal_noise((2, 3), 1.0, 0.01, 1.0, random_state=rng)
    assert np.isfinite(v).all() and rng.calls == 2


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"epsilon": 0.0}, "epsilon"),
        ({"epsilon": -1.0}, "epsilon"),
        ({"epsilon": np.inf}, "epsilon"),
        ({"epsilon": np.nan}, "epsilon"),
        ({"delta": 0.0}, "delta"),
        ({"delta": 1.0}, "delta"),
        ({"delta": -0.1}, "delta"),
        ({"d": 0.0}, "d must"),
        ({"d": -2.0}, "d must"),
        ({"d": np.inf}, "d must"),
    ],
)
def test_parameter_checks(kwargs, match):
    args = {"epsilon": 1.0, "delta": 1e-5, "d": 1.0} | kwargs
    Y = np.zeros((3, 2))
    with pytest.raises(ValueError, match=match):
        add_optimal_noise(Y, **args, random_state=0)
    with pytest.raises(ValueError, match=match):
        add_blocked_optimal_noise(Y, **args, seed=np.random.SeedSequence(0))
    with pytest.raises(ValueError, match=match):
        optimal_noise_cdf(0.0, **args)


def test_parameter_type_checks():
    with pytest.raises(TypeError, match="epsilon"):
        add_optimal_noise(np.zeros((3, 2)), "1")
    with pytest.raises(TypeError, match="seed"):
        add_blocked_optimal_noise(np.zeros((3, 2)), 1.0, 0.01, 1.0, seed=None)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_data_rejected(bad):
    Y = np.zeros((3, 2))
    Y[1, 1] = bad
    with pytest.raises(ValueError, match="Y"):
        add_optimal_noise(Y, 1.0, random_state=0)
    with pytest.raises(ValueError, match="Y"):
        add_blocked_optimal_noise(Y, 1.0, 0.01, 1.0, seed=np.random.SeedSequence(0))


# ---------------------------------------------------------------------------------------------
# Blocked, chunk-invariant noise
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "block_rows, cuts",
    [
        (1024, [0, 1, 777, 1024, 2048, 3000, 5001, 9999, 10_000]),
        (4096, [0, 4095, 4097, 8192, 8193, 10_000]),
        (7, [0, 3, 10, 9996, 10_000]),
    ],
)
def test_blocked_noise_is_chunk_invariant_bit_for_bit(block_rows, cuts):
    Y = np.random.default_rng(5).normal(size=(10_000, 3))
    Y_copy = Y.copy()
    seed = np.random.SeedSequence(2024)
    whole = add_blocked_optimal_noise(Y, 1.0, 0.01, 1.0, seed, block_rows=block_rows)
    parts = [
        add_blocked_optimal_noise(Y[a:b], 1.0, 0.01, 1.0, seed, row_offset=a, block_rows=block_rows)
        for a, b in zip(cuts[:-1], cuts[1:])
    ]
    assert np.concatenate(parts).tobytes() == whole.tobytes()
    np.testing.assert_array_equal(Y, Y_copy)
    single = add_blocked_optimal_noise(
        Y[6543:6544], 1.0, 0.01, 1.0, seed, row_offset=6543, block_rows=block_rows
    )
    assert single.tobytes() == whole[6543:6544].tobytes()


def test_blocked_noise_definition_and_seeds():
    seed = np.random.SeedSequence(77)
    noise = blocked_optimal_noise(300, 2, 1.0, 0.01, 1.0, seed, row_offset=150, block_rows=100)
    for b in (1, 2, 3, 4):  # rows 150..449 touch blocks 1..4
        block = sample_optimal_noise((100, 2), 1.0, 0.01, 1.0, child_seed_sequence(seed, b))
        lo, hi = max(100 * b, 150), min(100 * (b + 1), 450)
        np.testing.assert_array_equal(
            noise[lo - 150 : hi - 150], block[lo - 100 * b : hi - 100 * b]
        )
    np.testing.assert_array_equal(
        noise, blocked_optimal_noise(300, 2, 1.0, 0.01, 1.0, 77, row_offset=150, block_rows=100)
    )
    other = blocked_optimal_noise(
        300, 2, 1.0, 0.01, 1.0, np.random.SeedSequence(78), row_offset=150, block_rows=100
    )
    assert not np.array_equal(noise, other)
    assert not np.array_equal(noise[50:150], noise[150:250])  # blocks differ from each other


def test_blocked_noise_argument_checks():
    seed = np.random.SeedSequence(0)
    with pytest.raises(ValueError, match="row_offset"):
        add_blocked_optimal_noise(np.zeros((2, 2)), 1.0, 0.01, 1.0, seed, row_offset=-1)
    with pytest.raises(ValueError, match="block_rows"):
        add_blocked_optimal_noise(np.zeros((2, 2)), 1.0, 0.01, 1.0, seed, block_rows=0)
