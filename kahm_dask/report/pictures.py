"""The quality report's pictures: each function takes arrays or score tables and returns a
matplotlib Figure (Agg backend: files only, no screen); :func:`png_bytes` renders one.

Which may be published follows from the inputs: :func:`class_story`, :func:`dp_quantile_bands`
read only DP rows and public bounds; :func:`real_rows_beside_dp`, :func:`marginals`,
:func:`correlation_heatmaps` and :func:`efficacy_bars` show the private rows or scores computed
from them (owner only).
"""

from __future__ import annotations

import io
import math

import numpy as np

__all__ = ["png_bytes", "image_shape_of", "ClassSummary", "class_story", "real_sample", "real_rows_beside_dp",
           "dp_quantile_bands", "marginals", "correlation_heatmaps", "efficacy_bars"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_bytes(fig, dpi: int = 90) -> bytes:
    """The figure as PNG bytes (no software tag, so the same figure gives the same bytes); closes it."""
    plt = _pyplot()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def image_shape_of(p: int) -> tuple[int, int] | None:
    """(side, side) when p features are a square image of side ≥ 4 (8×8 digits, 28×28 MNIST), else None."""
    side = math.isqrt(p)
    return (side, side) if side * side == p and side >= 4 else None


class ClassSummary:
    """What :func:`class_story` draws of DP rows, gathered a block of rows at a time: the first
    ``k`` rows of each class and the running mean of at most ``max_rows`` rows per class
    (enough: the noise of a mean of m rows shrinks as 1/√m).

    >>> s = ClassSummary(k=2)
    >>> s.add(7, np.ones((3, 4))); s.add(7, np.zeros((1, 4)))
    >>> s.samples[7].shape, s.counts[7], s.means()[7].tolist()
    ((2, 4), 4, [0.75, 0.75, 0.75, 0.75])
    """

    def __init__(self, k: int = 4, max_rows: int = 5000):
        self.k, self.max_rows = k, max_rows
        self.samples: dict = {}
        self.counts: dict = {}
        self._sums: dict = {}

    @classmethod
    def from_rows(cls, X: np.ndarray, y: np.ndarray, k: int = 4, seed: int = 0) -> ClassSummary:
        """From all (N, p) DP rows and their labels (every row in the means); the k rows shown per
        class are a seeded choice."""
        rng = np.random.default_rng(seed)  # which DP rows are shown: not private
        summary = cls(k, max_rows=len(y))
        for c in np.unique(y):
            rows = X[y == c]
            summary.add(c, rows[rng.permutation(len(rows))])
        return summary

    def add(self, label, rows: np.ndarray) -> None:
        """Add (n, p) DP rows of class ``label``: to its samples until it has k, to its mean until ``max_rows``."""
        rows = np.asarray(rows, dtype=np.float64)
        have = self.samples.get(label, rows[:0])
        self.samples[label] = np.vstack([have, rows[: self.k - len(have)]])
        taken = rows[: self.max_rows - self.counts.get(label, 0)]
        self._sums[label] = self._sums.get(label, 0.0) + taken.sum(axis=0)
        self.counts[label] = self.counts.get(label, 0) + len(taken)

    def means(self) -> dict:
        """label → (p,) mean of the class's DP rows added so far."""
        return {c: self._sums[c] / self.counts[c] for c in self._sums}


def class_story(summary: ClassSummary, *, epsilon: float, image_shape: tuple[int, int] | None = None):
    """The release in one publishable picture: single DP rows are unrecognisable (the privacy),
    the mean of each class's DP rows still shows the class (the utility).

    Images (``image_shape``): one line per class (at most 10), ``summary``'s single rows then the
    class mean, each group on its own colour scale. Other data: a heatmap of the class means per
    feature. Title and caption say what it shows, ε and that it may be published.
    """
    plt = _pyplot()
    means = summary.means()
    classes = list(means)[:10]
    counts = [summary.counts[c] for c in classes]
    title = f"DP rows, ε = {epsilon:g} per entry\n"
    if image_shape is None:
        fig = _story_table(plt, means, classes)
        title += "mean of each class's DP rows, per feature"
        caption = (f"Each line: the mean of one class's DP rows ({min(counts)} to {max(counts)} rows; "
                   "post-processing of the release). Drawn from DP rows only: may be published.")
    else:
        fig = _story_images(plt, summary.samples, means, classes, image_shape)
        title += "one row alone is mostly noise; the mean of a class's rows shows the class"
        k = max(len(summary.samples[c]) for c in classes)
        caption = (f"Left: {k} single DP rows per class, as released. Right: the mean of the class's DP rows "
                   f"({min(counts)} to {max(counts)} rows; post-processing). "
                   "Drawn from DP rows only: may be published.")
    fig.suptitle(title, fontsize=10, x=0.01, ha="left")
    fig.text(0.01, 0.005, caption, fontsize=7, ha="left", va="bottom", wrap=True)
    return fig


def _story_images(plt, samples: dict, means: dict, classes: list, shape: tuple[int, int]):
    k = max(len(samples[c]) for c in classes)
    single = np.concatenate([np.ravel(samples[c]) for c in classes])
    single_range = np.percentile(single, [1, 99])
    mean_all = np.concatenate([np.ravel(means[c]) for c in classes])
    mean_range = (mean_all.min(), mean_all.max())
    fig, axes = plt.subplots(len(classes), k + 1, figsize=(0.9 * (k + 1) + 2.2, 0.9 * len(classes) + 1.3),
                             squeeze=False, gridspec_kw={"wspace": 0.08, "hspace": 0.08})
    for i, c in enumerate(classes):
        for j in range(k):
            if j < len(samples[c]):
                single_image = axes[i, j].imshow(np.reshape(samples[c][j], shape), cmap="gray_r",
                                                 vmin=single_range[0], vmax=single_range[1])
        mean_image = axes[i, k].imshow(np.reshape(means[c], shape), cmap="magma_r",
                                       vmin=mean_range[0], vmax=mean_range[1])
        axes[i, 0].set_ylabel(str(c), rotation=0, labelpad=10, va="center")
    for ax in axes.ravel():
        ax.set_xticks([]), ax.set_yticks([])
    axes[0, 0].set_title("single DP rows", loc="left", fontsize=8)
    axes[0, k].set_title("class mean", fontsize=8)
    fig.subplots_adjust(left=0.07, right=0.78, top=0.9, bottom=0.07)
    bar_single = fig.add_axes((0.81, 0.09, 0.025, 0.8))
    bar_mean = fig.add_axes((0.91, 0.09, 0.025, 0.8))
    fig.colorbar(single_image, cax=bar_single).ax.tick_params(labelsize=6)
    fig.colorbar(mean_image, cax=bar_mean).ax.tick_params(labelsize=6)
    bar_single.set_title("row", fontsize=6)
    bar_mean.set_title("mean", fontsize=6)
    return fig


def _story_table(plt, means: dict, classes: list):
    table = np.vstack([means[c] for c in classes])
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(classes) + 1.6))
    image = ax.imshow(table, aspect="auto", cmap="magma_r", interpolation="nearest")
    ax.set_yticks(range(len(classes)), [str(c) for c in classes], fontsize=7)
    ax.set_xlabel("feature", fontsize=7)
    ax.set_ylabel("class", fontsize=7)
    ax.tick_params(labelsize=6)
    bar = fig.colorbar(image, ax=ax)
    bar.set_label("mean of the DP rows", fontsize=7)
    bar.ax.tick_params(labelsize=6)
    fig.subplots_adjust(top=0.8, bottom=0.2)
    return fig


def real_sample(real: np.ndarray, real_y: np.ndarray, classes: list, k: int = 4, seed: int = 0) -> dict:
    """label → (≤ k, p) real rows of each of ``classes``, a seeded choice among the class's rows
    of the (N, p) private rows ``real`` with labels ``real_y`` (N,) (owner only: private rows)."""
    rng = np.random.default_rng(seed)  # which real rows the owner sees: drawn for the owner only
    out = {}
    for c in classes:
        rows = np.asarray(real[real_y == c], dtype=np.float64)
        out[c] = rows[np.sort(rng.permutation(len(rows))[:k])]
    return out


def real_rows_beside_dp(summary: ClassSummary, real: dict, image_shape: tuple[int, int]):
    """The single DP rows of the publishable :func:`class_story` (``summary``: same classes, same
    rows) beside real rows of the same classes (``real``: label → (k, p) private rows, e.g.
    :func:`real_sample`), as images of ``image_shape``, each group on its own colour scale.
    Owner only: it shows private rows; title and caption say so."""
    plt = _pyplot()
    classes = [c for c in list(summary.means())[:10] if c in real]
    k_dp = max(len(summary.samples[c]) for c in classes)
    k_real = max(len(real[c]) for c in classes)
    ranges = [np.percentile(np.concatenate([np.ravel(group[c]) for c in classes]), [1, 99])
              for group in (summary.samples, real)]
    cols = k_dp + k_real
    fig, axes = plt.subplots(len(classes), cols, figsize=(0.9 * cols + 2.4, 0.9 * len(classes) + 1.5),
                             squeeze=False, gridspec_kw={"wspace": 0.08, "hspace": 0.08})
    shown = [None, None]
    for i, c in enumerate(classes):
        for g, (group, start, k, cmap) in enumerate(((summary.samples, 0, k_dp, "gray_r"),
                                                     (real, k_dp, k_real, "Reds"))):
            for j in range(min(k, len(group[c]))):
                shown[g] = axes[i, start + j].imshow(np.reshape(group[c][j], image_shape), cmap=cmap,
                                                     vmin=ranges[g][0], vmax=ranges[g][1])
        axes[i, 0].set_ylabel(str(c), rotation=0, labelpad=10, va="center")
    for ax in axes.ravel():
        ax.set_xticks([]), ax.set_yticks([])
    axes[0, 0].set_title("single DP rows (as published)", loc="left", fontsize=8)
    axes[0, k_dp].set_title("REAL rows: owner only", loc="left", fontsize=8, color="#b03030")
    fig.suptitle("OWNER ONLY, never publish: real rows beside the DP rows of the same classes", fontsize=10,
                 x=0.01, ha="left", color="#b03030")
    fig.subplots_adjust(left=0.07, right=0.78, top=0.88, bottom=0.08)
    for g, (x, name) in enumerate(((0.81, "DP row"), (0.91, "real row"))):
        bar = fig.add_axes((x, 0.1, 0.025, 0.76))
        fig.colorbar(shown[g], cax=bar).ax.tick_params(labelsize=6)
        bar.set_title(name, fontsize=6)
    fig.text(0.01, 0.005, f"Left: the {k_dp} DP rows per class of the publishable picture. Right: {k_real} real "
             "(private) rows of the class. Shows private rows: owner only, never published.",
             fontsize=7, ha="left", va="bottom", wrap=True)
    return fig


def dp_quantile_bands(dp: np.ndarray, lower: np.ndarray, upper: np.ndarray):
    """Each feature's 5–95 % and 25–75 % quantile bands and median over the (N, p) DP rows, with
    the public bounds: the DP rows' marginals (publishable)."""
    plt = _pyplot()
    q = np.percentile(dp, [5, 25, 50, 75, 95], axis=0)
    x = np.arange(dp.shape[1])
    fig, ax = plt.subplots(figsize=(7, 2.6))
    ax.fill_between(x, q[0], q[4], step="mid", color="tab:blue", alpha=0.2, label="5–95 %")
    ax.fill_between(x, q[1], q[3], step="mid", color="tab:blue", alpha=0.45, label="25–75 %")
    ax.step(x, q[2], where="mid", color="tab:blue", lw=0.8, label="median")
    ax.step(x, lower, where="mid", color="k", lw=0.6, ls="--", label="public bounds")
    ax.step(x, upper, where="mid", color="k", lw=0.6, ls="--")
    ax.set_xlabel("feature", fontsize=7)
    ax.set_ylabel("DP value", fontsize=7)
    ax.tick_params(labelsize=6)
    ax.legend(fontsize=6, ncol=4, loc="upper right")
    fig.tight_layout()
    return fig


def marginals(real: np.ndarray, dp: np.ndarray, features: list[int], names: list[str], scores: np.ndarray):
    """Histograms of real and DP values of the given features, each titled with its name and
    marginal similarity ``scores[j]`` (owner only: shows the private rows)."""
    plt = _pyplot()
    cols = min(3, len(features))
    rows = math.ceil(len(features) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.4 * cols, 1.9 * rows), squeeze=False)
    for ax, j in zip(axes.ravel(), features, strict=False):
        values = np.concatenate([real[:, j], dp[:, j]])
        bins = np.linspace(*np.percentile(values, [0.5, 99.5]), 30)
        ax.hist(real[:, j], bins=bins, density=True, alpha=0.55, label="real")
        ax.hist(dp[:, j], bins=bins, density=True, alpha=0.55, label="DP")
        ax.set_title(f"{names[j]} (similarity {scores[j]:.2f})", fontsize=7)
        ax.tick_params(labelsize=6)
    for ax in axes.ravel()[len(features):]:
        ax.axis("off")
    axes[0, 0].legend(fontsize=6)
    fig.tight_layout()
    return fig


def correlation_heatmaps(rho_real: np.ndarray, rho_dp: np.ndarray):
    """The (p, p) correlations of the real and the DP rows side by side, one colour scale [−1, 1]
    (owner only: the real correlations are private). Undefined entries are grey."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(7.2, 3.4))
    cmap = plt.get_cmap("RdBu_r").with_extremes(bad="0.85")
    for ax, rho, title in zip(axes, (rho_real, rho_dp), ("real rows", "DP rows"), strict=True):
        image = ax.imshow(rho, cmap=cmap, vmin=-1, vmax=1, interpolation="nearest")
        ax.set_title(title, fontsize=8)
        ax.tick_params(labelsize=6)
    fig.colorbar(image, ax=axes, shrink=0.8, label="Pearson ρ").ax.tick_params(labelsize=6)
    return fig


def efficacy_bars(table: list):
    """Test accuracy of each model trained on DP rows (TSTR) and on real rows (TRTR), side by side
    (``table``: :class:`~kahm_dask.report.metrics.Efficacy` rows; owner only)."""
    plt = _pyplot()
    models = list(dict.fromkeys(row.model for row in table))
    trained_on = list(dict.fromkeys(row.trained_on for row in table))
    width = 0.8 / len(trained_on)
    fig, ax = plt.subplots(figsize=(5, 2.6))
    for i, source in enumerate(trained_on):
        values = [next(r.accuracy for r in table if r.model == m and r.trained_on == source) for m in models]
        bars = ax.bar(np.arange(len(models)) + (i - (len(trained_on) - 1) / 2) * width, values, width, label=source)
        ax.bar_label(bars, fmt="%.3f", fontsize=6)
    ax.set_xticks(range(len(models)), models, fontsize=7)
    ax.set_ylim(0, 1.25)
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.set_ylabel("test accuracy", fontsize=7)
    ax.tick_params(labelsize=6)
    ax.legend(fontsize=6, loc="upper center", ncol=len(trained_on), frameon=False)
    fig.tight_layout()
    return fig
