"""Run reports (face layer): the owner's ``report.json`` and ``report.md``, the few lines the
console ends a run with (:func:`console_summary`), and the publishable ``PRIVACY.md`` and
``dp_rows.png``.

The report is computed on private rows (accuracy on the private test split, membership metrics,
distances, timings): it is written to the owner's folder and is never published. What may be
published goes to the public folder: the privacy statement of the settings used (with the
privacy ledger's total) and a plot of DP rows (noisy or fabricated) only. No picture of real
rows is made anywhere. Plots use matplotlib's Agg backend (files only, no screen).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from kahm_dask.pipeline.runs.layout import DISTANCES_PLOT, DP_ROWS_PLOT, REPORT_JSON, REPORT_MD, STATEMENT_FILE
from kahm_dask.report.pictures import ClassSummary, class_story, image_shape_of, png_bytes
from kahm_dask.storage.atomic import write_bytes_atomic, write_json_atomic, write_text_atomic

__all__ = ["write_report", "write_privacy_statement", "ledger_markdown", "console_summary"]

def _plot_dp_rows(path: Path, summary: ClassSummary, epsilon: float, p: int) -> None:
    """The publishable picture of the release (:func:`~kahm_dask.report.pictures.class_story`):
    single DP rows beside each class's mean of DP rows; no real row is drawn."""
    fig = class_story(summary, epsilon=epsilon, image_shape=image_shape_of(p))
    write_bytes_atomic(path, png_bytes(fig))


def _plot_histograms(path: Path, d_train: np.ndarray, d_test: np.ndarray) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    finite = np.concatenate([d_train, d_test])
    finite = finite[np.isfinite(finite)]
    bins = np.linspace(finite.min(), np.quantile(finite, 0.995), 50) if finite.size else 10
    ax.hist(d_train[np.isfinite(d_train)], bins=bins, alpha=0.6, density=True, label="training rows (members)")
    ax.hist(d_test[np.isfinite(d_test)], bins=bins, alpha=0.6, density=True, label="test rows (non-members)")
    ax.set_xlabel("min over classes of Γ")
    ax.set_ylabel("density")
    ax.set_title("owner only: distances of private rows", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _budget_text(ledger: dict) -> str:
    budget = ledger.get("budget")
    return "no budget set" if budget is None else f"budget (ε, δ) = ({budget[0]:g}, {budget[1]:g})"


def ledger_markdown(ledger: dict | None) -> str:
    """The privacy ledger's total (a ``PrivacyLedger.summary()``) as a markdown section."""
    if not ledger:
        return ""
    return (
        "## Privacy spent on this data set\n\n"
        f"{ledger['releases']} release(s) recorded in the data set's privacy ledger; total by basic "
        f"composition: ε = {ledger['epsilon_total']:g}, δ = {ledger['delta_total']:g} per entry "
        f"({_budget_text(ledger)}).\n"
    )


def write_privacy_statement(public: Path, statement_markdown: str, ledger: dict | None = None) -> Path:
    """Write ``public/PRIVACY.md``: the statement, the ledger's total and what the folder holds."""
    public = Path(public)
    public.mkdir(parents=True, exist_ok=True)
    text = "\n".join([
        statement_markdown.rstrip("\n"),
        "",
        ledger_markdown(ledger).rstrip("\n"),
        "",
        "## This folder",
        "",
        "It may be published: `model.zarr` (the DP rows and the models fitted on them), this "
        f"statement and `{DP_ROWS_PLOT}` (DP rows only). Everything computed on the "
        "private rows (the report, accuracy, membership metrics, distances, predictions, the "
        "data and work stores) is in the run's `owner/` folder, which stays with the data owner.",
        "",
    ])
    path = public / STATEMENT_FILE
    write_text_atomic(path, text)
    return path


#: The results a report prints, each with its meaning in one line (``{n_test}``, ``{n_train}``:
#: the row counts; docs/privacy.md#measuring-membership-risk explains the membership metrics).
RESULTS = {
    "accuracy": "share of the {n_test} test rows whose class is predicted correctly",
    "site_wins": "test rows each site answered with the smallest distance (federated)",
    "attack_auc": "membership attack (a small distance says 'member'): ROC AUC over training rows (members) "
                  "and test rows (non-members); 0.5 is chance, 1 a perfect attack",
    "attack_auc_mean": "the attack's AUC averaged over the sites, weighted by their members (federated)",
    "attack_advantage": "the attack's best true-positive rate minus false-positive rate; 0: no advantage",
    "attack_tpr_at_1pct_fpr": "share of members the attack finds while flagging at most 1 % of non-members",
    "attack_tpr_at_0_1pct_fpr": "the same at 0.1 % of non-members",
    "mis": "membership-inference score: how far apart the distance distributions of members and non-members "
           "are (LSDD, in the squared units of the distances; 0: identical)",
    "mis_norm": "mis on distances divided by their pooled median: comparable across data sets and models",
    "worst_site": "the site whose members the attack tells apart best (federated)",
    "n_train_used": "training rows the membership metrics used (members)",
    "n_infinite": "rows at an infinite distance, left out of mis",
    "median_distance": "the pooled median distance mis_norm divides by",
}
#: Fields of report.json that are settings (printed apart from the results).
SETTINGS = ("epsilon", "record_epsilon", "delta", "d", "d_raw", "bounds", "bounds_raw", "bounds_source", "dp_data",
            "r_source", "cluster_on", "budget", "n_components", "n_layers", "seed", "n_sites", "split",
            "classes_per_site", "alpha", "split_seed", "pin_sites")
#: Where the run wrote what (printed last).
PATHS = ("public_dir", "owner_dir", "model_store", "dashboard")


def _cell(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        text = ", ".join(_cell(x) for x in v)
        if len(text) <= 80:
            return text
        numbers = all(isinstance(x, int | float) for x in v)
        return f"{len(v)} values, {_cell(min(v))} to {_cell(max(v))}" if numbers else text[:77] + "..."
    return str(v)


def _results(metrics: dict) -> list[str]:
    lines = ["## Results (owner only: computed on the private rows)", "", "| result | value | what it means |",
             "|---|---|---|"]
    counts = {"n_test": metrics.get("n_test", "?"), "n_train": metrics.get("n_train", "?")}
    for key, meaning in RESULTS.items():
        if key not in metrics:
            continue
        value = metrics[key]
        if value is None and key.startswith("attack_tpr"):
            rate, need = ("0.1 %", 1000) if "0_1pct" in key else ("1 %", 100)
            value_text = f"not resolved ({metrics.get('n_test', '?')} non-members; {rate} needs ≥ {need})"
        else:
            value_text = _cell(value)
        lines.append(f"| {key} | {value_text} | {meaning.format(**counts)} |")
    return lines


#: Separates a stage of the fit from the fit in :func:`_stage_seconds`' names ("fit: noise").
_WITHIN = ": "


def _stage_seconds(metrics: dict) -> dict[str, float]:
    """The run's stage timings in seconds, in run order: ingest, fit, the fit's own stages (named
    ``fit: <stage>``), then the other ``*_seconds`` fields (predict, evaluate)."""
    seconds = {k[: -len("_seconds")]: v for k, v in metrics.items() if k.endswith("_seconds") and k != "fit_seconds"}
    stages = metrics.get("fit_stage_seconds") or {}
    ordered = {"ingest": seconds.pop("ingest", None), "fit": metrics.get("fit_seconds"),
               **{f"fit{_WITHIN}{k}": v for k, v in stages.items()}, **seconds}
    return {name: v for name, v in ordered.items() if v is not None and not isinstance(v, list | dict)}


def _timings(metrics: dict) -> list[str]:
    lines = ["## Timings (seconds)", "", "| stage | seconds |", "|---|---|"]
    return lines + [f"| {name} | {_cell(value)} |" for name, value in _stage_seconds(metrics).items()]


def _timings_line(metrics: dict) -> str:
    """The stage timings on one line, the fit's own stages in brackets after it."""
    parts: list[str] = []
    for name, value in _stage_seconds(metrics).items():
        if _WITHIN in name:
            inner = f"{name.split(_WITHIN, 1)[1].replace('_', ' ')} {value:.1f}"
            parts[-1] = f"{parts[-1][:-1]}, {inner})" if parts[-1].endswith(")") else f"{parts[-1]} ({inner})"
        else:
            parts.append(f"{name} {value:.1f} s")
    return "Timings: " + ", ".join(parts)


def _settings(metrics: dict) -> list[str]:
    lines = ["## Settings", "", "| setting | value |", "|---|---|"]
    sizes = (f"{metrics.get('n_train')} training rows, {metrics.get('n_test')} test rows, "
             f"{metrics.get('n_features')} features")
    lines.append(f"| data | {sizes} |")
    for key in SETTINGS:
        if key in metrics and not isinstance(metrics[key], dict):
            lines.append(f"| {key} | {_cell(metrics[key])} |")
    lines.append(f"| clusters | {metrics.get('n_clusters')} ({metrics.get('n_clusters_resumed', 0)} resumed) |")
    return lines


def _ledger_spent(ledger: dict) -> str:
    """A ledger's total (a ``PrivacyLedger.summary()``) in a few words, for the console."""
    return (f"ε = {ledger['epsilon_total']:g}, δ = {ledger['delta_total']:g} per entry in total over "
            f"{ledger['releases']} release(s), {_budget_text(ledger)}")


def _spend_line(metrics: dict) -> str:
    """The run's privacy on one line: the ε (and δ) its models were trained at, and the total
    of the training rows' privacy ledger (each site's in a federated run); or that a non-private
    run has no guarantee."""
    if metrics.get("epsilon") is None:
        return "Privacy: non-private run, no DP guarantee (nothing recorded in the privacy ledger)."
    delta = f", δ = {metrics['delta']:g}" if metrics.get("delta") else ""
    sites = metrics.get("site_privacy")
    trained = f"{'each site trained' if sites else 'trained'} at ε = {metrics['epsilon']:g}{delta} per entry"
    if sites:
        totals = "; ".join(f"site {q}: {_ledger_spent(p['ledger'])}" for q, p in enumerate(sites) if p.get("ledger"))
        return f"Privacy: {trained}; the sites' privacy ledgers: {totals}."
    ledger = (metrics.get("privacy") or {}).get("ledger")
    return f"Privacy: {trained}" + (f"; the rows' privacy ledger: {_ledger_spent(ledger)}." if ledger else ".")


def console_summary(metrics: dict, report_md: Path, sites_dir: Path | None = None) -> str:
    """The console's end of a run (a few lines; the full report is ``report_md``): the accuracy
    on the test rows (computed on private rows: owner only), the stage timings, the privacy
    spent (:func:`_spend_line`), where the publishable and the owner's folders are and what
    each may do (``sites_dir``: a federated run's site folders), and where the full report is."""
    private = metrics.get("epsilon") is not None
    lines = [
        f"Accuracy {_cell(metrics.get('accuracy'))} on the {metrics.get('n_test', '?')} test rows "
        "(owner only: computed on the private rows).",
        _timings_line(metrics),
        _spend_line(metrics),
    ]
    if metrics.get("public_dir"):
        lines.append(f"Public folder (may be published: DP model store, PRIVACY.md): {metrics['public_dir']}")
    if sites_dir is not None:
        public = "its public/ may be published (DP model store, PRIVACY.md), " if private else ""
        lines.append(f"Site folders (site{{q}}/: {public}its owner/ and answers/ stay at site q): {sites_dir}")
    if metrics.get("owner_dir"):
        central_model = not private and sites_dir is None  # a non-private central model stays here
        held = f"data, work, {'model store, ' if central_model else ''}report, predictions"
        lines.append(f"Owner folder (keep with the data owner: {held}): {metrics['owner_dir']}")
    lines.append(f"Full report (owner only; --full-report prints it): {report_md}")
    return "\n".join(lines)


def write_report(
    out: Path,
    metrics: dict,
    *,
    plots: bool = True,
    dp_rows: ClassSummary | None = None,
    d_train: np.ndarray | None = None,
    d_test: np.ndarray | None = None,
    statement_markdown: str | None = None,
    public_dir: Path | None = None,
) -> str:
    """Write ``out/report.json`` and ``out/report.md`` (``out``: the owner's folder); return the
    markdown text. The markdown gives the results (each explained in a line), the timings, the
    settings, the privacy statement and where things are, in that order. With ``public_dir`` (a
    DP run), the picture of ``dp_rows`` (single DP rows and each class's mean of DP rows) goes
    there and the report says which folder is which."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / REPORT_JSON, metrics, indent=2, default=_jsonable)
    lines = [f"# kahm-dask run: {metrics.get('name', '')}", ""]
    if public_dir is None and metrics.get("epsilon") is None and metrics.get("record_epsilon") is None:
        lines += [
            "Non-private run: no DP guarantee. The model store is fitted on the private rows; "
            f"it and this report stay with the data owner ({out}).",
            "",
        ]
    lines += _results(metrics) + [""] + _timings(metrics) + [""] + _settings(metrics)
    if statement_markdown:
        lines += ["", statement_markdown.rstrip("\n")]
        ledger = (metrics.get("privacy") or {}).get("ledger")
        if ledger:
            lines += ["", ledger_markdown(ledger).rstrip("\n")]
    if plots and d_train is not None and d_test is not None and len(d_train) and len(d_test):
        _plot_histograms(out / DISTANCES_PLOT, d_train, d_test)
        lines += ["", "## Distances, members vs non-members (owner only)", "", f"![distances]({DISTANCES_PLOT})"]
    if plots and dp_rows and dp_rows.counts and public_dir is not None:
        public_dir = Path(public_dir)
        public_dir.mkdir(parents=True, exist_ok=True)
        _plot_dp_rows(public_dir / DP_ROWS_PLOT, dp_rows, metrics["epsilon"], int(metrics["n_features"]))
        rel = os.path.relpath(public_dir / DP_ROWS_PLOT, out)
        lines += ["", "## DP rows (public)", "", f"![DP rows]({rel})"]
    if public_dir is not None:
        lines += [
            "",
            "## Folders",
            "",
            f"- `{Path(public_dir).name}/` ({public_dir}): **may be published**: `model.zarr` (DP rows "
            f"and models fitted on them), `{STATEMENT_FILE}`, `{DP_ROWS_PLOT}` (DP rows only).",
            f"- `{out.name}/` ({out}): **stays with the data owner** (folders 0700, files 0600): this report, "
            "`report.json`, `distances.png`, `predictions.zarr`, `data/`, `work/`: everything computed on "
            "private rows (accuracy on the private test split, membership metrics, distances, timings).",
        ]
    paths = [f"- {key}: {metrics[key]}" for key in PATHS if metrics.get(key)]
    if paths:
        lines += ["", "## Paths", "", *paths]
    text = "\n".join(lines) + "\n"
    write_text_atomic(out / REPORT_MD, text)
    return text


def _jsonable(v):
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    raise TypeError(f"not JSON serialisable: {type(v)}")
