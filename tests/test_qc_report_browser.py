"""The QC report in a real browser: headless Chromium (Debian's chromium and chromedriver,
driven by selenium; nothing is downloaded at run time) opens the report of a small
preprocessing folder, opens a scan from a metric's strip plot, sorts, opens a scan from the
table, rates two scans with the keyboard, saves the ratings, loads them back into a fresh
page, and ``cohort build --qc-ratings`` leaves out the scan rated fail.

Skips, with one line saying why, where the browser or selenium cannot be had
(``.ci/run`` installs them; selenium comes with the ``dev`` extra; the launcher and its
flags: tests/chromium.py).
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest
from qc_folder import make_qc_folder
from typer.testing import CliRunner

from adni_pu.cli.app import app


def browser(profile: Path, downloads: Path):
    """A headless Chromium that saves downloads into ``downloads``, or a skip saying why."""
    from chromium import BrowserUnavailable, start_chromium

    try:
        return start_chromium(profile, downloads)
    except BrowserUnavailable as exc:
        pytest.skip(str(exc))


def _wait(condition, what: str, timeout: float = 10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_report_in_chromium_rates_two_scans_and_the_cohort_leaves_out_the_failed_one(tmp_path):
    from selenium.webdriver.common.by import By  # after the skip checks of browser()

    prep, clinical, ids = make_qc_folder(tmp_path, n=12, refused=1)
    result = CliRunner().invoke(app, ["qc", str(prep)])
    assert result.exit_code == 0, result.output
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    driver = browser(tmp_path / "profile", downloads)
    try:
        driver.get((prep / "qc" / "index.html").resolve().as_uri())
        _wait(lambda: driver.execute_script("return document.body.dataset.ready"), "the page")
        listed = [tr.get_attribute("data-id") for tr in driver.find_elements(By.CSS_SELECTOR,
                                                                               "#rows tr")]
        assert sorted(listed) == sorted(ids)  # every scan, the refused one first
        assert listed[0] == ids[-1]

        # a click on a point of a metric's strip opens that point's scan
        opened = driver.execute_script("""
            const c = document.querySelector('#strips canvas'), r = c.getBoundingClientRect();
            for (let x = 0; x < c.width; x += 3) for (let y = 0; y < c.height; y += 3) {
              c.dispatchEvent(new MouseEvent('click', {clientX: r.left + x, clientY: r.top + y}));
              if (location.hash) return decodeURIComponent(location.hash);
            }
            return null;""")
        assert opened is not None and opened.removeprefix("#scan=") in ids
        _wait(lambda: driver.find_element(By.ID, "scan").is_displayed(), "the clicked scan")
        assert driver.find_element(By.ID, "scan-id").text == opened.removeprefix("#scan=")
        driver.find_element(By.ID, "back").click()
        _wait(lambda: driver.find_element(By.ID, "group").is_displayed(), "the table")

        # sort by brain volume, largest first (a second click reverses)
        header = next(th for th in driver.find_elements(By.CSS_SELECTOR, "#head th")
                      if th.text.startswith("brain_volume_ml"))
        header.click()
        driver.find_element(By.XPATH, "//th[starts-with(., 'brain_volume_ml')]").click()
        rows = driver.find_elements(By.CSS_SELECTOR, "#rows tr")
        column = [th.text for th in driver.find_elements(By.CSS_SELECTOR, "#head th")].index(
            driver.find_element(By.XPATH, "//th[starts-with(., 'brain_volume_ml')]").text)
        volumes = [float(r.find_elements(By.TAG_NAME, "td")[column].text.split()[0])
                   for r in rows]
        assert volumes == sorted(volumes, reverse=True) and len(volumes) == len(ids)
        first, second = (r.get_attribute("data-id") for r in rows[:2])

        # open the largest: its picture loads from the folder
        rows[0].click()
        _wait(lambda: driver.find_element(By.ID, "scan").is_displayed(), "the scan view")
        assert driver.find_element(By.ID, "scan-id").text == first
        _wait(lambda: driver.execute_script(
            "const i = document.querySelector('#figure img'); return i && i.naturalWidth"),
            "the QC picture")

        # rate it fail with a note, then (the view moves on) the next one pass: keys only
        driver.find_element(By.ID, "rater").send_keys("ab")
        body = driver.find_element(By.TAG_NAME, "body")
        body.click()
        body.send_keys("n")
        driver.switch_to.active_element.send_keys("mask cuts <the> cerebellum\n")
        body.send_keys("f")
        _wait(lambda: driver.find_element(By.ID, "scan-id").text == second, "the next scan")
        body.send_keys("p")
        body.send_keys("s")
        saved = _wait(lambda: (downloads / "qc_ratings.tsv").is_file()
                      and downloads / "qc_ratings.tsv", "the download")

        # resume: a fresh page (nothing kept in the browser) loads the saved file
        driver.execute_script("localStorage.clear(); location.hash = '#'")
        driver.refresh()
        _wait(lambda: driver.execute_script("return document.body.dataset.ready"), "the page")
        assert "rated 0 " in driver.find_element(By.ID, "counts").text
        driver.find_element(By.ID, "load").send_keys(str(saved))
        _wait(lambda: "rated 2 (pass 1, fail 1, unsure 0)" in driver.find_element(
            By.ID, "counts").text, "the loaded ratings")
    finally:
        driver.quit()

    from adni_pu.preprocessing.qc_ratings import read_ratings

    ratings = read_ratings(saved, ids)
    assert {k: v.rating for k, v in ratings.items()} == {first: "fail", second: "pass"}
    assert ratings[first].note == "mask cuts <the> cerebellum" and ratings[first].rater == "ab"

    out = tmp_path / "cohort"
    result = CliRunner().invoke(app, ["cohort", "build", str(clinical), str(prep / "summary.csv"),
                                      str(out), "--preset", "tracer-cutoffs",
                                      "--qc-ratings", str(saved)])
    assert result.exit_code == 0, result.output
    excluded = pd.read_csv(out / "excluded.csv", dtype=str)
    failed = excluded[excluded["reason"].str.startswith("rated fail")]
    subject = first.split("_")[0].removeprefix("sub-")
    assert [s.replace("_", "") for s in failed["subject"]] == [subject]
    assert failed["reason"].iloc[0] == ("rated fail by ab in the visual QC: mask cuts <the> "
                                        "cerebellum")
    manifest = pd.read_csv(out / "manifest.csv", dtype=str)
    kept = {Path(p).name.split("_space-")[0] for p in manifest["scan_path"]}
    assert first not in kept and second in kept
