"""Fabrication: what each smoother pass buys in accuracy and costs in time, on five data sets.

The DP rows of the default recipe are fabricated: the noisy rows smoothed by M̃ passes of a KAHM
(``r_source="passes"``, ``DEFAULT_PASSES``). This benchmark measures the two sides of that number:

* ``passes``: test accuracy of the DP classifier fitted on the fabricated rows after m passes, for
  m in :data:`PASSES`, and on the noisy rows themselves (m = 0). The m-th iterate of one smoother
  run is the fabricated data with M̃ = m, so every m of a seed shares one noise draw (paired
  differences). Fresh secure noise per seed. The partition of each class (Remark 4) is the
  default's: k-means on the noisy rows.
* ``cost``: wall time of ``KAHMClassifier(n_jobs=2).fit`` non-private, DP on the noisy rows and DP
  fabricated with m passes, with the non-private fit of the same sitting as the baseline.
* ``defaults``: the old default (fabricated rows, ``DEFAULT_PASSES`` passes), the new default (the
  noisy rows) and, on the small data sets, the paper's leaky settings (threshold r from the private
  rows, the fabrication's k-means on the private rows; they warn), each with the non-private fit of
  the same seed and sitting: test accuracy, threshold-attack AUC (training rows, at most 10 000,
  against the test rows) and fit time. ``mnist`` here is all 60 000 training rows.

* ``denoise``: post-processing of the noisy rows that uses the known noise law, against the noisy
  rows on the same draw: each class's noisy rows shrunk toward their mean along the principal
  directions of their covariance, by the Wiener factor ``max(0, 1 − σ²/λ_k)`` (σ² the noise
  variance per entry, public: :func:`noise_variance`), keeping either every direction with
  ``λ_k > σ²`` or only those above the Marchenko–Pastur edge ``σ²(1 + √(p/N_c))²`` of pure noise.

The default is chosen without the data set it is reported on: the selection table picks, for each
data set, the option (noisy rows or m passes) whose worst paired difference to the old default over
the *other* data sets of the ``passes`` part is largest (DPImageBench's rule: no selection on the
reported test set).

Data sets (ε per entry; L layers): digits (public bounds 0–16; ε = 2; L = 5), breast cancer and
wine (no public bounds: scaled by the training split's min and max, which warns; ε = 1; L = 5),
spiral20 (the three-arm spiral embedded in 20 dimensions by a fixed orthonormal map, public
bounds (0, 1) by construction, a known two-dimensional structure, 1000 rows a class; ε = 2;
L = 5) and mnist12k (12 000 training rows of MNIST, stratified, tanh features with public bounds
[0, tanh 1], its 10 000 test rows; ε = 1; L = 1). n = 20, N_b = 1000.

    python -m benchmarks.bench_fabrication [--parts passes cost] [--seeds 0 1 2 3 4]
        [--datasets digits breast_cancer wine spiral20 mnist12k]
        [--defaults-datasets digits breast_cancer wine spiral20 mnist] [--parts ... denoise]

Writes ``benchmarks/results/fabrication.md`` (one BLAS thread per fit thread, load recorded).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from pathlib import Path

import numpy as np
from sklearn.model_selection import train_test_split

from benchmarks._harness import CACHE, blas_threads, load_mnist, machine_facts, markdown_table, write_report
from benchmarks.bench_privacy import BLOCK, N_COMP, TANH1, pm, smoother_iterates
from kahm_dask import KAHMClassifier
from kahm_dask.datasets import PUBLIC_BOUNDS, load_bundled, make_spiral, split_and_scale
from kahm_dask.privacy.fabrication import DEFAULT_PASSES, FabricationWarning
from kahm_dask.privacy.membership import membership_attack
from kahm_dask.privacy.noise import GridLaplace
from kahm_dask.privacy.randomness import PrivacyLeakWarning, SecureRandom

PASSES = (1, 2, 4, 8, 16)
COST_PASSES = (1, 2, 4, 8)
DATASETS = ("digits", "breast_cancer", "wine", "spiral20", "mnist12k", "mnist")
#: ε per entry and the number of layers L of each data set.
SETTINGS = {"digits": (2.0, 5), "breast_cancer": (1.0, 5), "wine": (1.0, 5), "spiral20": (2.0, 5),
            "mnist12k": (1.0, 1), "mnist": (1.0, 1)}
#: The ``defaults`` part's configurations: label → the DP settings beside ε and the bounds.
OLD_DEFAULT = f"fabricated, {DEFAULT_PASSES} passes (old default)"
NEW_DEFAULT = "noisy rows (new default)"
LEAKY = "paper's settings (leak)"
DEFAULT_CONFIGS = {
    OLD_DEFAULT: {"dp_data": "fabricated", "r_source": "passes", "r_value": DEFAULT_PASSES},
    NEW_DEFAULT: {"dp_data": "noisy"},
    LEAKY: {"dp_data": "fabricated", "r_source": "private", "cluster_on": "original"},
}
#: The leaky settings run up to 100 passes a cluster: not on MNIST (minutes a fit, and no target).
LEAKY_SKIP = ("mnist12k", "mnist")
ATTACK_ROWS = 10_000
#: Each part's raw rows (one JSON per part and data set; the report is rebuilt from all of them).
PARTS_DIR = CACHE / "fabrication"


def spiral20(n_per_class: int = 1000, p: int = 20, seed: int = 0):
    """The spiral (X2 in the unit disc) mapped to ``0.5 + 0.25 · X2 Q`` with Q (2, p) orthonormal
    rows: inside [0.25, 0.75]^p, so (0, 1) are bounds known without the data."""
    rng = np.random.default_rng(seed)
    X2, y = make_spiral(rng.uniform(size=n_per_class))
    Q = np.linalg.qr(rng.standard_normal((p, 2)))[0].T
    return 0.5 + 0.25 * X2 @ Q, y


def load(name: str):
    """``(X_train, y_train, X_test, y_test, lower, upper)`` of a data set, features in [lower, upper]."""
    if name == "mnist":
        return (*load_mnist(), 0.0, TANH1)
    if name == "mnist12k":
        Xtr, ytr, Xte, yte = load_mnist()
        keep, _ = train_test_split(np.arange(len(ytr)), train_size=12_000, stratify=ytr, random_state=0)
        return Xtr[keep], ytr[keep], Xte, yte, 0.0, TANH1
    if name == "spiral20":
        X, y = spiral20()
        bounds = (0.0, 1.0)
        split = split_and_scale(X, y, scale=False)
        return split.X_train, split.y_train, split.X_test, split.y_test, *bounds
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)  # breast cancer, wine: min/max scaling
        split = split_and_scale(*load_bundled(name), bounds=PUBLIC_BOUNDS.get(name))
    return split.X_train, split.y_train, split.X_test, split.y_test, 0.0, 1.0


def _accuracy_rows(name: str, seeds, variants) -> list[dict]:
    """For each seed, one fresh secure release of the training rows (the data set's ε, its public
    bounds), and for each DP-row variant ``(label, F)`` that ``variants(Y, y, seed, mech)`` makes of
    it, the test accuracy of the DP classifier fitted on F: rows ``{"seed", **label, "acc"}``."""
    Xtr, ytr, Xte, yte, lo, hi = load(name)
    mech = GridLaplace(SETTINGS[name][0], np.full(Xtr.shape[1], lo), np.full(Xtr.shape[1], hi))
    rows = []
    for seed in seeds:
        for label, F in variants(mech.release(Xtr, SecureRandom()), ytr, seed, mech):
            clf = KAHMClassifier(N_COMP, SETTINGS[name][1], BLOCK, random_state=seed, n_jobs=2).fit(F, ytr)
            rows.append({"seed": seed, **label, "acc": float(np.mean(clf.predict(Xte) == yte))})
            print(name, json.dumps(rows[-1]), flush=True)
    return rows


def run_passes(name: str, seeds) -> list[dict]:
    def iterates(Y, y, seed, mech):
        for m, F in {0: Y, **smoother_iterates(Y, y, np.unique(y), seed, PASSES)}.items():
            yield {"passes": m}, F

    return _accuracy_rows(name, seeds, iterates)


def run_cost(name: str, seeds) -> list[dict]:
    Xtr, ytr, _, _, lo, hi = load(name)
    eps, layers = SETTINGS[name]
    bounds = (lo, hi)
    configs = [("non-private", {}), ("DP, noisy rows", {"epsilon": eps, "bounds": bounds, "dp_data": "noisy"})]
    fabricated = {"epsilon": eps, "bounds": bounds, "dp_data": "fabricated"}
    configs += [(f"DP, fabricated, {m} passes", {**fabricated, "r_value": m}) for m in COST_PASSES]
    rows = []
    for seed in seeds:
        for label, kw in configs:
            clf = KAHMClassifier(N_COMP, layers, BLOCK, random_state=seed, n_jobs=2, ledger=None, **kw)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", PrivacyLeakWarning)  # ledger=None: a benchmark releases nothing
                t0 = time.perf_counter()
                clf.fit(Xtr, ytr)
                seconds = time.perf_counter() - t0
            rows.append({"seed": seed, "config": label, "seconds": seconds})
            print(name, json.dumps(rows[-1]), flush=True)
    return rows


def noise_variance(mech: GridLaplace) -> np.ndarray:
    """(p,) variance of the noise added to each entry: ``step² · 2r/(1 − r)²``, the variance of
    the discrete Laplace law of ratio r in grid steps (public: ε, d and the grid fix it)."""
    return mech.step**2 * 2 * mech.ratio / (1 - mech.ratio) ** 2


def pca_shrink(Y: np.ndarray, variance: float, edge: str) -> np.ndarray:
    """Rows of one class ``Y`` (N, p) shrunk toward their mean: coordinate k along the k-th
    principal direction times ``max(0, 1 − σ²/λ_k)``, zero below the edge (``"noise"``: σ²;
    ``"mp"``: σ²(1 + √(p/N))², the largest eigenvalue of pure noise)."""
    mean = Y.mean(axis=0)
    Yc = Y - mean
    lam, V = np.linalg.eigh(Yc.T @ Yc / (Y.shape[0] - 1))
    floor = variance * (1 + np.sqrt(Y.shape[1] / Y.shape[0])) ** 2 if edge == "mp" else variance
    weight = np.where(lam > floor, 1 - variance / np.maximum(lam, floor), 0.0)
    return mean + (Yc @ V) * weight @ V.T


DENOISE = {"noisy rows": None, "PCA shrinkage, λ > σ²": "noise", "PCA shrinkage, λ > MP edge": "mp"}


def run_denoise(name: str, seeds) -> list[dict]:
    def shrunk(Y, y, seed, mech):
        variance = float(noise_variance(mech).mean())
        for label, edge in DENOISE.items():
            F = Y.copy()
            if edge is not None:
                for c in np.unique(y):
                    F[y == c] = pca_shrink(Y[y == c], variance, edge)
            yield {"config": label}, F

    return _accuracy_rows(name, seeds, shrunk)


def run_defaults(name: str, seeds) -> list[dict]:
    Xtr, ytr, Xte, yte, lo, hi = load(name)
    eps, layers = SETTINGS[name]
    configs = {"non-private": None} | {k: v for k, v in DEFAULT_CONFIGS.items()
                                       if not (k == LEAKY and name in LEAKY_SKIP)}
    rows = []
    for seed in seeds:
        for label, kw in configs.items():
            dp = {} if kw is None else {"epsilon": eps, "bounds": (lo, hi), **kw}
            clf = KAHMClassifier(N_COMP, layers, BLOCK, random_state=seed, n_jobs=2, ledger=None, **dp)
            with warnings.catch_warnings():
                # ledger=None and the leaky settings warn by design; an unreached r is M̃ = None
                warnings.simplefilter("ignore", PrivacyLeakWarning)
                warnings.simplefilter("ignore", FabricationWarning)
                t0 = time.perf_counter()
                clf.fit(Xtr, ytr)
                seconds = time.perf_counter() - t0
            row = {"seed": seed, "config": label, "seconds": seconds,
                   "acc": float(np.mean(clf.predict(Xte) == yte))}
            if kw is not None or seed == seeds[0]:
                row["auc"] = membership_attack(clf, Xtr, Xte, max_train_rows=ATTACK_ROWS, random_state=seed).auc
            rows.append(row)
            print(name, json.dumps(rows[-1]), flush=True)
    return rows


def _paired(values, base) -> str:
    d = 100 * (np.asarray(values) - np.asarray(base))
    se = d.std(ddof=1) / np.sqrt(d.size) if d.size > 1 else 0.0
    return f"{d.mean():+.2f} ± {se:.2f}"


def passes_table(results: dict[str, list[dict]]) -> str:
    names = list(results)
    ms = sorted({r["passes"] for rows in results.values() for r in rows})
    acc = {(n, m): [r["acc"] for r in sorted(results[n], key=lambda r: r["seed"]) if r["passes"] == m]
           for n in names for m in ms}
    headers = ["passes m"] + [f"{n} (ε = {SETTINGS[n][0]:g}, L = {SETTINGS[n][1]})" for n in names]
    table = [[("0 (noisy rows)" if m == 0 else str(m)) + (" (default)" if m == DEFAULT_PASSES else "")]
             + [f"{pm(acc[n, m], '{:.4f}')} ({_paired(acc[n, m], acc[n, DEFAULT_PASSES])})" for n in names]
             for m in ms]
    seeds = {n: len(acc[n, DEFAULT_PASSES]) for n in names}
    return (markdown_table(headers, table) + "\n\nTest accuracy, mean ± sd over noise draws "
            f"({', '.join(f'{n}: {k}' for n, k in seeds.items())}); in brackets the paired difference to "
            f"{DEFAULT_PASSES} passes on the same noise, in points, mean ± standard error.")


def cost_table(results: dict[str, list[dict]]) -> str:
    parts = []
    for name, rows in results.items():
        configs = list(dict.fromkeys(r["config"] for r in rows))
        seconds = {c: np.array([r["seconds"] for r in rows if r["config"] == c]) for c in configs}
        base = seconds["non-private"]
        table = [[c, f"{s.mean():.2f}", f"{(s / base).mean():.2f}×"] for c, s in seconds.items()]
        parts.append(f"**{name}** (ε = {SETTINGS[name][0]:g}, L = {SETTINGS[name][1]}, {len(base)} sittings)\n\n"
                     + markdown_table(["fit", "seconds (mean)", "/ non-private fit of the same sitting"], table))
    return "\n\n".join(parts)


def defaults_table(results: dict[str, list[dict]]) -> str:
    table = []
    for name, rows in results.items():
        base = {r["seed"]: r["seconds"] for r in rows if r["config"] == "non-private"}
        for config in dict.fromkeys(r["config"] for r in rows):
            runs = sorted((r for r in rows if r["config"] == config), key=lambda r: r["seed"])
            ratio = np.array([r["seconds"] / base[r["seed"]] for r in runs])
            aucs = [r["auc"] for r in runs if "auc" in r]
            table.append([f"{name} (ε = {SETTINGS[name][0]:g}, L = {SETTINGS[name][1]})", config, str(len(runs)),
                          pm([r["acc"] for r in runs], "{:.4f}"), pm(aucs), pm([r["seconds"] for r in runs], "{:.2f}"),
                          f"{ratio.mean():.2f}×"])
    return (markdown_table(["data set", "configuration", "seeds", "test accuracy", "attack AUC", "fit s",
                            "fit / non-private fit, same seed and sitting"], table)
            + f"\n\nMean ± sd over seeds (fresh secure noise per seed). Attack AUC: threshold attack, at most "
            f"{ATTACK_ROWS:,} training rows against the test rows (0.5 = no signal); the non-private row has one "
            "seed's attack. The paper's settings read the private rows twice beyond the noise (r and the "
            "partition) and are not DP as a whole: the accuracy the paper's method reaches when it may leak.")


def denoise_table(results: dict[str, list[dict]]) -> str:
    labels = list(DENOISE)
    table = []
    for label in labels:
        cells = [label]
        for rows in results.values():
            acc = {r["config"]: [] for r in rows}
            for r in sorted(rows, key=lambda r: r["seed"]):
                acc[r["config"]].append(r["acc"])
            cells.append(f"{pm(acc[label], '{:.4f}')} ({_paired(acc[label], acc[labels[0]])})")
        table.append(cells)
    headers = ["DP rows"] + [f"{n} (ε = {SETTINGS[n][0]:g}, L = {SETTINGS[n][1]})" for n in results]
    return (markdown_table(headers, table) + "\n\nTest accuracy, mean ± sd over noise draws (5 a data set "
            "unless the raw file says otherwise); in brackets the paired difference to the noisy rows on the same "
            "draw, in points, mean ± standard error. Both shrinkages are post-processing of the release: the "
            "noise variance comes from ε, d and the grid.")


def selection_table(results: dict[str, list[dict]]) -> str:
    """For each data set, the option chosen on the *other* data sets: the one whose worst paired
    difference to the old default over them is largest (no data set loses; ties: the larger
    mean), with the mean for comparison."""
    names = list(results)
    ms = sorted({r["passes"] for rows in results.values() for r in rows})

    def delta(n: str, m: int) -> float:
        acc = {(r["seed"], r["passes"]): r["acc"] for r in results[n]}
        seeds = sorted({s for s, _ in acc})
        return 100 * float(np.mean([acc[s, m] - acc[s, DEFAULT_PASSES] for s in seeds]))

    def label(m: int) -> str:
        return "noisy rows" if m == 0 else f"{m} passes"

    reported = names + (["mnist"] if "mnist12k" in names else [])
    table = []
    for n in reported:
        others = [o for o in names if o != n and not (n.startswith("mnist") and o.startswith("mnist"))]
        worst = {m: min(delta(o, m) for o in others) for m in ms}
        mean = {m: float(np.mean([delta(o, m) for o in others])) for m in ms}
        best = max(ms, key=lambda m: (worst[m], mean[m]))
        by_mean = max(ms, key=mean.get)
        table.append([n, ", ".join(others), label(best), f"{worst[best]:+.2f}", f"{mean[best]:+.2f}",
                      f"{delta(n, best):+.2f}" if n in results else "– (see the defaults table)",
                      f"{label(by_mean)} ({mean[by_mean]:+.2f})"])
    return (markdown_table(["reported data set", "chosen on", "choice", "worst Δ there", "mean Δ there",
                            "Δ on the reported data set", "the largest mean Δ instead"], table)
            + f"\n\nΔ: paired accuracy difference to {DEFAULT_PASSES} passes (the old default), in points, from the "
            "accuracy-by-passes table above. The rule is the one the old default was chosen by (the option at "
            "which no data set loses); the largest mean instead follows a single data set's large gain "
            "(spiral20 at 16 passes). MNIST subsets are never chosen on each other.")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", nargs="+", choices=("passes", "cost", "defaults", "denoise"),
                    default=["passes", "cost", "defaults", "denoise"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    ap.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(DATASETS[:5]))
    ap.add_argument("--cost-datasets", nargs="+", choices=DATASETS, default=["digits", "mnist12k"])
    ap.add_argument("--defaults-datasets", nargs="+", choices=DATASETS,
                    default=["digits", "breast_cancer", "wine", "spiral20", "mnist"])
    ap.add_argument("--report-only", action="store_true", help="rebuild the report from the stored parts")
    args = ap.parse_args(argv)
    # n = 20 is capped at p on wine (13 features): the same cap for every configuration
    warnings.filterwarnings("ignore", message="n_components=.* exceeds the number of features")
    PARTS_DIR.mkdir(parents=True, exist_ok=True)
    facts = machine_facts(1)
    runs = {"passes": (args.datasets, run_passes), "cost": (args.cost_datasets, run_cost),
            "defaults": (args.defaults_datasets, run_defaults), "denoise": (args.datasets, run_denoise)}
    with blas_threads(1):
        for part in [] if args.report_only else args.parts:
            names, fn = runs[part]
            for name in names:
                start = {"date": time.strftime("%Y-%m-%dT%H:%M"), "load_start": os.getloadavg()[0]}
                rows = fn(name, args.seeds)
                sitting = {**start, "load_end": os.getloadavg()[0], "rows": rows}
                (PARTS_DIR / f"{part}_{name}.json").write_text(json.dumps(sitting))
    stored = {}
    for path in sorted(PARTS_DIR.glob("*_*.json")):
        part, name = path.stem.split("_", 1)
        data = json.loads(path.read_text())
        if not isinstance(data, dict):  # rows only, stored before the sittings were: the file's time is their end
            ended = time.strftime("%Y-%m-%dT%H:%M", time.localtime(path.stat().st_mtime))
            data = {"rows": data, "date": f"{ended} (end)"}
        stored[part, name] = data
    sections = []
    for part, title, table in (("passes", "Accuracy by smoother passes", passes_table),
                               ("passes", "The default, chosen without the reported data set", selection_table),
                               ("cost", "Fit time by smoother passes", cost_table),
                               ("defaults", "Old and new defaults, same sittings", defaults_table),
                               ("denoise", "Post-processing with the known noise variance", denoise_table)):
        found = {n: stored[part, n]["rows"] for n in DATASETS if (part, n) in stored}
        if found:
            sections.append((title, table(found)))
    sittings = [[part, name, d.get("date", "–"), f"{d['load_start']:.2f}" if "load_start" in d else "–",
                 f"{d['load_end']:.2f}" if "load_end" in d else "–"] for (part, name), d in stored.items()]
    sections.append(("Sittings", markdown_table(["part", "data set", "date", "load at start", "load at end"], sittings)
                     + "\n\nThe facts above are the last run's; each part and data set was measured in the sitting "
                     "listed here. A date marked (end) is the time its rows were stored, by a run that did not record "
                     "its sitting (nor the load)."))
    path = write_report("fabrication", "Fabrication: smoother passes, accuracy and cost", facts, sections)
    print(f"wrote {Path(path)}")


if __name__ == "__main__":
    main()
