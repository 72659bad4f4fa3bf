"""A small preprocessing folder written directly (no preprocessing run): what ``adni-pu qc``
and ``cohort build`` read of one.

Each scan gets the sidecar of its preprocessed T1w (``scan_label``, status, QC metrics,
outputs), a small QC picture under ``sub-*/figures/``, a few bytes standing in for its volume,
and a row of ``summary.csv``; ``ADNIMERGE.csv`` gives every subject a baseline visit with
an AV45 SUVR, so ``cohort build --preset tracer-cutoffs`` labels them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

CLINICAL_HEADER = "RID,PTID,VISCODE,EXAMDATE,DX_bl,DX,AGE,PTGENDER,AV45,FBB,PIB"


def _png(path: Path, seed: int) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    plt.imsave(path, np.random.default_rng(seed).random((24, 36)), cmap="gray")


def make_qc_folder(root: Path, n: int = 12, refused: int = 1) -> tuple[Path, Path, list[str]]:
    """Write ``root/prep`` (``n`` scans, the last ``refused`` of them refused by the
    automatic QC) and ``root/ADNIMERGE.csv``; returns the folder, the clinical table and the
    scan ids (``sub-011S000i_ses-bl``)."""
    from adni_pu.preprocessing.derivatives import scan_names

    prep = root / "prep"
    prep.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    summary = ["subject_id,session_id,input_path,status,preprocessed_path,error,seconds"]
    clinical = [CLINICAL_HEADER]
    ids = []
    for i in range(1, n + 1):
        label = f"011S{i:04d}"
        names = scan_names(label, "bl", "1p5mm")
        status = "failed-qc" if i > n - refused else "done"
        volume = 1250 + 60 * rng.standard_normal() if status == "done" else 520.0
        qc = {"brain_volume_ml": round(volume, 1),
              "brain_fraction_of_head": round(0.3 + 0.02 * rng.standard_normal(), 3),
              "registration_similarity": round(0.8 + 0.03 * rng.standard_normal(), 3),
              "template_mask_dice": round(0.95 + 0.01 * rng.standard_normal(), 3),
              "mask_edge_offset_mm": round(-1.0 + 0.3 * rng.standard_normal(), 2)}
        problems = [] if status == "done" else ["brain volume 520 ml below the plausible "
                                                "minimum 700 ml"]
        side = {"scan_label": f"sub-{label}_ses-bl", "subject_id": f"011_S_{i:04d}",
                "session_id": "bl", "status": status, "error": "; ".join(problems),
                "qc_problems": problems, "qc": qc,
                "outputs": {"qc": names["qc"], "preproc": names["preproc"],
                            "sidecar": names["sidecar"]}}
        (prep / names["sidecar"]).parent.mkdir(parents=True, exist_ok=True)
        (prep / names["sidecar"]).write_text(json.dumps(side))
        (prep / names["preproc"]).write_bytes(label.encode())  # distinct content: no leak
        _png(prep / names["qc"], i)
        preproc = names["preproc"] if status == "done" else ""
        summary.append(f"011_S_{i:04d},bl,/raw/{i}.nii,{status},{preproc},"
                       f"{'; '.join(problems)},3.0")
        dx = ["CN", "LMCI", "AD"][i % 3]
        clinical.append(f"{i},011_S_{i:04d},bl,2010-01-{i % 27 + 1:02d},{dx},{dx},{60 + i},"
                        f"{'Male' if i % 2 else 'Female'},{0.9 + 0.04 * i:.2f},,")
        ids.append(side["scan_label"])
    (prep / "summary.csv").write_text("\n".join(summary) + "\n")
    (root / "ADNIMERGE.csv").write_text("\n".join(clinical) + "\n")
    return prep, root / "ADNIMERGE.csv", ids
