"""Settings of the synthetic ADNI-like cohort generator (one typed dataclass)."""

from __future__ import annotations

from dataclasses import dataclass

from adni_pu.errors import ConfigError

DX_BL_CODES: tuple[str, ...] = ("CN", "SMC", "EMCI", "LMCI", "AD")
ORIENTATIONS: tuple[str, ...] = ("RAS", "LAS", "LPS", "PIR", "ASL")


@dataclass
class SynthConfig:
    """What the synthetic cohort looks like and how its scans are rendered.

    Diagnosis mix, amyloid prevalence per diagnosis and the strength of each disease effect
    are settings, so a test can make the task easy (strong effects, no noise) or as hard as
    real data (weak, noisy effects; amyloid-positive people with no atrophy).
    """

    # --- scans -------------------------------------------------------------------------
    voxel_size: float = 2.0
    """Isotropic voxel size (mm) of the raw scans; 1.0 gives ADNI-like 1 mm scans (slower)."""
    field_of_view: tuple[float, float, float] = (200.0, 240.0, 232.0)
    """Scanner field of view (mm) along the world x (L-R), y (P-A) and z (I-S) axes."""
    orientations: tuple[str, ...] = ORIENTATIONS
    """Voxel axis codes a scan is stored in, drawn per scan (nibabel axis codes)."""
    max_rotation_deg: float = 10.0
    max_translation_mm: float = 10.0
    head_scale_by_sex: tuple[float, float] = (0.92, 0.97)
    """Mean linear head size (female, male) relative to MNI152, which is larger than an
    average head; these give skull-stripped brain volumes of about 1.4 to 1.9 litres."""
    head_scale_sd: float = 0.04
    """Per-axis head-size variation (relative SD) on top of the sex difference."""
    deformation_mm: float = 2.5
    """SD (mm) of the smooth non-linear deformation at its control points."""
    deformation_spacing_mm: float = 40.0
    bias_strength: float = 0.25
    """SD of the log bias field at its control points (0 turns the bias field off)."""
    noise_level: float = 0.025
    """Rician noise SD relative to the white-matter intensity."""
    skull: bool = True
    """Render skull, scalp and neck around the brain (False: brain only, already stripped)."""
    write_brain_masks: bool = True
    """Also write the true brain mask of each scan (outside BIDS, under truth/)."""
    ideal_preprocessed: bool = False
    """Also write what a perfect preprocessing would give (model grid, skull and cerebellum
    off, smooth deformation kept) under preprocessed_ideal/, in the preprocessing output
    layout with a summary.csv, so the training path can run without preprocessing."""

    # --- cohort ------------------------------------------------------------------------
    dx_proportions: tuple[float, float, float, float, float] = (0.36, 0.06, 0.28, 0.16, 0.14)
    """Baseline diagnosis mix in the order CN, SMC, EMCI, LMCI, AD: ADNI-GO/2's groups (the
    phases with florbetapir PET), weighted so that the ``paper`` preset gives the paper's
    class prior (about 0.43) with about a third of the positives labelled (docs/volumes.md,
    "Composition")."""
    amyloid_prevalence: tuple[float, float, float, float, float] = (
        0.20, 0.22, 0.34, 0.56, 0.88)
    """P(amyloid positive) per baseline diagnosis, same order: published prevalences at
    ADNI's mean age (Jansen et al. JAMA 2015 for CN, SCD and MCI; Ossenkoppele et al. JAMA
    2015 for AD dementia; docs/volumes.md)."""
    visit_probabilities: tuple[float, float, float] = (0.4, 0.35, 0.25)
    """P(1, 2, 3 MRI visits): bl only; bl + m12; bl + m12 + m24."""
    pet_fraction: float = 0.75
    """Fraction of subjects with an amyloid PET SUVR in the table (the others: empty)."""
    fbb_fraction: float = 0.1
    """Fraction of PET subjects scanned with florbetaben (FBB column) instead of AV45."""
    clinical_only_visits: bool = True
    """Add m06 table rows without an MRI, as ADNIMERGE has visits without scans."""
    age_mean: float = 73.0
    age_sd: float = 7.0

    # --- latent amyloid and its effects ------------------------------------------------
    latent_cutoff: float = 0.25
    """Latent amyloid level at and above which a subject is amyloid positive (truth)."""
    suvr_at_cutoff: float = 1.08
    """SUVR of the latent cut-off, both tracers: the paper's positivity cut-off, so that a
    measured SUVR disagrees with the latent status only by measurement noise."""
    av45_slope: float = 0.4
    """AV45 SUVR = suvr_at_cutoff + slope * (latent - latent_cutoff) + noise."""
    fbb_slope: float = 0.34
    suvr_noise: float = 0.03
    hippocampal_atrophy: float = 0.45
    """Fraction of hippocampal grey matter lost at full disease severity."""
    cortical_atrophy: float = 0.3
    """Fraction of temporo-parietal cortical grey matter lost at full severity."""
    ventricle_enlargement_mm: float = 3.5
    """Ventricle wall displacement (mm) at full severity."""
    atrophy_noise: float = 0.05
    """SD of individual atrophy not explained by disease or age (fraction units)."""
    age_effect: float = 0.1
    """Atrophy fraction added per 20 years of age above 65 (a confounder of the task)."""
    preclinical_fraction: float = 0.5
    """Share of amyloid-positive CN/SMC/EMCI subjects with (almost) no neurodegeneration."""

    # --- PET ---------------------------------------------------------------------------
    pet: bool = False
    """Also write amyloid PET uptake-ratio volumes for subjects with PET."""
    pet_space: str = "template"
    """``template`` (MNI grid, 2 mm) or ``native`` (the subject's T1 grid and pose)."""
    pet_fwhm_mm: float = 8.0

    table_name: str = "ADNIMERGE.csv"

    def __post_init__(self) -> None:
        if not 0.5 <= self.voxel_size <= 4.0:
            raise ConfigError(f"voxel_size: expected 0.5 to 4 mm, found {self.voxel_size}")
        for name in ("dx_proportions", "visit_probabilities"):
            probs = getattr(self, name)
            if any(p < 0 for p in probs) or abs(sum(probs) - 1.0) > 1e-6:
                raise ConfigError(f"{name}: expected probabilities summing to 1, found {probs}")
        if len(self.dx_proportions) != len(DX_BL_CODES):
            raise ConfigError(f"dx_proportions: expected {len(DX_BL_CODES)} values")
        if any(not 0 <= p <= 1 for p in self.amyloid_prevalence):
            raise ConfigError(f"amyloid_prevalence: expected values in [0, 1], found "
                             f"{self.amyloid_prevalence}")
        bad = [o for o in self.orientations if not _valid_code(o)]
        if not self.orientations or bad:
            raise ConfigError(f"orientations: expected axis codes like 'RAS', found {bad}")
        if self.pet_space not in ("template", "native"):
            raise ConfigError(f"pet_space: expected 'template' or 'native', found "
                             f"{self.pet_space!r}")
        if any(not 0.5 <= s <= 1.5 for s in self.head_scale_by_sex):
            raise ConfigError(f"head_scale_by_sex: expected two scales in [0.5, 1.5], found "
                             f"{self.head_scale_by_sex}")
        for name in ("pet_fraction", "fbb_fraction", "preclinical_fraction"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"{name}: expected a value in [0, 1]")


def _valid_code(code: str) -> bool:
    pairs = ("LR", "PA", "IS")
    if len(code) != 3:
        return False
    used = []
    for letter in code:
        hit = [p for p in pairs if letter in p]
        if not hit:
            return False
        used.append(hit[0])
    return len(set(used)) == 3
