"""The quality report file: owner-only by mode, each section and picture labelled publishable
or owner only, every score explained, every field of the statement shown, the same bytes for the
same inputs, and bad input refused by name before anything is written."""

from __future__ import annotations

import base64
import dataclasses
import html
import re
import stat

import numpy as np
import pytest

from kahm_dask.datasets import make_class_blobs
from kahm_dask.privacy.bounds import BOUNDS_PUBLIC
from kahm_dask.privacy.noise import GridLaplace
from kahm_dask.privacy.statement import PrivacyStatement
from kahm_dask.report import pictures, write_quality_report
from kahm_dask.report.html import MEANINGS, OWNER_ONLY, PUBLISHABLE


@dataclasses.dataclass(frozen=True)
class _StatementWithPLD(PrivacyStatement):
    """A statement with a field added later (a tighter per-record ε): the report shows it."""

    epsilon_per_record_pld: float | None = None


def _inputs() -> dict:
    X, y = make_class_blobs(700, n_features=16, n_classes=3, random_state=1)
    rng = np.random.default_rng(5)
    mechanism = GridLaplace(epsilon=2.0, lower=np.zeros(16), upper=np.ones(16))
    statement = _StatementWithPLD(**vars(PrivacyStatement.from_settings(mechanism, BOUNDS_PUBLIC, dp_data="noisy")),
                                  epsilon_per_record_pld=11.5)
    return dict(real_X=X[:500], real_y=y[:500], dp_X=X[:500] + rng.laplace(scale=0.5, size=(500, 16)),
                dp_y=y[:500], test_X=X[500:], test_y=y[500:], statement=statement, bounds=(0.0, 1.0),
                image_shape=(4, 4), audit={"epsilon_lower_bound": 0.7, "confidence": 0.95})


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "quality.html"
    write_quality_report(path, **_inputs())
    return path


def _sections(page: str) -> dict:
    return {m.group(2): m.group(1) for m in re.finditer(r'<section class="\w+" data-label="([^"]+)"><h2>([^<]+?) <',
                                                         page)}


def test_the_report_is_owner_only_by_mode(report):
    assert stat.S_IMODE(report.stat().st_mode) == 0o600


def test_each_section_is_labelled_publishable_only_when_it_reads_no_private_row(report):
    page = report.read_text(encoding="utf-8")
    assert _sections(page) == {
        "Privacy": PUBLISHABLE,
        "The DP rows": PUBLISHABLE,
        "Fidelity: DP rows against the private rows": OWNER_ONLY,
        "Machine-learning efficacy (TSTR vs TRTR)": OWNER_ONLY,
    }
    # every picture is inline, captioned and labelled like its section
    figures = re.findall(r'<figure data-label="([^"]+)"><img alt="[^"]*" src="data:image/png;base64,', page)
    assert figures == [PUBLISHABLE, PUBLISHABLE, OWNER_ONLY, OWNER_ONLY, OWNER_ONLY, OWNER_ONLY]
    assert page.count("<figcaption>") == len(figures) == page.count("<img ")
    assert "src=\"http" not in page and "src=\"file" not in page  # self-contained


def _section_pages(page: str) -> dict:
    """title → (label, the section's HTML) of every section of the page."""
    return {m.group(2): (m.group(1), m.group(0)) for m in re.finditer(
        r'<section class="\w+" data-label="([^"]+)"><h2>([^<]+?) <.*?</section>', page, flags=re.S)}


def _published(page: str) -> str:
    return "".join(body for label, body in _section_pages(page).values() if label == PUBLISHABLE)


def _owner_only(page: str) -> str:
    return "".join(body for label, body in _section_pages(page).values() if label == OWNER_ONLY)


def test_real_rows_are_shown_owner_only_beside_the_published_dp_rows(report):
    """The owner-only picture of real rows beside the DP rows is in an owner-only section; no
    picture of real rows (that one, or the publishable picture drawn from real rows) is in a
    publishable one."""
    page = report.read_text(encoding="utf-8")
    inputs = _inputs()
    dp = pictures.ClassSummary.from_rows(inputs["dp_X"], inputs["dp_y"])
    real = pictures.real_sample(inputs["real_X"], inputs["real_y"], list(dp.means()), k=dp.k)
    beside = _png(pictures.real_rows_beside_dp(dp, real, (4, 4)))
    published_story = _png(pictures.class_story(dp, epsilon=2.0, image_shape=(4, 4)))
    real_story = _png(pictures.class_story(pictures.ClassSummary.from_rows(inputs["real_X"], inputs["real_y"]),
                                           epsilon=2.0, image_shape=(4, 4)))
    assert beside in _owner_only(page) and beside not in _published(page)
    assert published_story in _published(page)  # the check sees the pictures it looks for
    assert real_story not in page
    assert "Real rows beside the DP rows" in _owner_only(page) and "never published" in _owner_only(page)


def test_the_publishable_sections_do_not_change_with_the_private_rows(report, tmp_path):
    """An attacker who reads only the publishable sections learns nothing of the private rows:
    other real rows (same count and labels), same DP rows, the same publishable bytes; the
    owner-only sections (its real rows among them) change."""
    inputs = _inputs()
    other = np.random.default_rng(11).uniform(size=inputs["real_X"].shape)
    again = write_quality_report(tmp_path / "other.html", **{**inputs, "real_X": other})
    page, other_page = report.read_text(encoding="utf-8"), again.read_text(encoding="utf-8")
    assert _published(other_page) == _published(page) and len(_published(page)) > 10_000
    assert _owner_only(other_page) != _owner_only(page)
    for title, (label, body) in _section_pages(page).items():
        if label == OWNER_ONLY:
            assert _section_pages(other_page)[title][1] != body, title


def _png(fig) -> str:
    return base64.b64encode(pictures.png_bytes(fig)).decode("ascii")


def test_every_score_is_explained_and_every_statement_field_is_shown(report):
    page = report.read_text(encoding="utf-8")
    for meaning in MEANINGS.values():
        assert html.escape(meaning) in page
    assert "<td>ε per entry</td><td>2</td>" in page and "<td>ε per record (p·ε)</td><td>32</td>" in page
    assert "<td>ε per record (δ = 1e-05)</td>" in page  # the accountant's, beside the basic bound
    assert "<td>epsilon per record pld</td><td>11.5</td>" in page  # a field the statement gained later
    assert "<td>epsilon_lower_bound</td><td>0.7</td>" in page  # the audit, as given
    for row in ("KAHM</td><td>DP rows (TSTR)", "KAHM</td><td>real rows (TRTR)",
                "LogisticRegression</td><td>DP rows (TSTR)", "LogisticRegression</td><td>real rows (TRTR)"):
        assert row in page


def test_the_same_inputs_give_the_same_file(report, tmp_path):
    again = write_quality_report(tmp_path / "again.html", **_inputs())
    assert again.read_bytes() == report.read_bytes()


@pytest.mark.parametrize(("change", "message"), [
    ({"dp_X": np.zeros((500, 15))}, "dp_X has 15 features, real_X has 16"),
    ({"dp_y": np.zeros(499)}, r"dp_y must hold one label per row of dp_X \(500\)"),
    ({"test_y": np.full(200, 9)}, r"test_y has classes not in real_y: \[9\]"),
    ({"image_shape": (8, 8)}, r"image_shape \(8, 8\) does not hold 16 features"),
    ({"feature_names": ["a"]}, "feature_names has 1 names for 16 features"),
    ({"real_X": np.full((500, 16), np.nan)}, "real_X holds NaN"),
    ({"bounds": (1.0, 0.0)}, "upper must exceed lower"),
])
def test_bad_input_is_refused_by_name_before_anything_is_written(tmp_path, change, message):
    path = tmp_path / "quality.html"
    with pytest.raises(ValueError, match=message):
        write_quality_report(path, **{**_inputs(), **change})
    assert list(tmp_path.iterdir()) == []


def test_a_statement_that_is_not_one_is_refused_by_name(tmp_path):
    with pytest.raises(TypeError, match="statement must be the release's PrivacyStatement, got dict"):
        write_quality_report(tmp_path / "quality.html", **{**_inputs(), "statement": {"epsilon": 1.0}})
    assert list(tmp_path.iterdir()) == []
