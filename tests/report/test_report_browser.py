"""The report in a real browser: headless Chromium (Debian's ``chromium``, installed by
scripts/chromium.sh) loads the report.html of a real ``kvmap bench --quick`` run; every
plot must have decoded (no broken image), the interactive plotly map must have drawn its
points (``.scatterlayer .point`` paths in the live DOM) and a screenshot is written. Marked slow; runs
in CI, where a missing browser fails instead of skipping.

The quick run is shared with tests/bench/test_bench_quick_real.py through the session's
base temporary directory (the first of the two to run makes it), so CI runs it once.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import shared_quick_run

pytestmark = pytest.mark.slow

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
# Appended to a copy of the report: after load, write what the browser decoded into the DOM.
CHECK_SCRIPT = """<script>
window.addEventListener('load', function () { setTimeout(function () {
  var imgs = Array.prototype.slice.call(document.images);
  var plots = Array.prototype.slice.call(document.querySelectorAll('.plotly-graph-div'));
  var out = document.createElement('pre');
  out.id = 'kvmap-check';
  out.textContent = JSON.stringify({
    images: imgs.map(function (i) {
      return {id: i.id, complete: i.complete, w: i.naturalWidth, h: i.naturalHeight};
    }),
    points: plots.map(function (p) {
      return {id: p.id, n: p.querySelectorAll('.scatterlayer .point').length};
    })});
  document.body.appendChild(out);
}, 1000); });
</script>"""


def chromium() -> str:
    path = shutil.which("chromium") or ("/usr/bin/chromium"
                                        if Path("/usr/bin/chromium").exists() else None)
    if path is None:
        message = "chromium not found (install it with: bash scripts/chromium.sh)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + " -- CI must run the browser test")
        pytest.skip(message)
    return path


def run_chromium(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120)


def test_report_renders_every_plot_in_chromium(tmp_path_factory, tmp_path):
    browser = chromium()
    run_dir, proc = shared_quick_run(tmp_path_factory)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = run_dir / "report.html"
    assert report.is_file(), "kvmap bench --quick wrote no report.html"
    html = report.read_text()
    num_plots = html.count('<img class="plot"')
    assert num_plots >= 4          # map, CDFs, position, passkey heatmap (no tiers in quick)

    checked = tmp_path / "checked.html"
    checked.write_text(html.replace("</body>", CHECK_SCRIPT + "\n</body>"))
    dom = run_chromium(browser, tmp_path / "profile-1", "--virtual-time-budget=10000",
                       "--dump-dom", checked.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    start = dom.stdout.index('<pre id="kvmap-check">') + len('<pre id="kvmap-check">')
    check = json.loads(dom.stdout[start:dom.stdout.index("</pre>", start)]
                       .replace("&quot;", '"'))
    images = check["images"]
    assert len(images) == num_plots
    points = {p["id"]: p["n"] for p in check["points"]}
    assert points.get("map-interactive", 0) > 0, f"the interactive map drew no point: {points}"
    broken = [i["id"] for i in images if not (i["complete"] and i["w"] > 0 and i["h"] > 0)]
    assert not broken, f"images that did not render: {broken}"
    assert "fig-tradeoff" in {i["id"] for i in images}

    shot = run_dir / "report-screenshot.png"
    result = run_chromium(browser, tmp_path / "profile-2", "--window-size=1280,1800",
                          f"--screenshot={shot}", report.as_uri())
    assert result.returncode == 0 and shot.is_file(), result.stderr[-2000:]
    from matplotlib.image import imread
    pixels = imread(shot)[..., :3]                   # (H, W, 3) floats in [0, 1]
    assert pixels.shape[:2] == (1800, 1280)
    dark = (pixels.mean(axis=2) < 0.5).mean()        # text and plot lines on white
    assert 0.005 < dark < 0.5, f"screenshot looks blank or broken ({dark:.3%} dark pixels)"
    assert np.unique(pixels.reshape(-1, 3), axis=0).shape[0] > 50   # colours: plots drawn
