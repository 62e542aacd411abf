"""Federated benchmark: centralised vs federated KAHM accuracy per split type (docs/federated.md).

For each bundled data set (split seed 0, stratified 70/30, features to [0, 1] by the public
bounds where the data set has them (digits: 0–16), else by the training min/max), each privacy
setting (non-private; DP fabricated at ε = 2 per entry, δ = 0, public bounds [0, 1], d = 1,
the leak-free defaults) and each
seed: fit the centralised :class:`KAHMClassifier` (``random_state = seed``), then for each
split type and number of sites Q ∈ {2, 5, 10}, split the training rows with
:func:`split_sites` (``random_state = seed``), fit one classifier per site
(:func:`fit_sites`, site q seeded ``site_seed(seed, q)``) and combine them by minimum distance
(:class:`FederatedClassifier`). n = 20, L = 5, N_b = 1000. In-memory core path (no Dask).

Reported per (data set, privacy, split, Q), mean ± sd over the seeds: the split's label
heterogeneity (mean total-variation distance of the site label distributions to the pooled
one), centralised and federated test accuracy, the accuracy loss centralised − federated
(paired by seed, percentage points) and the federated threshold-attack AUC, site by site (each
site's answers on its own training rows vs on the test rows; no site is queried with another
site's rows), of the most exposed site (0.5 = no membership signal).

Writes ``benchmarks/results/federated.md``.

    python -m benchmarks.bench_federated [--blas-threads 1] [--seeds 0 1 2]
        [--datasets digits breast_cancer] [--sites 2 5 10]
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Iterator

import numpy as np

from benchmarks._harness import blas_threads, machine_facts, markdown_table, write_report
from kahm_dask import KAHMClassifier
from kahm_dask.datasets import PUBLIC_BOUNDS, Split, load_bundled, split_and_scale
from kahm_dask.federated import FederatedClassifier, fit_sites, label_heterogeneity, split_sites
from kahm_dask.privacy.fabrication import DEFAULT_PASSES, FabricationWarning
from kahm_dask.privacy.membership import membership_attack_from_distances

N_COMP, N_LAYERS, BLOCK, EPSILON = 20, 5, 1000, 2.0
SPLIT_SEED = 0
SPLITS = (("iid", {}), ("per_class", {}), ("label_skew", {"classes_per_site": 2}),
          ("dirichlet", {"alpha": 0.5}))
#: The DP rows are fabricated, as in the results of federated.md (the default fits the noisy rows).
PRIVACY = (("non-private", {}),
           (f"DP ε={EPSILON:g}", {"epsilon": EPSILON, "bounds": (0.0, 1.0), "dp_data": "fabricated"}))


def split_cases(n_classes: int, site_counts: list[int]) -> Iterator[tuple[str, dict, int]]:
    """(split, options, Q); per_class only with Q = number of classes."""
    for name, options in SPLITS:
        counts = [n_classes] if name == "per_class" else site_counts
        for q in counts:
            yield name, options, q


def evaluate(model, data: Split, sites: list[np.ndarray] | None = None) -> tuple[float, float]:
    """Test accuracy and the threshold-attack AUC (−min distance; train rows vs test rows).

    A federation is evaluated site by site (docs/federated.md): site q's answers on its own
    training rows vs its answers on the test rows of the classes it holds (non-members from the
    members' distribution: test rows of other classes would measure the class, not membership);
    the AUC of the most exposed site is kept. No site is queried with another site's rows."""
    if isinstance(model, FederatedClassifier):
        acc = float(np.mean(model.predict(data.X_test) == data.y_test))
        aucs = []
        for site, rows in zip(model.sites, sites, strict=True):
            test = data.X_test[np.isin(data.y_test, data.y_train[rows])]
            aucs.append(membership_attack_from_distances(
                site.answer(data.X_train[rows]).min_distance, site.answer(test).min_distance).auc)
        return acc, max(aucs)
    else:
        D = model.class_distances(data.X_test)
        pred, d_test = model.classes_[D.argmin(axis=1)], D.min(axis=1)
        d_train = model.class_distances(data.X_train).min(axis=1)
    acc = float(np.mean(pred == data.y_test))
    return acc, membership_attack_from_distances(d_train, d_test).auc


def run_dataset(name: str, seeds: list[int], site_counts: list[int]) -> tuple[list, list, dict]:
    """Centralised and federated results of one data set: rows of both tables and counters
    (site fits, fabrications that did not reach r, splits that cannot be built)."""
    data = split_and_scale(*load_bundled(name), split_seed=SPLIT_SEED, bounds=PUBLIC_BOUNDS.get(name))
    n_classes = np.unique(data.y_train).size
    fed_rows, central_rows = [], []
    counters = {"fits": 0, "unreached_r": 0, "impossible": {}}
    for privacy, kw in PRIVACY:
        central = {}
        for seed in seeds:
            clf = KAHMClassifier(N_COMP, N_LAYERS, BLOCK, random_state=seed, **kw)
            central[seed] = evaluate(clf.fit(data.X_train, data.y_train), data)
        central_rows.append([name, privacy, pm([a for a, _ in central.values()]),
                             pm([u for _, u in central.values()])])
        for split, options, n_sites in split_cases(n_classes, site_counts):
            runs = []
            for seed in seeds:
                try:
                    sites = split_sites(data.y_train, n_sites, split, random_state=seed, **options)
                except ValueError as exc:
                    counters["impossible"][(name, split, n_sites)] = str(exc)
                    runs = None
                    break
                estimator = KAHMClassifier(N_COMP, N_LAYERS, BLOCK, random_state=seed, **kw)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always", FabricationWarning)
                    fed = FederatedClassifier(fit_sites(estimator, data.X_train, data.y_train, sites))
                counters["fits"] += n_sites
                counters["unreached_r"] += sum(issubclass(w.category, FabricationWarning) for w in caught)
                acc, auc = evaluate(fed, data, sites)
                runs.append((label_heterogeneity(data.y_train, sites), central[seed][0], acc, auc))
            fed_rows.append(table_row(name, privacy, split, options, n_sites, runs))
    return fed_rows, central_rows, counters


def table_row(name: str, privacy: str, split: str, options: dict, n_sites: int, runs) -> list:
    label = split + "".join(f" ({k}={v})" for k, v in options.items())
    if runs is None:
        return [name, privacy, label, n_sites, "–", "–", "–", "n/a (see below)", "–"]
    het, central, fed, auc = (np.array(v) for v in zip(*runs, strict=True))
    return [name, privacy, label, n_sites, pm(het, "{:.2f}"), pm(central), pm(fed),
            pm(100 * (central - fed), "{:+.1f}"), pm(auc)]


def pm(values, fmt: str = "{:.3f}") -> str:
    v = np.asarray(values, dtype=float)
    sd = v.std(ddof=1) if v.size > 1 else 0.0
    return f"{fmt.format(v.mean())} ± {fmt.format(sd).lstrip('+')}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blas-threads", type=int, default=1)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--datasets", nargs="+", default=["digits", "breast_cancer"])
    parser.add_argument("--sites", type=int, nargs="+", default=[2, 5, 10])
    args = parser.parse_args()
    t0 = time.perf_counter()
    fed_rows, central_rows = [], []
    counters = {"fits": 0, "unreached_r": 0, "impossible": {}}
    with blas_threads(args.blas_threads):
        facts = machine_facts(args.blas_threads)
        for name in args.datasets:
            f, c, n = run_dataset(name, args.seeds, args.sites)
            fed_rows += f
            central_rows += c
            counters["fits"] += n["fits"]
            counters["unreached_r"] += n["unreached_r"]
            counters["impossible"].update(n["impossible"])
    facts["total wall time"] = f"{time.perf_counter() - t0:.0f} s"
    facts["seeds"] = " ".join(map(str, args.seeds))
    settings = (
        f"Split seed {SPLIT_SEED} (stratified 70/30), features scaled to [0, 1] by the public "
        "bounds (digits 0–16; breast cancer, which has none, by the pooled training min/max). "
        f"n = {N_COMP}, L = {N_LAYERS}, N_b = {BLOCK}. DP: fabricated data with the leak-free "
        f"defaults ({DEFAULT_PASSES} smoother passes, k-means on the noisy rows), ε = {EPSILON:g} per entry at "
        "every site, δ = 0, public bounds [0, 1], d = 1, noise from the OS's secure generator; "
        "the sites hold disjoint rows, so the federation is also ε-DP per entry "
        "(parallel composition). A seed s seeds the k-means of the centralised model, the site "
        "split (`split_sites(random_state=s)`) and the sites (`site_seed(s, q)`). Loss = centralised − "
        "federated test accuracy of the same seed, in percentage points (positive = federated "
        "worse). Heterogeneity = mean total-variation distance between the sites' label "
        "distributions and the pooled one (0 = IID; 1 − 1/C for one class per site). label_skew "
        "with 2 classes per site on breast_cancer (2 classes) gives every site both classes, "
        "i.e. a stratified IID split. A share of a class with < 2 rows at a site is merged into "
        "the class's largest share (`split_sites`). With Q·k = C (digits, label_skew, Q = 5) "
        "every class is held by exactly one site, as in per_class: non-private, the sites then "
        "equal the centralised class models (S = 1 here) and the predictions coincide exactly "
        "(docs/federated.md). The non-private centralised model does not depend on the seed (S = 1, no "
        "k-means), hence its sd 0. "
        f"Fits of site classifiers: {counters['fits']}; site classes whose fabrication did not "
        f"reach r (best effort used): {counters['unreached_r']}. The attack AUC of a federation "
        "is that of its most exposed site, each site queried with its own training rows and the test "
        "rows of the classes it holds."
    )
    headers = ["data set", "privacy", "split", "sites Q", "heterogeneity", "centralised acc",
               "federated acc", "loss (pp)", "federated attack AUC"]
    write_report(
        "federated",
        "Federated benchmark: centralised vs federated KAHM classifiers",
        facts,
        [
            ("Settings", settings),
            ("Centralised reference (mean ± sd over seeds)",
             markdown_table(["data set", "privacy", "test accuracy", "attack AUC"], central_rows)),
            ("Federated vs centralised (mean ± sd over seeds)", markdown_table(headers, fed_rows)),
            ("Splits that cannot be built", "\n".join(
                f"* {n}, {split}, Q = {q}: {reason}"
                for (n, split, q), reason in counters["impossible"].items()) or "none"),
        ],
    )


if __name__ == "__main__":
    main()
