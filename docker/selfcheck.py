"""Check that an installed adni-pu runs with no network: CLI, deepbet, templates, one scan.

Run at the end of the image build (docker/Dockerfile), by docker/build-check.sh inside the
built image with no network at all, and by the Apptainer definition's %test. Exit 0 and a
one-line report when everything works; otherwise the first problem, on one line.

Two layers, because the two builders (BuildKit and buildah) share no way to switch the
network off for one build step:

- in this process, every Internet connection and name lookup is refused by an audit hook
  (``sys.addaudithook``): CPython's socket module raises the ``socket.connect``,
  ``socket.getaddrinfo``, ... events from C, so calls through ``_socket`` are seen too,
  and the hook cannot be removed. Every attempt is recorded, so one that a library
  catches and hides still fails the check. Child processes get proxy variables that point
  at a closed local port, so their HTTP clients fail too;
- ``--require-no-network`` also fails unless the process sees no network interface but
  loopback (``unshare --net``, ``docker run --network none``): the operating system, not
  this process, then guarantees that nothing can be fetched.

    python docker/selfcheck.py [--work DIR] [--require-no-network]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

# fast registration settings for the 3 mm synthetic head (the skull strip stays deepbet)
FAST = ["registration.resolution_mm=4.0", "registration.iterations=[50, 20]",
        "registration.shrink_factors=[2, 1]", "registration.smoothing_sigmas=[1.0, 0.0]"]

# audit events (CPython's socket module raises them from C) that reach another machine
NETWORK_EVENTS = frozenset({"socket.connect", "socket.sendto", "socket.sendmsg",
                            "socket.getaddrinfo", "socket.gethostbyname",
                            "socket.gethostbyname_ex", "socket.gethostbyaddr",
                            "socket.getnameinfo"})
INTERNET = (socket.AF_INET, socket.AF_INET6)
# a closed port on this machine: any HTTP(S) client in a child process fails at once
DEAD_PROXY = "http://127.0.0.1:9"

ATTEMPTS: list[str] = []  # every refused attempt, also those a library caught and hid


class NetworkUsed(RuntimeError):
    """Something tried to open a network connection."""


def _refuse(what: str) -> None:
    ATTEMPTS.append(what)
    raise NetworkUsed(f"network access attempted: {what}")


def _audit(event: str, args: tuple) -> None:
    if event not in NETWORK_EVENTS:
        return
    if event in ("socket.connect", "socket.sendto", "socket.sendmsg"):
        family = getattr(args[0], "family", None)
        if family not in INTERNET:  # a local (AF_UNIX) socket, e.g. multiprocessing's
            return
    _refuse(f"{event}{args[1:]!r}")


def block_network() -> None:
    """Make every Internet connection and name lookup of this process fail with
    :class:`NetworkUsed` (and be recorded in :data:`ATTEMPTS`); point child processes'
    proxies at a closed port. Local (AF_UNIX) sockets keep working."""
    sys.addaudithook(_audit)
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                 "ALL_PROXY"):
        os.environ[name] = DEAD_PROXY
    for name in ("no_proxy", "NO_PROXY"):
        os.environ.pop(name, None)


def network_interfaces(proc_net_dev: Path = Path("/proc/net/dev")) -> list[str] | None:
    """The network interfaces this process's network namespace has (None if unknown)."""
    try:
        lines = proc_net_dev.read_text().splitlines()[2:]  # two header lines
    except OSError:
        return None
    return [ln.split(":", 1)[0].strip() for ln in lines if ":" in ln]


def network_note(interfaces: list[str] | None) -> str:
    """How offline this process is, in a few words."""
    if interfaces is None:
        return "network interfaces unknown; connections refused in-process"
    outside = [i for i in interfaces if i != "lo"]
    if not outside:
        return "no network interface but loopback"
    return f"network interfaces {', '.join(outside)} present; connections refused in-process"


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
    parser.add_argument("--require-no-network", action="store_true",
                        help="fail unless this process has no network interface but loopback")
    args = parser.parse_args(argv)
    interfaces = network_interfaces()
    note = network_note(interfaces)
    if args.require_no_network and note != "no network interface but loopback":
        print(f"selfcheck failed: --require-no-network: {note}", file=sys.stderr)
        return 1
    block_network()
    start = time.perf_counter()
    try:
        import torch

        bundled_files()
        with tempfile.TemporaryDirectory(dir=args.work) as tmp:
            preprocess_one(Path(tmp))
        if ATTEMPTS:  # refused, but caught and hidden by the code that tried
            raise NetworkUsed(f"network access attempted: {ATTEMPTS[0]}")
    except Exception as exc:  # noqa: BLE001 - report any failure on one line
        print(f"selfcheck failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"selfcheck ok: torch {torch.__version__} (CUDA build: {torch.version.cuda or 'none'}), "
          f"deepbet weights and templates bundled, one scan preprocessed offline in "
          f"{time.perf_counter() - start:.0f} s ({note})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
