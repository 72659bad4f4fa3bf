"""Ctrl-C and SIGTERM stop every command the same way (adni_pu.cli.common.stop_on_signals):
clean-up runs, no partial or hidden files stay, one line names the signal, exit 130 / 143
(issue 52, "Interrupts keep what they say they keep"; hostile round 4, finding 23: SIGTERM
during `demo` was reported as Ctrl-C, and SIGTERM ran no clean-up at all)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny_mnist_benchmark
from typer.testing import CliRunner

from adni_pu.cli.app import app

REPO = Path(__file__).resolve().parents[1]

# each command's workflow function replaced by one that stages a file, says so, then waits
SCRIPT = """
import sys, time
from pathlib import Path
from adni_pu.fileio import staged_folder

def slow(*args, **kwargs):
    with staged_folder(Path(sys.argv[1]), "slow") as stage:
        (stage / "half.txt").write_text("partial")
        print("STARTED", flush=True)
        time.sleep(120)

import importlib
module, name = sys.argv[2].rsplit(".", 1)
setattr(importlib.import_module(module), name, slow)
from adni_pu.cli.app import app
app(sys.argv[3:], prog_name="adni-pu")
"""

COMMANDS = {
    "demo": ("adni_pu.workflows.demo.run_demo", ["demo", "--out", "{out}"],
             "the stages already finished are kept"),
    "evaluate": ("adni_pu.workflows.evaluate.evaluate_run", ["evaluate", "{out}"],
                 "nothing is left half-written"),
    "interpret": ("adni_pu.workflows.interpret.interpret_run", ["interpret", "{out}"],
                  "the output folder holds what it held before"),
    "prior": ("adni_pu.workflows.prior.estimate_manifest_prior", ["prior", "m.csv", "{out}"],
              "the classifier keeps the checkpoint"),
    "train": ("adni_pu.workflows.train.train_volumes", ["train", "m.csv", "{out}"],
              "the run folder keeps the checkpoint"),
    # the download is written into a hidden folder beside DIR, removed on an interrupt
    # (finding 17: SIGTERM left a 130 MB `.DIR.partial-*`)
    "synth": ("adni_pu.synth.adni_download._write", ["synth", "{out}/dl", "--subjects", "2"],
              "nothing is left half-written"),
}


def _stop(tmp_path: Path, command: str, signum: int) -> tuple[int, str]:
    target, args, _ = COMMANDS[command]
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(out), target,
         *[a.format(out=out) for a in args]],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:  # a command may say what it starts first
            if line.strip() == "STARTED":
                break
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert list(out.iterdir()) == []  # the staged file and its hidden folder are gone
    return proc.returncode, err


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_sigterm_runs_the_clean_up_and_names_the_signal(tmp_path, command):
    code, err = _stop(tmp_path, command, signal.SIGTERM)
    assert code == 143, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("interrupted by SIGTERM; ") and "Ctrl-C" not in line
    assert COMMANDS[command][2] in line


def test_ctrl_c_names_the_user(tmp_path):
    code, err = _stop(tmp_path, "demo", signal.SIGINT)
    assert code == 130, err
    assert err.strip().splitlines()[-1].startswith("interrupted by the user (Ctrl-C); ")


# --------------------------------------------------------------------------- in-process Ctrl-C
# KeyboardInterrupt inside a command (Typer's test runner): one line, exit 130, and what
# a benchmark keeps for its rerun.


def test_ctrl_c_in_a_benchmark_says_what_is_kept_and_the_rerun_continues(
        tmp_path: Path, monkeypatch) -> None:
    from adni_pu.workflows import benchmark

    args = [*tiny_mnist_benchmark(tmp_path, monkeypatch), "--seeds", "2"]
    finish = benchmark.seed_result

    def stopped_in_seed_1(spec, seed, *rest, **kw):  # Ctrl-C once seed 1 has trained
        if seed == 1:
            raise KeyboardInterrupt
        return finish(spec, seed, *rest, **kw)

    monkeypatch.setattr(benchmark, "seed_result", stopped_in_seed_1)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 130
    bm = tmp_path / "bm"
    line = result.output.strip().splitlines()[-1]
    assert line == ("interrupted by the user (Ctrl-C); kept seed 0: "
                    f"{bm / 'seed0' / 'result.json'}; seed 1: the checkpoint of its last finished epoch "
                    f"({bm / 'seed1' / 'checkpoints' / 'last.pt'}); run the same command "
                    "again to continue from there")
    monkeypatch.setattr(benchmark, "seed_result", finish)
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert "seed 0: already done" in again.output
    assert (bm / "results.json").is_file()


def test_ctrl_c_in_any_command_is_one_line_and_exit_130(monkeypatch) -> None:
    from adni_pu.workflows import evaluate

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate, "evaluate_run", interrupted)
    result = CliRunner().invoke(app, ["evaluate", "RUN"])
    assert result.exit_code == 130
    assert result.output.strip() == ("interrupted by the user (Ctrl-C); every file is written "
                                     "whole or not at all, so nothing is left half-written; "
                                     "run the command again")
