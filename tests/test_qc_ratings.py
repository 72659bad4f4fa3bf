"""Visual QC ratings: the TSV's rules, merging two raters, the report's data and escaping,
``adni-pu qc --ratings/--merge`` and ``cohort build --qc-ratings`` (no browser here: the
browser test is tests/test_qc_report_browser.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from qc_folder import make_qc_folder
from typer.testing import CliRunner

from adni_pu.cli.app import app
from adni_pu.errors import DataFormatError
from adni_pu.preprocessing.qc_ratings import (
    Rating,
    merge_ratings,
    ratings_text,
    read_ratings,
    write_ratings,
)

HEADER = "scan_id\trating\tnote\trater\tdate\n"
runner = CliRunner()


def _tsv(path: Path, *lines: str) -> Path:
    path.write_text(HEADER + "".join(line + "\n" for line in lines))
    return path


def test_read_ratings_round_trips_and_cleans_tabs_and_line_breaks(tmp_path):
    ratings = [Rating("sub-a_ses-1", "fail", "cut\tthe\ncerebellum", "ab", "2026-12-07T08:00:00Z"),
               Rating("sub-b_ses-1", "pass")]
    path = tmp_path / "r.tsv"
    path.write_text(ratings_text(ratings))
    back = read_ratings(path, ["sub-a_ses-1", "sub-b_ses-1"])
    assert back["sub-a_ses-1"].note == "cut the cerebellum"
    assert [(r.scan_id, r.rating, r.line) for r in back.values()] == [
        ("sub-a_ses-1", "fail", 2), ("sub-b_ses-1", "pass", 3)]


@pytest.mark.parametrize("lines, message", [
    (["sub-a_ses-1\tpass\t\tab\t", "sub-x_ses-9\tfail\t\tab\t"],
     "line 3: scan 'sub-x_ses-9' is not in the preprocessing folder"),
    (["sub-a_ses-1\tmaybe\t\tab\t"], "line 2: rating 'maybe' of 'sub-a_ses-1' is not one of"),
    (["sub-a_ses-1\tpass\t\tab\t", "", "sub-a_ses-1\tfail\t\tcd\t"],
     "line 4: scan 'sub-a_ses-1' is rated twice (first on line 2)"),
    (["sub-a_ses-1\tpass"], "line 2: expected 5 tab-separated fields"),
])
def test_a_bad_ratings_file_is_refused_naming_the_line(tmp_path, lines, message):
    path = _tsv(tmp_path / "r.tsv", *lines)
    with pytest.raises(DataFormatError) as err:
        read_ratings(path, ["sub-a_ses-1", "sub-b_ses-1"])
    assert message in str(err.value) and str(path) in str(err.value)


def test_a_file_without_the_header_is_refused(tmp_path):
    path = tmp_path / "r.tsv"
    path.write_text("sub-a_ses-1\tpass\t\tab\t\n")
    with pytest.raises(DataFormatError, match="line 1: expected the header"):
        read_ratings(path)


def test_a_ratings_file_is_never_overwritten_without_a_copy(tmp_path):
    path = tmp_path / "qc_ratings.tsv"
    first, copy = write_ratings(path, [Rating("sub-a_ses-1", "pass")])
    assert copy is None
    _, copy = write_ratings(path, [Rating("sub-a_ses-1", "fail")])
    assert copy is not None and copy.name.startswith("qc_ratings.tsv.")
    assert "\tpass\t" in copy.read_text() and "\tfail\t" in path.read_text()


def test_merge_keeps_agreement_and_single_ratings_and_lists_disagreements():
    a = {"s1": Rating("s1", "pass", "ok", "ab", "1"), "s2": Rating("s2", "fail", "cut", "ab", "1"),
         "s3": Rating("s3", "unsure", "", "ab", "1")}
    b = {"s1": Rating("s1", "pass", "", "cd", "2"), "s2": Rating("s2", "pass", "fine", "cd", "2"),
         "s4": Rating("s4", "fail", "motion", "cd", "2")}
    merged, disagreements = merge_ratings(a, b)
    by_id = {r.scan_id: r for r in merged}
    assert [r.scan_id for r in merged] == ["s1", "s2", "s3", "s4"]
    assert (by_id["s1"].rating, by_id["s1"].rater) == ("pass", "ab+cd")
    assert by_id["s2"].rating == "unsure" and "ab: fail (cut)" in by_id["s2"].note
    assert "cd: pass (fine)" in by_id["s2"].note
    assert by_id["s3"].rating == "unsure" and by_id["s4"].rating == "fail"
    assert [d.scan_id for d in disagreements] == ["s2"]


def _page_data(page: Path) -> dict:
    text = page.read_text()
    blob = re.search(r'<script id="qc-data" type="application/json">(.*?)</script>', text, re.S)
    return json.loads(blob.group(1))


def test_the_report_lists_every_scan_outliers_first_with_pictures_and_limits(tmp_path):
    prep, _, ids = make_qc_folder(tmp_path, n=8, refused=1)
    result = runner.invoke(app, ["qc", str(prep)])
    assert result.exit_code == 0, result.output
    data = _page_data(prep / "qc" / "index.html")
    scans = data["scans"]
    assert sorted(s["id"] for s in scans) == sorted(ids) and scans[0]["id"] == ids[-1]
    assert all((prep / "qc" / s["fig"]).is_file() for s in scans)  # relative links
    volume = next(m for m in data["metrics"] if m["name"] == "brain_volume_ml")
    assert (volume["lo"], volume["hi"]) == (700.0, 2500.0)
    k = [m["name"] for m in data["metrics"]].index("brain_volume_ml")
    assert scans[0]["z"][k] < -3  # the refused scan's 520 ml is far below the others'


def test_scan_ids_and_notes_cannot_inject_markup(tmp_path):
    prep, _, ids = make_qc_folder(tmp_path, n=4, refused=0)
    side = next(prep.glob("sub-*/ses-*/anat/*_desc-preproc_T1w.json"))
    record = json.loads(side.read_text())
    record["scan_label"] = "sub-</script><img src=x onerror=alert(1)>_ses-1"
    side.write_text(json.dumps(record))
    evil = record["scan_label"]
    ratings = _tsv(tmp_path / "r.tsv", f"{evil}\tfail\t<b>bold</b> & </script>\tab\t")
    result = runner.invoke(app, ["qc", str(prep), "--ratings", str(ratings)])
    assert result.exit_code == 0, result.output
    page = (prep / "qc" / "index.html").read_text()
    assert "<img src=x" not in page and "<b>bold" not in page and page.count("</script>") == 2
    data = _page_data(prep / "qc" / "index.html")
    assert evil in [s["id"] for s in data["scans"]]
    assert data["ratings"][0]["note"] == "<b>bold</b> & </script>"


def test_qc_refuses_a_ratings_file_naming_another_folders_scan(tmp_path):
    prep, _, ids = make_qc_folder(tmp_path, n=4, refused=0)
    ratings = _tsv(tmp_path / "r.tsv", f"{ids[0]}\tpass\t\tab\t", "sub-other_ses-1\tfail\t\tab\t")
    result = runner.invoke(app, ["qc", str(prep), "--ratings", str(ratings)])
    assert result.exit_code == 2
    assert "r.tsv line 3: scan 'sub-other_ses-1' is not in the preprocessing folder" in \
        " ".join(result.output.split())
    assert not (prep / "qc").exists()


def test_qc_merge_writes_the_merged_file_lists_disagreements_and_keeps_a_copy(tmp_path):
    prep, _, ids = make_qc_folder(tmp_path, n=4, refused=0)
    a = _tsv(tmp_path / "a.tsv", f"{ids[0]}\tpass\t\tab\t1", f"{ids[1]}\tfail\tcut\tab\t1")
    b = _tsv(tmp_path / "b.tsv", f"{ids[0]}\tpass\t\tcd\t2", f"{ids[1]}\tpass\t\tcd\t2")
    args = ["qc", str(prep), "--merge", str(a), "--merge", str(b)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "1 disagreement(s)" in result.output and f"{ids[1]}: ab fail, cd pass" in result.output
    merged = read_ratings(prep / "qc" / "qc_ratings_merged.tsv", ids)
    assert merged[ids[0]].rating == "pass" and merged[ids[1]].rating == "unsure"
    assert ids[1] in (prep / "qc" / "qc_disagreements.tsv").read_text()
    assert [r["id"] for r in _page_data(prep / "qc" / "index.html")["ratings"]] == ids[:2]
    result = runner.invoke(app, args)  # a second merge keeps the first one's file
    assert result.exit_code == 0 and len(list((prep / "qc").glob("qc_ratings_merged.tsv.*"))) == 1


def _build(tmp_path: Path, prep: Path, clinical: Path, ratings: Path):
    return runner.invoke(app, ["cohort", "build", str(clinical), str(prep / "summary.csv"),
                               str(tmp_path / "cohort"), "--preset", "tracer-cutoffs",
                               "--qc-ratings", str(ratings)])


def test_cohort_build_leaves_out_fail_keeps_unsure_and_says_so(tmp_path):
    prep, clinical, ids = make_qc_folder(tmp_path, n=9, refused=0)
    ratings = _tsv(tmp_path / "r.tsv", f"{ids[0]}\tfail\tmotion\tab\t", f"{ids[1]}\tunsure\t\tab\t",
                   f"{ids[2]}\tpass\t\tab\t")
    result = _build(tmp_path, prep, clinical, ratings)
    assert result.exit_code == 0, result.output
    out = tmp_path / "cohort"
    excluded = pd.read_csv(out / "excluded.csv", dtype=str)
    assert list(excluded["reason"]) == ["rated fail by ab in the visual QC: motion"]
    manifest = pd.read_csv(out / "manifest.csv", dtype=str)
    kept = {Path(p).name.split("_space-")[0] for p in manifest["scan_path"]}
    assert ids[0] not in kept and {ids[1], ids[2]} <= kept
    quality = pd.read_csv(out / "quality.csv", dtype=str)
    assert set(quality["kind"]) >= {"scan_rated_fail", "scan_rated_unsure"}
    summary = json.loads((out / "cohort.json").read_text())
    assert summary["qc_ratings"]["left_out"] == 1 and summary["qc_ratings"]["kept_unsure"] == 1
    assert summary["inputs"]["qc_ratings"]["path"] == str(ratings.resolve())


def test_cohort_build_refuses_a_bad_ratings_file_naming_the_line(tmp_path):
    prep, clinical, ids = make_qc_folder(tmp_path, n=6, refused=0)
    ratings = _tsv(tmp_path / "r.tsv", f"{ids[0]}\tfail\t\tab\t", f"{ids[0]}\tpass\t\tab\t")
    result = _build(tmp_path, prep, clinical, ratings)
    assert result.exit_code == 2
    assert "r.tsv line 3: scan" in result.output and "rated twice" in result.output
    assert not (tmp_path / "cohort" / "manifest.csv").exists()


def test_qc_is_refused_while_another_process_writes_the_folder(tmp_path):
    import threading

    from adni_pu.locking import output_lock

    prep, _, ids = make_qc_folder(tmp_path, n=4, refused=0)
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with output_lock(prep, "preprocess"):
            held.set()
            done.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        held.wait(10)
        result = runner.invoke(app, ["qc", str(prep)])
    finally:
        done.set()
        thread.join()
    assert result.exit_code == 2 and "in use by pid" in result.output
    assert "adni-pu qc cannot write there at the same time" in result.output
    assert not (prep / "qc" / "index.html").exists()


def test_a_fail_rating_that_matches_no_row_is_a_warning_not_silence(tmp_path):
    prep, clinical, ids = make_qc_folder(tmp_path, n=7, refused=0)
    summary = (prep / "summary.csv").read_text()  # the folder moved: paths elsewhere
    (prep / "summary.csv").write_text(summary.replace(f"sub-{ids[0][4:12]}/", "/moved/"))
    ratings = _tsv(tmp_path / "r.tsv", f"{ids[0]}\tfail\tmotion\tab\t")
    result = _build(tmp_path, prep, clinical, ratings)
    assert result.exit_code == 0, result.output
    quality = pd.read_csv(tmp_path / "cohort" / "quality.csv", dtype=str)
    row = quality[quality["kind"] == "qc_rating_unmatched"]
    assert list(row["severity"]) == ["warning"] and f"line 2: {ids[0]}" in row["examples"].iloc[0]
