"""Container files: hadolint on the Dockerfile, the compose file against the Compose spec,
one list of pins for the image and scripts/setup.sh, the Apptainer definition, the self-check.

No Docker engine is needed: nothing here builds or runs the image (docs/deployment.md).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    """A dev tool from this environment (installed by scripts/setup.sh's dev extras)."""
    path = shutil.which(name, path=str(BIN)) or shutil.which(name)
    assert path, f"{name} not found: install the dev extras (bash scripts/setup.sh)"
    return path


def _logical_lines(text: str) -> list[str]:
    """Lines with backslash continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", text)
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def _pip_installs(text: str) -> list[list[str]]:
    """The argument lists of every `pip install` command in a shell or Dockerfile text."""
    found = []
    for line in _logical_lines(text):
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        command: list[str] = []
        for word in [*lexer, "&&"]:
            if word not in ("&&", ";", "||"):
                command.append(word)
                continue
            if "pip" in command and "install" in command and "--upgrade" not in command:
                found.append(command[command.index("install") + 1:])
            command = []
    return found


def _packages(args: list[str]) -> set[str]:
    """Package arguments of one `pip install` (options and their values dropped)."""
    takes_value = {"-c", "--constraint", "--index-url", "--extra-index-url", "-r"}
    out, skip = set(), False
    for word in args:
        if skip:
            skip = False
        elif word in takes_value:
            skip = True
        elif word == "-e":
            continue
        elif not word.startswith("-"):
            out.add(word)
    return out


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


# ------------------------------------------------------------------ Dockerfile


def test_dockerfile_passes_hadolint(tmp_path) -> None:
    hadolint = _tool("hadolint")
    ok = subprocess.run([hadolint, str(DOCKER / "Dockerfile")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # the lint really runs: an unpinned apt-get install is reported
    bad = tmp_path / "Dockerfile"
    bad.write_text((DOCKER / "Dockerfile").read_text()
                   + "\nRUN apt-get update && apt-get install -y curl\n")
    res = subprocess.run([hadolint, str(bad)], capture_output=True, text=True)
    assert res.returncode != 0 and "DL3008" in res.stdout


def test_dockerfile_conventions() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    lines = _logical_lines(text)
    assert len([ln for ln in lines if ln.startswith("FROM ")]) >= 2  # multi-stage
    assert lines[-2:] == ['ENTRYPOINT ["adni-pu"]', 'CMD ["--help"]']
    user = [ln for ln in lines if ln.startswith("USER ")][-1]
    assert user.split()[1].split(":")[0] not in ("0", "root")
    for label in ("title", "version", "licenses", "created", "revision"):
        assert f"org.opencontainers.image.{label}=" in text
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert f"ARG VERSION={version}" in lines
    # the offline check runs at build time with the network off
    assert any(ln.startswith("RUN --network=none") and "selfcheck.py" in ln for ln in lines)


def test_dockerignore_admits_exactly_what_the_image_copies() -> None:
    ignore = _logical_lines((ROOT / ".dockerignore").read_text())
    assert ignore[0] == "*"  # everything else (runs, caches, data, .venv) stays out
    allowed = {p[1:].rstrip("/") for p in ignore if p.startswith("!")}
    copied = set()
    for line in _logical_lines((DOCKER / "Dockerfile").read_text()):
        if line.startswith("COPY ") and "--from=" not in line:
            copied.update(w.rstrip("/") for w in line.split()[1:-1])
    assert copied == allowed
    for path in copied:
        assert (ROOT / path).exists(), path


# ------------------------------------------------------------------ one list of pins


def test_image_and_setup_install_the_same_pinned_packages() -> None:
    setup = _pip_installs((ROOT / "scripts" / "setup.sh").read_text())
    image = _pip_installs((DOCKER / "Dockerfile").read_text())
    for args in setup + image:
        assert args[args.index("-c") + 1] == "constraints.txt", args
        assert not any("==" in a or ">=" in a for a in args), f"version outside constraints: {args}"
    assert [_packages(a) for a in setup] == [{"torch"}, {".[dev]"}, {"deepbet"}]
    assert [_packages(a) for a in image] == [{"torch"}, {"."}, {"deepbet"}]
    assert "--no-deps" in setup[2] and "--no-deps" in image[2]
    assert "COPY constraints.txt ./" in _logical_lines((DOCKER / "Dockerfile").read_text())


def test_constraints_pin_torch_and_every_dependency() -> None:
    pins = _constraints()
    assert pins["torch"] == "2.13.0"  # no local label: CPU build here, CUDA build in the image
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    from packaging.requirements import Requirement

    for req in project["dependencies"] + project["optional-dependencies"]["dev"] + ["deepbet"]:
        name = re.sub(r"[-_.]+", "-", Requirement(req).name).lower()
        assert name in pins, f"constraints.txt: no pin for {name} (run scripts/pin_requirements.py)"
        assert Requirement(req).specifier.contains(pins[name]), (name, pins[name])
    # written on the Python the image uses
    header = (ROOT / "constraints.txt").read_text().splitlines()[1]
    python = re.search(r"Python (\d+\.\d+)", header).group(1)
    assert f"ARG PYTHON_VERSION={python}" in (DOCKER / "Dockerfile").read_text()


def test_pin_script_lists_the_same_packages(tmp_path) -> None:
    out = tmp_path / "constraints.txt"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "pin_requirements.py"), "--out",
                    str(out)], check=True, capture_output=True, cwd=ROOT)
    names = {ln.split("==")[0] for ln in out.read_text().splitlines() if "==" in ln}
    assert names == {ln.split("==")[0] for ln in (ROOT / "constraints.txt").read_text()
                     .splitlines() if "==" in ln}


# ------------------------------------------------------------------ compose


def test_compose_file_matches_the_compose_spec(tmp_path) -> None:
    checker = _tool("check-jsonschema")
    cmd = [checker, "--builtin-schema", "vendor.compose-spec"]
    ok = subprocess.run(cmd + [str(DOCKER / "compose.yaml")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = tmp_path / "compose.yaml"
    bad.write_text((DOCKER / "compose.yaml").read_text().replace("shm_size:", "shm_sizes:"))
    res = subprocess.run(cmd + [str(bad)], capture_output=True, text=True)
    assert res.returncode != 0 and "shm_sizes" in res.stdout


def test_compose_services_volumes_user_and_gpus() -> None:
    spec = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = spec["services"]
    assert {"preprocess", "train", "evaluate"} <= set(services)
    for name, svc in services.items():
        assert svc["user"].startswith("${ADNI_PU_UID"), name
        targets = {v["target"]: v for v in svc["volumes"]}
        assert targets["/data"]["read_only"] is True and {"/runs", "/cache"} <= set(targets), name
        build = (DOCKER / svc["build"]["context"] / svc["build"]["dockerfile"]).resolve()
        assert build == (DOCKER / "Dockerfile").resolve(), name
        assert svc["command"][0] in ("preprocess", "cohort", "train", "evaluate"), name
    train = services["train"]
    device = train["deploy"]["resources"]["reservations"]["devices"][0]
    assert device["driver"] == "nvidia" and device["count"] == "all"
    assert "gpu" in device["capabilities"]
    entry = train["entrypoint"]
    assert entry[0] == "torchrun" and entry[entry.index("--nproc_per_node") + 1] == "gpu"
    assert entry[-2:] == ["--no-python", "adni-pu"]
    assert "cuda" in " ".join(train["command"])
    assert "adni-pu-cache" in spec["volumes"]


def test_compose_commands_are_valid_cli_calls() -> None:
    """Every service's arguments parse with the real CLI (an unknown option would exit 2)."""
    from typer.testing import CliRunner

    from adni_pu.cli.app import app

    spec = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    runner = CliRunner()
    for name, svc in spec["services"].items():
        args = [re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", a) for a in svc["command"]]
        res = runner.invoke(app, args + ["--help"])
        assert res.exit_code == 0, (name, args, res.output)
        deprecated = {"--manifest", "--out", "--clinical", "--scans"} & set(args)
        assert not deprecated, (name, "deprecated spelling", deprecated)
    res = runner.invoke(app, ["evaluate", "/runs/x", "--no-such-option", "--help"])
    assert res.exit_code == 2


# ------------------------------------------------------------------ Apptainer


def test_apptainer_definition_wraps_the_image() -> None:
    text = (DOCKER / "adni-pu.def").read_text()
    header = dict(re.findall(r"^(Bootstrap|From):\s*(\S+)", text, re.M))
    assert header == {"Bootstrap": "docker-archive", "From": "adni-pu.tar"}
    sections = dict(re.findall(r"^%(\w+)\n(.*?)(?=^%|\Z)", text, re.M | re.S))
    assert 'exec adni-pu "$@"' in sections["runscript"]
    assert "selfcheck.py" in sections["test"]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert f"org.opencontainers.image.version {version}" in sections["labels"]


# ------------------------------------------------------------------ offline self-check


def test_selfcheck_blocks_the_network_and_finds_bundled_files() -> None:
    code = ("import sys; sys.path.insert(0, 'docker'); import selfcheck, urllib.request\n"
            "files = selfcheck.bundled_files(); assert all(f.stat().st_size > 1e6 for f in files)\n"
            "selfcheck.block_network()\n"
            "try:\n    urllib.request.urlopen('http://127.0.0.1:9/', timeout=2)\n"
            "except selfcheck.NetworkUsed:\n    print('blocked')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "blocked"


@pytest.mark.slow
def test_selfcheck_preprocesses_a_scan_offline() -> None:
    res = subprocess.run([sys.executable, str(DOCKER / "selfcheck.py")], capture_output=True,
                         text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("selfcheck ok: torch 2.13.0")
