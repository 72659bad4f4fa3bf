"""The visual QC report at cohort scale: 2,000 scans, the writer's time and memory, the page's
time to first paint in headless Chromium.

The 2,000 entries repeat a small preprocessed folder's scans (their sidecars, metrics and
QC pictures, the pictures hard-linked) under other ids (``sub-qc0001_ses-bl`` ...), in a
temporary folder. ``adni-pu qc`` runs on it in a child process (wall seconds, peak resident
memory of the child); then Debian's headless Chromium (benchmarks/chromium.py) opens the
page ``--loads`` times: first contentful paint, the page ready (table and strip plots
drawn: the ``qc-ready`` mark), sorting the table by a metric, and opening a scan until its
picture has loaded. Medians over the loads::

    adni-pu synth qc-src --subjects 6 --seed 0 --set 'visit_probabilities=[1,0,0]'
    (cd qc-src && adni-pu preprocess ADNI prep)
    python benchmarks/qc_report_scale.py --source qc-src/prep   # -> results/qc-report-scale.json
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import add_out, command_line, results_record, script_parser, write_json


def repeat_folder(source: Path, target: Path, n: int) -> int:
    """Write ``n`` scans into ``target`` by repeating ``source``'s under new ids; returns
    how many distinct source scans were repeated."""
    from adni_pu.preprocessing.derivatives import scan_names
    from adni_pu.preprocessing.qc_group import load_sidecars

    records = [r for r in load_sidecars(source) if r.get("_qc_png")]
    if not records:
        sys.exit(f"{source}: no scans with a QC picture (expected a folder written by "
                 "adni-pu preprocess)")
    for k in range(n):
        r = dict(records[k % len(records)])
        label = f"qc{k + 1:04d}"
        names = scan_names(label, "bl", "1p5mm")
        picture = Path(r.pop("_qc_png"))
        r.pop("_sidecar")
        r["scan_label"] = f"sub-{label}_ses-bl"
        r["outputs"] = {"qc": names["qc"], "sidecar": names["sidecar"]}
        for kind in ("qc", "sidecar"):
            (target / names[kind]).parent.mkdir(parents=True, exist_ok=True)
        os.link(picture, target / names["qc"])
        (target / names["sidecar"]).write_text(json.dumps(r))
    return len(records)


def write_report(folder: Path) -> dict:
    """``adni-pu qc folder`` in a child process: wall seconds and the child's peak RSS."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    tic = time.perf_counter()
    subprocess.run([sys.executable, "-c", "from adni_pu.cli.app import main; main()", "qc",
                    str(folder)], check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - tic
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
    page = folder / "qc" / "index.html"
    if peak <= before:
        raise RuntimeError("an earlier child's peak hides the writer's: run the writer first")
    return {"seconds": round(seconds, 2), "peak_rss_mb": round(peak / 1024, 1),
            "page_mb": round(page.stat().st_size / 2**20, 2)}


def browse(page: Path, loads: int) -> dict:
    """Medians over ``loads`` fresh loads of ``page`` in headless Chromium (milliseconds)."""
    from selenium.webdriver.common.by import By

    from benchmarks.chromium import start_chromium

    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        driver = start_chromium(Path(tmp) / "profile", Path(tmp))
        try:
            for _ in range(loads):
                driver.get("about:blank")  # each load a fresh navigation
                driver.get(page.resolve().as_uri())
                end = time.monotonic() + 60
                while not driver.execute_script(
                        "return document.body.dataset.ready"
                        " && performance.getEntriesByName('first-contentful-paint').length"):
                    if time.monotonic() > end:
                        raise RuntimeError("the page did not get ready in 60 s")
                    time.sleep(0.02)
                timing = driver.execute_script(
                    "const p = performance.getEntriesByName('first-contentful-paint')[0];"
                    "const r = performance.getEntriesByName('qc-ready')[0];"
                    "return [p ? p.startTime : null, r ? r.startTime : null,"
                    " document.querySelectorAll('#rows tr').length];")
                head = driver.find_element(By.XPATH, "//th[starts-with(., 'brain_volume_ml')]")
                sort_ms = driver.execute_script(
                    "const t = performance.now(); arguments[0].click(); return performance.now() - t;",
                    head)
                tic = time.perf_counter()
                driver.find_element(By.CSS_SELECTOR, "#rows tr").click()
                deadline = time.monotonic() + 30
                while not driver.execute_script(
                        "const i = document.querySelector('#figure img');"
                        "return i && i.complete && i.naturalWidth > 0"):
                    if time.monotonic() > deadline:
                        raise RuntimeError("the scan's picture did not load in 30 s")
                    time.sleep(0.01)
                open_ms = (time.perf_counter() - tic) * 1000
                rows.append({"first_contentful_paint_ms": timing[0], "ready_ms": timing[1],
                             "table_rows_drawn": timing[2], "sort_ms": sort_ms,
                             "open_scan_ms": open_ms})
                driver.execute_script("localStorage.clear()")
        finally:
            driver.quit()
    median = {k: round(statistics.median(r[k] for r in rows), 1) for k in rows[0]}
    return {"median": median, "loads": rows}


def main() -> None:
    p = script_parser(__doc__)
    p.add_argument("--source", type=Path, required=True,
                   help="a small folder written by adni-pu preprocess")
    p.add_argument("--scans", type=int, default=2000)
    p.add_argument("--loads", type=int, default=3, help="page loads in the browser")
    add_out(p, "qc-report-scale.json")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "prep"
        distinct = repeat_folder(args.source, folder, args.scans)
        writer = write_report(folder)
        page = browse(folder / "qc" / "index.html", args.loads)
    record = results_record(
        "qc-report-scale", command_line(__file__), f"{args.scans} entries repeating the "
        f"{distinct} scans of {args.source} (a preprocessed adni-pu synth download)",
        {"writer": writer, "browser": page},
        settings={"scans": args.scans, "loads": args.loads,
                  "browser": "Debian chromium, headless, 1300x900"})
    write_json(args.out, record)
    print(json.dumps({"writer": writer, "browser": page["median"]}, indent=2))
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
