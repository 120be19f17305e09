"""Make the README screenshots (docs/images/): the HTML report of a demo run and the live
view in a real terminal. Not a test; run it by hand after changing what they show:

    python tests/report/screenshots.py [DEMO_RECORDING.otlp.jsonl]

The report is opened in headless Chromium (as in the tests); the live view is captured
from tmux with its colours (``capture-pane -e``) and drawn by rich's SVG export, then
photographed by the same browser.
"""

from __future__ import annotations

import io
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
IMAGES = ROOT / "docs" / "images"
sys.path.insert(0, str(HERE))

from report_browser import chromium  # noqa: E402


def report_png(recording: Path) -> None:
    from otelgpu.report import html, model

    page = Path(tempfile.mkdtemp()) / "report.html"
    page.write_text(html.render(model.load([recording])), encoding="utf-8")
    for dark, name in ((False, "report.png"), (True, "report-dark.png")):
        with chromium(width=1280, height=1900, dark=dark) as driver:
            driver.get(page.as_uri())
            time.sleep(3)
            driver.save_screenshot(str(IMAGES / name))


def live_png() -> None:
    from rich.console import Console
    from rich.text import Text

    server = f"otelgpu-shot-{os.getpid()}"
    # The workload runs as ``python train.py`` from a scratch directory, as a user would
    # start it (the view's title shows the command line, not this checkout's path).
    work = Path(tempfile.mkdtemp())
    (work / "train.py").write_text((HERE / "live_torch_workload.py").read_text())
    (work / "live_serving.py").write_text((HERE / "live_serving.py").read_text())
    cmd = [
        "python", "-m", "otelgpu", "run", "--live", "--interval", "0.5", "--sim",
        "healthy-8xh100", "-e", "OTELGPU_EXPORTERS=none", "--", "python", "train.py", "120",
    ]  # fmt: skip
    script = work / "run.sh"
    script.write_text(
        f"cd {shlex.quote(str(work))}\nexport PYTHONPATH={shlex.quote(str(ROOT))}\n"
        f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:$PATH\n"
        "unset COLUMNS LINES\n" + " ".join(shlex.quote(a) for a in cmd) + "; sleep 60\n"
    )
    subprocess.run(
        ["tmux", "-L", server, "new-session", "-d", "-x", "132", "-y", "40", "sh", str(script)],
        check=True,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # until the view has something to show
            time.sleep(1)
            plain = subprocess.run(
                ["tmux", "-L", server, "capture-pane", "-p"], capture_output=True, text=True
            ).stdout
            steps = re.search(r"steps\s+(\d+)", plain)
            if steps and int(steps.group(1)) >= 60 and "hw_thermal" in plain:
                break
        ansi = subprocess.run(
            ["tmux", "-L", server, "capture-pane", "-p", "-e"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    finally:
        subprocess.run(["tmux", "-L", server, "kill-server"], capture_output=True)
    lines = ansi.rstrip("\n").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    console = Console(
        record=True, width=132, force_terminal=True, color_system="truecolor", file=io.StringIO()
    )
    console.print(Text.from_ansi("\n".join(lines)), soft_wrap=True)
    svg = Path(tempfile.mkdtemp()) / "live.svg"
    svg.write_text(console.export_svg(title="otelgpu run --live -- python train.py"))
    with chromium(width=1400, height=60 + 24 * len(lines)) as driver:
        driver.get(svg.as_uri())
        time.sleep(1)
        driver.find_element("css selector", "svg").screenshot(str(IMAGES / "live-view.png"))


if __name__ == "__main__":
    IMAGES.mkdir(parents=True, exist_ok=True)
    if len(sys.argv) > 1:
        report_png(Path(sys.argv[1]))
    live_png()
