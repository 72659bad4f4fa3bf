"""``adni-pu synth``: write a synthetic ADNI download (or BIDS cohort) to try the own-data path.

Thin wrapper around :func:`adni_pu.synth.adni_download.write_adni_download` (``--layout
adni``) and :func:`adni_pu.synth.generate_cohort` (``--layout bids``).
"""

from __future__ import annotations

from pathlib import Path
from shlex import quote
from typing import TYPE_CHECKING, Annotated

import typer

from adni_pu.cli.common import sets_option

if TYPE_CHECKING:
    from adni_pu.synth.config import SynthConfig

#: The README's own-data block, as it starts (README.md, "Your ADNI download").
FIRST_STEP = "adni-pu preprocess ADNI prep --workers 2"


def synth(
    out: Annotated[Path, typer.Argument(
        metavar="DIR", help="new or empty folder to write (written whole, or not at all)")],
    layout: Annotated[str, typer.Option(
        help="adni: as the ADNI archive (LONI IDA) gives it: ADNI/<PTID>/<series>/<date_time>/"
             "I<image ID>/, ADNIMERGE.csv and a UC Berkeley amyloid table (the README's "
             "own-data block runs in DIR); bids: the demo's cohort, BIDS raw data as "
             "Clinica's adni-to-bids writes it, with clinical/ADNIMERGE.csv")] = "adni",
    subjects: Annotated[int, typer.Option(
        help="subjects (adni layout: drawn to ADNI's diagnosis mix exactly; 18 is the fewest "
             "whose default cohort splits all hold labelled positives)")] = 32,
    seed: Annotated[int, typer.Option(
        help="seed (a non-negative integer): same seed and settings, same files")] = 0,
    format_: Annotated[str, typer.Option(
        "--format", help="nifti (one .nii per image) or dicom (one .dcm per slice); adni "
                         "layout only")] = "nifti",
    voxel_size: Annotated[float | None, typer.Option(
        help="isotropic voxel size of the scans in mm (ADNI's are about 1; 3, the default, "
             "is quick)", show_default="3.0")] = None,
    set_: sets_option("visit_probabilities=[1,0,0] (one MRI visit per subject)") = None,
) -> None:
    """Write a synthetic ADNI download (no ADNI data: every subject and value is drawn) and
    print the next command: the own-data path of the README can then be tried without ADNI
    access. --set takes the generator's settings (adni_pu.synth.SynthConfig, docs/volumes.md).
    """
    from adni_pu import config as cfgmod
    from adni_pu.errors import ConfigError
    from adni_pu.locking import output_lock
    from adni_pu.synth.adni_download import download_config
    from adni_pu.synth.target import prepare_target

    if layout not in ("adni", "bids"):
        raise ConfigError(f"--layout: expected adni or bids, found {layout!r}")
    if layout == "bids" and format_ != "nifti":
        raise ConfigError(f"--format {format_}: the bids layout is NIfTI only; use --layout "
                          "adni for DICOM")
    if seed < 0:
        raise ConfigError(f"--seed: expected a non-negative integer, found {seed}")
    values: dict = {}
    for text in set_ or []:
        path, value = cfgmod.parse_override(text)
        if len(path) != 1:
            raise ConfigError(f"--set {text}: expected a generator setting such as "
                              "visit_probabilities=[1,0,0] (adni_pu.synth.SynthConfig)")
        values[path[0]] = value
    if voxel_size is not None:
        if "voxel_size" in values and values["voxel_size"] != voxel_size:
            raise ConfigError(f"--voxel-size {voxel_size:g} and --set voxel_size="
                              f"{values['voxel_size']}: two voxel sizes; give one of them")
        values["voxel_size"] = voxel_size
    cfg = download_config(values)
    prepare_target(out)  # refused before any image is drawn or any folder made
    # one writer per folder (a second synth is refused naming this one); Ctrl-C / SIGTERM:
    # SynthInterrupted, whose hint the app prints (adni_pu.signals)
    with output_lock(out, "synth"):
        prepare_target(out)
        if layout == "adni":
            _adni(out, subjects, seed, format_, cfg)
        else:
            _bids(out, subjects, seed, cfg)


def _adni(out: Path, subjects: int, seed: int, fmt: str, cfg: SynthConfig) -> None:
    from adni_pu.synth.adni_download import write_adni_download

    def log(line: str) -> None:
        typer.echo(line, err=True)

    log(f"writing a synthetic ADNI download of {subjects} subjects to {out}")
    dl = write_adni_download(out, subjects, seed, fmt, cfg, log=log)
    c = dl.counts
    typer.echo(f"wrote {out}/ (synthetic, not ADNI data):")
    typer.echo(f"  ADNI/  {dl.n_subjects} subjects, {sum(c.values())} image folders ({fmt}): "
               f"{c.get('done', 0)} T1 scans to preprocess, {c.get('extra-t1', 0)} repeat "
               f"T1, {c.get('not-t1', 0)} localiser or FLAIR")
    typer.echo(f"  {dl.clinical_path.name}  clinical table, one row per visit")
    typer.echo(f"  {dl.amyloid_path.name}  amyloid PET table (UC Berkeley's columns)")
    typer.echo("  synth/  what the generator knows: truth.csv, images.csv (the status each "
               "image folder should get)")
    typer.echo(f"next: cd {quote(str(out))} && {FIRST_STEP}   (then the rest of the block in "
               "README.md, \"Your ADNI download\")")


def _bids(out: Path, subjects: int, seed: int, cfg: SynthConfig) -> None:
    from adni_pu.synth import generate_cohort
    from adni_pu.synth.adni_download import amyloid_file_name, amyloid_table
    from adni_pu.synth.subjects import make_subjects
    from adni_pu.synth.target import write_in_place

    def write(tmp: Path) -> None:
        generate_cohort(tmp, subjects, seed, cfg)
        amyloid_table(make_subjects(subjects, seed, cfg), seed).to_csv(
            tmp / amyloid_file_name(), index=False)

    write_in_place(out, write)
    n_scans = sum(1 for _ in (out / "bids").glob("sub-*/ses-*/anat/*_T1w.nii.gz"))
    typer.echo(f"wrote {out}/ (synthetic, not ADNI data):")
    typer.echo(f"  bids/  {subjects} subjects, {n_scans} T1 scans (BIDS raw data)")
    typer.echo("  clinical/ADNIMERGE.csv  clinical table, one row per visit")
    typer.echo(f"  {amyloid_file_name()}  amyloid PET table (UC Berkeley's columns)")
    typer.echo("  truth.csv, truth_scans.csv  what the generator knows")
    typer.echo(f"next: cd {quote(str(out))} && adni-pu preprocess bids prep --workers 2   "
               "(then adni-pu cohort build clinical/ADNIMERGE.csv prep/summary.csv cohort "
               f"--amyloid {amyloid_file_name()})")


def register(app: typer.Typer) -> None:
    """Add ``synth`` to the main app."""
    app.command("synth")(synth)
