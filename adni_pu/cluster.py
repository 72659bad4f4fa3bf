"""Slurm scale-out through submitit: preprocessing as a job array, training on a GPU node.

- :func:`submit_preprocessing`: one array task per shard (``run_preprocessing(...,
  shard="i/N")``, each writing ``summary_shard-i-of-N.csv``), then one merge job that starts
  after every shard succeeded (Slurm ``--dependency=afterok``) and writes ``summary.csv``,
  the table ``adni-pu cohort build`` reads.
- :func:`submit_training`: ``train_volumes`` on one node, one task per GPU; with more than one
  GPU each task joins the DDP process group from the variables that submitit's
  ``TorchDistributedEnvironment`` exports (the same ones torchrun sets).
- :func:`submit_comparison`: ``adni-pu benchmark cohort`` as an array, task i taking the
  pieces ``--piece i/N``, then one report job after every task succeeded.

submitit writes the sbatch scripts, submits them and pickles the calls; a :class:`Scheduler`
says where: its log folder, the cluster (with ``"local"`` submitit's LocalExecutor runs the
same jobs as processes on this machine, how the tests run them) and ``python``, the command
that starts Python on the nodes, e.g. ``"apptainer exec --nv --bind /scratch adni-pu.sif
python"`` to run inside the Apptainer image. Any other submitit parameter
(``slurm_partition``, ``timeout_min``, ``cpus_per_task``, ``mem_gb``, ``slurm_account``,
``slurm_array_parallelism``, ...) passes through ``params``. See
docs/deployment.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adni_pu.errors import ClusterError
from adni_pu.preprocessing.config import PreprocessConfig

# the merge is light: a few CSV files
MERGE_PARAMS: dict[str, Any] = {"timeout_min": 30, "cpus_per_task": 1, "mem_gb": 4}


@dataclass
class PreprocessJobs:
    """The submitted shard array and the merge job that follows it."""

    shards: list[Any]
    merge: Any

    def result(self):
        """Wait for the merge job; the merged summary (a DataFrame)."""
        return self.merge.result()


@dataclass(frozen=True)
class Scheduler:
    """Where jobs go: submitit's folder for scripts, pickles and logs (``log_dir``), the
    ``cluster`` (``"slurm"``, ``"local"`` or None: submitit picks, Slurm when ``srun`` is
    on the PATH) and the command that starts Python on the nodes (``python``; None: the
    submitting interpreter)."""

    log_dir: str | Path
    cluster: str | None = None
    python: str | None = None


def _executor(scheduler: Scheduler, params: dict[str, Any]):
    import submitit

    cluster, kwargs = scheduler.cluster, {}
    if scheduler.python is not None:
        cluster = cluster or submitit.AutoExecutor.which()
        kwargs[f"{cluster}_python"] = scheduler.python
    executor = submitit.AutoExecutor(folder=str(scheduler.log_dir), cluster=cluster, **kwargs)
    executor.update_parameters(**params)
    return executor


def merge_shards(output: str | Path, shards: int):
    """The merge job: ``summary_shard-i-of-N.csv`` (i = 1..N) into ``summary.csv``.

    Strict (:func:`adni_pu.preprocessing.summary.merge_shard_summaries` with
    ``require_all``): a missing shard summary, or one with other columns, is refused naming
    the file, and nothing is written. Returns the merged table.
    """
    from adni_pu.errors import ShardMergeError
    from adni_pu.preprocessing.summary import merge_shard_summaries

    try:
        return merge_shard_summaries(output, shards, require_all=True)
    except ShardMergeError as exc:
        raise ClusterError(str(exc)) from exc


def _preprocess_shard(inputs: Any, output: str, config: PreprocessConfig, shard: str,
                      workers: int | None, threads: int | None) -> dict[str, int]:
    """One array task: this shard's scans; returns the count of each status."""
    from adni_pu.preprocessing import run_preprocessing

    summary = run_preprocessing(inputs, output, config, workers=workers,
                                threads_per_worker=threads, shard=shard, progress=False)
    return {str(k): int(v) for k, v in summary["status"].value_counts().items()}


def submit_preprocessing(
    inputs: str | Path | Sequence[str | Path],
    output: str | Path,
    shards: int,
    *,
    scheduler: Scheduler,
    config: PreprocessConfig | None = None,
    workers: int | None = None,
    threads_per_worker: int | None = None,
    merge_params: dict[str, Any] | None = None,
    **params: Any,
) -> PreprocessJobs:
    """Preprocess ``inputs`` into ``output`` as ``shards`` array tasks, then merge.

    ``params`` are submitit parameters of each array task; ``merge_params`` override
    :data:`MERGE_PARAMS` for the merge job (which otherwise shares the partition and
    account). ``scheduler``: where the jobs go (:class:`Scheduler`). Returns at once on
    Slurm; ``.result()`` waits for the merge.
    """
    if shards < 1:
        raise ClusterError(f"shards: expected a count >= 1, found {shards}")
    config = config or PreprocessConfig()
    out = str(Path(output).resolve())
    if isinstance(inputs, (str, Path)):
        inputs = str(Path(inputs).resolve())
    else:
        inputs = [str(Path(p).resolve()) for p in inputs]
    params = {"name": "adni-pu-preprocess", **params}
    executor = _executor(scheduler, params)
    labels = [f"{i}/{shards}" for i in range(1, shards + 1)]
    jobs = executor.map_array(_preprocess_shard, [inputs] * shards, [out] * shards,
                              [config] * shards, labels, [workers] * shards,
                              [threads_per_worker] * shards)
    shared = {k: v for k, v in params.items()
              if k.startswith("slurm_") and k not in ("slurm_array_parallelism",)}
    merge = {**shared, **MERGE_PARAMS, **(merge_params or {}), "name": "adni-pu-merge"}
    if executor.cluster == "slurm":
        # the array's id without the task suffix: afterok waits for every task
        merge["slurm_dependency"] = f"afterok:{jobs[0].job_id.split('_')[0]}"
    else:
        for job in jobs:  # no scheduler to hold the merge back: wait here
            job.result()
    merge_executor = _executor(Scheduler(scheduler.log_dir, executor.cluster,
                                         scheduler.python), merge)
    merge_job = merge_executor.submit(merge_shards, out, shards)
    return PreprocessJobs(shards=jobs, merge=merge_job)


def _train(manifest: str, out: str, config_path: str | None, preset: str | None,
           overrides: list[str], distributed: bool) -> dict[str, Any]:
    """One training task (rank): join the process group when several, then train."""
    if distributed:
        from submitit.helpers import TorchDistributedEnvironment

        # every task sees all the node's GPUs and takes the one numbered by its LOCAL_RANK
        TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    import os

    from adni_pu.workflows.train import train_volumes
    from adni_pu.workflows.volume_settings import load_volume_config

    cfg = load_volume_config(config_path, overrides, preset)
    fit = train_volumes(manifest, cfg, out)
    return {"run": out, "best_epoch": int(fit.best_epoch),
            "best_candidate": str(fit.best_candidate),
            "world_size": int(os.environ.get("WORLD_SIZE", "1"))}


def submit_training(
    manifest: str | Path,
    out: str | Path,
    *,
    scheduler: Scheduler,
    gpus: int = 1,
    tasks: int | None = None,
    config: str | Path | None = None,
    preset: str | None = None,
    overrides: Sequence[str] = (),
    **params: Any,
):
    """Train on one node as ``adni-pu train`` does; returns the submitit job.

    ``gpus`` GPUs and one task per GPU (``tasks`` tasks on ``gpus=0``, e.g. gloo processes
    on CPUs); ``overrides`` are ``--set`` strings, e.g. ``'train.device="cuda"'``. The job's
    ``.results()`` holds each task's ``{"run", "best_epoch", "best_candidate",
    "world_size"}`` (the same on every rank). ``scheduler``: where the job goes
    (:class:`Scheduler`).
    """
    if gpus < 0:
        raise ClusterError(f"gpus: expected a count >= 0, found {gpus}")
    ntasks = tasks if tasks is not None else max(gpus, 1)
    if ntasks < 1 or (gpus and ntasks != gpus):
        raise ClusterError(f"tasks: expected one per GPU ({gpus}), found {ntasks}")
    params = {"name": "adni-pu-train", "nodes": 1, "tasks_per_node": ntasks,
              "gpus_per_node": gpus, **params}
    executor = _executor(scheduler, params)
    return executor.submit(
        _train, str(Path(manifest).resolve()), str(Path(out).resolve()),
        str(Path(config).resolve()) if config is not None else None, preset,
        list(overrides), ntasks > 1)


@dataclass
class ComparisonJobs:
    """The submitted piece array of a comparison and the report job that follows it."""

    shares: list[Any]
    report: Any

    def result(self):
        """Wait for the report job; the path of report.md."""
        return self.report.result()


def _compare_share(spec: Any, share: str) -> dict[str, Any]:
    """One array task: its share ``i/N`` of the comparison's pieces."""
    from adni_pu.workflows.compare.pieces import run_comparison

    return run_comparison(spec, [share])


def _compare_report(out: str, n_boot: int) -> str:
    """The report job: the report from every finished piece."""
    from adni_pu.workflows.compare.report import write_report

    return str(write_report(Path(out), None, n_boot, f"adni-pu benchmark cohort-report {out}"))


def submit_comparison(spec: Any, tasks: int, *, scheduler: Scheduler, n_boot: int = 1000,
                      report_params: dict[str, Any] | None = None, **params: Any
                      ) -> ComparisonJobs:
    """Run the comparison ``spec`` (a :class:`~adni_pu.workflows.compare.pieces.CompareSpec`)
    as ``tasks`` array tasks, task i taking ``--piece i/tasks``, then one report job after
    every task succeeded. The inputs are checked and the folds written here, before
    anything is submitted. ``params``: submitit parameters of each task (e.g.
    ``gpus_per_node=1``); ``report_params`` override :data:`MERGE_PARAMS` for the report."""
    from dataclasses import replace

    from adni_pu.workflows.compare.pieces import prepare

    if tasks < 1:
        raise ClusterError(f"tasks: expected a count >= 1, found {tasks}")
    spec = replace(spec, manifest=str(Path(spec.manifest).resolve()),
                   out=str(Path(spec.out).resolve()))
    prepare(spec)  # bad input refused before any job is submitted
    params = {"name": "adni-pu-compare", **params}
    executor = _executor(scheduler, params)
    shares = [f"{i}/{tasks}" for i in range(1, tasks + 1)]
    jobs = executor.map_array(_compare_share, [spec] * tasks, shares)
    shared = {k: v for k, v in params.items()
              if k.startswith("slurm_") and k not in ("slurm_array_parallelism",)}
    report = {**shared, **MERGE_PARAMS, **(report_params or {}), "name": "adni-pu-report"}
    if executor.cluster == "slurm":
        report["slurm_dependency"] = f"afterok:{jobs[0].job_id.split('_')[0]}"
    else:
        for job in jobs:
            job.result()
    report_job = _executor(Scheduler(scheduler.log_dir, executor.cluster, scheduler.python),
                           report).submit(
        _compare_report, spec.out, n_boot)
    return ComparisonJobs(shares=jobs, report=report_job)
