"""Slurm scale-out (adni_pu.cluster): the merge, the jobs run by submitit's LocalExecutor,
and the sbatch files submitit writes for Slurm (a stand-in `sbatch` records them)."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import nibabel as nib
import pandas as pd
import pytest
from volume_helpers import make_volume_cohort, tiny_overrides

from adni_pu.cluster import (
    ClusterError,
    Scheduler,
    merge_shards,
    submit_preprocessing,
    submit_training,
)
from adni_pu.preprocessing import discover_scans, load_config
from adni_pu.preprocessing.phantom import synthetic_head
from adni_pu.preprocessing.summary import SUMMARY_COLUMNS, shard_summary_path, write_summary

FAST = ['skullstrip.method="template"', "registration.resolution_mm=4.0",
        "registration.iterations=[50, 20]", "registration.shrink_factors=[2, 1]",
        "registration.smoothing_sigmas=[1.0, 0.0]", "grid.spacing_mm=3.0",
        "grid.shape=[61, 73, 61]"]


def _rows(names: list[str]) -> pd.DataFrame:
    return pd.DataFrame([{"subject_id": n, "session_id": "01", "input_path": f"/in/{n}.nii",
                          "status": "done", "preprocessed_path": f"/out/{n}.nii.gz",
                          "error": "", "seconds": 1.5} for n in names], columns=SUMMARY_COLUMNS)


def test_merge_sorts_the_shards_rows_by_subject_and_session(tmp_path) -> None:
    scans = [f"s{i}" for i in range(7)]
    for i in (1, 2, 3):  # shard i took scans[i-1::3]
        write_summary(_rows(scans[i - 1::3]), tmp_path, f"{i}/3")
    merged = merge_shards(tmp_path, 3)
    assert list(merged["subject_id"]) == scans
    on_disk = pd.read_csv(tmp_path / "summary.csv", dtype={"subject_id": str, "session_id": str},
                          keep_default_na=False)
    assert list(on_disk.columns) == SUMMARY_COLUMNS
    assert list(on_disk["subject_id"]) == scans and list(on_disk["session_id"]) == ["01"] * 7


def test_merge_refuses_missing_or_foreign_shards_and_writes_nothing(tmp_path) -> None:
    write_summary(_rows(["a", "c"]), tmp_path, "1/3")
    write_summary(_rows(["b"]), tmp_path, "2/3")
    with pytest.raises(ClusterError, match=r"summary_shard-3-of-3\.csv"):
        merge_shards(tmp_path, 3)
    shard_summary_path(tmp_path, 3, 3).write_text("subject_id,status\nx,done\n")
    with pytest.raises(ClusterError, match=r"summary_shard-3-of-3\.csv: columns: expected "):
        merge_shards(tmp_path, 3)
    assert not (tmp_path / "summary.csv").exists()
    with pytest.raises(ClusterError, match="shards: expected a count >= 1, found 0"):
        merge_shards(tmp_path, 0)


def test_local_executor_preprocesses_shards_then_merges(tmp_path) -> None:
    """Two array tasks (one real synthetic head, one broken file) and the merge job."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    head = synthetic_head(seed=3)
    nib.save(nib.Nifti1Image(head.data, head.affine), str(inputs / "headA.nii.gz"))
    (inputs / "broken.nii.gz").write_bytes(b"\x1f\x8b truncated")
    out = tmp_path / "out"
    jobs = submit_preprocessing(inputs, out, 2, scheduler=Scheduler(tmp_path / "logs", "local"),
                                config=load_config(None, FAST), timeout_min=10)
    merged = jobs.result()
    assert [j.result() for j in jobs.shards] == [{"failed": 1}, {"done": 1}]
    order = [s.subject_id for s in discover_scans(inputs)]
    assert list(merged["subject_id"]) == order == ["broken", "headA"]
    assert dict(zip(merged.subject_id, merged.status)) == {"broken": "failed", "headA": "done"}
    assert Path(merged.set_index("subject_id").loc["headA", "preprocessed_path"]).is_file()
    on_disk = pd.read_csv(out / "summary.csv")
    assert list(on_disk["status"]) == ["failed", "done"]
    for i in (1, 2):
        assert shard_summary_path(out, i, 2).is_file()


def _train_locally(tmp_path: Path, tasks: int, cluster: str = "local",
                   epochs: int = 2) -> list[dict]:
    manifest = make_volume_cohort(tmp_path / "cohort")
    job = submit_training(manifest, tmp_path / "run", scheduler=Scheduler(tmp_path / "logs", cluster),
                          gpus=0, tasks=tasks, preset="nnpu", overrides=tiny_overrides(epochs),
                          timeout_min=10)
    results = job.results()
    assert len(results) == tasks
    for result in results:
        assert result["run"] == str((tmp_path / "run").resolve())
        assert result["best_epoch"] in (0, 1)
        assert result["world_size"] == tasks
    assert (tmp_path / "run" / "best_model.pt").is_file()
    return results


def test_the_training_job_runs_under_submitit_in_this_process(tmp_path) -> None:
    """submit_training's job, fast: submitit's DebugExecutor runs it in this process (the
    LocalExecutor tests below start processes and are slow)."""
    _train_locally(tmp_path, 1, cluster="debug", epochs=1)


@pytest.mark.slow
def test_local_executor_trains(tmp_path) -> None:
    _train_locally(tmp_path, 1)


@pytest.mark.slow
def test_local_executor_trains_two_ranks(tmp_path) -> None:
    """Two tasks of one job: submitit's variables join the DDP group (gloo); ranks agree."""
    results = _train_locally(tmp_path, 2)
    assert results[0] == results[1]


# ------------------------------------------------------------------ Slurm submission files

FAKE_SBATCH = """#!/bin/sh
# stand-in for sbatch: keep the script it was given, answer like Slurm
n=$(ls "{record}" | wc -l)
cp "$1" "{record}/$n.sh"
echo "Submitted batch job $((4200 + n))"
"""


@pytest.fixture
def fake_sbatch(tmp_path, monkeypatch) -> Path:
    record = tmp_path / "submitted"
    record.mkdir()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "sbatch"
    script.write_text(FAKE_SBATCH.format(record=record))
    (bindir / "srun").write_text("#!/bin/sh\nexit 1\n")  # submitit looks for it
    for tool in bindir.iterdir():
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return record


def _sbatch(text: str) -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(.*))?$", text, re.M))


def test_slurm_array_then_merge_after_every_shard(tmp_path, fake_sbatch) -> None:
    python = "apptainer exec --bind /scratch adni-pu.sif python"
    jobs = submit_preprocessing(tmp_path / "bids", tmp_path / "out", 3,
                                scheduler=Scheduler(tmp_path / "logs", "slurm", python),
                                workers=4,
                                slurm_partition="cpu", cpus_per_task=4, timeout_min=240,
                                slurm_array_parallelism=2)
    array, merge = (fake_sbatch / "0.sh").read_text(), (fake_sbatch / "1.sh").read_text()
    opts = _sbatch(array)
    assert opts["array"] == "0-2%2" and opts["partition"] == "cpu"
    assert opts["cpus-per-task"] == "4" and opts["time"] == "240"
    assert opts["job-name"] == "adni-pu-preprocess"
    assert f"{python} -u -m submitit.core._submit" in array
    assert [j.job_id for j in jobs.shards] == ["4200_0", "4200_1", "4200_2"]
    mopts = _sbatch(merge)
    assert mopts["dependency"] == "afterok:4200"
    assert mopts["partition"] == "cpu" and mopts["cpus-per-task"] == "1"
    assert mopts["job-name"] == "adni-pu-merge" and "array" not in mopts
    assert jobs.merge.job_id == "4201"


def test_slurm_training_takes_one_task_per_gpu(tmp_path, fake_sbatch) -> None:
    job = submit_training(tmp_path / "cohort", tmp_path / "run",
                          scheduler=Scheduler(tmp_path / "logs", "slurm"), gpus=4,
                          preset="selfpu", overrides=['train.device="cuda"'],
                          slurm_partition="gpu", timeout_min=1440)
    opts = _sbatch((fake_sbatch / "0.sh").read_text())
    assert opts["gpus-per-node"] == "4" and opts["ntasks-per-node"] == "4"
    assert opts["nodes"] == "1" and opts["partition"] == "gpu"
    assert job.job_id == "4200"
    with pytest.raises(ClusterError, match="one per GPU"):
        submit_training(tmp_path / "c", tmp_path / "r", scheduler=Scheduler(tmp_path / "logs", "slurm"),
                        gpus=2, tasks=3)


# ------------------------------------------------------------------ plain sbatch scripts

SLURM_DIR = Path(__file__).resolve().parents[1] / "docker" / "slurm"

FAKE_APPTAINER = """#!/bin/sh
# stand-in for apptainer: drop the verb, its options and the image; run the rest here
verb=$1; shift
while [ $# -gt 0 ]; do
  case $1 in --nv) shift ;; --bind) shift 2 ;; *) break ;; esac
done
shift
if [ "$verb" = run ]; then exec adni-pu "$@"; else exec "$@"; fi
"""


@pytest.fixture
def fake_apptainer(tmp_path, monkeypatch) -> Path:
    """`apptainer` (and a recording `torchrun`) on the PATH, before this environment's bin."""
    import sys

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "apptainer").write_text(FAKE_APPTAINER)
    (bindir / "torchrun").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/torchrun.args\n')
    for tool in bindir.iterdir():
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    path = os.pathsep.join([str(bindir), str(Path(sys.executable).parent), os.environ["PATH"]])
    monkeypatch.setenv("PATH", path)
    return bindir


def _sbatch_run(script: str, args: list[str], cwd: Path, **env: str):
    import subprocess

    return subprocess.run(["bash", str(SLURM_DIR / script), *args], cwd=cwd, text=True,
                          capture_output=True, env={**os.environ, **env})


def test_sbatch_scripts_pass_shellcheck() -> None:
    import shutil
    import subprocess
    import sys

    tool = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or \
        shutil.which("shellcheck")
    assert tool, "shellcheck not found: install the dev extras (bash scripts/setup.sh)"
    scripts = sorted(str(p) for p in SLURM_DIR.glob("*.sbatch"))
    assert len(scripts) == 3
    res = subprocess.run([tool, *scripts], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout


def test_sbatch_array_tasks_then_merge(tmp_path, fake_apptainer) -> None:
    """Two array tasks (scans that fail are rows, not failed tasks), then the merge."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for name in ("a", "b", "c"):
        (raw / f"{name}.nii.gz").write_bytes(b"\x1f\x8b truncated")
    out = tmp_path / "out"
    with pytest.raises(ClusterError):
        merge_shards(out, 2)
    res = _sbatch_run("merge.sbatch", [str(out), "2"], tmp_path)
    assert res.returncode != 0 and "summary_shard-1-of-2.csv" in res.stderr
    for i in (1, 2):
        res = _sbatch_run("preprocess.sbatch", [str(raw), str(out)], tmp_path,
                          SLURM_ARRAY_TASK_ID=str(i), SLURM_ARRAY_TASK_COUNT="2",
                          SLURM_CPUS_PER_TASK="1")
        assert res.returncode == 0, res.stderr
    res = _sbatch_run("merge.sbatch", [str(out), "2"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert "3 scans: {'failed': 3}" in res.stdout
    merged = pd.read_csv(out / "summary.csv")
    assert list(merged["subject_id"]) == ["a", "b", "c"]
    # bad input is the task's failure (exit 2), not a row
    res = _sbatch_run("preprocess.sbatch", [str(tmp_path / "nowhere"), str(out)], tmp_path,
                      SLURM_ARRAY_TASK_ID="1", SLURM_ARRAY_TASK_COUNT="2")
    assert res.returncode == 2 and "nowhere" in res.stderr
    res = _sbatch_run("preprocess.sbatch", [str(raw), str(out)], tmp_path)
    assert res.returncode == 2 and "usage: sbatch --array=1-N" in res.stderr


def test_sbatch_train_runs_torchrun_on_every_gpu(tmp_path, fake_apptainer) -> None:
    from typer.testing import CliRunner

    from adni_pu.cli.app import app

    res = _sbatch_run("train.sbatch", ["/runs/cohort", "/runs/train/selfpu", "--preset",
                                       "selfpu"], tmp_path)
    assert res.returncode == 0, res.stderr
    args = (tmp_path / "torchrun.args").read_text().splitlines()
    assert args[:4] == ["--standalone", "--nproc_per_node", "gpu", "--no-python"]
    assert args[4] == "adni-pu"
    cli = args[5:]
    assert cli == ["train", "/runs/cohort", "/runs/train/selfpu", "--set",
                   'train.device="cuda"', "--preset", "selfpu"]
    assert CliRunner().invoke(app, [*cli, "--help"]).exit_code == 0


def test_slurm_comparison_array_then_report(tmp_path, fake_sbatch) -> None:
    from adni_pu.cluster import submit_comparison
    from adni_pu.workflows.compare.pieces import CompareSpec

    manifest = make_volume_cohort(tmp_path / "cohort")
    spec = CompareSpec(manifest=str(manifest), out=str(tmp_path / "out"),
                       methods=("naive", "nnpu"), folds=2, seeds=1)
    jobs = submit_comparison(spec, 4, scheduler=Scheduler(tmp_path / "logs", "slurm"),
                             slurm_partition="gpu", gpus_per_node=1, timeout_min=600)
    array, report = (fake_sbatch / "0.sh").read_text(), (fake_sbatch / "1.sh").read_text()
    opts = _sbatch(array)
    assert opts["array"].split("%")[0] == "0-3" and opts["job-name"] == "adni-pu-compare"
    assert opts["partition"] == "gpu"
    assert [j.job_id for j in jobs.shares] == ["4200_0", "4200_1", "4200_2", "4200_3"]
    ropts = _sbatch(report)
    assert ropts["dependency"] == "afterok:4200" and ropts["job-name"] == "adni-pu-report"
    assert (tmp_path / "out" / "folds" / "fold-1" / "manifest.csv").is_file()  # checked first
    with pytest.raises(ClusterError, match="tasks: expected a count >= 1"):
        submit_comparison(spec, 0, scheduler=Scheduler(tmp_path / "logs", "slurm"))


@pytest.mark.slow
def test_local_executor_runs_a_comparison(tmp_path) -> None:
    from adni_pu.cluster import submit_comparison
    from adni_pu.workflows.compare.pieces import CompareSpec

    manifest = make_volume_cohort(tmp_path / "cohort")
    spec = CompareSpec(manifest=str(manifest), out=str(tmp_path / "out"), methods=("naive",),
                       folds=2, seeds=1, overrides=tuple(tiny_overrides(1)))
    jobs = submit_comparison(spec, 2, scheduler=Scheduler(tmp_path / "logs", "local"),
                             n_boot=20, timeout_min=10)
    assert [job.result()["trained"] for job in jobs.shares] == [1, 1]
    assert Path(jobs.result()).is_file()
