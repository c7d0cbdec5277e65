"""The HTML report opens in headless Chromium and its figures render (a screenshot with plotted colours)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from prereqs import need_chromium

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from analysis_runs import make_run

from analysis.report import build_report

pytestmark = pytest.mark.slow

CHROMIUM = need_chromium()


def _screenshot(html: Path, png: Path, profile: Path, height: int = 4000) -> np.ndarray:
    from matplotlib.image import imread

    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        f"--screenshot={png}",
        f"--window-size=1280,{height}",
        html.as_uri(),
    ]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=180)
    assert png.exists(), f"chromium wrote no screenshot (rc {proc.returncode}): {proc.stderr[-2000:]}"
    return imread(png)


def _coloured_pixels(img: np.ndarray) -> int:
    """Pixels with clearly saturated colour: plotted lines and bands; report text and tables are grey scale."""
    rgb = img[..., :3].astype(float)
    return int(((rgb.max(axis=-1) - rgb.min(axis=-1)) > 0.3).sum())


def test_report_renders_in_chromium(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", steps=6)
    paths = build_report([run.root], tmp_path / "out")
    img = _screenshot(paths.html, tmp_path / "shot.png", tmp_path / "profile")
    assert img.shape[:2] == (4000, 1280)
    assert (img[..., :3] < 0.9).any(axis=-1).mean() > 0.02, "screenshot is blank"
    with_figures = _coloured_pixels(img)
    # Control: the same page with the embedded images removed has (almost) no coloured pixels.
    bare = tmp_path / "bare.html"
    bare.write_text(re.sub(r'src="data:image/png;base64,[^"]+"', 'src=""', paths.html.read_text()))
    without = _coloured_pixels(_screenshot(bare, tmp_path / "bare.png", tmp_path / "profile2"))
    # (The reward and eval figures sit side by side at half width in the outcome, hence fewer pixels than the
    # other, full-width figures; the eval figure draws only the scores: 11921 measured.) Many times the control.
    assert with_figures > 6000 and without < 500, (with_figures, without)


# Reports each element's box (document coordinates, px) once the page and its images have loaded.
_POSITIONS_JS = """<script>window.addEventListener("load", function () {
  var box = function (e) { if (!e) return null; var b = e.getBoundingClientRect();
    return {top: b.top + window.scrollY, bottom: b.bottom + window.scrollY}; };
  var cells = [].slice.call(document.querySelectorAll("#outcome td"));
  var ended = cells.filter(function (td) { return td.textContent.indexOf("how the run ended") >= 0; })[0];
  var out = {outcome: box(document.getElementById("outcome")), ended: box(ended),
             ended_text: ended ? ended.nextElementSibling.textContent : null,
             figures: [].slice.call(document.querySelectorAll("#outcome img")).map(box),
             page_width: document.documentElement.scrollWidth};
  var p = document.createElement("pre"); p.id = "positions"; p.textContent = JSON.stringify(out);
  document.body.appendChild(p);
});</script>"""


def _positions(html: Path, profile: Path) -> dict:
    import json

    probe = html.with_name("probe.html")
    probe.write_text(html.read_text().replace("</body>", _POSITIONS_JS + "</body>"))
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--window-size=1280,900",
        "--virtual-time-budget=5000",
        "--dump-dom",
        probe.as_uri(),
    ]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=180)
    m = re.search(r'<pre id="positions">([^<]*)</pre>', proc.stdout)
    assert m, f"no positions in the dumped page (rc {proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def test_first_screen_holds_the_outcome_and_a_figure(tmp_path: Path) -> None:
    from toolkit.run import ending
    from toolkit.run.layout import RunDir

    run = make_run(tmp_path / "run", steps=6)
    run.control.mkdir(parents=True, exist_ok=True)
    run.stop_request.write_text("orchestrator: zero-signal guard: 10 consecutive steps without signal\n")
    ending.settle(RunDir(run.root))
    paths = build_report([run.root], tmp_path / "out")
    pos = _positions(paths.html, tmp_path / "profile")
    # Within the first 1280x900 screen: how the run ended and both outcome figures (reward, eval), whole.
    assert pos["ended"]["bottom"] <= 900 and "stopped by the zero-signal guard" in pos["ended_text"], pos
    assert len(pos["figures"]) == 2 and all(f["bottom"] <= 900 for f in pos["figures"]), pos
    assert pos["page_width"] <= 1280, pos  # wide tables scroll inside their box, not the page
    # The screenshot of that screen shows plotted colour (a figure), not only text and tables.
    img = _screenshot(paths.html, tmp_path / "first.png", tmp_path / "profile2", height=900)
    # A report whose first screen is text and tables has (almost) none: the control above shows < 500.
    assert _coloured_pixels(img) > 4000, _coloured_pixels(img)
