"""The quality report of a DP release: one self-contained HTML file (pictures inline as base64
PNG), every score explained in a line, every section labelled *publishable* or *owner only*.

Publishable sections read only the DP rows, their labels and public settings (the privacy
statement, the bounds, an audit of the mechanism); owner-only sections compare the DP rows with
the private rows (:mod:`kahm_dask.report.metrics`). The file holds owner-only sections, so it is
written owner-only (0600), atomically.
"""

from __future__ import annotations

import base64
import html
import math
import os
import warnings
from pathlib import Path

import numpy as np

from kahm_dask._version import __version__
from kahm_dask.privacy.bounds import public_bounds
from kahm_dask.report import metrics, pictures
from kahm_dask.storage.atomic import write_text_atomic

__all__ = ["write_quality_report", "PUBLISHABLE", "OWNER_ONLY", "MEANINGS"]

PUBLISHABLE = "Publishable"
OWNER_ONLY = "Owner only"
TSTR, TRTR = "DP rows (TSTR)", "real rows (TRTR)"

#: Each score of the report with its meaning in one line.
MEANINGS = {
    "marginal similarity": "per feature, 1 − the largest gap between the real and DP cumulative distributions "
                           "(KS complement; TV complement, 1 − half the summed share gaps, for discrete features); "
                           "1 best, 0 disjoint",
    "correlation similarity": "mean over feature pairs of 1 − |ρ_real − ρ_DP| / 2; 1 the same correlations, "
                              "0 every one reversed",
    "correlation attenuation": "slope of the DP correlations on the real ones; 1 kept, below 1 shrunk by the noise",
    "boundary adherence": "share of DP values inside the real rows' [min, max] of their feature; 1 best",
    "detection AUC": "how well a logistic regression on the features and their squares tells real rows from "
                     "DP rows (5-fold cross-validation, seeded); 0.5 best (indistinguishable), 1 fully separable",
    "within public bounds": "share of DP values inside the public bounds (the noise is added after clipping, "
                            "so noisy rows leave them)",
    "accuracy": "share of the test rows predicted right",
    "recall": "per class: share of the class's test rows predicted as that class",
}

_SCRIPT = """<script>
// Marks the report for a headless check: how many pictures failed to load.
window.addEventListener("load", () => {
  const broken = [...document.images].filter(i => !i.complete || i.naturalWidth === 0).length;
  document.body.setAttribute("data-images", String(document.images.length));
  document.body.setAttribute("data-broken-images", String(broken));
});
</script>"""

_STYLE = """<style>
body { font: 14px/1.45 system-ui, sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }
section { border-left: 6px solid #999; padding: 0.2em 1em; margin: 1.5em 0; }
section.publishable { border-color: #2a7d2a; } section.owner { border-color: #b03030; }
.label { font-weight: bold; padding: 0.1em 0.5em; border-radius: 3px; color: white; font-size: 12px; }
.publishable .label { background: #2a7d2a; } .owner .label { background: #b03030; }
table { border-collapse: collapse; margin: 0.5em 0; } td, th { border: 1px solid #ccc; padding: 2px 8px; }
th { background: #f2f2f2; text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1em 0; } figure img { max-width: 100%; } figcaption { font-size: 13px; color: #444; }
</style>"""


def write_quality_report(
    path: str | os.PathLike,
    *,
    real_X: np.ndarray,
    real_y: np.ndarray,
    dp_X: np.ndarray,
    dp_y: np.ndarray,
    test_X: np.ndarray,
    test_y: np.ndarray,
    statement,
    bounds,
    feature_names: list[str] | None = None,
    image_shape: tuple[int, int] | None = None,
    audit: dict | None = None,
) -> Path:
    """Write the quality report of the DP rows ``dp_X`` (N_d, p), ``dp_y`` (N_d,) released from the
    private rows ``real_X`` (N, p), ``real_y`` (N,), tested on ``test_X`` (N_t, p), ``test_y`` (N_t,).

    ``statement``: the release's :class:`~kahm_dask.privacy.statement.PrivacyStatement` (every
    field it has is shown); ``bounds``: the public ``(lower, upper)``; ``feature_names``: p names
    (default ``x0``…); ``image_shape``: (h, w) with h·w = p to draw rows as images; ``audit``: a
    lower bound on ε from an audit of the mechanism, shown as given. Inputs are checked before
    anything is computed or written (``ValueError`` or ``TypeError`` naming the problem).
    Returns the path, a 0600 file. Scores are deterministic (every split and subset is seeded;
    the noise is in the given DP rows).
    """
    if not callable(getattr(statement, "to_dict", None)):
        raise TypeError(f"statement must be the release's PrivacyStatement, got {type(statement).__name__}.")
    real_X, dp_X, test_X = (_rows(a, name) for a, name in ((real_X, "real_X"), (dp_X, "dp_X"), (test_X, "test_X")))
    real_y, dp_y, test_y = (np.asarray(v) for v in (real_y, dp_y, test_y))
    p = real_X.shape[1]
    _check_inputs(real_X, real_y, dp_X, dp_y, test_X, test_y, feature_names, image_shape)
    lower, upper = public_bounds(bounds, p)
    names = list(feature_names) if feature_names is not None else [f"x{j}" for j in range(p)]
    body = [f"<h1>Quality report of a DP release</h1><p>{p} features; {len(dp_X)} DP rows released from "
            f"{len(real_X)} private rows; {len(test_X)} test rows. Made by kahm-dask {__version__}.</p>",
            "<p><b>This file holds owner-only sections: keep it with the data owner.</b> Only the sections "
            f"marked <i>{PUBLISHABLE}</i> may be copied out and published.</p>"]
    body.append(_privacy_section(statement, audit))
    summary = pictures.ClassSummary.from_rows(dp_X, dp_y)  # DP rows only: what the publishable picture shows
    body.append(_dp_rows_section(dp_X, dp_y, lower, upper, statement, image_shape, summary))
    body.append(_fidelity_section(real_X, real_y, dp_X, names, summary, image_shape))
    body.append(_efficacy_section(real_X, real_y, dp_X, dp_y, test_X, test_y))
    page = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>DP release quality report"
            f"</title>{_STYLE}</head><body>\n" + "\n".join(body) + f"\n{_SCRIPT}\n</body></html>\n")
    return write_text_atomic(path, page, mode=0o600)


def _rows(a, name: str) -> np.ndarray:
    try:
        a = np.asarray(a, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a numeric (rows, features) array.") from None
    if a.ndim != 2 or a.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty (rows, features) array, got shape {a.shape}.")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} holds NaN or infinite values.")
    return a


def _check_inputs(real_X, real_y, dp_X, dp_y, test_X, test_y, feature_names, image_shape) -> None:
    p = real_X.shape[1]
    for name, X, y, y_name in (("real_X", real_X, real_y, "real_y"), ("dp_X", dp_X, dp_y, "dp_y"),
                               ("test_X", test_X, test_y, "test_y")):
        if X.shape[1] != p:
            raise ValueError(f"{name} has {X.shape[1]} features, real_X has {p}.")
        if y.shape != (X.shape[0],):
            raise ValueError(f"{y_name} must hold one label per row of {name} ({X.shape[0]}), got shape {y.shape}.")
    unknown = np.setdiff1d(np.unique(test_y), np.unique(real_y))
    if unknown.size:
        raise ValueError(f"test_y has classes not in real_y: {unknown.tolist()}.")
    if feature_names is not None and len(feature_names) != p:
        raise ValueError(f"feature_names has {len(feature_names)} names for {p} features.")
    if image_shape is not None and (len(image_shape) != 2 or math.prod(image_shape) != p):
        raise ValueError(f"image_shape {tuple(image_shape)} does not hold {p} features.")


# --------------------------------------------------------------------------- pieces of the page


def _section(label: str, title: str, parts: list[str]) -> str:
    kind = "publishable" if label == PUBLISHABLE else "owner"
    why = ("computed from the DP rows and public settings only: may be published" if label == PUBLISHABLE
           else "computed against the private rows: never publish")
    return (f'<section class="{kind}" data-label="{label}"><h2>{html.escape(title)} '
            f'<span class="label">{label}</span></h2><p><i>{why}.</i></p>' + "".join(parts) + "</section>")


def _figure(fig, label: str, caption: str) -> str:
    data = base64.b64encode(pictures.png_bytes(fig)).decode("ascii")
    return (f'<figure data-label="{label}"><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption><b>{label}.</b> {html.escape(caption)}</figcaption></figure>")


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(_td(v) for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _td(v) -> str:
    if isinstance(v, float | np.floating):
        return f'<td class="num">{v:.4g}</td>'
    if isinstance(v, int | np.integer):
        return f'<td class="num">{v}</td>'
    return f"<td>{html.escape(str(v))}</td>"


def _value(v) -> str:
    if isinstance(v, list | tuple | np.ndarray):
        values = list(np.ravel(v)) if isinstance(v, np.ndarray) else list(v)
        if len(values) > 6 and all(isinstance(x, int | float | np.number) for x in values):
            return f"{len(values)} values, {min(values):g} to {max(values):g}"
        return "; ".join(_value(x) for x in values) if values else "none"
    if isinstance(v, dict):
        return ", ".join(f"{k} = {_value(x)}" for k, x in v.items())
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _privacy_section(statement, audit: dict | None) -> str:
    fields = statement.to_dict()
    mechanism = fields.get("mechanism", {})
    headline = [["ε per entry", _value(mechanism.get("epsilon")),
                 "privacy loss for a change of one entry by at most d"]]
    per_record = getattr(statement, "epsilon_per_record", None)
    if per_record is not None:
        headline.append([f"ε per record (δ = {_value(per_record.delta)})", _value(per_record.pld),
                         "a whole row changes up to p entries: the exact composition of their losses "
                         "(privacy loss distribution), an upper bound"])
        headline.append(["ε per record (p·ε)", _value(per_record.basic),
                         "the same by basic composition: the plain sum of the losses, a looser bound"])
    for key, value in fields.items():  # every per-record field a statement has (e.g. a tighter accountant's)
        if "record" in key and value is not None and not isinstance(value, dict):
            headline.append([key.replace("_", " "), _value(value), "as stated by the privacy statement"])
    headline += [
        ["δ", _value(mechanism.get("delta")), "probability that an entry is released without noise"],
        ["d", _value(mechanism.get("d")), "largest change of one entry the guarantee covers"],
        ["bounds", f"[{_value(mechanism.get('lower'))}] to [{_value(mechanism.get('upper'))}]",
         "public bounds every entry is clipped to before the noise"],
        ["mechanism", _value(mechanism.get("mechanism")), "how the noise is added"],
        ["guarantee holds", _value(fields.get("holds")), "False only when the noise was seeded (tests)"],
    ]
    parts = [_table(["", "value", "what it means"], headline)]
    if audit is not None:
        parts.append("<h3>Audit of the mechanism</h3><p>A lower bound on ε measured by attacking the mechanism's "
                     "outputs: the stated ε must not be below it.</p>"
                     + _table(["field", "value"], [[k, _value(v)] for k, v in audit.items()]))
    parts.append("<h3>Every field of the statement</h3>"
                 + _table(["field", "value"], [[k, _value(v)] for k, v in _flatten(fields).items()]))
    return _section(PUBLISHABLE, "Privacy", parts)


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _epsilon(statement) -> float:
    return float(statement.to_dict()["mechanism"]["epsilon"])


def _dp_rows_section(dp_X, dp_y, lower, upper, statement, image_shape, summary) -> str:
    """Publishable: reads the DP rows, their labels and public settings only (never ``real_X``)."""
    classes, counts = np.unique(dp_y, return_counts=True)
    balance = _table(["class", "DP rows", "share"],
                     [[str(c), int(n), float(n / len(dp_y))] for c, n in zip(classes, counts, strict=True)])
    within = metrics.dp_within_bounds(dp_X, lower, upper)
    parts = [
        "<h3>Label balance</h3><p>Rows per class (the labels are released as they are).</p>", balance,
        "<p>" + html.escape(f"Within public bounds: {within.mean():.3f} on average, {within.min():.3f} for the "
                            f"worst feature ({MEANINGS['within public bounds']}).") + "</p>",
    ]
    story = pictures.class_story(summary, epsilon=_epsilon(statement), image_shape=image_shape)
    parts.append(_figure(story, PUBLISHABLE, "Single DP rows and the mean of each class's DP rows: single rows "
                         "hide the data, class means keep what tells the classes apart."))
    parts.append(_figure(pictures.dp_quantile_bands(dp_X, lower, upper), PUBLISHABLE,
                         "Per-feature distribution of the DP rows (quantile bands and median) with the public "
                         "bounds."))
    return _section(PUBLISHABLE, "The DP rows", parts)


def _fidelity_section(real_X, real_y, dp_X, names: list[str], summary, image_shape) -> str:
    kinds = metrics.feature_kinds(real_X)
    marginal = metrics.marginal_similarity(real_X, dp_X, kinds)
    adherence = metrics.boundary_adherence(real_X, dp_X)
    rho_real, rho_dp = metrics.correlations(real_X), metrics.correlations(dp_X)
    scores = [
        ["marginal similarity", float(marginal.mean()), "[0, 1], 1 best", MEANINGS["marginal similarity"]],
        ["correlation similarity", metrics.correlation_similarity(real_X, dp_X), "[0, 1], 1 best",
         MEANINGS["correlation similarity"]],
        ["correlation attenuation", metrics.correlation_attenuation(real_X, dp_X), "1 best",
         MEANINGS["correlation attenuation"]],
        ["boundary adherence", float(adherence.mean()), "[0, 1], 1 best", MEANINGS["boundary adherence"]],
        ["detection AUC", metrics.detection_auc(real_X, dp_X), "[0, 1], 0.5 best", MEANINGS["detection AUC"]],
    ]
    worst = np.argsort(marginal, kind="stable")[:10]
    parts = [
        "<h3>Scores</h3>", _table(["score", "value", "range", "what it means"], scores),
        "<h3>Features with the least similar marginals</h3>",
        _table(["feature", "kind", "marginal similarity", "boundary adherence"],
               [[names[j], str(kinds[j]), float(marginal[j]), float(adherence[j])] for j in worst]),
    ]
    if image_shape is not None:  # the publishable picture's DP rows beside real rows of the same classes
        real = pictures.real_sample(real_X, real_y, list(summary.means())[:10], k=summary.k)
        parts.append(_figure(pictures.real_rows_beside_dp(summary, real, image_shape), OWNER_ONLY,
                             "Real rows beside the DP rows: the single DP rows of the publishable picture (left) "
                             "and real rows of the same classes (right, red). The real rows are private: owner "
                             "only, never published."))
    informative = _informative(real_X, real_y)
    parts.append(_figure(pictures.marginals(real_X, dp_X, informative, names, marginal), OWNER_ONLY,
                         "Real vs DP distribution of the features that tell the classes apart best (largest "
                         "F statistic on the real rows), titled with their marginal similarity."))
    parts.append(_figure(pictures.correlation_heatmaps(rho_real, rho_dp), OWNER_ONLY,
                         "Pearson correlations of the real rows (left) and of the DP rows (right); grey: a "
                         "constant feature."))
    return _section(OWNER_ONLY, "Fidelity: DP rows against the private rows", parts)


def _informative(real_X: np.ndarray, real_y: np.ndarray, k: int = 6) -> list[int]:
    """The k features with the largest ANOVA F statistic over the classes (constant ones left out)."""
    from sklearn.feature_selection import f_classif

    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # constant features: their F is NaN, left out below
        f, _ = f_classif(real_X, real_y)
    f = np.nan_to_num(f, nan=-1.0)
    return [int(j) for j in np.argsort(-f, kind="stable")[:k]]


def _efficacy_section(real_X, real_y, dp_X, dp_y, test_X, test_y) -> str:
    table = metrics.efficacy({TSTR: (dp_X, dp_y), TRTR: (real_X, real_y)}, test_X, test_y)
    classes = table[0].classes
    rows = [[r.model, r.trained_on, r.accuracy, *[float(v) for v in r.recall]] for r in table]
    parts = [
        "<p>" + html.escape(
            "Train on synthetic, test on real (TSTR): each model trained on the DP rows, tested on the test rows, "
            "beside the same model trained on the real rows (TRTR). The KAHM is fitted without further noise: "
            f"fitting on DP rows is post-processing. Accuracy: {MEANINGS['accuracy']}; recall: {MEANINGS['recall']}."
        ) + "</p>",
        _table(["model", "trained on", "accuracy", *[f"recall {c}" for c in classes]], rows),
        _figure(pictures.efficacy_bars(table), OWNER_ONLY,
                "Test accuracy of each model trained on the DP rows (TSTR) and on the real rows (TRTR)."),
    ]
    return _section(OWNER_ONLY, "Machine-learning efficacy (TSTR vs TRTR)", parts)
