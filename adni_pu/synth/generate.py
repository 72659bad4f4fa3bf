"""Write a synthetic ADNI-like cohort: BIDS raw T1 scans, ADNIMERGE-style table, truth.

Layout under ``out_dir``::

    bids/                                   raw data, as Clinica's adni-to-bids writes it
      dataset_description.json, README, participants.tsv, participants.json
      sub-ADNI011S0002/ses-M000/anat/sub-ADNI011S0002_ses-M000_T1w.nii.gz
      derivatives/synth-pet/sub-.../ses-.../pet/
          ..._trc-AV45[_space-MNI152NLin2009aSym]_desc-suvr_pet.nii.gz   (pet=true)
    clinical/ADNIMERGE.csv                  one row per visit (some without MRI or PET)
    truth.csv                               per subject: latent amyloid level and status
    truth_scans.csv                         per scan: visit effects, pose, file paths
    truth/sub-.../ses-.../..._desc-brain_mask.nii.gz   true brain masks (optional)
    preprocessed_ideal/                     perfect-preprocessing stand-ins (optional),
      dataset_description.json, summary.csv  named as adni-pu preprocess names its volumes:
      sub-.../ses-.../anat/..._space-MNI152NLin2009aSym_res-1p5mm_desc-preproc_T1w.nii.gz
    synth_config.toml                       the settings used
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from adni_pu.atlas import MODEL_GRID_SPACING
from adni_pu.preprocessing.derivatives import TEMPLATE, res_label, scan_names
from adni_pu.synth.config import DX_BL_CODES, SynthConfig
from adni_pu.synth.subjects import Subject, make_subjects

#: Where under bids/ the synthetic PET maps go (SUVR maps are derivatives, not raw PET).
PET_DERIVATIVES = "derivatives/synth-pet"


@dataclass
class SynthCohort:
    """Paths of a generated cohort."""

    root: Path
    bids_dir: Path
    table_path: Path
    truth_path: Path
    truth_scans_path: Path
    scan_paths: list[Path]
    seconds_per_scan: float


def _save(array: np.ndarray, affine: np.ndarray, path: Path, units: str = "mm") -> None:
    import nibabel as nib

    img = nib.Nifti1Image(array, affine)
    img.header.set_xyzt_units(units)
    img.set_qform(affine, code=1)
    img.set_sform(affine, code=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(img, str(path))


def _write_bids_metadata(bids: Path, seed: int) -> None:
    """dataset_description.json, README and participants.json of the raw BIDS folder (what
    the BIDS validator asks of a raw dataset)."""
    (bids / "dataset_description.json").write_text(json.dumps({
        "Name": f"adni-pu synthetic ADNI-like cohort (seed {seed})",
        "BIDSVersion": "1.10.0", "DatasetType": "raw", "License": "CC0",
        "GeneratedBy": [{"Name": "adni_pu.synth",
                         "Description": "synthetic T1w heads, no real participant"}],
    }, indent=2) + "\n")
    (bids / "README").write_text(
        f"Synthetic ADNI-like cohort written by adni_pu.synth (seed {seed}).\n\n"
        "Every head is rendered from the MNI152 template with a made-up subject's anatomy, "
        "pose and scanner effects; no real participant's data is in it. The clinical "
        "table, amyloid measures and truth files lie beside this folder.\n")
    (bids / "participants.json").write_text(json.dumps({
        "participant_id": {"Description": "BIDS subject label (sub-ADNI + the PTID's digits)"},
        "alternative_id_1": {"Description": "ADNI PTID (site_S_roster), as in ADNIMERGE"},
        "sex": {"Description": "sex", "Levels": {"F": "female", "M": "male"}},
        "age_bl": {"Description": "age at the baseline visit", "Units": "year"},
        "diagnosis_bl": {"Description": "baseline diagnosis (ADNIMERGE DX_bl)",
                         "Levels": {c: c for c in DX_BL_CODES}},
    }, indent=2) + "\n")


def _write_derivative_description(folder: Path, source: Path, what: str) -> None:
    """dataset_description.json of a derivative folder of the synthetic ``source``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dataset_description.json").write_text(json.dumps({
        "Name": f"adni-pu synthetic cohort: {what}", "BIDSVersion": "1.10.0",
        "DatasetType": "derivative", "GeneratedBy": [{"Name": "adni_pu.synth"}],
        "SourceDatasets": [{"URL": source.absolute().as_uri()}],
    }, indent=2) + "\n")


def clinical_rows(subject: Subject) -> list[dict]:
    """The subject's ADNIMERGE-style rows, one per visit (the generator's table; the demo's
    composition check builds a cohort from them before any scan exists)."""
    rows = []
    for v in subject.visits:
        rows.append({
            "RID": subject.rid, "PTID": subject.ptid, "VISCODE": v.viscode,
            "SITE": subject.site, "EXAMDATE": v.examdate.isoformat(),
            "DX_bl": subject.dx_bl, "DX": v.dx, "AGE": subject.age,
            "PTGENDER": subject.sex,
            "AV45": v.suvr if subject.tracer == "AV45" else None,
            "FBB": v.suvr if subject.tracer == "FBB" else None,
            "PIB": None, "Month": v.months, "M": v.months,
        })
    return rows


def generate_cohort(out_dir: str | Path, n_subjects: int = 20, seed: int = 0,
                    config: SynthConfig | None = None, progress: bool = False) -> SynthCohort:
    """Generate ``n_subjects`` synthetic subjects under ``out_dir``; same seed, same files.

    Subject ``i`` depends only on (seed, i), so a larger cohort extends a smaller one.
    """
    import pandas as pd

    from adni_pu.config import save
    from adni_pu.synth.anatomy import build_anatomy
    from adni_pu.synth.render import SubjectAnatomy, render_ideal_preprocessed, render_scan

    cfg = config or SynthConfig()
    root = Path(out_dir).resolve()  # absolute paths in the ideal summary.csv
    bids = root / "bids"
    bids.mkdir(parents=True, exist_ok=True)
    anatomy = build_anatomy(float(min(max(cfg.voxel_size, 1.0), 3.0)))
    subjects = make_subjects(n_subjects, seed, cfg)

    _write_bids_metadata(bids, seed)
    pd.DataFrame({
        "participant_id": [f"sub-{s.bids_label}" for s in subjects],
        "alternative_id_1": [s.ptid for s in subjects],
        "sex": [s.sex[0] for s in subjects], "age_bl": [s.age for s in subjects],
        "diagnosis_bl": [s.dx_bl for s in subjects],
    }).to_csv(bids / "participants.tsv", sep="\t", index=False)

    table, truth, scans, paths, summary = [], [], [], [], []
    start = time.perf_counter()
    iterator = subjects
    if progress:
        from tqdm import tqdm

        iterator = tqdm(subjects, desc="synth subjects", unit="subject")
    for subject in iterator:
        table.extend(clinical_rows(subject))
        truth.append({
            "subject_id": subject.ptid, "RID": subject.rid,
            "participant_id": f"sub-{subject.bids_label}",
            "latent_amyloid": round(subject.latent, 5),
            "amyloid_positive": int(subject.amyloid_positive),
            "dx_bl": subject.dx_bl, "severity_bl": round(subject.severity, 5),
            "tracer": subject.tracer or "", "age": subject.age, "sex": subject.sex,
        })
        sub_anat = SubjectAnatomy(anatomy, subject, cfg)
        visit_seeds = np.random.SeedSequence([seed, subject.rid]).spawn(len(subject.visits))
        for visit, vseed in zip(subject.visits, visit_seeds):
            if not visit.has_mri:
                continue
            rng = np.random.default_rng(vseed)
            out = render_scan(sub_anat, subject, visit, rng, cfg)
            stem = f"sub-{subject.bids_label}_ses-{visit.bids_session}"
            ses_dir = bids / f"sub-{subject.bids_label}" / f"ses-{visit.bids_session}"
            t1_path = ses_dir / "anat" / f"{stem}_T1w.nii.gz"
            _save(out.t1, out.affine, t1_path)
            paths.append(t1_path)
            row = {
                "subject_id": subject.ptid, "session_id": visit.viscode,
                "participant_id": f"sub-{subject.bids_label}",
                "bids_session": f"ses-{visit.bids_session}",
                "t1_path": str(t1_path.relative_to(root)),
                "latent_amyloid": round(visit.latent, 5),
                "amyloid_positive": int(subject.amyloid_positive),
                "dx": visit.dx, "severity": round(visit.severity, 5),
                "hippocampal_loss": round(visit.hippocampal_loss, 5),
                "cortical_loss": round(visit.cortical_loss, 5),
                "ventricle_mm": round(visit.ventricle_mm, 4),
                "orientation": out.orientation,
                **{k: round(val, 3) for k, val in out.pose.items()},
                "brain_mask_path": "", "pet_path": "",
            }
            if out.brain_mask is not None:
                mask_path = (root / "truth" / f"sub-{subject.bids_label}"
                             / f"ses-{visit.bids_session}" / f"{stem}_desc-brain_mask.nii.gz")
                _save(out.brain_mask, out.affine, mask_path)
                row["brain_mask_path"] = str(mask_path.relative_to(root))
            if out.pet is not None:  # an SUVR map, not raw counts: a derivative of bids/
                space = f"_space-{TEMPLATE}" if cfg.pet_space == "template" else ""
                pet_path = (bids / PET_DERIVATIVES / f"sub-{subject.bids_label}"
                            / f"ses-{visit.bids_session}" / "pet"
                            / f"{stem}_trc-{subject.tracer}{space}_desc-suvr_pet.nii.gz")
                _save(out.pet, out.pet_affine, pet_path)
                row["pet_path"] = str(pet_path.relative_to(root))
            if cfg.ideal_preprocessed:
                tic = time.perf_counter()
                ideal_rng = np.random.default_rng([seed, subject.rid, visit.months, 1])
                volume, grid = render_ideal_preprocessed(sub_anat, visit, ideal_rng, cfg)
                ideal_path = root / "preprocessed_ideal" / scan_names(
                    subject.bids_label, visit.bids_session,
                    res_label(MODEL_GRID_SPACING))["preproc"]
                _save(volume, grid, ideal_path)
                row["ideal_preprocessed_path"] = str(ideal_path.relative_to(root))
                summary.append({
                    "subject_id": subject.bids_label, "session_id": visit.bids_session,
                    "input_path": str(t1_path), "status": "done",
                    "preprocessed_path": str(ideal_path), "error": "",
                    "seconds": round(time.perf_counter() - tic, 3),
                })
            scans.append(row)
    elapsed = time.perf_counter() - start

    table_path = root / "clinical" / cfg.table_name
    table_path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(table).to_csv(table_path, index=False)
    truth_path = root / "truth.csv"
    pd.DataFrame(truth).to_csv(truth_path, index=False)
    scans_path = root / "truth_scans.csv"
    pd.DataFrame(scans).to_csv(scans_path, index=False)
    if summary:
        pd.DataFrame(summary).to_csv(root / "preprocessed_ideal" / "summary.csv", index=False)
        _write_derivative_description(root / "preprocessed_ideal", bids,
                                      "ideal preprocessed T1w stand-ins (model grid)")
    if any(row["pet_path"] for row in scans):
        _write_derivative_description(bids / PET_DERIVATIVES, bids,
                                      "amyloid PET SUVR maps (cerebellar grey matter = 1)")
    save(cfg, root / "synth_config.toml")
    return SynthCohort(
        root=root, bids_dir=bids, table_path=table_path, truth_path=truth_path,
        truth_scans_path=scans_path, scan_paths=paths,
        seconds_per_scan=elapsed / max(len(paths), 1),
    )
