"""Conditionally deep and wide KAHMs (docs/algorithm.md#deep-kahm, docs/algorithm.md#wide-kahm).

Oracles: docs/oracles.md#oracle-single-layer, docs/oracles.md#oracle-layers-in-hull,
docs/oracles.md#oracle-layer-dimensions, docs/oracles.md#oracle-wide-min,
docs/oracles.md#oracle-kmeans-partition.
"""

from __future__ import annotations

import pickle
from itertools import pairwise

import numpy as np
import pytest

import kahm_dask.partition as partition_module
from benchmarks.naive import affine_residual
from kahm_dask import KAHM, DeepKAHM, WideKAHM
from kahm_dask.deep import layer_dimensions
from kahm_dask.partition import check_partition, kmeans_partition, n_branches


def _data(seed: int, N: int = 150, p: int = 8) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(N, p)) @ (np.eye(p) + 0.4 * rng.normal(size=(p, p))) + 1.0


def _blobs(seed: int, sizes=(200, 200, 200), p: int = 6, gap: float = 12.0):
    rng = np.random.default_rng(seed)
    centres = gap * rng.normal(size=(len(sizes), p))
    Y = np.vstack([c + rng.normal(size=(k, p)) for c, k in zip(centres, sizes, strict=True)])
    return Y, centres


def _queries(Y: np.ndarray, rng: np.random.Generator, m_near=60, m_mid=30, m_far=30):
    N, p = Y.shape
    sd = Y.std()
    return np.vstack(
        [
            Y[rng.integers(0, N, m_near)] + 0.3 * sd * rng.normal(size=(m_near, p)),
            Y.mean(0) + 2 * sd * rng.normal(size=(m_mid, p)),
            Y.mean(0) + 50 * sd * rng.normal(size=(m_far, p)),
        ]
    )


# ----------------------------------------------- docs/oracles.md#oracle-single-layer
def test_oracle15_single_layer_is_kahm():
    """docs/oracles.md#oracle-single-layer: L = 1 gives D_{Y,n,1} = A_{Y,n} exactly (images and
    distances)."""
    Y = _data(0)
    Yq = _queries(Y, np.random.default_rng(15))
    deep = DeepKAHM(5, 1).fit(Y)
    flat = KAHM(5).fit(Y)
    img, gam, idx = deep.transform_with_distance(Yq)
    img_a, gam_a = flat.transform_with_distance(Yq)
    np.testing.assert_array_equal(img, img_a)
    np.testing.assert_array_equal(gam, gam_a)
    np.testing.assert_array_equal(idx, 0)


def test_distance_only_path_equals_the_distances_with_images():
    """``distance`` (and the pipeline's per-cluster blocks) skip the images; the distances
    must be bit-identical to those of ``transform_with_distance``, beyond one query block."""
    Y = _data(2)
    rng = np.random.default_rng(16)
    Yq = np.concatenate([_queries(Y, rng) for _ in range(6)])
    for model in (DeepKAHM(5, 3).fit(Y), WideKAHM(5, 2, block_size=60, random_state=0).fit(Y)):
        np.testing.assert_array_equal(model.distance(Yq), model.transform_with_distance(Yq)[1])


def test_oracle15_depth_monotone_and_nested_composition():
    """docs/oracles.md#oracle-single-layer: Γ_{D_{Y,n,L}} is non-increasing in L and ≤
    Γ_{A_{Y,n}}. The deep output is the nested composition M_l = A_{Y,n−l+1}(M_{l−1}) (eq. 51) of
    independently fitted KAHMs, the selected layer is the argmin of ‖y − M_l(y)‖ (lowest index on
    ties) and the image is that layer's output."""
    Y = _data(1)
    n, L = 5, 5
    Yq = _queries(Y, np.random.default_rng(151))
    scale = np.abs(Y).max()
    gammas = [DeepKAHM(n, l).fit(Y).distance(Yq) for l in range(1, L + 1)]
    for prev, cur in pairwise(gammas):
        assert np.all(cur <= prev)
    assert np.all(gammas[-1] <= KAHM(n).fit(Y).distance(Yq))

    # nested composition with separately fitted KAHMs of dimensions n, n-1, ..., n-L+1
    outs, x = [], Yq
    for l in range(1, L + 1):
        x = KAHM(n - l + 1).fit(Y).transform(x)
        outs.append(x)
    dists = np.stack([np.linalg.norm(Yq - M, axis=1) for M in outs], axis=1)
    img, gam, idx = DeepKAHM(n, L).fit(Y).transform_with_distance(Yq)
    np.testing.assert_allclose(gam, dists.min(axis=1), rtol=1e-12)
    # the selected index minimises the distance (lowest index among exact ties)
    np.testing.assert_array_equal(idx, np.argmin(dists, axis=1))
    chosen = np.stack([outs[l][i] for i, l in enumerate(idx)])
    np.testing.assert_allclose(img, chosen, rtol=0, atol=1e-12 * scale)
    # the composition is not the same as applying every layer to y directly
    direct = KAHM(n - 1).fit(Y).transform(Yq)
    assert np.abs(direct - outs[1]).max() > 1e-6 * scale


# --------------------------------------------- docs/oracles.md#oracle-layers-in-hull
@pytest.mark.parametrize("seed", [0, 1])
def test_oracle16_every_layer_in_affine_hull(seed):
    """docs/oracles.md#oracle-layers-in-hull: with N < p (N = 8, p = 30), every layer output M_l
    lies in aff(Y): least-squares residual ≤ 1e-9·scale."""
    rng = np.random.default_rng(160 + seed)
    Y = rng.normal(size=(8, 30)) + 0.5
    deep = DeepKAHM(5, 4).fit(Y)
    assert len(deep.layers_) == 4
    Yq = np.vstack([Y + 0.3 * rng.normal(size=Y.shape), 5 * rng.normal(size=(30, 30))])
    scale = np.abs(Y).max()
    assert affine_residual(Yq, Y).min() > 1e-2 * scale
    x = Yq
    for layer in deep.layers_:
        x = layer.transform(x)
        assert affine_residual(x, Y).max() <= 1e-9 * scale
    assert affine_residual(deep.transform(Yq), Y).max() <= 1e-9 * scale


# --------------------------------------------------------------------------- layers
def test_layer_dimensions_rule():
    """docs/oracles.md#oracle-layer-dimensions (docs/decisions.md#decision-layer-dimensions):
    layer l has dimension max(n − l + 1, 1), also for L > n."""
    assert layer_dimensions(5, 3) == [5, 4, 3]
    assert layer_dimensions(3, 5) == [3, 2, 1, 1, 1]
    assert layer_dimensions(2, 5) == [2, 1, 1, 1, 1]
    assert layer_dimensions(1, 1) == [1]


def test_layers_with_equal_dimension_share_one_kahm():
    """Layers whose effective dimension coincides share one fitted KAHM object (L > n, and
    dimensions capped by the data)."""
    Y = _data(2)
    deep = DeepKAHM(3, 5).fit(Y)
    assert deep.layer_dims_ == [3, 2, 1, 1, 1]
    assert deep.layers_[2] is deep.layers_[3] is deep.layers_[4]
    assert len({id(layer) for layer in deep.layers_}) == 3
    # rank-2 data: requested [4, 3, 2, 1] → capped [2, 2, 2, 1]
    rng = np.random.default_rng(3)
    Y2 = rng.normal(size=(60, 2)) @ rng.normal(size=(2, 6)) + 1.0
    deep2 = DeepKAHM(4, 4).fit(Y2)
    assert deep2.layer_dims_ == [2, 2, 2, 1]
    assert deep2.layers_[0] is deep2.layers_[1] is deep2.layers_[2]
    assert deep2.layers_[3] is not deep2.layers_[0]
    # with shared layers and L > n the output still is the min over layers
    img, gam, idx = deep.transform_with_distance(_queries(Y, np.random.default_rng(4)))
    assert np.all(idx < 5)


# --------------------------------------------------- docs/oracles.md#oracle-wide-min
def test_oracle17_single_branch_equals_deep():
    """docs/oracles.md#oracle-wide-min: S = 1 gives W_{Y,n,L,1} = D_{Y,n,L}."""
    Y = _data(5)
    Yq = _queries(Y, np.random.default_rng(17))
    wide = WideKAHM(4, 3, block_size=1000, random_state=0).fit(Y)
    assert wide.n_branches_ == 1
    np.testing.assert_array_equal(wide.branch_sizes_, [len(Y)])
    deep = DeepKAHM(4, 3).fit(Y)
    img_w, gam_w, idx_w = wide.transform_with_distance(Yq)
    img_d, gam_d, _ = deep.transform_with_distance(Yq)
    np.testing.assert_array_equal(idx_w, 0)
    np.testing.assert_allclose(gam_w, gam_d, rtol=1e-12)
    np.testing.assert_allclose(img_w, img_d, rtol=0, atol=1e-12 * np.abs(Y).max())


@pytest.fixture(scope="module")
def wide3():
    Y, centres = _blobs(0)
    wide = WideKAHM(4, 2, block_size=200, random_state=0).fit(Y)
    return Y, centres, wide


def test_oracle17_min_over_branches(wide3):
    """docs/oracles.md#oracle-wide-min (S > 1): Γ_W = min_s Γ_{D_s}; the selected branch is the
    argmin; the returned image equals that branch's image (recomputed on the sub-batch it won) to
    1e-12·max|Y|; Theorem 5: Γ_W(y)/‖[y − y^i]_i‖_F < min_s(1 + p N_s²/(2‖Y_s‖_F²))."""
    Y, centres, wide = wide3
    N, p = Y.shape
    assert wide.n_branches_ == 3
    rng = np.random.default_rng(171)
    Yq = np.vstack([_queries(Y, rng), centres + rng.normal(size=centres.shape)])
    img, gam, idx = wide.transform_with_distance(Yq)
    per_branch = np.stack([b.distance(Yq) for b in wide.branches_], axis=1)
    np.testing.assert_allclose(gam, per_branch.min(axis=1), rtol=1e-12)
    np.testing.assert_array_equal(idx, np.argmin(per_branch, axis=1))
    assert len(np.unique(idx)) == 3  # every branch wins somewhere
    scale = np.abs(Y).max()
    for s, branch in enumerate(wide.branches_):
        rows = idx == s
        np.testing.assert_allclose(img[rows], branch.transform(Yq[rows]), rtol=0, atol=1e-12 * scale)
    np.testing.assert_allclose(gam, np.linalg.norm(Yq - img, axis=1), rtol=1e-12)
    # Theorem 5 with the Frobenius norm over all N training rows
    labels = wide.partition(Y)  # the same seeded k-means labels the fit used
    np.testing.assert_array_equal(np.bincount(labels), wide.branch_sizes_)
    for s, branch in enumerate(wide.branches_):
        np.testing.assert_allclose(branch.layers_[0].mean_, Y[labels == s].mean(axis=0), rtol=1e-12)
    bound = min(
        1 + p * np.count_nonzero(labels == s) ** 2 / (2 * np.sum(Y[labels == s] ** 2))
        for s in range(wide.n_branches_)
    )
    fro = np.array([np.linalg.norm(y - Y) for y in Yq])
    assert np.all(gam / fro < bound)


def test_oracle17_ties_pick_lowest_branch():
    """docs/oracles.md#oracle-wide-min / docs/decisions.md#decision-ties: two identical branches
    tie exactly; the lowest index wins."""
    rng = np.random.default_rng(172)
    A = rng.normal(size=(40, 5)) + 1.0
    Y = np.vstack([A, A])
    part = np.repeat([0, 1], 40)
    wide = WideKAHM(3, 2).fit(Y, partition=part)
    Yq = _queries(A, rng)
    img, gam, idx = wide.transform_with_distance(Yq)
    np.testing.assert_array_equal(wide.branches_[0].distance(Yq), wide.branches_[1].distance(Yq))
    np.testing.assert_array_equal(idx, 0)
    np.testing.assert_array_equal(gam, wide.branches_[0].distance(Yq))


# ------------------------------------------- docs/oracles.md#oracle-kmeans-partition
@pytest.mark.parametrize("S,min_size", [(3, 30), (3, 150), (5, 20)])
def test_oracle18_kmeans_partition(S, min_size):
    """docs/oracles.md#oracle-kmeans-partition: every cluster has ≥ min_cluster_size rows; the
    clusters cover all rows and are disjoint (each row carries exactly one label in 0..S'−1, every
    label used)."""
    Y, _ = _blobs(1, sizes=(200, 200, 200))
    labels = kmeans_partition(Y, S, min_cluster_size=min_size, random_state=0)
    assert labels.shape == (len(Y),)
    assert labels.dtype.kind in "iu"
    ids = np.unique(labels)
    np.testing.assert_array_equal(ids, np.arange(len(ids)))
    counts = np.bincount(labels)
    assert counts.sum() == len(Y)
    assert len(ids) == 1 or counts.min() >= min_size
    members = [set(np.flatnonzero(labels == k)) for k in ids]
    assert set().union(*members) == set(range(len(Y)))
    assert sum(len(m) for m in members) == len(Y)


def test_oracle18_s_lowering_loop(monkeypatch):
    """docs/oracles.md#oracle-kmeans-partition (the retry of docs/algorithm.md#kmeans-partition):
    while some cluster is smaller than min_cluster_size, S ← S − 1 and re-cluster. Blobs of 200,
    200, 50 rows with min_cluster_size 100: S = 3 is tried and rejected, S = 2 accepted."""
    Y, _ = _blobs(2, sizes=(200, 200, 50))
    tried = []
    Real = partition_module.KMeans

    def spy(n_clusters, **kw):
        tried.append(n_clusters)
        return Real(n_clusters, **kw)

    monkeypatch.setattr(partition_module, "KMeans", spy)
    labels = kmeans_partition(Y, 3, min_cluster_size=100, random_state=0)
    assert tried == [3, 2]
    assert np.bincount(labels).min() >= 100 and labels.max() == 1
    tried.clear()
    assert np.bincount(kmeans_partition(Y, 3, min_cluster_size=30, random_state=0)).min() >= 30
    assert tried == [3]
    # through WideKAHM: N = 450, block 150 → S = 3, lowered to 2
    tried.clear()
    wide = WideKAHM(3, 1, block_size=150, random_state=0, min_cluster_size=100).fit(Y)
    assert tried == [3, 2]
    assert wide.n_branches_ == 2
    assert wide.branch_sizes_.min() >= 100 and wide.branch_sizes_.sum() == len(Y)
    # no S > 1 satisfies the size: falls back to one branch
    tried.clear()
    assert np.all(kmeans_partition(Y, 3, min_cluster_size=400, random_state=0) == 0)
    assert tried == [3, 2]


@pytest.mark.parametrize(
    "N,block,rule,expected",
    [
        (1500, 1000, "round", 2),
        (1499, 1000, "round", 1),
        (400, 1000, "round", 1),
        (2500, 1000, "round", 3),  # half up, not banker's rounding
        (0, 1000, "round", 1),
        (1001, 1000, "ceil", 2),
        (1000, 1000, "ceil", 1),
        (400, 1000, "ceil", 1),
        (450, 150, "round", 3),
    ],
)
def test_n_branches_rules(N, block, rule, expected):
    """docs/decisions.md#decision-s-rule: S = max(1, round_half_up(N/N_b)) or ⌈N/N_b⌉."""
    assert n_branches(N, block, rule) == expected


def test_n_branches_bad_rule():
    """An unknown S rule raises ValueError."""
    with pytest.raises(ValueError, match="s_rule"):
        n_branches(100, 10, "floor")


# --------------------------------------------------------------------------- given partition
def test_wide_uses_given_partition():
    """WideKAHM.fit(partition=...) uses the given labels (any integer ids, sorted)."""
    Y, _ = _blobs(3, sizes=(50, 70, 40))
    part = np.repeat([7, 3, 9], [50, 70, 40])
    wide = WideKAHM(3, 2, block_size=10, random_state=0).fit(Y, partition=part)
    assert wide.n_branches_ == 3
    np.testing.assert_array_equal(wide.branch_sizes_, [70, 50, 40])  # ids 3, 7, 9
    for branch, pid in zip(wide.branches_, (3, 7, 9), strict=True):
        np.testing.assert_allclose(branch.layers_[0].mean_, Y[part == pid].mean(axis=0), rtol=1e-14)
        assert branch.layers_[0].n_samples_fit_ == np.count_nonzero(part == pid)


def test_wide_partition_errors():
    """A 1-row branch, a wrong length or non-integer labels raise."""
    Y = _data(4, N=30)
    part = np.zeros(30, dtype=int)
    part[5] = 1
    with pytest.raises(ValueError, match=r"branch\(es\) \[1\] have fewer than 2 rows"):
        WideKAHM(2, 1).fit(Y, partition=part)
    with pytest.raises(ValueError, match="partition must have shape"):
        WideKAHM(2, 1).fit(Y, partition=np.zeros(29, dtype=int))
    with pytest.raises(TypeError, match="integer"):
        WideKAHM(2, 1).fit(Y, partition=np.zeros(30))
    labels, ids = check_partition(np.repeat([4, 2], 15), 30)
    np.testing.assert_array_equal(ids, [2, 4])


# --------------------------------------------------------------------------- determinism
def test_wide_determinism_and_pickle(wide3):
    """Same random_state → identical branch sizes and distances; a pickle round trip gives
    identical distances."""
    Y, _, wide = wide3
    again = WideKAHM(4, 2, block_size=200, random_state=0).fit(Y)
    np.testing.assert_array_equal(again.branch_sizes_, wide.branch_sizes_)
    Yq = _queries(Y, np.random.default_rng(5))
    d = wide.distance(Yq)
    np.testing.assert_array_equal(again.distance(Yq), d)
    clone = pickle.loads(pickle.dumps(wide))
    np.testing.assert_array_equal(clone.distance(Yq), d)
    np.testing.assert_array_equal(clone.transform(Yq), wide.transform(Yq))


def test_wide_validation():
    """Wide/deep input checks: 1 row, 1-D input, NaN, bad parameters, feature count."""
    Y = _data(6, N=40)
    with pytest.raises(ValueError, match="at least 2"):
        WideKAHM(2, 1).fit(Y[:1])
    with pytest.raises(ValueError, match="2-D array"):
        DeepKAHM(2, 1).fit(Y[0])
    bad = Y.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        WideKAHM(2, 1).fit(bad)
    with pytest.raises(ValueError, match="n_layers"):
        DeepKAHM(2, 0).fit(Y)
    with pytest.raises(TypeError, match="block_size"):
        WideKAHM(2, 1, block_size=2.5).fit(Y)
    model = DeepKAHM(2, 2).fit(Y)
    with pytest.raises(ValueError, match="features"):
        model.transform(np.zeros((3, 5)))
