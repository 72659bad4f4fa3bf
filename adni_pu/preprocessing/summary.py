"""``summary.csv``: the table of every scan a preprocessing run saw, with its status.

The runner writes it, the cohort builder reads it, sharded runs merge their parts into it
and the layout conversion points it at renamed files; this module is the one place that
knows its columns and how it is read, written and merged.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Sequence
from pathlib import Path

from adni_pu.errors import ConfigError, ShardMergeError

from .derivatives import find_record
from .io import Scan

SUMMARY_COLUMNS = ["subject_id", "session_id", "acquisition_date", "image_id",
                   "series_description", "input_path", "status", "preprocessed_path",
                   "error", "seconds", "input_sha256", "note"]

#: Columns added after the first release: a summary.csv without them is still read.
LATER_COLUMNS = ("input_sha256", "note")


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/N"`` -> (i, N) with 1 <= i <= N (cluster array jobs count from 1)."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not match:
        raise ConfigError(f"shard {text!r}: expected i/N, e.g. 2/10")
    i, n = int(match.group(1)), int(match.group(2))
    if not 1 <= i <= n:
        raise ConfigError(f"shard {text!r}: expected 1 <= i <= N, found i={i}, N={n}")
    return i, n


def summary_frame(rows: list[dict], scans: Sequence[Scan], left_out: Sequence[dict] = ()):
    """The summary rows in the order the scans were discovered, then the inputs left out."""
    import pandas as pd

    summary = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    order = {(s.subject_id, s.session_id): i for i, s in enumerate(scans)}
    summary["_order"] = [order.get((r.subject_id, r.session_id), -1)
                         for r in summary.itertuples()]
    summary = summary.sort_values("_order", kind="stable").drop(columns="_order")
    if left_out:
        summary = pd.concat([summary, pd.DataFrame(left_out, columns=SUMMARY_COLUMNS)])
    return summary.reset_index(drop=True)


def read_summary(path: str | Path):
    """A summary.csv (or shard summary) as strings; one written before the columns of
    :data:`LATER_COLUMNS` existed gets them empty. Other columns are a ShardMergeError."""
    import pandas as pd

    path = Path(path)
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    for col in LATER_COLUMNS:
        if col not in frame.columns:
            frame[col] = ""
    if list(frame.columns) != SUMMARY_COLUMNS:
        raise ShardMergeError(f"{path}: columns: expected {','.join(SUMMARY_COLUMNS)}, "
                              f"found {','.join(map(str, frame.columns))}")
    return frame


def with_earlier_rows(summary, output: Path, config_hash: str | None = None):
    """``summary`` plus the rows of ``output/summary.csv`` for scans this run did not list.

    A second run into the same folder with another input must not hide the first run's
    scans from the table the cohort builder reads. Kept rows whose outputs are gone become
    ``missing``, and usable rows made with other settings than ``config_hash`` become
    ``stale``, each with a note, so the cohort builder leaves them out and says why.
    """
    import pandas as pd

    path = Path(output) / "summary.csv"
    if not path.is_file():
        return summary
    earlier = read_summary(path)
    seen = set(zip(summary["subject_id"].astype(str), summary["session_id"].astype(str)))
    keep = earlier[[k not in seen for k in zip(earlier["subject_id"], earlier["session_id"])]]
    if keep.empty:
        return summary
    keep = keep.copy()
    for i, row in keep.iterrows():
        if row["status"] not in ("done", "skipped"):
            continue
        scan = Scan(row["subject_id"], row["session_id"], Path(row["input_path"]))
        try:
            sidecar = json.loads(find_record(scan, output).read_text())
        except (OSError, ValueError):
            sidecar = None
        if sidecar is None or not Path(row["preprocessed_path"]).is_file():
            keep.loc[i, ["status", "note"]] = ["missing", "kept from an earlier run into "
                                               "this folder, but its outputs are gone"]
        elif config_hash and sidecar.get("settings_hash") != config_hash:
            keep.loc[i, ["status", "note"]] = [
                "stale", f"kept from an earlier run into this folder, made with other "
                f"settings (hash {sidecar.get('settings_hash')}, this run's {config_hash}); "
                "preprocess its input again to use it"]
        elif not keep.loc[i, "note"].startswith("kept from an earlier run"):
            keep.loc[i, "note"] = "kept from an earlier run into this folder"
    return pd.concat([summary, keep[SUMMARY_COLUMNS]], ignore_index=True)


def shard_summary_path(output: str | Path, i: int, n: int) -> Path:
    """Where the run with ``shard="i/n"`` writes its summary."""
    return Path(output) / f"summary_shard-{i}-of-{n}.csv"


def write_summary(summary, output: Path, shard: str = "") -> Path:
    """Write ``summary.csv`` atomically (``summary_shard-i-of-N.csv`` for a shard)."""
    from .io import write_outputs

    name = "summary.csv"
    if shard:
        name = shard_summary_path(output, *parse_shard(shard)).name
    buf = io.StringIO()
    summary.to_csv(buf, index=False)
    path = Path(output) / name
    write_outputs({path: buf.getvalue().encode()})
    return path


def merge_shard_summaries(output: str | Path, shards: int, *, require_all: bool = True):
    """Merge ``summary_shard-i-of-N.csv`` (i = 1..N) into ``summary.csv``; returns the table.

    Every shard run calls this with ``require_all=False`` after writing its own summary, so
    whichever shard finishes last (or any rerun of a shard) writes the merged table the
    cohort builder reads; it returns None while some shard has not finished. A cluster's
    merge job calls it with ``require_all=True``: a missing shard, or a file with other
    columns, is a :class:`ShardMergeError` naming it, and nothing is written. Rows are
    sorted by subject and session.
    """
    import pandas as pd

    if shards < 1:
        raise ShardMergeError(f"shards: expected a count >= 1, found {shards}")
    output = Path(output)
    parts = [shard_summary_path(output, i, shards) for i in range(1, shards + 1)]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        if not require_all:
            return None
        raise ShardMergeError(f"{output}: shard summaries missing: {', '.join(missing)} (each "
                              f"written by `adni-pu preprocess --shard i/{shards}`)")
    frames = [read_summary(path) for path in parts]
    merged = pd.concat(frames, ignore_index=True)
    merged = merged.sort_values(["subject_id", "session_id"], kind="stable")
    merged = merged.reset_index(drop=True)
    write_summary(merged, output)
    return merged
