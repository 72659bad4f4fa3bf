"""Settings (adni_pu.config, workflows.volume_settings): values given by library code, derived
values computed in one explicit step, ranges held whether a setting comes from a file, a
``--set`` or code, and a bad ``--set`` blamed on the ``--set``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adni_pu import config as cfgmod
from adni_pu.cli.app import app
from adni_pu.errors import ConfigError
from adni_pu.workflows.benchmark import BenchmarkSpec, resolve_config
from adni_pu.workflows.volume_settings import (
    VolumeTrainConfig,
    load_volume_config,
    with_derived_values,
)

runner = CliRunner()


@dataclass
class _Inner:
    cache_dir: Path | None = None


@dataclass
class _Outer:
    name: str = "a"
    epochs: int = 1
    inner: _Inner = field(default_factory=_Inner)


def test_values_sit_between_the_file_and_the_overrides(tmp_path):
    toml = tmp_path / "s.toml"
    toml.write_text('name = "file"\nepochs = 3\n')
    odd = tmp_path / 'a "quoted" folder'  # would break a KEY="VALUE" string
    cfg = cfgmod.load(_Outer, toml, ["epochs=9"], None,
                      {"name": "value", "epochs": 5, "inner": {"cache_dir": odd}})
    assert cfg.name == "value" and cfg.epochs == 9 and cfg.inner.cache_dir == odd


def test_derived_model_sizes_are_an_explicit_step_that_changes_no_input():
    cfg = VolumeTrainConfig()
    assert "brain_size" not in cfg.train.model_args  # construction derives nothing
    derived = with_derived_values(cfg)
    assert derived.train.model_args["brain_size"] == list(cfg.data.brain_size)
    assert derived.train.model_args["hipp_size"] == list(cfg.data.hipp_size)
    assert "brain_size" not in cfg.train.model_args  # the input is left as it was
    assert with_derived_values(derived) == derived
    loaded = load_volume_config(None, [], "nnpu")
    assert loaded.train.model_args["brain_size"] == list(loaded.data.brain_size)


def test_model_sizes_that_differ_from_the_data_sizes_are_refused():
    with pytest.raises(cfgmod.ConfigError, match="set only the data sizes"):
        load_volume_config(None, ["train.model_args.brain_size=[10, 10, 10]"], "nnpu")


def test_roi_pool_follows_the_label_channel():
    cfg = load_volume_config(None, ["data.hipp_mask=true",
                                    "train.model_args.global_pool=true"], "nnpu")
    assert cfg.train.model_args["roi_pool"] is True
    assert "roi_pool" not in load_volume_config(None, [], "nnpu").train.model_args
    with pytest.raises(cfgmod.ConfigError, match="set only data.hipp_mask"):
        load_volume_config(None, ["train.model_args.roi_pool=true"], "nnpu")
    both = load_volume_config(None, ["data.ventricle_mask=true", "train.model_args.global_pool"
                                     "=true"], "nnpu")
    assert both.train.model_args["brain_roi"] is True and "roi_pool" not in \
        both.train.model_args
    with pytest.raises(cfgmod.ConfigError, match="set only data.ventricle_mask"):
        load_volume_config(None, ["data.ventricle_mask=true", "train.model_args.global_pool"
                                  "=true", "train.model_args.brain_roi=false"], "nnpu")
    for setting in ("hipp_mask", "ventricle_mask"):  # a label channel needs the pooled head
        with pytest.raises(cfgmod.ConfigError, match=f"data.{setting}=true needs train."
                           "model_args.global_pool=true"):
            load_volume_config(None, [f"data.{setting}=true"], "nnpu")


def test_preset_and_values_resolve_like_the_command_line(tmp_path):
    cache = tmp_path / 'it\'s "here"'
    cfg = load_volume_config(None, ["train.epochs=7"], "naive",
                             values={"train": {"epochs": 3, "threads": 1},
                                     "data": {"cache": "disk", "cache_dir": cache}})
    assert cfg.preset == "naive" and cfg.train.method == "naive"
    assert cfg.train.epochs == 7 and cfg.train.threads == 1 and cfg.data.cache_dir == cache


def test_benchmark_settings_are_values_and_the_run_seed_wins():
    spec = BenchmarkSpec(dataset="mnist", method="upu", settings={"threads": 1, "device": "cpu",
                                                                  "method": "upu"},
                         overrides=["epochs=4", "seed=99"])
    cfg = resolve_config(spec, seed=2)
    assert (cfg.method, cfg.threads, cfg.device, cfg.epochs, cfg.seed) == ("upu", 1, "cpu", 4, 2)


def test_the_demo_budget_file_resolves_as_the_set_strings_did(tmp_path):
    """The demo hands its budget to the comparison as a settings file
    (``demo_training.toml``); with the piece's seed and prior as values it resolves as the
    ``--set`` strings the demo once built, and a cache path with quotes survives the file."""
    from adni_pu.workflows.demo import DemoSettings, training_file

    cache = tmp_path / "cache"
    as_text = ["train.batch_size=8", "train.eval_batch_size=16", "train.lr=0.001",
               "train.progress=false", "train.model_args.channels=[8, 16]",
               "train.model_args.hidden=64", "train.model_args.global_pool=true",
               "data.brain_size=[40, 40, 40]", "data.hipp_mask=true", "bootstrap=0",
               "train.epochs=8",
               'data.cache="disk"', f'data.cache_dir="{cache.resolve()}"', "train.threads=2",
               "train.seed=3", "train.selfpu.warmup_epochs=2",
               "train.selfpu.self_paced_end=5", "train.selfpu.select_every=1",
               "train.selfpu.teacher_rampup_epochs=1", "prior=0.6214", "train.lr=0.002"]
    path = training_file(DemoSettings(out=tmp_path, epochs=8, threads=2))
    for preset in ("nnpu", "selfpu"):
        before = load_volume_config(None, as_text, preset=preset)
        after = load_volume_config(path, ["train.lr=0.002"], preset=preset,
                                   values={"prior": 0.6214, "train": {"seed": 3}})
        assert cfgmod.to_dict(after) == cfgmod.to_dict(before)
    odd = tmp_path / 'a "quoted" place'  # the text form could not carry this path
    odd_file = training_file(DemoSettings(out=odd, epochs=2, threads=1))
    cfg = load_volume_config(odd_file, [], "nnpu")
    assert cfg.data.cache_dir == (odd / "cache").resolve()


def test_demo_preprocessing_and_cohort_settings_as_values_equal_the_old_strings():
    """The demo builds its stage settings as values; they resolve (and hash) as the strings
    it used to build did, so earlier demo folders still resume."""
    from adni_pu.cohort.config import load_cohort_config
    from adni_pu.preprocessing.config import load_config, settings_hash
    from adni_pu.workflows.demo import FAST_PREPROCESSING

    strings = load_config(None, [
        "registration.resolution_mm=4.0", "registration.iterations=[50,20]",
        "registration.shrink_factors=[2,1]", "registration.smoothing_sigmas=[1.0,0.0]",
        "qc.min_brain_ml=400.0", "skullstrip.deepbet_size=192"])
    values = load_config(values=FAST_PREPROCESSING)
    assert values == strings and settings_hash(values) == settings_hash(strings)
    assert values.registration.resolution_mm == 4.0  # not the default
    assert values.skullstrip.deepbet_size == 192
    cohort = load_cohort_config(values={"split": {"seed": 3, "test_fraction": 0.25}},
                                preset="centiloid")
    assert cohort == load_cohort_config(None, ["split.seed=3", "split.test_fraction=0.25"],
                                        preset="centiloid")
    assert cohort.split.seed == 3 and cohort.preset == "centiloid"


# --------------------------------------------------------------------------- ranges and --set


@pytest.mark.parametrize("override, message", [
    ("train.lr=-0.01", "--set train.lr=-0.01: expected a number > 0, found -0.01"),
    ("train.lr=0", "--set train.lr=0: expected a number > 0, found 0"),
    ("train.beta=-1", "--set train.beta=-1: expected a number >= 0, found -1"),
    ("train.epochs=-1", "--set train.epochs=-1: expected an integer >= 1, found -1"),
    ("train.batch_size=0", "--set train.batch_size=0: expected an integer >= 2, found 0"),
    ("train.selfpu.ema_decay=1", "--set train.selfpu.ema_decay=1: expected a number in "
                                 "[0, 1), found 1"),
    ("bootstrap=-1", "--set bootstrap=-1: expected an integer >= 0, found -1"),
])
def test_settings_out_of_range_are_refused_in_one_line(override, message):
    with pytest.raises(ConfigError) as info:
        load_volume_config(None, [override])
    assert str(info.value) == message


def test_settings_made_directly_are_held_to_the_ranges_too():
    from adni_pu.pu.config import TrainConfig

    with pytest.raises(ConfigError, match="lr=-1: expected a number > 0, found -1"):
        TrainConfig(lr=-1)


@pytest.mark.parametrize("override, message", [
    ("lr=-1", "--set lr=-1: expected a number > 0, found -1"),
    ("beta=-1", "--set beta=-1: expected a number >= 0, found -1"),
])
def test_benchmark_settings_out_of_range_are_refused(override, message):
    from adni_pu.workflows.benchmark import BenchmarkSpec, resolve_config

    spec = BenchmarkSpec(dataset="mnist", method="nnpu", overrides=[override])
    with pytest.raises(ConfigError) as info:
        resolve_config(spec, seed=0)
    assert str(info.value) == message


def test_evaluate_bootstrap_below_zero_is_refused_before_any_work(tmp_path):
    result = runner.invoke(app, ["evaluate", str(tmp_path / "no-run"), "--bootstrap", "-1"])
    assert result.exit_code == 2
    assert result.output.strip() == "error: --bootstrap: expected an integer >= 0, found -1"


def test_a_bad_set_value_is_blamed_on_the_set_not_the_settings_file(tmp_path):
    """A --set that gives a bad value, a value of the wrong type or an unknown name is
    blamed on the --set; the settings file's own mistake names the file."""
    fast = tmp_path / "fast.toml"
    fast.write_text("[train]\nepochs = 2\n")
    with pytest.raises(ConfigError) as info:
        load_volume_config(fast, ["prior=1.5"])
    assert str(info.value) == "--set prior=1.5: expected a number in (0, 1), found 1.5"
    with pytest.raises(ConfigError, match=r"^--set train.batch_size=abc: expected an integer, "
                                          r"found 'abc'$"):
        load_volume_config(fast, ["train.batch_size=abc"])
    with pytest.raises(ConfigError, match=r"^--set train.batchsize=3: unknown setting"):
        load_volume_config(fast, ["train.batchsize=3"])
    fast.write_text("prior = 1.5\n")  # the file's own bad value is still the file's
    with pytest.raises(ConfigError, match=f"^{fast}: prior: expected a number in"):
        load_volume_config(fast, ["train.epochs=3"])
    fast.write_text("[train]\nepochs = \"many\"\n")
    with pytest.raises(ConfigError, match=r"fast.toml.train.epochs: expected an integer"):
        load_volume_config(fast, ["train.batch_size=4"])
