"""``adni-pu interpret``: thin wrapper around :func:`adni_pu.workflows.interpret.interpret_run`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Optional

import typer

from adni_pu.cli.common import Device


def interpret(
    run: Annotated[Path, typer.Argument(metavar="RUN",
                                        help="run folder written by `adni-pu train`")],
    split: Annotated[str, typer.Option(help="manifest split whose scans get maps")] = "test",
    method: Annotated[str, typer.Option(
        help="gradcam (each branch's signed, element-wise Grad-CAM mapped back to the voxels it "
             "saw), occlusion "
             "(blocks of --patch voxels set to the mean brain intensity) or gradients "
             "(SmoothGrad through the whole input)")] = "gradcam",
    out: Annotated[Optional[Path], typer.Option(  # noqa: UP045 - typer needs Optional
        show_default="RUN/interpret-<split>-<method>", help="output folder")] = None,
    manifest: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        show_default="the one the run was trained on", help="another manifest")] = None,
    patch: Annotated[int, typer.Option(
        min=1, help="occlusion block side in grid voxels (16 = 24 mm)")] = 16,
    samples: Annotated[int, typer.Option(min=1, help="SmoothGrad noisy copies per scan")] = 8,
    sanity: Annotated[int, typer.Option(
        min=0, help="subjects that also get a map from the re-initialised network (model "
                    "randomisation check); 0 skips it")] = 3,
    bootstrap: Annotated[int, typer.Option(
        min=1, help="bootstrap resamples of the hippocampal-share CI")] = 1000,
    threads: Annotated[int, typer.Option(
        min=0, help="torch threads; 0 leaves torch's default")] = 0,
    device: Device = "auto",
    compared: Annotated[Optional[str], typer.Option(  # noqa: UP045
        show_default="none", metavar="METHOD",
        help="RUN is a comparison folder: this training method's piece (--method names "
             "the map method here)")] = None,
    fold: Annotated[Optional[int], typer.Option(  # noqa: UP045
        show_default="none", help="with --compared: the piece's fold")] = None,
    seed: Annotated[Optional[int], typer.Option(  # noqa: UP045
        show_default="0 with one seed", help="with --compared: the piece's seed")] = None,
) -> None:
    """Maps of what the selected model looks at, one per scan on the model grid (NIfTI),
    group means, an overlay on the MNI template, the AAL regions by share of the map, and
    two sanity checks (docs/interpret.md)."""
    from adni_pu.interpret.maps import MapSettings
    from adni_pu.workflows.interpret import interpret_run

    if threads > 0:
        import torch

        torch.set_num_threads(threads)
    from adni_pu.workflows.compare.ensemble import resolve_run

    run = resolve_run(run, compared, fold, seed)  # a comparison folder's piece: a run folder
    settings = MapSettings(patch=patch, samples=samples)
    rec = interpret_run(run, split, method, out, manifest, device=device, settings=settings,
                        sanity_subjects=sanity, n_boot=bootstrap,
                        log=lambda m: typer.echo(m, err=True))
    typer.echo(f"{method} maps of {rec['n_scans']} scans ({rec['n_subjects']} subjects): "
               f"{rec['timing']['cpu_seconds_per_scan']:.1f} CPU s per scan")
    share = rec["sanity"]["hippocampal_share"]
    if share["n_subjects"] and math.isfinite(share["share"]):
        lo, hi = share["ci"]
        typer.echo(f"positives' map mass in the hippocampi: {share['share']:.3f} "
                   f"[{lo:.3f}, {hi:.3f}] (volume share {share['volume_share']:.3f}, "
                   f"{share['n_subjects']} subjects)")
    randomisation = rec["sanity"]["randomisation"]
    if randomisation["mean"] is not None:
        typer.echo(f"model randomisation: Spearman rank correlation {randomisation['mean']:.2f} "
                   "(trained vs re-initialised; near 1 would mean the map ignores what was "
                   "learnt)")
        trained, fresh = (randomisation[k] for k in ("hippocampal_share_trained",
                                                     "hippocampal_share_randomised"))
        if trained is not None and fresh is not None:
            typer.echo(f"hippocampal share on those scans: trained {trained:.3f}, "
                       f"re-initialised {fresh:.3f} (what the architecture alone gives)")
    typer.echo(f"outputs: {Path(rec['files']['record']).parent}")
    if rec.get("report"):
        typer.echo(f"linked from: {rec['report']}")


def register(app: typer.Typer) -> None:
    """Add ``interpret`` to the main app."""
    app.command("interpret")(interpret)
