"""Open an HTML page in the system's headless Chromium (Selenium + Debian's chromedriver).

No browser download: the browser and its driver are Debian's ``chromium`` and
``chromium-driver`` (``tests/report/install.sh`` installs them from ``make test``).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
DRIVER_CANDIDATES = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")


def _first(paths: tuple[str, ...], name: str) -> str:
    for p in paths:
        if Path(p).exists():
            return p
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(
            f"{name} not found: run tests/report/install.sh (Debian's chromium and chromium-driver)"
        )
    return found


@contextmanager
def chromium(width: int = 1280, height: int = 900, dark: bool = False) -> Iterator[Any]:
    """A headless Chromium WebDriver session (console messages logged at ALL)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = _first(CHROMIUM_CANDIDATES, "chromium")
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
        "--force-device-scale-factor=1",
    ):
        options.add_argument(arg)
    if dark:
        options.add_argument("--force-dark-mode")
        options.add_argument("--blink-settings=preferredColorScheme=0")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=_first(DRIVER_CANDIDATES, "chromedriver"))
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


def screenshot_full(driver: Any, path: Path, width: int = 1280) -> None:
    """Resize the window to the page height, then save a PNG of the whole page."""
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    driver.set_window_size(width, min(max(height, 600), 12000))
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))
