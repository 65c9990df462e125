"""report.html in a real headless browser (Debian's chromium): it renders, shows the verdict,
loads nothing from the network, its screenshot is not blank, and the first screen of the
recorded campaign's report holds what a reviewer must see without scrolling.

Skipped, saying why, where chromium is absent; CI installs it (``.ci/run``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.report.html import CSP, write_html
from pytest_osprey.report.plots import all_plots
from pytest_osprey.results.folder import load_campaign
from testkit.recorded_campaign import judge_as_the_plugin_does, record_campaign, write_project
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


# What a reviewer must see on the first screen, by CSS selector: each verdict, the deciding
# speedup with its CI and threshold, every unchecked check and the key figures table.
FIRST_SCREEN = {"verdict": ".verdict .label", "deciding": ".deciding", "unchecked": ".unchecked",
                "key figures": "table.key"}
# The page forbids scripts; its copy for measuring gets one that writes each element's box.
MEASURE = """<script>
const out = {height: innerHeight, width: innerWidth, boxes: {}};
for (const [name, sel] of Object.entries(%s)) {
  out.boxes[name] = [...document.querySelectorAll(sel)].map(e => {
    const r = e.getBoundingClientRect(); return [r.top, r.bottom, r.left, r.right]; });
}
const pre = document.createElement("pre"); pre.id = "boxes";
pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
</script>"""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The recorded campaign's report.html (a KEEP and a DROP), judged with its
    sampling-parameters pass off: a quality check left unchecked, as the verdicts name it."""
    root = tmp_path_factory.mktemp("recorded")
    project = write_project(root)
    pilot = project / "pilot.yaml"
    text = pilot.read_text("utf-8")
    assert "  params:\n    enabled: true\n" in text
    pilot.write_text(text.replace("  params:\n    enabled: true\n",
                                  "  params:\n    enabled: false\n"), "utf-8")
    results = root / "results"
    record_campaign(project, results)
    judge_as_the_plugin_does(project, results)
    summary = json.loads((results / "summary.json").read_text("utf-8"))
    data = load_campaign(results)
    return write_html(results, summary, data, all_plots(data, 1.1, 0, summary)), summary


def test_first_screen_shows_what_a_reviewer_needs(
        recorded: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    page, summary = recorded
    text = page.read_text("utf-8")
    probe = tmp_path / "probe.html"
    probe.write_text(re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", text)
                     .replace("</body>", MEASURE % json.dumps(FIRST_SCREEN) + "</body>"),
                     "utf-8")
    dom = _chromium(tmp_path, "--window-size=1280,800", "--dump-dom", probe.as_uri()).stdout
    found = re.search(r'<pre id="boxes">(.*?)</pre>', dom)
    assert found is not None, dom[-2000:]
    seen = json.loads(found.group(1))
    assert seen["width"] == 1280 and seen["height"] >= 600
    verdicts = summary["verdicts"]
    unchecked = sum(len(v["unchecked"]) for v in verdicts)
    boxes = seen["boxes"]
    assert len(boxes["verdict"]) == len(boxes["deciding"]) == len(verdicts) >= 2
    assert len(boxes["unchecked"]) >= unchecked >= 1 and len(boxes["key figures"]) == 1
    for name, rects in boxes.items():
        for top, bottom, left, right in rects:
            assert 0 <= top < bottom <= seen["height"], (name, top, bottom, seen["height"])
            assert 0 <= left < right <= seen["width"], (name, left, right)
    # The set-up is there, collapsed: its table takes no room until opened.
    assert '<details class="setup" id="setup">' in text



def _measured(page: Path, script: str, pre_id: str, tmp: Path) -> dict[str, Any]:
    """What ``script`` (writing JSON into ``<pre id=pre_id>``) found in a copy of ``page``
    opened at 1280 x 800, the copy without the page's script ban."""
    probe = tmp / "probe.html"
    probe.write_text(re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "",
                            page.read_text("utf-8")).replace("</body>", script + "</body>"),
                     "utf-8")
    dom = _chromium(tmp, "--window-size=1280,800", "--dump-dom", probe.as_uri()).stdout
    found = re.search(f'<pre id="{pre_id}">(.*?)</pre>', dom)
    assert found is not None, dom[-2000:]
    seen: dict[str, Any] = json.loads(found.group(1))
    return seen


WARNINGS = """<script>
const out = {height: innerHeight, warnings: []};
for (const w of document.querySelectorAll(".warning")) {
  out.warnings.push(w.getBoundingClientRect().bottom); }
const pre = document.createElement("pre"); pre.id = "warned";
pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
</script>"""


def test_stability_warnings_are_on_the_first_screen(
        recorded: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """A stability warning sits on the first screen (1280 x 800), under the verdicts."""
    page, summary = recorded
    summary = {**summary, "stability": {**summary["stability"], "warnings": [
        "the baseline ran 52% slower in pass 2 than in pass 1 at load busy"]}}
    data = load_campaign(page.parent)
    warned = write_html(tmp_path, summary, data, {})
    seen = _measured(warned, WARNINGS, "warned", tmp_path)
    assert len(seen["warnings"]) == 1, seen
    assert 0 < seen["warnings"][0] <= seen["height"], seen


OVERFLOW = """<script>
for (const d of document.querySelectorAll("details")) d.open = true;
const out = {width: innerWidth, wide: []};
for (const e of document.querySelectorAll("table, figure, pre")) {
  const r = e.getBoundingClientRect();
  if (r.right > innerWidth) out.wide.push([e.tagName, e.className, Math.round(r.right),
                                           e.textContent.slice(0, 60)]); }
const pre = document.createElement("pre"); pre.id = "overflow";
pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
</script>"""


def test_every_table_fits_a_1280_pixel_window(
        recorded: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """Every section opened, no table, figure or block reaches past a 1280-pixel window: the
    per-level tables keep their last columns (req/s, tokens) in view."""
    page, _ = recorded
    seen = _measured(page, OVERFLOW, "overflow", tmp_path)
    assert seen["width"] == 1280, seen
    assert seen["wide"] == [], seen["wide"]
