"""Check that an installed adni-pu runs with no network: CLI, deepbet, templates, one scan.

Run at the end of the image build (docker/Dockerfile, with the network off) and by the
Apptainer definition's %test. Sockets are refused in this process as well, so any attempt to
download (weights, templates, atlases) fails here instead of on a compute node. Exit 0 and a
one-line report when everything works; otherwise the first problem, on one line.

    python docker/selfcheck.py [--work DIR]
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
from pathlib import Path

# fast registration settings for the 3 mm synthetic head (the skull strip stays deepbet)
FAST = ["registration.resolution_mm=4.0", "registration.iterations=[50, 20]",
        "registration.shrink_factors=[2, 1]", "registration.smoothing_sigmas=[1.0, 0.0]"]


class NetworkUsed(RuntimeError):
    """Something tried to open a network connection."""


def block_network() -> None:
    """Make every connection and name lookup in this process fail with :class:`NetworkUsed`."""

    def refuse(*args, **kwargs):
        raise NetworkUsed(f"network access attempted: {args[1:] or args}")

    socket.socket.connect = refuse  # type: ignore[method-assign]
    socket.socket.connect_ex = refuse  # type: ignore[method-assign]
    socket.getaddrinfo = refuse  # type: ignore[assignment]
    socket.create_connection = refuse  # type: ignore[assignment]


def bundled_files() -> list[Path]:
    """deepbet's two TorchScript models and the template files adni-pu reads."""
    from deepbet.utils import DATA_PATH

    from adni_pu import atlas

    files = [Path(DATA_PATH) / "models" / "model.pt", Path(DATA_PATH) / "models" / "bbox_model.pt"]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"deepbet weights missing: {', '.join(missing)}")
    atlas.load_template("t1")
    atlas.aal_labels()
    return files


def preprocess_one(work: Path) -> dict:
    """One synthetic head through the default pipeline (deepbet skull strip)."""
    import nibabel as nib

    from adni_pu.preprocessing import Scan, load_config, preprocess_scan
    from adni_pu.preprocessing.phantom import synthetic_head

    head = synthetic_head(seed=1)
    path = work / "head.nii.gz"
    nib.save(nib.Nifti1Image(head.data, head.affine), str(path))
    config = load_config(None, FAST)
    if config.skullstrip.method != "deepbet":
        raise RuntimeError(f"default skull strip is {config.skullstrip.method!r}, expected deepbet")
    row = preprocess_scan(Scan("selfcheck", "01", path), work / "out", config)
    if row["status"] != "done":
        raise RuntimeError(f"synthetic head: status {row['status']}: {row['error']}")
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: temp)")
    args = parser.parse_args(argv)
    block_network()
    start = time.perf_counter()
    try:
        import torch

        bundled_files()
        with tempfile.TemporaryDirectory(dir=args.work) as tmp:
            preprocess_one(Path(tmp))
    except Exception as exc:  # noqa: BLE001 - report any failure on one line
        print(f"selfcheck failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"selfcheck ok: torch {torch.__version__} (CUDA build: {torch.version.cuda or 'none'}), "
          f"deepbet weights and templates bundled, one scan preprocessed offline in "
          f"{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
