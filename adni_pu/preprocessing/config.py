"""Settings of the T1 preprocessing pipeline (one typed object, saved with each run).

Every step has its own table so a TOML file or ``--set step.key=value`` can change one
step without touching the others. The *processing* settings (everything but ``runner``)
are hashed into each scan's sidecar: a rerun skips a scan whose sidecar carries the same
hash, and redoes it when any setting that changes the result has changed.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from adni_pu import config as cfgmod
from adni_pu.errors import ConfigError

#: Bumped when the pipeline's code changes what it writes, so old outputs are redone.
#: 2: intensities are measured from the air's level (issue 37: a scan stored with an
#: offset passed the noise and edge checks with 0, and its model input changed).
PIPELINE_VERSION = "2"


@dataclass
class N4Settings:
    """N4 bias-field correction (SimpleITK), fitted on a shrunk copy for speed."""

    enabled: bool = True
    shrink_factor: int = 4
    iterations: tuple[int, ...] = (50, 50, 30)
    convergence_threshold: float = 1e-3
    control_points: int = 4

    def __post_init__(self) -> None:
        if self.shrink_factor < 1:
            raise ConfigError(f"n4.shrink_factor must be >= 1, found {self.shrink_factor}")
        if not self.iterations or any(i < 1 for i in self.iterations):
            raise ConfigError(f"n4.iterations must be positive, found {self.iterations}")
        if self.control_points < 4:
            raise ConfigError(f"n4.control_points must be >= 4, found {self.control_points}")


@dataclass
class SkullStripSettings:
    """Brain extraction: ``deepbet`` (bundled CNN weights) or ``template`` (atlas mask)."""

    method: Literal["deepbet", "template"] = "deepbet"
    threshold: float = 0.5
    n_dilate: int = 0
    # deepbet resamples the brain's bounding box to this cube before its CNN (deepbet's own
    # choice: 256). 192 takes about half the time at the same Dice against ch2bet on
    # Colin27 (docs/preprocessing.md, "deepbet's input size"); 128 loses accuracy.
    deepbet_size: int = 256

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise ConfigError(f"skullstrip.threshold must be in (0, 1), found {self.threshold}")
        if not 96 <= self.deepbet_size <= 320 or self.deepbet_size % 32:
            raise ConfigError("skullstrip.deepbet_size: expected a multiple of 32 from 96 to "
                              f"320 (deepbet's own: 256), found {self.deepbet_size}")


@dataclass
class RegistrationSettings:
    """Registration of the skull-stripped scan to the MNI152 template with ANTs."""

    transform: Literal["affine", "syn"] = "affine"
    resolution_mm: float = 2.0
    metric: Literal["mattes", "GC", "meansquares"] = "mattes"
    iterations: tuple[int, ...] = (100, 50, 20)
    shrink_factors: tuple[int, ...] = (4, 2, 1)
    smoothing_sigmas: tuple[float, ...] = (2.0, 1.0, 0.0)
    syn_iterations: tuple[int, ...] = (40, 20, 0)
    random_seed: int = 1

    def __post_init__(self) -> None:
        n = len(self.iterations)
        if len(self.shrink_factors) != n or len(self.smoothing_sigmas) != n:
            raise ConfigError(
                "registration.iterations, shrink_factors and smoothing_sigmas must have the "
                f"same length, found {n}, {len(self.shrink_factors)}, {len(self.smoothing_sigmas)}"
            )
        if not 0.5 <= self.resolution_mm <= 8.0:
            raise ConfigError(
                f"registration.resolution_mm must be in [0.5, 8], found {self.resolution_mm}"
            )


@dataclass
class CerebellumSettings:
    """Cerebellum removal with AAL regions defined in template space."""

    enabled: bool = True
    regions: tuple[str, ...] = ("Cerebelum_*", "Vermis_*")
    dilate_mm: float = 2.0


@dataclass
class IntensitySettings:
    """Intensity normalisation inside the brain (background stays exactly 0)."""

    method: Literal["percentile", "zscore", "none"] = "percentile"
    low_percentile: float = 0.5
    high_percentile: float = 99.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.low_percentile < self.high_percentile <= 100.0:
            raise ConfigError(
                "intensity percentiles must satisfy 0 <= low < high <= 100, found "
                f"{self.low_percentile}, {self.high_percentile}"
            )


@dataclass
class GridSettings:
    """The model grid in MNI space (default: the paper's 121 x 145 x 121 at 1.5 mm)."""

    spacing_mm: float = 1.5
    shape: tuple[int, int, int] = (121, 145, 121)
    interpolation: Literal["linear", "bspline"] = "linear"

    def __post_init__(self) -> None:
        # refused here, before any scan is read: a grid of no voxels used to fail each scan
        # only after its whole pipeline (issue 37)
        if len(self.shape) != 3 or any(not 16 <= n <= 1024 for n in self.shape):
            raise ConfigError("grid.shape: expected three sizes of 16 to 1024 voxels (the "
                              f"paper's: [121, 145, 121]), found {list(self.shape)}")
        if not 0.5 <= self.spacing_mm <= 8.0:
            raise ConfigError(f"grid.spacing_mm: expected 0.5 to 8 mm, found {self.spacing_mm}")


@dataclass
class QCSettings:
    """Checks that refuse a result (status ``failed-qc``) instead of writing it as good.

    The defaults are calibrated on real heads (Colin27 and the heads that packages on PyPI
    ship), broken copies of each, and the demo's synthetic scans
    (``benchmarks/qc_calibration.py``, in git at d825906; the table and the margins are
    in docs/preprocessing.md).
    """

    min_brain_ml: float = 700.0
    max_brain_ml: float = 2500.0
    max_brain_fraction_of_head: float = 0.85
    max_mask_edge_contrast: float = 1.0
    min_mask_edge_offset_mm: float = -3.5
    max_mask_edge_offset_mm: float = 1.0
    max_brain_noise: float = 0.15
    min_registration_similarity: float = 0.35
    min_template_mask_dice: float = 0.9
    min_template_end_coverage: float = 0.3
    max_registration_gain: float = 0.033
    picture_dpi: int = 80


@dataclass
class ValidationSettings:
    """What a readable, plausible T1 scan looks like."""

    min_voxels_per_axis: int = 16
    max_voxels_per_axis: int = 1024
    min_spacing_mm: float = 0.2
    max_spacing_mm: float = 8.0
    min_extent_mm: float = 60.0
    max_extent_mm: float = 600.0


#: ADNI T1 series kept by default (regular expressions searched in the series description
#: in lower case with underscores read as spaces, as IDA's folder names turn spaces and
#: punctuation into underscores): MPRAGE in all its spellings (MP-RAGE, MP RAGE, t1_mprage, ASO-MPRAGE,
#: Accelerated Sagittal MPRAGE), GE's IR-SPGR / IR-FSPGR, ADNI's corrected images
#: (``MPR; GradWarp; B1 Correction; N3; Scaled``, ``MPR-R; ...``, ``MT1; GradWarp; N3m``)
#: and anything named T1.
DEFAULT_T1_SERIES: tuple[str, ...] = (
    r"mp[-_ ]?rag",
    r"(?<![a-z])f?spgr",
    r"(?<![a-z0-9])mpr(?:-r)?(?![a-z0-9])",
    r"(?<![a-z0-9])mt1(?![a-z0-9])",
    r"(?<![a-z0-9])t1(?![0-9])",
)

#: Series skipped by default even when a keep pattern matches (the skip list wins).
DEFAULT_SKIP_SERIES: tuple[str, ...] = (
    r"locali[sz]er|scout|survey|(?<![a-z])loc(?![a-z])",
    r"calibration|(?<![a-z])cal(?![a-z])|asset",
    r"field[-_ ]?map",
    r"flair",
    r"(?<![a-z0-9])t2(?![0-9])",
    r"(?<![a-z0-9])pd(?![a-z0-9])|proton",
    r"dti|dwi|diffusion|tensor",
    r"fmri|bold|resting|(?<![a-z])epi(?![a-z])",
    r"(?<![a-z])p?c?asl(?![a-z])|perfusion",
    r"(?<![a-z])swi(?![a-z])|swan|susceptib",
    r"hippocamp",
    r"(?<![a-z0-9])mpr (?:cor|sag|tra)(?![a-z])|reformat",
    r"angio|(?<![a-z])tof(?![a-z])",
    r"phantom",
)

#: Preferred series when a visit has several T1 scans, best first: ADNI's corrected
#: images (GradWarp corrects the scanner's gradient distortion, which the pipeline cannot),
#: most corrected first; then everything else (the raw scans).
DEFAULT_PREFER_SERIES: tuple[str, ...] = (
    r"gradwarp.*b1.*n3",
    r"gradwarp.*n3",
    r"n3",
    r"gradwarp",
)

#: Series used only when nothing else of the same preference is there: repeats
#: (``MPRAGE Repeat``, ``MPR-R; ...``) and Siemens' ``_ND`` copies (no distortion correction).
DEFAULT_FALLBACK_SERIES: tuple[str, ...] = (
    r"repea|(?<![a-z0-9])mpr-r(?![a-z])|(?<![a-z])rep(?![a-z])",
    r"[_ ]nd(?![a-z0-9])",
)


@dataclass
class DiscoverySettings:
    """How an ADNI download (``ADNI/<PTID>/<series>/<date_time>/<image ID>/``) is read.

    A series is kept when its description matches one of ``t1_series`` and none of
    ``skip_series`` (regular expressions, searched in the description in lower case with
    underscores read as spaces). Several kept T1
    scans of one subject on one acquisition date are resolved by ``per_visit``: ``one``
    keeps the best by the rule below, ``all`` keeps every one (session ``<date>I<image
    ID>``). The rule, in order: the first pattern of ``prefer_series`` the description
    matches (unmatched last), then not a ``fallback_series`` (repeats, ``_ND`` copies),
    then the earliest acquisition time, then the smallest image ID. Not part of the
    settings hash: it chooses scans, it does not change how one is processed.
    """

    t1_series: tuple[str, ...] = DEFAULT_T1_SERIES
    skip_series: tuple[str, ...] = DEFAULT_SKIP_SERIES
    prefer_series: tuple[str, ...] = DEFAULT_PREFER_SERIES
    fallback_series: tuple[str, ...] = DEFAULT_FALLBACK_SERIES
    per_visit: Literal["one", "all"] = "one"

    def __post_init__(self) -> None:
        for name in ("t1_series", "skip_series", "prefer_series", "fallback_series"):
            for pattern in getattr(self, name):
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise ConfigError(
                        f"discovery.{name}: expected regular expressions, found {pattern!r} "
                        f"({exc})") from exc


@dataclass
class RunnerSettings:
    """How scans are spread over processes (not part of the settings hash)."""

    workers: int = 1
    threads_per_worker: int = 1
    shard: str = ""
    dask_scheduler: str = ""
    progress: bool = True

    def __post_init__(self) -> None:
        if self.workers < 1 or self.threads_per_worker < 1:
            raise ConfigError(
                f"runner.workers and threads_per_worker must be >= 1, found "
                f"{self.workers}, {self.threads_per_worker}"
            )


@dataclass
class PreprocessConfig:
    """All settings of ``adni-pu preprocess``."""

    reorient: bool = True
    validation: ValidationSettings = field(default_factory=ValidationSettings)
    n4: N4Settings = field(default_factory=N4Settings)
    skullstrip: SkullStripSettings = field(default_factory=SkullStripSettings)
    registration: RegistrationSettings = field(default_factory=RegistrationSettings)
    cerebellum: CerebellumSettings = field(default_factory=CerebellumSettings)
    intensity: IntensitySettings = field(default_factory=IntensitySettings)
    grid: GridSettings = field(default_factory=GridSettings)
    qc: QCSettings = field(default_factory=QCSettings)
    discovery: DiscoverySettings = field(default_factory=DiscoverySettings)
    runner: RunnerSettings = field(default_factory=RunnerSettings)


# Settings added after outputs were already made, with the value that gives those outputs:
# left out of the hash at that value, so earlier output folders still resume.
ADDED_LATER: dict[tuple[str, str], Any] = {("skullstrip", "deepbet_size"): 256}


def settings_hash(cfg: PreprocessConfig) -> str:
    """Short hash of every setting that changes a scan's outputs.

    The runner and discovery settings are left out: they decide which scans run and
    where, not what a scan's outputs are.
    """
    data = cfgmod.to_dict(cfg)
    data.pop("runner", None)
    data.pop("discovery", None)
    cfgmod.drop_added_later(data, ADDED_LATER)
    data["pipeline_version"] = PIPELINE_VERSION
    text = json.dumps(data, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None,
    values: dict[str, Any] | None = None,
) -> PreprocessConfig:
    """Settings from an optional TOML file, then ``values`` (a nested dict given by library
    code), then the user's ``key=value`` overrides."""
    return cfgmod.load(PreprocessConfig, path, overrides, values=values)
