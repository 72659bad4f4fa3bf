"""One error family for adni-pu: every error a user can cause derives from :class:`AdniPuError`.

The CLI catches :class:`AdniPuError` once (``adni_pu.cli.app``), prints ``error: <message>``
and exits with status 2; anything else is a bug and shows its traceback. Each class also
derives from the built-in it replaced (``ValueError`` or ``RuntimeError``), so code that
caught those keeps working. The messages name the file, the field, what was expected and
what was found.
"""

from __future__ import annotations


class AdniPuError(Exception):
    """Base of every error a user's input, settings or files can cause."""


class AdniPuWarning(UserWarning):
    """Base of adni-pu's warnings about a user's input (used after a harmless repair); the
    CLI prints each as one line, ``warning: <message>``."""


# settings -----------------------------------------------------------------------------------
class ConfigError(AdniPuError, ValueError):
    """A settings file, override or settings value that cannot be used."""


# data ---------------------------------------------------------------------------------------
class DataFormatError(AdniPuError, ValueError):
    """A data file that is missing, truncated or not what its name says."""


class PUConstructionError(AdniPuError, ValueError):
    """A PU request that cannot be met (too many labelled positives, bad prior, empty split)."""


class ManifestError(AdniPuError, ValueError):
    """A cohort manifest, or a scan it lists, that cannot be used for training or evaluation."""


# preprocessing ------------------------------------------------------------------------------
class ScanError(AdniPuError, ValueError):
    """A scan that cannot be read or is not a plausible T1 volume."""


class OutputError(AdniPuError, ValueError):
    """The output path cannot be used as the output folder."""


class OutputLockedError(AdniPuError, RuntimeError):
    """Another process is writing the same output folder (:mod:`adni_pu.locking`)."""


class DeviceError(AdniPuError, RuntimeError):
    """A ``--device`` / ``train.device`` that is not a device name, or not on this machine."""


class ShardMergeError(AdniPuError, ValueError):
    """Shard summaries that cannot be merged (a shard missing, a foreign file)."""


class SkullStripError(AdniPuError, RuntimeError):
    """Skull stripping could not produce a mask."""


class AtlasError(AdniPuError, RuntimeError):
    """A bundled template or atlas file could not be found or read."""


class ClusterError(AdniPuError, RuntimeError):
    """A submission that cannot work as asked (bad shard count, missing shard summaries)."""


# cohort -------------------------------------------------------------------------------------
class CohortInputError(AdniPuError, ValueError):
    """Input tables or settings that the cohort builder cannot use; nothing is written."""


class SuvrError(AdniPuError, ValueError):
    """A PET volume from which no trustworthy SUVR can be computed."""


class LeakageError(AdniPuError, RuntimeError):
    """A subject used for evaluation was also used in training."""


# training and the workflows -----------------------------------------------------------------
class ResumeError(AdniPuError, RuntimeError):
    """A checkpoint that does not belong to this run's settings."""


class DistributedError(AdniPuError, RuntimeError):
    """A setting or a problem size that multi-process training cannot honour."""


class VolumeRunError(AdniPuError, ValueError):
    """Settings, a manifest or a run folder that cannot be used (the message says why)."""

