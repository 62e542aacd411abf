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

Data sets (ε per entry; L layers): digits (public bounds 0–16; ε = 2; L = 5), breast cancer and
wine (no public bounds: scaled by the training split's min and max, which warns; ε = 1; L = 5),
spiral20 (the three-arm spiral embedded in 20 dimensions by a fixed orthonormal map, public
bounds (0, 1) by construction, a known two-dimensional structure, 1000 rows a class; ε = 2;
L = 5) and mnist12k (12 000 training rows of MNIST, stratified, tanh features with public bounds
[0, tanh 1], its 10 000 test rows; ε = 1; L = 1). n = 20, N_b = 1000.

    python -m benchmarks.bench_fabrication [--parts passes cost] [--seeds 0 1 2 3 4]
        [--datasets digits breast_cancer wine spiral20 mnist12k]

Writes ``benchmarks/results/fabrication.md`` (one BLAS thread per fit thread, load recorded).
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np
from sklearn.model_selection import train_test_split

from benchmarks._harness import CACHE, blas_threads, load_mnist, machine_facts, markdown_table, write_report
from benchmarks.bench_privacy import BLOCK, N_COMP, TANH1, pm, smoother_iterates
from kahm_dask import KAHMClassifier
from kahm_dask.datasets import PUBLIC_BOUNDS, load_bundled, make_spiral, split_and_scale
from kahm_dask.privacy.fabrication import DEFAULT_PASSES
from kahm_dask.privacy.noise import GridLaplace
from kahm_dask.privacy.randomness import PrivacyLeakWarning, SecureRandom

PASSES = (1, 2, 4, 8, 16)
COST_PASSES = (1, 2, 4, 8)
DATASETS = ("digits", "breast_cancer", "wine", "spiral20", "mnist12k")
#: ε per entry and the number of layers L of each data set.
SETTINGS = {"digits": (2.0, 5), "breast_cancer": (1.0, 5), "wine": (1.0, 5), "spiral20": (2.0, 5),
            "mnist12k": (1.0, 1)}
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


def run_passes(name: str, seeds) -> list[dict]:
    Xtr, ytr, Xte, yte, lo, hi = load(name)
    eps, layers = SETTINGS[name]
    mech = GridLaplace(eps, np.full(Xtr.shape[1], lo), np.full(Xtr.shape[1], hi))
    rows = []
    for seed in seeds:
        Y = mech.release(Xtr, SecureRandom())
        iterates = {0: Y, **smoother_iterates(Y, ytr, np.unique(ytr), seed, PASSES)}
        for m, F in iterates.items():
            clf = KAHMClassifier(N_COMP, layers, BLOCK, random_state=seed, n_jobs=2).fit(F, ytr)
            rows.append({"seed": seed, "passes": m, "acc": float(np.mean(clf.predict(Xte) == yte))})
            print(name, json.dumps(rows[-1]), flush=True)
    return rows


def run_cost(name: str, seeds) -> list[dict]:
    Xtr, ytr, _, _, lo, hi = load(name)
    eps, layers = SETTINGS[name]
    bounds = (lo, hi)
    configs = [("non-private", {}), ("DP, noisy rows", {"epsilon": eps, "bounds": bounds, "dp_data": "noisy"})]
    configs += [(f"DP, fabricated, {m} passes", {"epsilon": eps, "bounds": bounds, "r_value": m}) for m in COST_PASSES]
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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", nargs="+", choices=("passes", "cost"), default=["passes", "cost"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    ap.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(DATASETS))
    ap.add_argument("--cost-datasets", nargs="+", choices=DATASETS, default=["digits", "mnist12k"])
    args = ap.parse_args(argv)
    # n = 20 is capped at p on wine (13 features): the same cap for every configuration
    warnings.filterwarnings("ignore", message="n_components=.* exceeds the number of features")
    PARTS_DIR.mkdir(parents=True, exist_ok=True)
    facts = machine_facts(1)
    with blas_threads(1):
        for part, names, fn in (("passes", args.datasets, run_passes), ("cost", args.cost_datasets, run_cost)):
            if part in args.parts:
                for name in names:
                    (PARTS_DIR / f"{part}_{name}.json").write_text(json.dumps(fn(name, args.seeds)))
    sections = []
    for part, title, table in (("passes", "Accuracy by smoother passes", passes_table),
                               ("cost", "Fit time by smoother passes", cost_table)):
        found = {p.stem.split("_", 1)[1]: json.loads(p.read_text()) for p in sorted(PARTS_DIR.glob(f"{part}_*.json"))}
        found = {n: found[n] for n in DATASETS if n in found}
        if found:
            sections.append((title, table(found)))
    path = write_report("fabrication", "Fabrication: smoother passes, accuracy and cost", facts, sections)
    print(f"wrote {Path(path)}")


if __name__ == "__main__":
    main()
