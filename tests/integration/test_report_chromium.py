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


def _screenshot(html: Path, png: Path, profile: Path) -> np.ndarray:
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
        "--window-size=1280,4000",
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
    assert with_figures > 20000 and without < 500, (with_figures, without)
