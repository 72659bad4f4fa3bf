"""Effect sizes the synthetic generator produces, to compare with published ADNI values.

Draws subjects only (no rendering: seconds) with the demo's synthetic settings and with the
generator's defaults, and reports per setting:

- hippocampal volume, AD vs CN at baseline: relative reduction and Cohen's d (pooled SD);
  the volume is the hippocampus left after the true loss times the head-size scale;
- the same for amyloid-positive vs amyloid-negative CN;
- AUC of the true hippocampal loss for amyloid status (all subjects, within CN, within
  MCI and within LMCI), and amyloid-positive vs -negative MCI;
- the PU composition under the ``paper`` preset, read from the generator's clinical values
  (labelled: Dementia on file at any visit; truth: that diagnosis or an SUVR >= 1.08 at
  any visit; unknown without both): the class prior, the labelled share of the positives
  and the baseline diagnoses of the hidden positives.

Usage::

    python -m benchmarks.synth_effect_sizes [--subjects 4000]

Writes ``benchmarks/results/synth-effect-sizes.json``; docs/volumes.md ("Effect sizes")
compares it with the literature.
"""

from __future__ import annotations

import json

import numpy as np

from benchmarks.common import RESULTS, command_line, script_parser, write_json


def effect_sizes(cfg, n_subjects: int, seed: int = 1) -> dict:
    """The numbers of the module docstring for one :class:`SynthConfig`."""
    from sklearn.metrics import roc_auc_score

    from adni_pu.synth.subjects import make_subjects, paper_composition

    subjects = make_subjects(n_subjects, seed, cfg)
    dx = np.array([s.dx_bl for s in subjects])
    positive = np.array([s.amyloid_positive for s in subjects])
    loss = np.array([s.visits[0].hippocampal_loss for s in subjects])
    volume = (1 - loss) * np.array([np.prod(s.head_scale) for s in subjects])

    def compare(low: np.ndarray, high: np.ndarray) -> dict:
        sd = np.sqrt((low.var(ddof=1) + high.var(ddof=1)) / 2)
        return {"reduction": round(float(1 - low.mean() / high.mean()), 3),
                "cohens_d": round(float((high.mean() - low.mean()) / sd), 2),
                "n": [int(len(low)), int(len(high))]}

    cn = dx == "CN"
    mci = np.isin(dx, ["EMCI", "LMCI"])
    lmci = dx == "LMCI"
    return {
        **paper_composition(subjects),
        "hippocampus_mci_amyloid_pos_vs_neg": compare(volume[mci & positive],
                                                      volume[mci & ~positive]),
        "auc_amyloid_true_hippocampal_loss_mci": round(
            float(roc_auc_score(positive[mci], loss[mci])), 3),
        "auc_amyloid_true_hippocampal_loss_lmci": round(
            float(roc_auc_score(positive[lmci], loss[lmci])), 3),
        "hippocampus_ad_vs_cn": compare(volume[dx == "AD"], volume[cn]),
        "hippocampus_cn_amyloid_pos_vs_neg": compare(volume[cn & positive],
                                                     volume[cn & ~positive]),
        "auc_amyloid_true_hippocampal_loss": round(float(roc_auc_score(positive, loss)), 3),
        "auc_amyloid_true_hippocampal_loss_cn": round(
            float(roc_auc_score(positive[cn], loss[cn])), 3),
    }


def main() -> None:
    p = script_parser(__doc__)
    p.add_argument("--subjects", type=int, default=4000)
    args = p.parse_args()

    from adni_pu import config as cfgmod
    from adni_pu.provenance import provenance
    from adni_pu.synth import SynthConfig
    from adni_pu.workflows.demo import DemoSettings

    demo = cfgmod.from_dict(SynthConfig, DemoSettings().synth)
    record = {"command": command_line(__file__),
              "subjects": args.subjects,
              "demo": {"synth": DemoSettings().synth,
                       "result": effect_sizes(demo, args.subjects)},
              "generator_defaults": {"result": effect_sizes(SynthConfig(), args.subjects)},
              "provenance": provenance()}
    path = write_json(RESULTS / "synth-effect-sizes.json", record, default=str)
    print(json.dumps({k: record[k]["result"] for k in ("demo", "generator_defaults")},
                     indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
