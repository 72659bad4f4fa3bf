"""Every preset is a configuration of the one trainer; check what each switches on."""

from __future__ import annotations

import pytest

from adni_pu import config as cfgmod
from adni_pu.config import ConfigError
from adni_pu.pu.config import PRESET_DESCRIPTIONS, TRAINING_PRESETS, TrainConfig, preset_settings


def load(name: str) -> TrainConfig:
    return cfgmod.from_dict(TrainConfig, preset_settings(name))


def test_every_preset_loads_and_is_described():
    assert set(TRAINING_PRESETS) == set(PRESET_DESCRIPTIONS)
    for name in TRAINING_PRESETS:
        load(name)


@pytest.mark.parametrize("name, method, students, labels, schedule, replacement, reweight, "
                         "consistency, teachers", [
    ("nnpu", "nnpu", None, None, None, None, None, None, None),
    ("sp-fixed", "selfpu", 1, "hard", "fixed", True, False, "none", False),
    ("sp-no-replacement", "selfpu", 1, "hard", "linear", False, False, "none", False),
    ("sp", "selfpu", 1, "hard", "linear", True, False, "none", False),
    ("sps", "selfpu", 1, "soft", "linear", True, False, "none", False),
    ("sp-reweight", "selfpu", 1, "hard", "linear", True, True, "none", False),
    ("sps-reweight", "selfpu", 1, "soft", "linear", True, True, "none", False),
    ("students", "selfpu", 2, "soft", "linear", True, True, "per_example", False),
    ("teachers", "selfpu", 2, "soft", "linear", True, True, "none", True),
    ("selfpu", "selfpu", 2, "soft", "linear", True, True, "per_example", True),
    ("published-code", "selfpu", 2, "entropy", "linear", True, True, "per_batch", True),
])
def test_preset_components(name, method, students, labels, schedule, replacement, reweight,
                           consistency, teachers):
    cfg = load(name)
    assert cfg.method == method
    if method != "selfpu":
        return
    sp = cfg.selfpu
    assert len(sp.rates) == students
    assert (sp.labels, sp.schedule, sp.replacement, sp.reweight) == (
        labels, schedule, replacement, reweight)
    assert (sp.student_consistency, sp.teachers) == (consistency, teachers)


def test_published_code_preset_details():
    sp = load("published-code").selfpu
    assert sp.teacher_average == "uniform" and sp.meta_sign_flip
    full = load("selfpu").selfpu
    assert full.teacher_average == "ema" and not full.meta_sign_flip
    assert full.rates == (0.2, 0.3)


def test_unknown_preset_and_bad_settings():
    with pytest.raises(ValueError, match="preset 'ls': expected one of"):
        preset_settings("ls")
    with pytest.raises(ConfigError, match="unknown setting"):
        cfgmod.from_dict(TrainConfig, {"epoch": 3})
    with pytest.raises(ConfigError, match="config.selfpu.rates"):
        cfgmod.from_dict(TrainConfig, {"selfpu": {"rates": "high"}})
    with pytest.raises(ConfigError, match="pn_validation"):
        cfgmod.from_dict(TrainConfig, {"val_criterion": "pn_accuracy"})


def test_meta_bn_preset_and_fingerprint_of_earlier_checkpoints():
    from adni_pu.pu.checkpoint import config_fingerprint

    base, running = load("selfpu"), load("selfpu-meta-running")
    assert base.selfpu.meta_bn == "batch" and running.selfpu.meta_bn == "running"
    # at the value from before the setting existed it stays out of the fingerprint, so
    # checkpoints written before it resume; another value is another run
    assert "meta_bn" not in config_fingerprint(base)
    assert '"meta_bn": "running"' in config_fingerprint(running)


@pytest.mark.parametrize(("name", "method", "rest", "reweight", "share"), [
    ("selfpu-band", "selfpu", "band", "shrink", 0.0),
    ("selfpu-mean-one", "selfpu", "prior", "mean-one", 0.0),
    ("selfpu-positive-share", "selfpu", "prior", "shrink", 0.125),
    ("nnpu-positive-share", "nnpu", "prior", "shrink", 0.125),
    ("selfpu", "selfpu", "prior", "shrink", 0.0),
])
def test_risk_setting_presets(name, method, rest, reweight, share):
    """The presets of the risk settings (tests/test_pu_risks.py) switch on what they name."""
    cfg = cfgmod.from_dict(TrainConfig, preset_settings(name))
    assert (cfg.method, cfg.selfpu.rest_risk, cfg.selfpu.reweight_risk, cfg.positive_share) == (
        method, rest, reweight, share)
