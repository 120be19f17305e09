"""The HTML report opened in a real headless browser (Debian's Chromium via Selenium).

Checks what a person would see: no console errors, every plot drawn as a non-empty SVG
with data in it, the GPU event markers on the step-time plot, the same page in the dark
theme; screenshots are kept under build/artifacts/ (test artifacts).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from report_browser import chromium, screenshot_full
from report_support import ARTIFACTS

from otelgpu.report import compare, html, model

# Every plot: its SVG root, the number of drawn traces and of data paths/points in it.
PLOTS_JS = """
return Array.from(document.querySelectorAll('.plot')).map(function (p) {
  var svg = p.querySelector('svg.main-svg');
  var box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
  return {
    id: p.id,
    width: box.width, height: box.height,
    traces: p.querySelectorAll('.scatterlayer .trace, .barlayer .trace').length,
    marks: p.querySelectorAll(
      '.scatterlayer path.js-line, .scatterlayer path.point, .barlayer path').length,
    shapes: p.querySelectorAll('.shapelayer path').length,
    names: (p.data || []).map(function (t) { return t.name; }),
  };
});
"""


def _open(driver: Any, page: Path) -> list[dict[str, Any]]:
    driver.get(page.as_uri())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        drawn = driver.execute_script("return document.body.getAttribute('data-plots-drawn')")
        if drawn is not None:
            break
        time.sleep(0.2)
    assert drawn is not None, "the page's script never ran"
    errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert errors == [], errors
    # nothing fetched besides the page itself (the page works offline)
    fetched = driver.execute_script(
        "return performance.getEntriesByType('resource').map(function (e) { return e.name; })"
    )
    assert fetched == [], fetched
    plots: list[dict[str, Any]] = driver.execute_script(PLOTS_JS)
    assert len(plots) == int(drawn)
    for plot in plots:
        assert plot["width"] > 300 and plot["height"] > 150, plot
        assert plot["traces"] > 0 and plot["marks"] > 0, plot
    return plots


@pytest.fixture(scope="module")
def report_page(workload_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    page = tmp_path_factory.mktemp("html") / "report.html"
    page.write_text(html.render(model.load([workload_run])), encoding="utf-8")
    return page


def test_report_html_is_self_contained(report_page: Path) -> None:
    text = report_page.read_text(encoding="utf-8")
    assert "Plotly" in text and len(text) > 1_000_000  # plotly.js inlined
    # outside the inlined scripts' code: no element loading anything from elsewhere
    markup = re.sub(r"<script>.*?</script>", "<script></script>", text, flags=re.S)
    assert not re.search(r"(src|href)=[\"']?(https?:)?//", markup), markup[:2000]
    assert "@import" not in markup
    assert "prefers-color-scheme: dark" in text


def test_report_html_renders_every_plot_with_gpu_event_markers(report_page: Path) -> None:
    with chromium() as driver:
        plots = {p["id"]: p for p in _open(driver, report_page)}
        assert set(plots) >= {"step-time", "latency-cdf", "gpu-timelines"}
        step = plots["step-time"]
        # the thermal throttle injected on GPU 1: a marker trace and a vertical line
        assert "GPU events" in step["names"] and step["shapes"] >= 1, step
        assert "step, GPU throttled" in step["names"]
        markers = driver.execute_script(
            "var d = document.getElementById('step-time').data;"
            "return d.filter(function (t) { return t.name === 'GPU events'; })[0].text;"
        )
        assert "throttle_start" in markers
        gpu = plots["gpu-timelines"]
        assert sum(1 for n in gpu["names"] if n.startswith("GPU ")) >= 8 * 5  # 8 GPUs x rows
        assert driver.find_elements("css selector", "li.gpu-event")
        assert "INPUT-BOUND" not in driver.page_source  # this workload has no data wait
        screenshot_full(driver, ARTIFACTS / "report-light.png")
    with chromium(dark=True) as driver:
        _open(driver, report_page)
        background = driver.execute_script("return getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(18, 22, 29)", background  # the dark theme's --bg
        font = driver.execute_script(
            "return document.getElementById('step-time').layout.font.color"
        )
        assert font == "#e6e9ef"  # plots re-themed with the dark foreground
        screenshot_full(driver, ARTIFACTS / "report-dark.png")
    assert (ARTIFACTS / "report-light.png").stat().st_size > 20_000


def test_report_html_comparison_renders(synthetic_runs: dict[str, Path], tmp_path: Path) -> None:
    a, c = model.load([synthetic_runs["healthy_a"]]), model.load([synthetic_runs["regressed"]])
    page = tmp_path / "compare.html"
    page.write_text(html.render_comparison(a, c, compare.compare(a, c)), encoding="utf-8")
    with chromium() as driver:
        plots = _open(driver, page)
        assert len(plots) >= 5  # one CDF overlay per compared duration metric
        rows = driver.execute_script(
            "return Array.from(document.querySelectorAll('tr.metric-row')).map("
            "function (r) { return [r.cells[0].textContent, r.dataset.verdict]; })"
        )
        regressed = {name for name, verdict in rows if verdict == "regression"}
        assert regressed == {"otelgpu.train.step.duration", "gen_ai.server.time_to_first_token"}
        screenshot_full(driver, ARTIFACTS / "compare.png")
