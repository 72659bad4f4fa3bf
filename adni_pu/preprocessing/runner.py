"""Run the pipeline over many scans: process pool or Dask, resumable, sharded, with progress.

:func:`run_preprocessing` is the one entry point (the CLI verb is a thin wrapper): it
discovers the scans, keeps this shard's share, skips scans already done with the same
settings, runs the rest (one scan's failure is recorded and the run goes on), and writes
``summary.csv`` and ``preprocess_config.toml`` into the output folder.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from adni_pu import config as cfgmod

from .config import PreprocessConfig, settings_hash
from .io import Scan, discover
from .pipeline import is_done, output_paths

T = TypeVar("T")

SUMMARY_COLUMNS = ["subject_id", "session_id", "acquisition_date", "image_id",
                   "series_description", "input_path", "status", "preprocessed_path",
                   "error", "seconds"]


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/N"`` -> (i, N) with 1 <= i <= N (cluster array jobs count from 1)."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not match:
        raise ValueError(f"shard {text!r}: expected i/N, e.g. 2/10")
    i, n = int(match.group(1)), int(match.group(2))
    if not 1 <= i <= n:
        raise ValueError(f"shard {text!r}: expected 1 <= i <= N, found i={i}, N={n}")
    return i, n


def shard_scans(scans: Sequence[T], shard: str) -> list[T]:
    """This shard's scans: every N-th scan starting at i-1 (all scans when shard is empty)."""
    if not shard:
        return list(scans)
    i, n = parse_shard(shard)
    return list(scans)[i - 1 :: n]


def _worker_init(threads: int) -> None:
    from .pipeline import configure_threads

    configure_threads(threads)


def _process_one(scan: Scan, output: str, config: PreprocessConfig) -> dict:
    from .pipeline import preprocess_scan

    return preprocess_scan(scan, output, config)


def _process_one_threads(scan: Scan, output: str, config: PreprocessConfig, threads: int) -> dict:
    _worker_init(threads)
    return _process_one(scan, output, config)


def _progress(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="preprocess", unit="scan", disable=not enabled)


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
    import pandas as pd

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
    output.mkdir(parents=True, exist_ok=True)
    found = discover(inputs, config.discovery)
    scans = shard_scans(found.scans, runner.shard)
    # inputs left out at discovery (not a T1, another T1 of the visit chosen, unusable
    # folder) are summary rows with their reason; each shard reports its share of them
    left_out = [e.row() for e in shard_scans(found.excluded, runner.shard)]
    cfgmod.save(config, output / "preprocess_config.toml")

    rows: list[dict] = []

    def collect(row: dict) -> None:
        rows.append(row)
        if on_result is not None:
            on_result(row)

    # resume: scans already done with these settings are skipped here, before any worker
    chash = settings_hash(config)
    todo = []
    for scan in scans:
        if is_done(scan, output, chash):
            collect({**scan.summary_fields(), "status": "skipped",
                     "preprocessed_path": str(output_paths(scan, output)["preproc"]),
                     "error": "", "seconds": 0.0})
        else:
            todo.append(scan)

    client = None if dask_scheduler is None or isinstance(dask_scheduler, str) else dask_scheduler
    if not todo:
        pass
    elif client is not None or runner.dask_scheduler:
        _run_dask(todo, output, config, client, collect)
    elif runner.workers <= 1 or len(todo) <= 1:
        _worker_init(runner.threads_per_worker)
        with _progress(len(todo), runner.progress) as bar:
            for scan in todo:
                collect(_process_one(scan, str(output), config))
                bar.update(1)
    else:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")  # torch and ITK thread pools do not survive fork
        with ProcessPoolExecutor(max_workers=min(runner.workers, len(todo)), mp_context=ctx,
                                 initializer=_worker_init,
                                 initargs=(runner.threads_per_worker,)) as pool, \
                _progress(len(todo), runner.progress) as bar:
            futures = {pool.submit(_process_one, s, str(output), config): s for s in todo}
            for fut in as_completed(futures):
                collect(_result_or_failure(fut, futures[fut]))
                bar.update(1)

    summary = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    order = {(s.subject_id, s.session_id): i for i, s in enumerate(scans)}
    summary["_order"] = [order.get((r.subject_id, r.session_id), -1)
                         for r in summary.itertuples()]
    summary = summary.sort_values("_order", kind="stable").drop(columns="_order")
    if left_out:
        summary = pd.concat([summary, pd.DataFrame(left_out, columns=SUMMARY_COLUMNS)])
    summary = summary.reset_index(drop=True)
    write_summary(summary, output, runner.shard)
    return summary


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
        with _progress(len(scans), config.runner.progress) as bar:
            for fut in dask_completed(futures):
                collect(_result_or_failure(fut, by_key[fut.key]))
                bar.update(1)
    finally:
        if own:
            client.close()


def write_summary(summary, output: Path, shard: str = "") -> Path:
    """Write ``summary.csv`` atomically (``summary_shard-i-of-N.csv`` for a shard)."""
    from .io import write_outputs

    name = "summary.csv"
    if shard:
        i, n = parse_shard(shard)
        name = f"summary_shard-{i}-of-{n}.csv"
    buf = io.StringIO()
    summary.to_csv(buf, index=False)
    path = Path(output) / name
    write_outputs({path: buf.getvalue().encode()})
    return path
