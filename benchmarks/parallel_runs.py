"""Run many ``adni-pu benchmark`` commands side by side on one machine (one GPU, many cores).

Small models (MNIST's MLP) leave a GPU mostly idle in one process: the host launches kernels
faster than one training loop can use them. Running a dozen benchmark processes at once
fills it. This script is the maintainers' tool for that; it starts no engine of its own
beyond a process pool, and each job is an ordinary, resumable ``adni-pu benchmark`` command.

A jobs file has one job per line, ``NAME ARGS...`` (``#`` starts a comment), for example::

    nnpu-wd0-s0  mnist --method nnpu --seeds 1 --seed-offset 0 --epochs 200

Each job runs as ``adni-pu benchmark ARGS --out RUNS/NAME [--time-limit M]``, its output in
``RUNS/NAME.log``. Jobs whose ``results.json`` exists are skipped. At the end the small files
of every run folder (results, per-seed result, metrics.csv, settings, progress) are packed
into one ``.tar.xz`` so they can travel; checkpoints are left out unless ``--with-checkpoints``.
The status lines (and the wall time of each job) are also appended to
``RUNS/parallel_runs.log``. The exit status is 1 when a job failed (a job paused by its
time limit, exit 75, is not a failure).

    python -m benchmarks.parallel_runs JOBS --runs runs/par --jobs 12 --time-limit 8 \
        --pack $OUT/runs.tar.xz
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.common import cli_command, script_parser

SMALL = ("results.json", "results.md", "result.json", "metrics.csv", "config.toml",
         "progress.json", "data.json", "selection.json", "provenance.json")


def read_jobs(path: Path) -> list[tuple[str, list[str]]]:
    """``(name, benchmark arguments)`` of every job line of ``path``."""
    jobs = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        words = shlex.split(line, comments=True)
        if not words:
            continue
        name, *args = words
        if not args:
            raise SystemExit(f"{path}:{number}: job {name!r} has no benchmark arguments")
        jobs.append((name, args))
    names = [n for n, _ in jobs]
    if len(set(names)) != len(names):
        raise SystemExit(f"{path}: job names repeat")
    return jobs


def run_job(name: str, args: list[str], runs: Path, time_limit: float | None,
            threads: int) -> tuple[str, int, float]:
    """Run one job to its end (or its time limit); return (name, exit status, seconds)."""
    out = runs / name
    if (out / "results.json").is_file():
        return name, 0, 0.0
    cmd = cli_command("benchmark", *args, "--out", str(out))
    if time_limit is not None:
        cmd += ["--time-limit", str(time_limit)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    with (runs / f"{name}.log").open("a") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    return name, rc, time.monotonic() - start


def pack(runs: Path, target: Path, with_checkpoints: bool) -> None:
    """The small files (and optionally checkpoints) of every run folder in one tar.xz."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".part")
    with tarfile.open(tmp, "w:xz") as tar:
        for path in sorted(runs.rglob("*")):
            if not path.is_file() or ".cache" in path.parts or "tensorboard" in path.parts:
                continue
            keep = path.name in SMALL or path.suffix == ".log"
            if with_checkpoints and path.suffix == ".pt":
                keep = True
            if keep:
                tar.add(path, arcname=str(path.relative_to(runs.parent)))
    tmp.replace(target)


def main() -> int:
    parser = script_parser(__doc__)
    parser.add_argument("jobs_file", type=Path)
    parser.add_argument("--runs", type=Path, default=Path("runs/parallel"))
    parser.add_argument("--jobs", type=int, default=8, help="jobs at a time")
    parser.add_argument("--time-limit", type=float, default=None,
                        help="minutes each job may train (its own --time-limit)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per job")
    parser.add_argument("--pack", type=Path, default=None, help="write the tar.xz here")
    parser.add_argument("--with-checkpoints", action="store_true")
    parser.add_argument("--only", default="", help="comma-separated job names to run")
    a = parser.parse_args()
    jobs = read_jobs(a.jobs_file)
    if a.only:
        wanted = set(a.only.split(","))
        unknown = sorted(wanted - {n for n, _ in jobs})
        if unknown:
            raise SystemExit(f"{a.jobs_file}: --only names {unknown} are not jobs of the file")
        jobs = [j for j in jobs if j[0] in wanted]
    a.runs.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    failed = 0
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool, \
            (a.runs / "parallel_runs.log").open("a") as log:
        print(f"# {time.strftime('%Y-%m-%dT%H:%M:%S')} {len(jobs)} jobs, {a.jobs} at a time, "
              f"time limit {a.time_limit} min: {' '.join(sys.argv)}", file=log, flush=True)
        futures = [pool.submit(run_job, n, args, a.runs, a.time_limit, a.threads)
                   for n, args in jobs]
        for future in futures:
            name, rc, seconds = future.result()
            failed += rc not in (0, 75)
            state = {0: "done", 75: "paused (time limit)"}.get(rc, f"failed (exit {rc})")
            line = f"{name}: {state} after {seconds:.0f} s [{time.monotonic() - start:.0f} s]"
            print(line, flush=True)
            print(line, file=log, flush=True)
    if a.pack is not None:
        pack(a.runs, a.pack, a.with_checkpoints)
        print(f"packed {a.pack} ({a.pack.stat().st_size / 2**20:.1f} MiB)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
