"""Run the pipeline over many scans: process pool or Dask, resumable, sharded, with progress.

:func:`run_preprocessing` is the one entry point (the CLI verb is a thin wrapper): it
discovers the scans, keeps this shard's share, skips scans already done with the same
settings, runs the rest (one scan's failure is recorded and the run goes on), and writes
``summary.csv`` and ``preprocess_config.toml`` into the output folder.

SIGINT (Ctrl-C) or SIGTERM stops a run promptly: queued scans are cancelled, running
workers are terminated (their outputs are written atomically, so nothing half-written is
left), the summary of the scans that finished is written, and
:class:`PreprocessInterrupted` is raised. Workers ignore SIGINT (the main process decides)
and exit by themselves if the main process dies, so no worker is ever orphaned.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from adni_pu import config as cfgmod
from adni_pu.errors import OutputError
from adni_pu.locking import holding_output_lock
from adni_pu.progress import progress_bar
from adni_pu.signals import Interrupted, signal_label, stop_on_signals

from .config import PreprocessConfig, settings_hash
from .derivatives import (
    DESCRIPTION,
    output_paths,
    recorded_sha256,
    resume_check,
    source_datasets,
    write_description,
)
from .io import Scan, discover
from .legacy_layout import refuse_legacy_layout
from .output_checks import spare_inputs
from .summary import (
    merge_shard_summaries,
    parse_shard,
    shard_summary_path,
    summary_frame,
    with_earlier_rows,
    write_summary,
)

T = TypeVar("T")


class PreprocessInterrupted(Interrupted):
    """SIGINT or SIGTERM stopped a run (:mod:`adni_pu.signals`); ``summary_path`` lists the
    scans that finished, and :attr:`hint` says so in the CLI's one line."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.summary_path: Path | None = None
        self.finished = 0
        self.total = 0

    def set_hint(self) -> None:
        """Say what is kept and how to go on (the rest of the CLI's one line)."""
        where = f"; summary of those: {self.summary_path}" if self.summary_path else ""
        self.hint = (f"{self.finished} of {self.total} scans finished, the rest were "
                     f"cancelled{where}; run the same command again to process the rest")


def shard_scans(scans: Sequence[T], shard: str) -> list[T]:
    """This shard's scans: every N-th scan starting at i-1 (all scans when shard is empty)."""
    if not shard:
        return list(scans)
    i, n = parse_shard(shard)
    return list(scans)[i - 1 :: n]


def _worker_init(threads: int, parent: int | None = None) -> None:
    """Set the worker's threads; in a pool worker also ignore SIGINT and watch the parent."""
    from .pipeline import configure_threads

    configure_threads(threads)
    if parent is not None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group
        threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    """End this worker when its parent is gone (killed with SIGKILL, say): never orphaned."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _process_one(scan: Scan, output: str, config: PreprocessConfig) -> dict:
    from .pipeline import preprocess_scan

    return preprocess_scan(scan, output, config)


def _process_one_threads(scan: Scan, output: str, config: PreprocessConfig, threads: int) -> dict:
    _worker_init(threads)
    return _process_one(scan, output, config)


def _lock_part(args: dict[str, Any]) -> str | None:
    """The shard a run holds the output folder's lock for (None: the whole folder)."""
    config = args["config"]
    shard = args["shard"] if args["shard"] is not None else (config.runner.shard if config
                                                             else "")
    return "shard-{}-of-{}".format(*parse_shard(shard)) if shard else None


@holding_output_lock("preprocess", "output", part=_lock_part)  # adni_pu.locking
def run_preprocessing(
    inputs: str | Path | Sequence[Scan | str | Path],
    output: str | Path,
    config: PreprocessConfig | None = None,
    *,
    workers: int | None = None,
    threads_per_worker: int | None = None,
    shard: str | None = None,
    dask_scheduler: str | Any | None = None,
    progress: bool | None = None,
    on_result: Callable[[dict], None] | None = None,
):
    """Preprocess every scan of ``inputs`` into ``output``; returns the summary DataFrame.

    ``inputs``: a BIDS folder, an ADNI download, a folder of NIfTI files / DICOM series,
    a CSV of (subject, session, path), a single file, or a list of paths or :class:`Scan`.
    Inputs found but left out (``config.discovery``: series that are not T1, extra T1
    scans of a visit) get summary rows with status ``not-t1`` / ``extra-t1`` and the reason.
    Keyword arguments override the ``runner`` settings of ``config``;
    ``dask_scheduler`` is a scheduler address or a ``dask.distributed.Client``.
    """
    config = config or PreprocessConfig()
    overrides = {k: v for k, v in dict(
        workers=workers, threads_per_worker=threads_per_worker, shard=shard,
        progress=progress).items() if v is not None}
    if isinstance(dask_scheduler, str):
        overrides["dask_scheduler"] = dask_scheduler
    runner = replace(config.runner, **overrides)
    config = replace(config, runner=runner)
    # absolute, so summary.csv's preprocessed_path is valid wherever it is read from
    output = Path(output).resolve()
    if output.exists() and not output.is_dir():
        raise OutputError(f"{output}: expected an output folder, found a file")
    # discover before creating anything: a refused input leaves no empty output folder
    found = discover(inputs, config.discovery)
    scans = shard_scans(found.scans, runner.shard)
    # inputs left out at discovery (not a T1, another T1 of the visit chosen, unusable
    # folder) are summary rows with their reason; each shard reports its share of them
    left_out = [e.row() for e in shard_scans(found.excluded, runner.shard)]
    # no output may be an input (it would be overwritten, or deleted as an older output)
    spare_inputs(inputs, found.scans, found.excluded, output, [
        output / "summary.csv", output / "preprocess_config.toml", output / DESCRIPTION,
        *([shard_summary_path(output, *parse_shard(runner.shard))] if runner.shard else [])],
        config)
    # a folder written with the earlier file names: converted on request, never mixed
    refuse_legacy_layout(output)
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file on the way, no permission, ...
        raise OutputError(f"{output}: cannot create the output folder "
                          f"({exc.strerror or exc})") from exc
    cfgmod.save(config, output / "preprocess_config.toml")
    write_description(output, source_datasets(inputs))

    rows: list[dict] = []
    notes: dict[tuple[str, str], str] = {}

    def collect(row: dict) -> None:
        row["note"] = notes.get((row["subject_id"], row["session_id"]), "")
        rows.append(row)
        if on_result is not None:
            on_result(row)

    # resume: scans already done from the same content with these settings are skipped
    # here, before any worker; a scan whose input changed is redone, with a note saying so
    chash = settings_hash(config)
    todo = []
    for scan in scans:
        done, why = resume_check(scan, output, chash, config)
        if why:
            notes[(scan.subject_id, scan.session_id)] = why
        if done:
            collect({**scan.summary_fields(), "status": "skipped",
                     "preprocessed_path": str(output_paths(scan, output, config)["preproc"]),
                     "error": "", "seconds": 0.0,
                     "input_sha256": recorded_sha256(scan, output, config)})
        else:
            todo.append(scan)

    client = None if dask_scheduler is None or isinstance(dask_scheduler, str) else dask_scheduler
    try:
        with stop_on_signals(PreprocessInterrupted):
            if not todo:
                pass
            elif client is not None or runner.dask_scheduler:
                _run_dask(todo, output, config, client, collect)
            elif runner.workers <= 1 or len(todo) <= 1:
                _worker_init(runner.threads_per_worker)
                with progress_bar(len(todo), "preprocess", runner.progress, unit="scan") as bar:
                    for scan in todo:
                        collect(_process_one(scan, str(output), config))
                        bar.update(1)
            else:
                run_in_workers([(s, output) for s in todo], config, runner.workers,
                               runner.threads_per_worker, collect, runner.progress)
    except PreprocessInterrupted as stop:
        stop.finished, stop.total = len(rows), len(scans)
        # the scans cut short keep a row, so a merged (sharded) summary.csv still lists
        # them, as not usable, instead of losing them without a trace
        seen = {(r["subject_id"], r["session_id"]) for r in rows}
        for scan in todo:
            if (scan.subject_id, scan.session_id) in seen:
                continue
            if resume_check(scan, output, chash, config)[0]:  # finished, result not yet in
                rows.append({**scan.summary_fields(), "status": "done", "error": "",
                             "preprocessed_path": str(output_paths(scan, output, config)
                                                      ["preproc"]),
                             "seconds": 0.0, "note": "finished as the run was interrupted",
                             "input_sha256": recorded_sha256(scan, output, config)})
                continue
            rows.append({**scan.summary_fields(), "status": "interrupted",
                         "preprocessed_path": "", "seconds": 0.0,
                         "error": f"interrupted by {signal_label(stop.signum)} before "
                                  "it finished; rerun the command to process it"})
        stop.finished = sum(r["status"] != "interrupted" for r in rows)
        cut = summary_frame(rows, scans, left_out)
        if not runner.shard:
            cut = with_earlier_rows(cut, output, chash)
        stop.summary_path = write_summary(cut, output, runner.shard)
        stop.set_hint()
        raise
    summary = summary_frame(rows, scans, left_out)
    if not runner.shard:
        summary = with_earlier_rows(summary, output, chash)
    path = write_summary(summary, output, runner.shard)
    merged = (merge_shard_summaries(output, parse_shard(runner.shard)[1], require_all=False)
              if runner.shard else None)
    summary.attrs["summary_path"] = str(path if merged is None else output / "summary.csv")
    return summary


def run_in_workers(jobs: Sequence[tuple[Scan, str | Path]], config: PreprocessConfig,
                   workers: int, threads: int, collect: Callable[[dict], None],
                   progress: bool = False) -> None:
    """Preprocess each ``(scan, output folder)`` in spawned worker processes.

    ``threads`` per worker (1 makes the results bit-identical between runs). Rows are
    passed to ``collect`` as scans finish. On any exception (above all
    :class:`PreprocessInterrupted`) queued scans are cancelled and the workers are
    terminated before it propagates.
    """
    import multiprocessing as mp

    if not jobs:
        return
    ctx = mp.get_context("spawn")  # torch and ITK thread pools do not survive fork
    pool = ProcessPoolExecutor(max_workers=max(1, min(workers, len(jobs))), mp_context=ctx,
                               initializer=_worker_init, initargs=(threads, os.getpid()))
    try:
        with progress_bar(len(jobs), "preprocess", progress, unit="scan") as bar:
            futures = {pool.submit(_process_one, scan, str(out), config): scan
                       for scan, out in jobs}
            for fut in as_completed(futures):
                collect(_result_or_failure(fut, futures[fut]))
                bar.update(1)
    except BaseException:
        _terminate_pool(pool)
        raise
    pool.shutdown(wait=True)


def _terminate_pool(pool: ProcessPoolExecutor) -> None:
    """Cancel queued work and end the workers now (SIGTERM, then SIGKILL after 5 s)."""
    # the pool's own processes: Python < 3.14 has no public terminate_workers()
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.terminate()
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)


def _result_or_failure(fut, scan: Scan) -> dict:
    """A worker's row, or a ``failed`` row when the worker itself died (e.g. out of memory)."""
    try:
        return fut.result()
    except Exception as exc:  # noqa: BLE001 - a dead worker is this scan's failure
        return {**scan.summary_fields(), "status": "failed", "preprocessed_path": "",
                "error": f"{scan.path}: worker failed ({type(exc).__name__}: {exc})",
                "seconds": 0.0}


def _run_dask(scans: list[Scan], output: Path, config: PreprocessConfig, client: Any,
              collect: Callable[[dict], None]) -> None:
    from dask.distributed import Client
    from dask.distributed import as_completed as dask_completed

    own = client is None
    if own:
        client = Client(config.runner.dask_scheduler)
    try:
        futures = [client.submit(_process_one_threads, s, str(output), config,
                                 config.runner.threads_per_worker, pure=False) for s in scans]
        by_key = {f.key: s for f, s in zip(futures, scans)}
        try:
            with progress_bar(len(scans), "preprocess", config.runner.progress, unit="scan") as bar:
                for fut in dask_completed(futures):
                    collect(_result_or_failure(fut, by_key[fut.key]))
                    bar.update(1)
        except BaseException:  # interrupted: nothing more should run on the cluster
            with contextlib.suppress(Exception):
                client.cancel(futures)
            raise
    finally:
        if own:
            client.close()


