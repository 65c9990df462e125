"""report.html in a real headless browser (Debian's chromium): it renders, shows the verdict,
loads nothing from the network, and its screenshot is not blank.

Skipped, saying why, where chromium is absent; CI installs it (``.ci/run``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_osprey.report.html import CSP, write_html
from pytest_osprey.report.plots import all_plots
from testkit.report_campaign import make_data, make_summary

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (CI installs it: apt-get install -y "
    "chromium)")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]
KEEP_BACKGROUND = (0xDA, 0xFB, 0xE1)  # .KEEP's background colour


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("browser")
    data = make_data()
    summary = make_summary(data)
    return write_html(out, summary, data, all_plots(data, 1.1, 0, summary), "Pilot report")


def _chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp / "profile"  # a fresh profile each time: nothing cached, nothing shared
    profile.mkdir(exist_ok=True)
    assert CHROMIUM is not None
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=180)


def test_renders_and_shows_the_verdict(page: Path, tmp_path: Path) -> None:
    res = _chromium(tmp_path, "--dump-dom", page.as_uri())
    dom = res.stdout
    assert res.returncode == 0 and "</html>" in dom, res.stderr[-2000:]
    assert 'class="verdict KEEP"' in dom and ">KEEP<" in dom
    assert 'class="verdict DROP"' in dom
    assert "Gates that decide the verdict" in dom


def test_loads_nothing_from_the_network(page: Path, tmp_path: Path) -> None:
    dom = _chromium(tmp_path, "--dump-dom", page.as_uri()).stdout
    assert f'content="{CSP}"' in dom  # the page forbids every load but inline data
    assert "default-src 'none'" in CSP and "img-src data:" in CSP
    assert not re.search(r"https?://", dom)
    for ref in re.findall(r'(?:src|href)="([^"]*)"', dom):
        assert ref.startswith(("data:image/png;base64,", "#")), ref


def test_screenshot_is_not_blank(page: Path, tmp_path: Path) -> None:
    from PIL import Image

    shot = tmp_path / "shot.png"
    res = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=900,1600", page.as_uri())
    assert shot.is_file(), res.stderr[-2000:]
    with Image.open(shot) as im:
        rgb = im.convert("RGB")
        assert rgb.size == (900, 1600)
        colours = rgb.getcolors(maxcolors=1 << 20)
        assert colours is not None and len(colours) > 50  # text, tables, badges: not blank
        assert any(c == KEEP_BACKGROUND for _, c in colours)  # the KEEP box is drawn
