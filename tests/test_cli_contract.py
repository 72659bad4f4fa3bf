"""The contract of every command of the CLI that writes (docs/architecture.md, "Habits"):
each owns the names it writes and holds its folder's lock.

:data:`CASES` names every leaf command of the Typer app (:func:`leaf_commands`, read from
``adni_pu.cli.app.app`` itself), so a command added without a case fails
:func:`test_every_command_of_the_cli_has_a_contract_case`. A command that writes nothing
says why (:data:`READ_ONLY`); a writing command gives its cheapest invocation on tiny
inputs, and each check it cannot take cheaply is named with the reason. The checks:
``umask`` (002 and 077 respected; every name written is in the registry,
:mod:`adni_pu.workflows.output_registry`), ``lock`` (refused, exit 2, one line naming the
holder, nothing written, while another holds the folder), ``signal`` (SIGTERM / SIGINT once
it writes: 143 / 130, their line, no partial or hidden file; the same command again
completes), ``foreign`` (its output onto a file it did not write is refused, the file kept)
and ``bad`` (a bad argument: one line ``error: ...``, exit 2, no traceback).
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from adni_pu.cli.app import app
from adni_pu.locking import LOCK_NAME, output_lock
from adni_pu.workflows.output_registry import layout

ROOT = Path(__file__).resolve().parents[1]
HOLDER = "contract-holder"
FOREIGN = "a colleague's notes, not written by adni-pu\n"


def leaf_commands() -> list[str]:
    """Every leaf command of the app, as typed (``"cohort build"``)."""
    def walk(cmd: object, path: tuple[str, ...]) -> Iterator[str]:
        subs = getattr(cmd, "commands", None)
        if subs is None:
            yield " ".join(path)
            return
        for name, sub in subs.items():
            yield from walk(sub, (*path, name))

    return sorted(walk(typer.main.get_command(app), ()))


# --------------------------------------------------------------------------- tiny inputs
class Inputs:
    """The tiny inputs of the cases, made once per worker on first use."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._made: dict[str, object] = {}

    def _once(self, key: str, make: Callable[[], object]) -> object:
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]

    @property
    def manifest(self) -> Path:
        from volume_helpers import make_volume_cohort

        return self._once("manifest", lambda: make_volume_cohort(self.root / "cohort"))

    def tiny_sets(self, epochs: int = 1) -> list[str]:
        from volume_helpers import tiny_overrides

        return [a for o in tiny_overrides(epochs, self.root / "cache") for a in ("--set", o)]

    @property
    def run(self) -> Path:
        def make() -> Path:
            run = self.root / "run"
            args = ["train", str(self.manifest), str(run), "--preset", "nnpu",
                    *self.tiny_sets()]
            result = CliRunner().invoke(app, args)
            assert result.exit_code == 0, result.output
            return run

        return self._once("run", make)

    @property
    def scan(self) -> Path:
        return sorted((self.manifest.parent / "vol").glob("*.nii"))[0]

    @property
    def qc(self) -> tuple[Path, Path]:
        from qc_folder import make_qc_folder

        def make() -> tuple[Path, Path]:
            prep, clinical, _ = make_qc_folder(self.root / "qc", n=6)
            return prep, clinical

        return self._once("qc", make)

    @property
    def blank_scans(self) -> Path:
        """One constant volume: preprocess refuses it at once (exit 1), writing its record."""
        def make() -> Path:
            import nibabel as nib
            import numpy as np

            folder = self.root / "blank"
            folder.mkdir()
            nib.save(nib.Nifti1Image(np.zeros((20, 20, 20), np.float32),
                                     np.diag([3.0, 3, 3, 1])), str(folder / "blank.nii.gz"))
            return folder

        return self._once("blank", make)

    @property
    def mnist(self) -> Path:
        from test_readers import write_mnist

        def make() -> Path:
            write_mnist(self.root / "mnist", n_train=200, n_test=40)
            return self.root / "mnist"

        return self._once("mnist", make)

    @property
    def cifar(self) -> Path:
        from test_readers import write_cifar_pickles

        def make() -> Path:
            write_cifar_pickles(self.root / "cifar", per_batch=40)
            return self.root / "cifar"

        return self._once("cifar", make)

    def compare_args(self, out: Path) -> list[str]:
        return ["benchmark", "cohort", self.manifest, out, "--methods", "naive,nnpu",
                "--folds", "2", "--seeds", "1", "--bootstrap", "20", *self.tiny_sets()]

    @property
    def compared(self) -> Path:
        """A finished comparison's pieces and folds, without its report (which
        ``benchmark cohort-report`` writes)."""
        def make() -> Path:
            done = self.root / "compared-full"
            result = CliRunner().invoke(app, [str(a) for a in self.compare_args(done)])
            assert result.exit_code == 0, result.output
            kept = self.root / "compared"
            shutil.copytree(done, kept, ignore=shutil.ignore_patterns(
                "report.*", "roc.png", "calibration.png", "records", "volume_features.csv"))
            return kept

        return self._once("compared", make)

    @property
    def results(self) -> Path:
        def make() -> Path:
            out = self.root / "bench"
            result = CliRunner().invoke(app, _mnist_args(self, out))
            assert result.exit_code == 0, result.output
            return out

        return self._once("results", make)


def _mnist_args(w: Inputs, out: Path, epochs: int = 1) -> list[str]:
    return ["benchmark", "mnist", "--seeds", "1", "--epochs", str(epochs), "--n-labelled", "60",
            "--data-dir", str(w.mnist), "--set", "progress=false", "--out", str(out)]


def _cohort_report_args(w: Inputs, out: Path) -> list[str]:
    """A report of a cohort built once from the tiny preprocessing folder, into ``out``."""
    def build() -> Path:
        prep, clinical = w.qc
        result = CliRunner().invoke(app, ["cohort", "build", str(clinical),
                                          str(prep / "summary.csv"), str(w.root / "built"),
                                          "--preset", "tracer-cutoffs"])
        assert result.exit_code == 0, result.output
        return w.root / "built"

    return ["cohort", "report", str(w._once("built", build)), "--out", str(out)]


def _compare_report_args(w: Inputs, out: Path) -> list[str]:
    """cohort-report writes into a comparison folder: a copy of a finished one."""
    if not out.exists():
        shutil.copytree(w.compared, out)
    return ["benchmark", "cohort-report", out, "--bootstrap", "20"]


def _copy_qc(w: Inputs, out: Path) -> list[str]:
    """qc writes into a preprocessing folder: a copy of the tiny one."""
    if not out.exists():
        shutil.copytree(w.qc[0], out)
    return ["qc", str(out), "--sheet"]


# --------------------------------------------------------------------------- the cases
Args = Callable[[Inputs, Path], list[str]]


@dataclass(frozen=True)
class Case:
    """A writing command's cheapest invocation: ``args(inputs, out)`` writes into ``out``
    (a folder; ``file`` names the file inside it for commands whose output is one file).
    ``bad``: the same with a bad argument; ``skip``: check -> why it is not run."""

    command: str
    args: Args
    bad: Args
    file: str | None = None
    ok: tuple[int, ...] = (0,)
    skip: dict[str, str] = field(default_factory=dict)
    signal_marker: str | None = None  # a name inside out that says it has started writing
    long_args: Args | None = None  # a longer invocation for the signal check (default: args)

    def argv(self, w: Inputs, out: Path) -> list[str]:
        return [str(a) for a in self.args(w, out)]

    def target(self, out: Path) -> Path:
        """The path the command is told to write: ``out``, or its file inside ``out``."""
        return out / self.file if self.file else out


#: What the commands that write nothing do instead.
READ_ONLY = {
    "presets": "prints the training presets; writes nothing",
    "cohort presets": "prints the cohort presets; writes nothing",
}

_SLOW_DEMO = "the cheapest demo (synth, preprocess, cohort, 2 folds x methods) takes minutes"
_FAST = "finishes in about a second on the tiny case, too short to stop it reliably"

CASES: dict[str, Case] = {case.command: case for case in (
    Case("train", lambda w, out: ["train", w.manifest, out, "--preset", "nnpu",
                                  *w.tiny_sets()],
         lambda w, out: ["train", w.manifest, out, "--preset", "no-such-preset"],
         signal_marker="metrics.csv", long_args=lambda w, out: [
             "train", w.manifest, out, "--preset", "nnpu", *w.tiny_sets(60)]),
    Case("evaluate", lambda w, out: ["evaluate", w.run, "--out", out, "--bootstrap", "20",
                                     "--device", "cpu"],
         lambda w, out: ["evaluate", w.run, "--out", out, "--split", "no-such-split"],
         skip={"signal": _FAST + "; tests/test_interrupts.py stops it"}),
    Case("interpret", lambda w, out: ["interpret", w.run, "--out", out, "--sanity", "0",
                                      "--bootstrap", "20", "--device", "cpu"],
         lambda w, out: ["interpret", w.run, "--out", out, "--method", "no-such-method"],
         skip={"signal": _FAST + "; tests/test_interrupts.py stops it"}),
    Case("predict", lambda w, out: ["predict", w.run, w.scan, "--out", out / "p.csv",
                                    "--device", "cpu"],
         lambda w, out: ["predict", w.run, out / "no-such-scan.nii", "--out", out / "p.csv"],
         file="p.csv", skip={"signal": _FAST}),
    Case("prior", lambda w, out: ["prior", w.manifest, out, *w.tiny_sets()],
         lambda w, out: ["prior", w.manifest, out, "--set", "train.epochs=-1"],
         signal_marker="prior_estimate/metrics.csv",
         long_args=lambda w, out: ["prior", w.manifest, out, *w.tiny_sets(60)]),
    Case("preprocess", lambda w, out: ["preprocess", w.blank_scans, out, "--no-progress",
                                       "--set", "n4.shrink_factor=2"],
         lambda w, out: ["preprocess", w.blank_scans, out, "--workers", "0"], ok=(1,),
         skip={"signal": "a real scan takes a minute; tests/test_preprocessing_interrupt.py "
                         "stops runs of stand-in steps"}),
    Case("qc", _copy_qc, lambda w, out: [*_copy_qc(w, out), "--ratings",
                                         w.root / "no-such-ratings.tsv"],
         skip={"signal": _FAST, "foreign": "its OUTPUT is a folder it reads (a file there is "
                                            "refused as no preprocessing folder); --out "
                                            "is checked in test_qc_sheet_out_keeps_a_foreign_file"}),
    Case("cohort build", lambda w, out: ["cohort", "build", w.qc[1], w.qc[0] / "summary.csv",
                                         out, "--preset", "tracer-cutoffs"],
         lambda w, out: ["cohort", "build", w.qc[1], w.qc[0] / "summary.csv", out,
                         "--preset", "no-such-preset"],
         skip={"signal": _FAST}),
    Case("cohort report", _cohort_report_args,
         lambda w, out: ["cohort", "report", w.root / "no-such-manifest.csv", "--out", out],
         skip={"signal": _FAST}),
    Case("synth", lambda w, out: ["synth", out, "--subjects", "2", "--voxel-size", "3"],
         lambda w, out: ["synth", out, "--subjects", "2", "--seed", "-1"],
         signal_marker=".adni-pu-synth.partial-*"),
    Case("benchmark mnist", _mnist_args,
         lambda w, out: [*_mnist_args(w, out), "--method", "svm"],
         signal_marker="seed0/metrics.csv", long_args=lambda w, out: _mnist_args(w, out, 8)),
    Case("benchmark cifar10", lambda w, out: [
        "benchmark", "cifar10", "--seeds", "1", "--epochs", "1", "--n-labelled", "60",
        "--data-dir", w.cifar, "--set", "progress=false", "--out", out],
         lambda w, out: ["benchmark", "cifar10", "--out", out, "--method", "svm"],
         skip={"umask": "the same workflow as benchmark mnist (adni_pu.workflows.benchmark), "
                        "whose outputs are checked; CIFAR's network is slower",
               "signal": "as benchmark mnist"}),
    Case("benchmark cohort", lambda w, out: w.compare_args(out),
         lambda w, out: [*w.compare_args(out)[:4], "--methods", "naive,svm"],
         skip={"signal": "each piece is a train run (the train case stops one) and a rerun "
                         "skips finished pieces and resumes a cut one "
                         "(tests/test_compare.py)"}),
    Case("benchmark cohort-report", _compare_report_args,
         lambda w, out: [*_compare_report_args(w, out), "--pair", "naive"],
         skip={"signal": _FAST, "foreign": "its OUT is a comparison folder it reads (a file "
                                           "there is refused as no comparison folder)"}),
    Case("benchmark table", lambda w, out: ["benchmark", "table", w.results,
                                            "--out", out / "t"],
         lambda w, out: ["benchmark", "table", w.results, "--out", out / "t",
                         "--pair", "not-a-pair"],
         file="t", skip={"signal": _FAST}),
    Case("demo", lambda w, out: ["demo", "--out", out, "--subjects", "20", "--epochs", "1"],
         lambda w, out: ["demo", "--out", out, "--subjects", "0"],
         skip={"umask": _SLOW_DEMO, "signal": _SLOW_DEMO + "; tests/test_interrupts.py "
                                                          "stops it"}),
)}


def test_every_command_of_the_cli_has_a_contract_case():
    missing = [c for c in leaf_commands() if c not in CASES and c not in READ_ONLY]
    assert not missing, f"commands with no contract case (add one to CASES): {missing}"
    assert not set(CASES) & set(READ_ONLY)
    assert sorted({*CASES, *READ_ONLY}) == leaf_commands()  # no case of a gone command
    for command in CASES:  # each writing command declares its names in the registry
        assert layout(REGISTRY_NAME.get(command, command)).names


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Inputs:
    return Inputs(tmp_path_factory.mktemp("contract"))


def tiny_data(patch: pytest.MonkeyPatch) -> None:
    """Data of seconds may give a class prior estimate, and MNIST of 240 images is a whole
    data set (the tiny inputs' sizes)."""
    from conftest import allow_tiny_prior_estimates

    from adni_pu.data import readers

    allow_tiny_prior_estimates(patch)
    patch.setitem(readers.MNIST_COUNTS, "train", 200)
    patch.setitem(readers.MNIST_COUNTS, "test", 40)


@pytest.fixture(autouse=True)
def _tiny(monkeypatch):
    """:func:`tiny_data` in this process (the in-process cases)."""
    tiny_data(monkeypatch)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


#: A command in its own process, with :func:`tiny_data` (``argv[1]``: this folder).
SCRIPT = """
import sys
sys.path.insert(0, sys.argv.pop(1))
import pytest
from test_cli_contract import tiny_data
tiny_data(pytest.MonkeyPatch())
from adni_pu.cli.app import app
app(sys.argv[1:], prog_name="adni-pu")
"""


def _case(command: str, check: str) -> Case:
    case = CASES[command]
    if check in case.skip:
        pytest.skip(f"{command}: {case.skip[check]}")
    return case


def _one_line_error(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert "Traceback" not in output and lines and lines[-1].startswith("error: "), output
    return lines[-1]


WRITING = sorted(CASES)  # the writing commands, each a parameter of every check


# --------------------------------------------------------------------------- umask
def _declared(command: str, path: Path, out: Path, file: str | None) -> bool:
    """Whether ``path`` (under the output folder ``out``) is a name the registry gives
    ``command``: a declared folder ``x/`` covers everything under it, a folder on the way to
    a declared file is declared, ``<N>`` stands for any text, and ``FILE`` / ``STEM`` for
    the file the case names."""
    parts = path.relative_to(out).parts
    for o in layout(REGISTRY_NAME.get(command, command)).names:
        declared = re.sub(r"<[^>]+>", "*", o.name)
        if file:
            declared = declared.replace("FILE", file).replace("STEM", file)
        pattern = declared.rstrip("/").split("/")
        if len(parts) <= len(pattern) and (path.is_dir() or len(parts) == len(pattern)) \
                and all(fnmatch.fnmatch(p, q) for p, q in zip(parts, pattern)):
            return True
        if declared.endswith("/") and len(parts) > len(pattern) \
                and all(fnmatch.fnmatch(p, q) for p, q in zip(parts, pattern)):
            return True
    return False


#: The registry's name of a command, where it differs: the benchmarks share a layout.
REGISTRY_NAME = {"benchmark mnist": "benchmark", "benchmark cifar10": "benchmark"}


@pytest.mark.parametrize("mask", [0o002, 0o077], ids=["002", "077"])
@pytest.mark.parametrize("command", WRITING)
def test_outputs_respect_the_umask_and_the_registry(command, mask, inputs, tmp_path):
    case = _case(command, "umask")
    out = tmp_path / "out"
    argv = case.argv(inputs, out)  # inputs are made under the test's own umask
    before = os.umask(mask)
    try:
        result = CliRunner().invoke(app, argv)
    finally:
        os.umask(before)
    assert result.exit_code in case.ok, result.output
    written = list(out.rglob("*"))
    copied = {"qc": lambda: inputs.qc[0],  # they write into another command's folder (a
              "benchmark cohort-report": lambda: inputs.compared}.get(command)  # copy)
    if copied is not None:  # their own names only
        given = {p.relative_to(copied()) for p in copied().rglob("*")}
        written = [p for p in written if p.relative_to(out) not in given]
    assert written
    for path in written:
        mode = path.stat().st_mode & 0o777
        assert mode & mask == 0, f"{path}: mode {mode:o} under umask {mask:03o}"
        if mask == 0o002:  # the group shares the work: it may read and write every file
            assert mode & 0o060 == 0o060, f"{path}: mode {mode:o} under umask 002"
        assert _declared(command, path, out, case.file), \
            f"{path.relative_to(out)}: not in {command}'s layout (adni_pu.workflows.output_registry)"


# --------------------------------------------------------------------------- lock
@pytest.mark.parametrize("command", WRITING)
def test_a_second_process_into_the_same_folder_is_refused(command, inputs, tmp_path):
    case = _case(command, "lock")
    out = tmp_path / "out"
    argv = case.argv(inputs, out)
    out.mkdir(exist_ok=True)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # another thread holds it as another process would (flock)
        with output_lock(out, HOLDER):
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(30)
        result = CliRunner().invoke(app, argv)
    finally:
        release.set()
        holder.join()
    assert result.exit_code == 2, result.output
    line = _one_line_error(result.output)
    assert f"{out}: in use by pid {os.getpid()} " in line, line  # the holder, named
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before  # nothing written


# --------------------------------------------------------------------------- foreign
@pytest.mark.parametrize("command", WRITING)
def test_the_output_onto_a_foreign_file_is_refused_and_the_file_kept(command, inputs,
                                                                      tmp_path):
    case = _case(command, "foreign")
    out = tmp_path / "out"
    argv = case.argv(inputs, out)
    target = case.target(out)
    # a file output: a foreign file where it writes; a folder output: a file in its place
    paths = [out / "t.md", out / "t.json"] if command == "benchmark table" else [target]
    if case.file:
        out.mkdir(exist_ok=True)
    for path in paths:
        path.write_text(FOREIGN)
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    _one_line_error(result.output)
    for path in paths:
        assert path.read_text() == FOREIGN


def test_qc_sheet_out_keeps_a_foreign_file(inputs, tmp_path):
    out = tmp_path / "out"
    argv = _copy_qc(inputs, out)
    sheet = tmp_path / "notes.png"
    sheet.write_text(FOREIGN)
    result = CliRunner().invoke(app, [*argv, "--out", str(sheet)])
    assert result.exit_code == 2, result.output
    _one_line_error(result.output)
    assert sheet.read_text() == FOREIGN


# --------------------------------------------------------------------------- bad argument
@pytest.mark.parametrize("command", WRITING)
def test_a_bad_argument_is_one_line_and_exit_2(command, inputs, tmp_path):
    case = _case(command, "bad")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [str(a) for a in case.bad(inputs, out)])
    assert result.exit_code == 2, result.output
    _one_line_error(result.output)
    assert len([line for line in result.output.splitlines() if line.strip()]) == 1, result.output


# --------------------------------------------------------------------------- signals
SIGNALS = [(signal.SIGTERM, 143, "interrupted by SIGTERM; "),
           (signal.SIGINT, 130, "interrupted by the user (Ctrl-C); ")]


@pytest.mark.parametrize("sig, code, line", SIGNALS, ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("command", WRITING)
def test_a_signal_stops_it_cleanly_and_a_rerun_completes(command, sig, code, line, inputs,
                                                         tmp_path):
    case = _case(command, "signal")
    assert case.signal_marker, f"{command}: give a signal_marker or skip the signal check"
    out = tmp_path / "out"
    argv = [str(a) for a in (case.long_args or case.args)(inputs, out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(ROOT / "tests"), *argv],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list(out.glob(case.signal_marker)) and proc.poll() is None:
            assert time.monotonic() < deadline, "never started writing"
            time.sleep(0.02)
        assert proc.poll() is None, f"finished before the signal: {proc.communicate()}"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith(line), err
    left = [p for p in tmp_path.rglob("*") if p.name.startswith(".") or ".partial" in p.name
            or p.name.endswith((".tmp", ".part"))]
    assert not left, left
    result = CliRunner().invoke(app, argv)  # the same command again: resumes, completes
    assert result.exit_code in case.ok, result.output
    assert not [p for p in out.rglob("*") if p.name == LOCK_NAME]
