"""The publishable picture of a release (the run's dp_rows.png): single DP rows beside each
class's mean, titled with ε, captioned as publishable, with a colour scale per group.

Finding replayed (failed on the code before): dp_rows.png was 40 tiles of noise under the words
"DP rows only", with no ε, no colour scale and nothing that showed the classes."""

from __future__ import annotations

import numpy as np

from kahm_dask.report.pictures import ClassSummary, class_story, real_rows_beside_dp, real_sample


def _texts(fig) -> str:
    return " ".join(t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text")))


def test_class_summary_keeps_k_rows_and_the_mean_of_at_most_max_rows_per_class():
    s = ClassSummary(k=3, max_rows=4)
    s.add("a", np.arange(10.0).reshape(5, 2))
    s.add("a", np.full((2, 2), 100.0))  # beyond max_rows: not averaged
    assert s.samples["a"].tolist() == [[0, 1], [2, 3], [4, 5]] and s.counts["a"] == 4
    assert s.means()["a"].tolist() == [3.0, 4.0]
    X, y = np.arange(12.0).reshape(6, 2), np.array([0, 1, 0, 1, 0, 1])
    full = ClassSummary.from_rows(X, y, k=2)
    assert full.counts == {0: 3, 1: 3} and np.allclose(full.means()[1], X[y == 1].mean(axis=0))
    assert all(len(full.samples[c]) == 2 for c in (0, 1))


def test_the_story_of_image_rows_shows_single_rows_and_class_means_on_their_own_scales():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(60, 64)), np.repeat([0, 1, 2], 20)
    fig = class_story(ClassSummary.from_rows(X, y), epsilon=2.0, image_shape=(8, 8))
    text = _texts(fig)
    assert "ε = 2 per entry" in text and "may be published" in text
    assert "single DP rows" in text and "class mean" in text
    images = [im for ax in fig.axes for im in ax.get_images()]
    assert len(images) == 3 * 5  # 4 rows and the mean per class
    scales = {im.get_clim() for im in images}
    assert len(scales) == 2 and sum(im.colorbar is not None for im in images) == 2  # one colour bar per scale


def test_the_story_of_other_rows_is_a_heatmap_of_the_class_means():
    X, y = np.random.default_rng(1).normal(size=(40, 30)), np.repeat([0, 1], 20)
    fig = class_story(ClassSummary.from_rows(X, y), epsilon=1.0)
    assert "ε = 1 per entry" in _texts(fig) and "may be published" in _texts(fig)
    (image,) = fig.axes[0].get_images()
    assert np.allclose(image.get_array(), np.vstack([X[:20].mean(0), X[20:].mean(0)]))


def test_real_rows_beside_dp_shows_the_published_dp_rows_and_real_rows_of_the_same_classes_owner_only():
    rng = np.random.default_rng(2)
    dp, y = rng.normal(size=(60, 64)), np.repeat([0, 1, 2], 20)
    real_X, real_y = rng.uniform(size=(90, 64)), np.repeat([2, 1, 0], 30)
    summary = ClassSummary.from_rows(dp, y, k=3)
    real = real_sample(real_X, real_y, [0, 1, 2], k=2)
    assert all(len(real[c]) == 2 and any((r == real_X[real_y == c]).all(1).any() for r in real[c]) for c in real)
    fig = real_rows_beside_dp(summary, real, (8, 8))
    text = _texts(fig)
    assert "OWNER ONLY" in text and "never published" in text and "may be published" not in text
    drawn = [np.ravel(im.get_array()) for ax in fig.axes for im in ax.get_images()]
    assert len(drawn) == 3 * (3 + 2)
    expected = [row for c in (0, 1, 2) for row in (*summary.samples[c], *real[c])]
    assert all(np.array_equal(a, b) for a, b in zip(drawn, expected, strict=True))
    assert len({im.get_clim() for ax in fig.axes for im in ax.get_images()}) == 2  # DP and real: own scales
