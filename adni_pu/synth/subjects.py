"""Synthetic subjects: diagnosis, latent amyloid, neurodegeneration and visits.

The causal story, per subject: a baseline diagnosis; amyloid status drawn with a
diagnosis-dependent prevalence; a latent amyloid level (continuous; positive at and above
``latent_cutoff``); a neurodegeneration stage that is high in AD, present in part of MCI and
mostly absent in CN, scaled up by the amyloid level in amyloid-positive people. Age adds
atrophy of its own and individual noise blurs everything, so the T1 shows amyloid only
partly: amyloid-positive people without atrophy exist (preclinical AD), and so do
amyloid-negative people with atrophy (non-AD dementia, ageing).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import numpy as np

from adni_pu.errors import ConfigError
from adni_pu.synth.config import DX_BL_CODES, SynthConfig

SITES: tuple[int, ...] = (2, 5, 11, 23, 27, 33, 67, 94, 128, 137, 941)
VISIT_MONTHS: tuple[int, ...] = (0, 12, 24)


@dataclass
class Visit:
    """One row of the clinical table; ``has_mri`` when a T1 scan is rendered for it."""

    viscode: str
    months: int
    examdate: dt.date
    dx: str
    latent: float
    severity: float
    hippocampal_loss: float
    cortical_loss: float
    ventricle_mm: float
    has_mri: bool
    suvr: float | None = None

    @property
    def bids_session(self) -> str:
        """BIDS session label of the visit (bl -> M000, m12 -> M012)."""
        return f"M{self.months:03d}"


@dataclass
class Subject:
    """A synthetic ADNI participant with its visits and the seed of its anatomy."""

    rid: int
    site: int
    sex: str
    age: float
    dx_bl: str
    latent: float
    amyloid_positive: bool
    severity: float
    tracer: str | None
    head_scale: tuple[float, float, float]
    seed: int
    visits: list[Visit] = field(default_factory=list)

    @property
    def ptid(self) -> str:
        """ADNI PTID, e.g. ``011_S_0002``."""
        return f"{self.site:03d}_S_{self.rid:04d}"

    @property
    def bids_label(self) -> str:
        """BIDS participant label as Clinica's adni-to-bids writes it: ``ADNI011S0002``."""
        return f"ADNI{self.site:03d}S{self.rid:04d}"


def _dx_at(dx_bl: str, severity: float, amyloid_positive: bool, months: int) -> str:
    """ADNIMERGE DX (CN / MCI / Dementia) at a visit."""
    base = {"CN": "CN", "SMC": "CN", "EMCI": "MCI", "LMCI": "MCI", "AD": "Dementia"}[dx_bl]
    if months == 0:
        return base
    if base == "MCI" and severity > 0.6:
        return "Dementia"
    if base == "CN" and severity > 0.3 and amyloid_positive:
        return "MCI"
    return base


def _stage(rng: np.random.Generator, dx_bl: str, positive: bool, cfg: SynthConfig) -> float:
    """Neurodegeneration stage in [0, 1] at baseline."""
    if positive:
        if dx_bl == "AD":
            return float(rng.uniform(0.55, 1.0))
        if dx_bl == "LMCI":
            return float(rng.uniform(0.0, 0.1) if rng.random() < 0.3 * cfg.preclinical_fraction
                         else rng.uniform(0.2, 0.6))
        if dx_bl == "EMCI":
            return float(rng.uniform(0.0, 0.08) if rng.random() < cfg.preclinical_fraction
                         else rng.uniform(0.1, 0.4))
        return float(rng.uniform(0.0, 0.05) if rng.random() < cfg.preclinical_fraction
                     else rng.uniform(0.05, 0.25))
    # Amyloid negative: non-AD neurodegeneration in dementia, a little in MCI.
    high = {"AD": 0.8, "LMCI": 0.3, "EMCI": 0.15}.get(dx_bl, 0.05)
    low = 0.3 if dx_bl == "AD" else 0.0
    return float(rng.uniform(low, high))


def _effects(rng: np.random.Generator, severity: float, age: float, cfg: SynthConfig,
             noise: np.ndarray) -> tuple[float, float, float]:
    """Hippocampal and cortical grey matter loss (fractions) and ventricle growth (mm)."""
    ageing = cfg.age_effect * max(age - 65.0, 0.0) / 20.0
    hipp = cfg.hippocampal_atrophy * severity + ageing + cfg.atrophy_noise * noise[0]
    cort = cfg.cortical_atrophy * severity + 0.7 * ageing + cfg.atrophy_noise * noise[1]
    vent = cfg.ventricle_enlargement_mm * (severity + 2.0 * ageing + noise[2] * 0.2)
    return float(np.clip(hipp, 0, 0.8)), float(np.clip(cort, 0, 0.6)), float(max(vent, 0.0))


def make_subject(index: int, rng: np.random.Generator, cfg: SynthConfig) -> Subject:
    """Draw subject ``index`` (RID ``index + 2``) and its visits from ``rng``."""
    dx_bl = DX_BL_CODES[int(rng.choice(len(DX_BL_CODES), p=np.asarray(cfg.dx_proportions)))]
    p_pos = cfg.amyloid_prevalence[DX_BL_CODES.index(dx_bl)]
    positive = bool(rng.random() < p_pos)
    if positive:
        latent = cfg.latent_cutoff + float(rng.gamma(2.0, 0.2))
    else:
        latent = cfg.latent_cutoff * float(rng.beta(2.0, 3.0))
    sex = "Female" if rng.random() < 0.47 else "Male"
    age = float(np.clip(rng.normal(cfg.age_mean, cfg.age_sd), 55.0, 92.0))
    stage = _stage(rng, dx_bl, positive, cfg)
    if positive:
        stage = float(np.clip(stage * (0.7 + 0.5 * min(latent, 1.0)), 0.0, 1.0))
    has_pet = rng.random() < cfg.pet_fraction
    tracer = None
    if has_pet:
        tracer = "FBB" if rng.random() < cfg.fbb_fraction else "AV45"
    sex_scale = cfg.head_scale_by_sex[0 if sex == "Female" else 1]
    head_scale = tuple(float(sex_scale * (1.0 + cfg.head_scale_sd * rng.standard_normal()))
                       for _ in range(3))
    subject = Subject(
        rid=index + 2, site=int(rng.choice(SITES)), sex=sex, age=round(age, 1), dx_bl=dx_bl,
        latent=latent, amyloid_positive=positive, severity=stage, tracer=tracer,
        head_scale=head_scale, seed=int(rng.integers(2**31 - 1)),
    )
    n_mri = 1 + int(rng.choice(len(cfg.visit_probabilities), p=cfg.visit_probabilities))
    months = list(VISIT_MONTHS[:n_mri])
    if cfg.clinical_only_visits and n_mri > 1:
        months.insert(1, 6)
    start = dt.date(2006, 1, 1) + dt.timedelta(days=int(rng.integers(0, 8 * 365)))
    noise = rng.standard_normal(3)  # individual atrophy, stable over visits
    for m in months:
        years = m / 12.0
        if positive:
            sev = stage + years * (0.06 + 0.1 * stage)
            lat = latent + 0.03 * years
        else:
            sev = stage + years * (0.05 if dx_bl == "AD" else 0.01)
            lat = latent + 0.005 * years
        sev = float(min(sev, 1.0))
        hipp, cort, vent = _effects(rng, sev, age + years, cfg, noise)
        date = start + dt.timedelta(days=int(round(m * 30.44)) + (
            int(rng.integers(-20, 21)) if m else 0))
        suvr = None
        pet_visit = m == 0 or (m == 24 and rng.random() < 0.5)
        if tracer is not None and pet_visit:
            slope = cfg.fbb_slope if tracer == "FBB" else cfg.av45_slope
            suvr = round(cfg.suvr_at_cutoff + slope * (lat - cfg.latent_cutoff)
                         + cfg.suvr_noise * float(rng.standard_normal()), 4)
        subject.visits.append(Visit(
            viscode="bl" if m == 0 else f"m{m:02d}", months=m, examdate=date,
            dx=_dx_at(dx_bl, sev, positive, m), latent=lat, severity=sev,
            hippocampal_loss=hipp, cortical_loss=cort, ventricle_mm=vent,
            has_mri=m in VISIT_MONTHS, suvr=suvr,
        ))
    return subject


def make_subjects(n_subjects: int, seed: int, cfg: SynthConfig) -> list[Subject]:
    """``n_subjects`` subjects; subject ``i`` depends only on (seed, i), not on the count."""
    if n_subjects < 1:
        raise ConfigError(f"n_subjects: expected at least 1, found {n_subjects}")
    children = np.random.SeedSequence(seed).spawn(n_subjects)
    return [make_subject(i, np.random.default_rng(s), cfg) for i, s in enumerate(children)]


def paper_composition(subjects: list, cutoff: float = 1.08) -> dict:
    """What the ``paper`` cohort preset makes of these subjects, read from their clinical
    values without building a cohort: labelled = Dementia on file at any visit; truth =
    that diagnosis or an SUVR >= ``cutoff`` at any visit (unknown without both). Returns
    ``{"paper_preset": {class_prior, labelled_share_of_positives, hidden_by_dx_bl, ...}}``.
    """
    labelled = np.array([any(v.dx == "Dementia" for v in s.visits) for s in subjects])
    suvrs = [[v.suvr for v in s.visits if v.suvr is not None] for s in subjects]
    measured = np.array([bool(x) for x in suvrs])
    amyloid = np.array([bool(x) and max(x) >= cutoff for x in suvrs])
    truth_known = labelled | measured
    positive = labelled | amyloid
    hidden = ~labelled & amyloid
    dx = np.array([s.dx_bl for s in subjects])
    n_pos = int((positive & truth_known).sum())
    return {
        "paper_preset": {
            "class_prior": round(float(n_pos / truth_known.sum()), 3),
            "labelled_fraction": round(float(labelled.mean()), 3),
            "labelled_share_of_positives": round(float(labelled.sum() / n_pos), 3),
            "hidden_share_of_positives": round(float(hidden.sum() / n_pos), 3),
            "hidden_by_dx_bl": {d: int((hidden & (dx == d)).sum())
                                for d in ("CN", "SMC", "EMCI", "LMCI", "AD")},
            "hidden_mci_share": round(float((hidden & np.isin(dx, ["EMCI", "LMCI"])).sum()
                                            / max(int(hidden.sum()), 1)), 3),
            "truth_known_fraction": round(float(truth_known.mean()), 3),
        }}
