"""Debian's headless Chromium driven by selenium, for the QC report's browser test
(tests/test_qc_report_browser.py; the 2,000-scan measurement used it too, from
benchmarks/qc_report_scale.py, in git at a7cf031).

Nothing is downloaded at run time: the system's ``chromium`` and ``chromedriver`` (apt
packages chromium and chromium-driver; ``.ci/run`` installs them) and selenium from the
``dev`` extra. The flags keep Chromium from hanging on a closed network and from touching
anything outside its own fresh profile.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1300,900")


class BrowserUnavailable(RuntimeError):
    """Why no browser could be started, in one line."""


def start_chromium(profile: Path, downloads: Path) -> Any:
    """A headless Chromium (selenium driver) with a fresh profile in ``profile`` that saves
    downloads into ``downloads``; raises :class:`BrowserUnavailable` saying what is missing."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        raise BrowserUnavailable("selenium is not installed (pip install -e '.[dev]')") from exc
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not Path(path).is_file():
            raise BrowserUnavailable(f"{path} not found (apt-get install {package}; .ci/run "
                                     "does)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.add_experimental_option("prefs", {
        "download.default_directory": str(downloads), "download.prompt_for_download": False})
    try:
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    except Exception as exc:  # noqa: BLE001 - any failure to start, said in one line
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise BrowserUnavailable(f"headless Chromium did not start: {reason}") from exc
    driver.execute_cdp_cmd("Browser.setDownloadBehavior",
                           {"behavior": "allow", "downloadPath": str(downloads)})
    return driver
