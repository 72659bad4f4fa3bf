"""Settings of a training run on MRI volumes: :class:`VolumeTrainConfig` and how it is resolved.

The trainer's :class:`~adni_pu.pu.config.TrainConfig` (under ``train``), the MONAI
pipeline's :class:`~adni_pu.data.volume_config.VolumeDataConfig` (under ``data``), and the
settings of the volume path itself (preset, class prior, PU scheme, bootstrap resamples).
:func:`load_volume_config` resolves them from the preset, a TOML file, values and
``--set`` overrides; :func:`with_derived_values` fills in what follows from other settings.
``adni-pu train`` writes the resolved settings to ``RUN/volume_config.toml``
(:mod:`adni_pu.workflows.run_folder`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from adni_pu import config as cfgmod
from adni_pu.data.volume_config import VolumeDataConfig
from adni_pu.errors import ConfigError
from adni_pu.pu.config import TrainConfig

# The CNN's label-channel switches and the data settings that give it those channels.
LABEL_CHANNELS: dict[str, str] = {"roi_pool": "hipp_mask", "brain_roi": "ventricle_mask"}


def _default_train() -> TrainConfig:
    return TrainConfig(model="cnn3d", model_args={"preset": "paper"}, batch_size=16,
                       eval_batch_size=16, epochs=60)


@dataclass
class VolumeTrainConfig:
    """Settings of a training run on volumes.

    ``train`` is the trainer's :class:`TrainConfig` (the ``preset`` is applied to it first,
    then the file and ``--set`` overrides); ``data`` the MONAI pipeline's settings.
    """

    preset: str = "selfpu"
    """Training preset (``adni-pu presets``): naive, upu, nnpu, selfpu or an ablation row."""
    prior: float | str = "cohort"
    """Class prior: a number, "cohort" for the positive fraction (by the truth) among the
    training subjects with known truth, or "estimate" to estimate it from the PU data alone
    (no truth needed; :mod:`adni_pu.workflows.prior`)."""
    scheme: str = "censoring"
    """PU scheme: "censoring" (U = unlabelled subjects, right for ADNI) or "case-control"."""
    bootstrap: int = cfgmod.bounded(1000, ge=0)
    """Bootstrap resamples for the CIs of ``adni-pu evaluate``."""
    train: TrainConfig = field(default_factory=_default_train)
    data: VolumeDataConfig = field(default_factory=VolumeDataConfig)

    def __post_init__(self) -> None:
        cfgmod.check_ranges(self)
        if isinstance(self.prior, str) and self.prior not in ("cohort", "estimate"):
            raise ConfigError(f"prior: expected a number in (0, 1), 'cohort' or 'estimate', "
                             f"found {self.prior!r}")
        if not isinstance(self.prior, str) and not 0.0 < float(self.prior) < 1.0:
            raise ConfigError(f"prior: expected a number in (0, 1), found {self.prior}")
        if self.scheme not in ("censoring", "case-control"):
            raise ConfigError(f"scheme: expected 'censoring' or 'case-control', found "
                             f"{self.scheme!r}")
        if self.train.model != "cnn3d" and not self.train.model_args:
            raise ConfigError(f"train.model={self.train.model!r}: volumes need 'cnn3d' (or a "
                             "model taking the brain/hipp_l/hipp_r dict, with model_args)")
        if self.train.model == "cnn3d":  # the network's input sizes follow the pipeline's
            args = self.train.model_args
            brain = args.get("brain_size", self.data.brain_size)
            hipp = args.get("hipp_size", self.data.hipp_size)
            if list(brain) != list(self.data.brain_size) or \
                    list(hipp) != list(self.data.hipp_size):
                raise ConfigError(
                    f"train.model_args brain_size={list(brain)}, hipp_size="
                    f"{list(hipp)} differ from data.brain_size={list(self.data.brain_size)}"
                    f", data.hipp_size={list(self.data.hipp_size)}; set only the data sizes")
            for arg, setting in LABEL_CHANNELS.items():
                given = bool(getattr(self.data, setting))
                if given and not args.get("global_pool", False):
                    raise ConfigError(f"data.{setting}=true needs train.model_args.global_pool"
                                      "=true (a branch averages its feature maps inside the "
                                      "label channel, which only the pooled head takes)")
                if bool(args.get(arg, given)) != given:
                    raise ConfigError(f"train.model_args {arg}={args[arg]} differs from "
                                      f"data.{setting}={given}; set only data.{setting} "
                                      "(the model pools inside the label it gets)")


def with_derived_values(cfg: VolumeTrainConfig) -> VolumeTrainConfig:
    """The settings with their derived values filled in (a copy; ``cfg`` is not changed).

    With ``train.model = "cnn3d"`` the network's input sizes ``train.model_args.brain_size``
    and ``hipp_size`` follow the data pipeline's ``data.brain_size`` and ``data.hipp_size``,
    and ``roi_pool`` and ``brain_roi`` follow ``data.hipp_mask`` and ``data.ventricle_mask``
    (set only those; :class:`VolumeTrainConfig`
    refuses model values that differ).
    :func:`load_volume_config` and :func:`train_volumes` call this; it is idempotent.
    """
    if cfg.train.model != "cnn3d":
        return cfg
    args = dict(cfg.train.model_args)
    args.setdefault("brain_size", list(cfg.data.brain_size))
    args.setdefault("hipp_size", list(cfg.data.hipp_size))
    for arg, setting in LABEL_CHANNELS.items():
        if getattr(cfg.data, setting):
            args.setdefault(arg, True)
    return replace(cfg, train=replace(cfg.train, model_args=args))


def load_volume_config(path: str | Path | None = None, overrides: list[str] | None = None,
                       preset: str | None = None, values: dict[str, Any] | None = None
                       ) -> VolumeTrainConfig:
    """Resolve the settings: volume defaults < preset < file < ``values`` < ``--set`` overrides.

    The preset is taken from ``preset`` (the CLI's ``--preset``), else from the overrides',
    the values' or the file's ``preset`` key, else ``selfpu``. ``values`` are settings given
    as a nested dict by library code (never as ``KEY=VALUE`` text). The class prior is
    ``prior``; ``train.prior`` is accepted as another name for it (see :func:`_one_prior`).
    Derived values are filled in last (:func:`with_derived_values`).
    """
    import tomllib

    from adni_pu.pu.config import preset_settings

    file_data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise cfgmod.ConfigError(f"{path}: settings file not found")
        try:
            file_data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise cfgmod.ConfigError(f"{path}: not valid TOML ({exc})") from exc
    overrides = list(overrides or [])
    values = dict(values or {})
    name = cfgmod.preset_choice(path, overrides, preset, "selfpu", values)
    prior_given = ("prior" in file_data or "prior" in values
                   or any(cfgmod.parse_override(o)[0] == ["prior"] for o in overrides))
    if preset is not None:
        overrides = cfgmod.without_preset(overrides)
        values["preset"] = preset
    train_defaults = cfgmod.to_dict(_default_train())
    train_defaults.pop("prior", None)
    cfgmod.deep_update(train_defaults, preset_settings(str(name)))  # unknown: ConfigError
    defaults = {"preset": name, "train": train_defaults}
    cfg = cfgmod.load(VolumeTrainConfig, path, overrides, defaults, values)
    cfg = _one_prior(cfg, prior_given, str(path) if path is not None else "settings")
    return with_derived_values(cfg)


def _one_prior(cfg: VolumeTrainConfig, prior_given: bool, where: str) -> VolumeTrainConfig:
    """Fold ``train.prior`` into ``prior``, so one value is recorded, used and reported.

    The trainer would take ``train.prior`` for its risks while the run folder, the
    unlabelled prior and the report follow ``prior``; both given with different values
    is refused, one alone sets ``prior`` and leaves ``train.prior`` unset.
    """
    alias = cfg.train.prior
    if alias is None:
        return cfg
    if prior_given and cfg.prior != alias:
        raise cfgmod.ConfigError(
            f"{where}: prior = {cfg.prior!r} and train.prior = {alias!r} disagree; set the "
            "class prior once, as prior = <number> (or \"cohort\")")
    try:
        return replace(cfg, prior=alias, train=replace(cfg.train, prior=None))
    except cfgmod.ConfigError as exc:  # __post_init__ validation, said with where it came from
        raise cfgmod.ConfigError(f"{where}: {exc}") from exc
