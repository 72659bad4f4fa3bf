"""Synthetic ADNI-like cohorts: raw T1 scans in BIDS, an ADNIMERGE-style table and truth.

ADNI data are access-controlled, so the toolkit is built and tested on cohorts drawn here:
a latent amyloid level per subject drives (partly visible) atrophy in the T1 scans.
Usage: ``generate_cohort(out_dir, n_subjects=20, seed=0, config=SynthConfig())``.
"""

from adni_pu.synth.config import SynthConfig
from adni_pu.synth.generate import SynthCohort, generate_cohort

__all__ = ["SynthCohort", "SynthConfig", "generate_cohort"]
