"""The attacks of issue 11 ("Privacy that holds"), replayed against the DP KAHMClassifier.

Every test runs an attacker's procedure on what a DP fit releases (``dp_data_``, the fitted
models, the privacy statement) on digits, with public bounds: pixel counts 0–16 scaled to
[0, 1] by ``split_and_scale(..., bounds=(0, 16))`` and the estimator fitted with
``bounds=(0, 1)``. Each asserts that the attack now recovers nothing.

Each test also shows that its attack works: it is run as well against the old design,
re-implemented here in a few lines (the old release was ``X + V`` with V continuous Laplace
noise of scale d/ε plus an atom δ = 1e-5, drawn through a float inverse CDF from uniforms of
``numpy.random.Generator.random`` seeded by ``child(SeedSequence(random_state), 0)``, row
block b from ``child(…, 0, b)``), or against the paper's leaking options, and succeeds there.
The mechanism that replaced it is described in docs/privacy.md.
"""

from __future__ import annotations

import pickle
import warnings
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest

from kahm_dask import KAHMClassifier
from kahm_dask._random import as_seed_sequence, child_seed_sequence
from kahm_dask.privacy.bounds import BOUNDS_PRIVATE, BOUNDS_PUBLIC
from kahm_dask.privacy.fabrication import DEFAULT_PASSES, fabricate, modelling_error
from kahm_dask.privacy.ledger import BudgetExceededError, PrivacyLedger
from kahm_dask.privacy.noise import GridLaplace
from kahm_dask.privacy.randomness import InsecureSeededRandom, PrivacyLeakWarning

EPS = 2.0
N_COMP, N_LAYERS = 20, 1  # the release does not depend on the depth: keep the fits fast
P = 64


def _dp(X, y, **kw) -> KAHMClassifier:
    params = dict(
        n_components=N_COMP, n_layers=N_LAYERS, random_state=0, epsilon=EPS, bounds=(0, 1),
        dp_data="noisy",
    ) | kw
    return KAHMClassifier(**params).fit(X, y)


def _released(clf: KAHMClassifier, y: np.ndarray) -> np.ndarray:
    """The released DP rows of a fit, put back in the order of the training rows."""
    out = np.empty((len(y), clf.n_features_in_))
    for label in clf.classes_:
        out[y == label] = clf.dp_data_[label]
    return out


def _mechanism(epsilon: float = EPS, **kw) -> GridLaplace:
    """The mechanism of ``_dp``: bounds (0, 1) on every feature, d = 1."""
    return GridLaplace(epsilon, np.zeros(P), np.ones(P), **kw)


def _seeded(seed: int) -> InsecureSeededRandom:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        return InsecureSeededRandom(seed)


def _exp(x: Fraction) -> Decimal:
    with localcontext() as ctx:
        ctx.prec = 60
        return (Decimal(x.numerator) / Decimal(x.denominator)).exp()


def _frac_le_exp(value: Fraction, x: Fraction) -> bool:
    """``value ≤ exp(x)``, decided with a 60-digit exponential."""
    with localcontext() as ctx:
        ctx.prec = 80
        bound = _exp(x) * (1 - Decimal(10) ** -55)
        return Decimal(value.numerator) / Decimal(value.denominator) <= bound


# ---------------------------------------------------------------------------------------------
# the old design, re-implemented for the positive controls
# ---------------------------------------------------------------------------------------------

OLD_DELTA, OLD_D, OLD_BLOCK_ROWS = 1e-5, 1.0, 4096


def _old_cdf(v, eps):
    tail = 0.5 * (1.0 - OLD_DELTA) * np.exp(-np.abs(v) * (eps / OLD_D))
    return np.where(v < 0.0, tail, 1.0 - tail)


def _old_inverse_cdf(t, eps):
    """The old float inverse CDF of Laplace(d/ε) with an atom δ at 0 (same operations)."""
    scale = OLD_D / eps
    lower, upper = t < 0.5 * (1.0 - OLD_DELTA), t > 0.5 * (1.0 + OLD_DELTA)
    tail = np.where(upper, 1.0 - t, t)
    magnitude = np.maximum(scale * (np.log1p(-OLD_DELTA) - np.log(2.0 * tail)), 0.0)
    return np.where(lower, -magnitude, np.where(upper, magnitude, 0.0))


def _old_noise(shape, eps, seed):
    return _old_inverse_cdf(np.random.default_rng(seed).random(shape), eps)


def _old_blocked_noise(n: int, p: int, eps: float, root: np.random.SeedSequence) -> np.ndarray:
    blocks = [
        _old_noise((OLD_BLOCK_ROWS, p), eps, child_seed_sequence(root, b))
        for b in range(-(-n // OLD_BLOCK_ROWS))
    ]
    return np.concatenate(blocks)[:n]


def _old_release(X: np.ndarray, eps: float, random_state) -> np.ndarray:
    """What the old ``KAHMClassifier(random_state=…, epsilon=eps, dp_data="noisy")`` released."""
    root = as_seed_sequence(random_state)  # a Generator gave its seed sequence, not advanced
    return X + _old_blocked_noise(*X.shape, eps, child_seed_sequence(root, 0))


# ---------------------------------------------------------------------------------------------
# seed brute force
# ---------------------------------------------------------------------------------------------


def _stored_roots(model) -> set[tuple[int, tuple[int, ...]]]:
    """(entropy, spawn key) of every root a seed sequence stored in the released model may
    have been derived from (the sequence itself and each prefix of its spawn key)."""
    roots, seen, stack = set(), set(), [model]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, np.random.SeedSequence):
            key = tuple(obj.spawn_key)
            roots |= {(obj.entropy, key[:i]) for i in range(len(key) + 1)}
        elif isinstance(obj, dict):
            stack += list(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack += list(obj)
        elif hasattr(obj, "__dict__") and not isinstance(obj, np.ndarray):
            stack += list(vars(obj).values())
    return roots


def _candidate_noises(n: int, roots, int_seeds):
    """The noise an attacker regenerates from each candidate seed: ((kind, seed), V (n, P))."""
    step = _mechanism().step
    for entropy, key in sorted(roots, key=repr):
        root = np.random.SeedSequence(entropy, spawn_key=key)
        old_stream = child_seed_sequence(root, 0)
        yield ("old stream", (entropy, key)), _old_blocked_noise(n, P, EPS, old_stream)
        yield ("inverse CDF", (entropy, key)), _old_noise((n, P), EPS, root)
    for s in int_seeds:
        yield ("numpy laplace", s), np.random.default_rng(s).laplace(0.0, OLD_D / EPS, (n, P))
        # the new core's test-only seeded source, as if random_state had seeded it
        yield ("seeded grid noise", s), step * _mechanism().noise_steps(n, _seeded(s))


def _attack(released: np.ndarray, X: np.ndarray, V: np.ndarray) -> tuple[int, float]:
    """(training rows recovered to 1e-9, fraction of candidate rows inside the public range
    [0, 1]^p: what tells an attacker without X that the seed is right)."""
    candidate = released - V
    recovered = int(np.count_nonzero(np.abs(candidate - X).max(axis=1) <= 1e-9))
    plausible = float(np.mean(np.all((candidate >= -1e-9) & (candidate <= 1 + 1e-9), axis=1)))
    return recovered, plausible


def test_seed_brute_force_recovers_nothing(digits):
    """README's KAHMClassifier(random_state=0, epsilon=2.0), noisy rows released and the model
    pickled. The old code fell in one second: the noise was a function of random_state, so
    seeds 0..63 (or the seed streams stored in the model) regenerated V, and dp_data_ − V gave
    all 1,257 training rows back to 4e-16. Now the noise comes from OS entropy."""
    X, y = digits.X_train, digits.y_train
    clf = _dp(X, y)
    released = _released(clf, y)
    old = _old_release(X, EPS, 0)
    shipped = pickle.loads(pickle.dumps(clf))
    stored = _stored_roots(shipped)
    assert len(stored) > 2  # the released model does carry seed streams (for k-means only)
    roots = {(s, ()) for s in range(64)} | stored
    int_seeds = sorted(set(range(64)) | {shipped.random_state})
    results, controls = {}, {}
    for name, V in _candidate_noises(len(X), roots, int_seeds):
        results[name] = _attack(released, X, V)
        controls[name] = _attack(old, X, V)
    # positive control: against the old release the brute force finds seed 0 and every row
    found = [name for name, (rec, plausible) in controls.items() if plausible == 1.0]
    assert found == [("old stream", (0, ()))]
    assert controls[found[0]][0] == len(X)
    # the new release: no candidate gives back a training row, or even looks right
    assert max(rec for rec, _ in results.values()) == 0
    assert max(plausible for _, plausible in results.values()) < 0.01


def test_same_random_state_releases_different_noise(digits):
    """Two fits with the same random_state: the old code released the same noisy rows (so
    the difference of two releases was 0 and one seed served all); now fresh noise."""
    X, y = digits.X_train, digits.y_train
    a, b = _released(_dp(X, y), y), _released(_dp(X, y), y)
    assert np.mean(a != b) > 0.99
    assert np.array_equal(_old_release(X, EPS, 0), _old_release(X, EPS, 0))  # the old way


# ---------------------------------------------------------------------------------------------
# two-ε differencing
# ---------------------------------------------------------------------------------------------


def test_two_epsilon_differencing_recovers_nothing(digits):
    """Fits at ε1 and ε2 with the same random_state. Old: V_i = V / ε_i from the same
    uniforms, so (ε2·Y2 − ε1·Y1)/(ε2 − ε1) = X to 9e-16. Now the two noises are
    independent and the estimate is off by the noise (sd ≈ 2 here)."""
    X, y = digits.X_train, digits.y_train
    e1, e2 = 1.0, 2.0

    def estimate(Y1, Y2):
        return (e2 * Y2 - e1 * Y1) / (e2 - e1)

    old = estimate(_old_release(X, e1, 0), _old_release(X, e2, 0))
    assert np.abs(old - X).max() < 1e-12  # positive control
    Y1 = _released(_dp(X, y, epsilon=e1), y)
    Y2 = _released(_dp(X, y, epsilon=e2), y)
    err = np.abs(estimate(Y1, Y2) - X)
    assert np.median(err) > 0.5  # ≈ 1.1 for the sum of two unit-scale Laplace errors
    assert np.mean(err <= 1e-9) < 1e-3  # exact only where 2·Z2 = Z1 by chance (≈ 2.4e-4)
    assert not np.any(np.all(err <= 1e-9, axis=1))  # no row recovered


# ---------------------------------------------------------------------------------------------
# generator reuse
# ---------------------------------------------------------------------------------------------


def test_generator_reuse_on_neighbouring_data(digits):
    """One np.random.Generator passed to fits on two data sets differing in one entry. Old:
    the generator was not advanced, both fits drew the same noise, and the releases differed
    only at the changed entry, by exactly the change. Now every entry has fresh noise."""
    X, y = digits.X_train, digits.y_train
    X2 = X.copy()
    X2[5, 10] = (np.rint(X[5, 10] * 16) + 8) % 17 / 16  # another grey level
    rng = np.random.default_rng(0)
    old_a, old_b = _old_release(X, EPS, rng), _old_release(X2, EPS, rng)
    assert np.argwhere(old_a != old_b).tolist() == [[5, 10]]  # positive control
    assert old_b[5, 10] - old_a[5, 10] == pytest.approx(X2[5, 10] - X[5, 10], abs=1e-15)
    a = _released(_dp(X, y, random_state=rng), y)
    b = _released(_dp(X2, y, random_state=rng), y)
    differ = a != b
    assert differ.mean() > 0.99
    assert np.count_nonzero(differ[np.arange(len(X)) != 5]) > 0.99 * (len(X) - 1) * P


# ---------------------------------------------------------------------------------------------
# the floating-point attack (Mironov 2012)
# ---------------------------------------------------------------------------------------------


def _old_consistent_levels(released: np.ndarray, eps: float, window: int = 16) -> np.ndarray:
    """Mironov's attack on the old float sampler: is each grey level x' = g/16 consistent
    with the released float y, i.e. is there a uniform t = k·2^-53 of Generator.random with
    fl(x' + F^{-1}(t)) == y? → bool (n, p, 17). k is searched in a window around F(y − x')."""
    levels = np.arange(17) / 16
    k0 = np.rint(_old_cdf(released[..., None] - levels, eps) * 2.0**53)
    k = np.clip(k0[..., None] + np.arange(-window, window + 1), 1, 2.0**53 - 1)
    candidates = levels[:, None] + _old_inverse_cdf(k * 2.0**-53, eps)
    return (candidates == released[..., None, None]).any(axis=-1)


def test_floating_point_attack_recovers_nothing(digits):
    """Old: 27.7 % of the quickstart's entries pinned to one of the 17 grey levels by the bits
    of the float, 97.9 % with at least one level ruled out. Now every released value lies on
    the public grid lower + j·step, and every in-bounds private value can produce it, with
    likelihoods within e^ε of each other (exactly, from the discrete Laplace pmf)."""
    X, y = digits.X_train, digits.y_train
    grey = np.rint(X * 16).astype(np.int64)
    np.testing.assert_array_equal(grey / 16, X)  # every entry is one of the 17 grey levels g/16, exactly

    # positive control on 100 rows of the old release
    old = _old_release(X[:100], EPS, 0)
    ok = _old_consistent_levels(old, EPS)
    assert np.take_along_axis(ok, grey[:100, :, None], axis=-1).all()  # truth never ruled out
    n_consistent = ok.sum(axis=-1)
    assert np.mean(n_consistent == 1) > 0.05  # pinned exactly (measured ≈ 0.2)
    assert np.mean(n_consistent < 17) > 0.9  # some level ruled out (measured ≈ 0.999)

    clf = _dp(X, y)
    mech = _mechanism()
    assert clf.privacy_statement_.mechanism == mech.describe()
    R = _released(clf, y)
    j = np.rint((R - mech.lower) / mech.step).astype(np.int64)
    np.testing.assert_array_equal(mech.lower + j * mech.step, R)  # exactly on the public grid
    q = mech.grid_index(np.repeat(np.arange(17) / 16, P).reshape(17, P))[:, 0]
    np.testing.assert_array_equal(q, 64 * np.arange(17))
    # The same consistency check as above: each level g with noise z = j − q_g reproduces the
    # released float bit for bit, so no level is ruled out.
    for g in range(17):
        np.testing.assert_array_equal(mech.lower + (q[g] + (j - q[g])) * mech.step, R)
    # P(q_g + Z = j) = c·r^|j − q_g| > 0 for every level, and the likelihoods of any two
    # in-bounds private values (grid indices 0..1024) differ by the factor r^-e with
    # e ≤ 1024 (integers, so this is exact), which is ≤ e^ε.
    r = Fraction(mech.ratio)
    c = (1 - r) / (1 + r)
    assert r > 0 and c > 0
    e = np.abs(j[..., None] - q)  # the 17 levels
    assert (e.max(axis=-1) - e.min(axis=-1)).max() <= 1024
    # every in-bounds grid index 0..1024: max and min of |j − q| over q in closed form
    farthest = np.maximum(np.abs(j), np.abs(j - 1024))
    nearest = np.maximum(0, np.maximum(-j, j - 1024))
    assert (farthest - nearest).max() <= 1024
    assert _frac_le_exp(r ** -1024, Fraction(EPS))
    # exact pmf at a few released entries, for all 17 levels
    for i, col in [(0, 0), (3, 17), (100, 33), (1000, 63)]:
        pmf = [c * r ** int(abs(j[i, col] - qg)) for qg in q]
        assert min(pmf) > 0
        assert _frac_le_exp(max(pmf) / min(pmf), Fraction(EPS))


def test_release_float_does_not_depend_on_the_private_float(digits):
    """Two private values in the same grid cell give the same release bit for bit under the
    same noise, so the float carries nothing beyond the noisy grid index. The old release
    X + V moved with every bit of X."""
    X = digits.X_train[:200]
    X2 = np.clip(X + 1e-7, 0, 1)  # a sub-grid change of each entry
    mech = _mechanism()
    assert mech.release(X, _seeded(3)).tobytes() == mech.release(X2, _seeded(3)).tobytes()
    assert np.all(_old_release(X, EPS, 0)[X < 1] != _old_release(X2, EPS, 0)[X < 1])


# ---------------------------------------------------------------------------------------------
# the smoother and the fabrication's partition: neighbouring data sets, same noise
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def three_classes(digits):
    keep = digits.y_train < 3
    X, y = digits.X_train[keep], digits.y_train[keep]
    return X, y, _mechanism().release(X, _seeded(2))  # the one noisy matrix of every fit


@pytest.fixture
def same_noise(monkeypatch, three_classes):
    """Every fit gets the same noisy matrix, whatever data it is given."""
    noisy = three_classes[2]
    monkeypatch.setattr(GridLaplace, "release", lambda self, X, source=None, **kw: noisy.copy())
    return noisy


def _fab(X, y, **kw) -> KAHMClassifier:
    return _dp(X, y, dp_data="fabricated", **kw)


def _model_bytes(clf: KAHMClassifier) -> bytes:
    """The fitted model's pickle, without the id that names each release anew (its ledger entry)."""
    return pickle.dumps({k: v for k, v in vars(clf).items() if k != "release_id_"})


def _released_quantities(clf: KAHMClassifier, probe: np.ndarray):
    return (
        _model_bytes(clf),
        {label: rows.tobytes() for label, rows in clf.dp_data_.items()},
        clf.fabrication_passes_,
        clf.class_distances(probe).tobytes(),
        clf.privacy_statement_.to_dict(),
    )


def _neighbour_moving_private_r(X, y, noisy, n_rows_tried: int = 10):
    """X' one row from X (a row replaced by its complement 1 − x: in bounds) for which the
    paper's private stopping threshold r gives another number of smoother passes M̃ on the
    same noisy rows. Returns (X', label)."""
    for label in np.unique(y):
        rows = np.flatnonzero(y == label)
        r = modelling_error(X[rows], N_COMP)
        errors = fabricate(noisy[rows], N_COMP, r).errors  # errors[-1] ≤ r < errors[-2]
        for i in rows[:n_rows_tried]:
            X2 = X.copy()
            X2[i] = 1.0 - X[i]
            r2 = modelling_error(X2[rows], N_COMP)
            if r2 < errors[-1] or (len(errors) > 1 and r2 >= errors[-2]):
                return X2, label
    pytest.fail("no neighbouring data set moves the private r across a pass: change the noise seed")


def test_smoother_release_identical_on_neighbouring_data(digits, three_classes, same_noise):
    """With the noise fixed, every released quantity of the default fabrication
    (r_source="passes", cluster_on="noisy") is the same for X and for a neighbouring X' (one
    row replaced), and even for an unrelated X'' = 1 − X: it is post-processing of the noisy
    rows only. Old defaults: the passes and the k-means partition followed the private rows."""
    X, y, _ = three_classes
    X2 = X.copy()
    X2[7] = 1.0 - X[7]
    probe = digits.X_test[:100]
    kw = dict(block_size=40, n_init=10)  # 2–3 k-means parts per class, so the partition matters
    base = _released_quantities(_fab(X, y, **kw), probe)
    assert all(len(p) >= 2 and set(p) == {DEFAULT_PASSES} for p in base[2].values())
    assert _released_quantities(_fab(X2, y, **kw), probe) == base
    assert _released_quantities(_fab(1.0 - X, y, **kw), probe) == base
    # the noisy variant too: the pickled model is a function of the noisy rows only
    assert _model_bytes(_dp(X, y, **kw)) == _model_bytes(_dp(1.0 - X, y, **kw))


def test_cluster_on_original_leaks_on_neighbouring_data(digits, three_classes, same_noise):
    """Contrast (the test above can fail): the paper's cluster_on="original" partitions the
    private rows, so one changed row changes the released fabricated rows."""
    X, y, _ = three_classes
    X2 = X.copy()
    X2[7] = 1.0 - X[7]
    probe = digits.X_test[:100]
    with pytest.warns(PrivacyLeakWarning, match="cluster_on='original'"):
        a = _fab(X, y, block_size=40, cluster_on="original")
    with pytest.warns(PrivacyLeakWarning):
        b = _fab(X2, y, block_size=40, cluster_on="original")
    qa, qb = _released_quantities(a, probe), _released_quantities(b, probe)
    assert qa[1] != qb[1] and qa[3] != qb[3]  # dp_data_ and the model's distances
    assert any("cluster_on='original'" in w for w in a.privacy_statement_.weakenings)


def test_private_r_leaks_on_neighbouring_data(digits, three_classes, same_noise):
    """Contrast: the paper's r_source="private" stops the smoother at the private rows'
    modelling error, so a neighbouring data set changes the released passes and rows."""
    X, y, noisy = three_classes
    X2, label = _neighbour_moving_private_r(X, y, noisy)
    probe = digits.X_test[:100]
    with pytest.warns(PrivacyLeakWarning, match="r_source='private'"):
        a = _fab(X, y, r_source="private")
    with pytest.warns(PrivacyLeakWarning):
        b = _fab(X2, y, r_source="private")
    assert a.fabrication_passes_[label] != b.fabrication_passes_[label]
    qa, qb = _released_quantities(a, probe), _released_quantities(b, probe)
    assert qa[1] != qb[1] and qa[3] != qb[3]
    # the default on the same pair: identical
    assert _released_quantities(_fab(X, y), probe) == _released_quantities(_fab(X2, y), probe)


# ---------------------------------------------------------------------------------------------
# bounds
# ---------------------------------------------------------------------------------------------


def test_out_of_bounds_entry_is_clipped(digits):
    """Old: the estimator accepted x = 1600 with d = 1 and released 1600 ± 0.5 (and a
    min/max scaling let one entry rescale its column). Now the entry is clipped to the upper
    bound before noise: its release is the release of x = upper, bit for bit under the same
    noise, and no other entry moves."""
    X, y = digits.X_train, digits.y_train
    big, top = X.copy(), X.copy()
    big[0, 5], top[0, 5] = 1600.0, 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)  # the seeded noise
        fits = [_dp(Z, y, insecure_noise_seed=11) for Z in (X, big, top)]
    plain, from_big, from_top = (_released(f, y) for f in fits)
    assert from_big.tobytes() == from_top.tobytes()
    changed = np.argwhere(plain != from_big).tolist()
    assert changed in ([[0, 5]], [])  # only the entry itself (if it was not already at 1)
    assert np.abs(from_big[0, 5] - 1600) > 100  # the huge value is not released


def test_no_bounds_warns_and_is_named_in_the_statement(digits):
    X, y = digits.X_train.copy(), digits.y_train
    X[0, 5] = 1600.0
    with pytest.warns(PrivacyLeakWarning, match="bounds"):
        clf = _dp(X, y, bounds=None)
    statement = clf.privacy_statement_
    assert statement.bounds_source == BOUNDS_PRIVATE and statement.holds
    assert any(w.startswith("the bounds") for w in statement.weakenings)
    assert "private data" in statement.to_markdown()
    # why it is flagged: the bounds (released with the statement) show the private maximum
    assert statement.mechanism["upper"][5] == 1600.0
    public = _dp(digits.X_train, y)
    assert public.privacy_statement_.bounds_source == BOUNDS_PUBLIC
    assert public.privacy_statement_.weakenings == []


# ---------------------------------------------------------------------------------------------
# δ
# ---------------------------------------------------------------------------------------------


def _exact_fraction(R: np.ndarray, X: np.ndarray) -> tuple[int, int]:
    return int(np.count_nonzero(R == X)), R.size


def test_delta_zero_releases_no_entry_unnoised_beyond_chance(digits):
    """δ = 0 (old: rejected; δ = 1e-5 released ≈ δ·N·p entries un-noised). An entry comes
    out exactly at its private value only when Z = 0, probability (1 − r)/(1 + r) ≈ 1e-3."""
    X, y = digits.X_train, digits.y_train
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)  # nothing weakens the guarantee
        clf = _dp(X, y, delta=0.0)
    assert clf.privacy_statement_.weakenings == []
    md = clf.privacy_statement_.to_markdown()
    assert "ε-DP with ε = 2" in md and "except with probability δ" not in md
    k, n = _exact_fraction(_released(clf, y), X)
    r = _mechanism().ratio
    p0 = (1 - r) / (1 + r)
    assert abs(k - n * p0) <= 5 * np.sqrt(n * p0) + 1


def test_delta_positive_is_named(digits):
    X, y = digits.X_train, digits.y_train
    with pytest.warns(PrivacyLeakWarning, match="delta = 0.05"):
        clf = _dp(X, y, delta=0.05)
    statement = clf.privacy_statement_
    assert statement.mechanism["delta"] == 0.05
    assert any("delta = 0.05" in w for w in statement.weakenings)
    assert "(ε, δ)-DP" in statement.to_markdown() and "δ = 0.05" in statement.to_markdown()
    k, n = _exact_fraction(_released(clf, y), X)
    r = _mechanism().ratio
    p0 = 0.05 + 0.95 * (1 - r) / (1 + r)  # the atom plus Z = 0
    assert abs(k - n * p0) <= 5 * np.sqrt(n * p0 * (1 - p0))


# ---------------------------------------------------------------------------------------------
# the ledger
# ---------------------------------------------------------------------------------------------


def test_ledger_refuses_a_fit_beyond_the_budget_before_any_noise(digits, tmp_path, monkeypatch):
    X, y = digits.X_train, digits.y_train
    path = tmp_path / "digits.privacy-ledger.json"
    ledger = PrivacyLedger(path, budget=(3.0, 0.0))
    _dp(X, y, ledger=ledger)
    assert ledger.spent() == (2.0, 0.0) and len(ledger.entries) == 1
    entry = ledger.entries[0]
    assert entry["unit"] == "entry" and entry["mechanism"]["epsilon"] == 2.0

    calls = []
    real = GridLaplace.release
    monkeypatch.setattr(
        GridLaplace, "release", lambda self, *a, **k: calls.append(1) or real(self, *a, **k)
    )
    with pytest.raises(BudgetExceededError, match="beyond the budget"):
        _dp(X, y, ledger=ledger)
    assert calls == []  # refused before any noise was drawn
    assert ledger.spent() == (2.0, 0.0)
    # the ledger on disk (another session) refuses too; a release within the budget passes
    again = PrivacyLedger(path)
    assert again.budget == (3.0, 0.0) and again.spent() == (2.0, 0.0)
    with pytest.raises(BudgetExceededError):
        _dp(X, y, ledger=again)
    _dp(X, y, ledger=again, epsilon=1.0)
    assert calls == [1] and again.spent() == (3.0, 0.0)


# ---------------------------------------------------------------------------------------------
# the insecure seed
# ---------------------------------------------------------------------------------------------


def test_insecure_noise_seed_warns_reproduces_and_voids_the_statement(digits):
    X, y = digits.X_train, digits.y_train
    with pytest.warns(PrivacyLeakWarning, match="fixed seed"):
        a = _dp(X, y, insecure_noise_seed=5)
    with pytest.warns(PrivacyLeakWarning):
        b = _dp(X, y, insecure_noise_seed=5)
    Ra = _released(a, y)
    assert Ra.tobytes() == _released(b, y).tobytes()  # the noise is reproduced
    # whoever knows the seed removes the noise: the training rows come back exactly
    mech = _mechanism()
    recovered = Ra - mech.step * mech.noise_steps(len(X), _seeded(5))
    np.testing.assert_array_equal(recovered, X)
    statement = a.privacy_statement_
    assert statement.holds is False and statement.to_dict()["holds"] is False
    md = statement.to_markdown()
    assert "No guarantee" in md and "secure random generator" not in md
    secure = _dp(X, y).privacy_statement_
    assert secure.holds is True and "secure random generator" in secure.to_markdown()
