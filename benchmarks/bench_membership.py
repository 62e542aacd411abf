"""Membership metric benchmark: ``mis`` / ``mis_norm`` (LSDD) before and after the eigenbasis CV.

Times the solve-based implementation this replaced (``benchmarks/_membership_reference.py``:
99 Cholesky solves per LSDD call, two independent LSDD calls) against
``membership_inference_from_distances`` (one ``eigh`` per sigma, closed form over all lambdas,
one shared pass for ``mis`` and ``mis_norm``) on 1-D distances shaped like real ones (positive,
right-skewed, members a little closer, a few ``+inf``) of

* the quickstart's size: 1257 member and 540 non-member distances;
* MNIST's size: 60 000 member and 10 000 non-member distances.

Old and new run in alternation, ``--repeat`` times each after one warm-up, with a fixed BLAS
thread count; the table gives the best and the median wall time, the process CPU time of the
best run, and the ratios old/new of the same run. Every run's values are checked: the same
(sigma, lambda) selected for ``mis`` and for ``mis_norm``, and both estimates within
``l2_agreement_bound`` of the reference (the bound the tests use). Writes
``benchmarks/results/membership.md``.

    python -m benchmarks.bench_membership [--repeat 7] [--mnist-repeat 3] [--blas-threads 1]

About 30 s on this 2-core machine with one BLAS thread (most of it the old code on MNIST size).
"""

from __future__ import annotations

import argparse
import os
import statistics

import numpy as np

from benchmarks._harness import blas_threads_loaded, machine_facts, markdown_table, timed_cpu, write_report
from benchmarks._membership_reference import (
    _sigma_scale,
    kernel_perturbation_bound,
    l2_agreement_bound,
    reference_mis,
    sigma_perturbation_bound,
)
from kahm_dask._random import as_generator, as_seed_sequence, child_seed_sequence
from kahm_dask.privacy.lsdd import MEDIAN_STREAM, lsdd_runs
from kahm_dask.privacy.membership import LSDD_STREAM, membership_inference_from_distances

SEED = 0
CASES = {
    # name: (members, non-members, +inf among members, +inf among non-members)
    "quickstart size": (1257, 540, 3, 2),
    "MNIST size": (60_000, 10_000, 30, 10),
}


def distances(n_train: int, n_test: int, inf_train: int, inf_test: int, seed: int = SEED):
    """Positive, right-skewed distances; members a little closer; a few ``+inf``."""
    rng = np.random.default_rng([500, seed])

    def skewed(n: int, scale: float) -> np.ndarray:
        return scale * rng.gamma(2.0, 1.0, n) * rng.lognormal(0.0, 0.4, n)

    d_tr, d_te = skewed(n_train, 0.9), skewed(n_test, 1.0)
    d_tr[rng.choice(n_train, inf_train, replace=False)] = np.inf
    d_te[rng.choice(n_test, inf_test, replace=False)] = np.inf
    return d_tr, d_te


def check_agreement(d_tr: np.ndarray, d_te: np.ndarray, new, ref) -> dict[str, float]:
    """Raise unless the new report agrees with the reference's: same (sigma, lambda) for both
    runs, ``|mis - mis_ref|`` and ``|mis_norm - mis_norm_ref|`` within ``l2_agreement_bound``.
    Returns the differences and the bounds."""
    ref_raw, ref_norm, median = ref
    if new.median_distance != median:
        raise AssertionError(f"pooled median {new.median_distance} != {median}")
    lsdd_seed = child_seed_sequence(as_seed_sequence(SEED), LSDD_STREAM)
    a, b = d_tr[np.isfinite(d_tr)], d_te[np.isfinite(d_te)]
    raw, norm = lsdd_runs(a, b, (1.0, median), random_state=lsdd_seed)
    if (new.mis, new.mis_norm) != (raw.l2, norm.l2):
        raise AssertionError("membership_inference_from_distances differs from its own LSDD runs")
    # the sigma grid: the reference's median pairwise distance times SIGMA_FACTORS
    median_rng = as_generator(child_seed_sequence(lsdd_seed, MEDIAN_STREAM))
    scale = _sigma_scale(np.concatenate([a, b])[:, None], 2000, median_rng)
    R = max(a.max(), b.max()) / median
    rho_sigma = sigma_perturbation_bound(R, scale / median)
    same = (
        (raw.sigma, raw.lambda_) == (ref_raw.sigma, ref_raw.lambda_)
        and norm.lambda_ == ref_norm.lambda_
        and abs(norm.sigma / ref_norm.sigma - 1.0) <= rho_sigma
    )
    if not same:
        raise AssertionError(f"selected pairs differ: new {raw}, {norm}; reference {ref_raw}, {ref_norm}")
    bound_raw = l2_agreement_bound(a, b, ref_raw.sigma, ref_raw.lambda_, random_state=lsdd_seed)
    rho = kernel_perturbation_bound(rho_sigma, R, ref_norm.sigma)
    bound_norm = l2_agreement_bound(
        a / median, b / median, ref_norm.sigma, ref_norm.lambda_, random_state=lsdd_seed, rho=rho
    )
    diff_raw, diff_norm = abs(new.mis - ref_raw.l2), abs(new.mis_norm - ref_norm.l2)
    if diff_raw > bound_raw or diff_norm > bound_norm:
        raise AssertionError(f"mis off by {diff_raw} (bound {bound_raw}), mis_norm by {diff_norm} (bound {bound_norm})")
    return {
        "sigma": raw.sigma,
        "lambda": raw.lambda_,
        "sigma_norm": norm.sigma,
        "lambda_norm": norm.lambda_,
        "mis": new.mis,
        "mis_norm": new.mis_norm,
        "diff_raw": diff_raw,
        "bound_raw": bound_raw,
        "diff_norm": diff_norm,
        "bound_norm": bound_norm,
    }


def run_case(name: str, repeat: int) -> dict:
    d_tr, d_te = distances(*CASES[name])

    def old():
        return reference_mis(d_tr, d_te, random_state=SEED)

    def new():
        return membership_inference_from_distances(d_tr, d_te, random_state=SEED)

    load_start = os.getloadavg()
    check = check_agreement(d_tr, d_te, new(), old())  # also the warm-up
    walls: dict[str, list[float]] = {"old": [], "new": []}
    cpus: dict[str, list[float]] = {"old": [], "new": []}
    for _ in range(repeat):
        outs = {}
        for label, fn in (("old", old), ("new", new)):
            wall, cpu, outs[label] = timed_cpu(fn)
            walls[label].append(wall)
            cpus[label].append(cpu)
        check_agreement(d_tr, d_te, outs["new"], outs["old"])
    return {
        "name": name,
        "sizes": CASES[name],
        "repeat": repeat,
        "walls": walls,
        "cpus": cpus,
        "check": check,
        "load": (load_start, os.getloadavg()),
    }


def report(results: list[dict], facts: dict[str, str]) -> None:
    rows = []
    for r in results:
        w, c = r["walls"], r["cpus"]
        best_old, best_new = min(w["old"]), min(w["new"])
        med_old, med_new = statistics.median(w["old"]), statistics.median(w["new"])
        cpu_old, cpu_new = c["old"][w["old"].index(best_old)], c["new"][w["new"].index(best_new)]
        n_tr, n_te, i_tr, i_te = r["sizes"]
        rows.append(
            [
                r["name"],
                f"{n_tr} / {n_te} ({i_tr + i_te} +inf)",
                r["repeat"],
                best_old,
                best_new,
                best_old / best_new,
                med_old,
                med_new,
                med_old / med_new,
                cpu_old / cpu_new,
                " ".join(f"{x:.2f}" for x in r["load"][0]) + " → " + " ".join(f"{x:.2f}" for x in r["load"][1]),
            ]
        )
    timing = markdown_table(
        [
            "case",
            "members / non-members",
            "runs each",
            "old best s",
            "new best s",
            "ratio best",
            "old median s",
            "new median s",
            "ratio median",
            "ratio CPU (best runs)",
            "load average (1, 5, 15 min) before → after",
        ],
        rows,
    )
    agreement = markdown_table(
        [
            "case",
            "selected σ, λ (mis)",
            "selected σ, λ (mis_norm)",
            "mis",
            "Δ mis (absolute) / bound",
            "mis_norm",
            "Δ mis_norm (absolute) / bound",
        ],
        [
            [
                r["name"],
                f"{r['check']['sigma']:.6g}, {r['check']['lambda']:.3g}",
                f"{r['check']['sigma_norm']:.6g}, {r['check']['lambda_norm']:.3g}",
                r["check"]["mis"],
                f"{r['check']['diff_raw']:.2g} / {r['check']['bound_raw']:.2g}",
                r["check"]["mis_norm"],
                f"{r['check']['diff_norm']:.2g} / {r['check']['bound_norm']:.2g}",
            ]
            for r in results
        ],
    )
    notes = "\n".join(
        [
            "* **old**: `benchmarks/_membership_reference.py`, the solve-based code this replaced "
            "(per LSDD call: the median of all pairwise distances of up to 2000 pooled points, "
            "the (n, b_c) kernel matrices per σ, 11 × 9 = 99 Cholesky solves, the kernels again "
            "for the refit; `mis` and `mis_norm` are two such calls).",
            "* **new**: `membership_inference_from_distances`: one pass for both estimates (their "
            "kernels coincide in raw units), the median of pairwise distances by a band search "
            "(same value), kernel fold sums in cache-sized blocks, one `eigh` per σ with every λ "
            "in closed form in its eigenbasis, one Cholesky refit per estimate.",
            "* Both include the input checks and dropping the `+inf` distances. Timings are wall "
            "times of single runs, old and new alternating; CPU is the process CPU time of the "
            "best run (less disturbed by other load on this shared machine).",
            "* Agreement, checked on every run: the same (σ, λ) selected as by the reference "
            "for both estimates (for `mis_norm` the σ differ by rounding: the new code divides "
            "the raw median scale by m~), and the values within `l2_agreement_bound` (a "
            "first-order worst-case bound from the conditioning of H + λI and machine epsilon, "
            "see its docstring); the table shows the last run's differences.",
        ]
    )
    path = write_report(
        "membership",
        "Membership metric (mis, mis_norm): solve-based CV vs eigenbasis CV",
        facts,
        [("Timing", timing), ("Agreement", agreement), ("What is timed", notes)],
    )
    print(timing)
    print()
    print(agreement)
    print(f"\nwrote {path}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="runs of old and new each, quickstart size")
    parser.add_argument("--mnist-repeat", type=int, default=3, help="runs of old and new each, MNIST size")
    parser.add_argument("--blas-threads", type=int, default=1)
    args = parser.parse_args(argv)
    with blas_threads_loaded(args.blas_threads):
        facts = machine_facts(args.blas_threads)
        results = [
            run_case("quickstart size", args.repeat),
            run_case("MNIST size", args.mnist_repeat),
        ]
    report(results, facts)


if __name__ == "__main__":
    main()
