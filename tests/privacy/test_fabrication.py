"""Smoother, DP fabricated data and Remark 4 fabrication (the paper's Definitions 13–14,
docs/algorithm.md#fabrication).

The smoother's oracles (one pass, no NaN, the stopping rule, the error trend, rows near the
data, DP blobs end to end), plus the API of ``fabricate_partitioned``: a given partition, the
``r_source`` options "passes" (the default), "threshold" and "private", ``cluster_on``
"noisy" (the default) and "original", the :class:`FabricationWarning` and the option checks.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.spatial.distance import cdist

import kahm_dask.privacy.fabrication as fab_mod
from kahm_dask import KAHMClassifier
from kahm_dask.kahm import KAHM
from kahm_dask.privacy.fabrication import (
    DEFAULT_PASSES,
    FabricationWarning,
    fabricate,
    fabricate_partitioned,
    fabricate_subset,
    modelling_error,
    smooth,
)
from kahm_dask.privacy.noise import GridLaplace
from kahm_dask.privacy.randomness import InsecureSeededRandom, PrivacyLeakWarning
from tests._kit import three_blobs as _blobs

N_COMP = 5  # n of the smoother oracles


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------


def _low_rank(seed: int = 26, N: int = 300, p: int = 20) -> np.ndarray:
    """Low-rank data: Y = UV + E, U, V ~ U(0, 1), E ~ N(0, 0.05²), columns to [0, 1]."""
    rng = np.random.default_rng(seed)
    Y = rng.uniform(size=(N, 3)) @ rng.uniform(size=(3, p)) + rng.normal(0.0, 0.05, (N, p))
    lo, hi = Y.min(axis=0), Y.max(axis=0)
    return (Y - lo) / (hi - lo)


@pytest.fixture(scope="module")
def low_rank():
    Y = _low_rank()
    return Y, modelling_error(Y, N_COMP)


def _noisy(Y: np.ndarray, eps: float, seed: int = 1) -> np.ndarray:
    """The DP release of Y (features in [0, 1], public bounds (0, 1), d = 1, δ = 0) with the
    reproducible test noise of ``seed`` (not private: fixed data for the oracles)."""
    mech = GridLaplace(eps, np.zeros(Y.shape[1]), np.ones(Y.shape[1]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        return mech.release(Y, InsecureSeededRandom(seed))


# ---------------------------------------------------------------------------------------------
# docs/oracles.md#oracle-smoother-one-pass: M = 1, no NaN
# ---------------------------------------------------------------------------------------------


def test_oracle25_one_pass_returns_noisy_data_unchanged(low_rank):
    Y, _ = low_rank
    Yp = _noisy(Y, 1.0)
    before = Yp.copy()
    out = smooth(Yp, N_COMP, 1)
    np.testing.assert_array_equal(out, Yp)
    assert out is not Yp and not np.shares_memory(out, Yp)  # a copy, input untouched
    out[0, 0] += 1.0
    np.testing.assert_array_equal(Yp, before)


@pytest.mark.parametrize("eps", [0.5, 5.0])
def test_oracle25_iterates_never_nan(low_rank, eps):
    Y, _ = low_rank
    Yp = _noisy(Y, eps)
    Yh, iterates = Yp, [Yp]
    for _ in range(30):  # the smoother by hand: Ŷ_m = A_{Ŷ_{m-1}}(Ŷ_{m-1})
        Yh = KAHM(N_COMP).fit_transform(Yh)
        iterates.append(Yh)
    assert all(np.isfinite(it).all() for it in iterates)
    # smooth(·, M) is Ŷ_{M-1}: check a few against the hand-made iterates
    for M in (2, 4, 11):
        np.testing.assert_allclose(smooth(Yp, N_COMP, M), iterates[M - 1], rtol=0, atol=1e-12)
    f = fabricate(Yp, N_COMP, n_passes=30)
    assert np.isfinite(f.errors).all() and np.isfinite(f.data).all()
    np.testing.assert_allclose(f.data, iterates[30], rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# docs/oracles.md#oracle-stopping-rule: the stopping rule of Definition 14
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [0.5, 1.0, 5.0])
def test_oracle26_stopping_rule(low_rank, eps):
    Y, r = low_rank
    Yp = _noisy(Y, eps)
    f = fabricate(Yp, N_COMP, r)
    M = f.n_passes
    assert M is not None and M >= 1 and len(f.errors) == M
    last = smooth(Yp, N_COMP, M)  # Ŷ_{M̃-1}
    err_last = modelling_error(last, N_COMP)
    assert err_last <= r
    assert err_last == pytest.approx(f.errors[-1], rel=1e-12)
    if M >= 2:
        err_prev = modelling_error(smooth(Yp, N_COMP, M - 1), N_COMP)  # Ŷ_{M̃-2}
        assert err_prev > r  # minimality of M̃
        assert np.all(f.errors[:-1] > r)
    # Ỹ is the KAHM image of Ŷ_{M̃-1} under its own KAHM (eq. 103)
    np.testing.assert_allclose(
        f.data, KAHM(N_COMP).fit_transform(last), rtol=0, atol=1e-12 * np.abs(last).max()
    )


def test_oracle26_error_recorded_per_iterate(low_rank):
    """errors[m-1] is the modelling error of Ŷ_{m-1}, the iterate tested at loop index m."""
    Y, _ = low_rank
    Yp = _noisy(Y, 1.0)
    f = fabricate(Yp, N_COMP, n_passes=4)
    assert f.n_passes == 4 and len(f.errors) == 4
    for m in range(1, 5):
        assert f.errors[m - 1] == pytest.approx(
            modelling_error(smooth(Yp, N_COMP, m), N_COMP), rel=1e-12
        )
    assert f.errors[0] == pytest.approx(modelling_error(Yp, N_COMP), rel=1e-12)


def test_modelling_error_is_sum_of_norms(low_rank):
    Y, r = low_rank
    images = KAHM(N_COMP).fit_transform(Y)
    assert r == pytest.approx(np.linalg.norm(Y - images, axis=1).sum(), rel=1e-12)


# ---------------------------------------------------------------------------------------------
# docs/oracles.md#oracle-smoother-trend: Theorem 6 trend
# ---------------------------------------------------------------------------------------------


def test_oracle27_error_trend(low_rank):
    Y, _ = low_rank
    f = fabricate(_noisy(Y, 0.5), N_COMP, n_passes=26)  # errors of Ŷ_0 .. Ŷ_25
    errors = f.errors
    assert errors.shape == (26,)
    assert errors[25] < 0.05 * errors[0]
    increases = np.flatnonzero(errors[1:] > errors[:-1] * (1 + 1e-9))
    if increases.size:  # Theorem 6 claims only the limit: flag, do not fail
        warnings.warn(
            f"smoother error increased at pass(es) {(increases + 1).tolist()}: "
            f"{errors.round(4).tolist()}",
            UserWarning,
            stacklevel=1,
        )


# ---------------------------------------------------------------------------------------------
# docs/oracles.md#oracle-fabricated-near-data: fabricated data stay near the data
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [0.5, 1.0])
def test_oracle28_fabricated_rows_near_data(low_rank, eps):
    Y, r = low_rank
    Yp = _noisy(Y, eps)
    f = fabricate(Yp, N_COMP, r)
    near_fab = cdist(f.data, Y).min(axis=1).mean()
    near_noisy = cdist(Yp, Y).min(axis=1).mean()
    assert near_fab < near_noisy


# ---------------------------------------------------------------------------------------------
# docs/oracles.md#oracle-dp-end-to-end: end to end on the DP blobs
# ---------------------------------------------------------------------------------------------


def _dp_blobs_accuracies(**kw) -> tuple[list[float], list[KAHMClassifier], set[str]]:
    """Blobs of the three-blob oracle, features to [0, 1] by training min/max (fitted with
    bounds (0, 1)), ε = 1, d = 1, n = 5 (= p), five fits with the test noise seeds 0..4.
    Returns the accuracies, the models and the PrivacyLeakWarnings other than the seed's."""
    Xtr, ytr, Xte, yte, _ = _blobs(19)
    lo, hi = Xtr.min(axis=0), Xtr.max(axis=0)
    Xtr, Xte = (Xtr - lo) / (hi - lo), (Xte - lo) / (hi - lo)
    accuracies, models, leaks = [], [], set()
    for seed in range(5):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("error", FabricationWarning)
            warnings.simplefilter("always", PrivacyLeakWarning)
            clf = KAHMClassifier(
                5, random_state=seed, epsilon=1.0, bounds=(0, 1), insecure_noise_seed=seed, **kw
            ).fit(Xtr, ytr)
        leaks |= {
            str(w.message) for w in caught
            if issubclass(w.category, PrivacyLeakWarning) and "fixed seed" not in str(w.message)
        }
        accuracies.append(clf.score(Xte, yte))
        models.append(clf)
    return accuracies, models, leaks


def test_oracle29_dp_blobs_end_to_end_papers_stopping_rule():
    """The paper's fabrication (private r, k-means on the original rows), passed explicitly:
    both leak beyond the noise and warn.

    The accuracy of one fabricated classifier depends on the noise draw: with 200 rows per
    class the noise shifts each class mean by ≈ 0.2 in the scaled units, against centre gaps
    of ≈ 0.8, and one draw in a few gives ≈ 0.7. So the oracle is checked on the median over
    five noise seeds (measured 0.977), and the finiteness of every M̃ on each of them.
    """
    accuracies, models, leaks = _dp_blobs_accuracies(dp_data="fabricated", r_source="private", cluster_on="original")
    assert {w.split(":")[0] for w in leaks} == {"r_source='private'", "cluster_on='original'"}
    for clf in models:
        assert set(clf.fabrication_passes_) == {0, 1, 2}
        assert any("r_source='private'" in w for w in clf.privacy_statement_.weakenings)
        for label, passes in clf.fabrication_passes_.items():
            assert len(passes) == clf.n_branches_[label] == 1  # 200 rows: one part
            assert all(m is not None and 1 <= m < clf.max_passes for m in passes), passes
    assert np.median(accuracies) >= 0.95, accuracies


def test_oracle29_dp_blobs_end_to_end_public_passes():
    """The same with a leak-free public stopping rule of 20 passes (the private r stops
    after 26–39 passes here): median measured 0.97."""
    accuracies, models, leaks = _dp_blobs_accuracies(dp_data="fabricated", r_value=20)
    assert leaks == set()
    assert all(clf.privacy_statement_.weakenings[1:] == [] for clf in models)  # the seed only
    assert all(p == [20] for clf in models for p in clf.fabrication_passes_.values())
    assert np.median(accuracies) >= 0.95, accuracies


@pytest.mark.parametrize("kw", [{}, {"dp_data": "fabricated"}], ids=["defaults", "fabricated-default-passes"])
def test_oracle29_dp_blobs_end_to_end_defaults(kw):
    """The leak-free defaults (the noisy rows, k-means on them) and the fabrication's default
    (DEFAULT_PASSES = 8 fixed passes).

    These 5-D blobs at ε = 1 are far noisier than the data the defaults were chosen on (noise
    s.d. 1.4 on a unit range): on these noise seeds the noisy rows give median 0.91 and 8 passes
    0.89 (4 passes: 0.58, 12: 0.95), so the bar is 0.85, not the paper-rule oracle's 0.95 (checked
    above for the paper's rule and for 20 public passes). docs/privacy.md, "Choosing the
    defaults", says when to fabricate and when to raise r_value.
    """
    accuracies, models, leaks = _dp_blobs_accuracies(**kw)
    assert leaks == set()
    if kw:
        assert all(p == [DEFAULT_PASSES] for clf in models for p in clf.fabrication_passes_.values())
    else:
        assert not any(hasattr(clf, "fabrication_passes_") for clf in models)
    assert np.median(accuracies) >= 0.85, accuracies


# ---------------------------------------------------------------------------------------------
# fabricate_partitioned: a given partition
# ---------------------------------------------------------------------------------------------


def _two_part_labels(N: int, seed: int = 5) -> np.ndarray:
    """Interleaved labels 0/1 (not contiguous), ~N/2 each."""
    labels = np.zeros(N, dtype=np.int64)
    labels[np.random.default_rng(seed).permutation(N)[: N // 2]] = 1
    return labels


def test_partitioned_row_i_from_row_i(low_rank):
    Y, _ = low_rank
    Yp = _noisy(Y, 1.0)
    labels = _two_part_labels(len(Y))
    out, got_labels, passes = fabricate_partitioned(
        Y, Yp, N_COMP, partition=labels, r_source="private"
    )
    np.testing.assert_array_equal(got_labels, labels)
    assert len(passes) == 2
    for s in (0, 1):
        rows = labels == s
        ref = fabricate(Yp[rows], N_COMP, modelling_error(Y[rows], N_COMP))
        np.testing.assert_array_equal(out[rows], ref.data)
        assert passes[s] == ref.n_passes


def test_partitioned_permuting_subsets_permutes_result(low_rank):
    Y, _ = low_rank
    Yp = _noisy(Y, 1.0)
    labels = _two_part_labels(len(Y))
    out, _, passes = fabricate_partitioned(Y, Yp, N_COMP, partition=labels, r_source="private")

    # (a) move whole subsets (subset 1 first, then subset 0) and swap their ids; the order
    # within each subset is kept, so the result must be the same rows, exactly
    perm = np.concatenate([np.flatnonzero(labels == 1), np.flatnonzero(labels == 0)])
    out_a, _, passes_a = fabricate_partitioned(
        Y[perm], Yp[perm], N_COMP, partition=1 - labels[perm], r_source="private"
    )
    np.testing.assert_array_equal(out_a, out[perm])
    assert passes_a == passes[::-1]  # passes are listed by sorted subset id

    # (b) an arbitrary row permutation: the KAHM is permutation invariant (tests/core), so the
    # result is permuted alike up to rounding (fixed passes avoid a threshold tie)
    out_f, _, _ = fabricate_partitioned(
        Y, Yp, N_COMP, partition=labels, r_source="passes", r_value=3
    )
    perm = np.random.default_rng(7).permutation(len(Y))
    out_b, _, _ = fabricate_partitioned(
        Y[perm], Yp[perm], N_COMP, partition=labels[perm], r_source="passes", r_value=3
    )
    np.testing.assert_allclose(out_b, out_f[perm], rtol=0, atol=1e-9)


# ---------------------------------------------------------------------------------------------
# r_source and cluster_on
# ---------------------------------------------------------------------------------------------


def test_r_source_threshold_scales_with_subset_size(low_rank):
    Y, _ = low_rank
    Yp = _noisy(Y, 1.0)
    labels = np.repeat([0, 1], [100, 200])
    r_value = 0.2  # public per-row error
    out, _, passes = fabricate_partitioned(
        Y, Yp, N_COMP, partition=labels, r_source="threshold", r_value=r_value
    )
    for s, n_s in ((0, 100), (1, 200)):
        rows = labels == s
        ref = fabricate(Yp[rows], N_COMP, r_value * n_s)  # r_s = r_value · N_s
        np.testing.assert_array_equal(out[rows], ref.data)
        assert passes[s] == ref.n_passes is not None
        assert ref.errors[-1] <= r_value * n_s
        assert np.all(ref.errors[:-1] > r_value * n_s)
    # "threshold" never reads the original rows: any Y gives the same result
    other, _, passes_other = fabricate_partitioned(
        np.zeros_like(Y), Yp, N_COMP, partition=labels, r_source="threshold", r_value=r_value
    )
    np.testing.assert_array_equal(other, out)
    assert passes_other == passes


@pytest.mark.parametrize("k", [1, 3])
def test_r_source_passes_is_exact(low_rank, k):
    Y, _ = low_rank
    Yp = _noisy(Y, 0.5)
    labels = np.repeat([0, 1], [150, 150])
    out, _, passes = fabricate_partitioned(
        Y, Yp, N_COMP, partition=labels, r_source="passes", r_value=k
    )
    assert passes == [k, k]
    for s in (0, 1):
        rows = labels == s
        # k passes: Ỹ = Ŷ_k = T_{n,k+1}(Y⁺), whatever the error
        np.testing.assert_allclose(out[rows], smooth(Yp[rows], N_COMP, k + 1), rtol=0, atol=1e-12)
    res = fabricate_subset(None, Yp, N_COMP, r_source="passes", r_value=k)
    assert res.n_passes == k and len(res.errors) == k


def test_cluster_on_noisy_never_reads_original_rows(low_rank, monkeypatch):
    Y, _ = low_rank
    Yp = _noisy(Y, 1.0)
    seen = []
    real = fab_mod.kmeans_partition

    def spy(data, *args, **kwargs):
        seen.append(np.array(data, copy=True))
        return real(data, *args, **kwargs)

    monkeypatch.setattr(fab_mod, "kmeans_partition", spy)
    kw = dict(block_size=100, random_state=3)  # S = 3 parts of ~100 rows
    out, labels, passes = fabricate_partitioned(
        Y, Yp, N_COMP, cluster_on="noisy", r_source="threshold", r_value=0.2, **kw
    )
    assert len(seen) == 1
    np.testing.assert_array_equal(seen[0], Yp)
    assert not np.any(np.all(np.isclose(seen[0], Y, rtol=0, atol=1e-9), axis=1))
    assert len(np.unique(labels)) > 1 and len(passes) == len(np.unique(labels))
    # pure post-processing: the result does not depend on the original rows at all
    out2, labels2, passes2 = fabricate_partitioned(
        np.zeros_like(Y), Yp, N_COMP, cluster_on="noisy", r_source="threshold", r_value=0.2, **kw
    )
    np.testing.assert_array_equal(out2, out)
    np.testing.assert_array_equal(labels2, labels)
    assert passes2 == passes

    # the default clusters the noisy rows too; the paper's order clusters the original rows
    seen.clear()
    fabricate_partitioned(Y, Yp, N_COMP, **kw)
    np.testing.assert_array_equal(seen[0], Yp)
    seen.clear()
    fabricate_partitioned(Y, Yp, N_COMP, cluster_on="original", **kw)
    np.testing.assert_array_equal(seen[0], Y)


def test_cluster_on_noisy_private_r_uses_matching_original_rows(low_rank):
    """With cluster_on="noisy" and r_source="private", r_s comes from the original rows of
    each noisy cluster (Remark 4 with the partition on the noisy rows)."""
    Y, _ = low_rank
    Yp = _noisy(Y, 1.0)
    out, labels, passes = fabricate_partitioned(
        Y, Yp, N_COMP, cluster_on="noisy", r_source="private", block_size=150, random_state=4
    )
    for i, s in enumerate(np.unique(labels)):
        rows = labels == s
        ref = fabricate(Yp[rows], N_COMP, modelling_error(Y[rows], N_COMP))
        np.testing.assert_array_equal(out[rows], ref.data)
        assert passes[i] == ref.n_passes


# ---------------------------------------------------------------------------------------------
# unreachable r and option checks
# ---------------------------------------------------------------------------------------------


def test_fabrication_warning_when_r_unreachable(low_rank):
    Y, _ = low_rank
    Yp = _noisy(Y, 1.0)
    with pytest.warns(FabricationWarning, match="r = 0"):
        f = fabricate(Yp, N_COMP, 0.0, max_passes=2)
    assert f.n_passes is None and len(f.errors) == 2
    np.testing.assert_allclose(f.data, smooth(Yp, N_COMP, 3), rtol=0, atol=1e-12)  # best effort

    labels = np.repeat([0, 1], [150, 150])
    with pytest.warns(FabricationWarning):
        _, _, passes = fabricate_partitioned(
            Y, Yp, N_COMP, partition=labels, r_source="threshold", r_value=0.0, max_passes=2
        )
    assert passes == [None, None]


def test_classifier_reports_unreached_r():
    Xtr, ytr, _, _, _ = _blobs(30, n_train=60, n_test=1)
    Xtr = (Xtr - Xtr.min(0)) / (Xtr.max(0) - Xtr.min(0))
    clf = KAHMClassifier(
        5, 2, random_state=0, epsilon=1.0, bounds=(0, 1), dp_data="fabricated", r_source="threshold",
        r_value=0.0, max_passes=2,
    )
    with pytest.warns(FabricationWarning):
        clf.fit(Xtr, ytr)
    assert clf.fabrication_passes_ == {0: [None], 1: [None], 2: [None]}


def test_fabricate_argument_checks(low_rank):
    Y, _ = low_rank
    Yp = _noisy(Y, 1.0)
    with pytest.raises(ValueError, match="exactly one of r"):
        fabricate(Yp, N_COMP)
    with pytest.raises(ValueError, match="exactly one of r"):
        fabricate(Yp, N_COMP, 1.0, n_passes=2)
    for bad in (-1.0, np.inf, np.nan):
        with pytest.raises(ValueError, match="r must be"):
            fabricate(Yp, N_COMP, bad)


@pytest.mark.parametrize(
    "kwargs, option",
    [
        (dict(r_source="public"), "r_source"),
        (dict(cluster_on="both"), "cluster_on"),
        (dict(r_source="threshold"), "r_value"),  # r_value missing
        (dict(r_source="threshold", r_value=-0.1), "r_value"),
        (dict(r_source="passes", r_value=0), "r_value"),
    ],
)
def test_invalid_options_raise_value_error(low_rank, kwargs, option):
    Y, _ = low_rank
    Yp = _noisy(Y, 1.0)
    with pytest.raises(ValueError, match=option):
        fabricate_partitioned(Y, Yp, N_COMP, **kwargs)
    Xtr, ytr = Y[:60], np.repeat([0, 1], 30)
    with pytest.raises(ValueError, match=option):  # the classifier checks at fit
        KAHMClassifier(5, 1, epsilon=1.0, bounds=(0, 1), **kwargs).fit(Xtr, ytr)


def test_default_stopping_rule_is_default_passes(low_rank):
    """r_source="passes" (the default) with r_value None: DEFAULT_PASSES passes, whatever the
    original rows (they are not read)."""
    Y, _ = low_rank
    Yp = _noisy(Y, 1.0)
    labels = np.repeat([0, 1], [150, 150])
    out, _, passes = fabricate_partitioned(Y, Yp, N_COMP, partition=labels)
    assert passes == [DEFAULT_PASSES, DEFAULT_PASSES]
    out2, _, _ = fabricate_partitioned(np.zeros_like(Y), Yp, N_COMP, partition=labels)
    np.testing.assert_array_equal(out2, out)
    for s in (0, 1):
        rows = labels == s
        ref = fabricate(Yp[rows], N_COMP, n_passes=DEFAULT_PASSES)
        np.testing.assert_array_equal(out[rows], ref.data)
    assert fabricate_subset(None, Yp, N_COMP).n_passes == DEFAULT_PASSES
