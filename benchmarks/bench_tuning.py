"""Free tuning: ``n_components`` chosen by cross-validation on a DP release, against the default.

For each data set and each of ``--draws`` noise draws: one release of the training rows
(``release_dataset``: noisy rows, and with ``--dp-data fabricated`` the rows fabricated from
them, at the data set's ε and with the features and bounds of
``bench_fabrication``, whose breast cancer and wine are scaled by the training split's min and
max, as there; one in-memory ledger per draw), then

* *default*: ``KAHMClassifier(random_state=draw)`` (``n_components`` = 20) fitted on the release
  (on noisy rows, the DP classifier's default model: same rows, same partition);
* *tuned*: ``GridSearchCV`` over ``n_components`` in :data:`GRID` (capped at p), 3-fold, on the
  release alone, refitted on all of it (``released_from=ds``: post-processing).

Both are scored on the private test split (a report, not a choice: nothing is chosen on it).
The ledger must hold exactly the one release per draw after the tuning (checked), so the
difference is what tuning on the release buys at no privacy cost.

    python -m benchmarks.bench_tuning [--datasets digits breast_cancer wine] [--draws 5] [--merge]

``mnist12k`` (12 000 MNIST training rows) needs the MNIST cache of ``benchmarks/_harness.py``.
With ``--merge`` the rows of ``results/tuning.md`` for the other (data set, release) pairs are
kept and this run's rows replace or join them; every row names its sitting (date and load
average at its start and end), and the file is rewritten after each finished row, so a long
run that is stopped keeps what it finished.
"""

from __future__ import annotations

import argparse
import ast
import os
import time
import warnings
from datetime import datetime

import numpy as np
from sklearn.model_selection import GridSearchCV
from threadpoolctl import threadpool_limits

from benchmarks._harness import RESULTS, machine_facts, markdown_table, write_report
from benchmarks.bench_fabrication import SETTINGS, load
from kahm_dask import KAHMClassifier, PrivacyLedger, release_dataset

GRID = (5, 10, 20, 40)


def measure(name: str, dp_data: str, draws: int) -> dict:
    Xtr, ytr, Xte, yte, lo, hi = load(name)
    eps = SETTINGS[name][0]
    grid = sorted({min(n, Xtr.shape[1]) for n in GRID})
    out = {"name": name, "dp_data": dp_data, "epsilon": eps, "n_train": len(ytr), "p": Xtr.shape[1], "grid": grid,
           "default": [], "tuned": [], "chosen": [], "spent": [], "seconds": [],
           "sitting": {"start": _now(), "load_start": _load()}}
    for draw in range(draws):
        t0 = time.perf_counter()
        ledger = PrivacyLedger()
        ds = release_dataset(Xtr, ytr, epsilon=eps, bounds=(lo, hi), dp_data=dp_data, random_state=draw,
                             ledger=ledger)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # n_components above p (wine): capped, as reported
            default = KAHMClassifier(random_state=draw).fit(ds.X, ds.y, released_from=ds)
            search = GridSearchCV(KAHMClassifier(random_state=draw), {"n_components": grid}, cv=3)
            search.fit(ds.X, ds.y, released_from=ds)
        out["default"].append(default.score(Xte, yte))
        out["tuned"].append(search.score(Xte, yte))
        out["chosen"].append(search.best_params_["n_components"])
        out["spent"].append(ledger.spent()[0])
        out["seconds"].append(time.perf_counter() - t0)
        assert ledger.spent() == (eps, 0.0), ledger.spent()  # the release only: tuning spent nothing
        print(f"{name} {dp_data} draw {draw}: default {out['default'][-1]:.4f}, tuned {out['tuned'][-1]:.4f} "
              f"(n_components {out['chosen'][-1]}), {out['seconds'][-1]:.1f} s, load {_load()}", flush=True)
    out["sitting"].update(end=_now(), load_end=_load())
    return out


def _now() -> str:
    return datetime.now().isoformat(timespec="minutes")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def earlier_results(path) -> list[dict]:
    """The raw results of an earlier ``tuning.md`` (empty if there is none), each with its
    sitting: its own, or for rows written before rows named one, the file's date and load
    average (both taken when that file was written, after its runs)."""
    if not path.exists():
        return []
    text = path.read_text()
    start = text.index("## Raw results")
    body = text[text.index("```", start) + 3:]
    results = ast.literal_eval(body[: body.index("```")].strip())
    facts = dict(line.strip("|").split("|", 1) for line in text.splitlines()
                 if line.startswith("| ") and line.count("|") == 3)
    facts = {k.strip(): v.strip() for k, v in facts.items()}
    for r in results:
        r.setdefault("sitting", {"start": None, "load_start": None, "end": facts.get("date", "?"),
                                 "load_end": facts.get("load average at end", "?")})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["digits", "breast_cancer", "wine"],
                        choices=["digits", "breast_cancer", "wine", "mnist12k"])
    parser.add_argument("--dp-data", nargs="+", default=["noisy", "fabricated"], choices=["noisy", "fabricated"])
    parser.add_argument("--draws", type=int, default=5)
    parser.add_argument("--merge", action="store_true",
                        help="keep the other rows of results/tuning.md (each names its sitting)")
    args = parser.parse_args()
    results = earlier_results(RESULTS / "tuning.md") if args.merge else []
    with threadpool_limits(1, user_api="blas"):
        for name in args.datasets:
            for dp_data in args.dp_data:
                r = measure(name, dp_data, args.draws)
                results = [o for o in results if (o["name"], o["dp_data"]) != (name, dp_data)] + [r]
                path = write(results, args.draws)
    print(path.read_text())


def _sitting(r: dict) -> str:
    s = r["sitting"]
    if s["start"] is None:
        return f"ended by {s['end']} (load {s['load_end']} then; start not recorded)"
    return f"{s['start']} (load {s['load_start']}) – {s['end']} (load {s['load_end']})"


def write(results: list[dict], draws: int):
    """Write ``results/tuning.md`` with the rows of ``results`` (data sets in their first
    order, noisy before fabricated) and their sittings; returns its path."""
    order = {n: i for i, n in enumerate(["digits", "breast_cancer", "wine", "mnist12k"])}
    results = sorted(results, key=lambda r: (order[r["name"]], r["dp_data"] != "noisy"))
    rows = []
    for r in results:
        d, t = np.array(r["default"]), np.array(r["tuned"])
        diff = t - d
        chosen = ", ".join(f"{n}×{r['chosen'].count(n)}" for n in sorted(set(r["chosen"])))
        rows.append([r["name"], r["dp_data"], f"{r['n_train']} × {r['p']}", f"{r['epsilon']:g}",
                     f"{d.mean():.4f} ± {d.std(ddof=1):.4f}", f"{t.mean():.4f} ± {t.std(ddof=1):.4f}",
                     f"{diff.mean():+.4f} (min {diff.min():+.4f}, max {diff.max():+.4f})", chosen,
                     f"{max(r['spent']):g}", f"{np.mean(r['seconds']):.1f}", len(r["default"])])
    table = markdown_table(
        ["data set", "release", "train rows × p", "ε per entry", "default n=20 (mean ± sd)", "tuned (mean ± sd)",
         "tuned − default, paired", "n_components chosen", "ε spent per draw", "s per draw", "draws"], rows)
    sittings = sorted({_sitting(r) for r in results})
    sitting_lines = "\n".join(
        f"* {s}: " + ", ".join(f"{r['name']} {r['dp_data']}" for r in results if _sitting(r) == s) for s in sittings)
    facts = machine_facts(1)
    facts["date"] += " (written)"
    del facts["load average at start"]  # per sitting, below; the load when written is the file's last fact
    facts = {**facts, "draws": f"{draws} this run (per row: column draws)",
             "grid": ", ".join(map(str, GRID)) + " (capped at p)",
             "cross-validation": "3-fold GridSearchCV on the release, refit on all of it",
             "test accuracy": "on the private test split (30 %, stratified, split seed 0; mnist12k: MNIST's "
                              "10 000 test rows): reported, never chosen on",
             "sittings": f"{len(sittings)} (listed below: the rows were not all measured in one sitting)"
                         if len(sittings) > 1 else "1"}
    return write_report("tuning", "Tuning n_components on a DP release (nothing spent) against the default",
                        facts, [("Results", table), ("Sittings", sitting_lines),
                                ("Raw results", "```\n" + repr(results) + "\n```")])


if __name__ == "__main__":
    main()
