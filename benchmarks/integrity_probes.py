"""The data-integrity probes: each defect as a reproducible check on one checkout.

Runs every probe against the ``adni_pu`` of ``--checkout`` (a clone or worktree of this
repository at any commit) in a fresh temporary folder, through the command line or the
library as a user would, and prints one result line per probe. Run it on the commit
before the fix and on the fix, and the two tables are the "before" and "after" columns::

    git worktree add /tmp/before e7ed1d3
    python benchmarks/integrity_probes.py --checkout /tmp/before --label before
    python benchmarks/integrity_probes.py --checkout . --label after \\
        --merge benchmarks/results/issue25-probes-before.json \\
        --out benchmarks/results/issue25-probes.md

The cohort-table defects (3, 4, 5, the cohort half of 6, and 9's dates) have their own
probe table, ``benchmarks/results/issue25-probes-cohort.md``. About two minutes on 2 cores
(two fast preprocessing runs and one tiny training run).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import REPO, RESULTS, checkout_env, git_describe, script_parser

FAST = ['skullstrip.method="template"', "registration.resolution_mm=4.0",
        "registration.iterations=[30, 10]", "registration.shrink_factors=[2, 1]",
        "registration.smoothing_sigmas=[1.0, 0.0]", "qc.min_brain_ml=100", "n4.enabled=false"]


class Probe:
    """Runs Python snippets and ``adni-pu`` commands against one checkout, in one folder."""

    def __init__(self, checkout: Path, work: Path) -> None:
        self.checkout, self.work = checkout.resolve(), work
        # the checkout's package, then this checkout's test helpers (tests/)
        self.env = {**checkout_env(self.checkout, REPO / "tests"), "PYTHONUNBUFFERED": "1",
                    "OMP_NUM_THREADS": "1"}

    def py(self, code: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=self.work,
                              env=self.env, capture_output=True, text=True, timeout=timeout)

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return self.py("import sys; from adni_pu.cli.app import main; sys.argv = ['adni-pu', "
                       + ", ".join(repr(a) for a in args) + "]; main()", timeout)


def _last(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:160] if lines else ""


def _sets(values: list[str]) -> list[str]:
    return [a for v in values for a in ("--set", v)]


HEAD = """
import nibabel as nib
from adni_pu.preprocessing.phantom import synthetic_head
def head(path, seed):
    h = synthetic_head(spacing=4.0, shape=(48, 57, 48), seed=seed)
    nib.save(nib.Nifti1Image(h.data, h.affine), path)
"""


def replaced_scan(p: Probe) -> str:
    """1. A scan replaced at the same path (cp -p), preprocess rerun."""
    (p.work / "in").mkdir()
    p.py(HEAD + "head('in/s1.nii.gz', 1); head('b.nii.gz', 2)")
    first = p.cli("preprocess", "in", "out", "--no-progress", *_sets(FAST))
    shutil.copy2(p.work / "b.nii.gz", p.work / "in" / "s1.nii.gz")  # another head (cp -p)
    second = p.cli("preprocess", "in", "out", "--no-progress", *_sets(FAST))
    return f"1st: {_last(first.stdout.split('summary:')[0])}; after replacing: " \
           f"{_last(second.stdout.split('summary:')[0])}"


def second_input(p: Probe) -> str:
    """7. A second preprocess run into the same output with another input."""
    (p.work / "in2").mkdir()
    p.py(HEAD + "head('in2/s2.nii.gz', 3)")
    p.cli("preprocess", "in2", "out", "--no-progress", *_sets(FAST))
    rows = p.py("import pandas as pd; t = pd.read_csv('out/summary.csv', dtype=str); "
                "print(sorted(t.subject_id))").stdout.strip()
    return f"summary.csv subjects after both runs: {rows}"


def dicom_slices(p: Probe) -> str:
    """2. A DICOM series with one truncated slice file."""
    r = p.py("""
        import numpy as np
        from adni_tree import write_dicom_series
        from adni_pu.preprocessing.io import load_scan
        d = np.random.default_rng(0).normal(100, 10, (20, 22, 18)).astype(np.int16)
        write_dicom_series(__import__('pathlib').Path('dcm'), d, np.diag([4., 4., 4., 1.]),
                           '1.2.826.0.1.3680043.9.71')
        f = __import__('pathlib').Path('dcm/slice006.dcm')
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
        try:
            print('read, shape', load_scan('dcm')[0].shape)
        except Exception as e:
            print(type(e).__name__ + ':', str(e).split(': ', 1)[-1][:110])
        """)
    return _last(r.stdout) or _last(r.stderr)


def bids_name(p: Probe) -> str:
    """11. A flat folder holding sub-colin27_T1w.nii.gz."""
    (p.work / "flat").mkdir()
    r = p.py(HEAD + """
head('flat/sub-colin27_T1w.nii.gz', 4)
from adni_pu.preprocessing.io import discover_scans
s = discover_scans('flat')[0]
print(f'subject {s.subject_id!r}, folder {s.out_dir("OUT").parents[1].name}/')
""")
    return _last(r.stdout) or _last(r.stderr)


TINY = """
import sys
from pathlib import Path
from volume_helpers import make_volume_cohort, tiny_overrides
"""


def tiny_sets(p: Probe, epochs: int = 1) -> list[str]:
    """The ``--set`` arguments of a seconds-long run of the tests' tiny network."""
    lines = p.py(TINY + f"print('\\n'.join(tiny_overrides({epochs})))").stdout.split("\n")
    return _sets([o for o in lines if o])


def _trained(p: Probe) -> Path:
    if not (p.work / "run" / "best_model.pt").is_file():
        p.py(TINY + "make_volume_cohort(Path('cohort'))")
        p.cli("train", "cohort/manifest.csv", "run", "--preset", "naive", *tiny_sets(p))
    return p.work / "run"


def predict_out(p: Probe) -> str:
    """6. predict --out pointing at the input scan."""
    run = _trained(p)
    scan = p.work / "cohort" / "vol" / "sub-15_ses-bl_desc-preproc_T1w.nii"
    shutil.copy(scan, p.work / "scan.nii")
    r = p.cli("predict", str(run), "scan.nii", "--out", "scan.nii")
    head = (p.work / "scan.nii").read_bytes()[:20]
    kept = "the scan is still NIfTI" if head[:4] in (b"\x5c\x01\x00\x00", b"\x1c\x02\x00\x00") \
        else f"the scan now starts with {head[:16]!r}"
    return f"exit {r.returncode}, {kept}"


def truncated_train(p: Probe) -> str:
    """8. train on a manifest with one truncated scan."""
    _trained(p)
    shutil.copytree(p.work / "cohort", p.work / "cohort2")
    vol = p.work / "cohort2" / "vol" / "sub-3_ses-bl_desc-preproc_T1w.nii"
    vol.write_bytes(vol.read_bytes()[: vol.stat().st_size // 2])
    r = p.cli("train", "cohort2/manifest.csv", "run2", "--preset", "naive", *tiny_sets(p))
    left = "a run folder is left" if (p.work / "run2").exists() else "no run folder"
    return f"exit {r.returncode}, {left}: {_last(r.stderr)[:110]}"


def changed_manifest(p: Probe) -> str:
    """9. evaluate after the training manifest changed."""
    run = _trained(p)
    m = p.work / "cohort" / "manifest.csv"
    lines = m.read_text().splitlines()
    m.write_text("\n".join([lines[0], *reversed(lines[1:])]) + "\n")
    r = p.cli("evaluate", str(run), "--bootstrap", "0")
    warned = [ln for ln in r.stderr.splitlines() if "changed since" in ln]
    return f"exit {r.returncode}, " + ("warned: " + warned[0][:90] if warned else "no warning")


def bad_set(p: Probe) -> str:
    """9. --set train.batch_size=abc with a settings file."""
    (p.work / "c.toml").write_text("[train]\nepochs = 2\n")
    r = p.cli("train", "cohort/manifest.csv", "run3", "--config", "c.toml",
              "--set", "train.batch_size=abc")
    return _last(r.stderr)


def no_seeds(p: Probe) -> str:
    """8. benchmark mnist --seeds 0."""
    r = p.cli("benchmark", "mnist", "--seeds", "0", "--data-dir", ".", "--out", "bm")
    return f"exit {r.returncode}: {_last(r.stderr)[:110]}"


def read_only(p: Probe) -> str:
    """8. benchmark writing under a read-only place (/proc)."""
    r = p.cli("benchmark", "mnist", "--seeds", "1", "--data-dir", ".", "--out",
              "/proc/adni-pu-probe/out")
    return f"exit {r.returncode}: {_last(r.stderr)[:110]}"


def demo_epochs(p: Probe) -> str:
    """9. demo --epochs 0."""
    try:
        r = p.cli("demo", "--epochs", "0", "--out", "demo0", "--subjects", "12",
                  "--preprocessing", "ideal", timeout=60)
        made = "an output folder was made" if (p.work / "demo0").exists() else "nothing made"
        return f"exit {r.returncode}, {made}: {_last(r.stderr)[:100]}"
    except subprocess.TimeoutExpired:
        return "still running after 60 s (the cohort was being generated)"


def outcome(fn: Callable[[Probe], str], probe: Probe, width: int) -> str:
    """A probe's result on one line; a probe that breaks says how, in ``width`` characters."""
    try:
        return " ".join(fn(probe).split())
    except Exception as exc:  # noqa: BLE001 - a probe's failure is its result
        return f"probe failed: {type(exc).__name__}: {exc}"[:width]


def table_rows(names: list[str], before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The Markdown rows ``| probe | before | after |`` of a probe table ("-": not run)."""
    return [f"| {name} | " + " | ".join(c.replace("|", "/") for c in
                                        (before.get(name, "-"), after.get(name, "-"))) + " |"
            for name in names]


def add_probe_options(parser: argparse.ArgumentParser) -> None:
    """A probe table's options: the checkout probed, the run's label, the earlier run to
    show beside it and the Markdown table to write."""
    parser.add_argument("--checkout", type=Path, default=REPO)
    parser.add_argument("--label", default="after")
    parser.add_argument("--merge", type=Path, default=None,
                        help="JSON of an earlier run (another checkout) to show beside")
    parser.add_argument("--out", type=Path, default=None, help="Markdown table to write")


def write_table(args: argparse.Namespace, commit: str, results: dict[str, str],
                names: list[str], heading: tuple[str, str, str], note: str = "") -> None:
    """With ``--out`` and ``--merge``: the table of the earlier run ("before") beside this
    one ("after"). ``heading``: the title, the command that ran, the first column's name."""
    if args.out is None or args.merge is None:
        return
    title, command, column = heading
    before = json.loads(args.merge.read_text())
    lines = [f"# {title}: before and after", "",
             f"`{command}` on {before['commit']} (before) and {commit} (after), 2-core CPU; "
             "each probe runs in a fresh temporary folder." + note, "",
             f"| {column} | before | after |", "|---|---|---|"]
    lines += table_rows(names, before["results"], results)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


PROBES: list[tuple[str, Callable[[Probe], str]]] = [
    ("1 preprocess: a scan replaced at the same path", replaced_scan),
    ("7 preprocess: a second input into the same output", second_input),
    ("2 DICOM series with a truncated slice", dicom_slices),
    ("11 flat folder: sub-colin27_T1w.nii.gz", bids_name),
    ("6 predict --out = the input scan", predict_out),
    ("8 train: one truncated scan", truncated_train),
    ("9 evaluate: the manifest changed since training", changed_manifest),
    ("9 train --config c.toml --set train.batch_size=abc", bad_set),
    ("8 benchmark mnist --seeds 0", no_seeds),
    ("8 benchmark into a read-only place", read_only),
    ("9 demo --epochs 0", demo_epochs),
]


def main() -> None:
    parser = script_parser(__doc__)
    add_probe_options(parser)
    args = parser.parse_args()
    commit = git_describe(args.checkout, abbrev=7)
    results = {}
    with tempfile.TemporaryDirectory(prefix="adni-pu-probes-") as tmp:
        probe = Probe(args.checkout, Path(tmp))
        for name, fn in PROBES:
            results[name] = outcome(fn, probe, 160)
            print(f"{name}: {results[name]}", flush=True)
    record = {"label": args.label, "commit": commit, "results": results}
    json_path = RESULTS / f"issue25-probes-{args.label}.json"
    json_path.write_text(json.dumps(record, indent=2) + "\n")
    write_table(args, commit, results, [name for name, _ in PROBES],
                ("Issue 25 probes", "python benchmarks/integrity_probes.py", "defect"),
                note=" Cohort-table probes: `issue25-probes-cohort.md`.")


if __name__ == "__main__":
    main()
