"""deepbet's input size (``skullstrip.deepbet_size``): time and mask agreement per size.

deepbet resamples the brain's bounding box to a 256^3 cube before its CNN, whatever the
scan's resolution; a smaller cube costs less. For each size this scores the mask against
deepbet's own 256^3 mask (Dice) and, on Colin27, against ``ch2bet > 0``, on:
Colin27 at 1 mm, Colin27 resampled to 3 mm (the demo's resolution), and generated 3 mm
demo heads (``adni_pu.synth``, no reference mask). One thread; times are wall seconds of
``deepbet_mask`` on this machine (compare sizes within one run)::

    python benchmarks/deepbet_size.py            # -> benchmarks/results/deepbet-size.json
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from benchmarks.common import (
    COLIN27,
    add_out,
    command_line,
    dice,
    script_parser,
    utc_stamp,
    write_json,
)


def cases(n_synth: int) -> list[tuple[str, object, object]]:
    """(name, canonical array, reference mask or None) to strip."""
    import nibabel as nib
    import numpy as np
    from scipy import ndimage

    from adni_pu import config as cfgmod
    from adni_pu.synth import SynthConfig, generate_cohort
    from adni_pu.workflows.demo import DemoSettings

    out = []
    if (COLIN27 / "ch2.nii.gz").is_file():
        img = nib.as_closest_canonical(nib.load(COLIN27 / "ch2.nii.gz"))
        ref = np.asarray(nib.as_closest_canonical(nib.load(COLIN27 / "ch2bet.nii.gz")).dataobj) > 0
        head = np.asarray(img.dataobj, np.float32)
        out.append(("colin27 1 mm", head, ref))
        out.append(("colin27 at 3 mm", ndimage.zoom(head, 1 / 3, order=1),
                    ndimage.zoom(ref.astype(np.float32), 1 / 3, order=1) > 0.5))
    with tempfile.TemporaryDirectory() as tmp:
        synth = cfgmod.from_dict(SynthConfig, DemoSettings().synth)
        generate_cohort(Path(tmp), n_synth, 7, synth)
        for path in sorted(Path(tmp).glob("bids/sub-*/ses-*/anat/*_T1w.nii.gz")):
            img = nib.as_closest_canonical(nib.load(path))
            out.append((f"demo head {path.name.split('_')[0]}",
                        np.asarray(img.dataobj, np.float32), None))
    return out


def main() -> None:
    p = script_parser(__doc__)
    p.add_argument("--sizes", type=int, nargs="+", default=[256, 192, 160, 128])
    p.add_argument("--synth", type=int, default=4, help="generated demo heads")
    add_out(p, "deepbet-size.json")
    args = p.parse_args()

    import torch

    from adni_pu.preprocessing.config import SkullStripSettings
    from adni_pu.preprocessing.skullstrip import deepbet_mask
    from adni_pu.provenance import provenance

    torch.set_num_threads(1)
    deepbet_mask(cases(1)[-1][1], SkullStripSettings())  # load the weights outside the timing
    rows = []
    for name, data, ref in cases(args.synth):
        masks, row = {}, {"case": name, "shape": list(data.shape)}
        for size in args.sizes:
            tic = time.perf_counter()
            masks[size] = deepbet_mask(data, SkullStripSettings(deepbet_size=size))
            row[f"seconds_{size}"] = round(time.perf_counter() - tic, 2)
            row[f"dice_vs_256_{size}"] = round(dice(masks[size], masks[256]), 4) \
                if 256 in masks else None
            if ref is not None:
                row[f"dice_vs_ch2bet_{size}"] = round(dice(masks[size], ref), 4)
        print(json.dumps(row), flush=True)
        rows.append(row)
    record = {"benchmark": "deepbet-size", "command": command_line(__file__),
              "date": utc_stamp(),
              "machine": "this project's 2-core CPU (shared), 1 thread",
              "data": "Colin27 (../shared/data/mri/colin27) and generated 3 mm demo heads",
              "sizes": args.sizes, "rows": rows, "provenance": provenance()}
    write_json(args.out, record)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
