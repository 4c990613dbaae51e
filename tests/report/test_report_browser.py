"""The report in a real browser: headless Chromium (Debian's ``chromium``, installed by
scripts/chromium.sh) loads the report.html of a real ``kvmap bench --quick`` run; every
plot must have decoded (no broken image), the interactive plotly map must have drawn its
points (``.scatterlayer .point`` paths in the live DOM) and a screenshot is written. At a
1,400-pixel-wide window no two panel titles of the map, and no two of its x-axis titles,
overlap (on the quick run and on a hand-made run whose map has all three panels). Marked
slow; runs in CI, where a missing browser fails instead of skipping.

The quick run is shared with tests/bench/test_bench_quick_real.py through the session's
base temporary directory (the first of the two to run makes it), so CI runs it once.
"""
from __future__ import annotations

import html as html_lib
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


# Appended to a copy of the report: the boxes of the map's panel titles and axis titles.
LAYOUT_SCRIPT = """<script>
window.addEventListener('load', function () { setTimeout(function () {
  var map = document.getElementById('map-interactive');
  function box(e) {
    var r = e.getBoundingClientRect();
    return {text: e.textContent, x0: r.left, x1: r.right, y0: r.top, y1: r.bottom};
  }
  var axes = Array.prototype.slice.call(map.querySelectorAll('.infolayer g')).filter(
    function (g) { return /^g-x[0-9]*title$/.test(g.getAttribute('class') || ''); });
  var out = document.createElement('pre');
  out.id = 'kvmap-layout';
  out.textContent = JSON.stringify({
    titles: Array.prototype.slice.call(map.querySelectorAll('.annotation-text')).map(box),
    xtitles: axes.map(function (g) { return box(g); })});
  document.body.appendChild(out);
}, 1500); });
</script>"""
LAYOUT_WIDTH = 1400


def overlapping(boxes: list[dict]) -> list[tuple[str, str]]:
    """Pairs of boxes whose rectangles intersect (a pixel of slack)."""
    return [(a["text"], b["text"]) for i, a in enumerate(boxes) for b in boxes[i + 1:]
            if a["x0"] < b["x1"] - 1 and b["x0"] < a["x1"] - 1
            and a["y0"] < b["y1"] - 1 and b["y0"] < a["y1"] - 1]


def map_layout(browser: str, report: Path, tmp_path: Path) -> dict:
    """The map's title boxes in Chromium at ``LAYOUT_WIDTH`` pixels."""
    checked = tmp_path / "layout.html"
    checked.write_text(report.read_text().replace("</body>", LAYOUT_SCRIPT + "\n</body>"))
    dom = run_chromium(browser, tmp_path / "profile-layout", "--virtual-time-budget=10000",
                       f"--window-size={LAYOUT_WIDTH},1800", "--dump-dom", checked.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    start = dom.stdout.index('<pre id="kvmap-layout">') + len('<pre id="kvmap-layout">')
    return json.loads(html_lib.unescape(dom.stdout[start:dom.stdout.index("</pre>", start)]))


def assert_map_titles_apart(layout: dict, num_panels: int) -> None:
    assert len(layout["titles"]) == num_panels, layout["titles"]
    assert not overlapping(layout["titles"]), overlapping(layout["titles"])
    assert len(layout["xtitles"]) == num_panels, layout["xtitles"]
    assert not overlapping(layout["xtitles"]), overlapping(layout["xtitles"])


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
    layout = map_layout(browser, report, tmp_path)
    assert_map_titles_apart(layout, len(layout["titles"]))


def test_three_panel_map_titles_apart_at_1400_pixels(tmp_path):
    """A hand-made run whose map has its three panels (accuracy tasks, and a workload
    where memory binds): titles and x-axis titles apart at 1,400 pixels (the titles ran
    into each other before they were wrapped)."""
    from kvmap.report.analysis import analyze
    from kvmap.report.html import write_report
    from kvmap.report.loader import load_run
    from tests.report.conftest import _tasks, _workload, store_run
    browser = chromium()
    cells = []
    for kv, gap, peak, running in (("bf16", 0.05, 40 << 20, 16), ("int8", 0.04, 20 << 20, 30)):
        record, rows = _workload(kv, gap, 0.2, peak, 1000, 2.0)
        record.metrics.update(concurrency_max=running, num_pool_full_steps=12)
        cells += [(record, rows), *[(t, []) for t in _tasks(kv, 0.5 * (kv != "bf16"),
                                                              [1, 1, 1, 1], peak)]]
    run = store_run(tmp_path / "run", cells, {"name": "three-panels", "description": "",
                                              "slo": {"ttft_p99_s": 0.5, "tbt_p99_s": 0.1}})
    report = write_report(analyze(load_run(run)))
    assert_map_titles_apart(map_layout(browser, report, tmp_path), 3)
