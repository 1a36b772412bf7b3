"""Look at report.html the way a person would: the verdict is the first element of the page, and
headless Chromium's screenshots at two widths show it at the top and the plots (their line and bar
colours) below, not broken images or an empty page.

Chromium is Debian's package: `make test` installs it where it is missing and it runs as root (as CI
does); a user who is not root installs it once (`apt-get install chromium`) or points DDSIM_BROWSER
at a Chromium or Chrome binary. A test never installs system packages. Without a browser this test
fails with one line naming the requirement; it does not skip.
"""
import os
import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import pytest
from matplotlib import image as mpimg

from ddsim.reports.html import MODE_COLORS

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


@pytest.fixture(scope="session")
def chromium():
    exe = os.environ.get("DDSIM_BROWSER") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        pytest.fail("the report.html screenshot test needs Chromium: `apt-get install chromium` (make test does it as "
                    "root), or DDSIM_BROWSER=/path/to/chrome", pytrace=False)
    return exe


class _FirstElement(HTMLParser):
    """The first element inside <body> (tag and attributes)."""

    def __init__(self):
        super().__init__()
        self.in_body, self.first = False, None

    def handle_starttag(self, tag, attrs):
        if tag == "body":
            self.in_body = True
        elif self.in_body and self.first is None:
            self.first = (tag, dict(attrs))


def test_the_verdict_is_the_first_element_of_the_body(audit_dir):
    p = _FirstElement()
    p.feed((audit_dir / "report.html").read_text())
    assert p.first == ("section", {"id": "verdict", "class": "fail"}), p.first
    text = (audit_dir / "report.html").read_text()
    head = text[text.index("<section id='verdict'"):text.index("</section>")]
    assert "Verdict: keep hybrid-unsafe verification off" in head and "leak_nodes_per_budget" in head
    assert "policy hybrid-unsafe (built-in hybrid-unsafe, sha256" in head


def _color_pixels(img: np.ndarray, hex_color: str, tol: float = 0.06) -> int:
    rgb = np.array([int(hex_color[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(img[..., :3] - rgb).max(-1) < tol).sum())


@pytest.mark.parametrize("width", [1300, 800])
def test_report_html_shows_the_verdict_then_the_plots(chromium, audit_dir, tmp_path, width):
    shot = tmp_path / "shot.png"
    subprocess.run([chromium, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={width},4200",
                    f"--screenshot={shot}", (audit_dir / "report.html").as_uri()],
                   check=True, capture_output=True, timeout=180)
    img = mpimg.imread(shot)
    assert img.shape[0] >= 4000 and img.shape[1] >= width - 10
    # the verdict box (its failing border colour) is at the top of the page
    top = img[:300]
    assert _color_pixels(top, "#D55E00", tol=0.08) > 200
    assert _color_pixels(img[300:], "#D55E00", tol=0.08) > 0  # and the leaky series below
    # plots are there: exact (blue) and leaky (red) series, each in thousands of pixels
    assert _color_pixels(img, MODE_COLORS["exact"]) > 2000
    assert _color_pixels(img, MODE_COLORS["leaky"]) > 2000
    # and the page is not blank: a good share of non-white pixels
    assert (img[..., :3].min(-1) < 0.9).mean() > 0.03
