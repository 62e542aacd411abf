"""The quality report renders in a real browser: headless Chromium (Debian's ``chromium``, no
download at run time) loads it, every picture decodes (the page's own script counts those whose
``naturalWidth`` is 0) and the screenshot is not blank. Without Chromium the test skips, or
fails where services are required (CI)."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from kahm_dask.report import write_quality_report
from tests._kit import service_unavailable
from tests.report.test_html import _inputs

pytestmark = pytest.mark.slow

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]


def _chromium(tmp_path, *args: str) -> str:
    browser = shutil.which("chromium")
    if browser is None:
        service_unavailable("chromium is not installed (apt-get install chromium)")
    done = subprocess.run([browser, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _image_marks(tmp_path, page) -> tuple[int, int]:
    """(pictures, pictures that did not load) as the page's load script counted them."""
    dom = _chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom", page.as_uri())
    marks = re.search(r'<body data-images="(\d+)" data-broken-images="(\d+)"', dom)
    assert marks is not None, "the page's load script did not run"
    return int(marks[1]), int(marks[2])


def test_the_report_renders_in_chromium_with_every_picture_loaded(tmp_path):
    import matplotlib.image

    page = write_quality_report(tmp_path / "quality.html", **_inputs())
    text = page.read_text(encoding="utf-8")
    n_images = text.count("<img ")
    assert _image_marks(tmp_path, page) == (n_images, 0)
    # the check sees a picture that does not decode
    broken = tmp_path / "broken.html"
    broken.write_text(text.replace("base64,", "base64,AAAA", 1), encoding="utf-8")
    assert _image_marks(tmp_path, broken) == (n_images, 1)

    shot = tmp_path / "shot.png"
    _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,3000", page.as_uri())
    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.shape[:2] == (3000, 1200)
    not_white = (pixels < 0.9).any(axis=-1).mean()
    assert not_white > 0.05 and pixels.std() > 0.1  # text, tables and pictures, not a blank page
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 100  # colour pictures, not flat fills
