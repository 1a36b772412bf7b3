"""Look at report.html the way a person would: render it in headless Chromium and check that the
screenshot shows the plots (their line and bar colours), not broken images or an empty page.

Chromium is Debian's package, installed by `make test` (the Makefile's browser target) before the
tests run; a test never installs system packages. Without it this test fails; it does not skip.
"""
import shutil
import subprocess

import numpy as np
import pytest
from matplotlib import image as mpimg

from ddsim.reports.html import MODE_COLORS

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


@pytest.fixture(scope="session")
def chromium():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "chromium is missing: run `make test` (it installs Debian's chromium) or `apt-get install chromium`"
    return exe


def _color_pixels(img: np.ndarray, hex_color: str, tol: float = 0.06) -> int:
    rgb = np.array([int(hex_color[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(img[..., :3] - rgb).max(-1) < tol).sum())


def test_report_html_shows_the_plots(chromium, audit_dir, tmp_path):
    shot = tmp_path / "shot.png"
    subprocess.run([chromium, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1300,4200",
                    f"--screenshot={shot}", (audit_dir / "report.html").as_uri()],
                   check=True, capture_output=True, timeout=180)
    img = mpimg.imread(shot)
    assert img.shape[0] >= 4000 and img.shape[1] >= 1200
    # plots are there: exact (blue) and leaky (red) series, each in thousands of pixels
    assert _color_pixels(img, MODE_COLORS["exact"]) > 2000
    assert _color_pixels(img, MODE_COLORS["leaky"]) > 2000
    # and the page is not blank: a good share of non-white pixels
    assert (img[..., :3].min(-1) < 0.9).mean() > 0.03
