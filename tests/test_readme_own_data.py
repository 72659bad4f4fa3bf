"""The README's own-data block ("Your ADNI download") runs, unedited, on a synthetic ADNI
download and gives what it promises.

The block is read from README.md at test time, so the test follows any change to it. It
runs in the download folder with ``bash -euo pipefail``, the project's environment first on
PATH and ``EPOCHS`` exported (the block's own ``EPOCHS=${EPOCHS:-60}`` keeps it): nothing
else differs from what a user pastes. The download (``adni-pu synth``) has the fewest
subjects whose default cohort splits all hold labelled positives (18, one MRI visit each;
tests/test_synth_adni_download.py checks that composition), so the test takes minutes, not
seconds: every scan goes through the real preprocessing with its default settings.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SECTION = "## Your ADNI download"
#: The steps the block must take, in this order (the issue's path from download to results).
STEPS = ("adni-pu preprocess", "adni-pu qc", "adni-pu cohort build", "adni-pu benchmark cohort",
         "adni-pu train",
         "adni-pu evaluate", "adni-pu interpret", "adni-pu predict")


def readme_block() -> str:
    """The one fenced bash block of the README's section "Your ADNI download"."""
    text = README.read_text(encoding="utf-8")
    assert f"\n{SECTION}\n" in text, f"README.md has no section {SECTION!r}"
    section = text.split(f"\n{SECTION}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```bash\n(.*?)^```", section, re.S | re.M)
    assert len(blocks) == 1, f"{SECTION}: expected one bash block, found {len(blocks)}"
    return blocks[0]


def split_at_rating(block: str) -> tuple[str, str]:
    """The block before and from ``adni-pu cohort build``: between them a person rates the
    scans in the QC report and saves qc_ratings.tsv, which the test does in their place."""
    lines = block.splitlines(keepends=True)
    at = next(k for k, line in enumerate(lines) if line.startswith("adni-pu cohort build"))
    return "".join(lines[:at]), "".join(lines[at:])


def commands(block: str) -> list[str]:
    """The block's command lines, comments stripped."""
    lines = [line.split("  #", 1)[0].strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_block_goes_from_download_to_predictions_and_only_epochs_varies():
    lines = commands(readme_block())
    assert lines[0].startswith("EPOCHS=${EPOCHS:-"), lines[0]
    starts = [next((k for k, line in enumerate(lines) if line.startswith(step)), None)
              for step in STEPS]
    assert None not in starts and starts == sorted(starts), list(zip(STEPS, starts))
    variables = set(re.findall(r"\$\{?([A-Za-z_]\w*)", "\n".join(lines)))
    assert variables == {"EPOCHS", "FOLDS"}, variables
    assert lines[1].startswith("FOLDS=${FOLDS:-"), lines[1]
    assert sum("--set train.epochs=$EPOCHS" in line for line in lines) == 2  # compare, train
    assert any("--folds $FOLDS" in line for line in lines)


def test_the_cohort_takes_the_ratings_saved_from_the_qc_report():
    before, after = split_at_rating(readme_block())
    assert any(line.startswith("adni-pu qc prep") for line in commands(before))
    assert "prep/qc/index.html" in before  # where the rater looks
    build = commands(after)[0]
    assert build.startswith("adni-pu cohort build") and "--qc-ratings qc_ratings.tsv" in build


def _rate(download: Path) -> str:
    """Rate every scan of ``prep`` as a person would in the report: pass, one unsure with a
    note (a fail could leave a split without labelled positives in this smallest download);
    returns the unsure scan's id."""
    from adni_pu.preprocessing.qc_group import load_sidecars
    from adni_pu.preprocessing.qc_ratings import Rating, ratings_text
    from adni_pu.preprocessing.qc_report import scan_id

    records = sorted(load_sidecars(download / "prep"), key=scan_id)
    unsure = next(scan_id(r) for r in records if r.get("status") == "done")
    ratings = [Rating(scan_id(r), "unsure" if scan_id(r) == unsure else "pass",
                      "ringing?" if scan_id(r) == unsure else "", "test", "2026-12-07T08:00:00Z")
               for r in records]
    (download / "qc_ratings.tsv").write_text(ratings_text(ratings))
    return unsure


def test_the_amyloid_glob_matches_the_one_table_of_a_download(tmp_path):
    from adni_pu.synth.adni_download import amyloid_file_name

    glob = next(re.search(r"--amyloid (\S+)", line).group(1)
                for line in commands(readme_block()) if line.startswith("adni-pu cohort build"))
    (tmp_path / amyloid_file_name()).write_text("")
    (tmp_path / "UCBERKELEY_TAU_6MM_28Jul2025.csv").write_text("")  # another Berkeley table
    assert [p.name for p in tmp_path.glob(glob)] == [amyloid_file_name()]


def _environment() -> dict[str, str]:
    venv_bin = Path(sys.executable).parent  # the interpreter running the tests: .venv/bin
    assert (venv_bin / "adni-pu").is_file(), f"{venv_bin}: no adni-pu console script"
    env = dict(os.environ)
    env["PATH"] = f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv_bin.parent)
    env["EPOCHS"] = "1"
    env["FOLDS"] = "3"  # its 3 labelled positives allow 3 to 5 folds (2 leave a val split without)
    return env


def _run(argv: list[str], cwd: Path, env: dict[str, str], log: Path, timeout: int) -> None:
    with open(log, "w") as out:
        proc = subprocess.run(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                              timeout=timeout)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-6000:]
        pytest.fail(f"{' '.join(argv[:3])} ... exited {proc.returncode}; last output:\n{tail}")


def test_readme_block_runs_on_a_synthetic_adni_download(tmp_path):
    env = _environment()
    download = tmp_path / "download"
    _run(["adni-pu", "synth", str(download), "--subjects", "18", "--seed", "0",
          "--set", "visit_probabilities=[1,0,0]"], tmp_path, env, tmp_path / "synth.log", 600)
    before, after = split_at_rating(readme_block())
    _run(["bash", "-euo", "pipefail", "-c", before], download, env, tmp_path / "block.log", 3600)
    unsure = _rate(download)
    _run(["bash", "-euo", "pipefail", "-c", after], download, env, tmp_path / "block2.log", 3600)

    # preprocess: every image folder got the status the generator planned for it
    summary = pd.read_csv(download / "prep" / "summary.csv", dtype=str, keep_default_na=False)
    images = pd.read_csv(download / "synth" / "images.csv", dtype=str)
    assert dict(zip(summary["image_id"], summary["status"])) == dict(
        zip(images["image_id"], images["expected_status"]))
    done = summary[summary["status"] == "done"]
    assert len(done) == 18 and (summary["status"] == "not-t1").any()
    volumes = {Path(download / "prep", p).resolve() for p in done["preprocessed_path"]}
    assert len(volumes) == 18 and all(v.is_file() for v in volumes)
    assert (download / "prep" / "qc" / "index.html").is_file()

    # cohort build: a manifest of the preprocessed scans, split by subject
    manifest = pd.read_csv(download / "cohort" / "manifest.csv", dtype={"subject_id": str})
    assert {Path(p).resolve() for p in manifest["scan_path"]} == volumes
    assert set(manifest["split"]) == {"train", "val", "test"}
    assert (download / "cohort" / "cohort_report.md").is_file()
    quality = pd.read_csv(download / "cohort" / "quality.csv", dtype=str)
    assert unsure in quality.loc[quality["kind"] == "scan_rated_unsure", "examples"].iloc[0]

    # the comparison: every method on 3 folds of all 18 subjects, pooled and paired
    compare = download / "runs" / "compare"
    held = []
    for fold in range(3):
        frame = pd.read_csv(compare / "folds" / f"fold-{fold}" / "manifest.csv")
        held += list(frame.loc[frame["split"] == "test", "subject_id"])
        for method in ("naive", "nnpu", "selfpu"):
            assert (compare / "pieces" / method / f"fold-{fold}" / "seed-0" / "piece.json"
                    ).is_file()
    assert sorted(held) == sorted(manifest["subject_id"])  # each subject held out once
    compared = (compare / "report.md").read_text()
    assert "| selfpu - nnpu |" in compared and "## Calibration" in compared
    assert {p.name for p in (compare / "records").iterdir()} == {
        "naive.json", "nnpu.json", "selfpu.json"}
    # train and evaluate: a run folder and the test report
    run = download / "runs" / "selfpu"
    assert (run / "run.json").is_file() and (run / "best_model.pt").is_file()
    report = run / "evaluation" / "test" / "report.md"
    assert report.is_file()

    # interpret: one map per test scan on the model grid, group means, linked from the report
    import nibabel as nib

    maps = pd.read_csv(run / "interpret" / "scans.csv", dtype={"subject_id": str})
    test_scans = manifest[manifest["split"] == "test"]
    assert sorted(maps["subject_id"]) == sorted(test_scans["subject_id"])
    grid = nib.load(next(iter(volumes)))
    for name in maps["map"]:
        image = nib.load(run / "interpret" / name)
        assert image.shape == grid.shape and (abs(image.affine - grid.affine) < 1e-4).all()
    assert list((run / "interpret").glob("group-*.nii.gz"))
    links = re.findall(r"\]\((\.\./\.\./interpret/[^)]+)\)", report.read_text())
    assert links and all((report.parent / link).is_file() for link in links)

    # predict: one probability per preprocessed volume, nothing else
    predictions = pd.read_csv(run / "predictions.csv", keep_default_na=False)
    assert sorted((download / p).resolve() for p in predictions["scan"]) == sorted(volumes)
    probability = pd.to_numeric(predictions["probability"])
    assert probability.between(0, 1).all()
