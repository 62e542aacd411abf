"""Run reports: ``report.json`` (metrics) and ``report.md`` with plots (face layer).

Plots use matplotlib's Agg backend (files only, no screen). They never show private training
rows: fabricated (DP) samples are shown beside *test* rows of the same class, and distances
only as histograms.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

__all__ = ["write_report"]


def _image_side(p: int) -> int | None:
    side = math.isqrt(p)
    return side if side * side == p and side >= 4 else None


def _plot_samples(path: Path, fabricated: dict, test_rows: dict, side: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    classes = list(fabricated)[:10]
    k = 4
    fig, axes = plt.subplots(len(classes), 2 * k, figsize=(2 * k * 0.9, len(classes) * 0.95))
    axes = np.atleast_2d(axes)
    for i, c in enumerate(classes):
        for j in range(2 * k):
            ax = axes[i, j]
            rows = fabricated[c] if j < k else test_rows.get(c, np.empty((0, side * side)))
            idx = j % k
            if idx < len(rows):
                ax.imshow(rows[idx].reshape(side, side), cmap="gray_r")
            ax.set_xticks([]), ax.set_yticks([])
        axes[i, 0].set_ylabel(str(c), rotation=0, labelpad=10)
    axes[0, 0].set_title("fabricated (DP)", loc="left", fontsize=8)
    axes[0, k].set_title("test rows (not training data)", loc="left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


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
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_report(
    out: Path,
    metrics: dict,
    *,
    plots: bool = True,
    fabricated: dict | None = None,
    test_rows: dict | None = None,
    d_train: np.ndarray | None = None,
    d_test: np.ndarray | None = None,
) -> str:
    """Write ``out/report.json`` and ``out/report.md``; return the markdown text."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(metrics, indent=2, default=_jsonable))
    lines = [f"# kahm-dask run: {metrics.get('name', '')}", "", "| metric | value |", "|---|---|"]
    for k, v in metrics.items():
        if not isinstance(v, (dict, list)):
            lines.append(f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |")
    if metrics.get("epsilon") is not None:
        lines += ["", f"Privacy unit: (ε, δ) = ({metrics['epsilon']}, {metrics['delta']}) per entry of the "
                  f"data matrix for changes of at most d = {metrics['d']} (element level, ALGORITHM.md §9); "
                  "a record of p features is covered at (p·ε, p·δ)."]
    if plots and d_train is not None and d_test is not None and len(d_train) and len(d_test):
        _plot_histograms(out / "distances.png", d_train, d_test)
        lines += ["", "## Distances, members vs non-members", "", "![distances](distances.png)"]
    side = _image_side(int(metrics.get("n_features", 0)))
    if plots and fabricated and side:
        _plot_samples(out / "samples.png", fabricated, test_rows or {}, side)
        lines += ["", "## Fabricated samples", "", "![samples](samples.png)"]
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text)
    return text


def _jsonable(v):
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    raise TypeError(f"not JSON serialisable: {type(v)}")
