"""A synthetic ADNI download: the files a user fetches from the ADNI archive (LONI IDA).

What ``adni-pu synth DIR`` writes, so that the README's own-data block can be tried (and
tested) without ADNI access::

    DIR/
      ADNI/<PTID>/<series description>/<date_time>/I<image ID>/
          ADNI_<PTID>_MR_<series>_br_raw_<stamp>_1_S<series ID>_I<image ID>.nii
                                  (one .dcm file per slice with fmt="dicom")
      ADNIMERGE.csv               one row per visit, ADNIMERGE's column names
      UCBERKELEY_AMY_6MM_<date>.csv  one row per amyloid PET scan, UC Berkeley's columns
      synth/                      what the generator knows (no part of a real download):
        truth.csv                 per subject: latent amyloid level and status
        images.csv                per image folder: series, dates, the status
                                  ``adni-pu preprocess`` should give it (done, extra-t1, not-t1)
        synth_config.toml         the generator's settings

The subjects, their anatomy and their scans are the demo's (:mod:`adni_pu.synth`); the
download adds what a real one has around them: ADNI's series descriptions (``MPRAGE``,
``MP-RAGE``, ``Accelerated_Sagittal_MPRAGE``, ``IR-FSPGR`` ...), a repeat T1 at some
visits, localiser and FLAIR series, MRI dates some days from the visit's EXAMDATE and PET
dates some weeks from it. A small download draws its subjects to the generator's
diagnosis mix exactly (largest remainder), not by chance, so that a cohort of 18 still
has labelled positives to split.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from adni_pu import outputs
from adni_pu.errors import ConfigError
from adni_pu.synth.config import DX_BL_CODES, SynthConfig
from adni_pu.synth.subjects import Subject, Visit, make_subjects
from adni_pu.synth.target import write_in_place

#: The generator's settings for a download, as values: the demo's scans (3 mm, published
#: effect sizes) with ADNI's visit mix (1 to 3 MRI visits) and amyloid PET for 90 %.
DOWNLOAD_SYNTH: dict[str, Any] = {
    "voxel_size": 3.0, "write_brain_masks": False, "hippocampal_atrophy": 0.3,
    "atrophy_noise": 0.08, "pet_fraction": 0.9,
}
#: Date of the UC Berkeley table's release in its file name (IDA names them so).
AMYLOID_RELEASE = dt.date(2025, 7, 28)
#: T1 series descriptions of ADNI's scanners and phases (as IDA spells the folders).
T1_SERIES: tuple[str, ...] = ("MPRAGE", "MP-RAGE", "Accelerated_Sagittal_MPRAGE",
                              "MPRAGE_GRAPPA2", "MPRAGE_SENSE2", "IR-FSPGR")
#: Series that are not T1 (skipped by ``adni-pu preprocess``, status ``not-t1``).
LOCALIZER, FLAIR = "3_Plane_Localizer", "Axial_T2-FLAIR"
FORMATS: tuple[str, ...] = ("nifti", "dicom")
#: Columns of the UC Berkeley AMY_6MM table written (its own names; the regional SUVRs of
#: the real table are left out).
AMYLOID_COLUMNS: tuple[str, ...] = (
    "LONIUID", "RID", "SITEID", "PTID", "VISCODE", "VISCODE2", "SCANDATE", "PROCESSDATE",
    "IMAGE_RESOLUTION", "qc_flag", "TRACER", "TRACER_SUVR_WARNING", "AMYLOID_STATUS",
    "AMYLOID_STATUS_COMPOSITE_REF", "CENTILOIDS", "SUMMARY_SUVR", "SUMMARY_VOLUME",
    "WHOLECEREBELLUM_SUVR", "COMPOSITE_REF_SUVR", "update_stamp")
#: ``adni-pu synth DIR``: every name it writes, for both layouts (the registry,
#: :mod:`adni_pu.workflows.output_registry`); all of them or none (:mod:`.target`).
LAYOUT = outputs.layout(
    "synth", "DIR", "synth/",
    ("ADNI/", "--layout adni: the image folders"),
    ("ADNIMERGE.csv", "--layout adni: the clinical table"),
    ("UCBERKELEY_AMY_6MM_*.csv", "the amyloid PET table"),
    ("synth/", "--layout adni: what the generator knows"),
    ("bids/", "--layout bids: BIDS raw data"),
    ("clinical/", "--layout bids: the clinical table"),
    ("truth.csv", "--layout bids: per subject, the truth"),
    ("truth_scans.csv", "--layout bids: per scan, the truth"))

#: ADNIMERGE's columns, in its order, of those written.
CLINICAL_COLUMNS: tuple[str, ...] = (
    "RID", "COLPROT", "ORIGPROT", "PTID", "SITE", "VISCODE", "EXAMDATE", "DX_bl", "AGE",
    "PTGENDER", "PIB", "AV45", "FBB", "DX", "EXAMDATE_bl", "Month_bl", "Month", "M")
#: Berkeley's positivity cut-offs (whole cerebellum) and Centiloid conversions per tracer.
_BERKELEY = {"AV45": ("FBP", 1.11, 188.22, -189.16), "FBB": ("FBB", 1.08, 157.15, -151.87)}


@dataclass
class AdniDownload:
    """Paths and counts of a written download."""

    root: Path
    adni_dir: Path
    clinical_path: Path
    amyloid_path: Path
    truth_path: Path
    images_path: Path
    n_subjects: int
    counts: dict[str, int] = field(default_factory=dict)
    """Image folders by the status preprocessing should give them (done, extra-t1, not-t1)."""


def download_config(overrides: dict[str, Any] | None = None) -> SynthConfig:
    """The generator's settings of a download: :data:`DOWNLOAD_SYNTH`, then ``overrides``."""
    from adni_pu import config as cfgmod

    return cfgmod.from_dict(SynthConfig, {**DOWNLOAD_SYNTH, **(overrides or {})},
                            where="synthetic download settings")


def diagnosis_quota(n: int, proportions: tuple[float, ...]) -> dict[str, int]:
    """Subjects per baseline diagnosis for ``n`` subjects: the largest-remainder rounding of
    ``proportions`` (order of :data:`DX_BL_CODES`; ties to the earlier code)."""
    share = np.asarray(proportions, dtype=float) * n
    quota = np.floor(share).astype(int)
    for i in np.argsort(-(share - quota), kind="stable")[: n - int(quota.sum())]:
        quota[i] += 1
    return dict(zip(DX_BL_CODES, (int(q) for q in quota)))


def pick_subjects(n: int, seed: int, cfg: SynthConfig) -> list[Subject]:
    """``n`` subjects with exactly :func:`diagnosis_quota` of each baseline diagnosis: the
    generator's subjects 0, 1, 2, ... of ``seed``, each kept while its diagnosis has room
    (so RIDs have gaps, as ADNI's do). Same seed and ``n``, same subjects."""
    if n < 1:
        raise ConfigError(f"subjects: expected at least 1, found {n}")
    room = diagnosis_quota(n, cfg.dx_proportions)
    chosen: list[Subject] = []
    pool = 0
    while len(chosen) < n:
        grow = max(4 * n, 64)
        for subject in make_subjects(pool + grow, seed, cfg)[pool:]:
            if room[subject.dx_bl] > 0:
                room[subject.dx_bl] -= 1
                chosen.append(subject)
                if len(chosen) == n:
                    break
        pool += grow
        if pool > 200 * n + 1000:  # a diagnosis with a quota but (almost) no probability
            raise ConfigError(f"dx_proportions {cfg.dx_proportions}: cannot draw {n} subjects "
                              f"with this diagnosis mix (still wanted: {room})")
    return chosen


# ----------------------------------------------------------------------------- images


@dataclass
class _Image:
    """One image folder of the download."""

    subject: Subject
    visit: Visit
    series: str
    acquired: dt.datetime
    image_id: str
    series_id: str
    status: str


def _plan_visit(subject: Subject, visit: Visit, rng: np.random.Generator, t1_series: str,
                counter: list[int], force: set[str]) -> list[_Image]:
    """The image folders of one MRI visit: its T1, and perhaps a repeat, a localiser, FLAIR."""
    day = visit.examdate + dt.timedelta(days=int(rng.integers(-14, 15)))
    start = dt.datetime.combine(day, dt.time(8, 0)) + dt.timedelta(
        minutes=int(rng.integers(0, 9 * 60)), seconds=int(rng.integers(0, 60)))
    parts = [(LOCALIZER, -6, "not-t1", "localizer" in force or rng.random() < 0.5),
             (t1_series, 0, "done", True),
             (f"{t1_series}_Repeat", 7, "extra-t1", "repeat" in force or rng.random() < 0.25),
             (FLAIR, 15, "not-t1", "flair" in force or rng.random() < 0.3)]
    images = []
    for series, minutes, status, wanted in parts:
        if not wanted:
            continue
        counter[0] += 1
        images.append(_Image(subject, visit, series, start + dt.timedelta(minutes=minutes),
                             f"I{counter[0]}", f"S{counter[0] - 60_000}", status))
    return images


def _nifti(data: np.ndarray, affine: np.ndarray, path: Path) -> None:
    import nibabel as nib

    img = nib.Nifti1Image(data, affine)
    img.header.set_xyzt_units("mm")
    img.set_qform(affine, code=1)
    img.set_sform(affine, code=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(img, str(path))


def write_dicom_series(folder: Path, data: np.ndarray, affine: np.ndarray, uid: str,
                       name: Callable[[int], str], tags: dict[str, Any] | None = None) -> None:
    """An int16 volume as an axial DICOM series, one file per slice (MR, explicit VR little
    endian), that reads back (SimpleITK, ``adni_pu.preprocessing.io``) as the same voxels
    in the same place. ``affine`` may be any axis-aligned voxel-to-RAS affine: the slices
    are axial, from inferior to superior, each with its columns along the patient's left
    and its rows towards posterior (DICOM's LPS axes). ``name(k)`` is slice k's file name;
    ``tags`` are added to every slice."""
    import nibabel as nib
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian

    canonical = nib.as_closest_canonical(nib.Nifti1Image(data, affine))
    ras = np.asarray(canonical.dataobj).astype(np.int16)
    aff = canonical.affine
    spacing = np.diag(aff)[:3]
    if not np.allclose(aff[:3, :3], np.diag(spacing)) or (spacing <= 0).any():
        raise ConfigError(f"{folder}: DICOM needs an axis-aligned affine, found {aff[:3, :3]}")
    n, m, _ = ras.shape
    # LPS position of the first voxel of a slice: x and y run backwards in LPS
    x0 = -(aff[0, 3] + spacing[0] * (n - 1))
    y0 = -(aff[1, 3] + spacing[1] * (m - 1))
    lps = ras[::-1, ::-1, :]
    folder.mkdir(parents=True, exist_ok=True)
    mr = "1.2.840.10008.5.1.4.1.1.4"
    for k in range(ras.shape[2]):
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = mr
        meta.MediaStorageSOPInstanceUID = f"{uid}.1.{k + 1}"
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds = Dataset()
        ds.file_meta = meta
        ds.SOPClassUID, ds.SOPInstanceUID = mr, meta.MediaStorageSOPInstanceUID
        ds.Modality = "MR"
        ds.StudyInstanceUID, ds.SeriesInstanceUID = f"{uid}.2", f"{uid}.3"
        ds.FrameOfReferenceUID = f"{uid}.4"
        for key, value in (tags or {}).items():
            setattr(ds, key, value)
        ds.InstanceNumber = k + 1
        ds.ImagePositionPatient = [float(x0), float(y0), float(aff[2, 3] + spacing[2] * k)]
        ds.ImageOrientationPatient = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
        ds.PixelSpacing = [float(spacing[1]), float(spacing[0])]  # between rows, columns
        ds.SliceThickness = float(spacing[2])
        ds.Rows, ds.Columns = m, n
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 1
        ds.PixelData = np.ascontiguousarray(lps[:, :, k].T).tobytes()
        ds.save_as(folder / name(k), enforce_file_format=True)


def _other_series(t1: np.ndarray, affine: np.ndarray, series: str
                  ) -> tuple[np.ndarray, np.ndarray]:
    """A small stand-in for a non-T1 series: thick slices of the T1 (FLAIR: inverted
    contrast; localiser: three slices). Never read by the pipeline, which skips them by
    their description, but real files, as in a download."""
    step = (2, 2, 3) if series == FLAIR else (2, 2, max(t1.shape[2] // 3, 1))
    data = t1[::step[0], ::step[1], ::step[2]][:, :, :3 if series == LOCALIZER else None]
    if series == FLAIR:
        data = np.clip(data.max() - data, 0, None)
    return data.astype(np.int16), affine @ np.diag([*step, 1.0])


def _stamp(when: dt.datetime) -> str:
    return when.strftime("%Y%m%d%H%M%S")


def _folder(adni: Path, image: _Image) -> Path:
    when = image.acquired.strftime("%Y-%m-%d_%H_%M_%S") + ".0"
    return adni / image.subject.ptid / image.series / when / image.image_id


def _file_name(image: _Image, ext: str, k: int = 1) -> str:
    return (f"ADNI_{image.subject.ptid}_MR_{image.series}_br_raw_{_stamp(image.acquired)}"
            f"_{k}_{image.series_id}_{image.image_id}{ext}")


def _write_image(adni: Path, image: _Image, data: np.ndarray, affine: np.ndarray,
                 fmt: str) -> Path:
    folder = _folder(adni, image)
    if fmt == "nifti":
        path = folder / _file_name(image, ".nii")
        _nifti(data, affine, path)
        return path
    uid = f"1.2.826.0.1.3680043.10.1138.{image.subject.rid}.{image.image_id[1:]}"
    tags = {"PatientID": image.subject.ptid, "SeriesDescription": image.series.replace("_", " "),
            "StudyDate": image.acquired.strftime("%Y%m%d"),
            "SeriesDate": image.acquired.strftime("%Y%m%d"),
            "AcquisitionDate": image.acquired.strftime("%Y%m%d"),
            "SeriesTime": image.acquired.strftime("%H%M%S"),
            "PatientSex": image.subject.sex[0], "MRAcquisitionType": "3D"}
    write_dicom_series(folder, data, affine, uid,
                       lambda k: _file_name(image, ".dcm", k + 1), tags)
    return folder


# ----------------------------------------------------------------------------- tables


def clinical_table(subjects: list[Subject]) -> Any:
    """ADNIMERGE-style table (one row per visit) of ``subjects``, ADNIMERGE's column order."""
    import pandas as pd

    from adni_pu.synth.generate import clinical_rows

    rows = []
    for subject in subjects:
        first = subject.visits[0].examdate.isoformat()
        for row in clinical_rows(subject):
            row.update({"COLPROT": "ADNI2", "ORIGPROT": "ADNI2", "EXAMDATE_bl": first,
                        "Month_bl": row["Month"]})
            rows.append(row)
    frame = pd.DataFrame(rows)
    return frame[[c for c in CLINICAL_COLUMNS if c in frame.columns]]


def amyloid_table(subjects: list[Subject], seed: int) -> Any:
    """UC Berkeley AMY_6MM-style table: one row per amyloid PET scan (a visit with an SUVR),
    dated some weeks from the visit, with Berkeley's tracer names, cut-offs and Centiloids."""
    import pandas as pd

    rows = []
    for subject in subjects:
        rng = np.random.default_rng([seed, subject.rid, 7])
        for visit in subject.visits:
            if visit.suvr is None or subject.tracer not in _BERKELEY:
                continue
            tracer, cutoff, slope, intercept = _BERKELEY[subject.tracer]
            when = visit.examdate + dt.timedelta(days=int(rng.integers(-30, 31)))
            positive = int(visit.suvr >= cutoff)
            rows.append({
                "LONIUID": f"I{int(rng.integers(1_000_000, 9_999_999))}", "RID": subject.rid,
                "SITEID": subject.site, "PTID": subject.ptid, "VISCODE": visit.viscode,
                "VISCODE2": visit.viscode, "SCANDATE": when.isoformat(),
                "PROCESSDATE": AMYLOID_RELEASE.isoformat(), "IMAGE_RESOLUTION": 6,
                "qc_flag": 2, "TRACER": tracer,
                "TRACER_SUVR_WARNING": "USE CENTILOIDS (NOT SUVRs) TO COMPARE ACROSS TRACERS",
                "AMYLOID_STATUS": positive, "AMYLOID_STATUS_COMPOSITE_REF": positive,
                "CENTILOIDS": round(slope * visit.suvr + intercept, 2),
                "SUMMARY_SUVR": round(visit.suvr, 4),
                "SUMMARY_VOLUME": int(rng.integers(45_000, 60_000)),
                "WHOLECEREBELLUM_SUVR": 1.0,
                "COMPOSITE_REF_SUVR": round(float(rng.uniform(0.78, 0.86)), 4),
                "update_stamp": f"{AMYLOID_RELEASE.isoformat()} 14:53:01.0",
            })
    return pd.DataFrame(rows, columns=list(AMYLOID_COLUMNS))


def amyloid_file_name(release: dt.date = AMYLOID_RELEASE) -> str:
    """``UCBERKELEY_AMY_6MM_28Jul2025.csv``: IDA's name of the table of that release."""
    return f"UCBERKELEY_AMY_6MM_{release.day:02d}{release.strftime('%b%Y')}.csv"


# ----------------------------------------------------------------------------- writing


@dataclass
class DownloadPlan:
    """What a download holds, before any image is rendered: the subjects and every image
    folder (series, acquisition time, image ID, the status preprocessing should give it)."""

    subjects: list[Subject]
    images: list[_Image]
    seed: int

    def images_table(self) -> Any:
        """One row per image folder (``synth/images.csv`` without paths)."""
        import pandas as pd

        return pd.DataFrame([{
            "PTID": i.subject.ptid, "RID": i.subject.rid, "VISCODE": i.visit.viscode,
            "EXAMDATE": i.visit.examdate.isoformat(),
            "acquisition_date": i.acquired.date().isoformat(),
            "acquisition_time": i.acquired.strftime("%H:%M:%S"),
            "series_description": i.series, "image_id": i.image_id,
            "expected_status": i.status} for i in self.images])


def plan_download(subjects: int, seed: int, cfg: SynthConfig) -> DownloadPlan:
    """The subjects (:func:`pick_subjects`) and image folders of a download; cheap (no
    image), so the composition of a download can be checked before it is written."""
    chosen = pick_subjects(subjects, seed, cfg)
    counter = [100_000 + 1000 * (seed % 1000)]
    images: list[_Image] = []
    for n, subject in enumerate(chosen):
        rng = np.random.default_rng([seed, subject.rid, 3])
        t1_series = T1_SERIES[int(rng.integers(len(T1_SERIES)))]
        # the first subjects always show each kind of clutter, so that every download has it
        force = {0: {"localizer", "flair"}, 1: {"repeat"}}.get(n, set())
        for visit in subject.visits:
            if visit.has_mri:
                images += _plan_visit(subject, visit, rng, t1_series, counter, force)
                force = set()
    return DownloadPlan(chosen, images, seed)


def write_adni_download(out: str | Path, subjects: int = 32, seed: int = 0, fmt: str = "nifti",
                        config: SynthConfig | None = None,
                        log: Callable[[str], None] = lambda m: None) -> AdniDownload:
    """Write a synthetic ADNI download of ``subjects`` subjects into the new or empty folder
    ``out`` (layout: the module docstring). Same arguments, same files.

    ``fmt`` is ``nifti`` (IDA's NIfTI download: one ``.nii`` per image) or ``dicom`` (one
    ``.dcm`` per slice). ``config`` defaults to :func:`download_config`. ``log`` gets a
    line per subject.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"format: expected one of {list(FORMATS)}, found {fmt!r}")
    cfg = config or download_config()
    plan = plan_download(subjects, seed, cfg)
    out = Path(out)
    write_in_place(out, lambda tmp: _write(tmp, plan, fmt, cfg, log))
    statuses = [i.status for i in plan.images]
    return AdniDownload(root=out, adni_dir=out / "ADNI", clinical_path=out / "ADNIMERGE.csv",
                        amyloid_path=out / amyloid_file_name(),
                        truth_path=out / "synth" / "truth.csv",
                        images_path=out / "synth" / "images.csv", n_subjects=len(plan.subjects),
                        counts={s: statuses.count(s) for s in sorted(set(statuses))})


def truth_table(subjects: list[Subject]) -> Any:
    """Per subject, what the generator knows: baseline diagnosis, latent amyloid level and
    status, neurodegeneration stage, tracer."""
    import pandas as pd

    return pd.DataFrame([{
        "PTID": s.ptid, "RID": s.rid, "dx_bl": s.dx_bl, "latent_amyloid": round(s.latent, 5),
        "amyloid_positive": int(s.amyloid_positive), "severity_bl": round(s.severity, 5),
        "tracer": s.tracer or "", "age": s.age, "sex": s.sex} for s in subjects])


def _write(root: Path, plan: DownloadPlan, fmt: str, cfg: SynthConfig,
           log: Callable[[str], None]) -> None:
    from adni_pu.config import save
    from adni_pu.synth.anatomy import build_anatomy
    from adni_pu.synth.render import SubjectAnatomy, render_scan

    anatomy = build_anatomy(float(min(max(cfg.voxel_size, 1.0), 3.0)))
    adni, seed = root / "ADNI", plan.seed
    paths, orientations = [], []
    for n, subject in enumerate(plan.subjects):
        sub_anat = SubjectAnatomy(anatomy, subject, cfg)
        # the generator's per-visit seeds (adni_pu.synth.generate): this subject's T1 scans
        # are the ones the BIDS layout of the same seed and settings gives it
        visit_seeds = dict(zip((v.months for v in subject.visits), np.random.SeedSequence(
            [seed, subject.rid]).spawn(len(subject.visits))))
        rendered: dict[int, Any] = {}
        mine = [i for i in plan.images if i.subject is subject]
        for image in mine:
            visit = image.visit
            if visit.months not in rendered:
                rendered[visit.months] = render_scan(
                    sub_anat, subject, visit, np.random.default_rng(visit_seeds[visit.months]),
                    cfg)
            t1 = rendered[visit.months]
            if image.status == "not-t1":
                data, affine = _other_series(t1.t1, t1.affine, image.series)
            elif image.status == "done":
                data, affine = t1.t1, t1.affine
            else:  # a repeat: the same visit scanned again (another pose, bias and noise)
                again = render_scan(sub_anat, subject, visit, np.random.default_rng(
                    [seed, subject.rid, visit.months, 2]), cfg)
                data, affine = again.t1, again.affine
            paths.append(str(_write_image(adni, image, data, affine, fmt).relative_to(root)))
            orientations.append(t1.orientation if image.status == "done" else "")
        log(f"  subject {n + 1}/{len(plan.subjects)} {subject.ptid} ({subject.dx_bl}): "
            f"{len(mine)} image folder(s)")
    clinical_table(plan.subjects).to_csv(root / "ADNIMERGE.csv", index=False)
    amyloid_table(plan.subjects, seed).to_csv(root / amyloid_file_name(), index=False)
    (root / "synth").mkdir()
    truth_table(plan.subjects).to_csv(root / "synth" / "truth.csv", index=False)
    table = plan.images_table()
    table["path"], table["orientation"] = paths, orientations
    table.to_csv(root / "synth" / "images.csv", index=False)
    save(cfg, root / "synth" / "synth_config.toml")
    (root / "synth" / "README.txt").write_text(
        f"Synthetic ADNI download written by adni-pu synth (seed {seed}, "
        f"{len(plan.subjects)} subjects, {fmt}). Not ADNI data: every subject, scan and value "
        "is drawn by adni_pu.synth.\nThis folder holds what the generator knows and a real "
        "download does not: truth.csv (amyloid status per subject), images.csv (every image "
        "folder with the status adni-pu preprocess should give it), synth_config.toml (the "
        "generator's settings).\n")
