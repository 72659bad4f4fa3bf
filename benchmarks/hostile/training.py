"""Hostile probes: training (see benchmarks.hostile): leakage, contradictory manifests,
settings and messages (findings 3, 5, 14, 19, 20, 24, 27, 28, 29, 30b)."""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Callable

from benchmarks.common import REPO
from benchmarks.integrity_probes import TINY, Probe, _last, _sets, _trained, tiny_sets

MNIST = REPO.parent / "shared" / "data" / "mnist"

EDIT = TINY + """
import shutil
import pandas as pd
make_volume_cohort(Path('cohort'))
m = pd.read_csv('cohort/manifest.csv', dtype=str, keep_default_na=False)
"""


def _train(p: Probe, manifest: str, run: str, *extra: str) -> subprocess.CompletedProcess:
    return p.cli("train", manifest, run, "--preset", "naive", *tiny_sets(p), *extra)


def _said(p: Probe, r: subprocess.CompletedProcess, width: int = 150) -> str:
    """``exit N: <last line>`` (paths under the probe's folder shortened to ``./``)."""
    last = (_last_full(r.stderr) or _last_full(r.stdout)).replace(f"{p.work.resolve()}/", "./")
    return f"exit {r.returncode}: {last.replace(f'{p.work}/', './')[:width]}"


def _last_full(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def content_leak(p: Probe) -> str:
    """3a. A test subject's scan copied into train under another id; train, then evaluate."""
    p.py(EDIT + """
t = m[m.split == 'test'].iloc[0].copy()
shutil.copy('cohort/' + t.scan_path, 'cohort/vol/copy.nii')
t[['subject_id', 'scan_path', 'split']] = ['999_S_9999', 'vol/copy.nii', 'train']
pd.concat([m, t.to_frame().T]).to_csv('cohort/leak.csv', index=False)
""")
    r = _train(p, "cohort/leak.csv", "run")
    out = f"train {_said(p, r, 280)}"
    if r.returncode == 0:
        e = p.cli("evaluate", "run", "--bootstrap", "0")
        warned = "a warning" if "warning" in e.stderr.lower() else "no warning"
        out += f"; evaluate exit {e.returncode}, {warned}: {_last(e.stdout)[:60]}"
    return out


def id_leak(p: Probe) -> str:
    """3b. 002_S_0004 in train and sub-ADNI002S0004 (the same subject) in val."""
    p.py(EDIT + """
m.loc[m.index[m.split == 'train'][3], 'subject_id'] = '002_S_0004'
m.loc[m.index[m.split == 'val'][0], 'subject_id'] = 'sub-ADNI002S0004'
m.to_csv('cohort/leak.csv', index=False)
""")
    r = _train(p, "cohort/leak.csv", "run")
    left = "a run folder" if (p.work / "run").exists() else "no run folder"
    return f"{_said(p, r, 190)}; {left}"


def contradictions(p: Probe) -> str:
    """5. One subject with pu_label 1 and 0 on two rows; an exact duplicate row."""
    p.py(EDIT + """
a = m.copy(); a.loc[1, 'pu_label'] = '0'; a.to_csv('cohort/labels.csv', index=False)
pd.concat([m, m.iloc[[4]]]).to_csv('cohort/duplicate.csv', index=False)
""")
    labels = _train(p, "cohort/labels.csv", "run1")
    duplicate = _train(p, "cohort/duplicate.csv", "run2")
    return f"two labels: {_said(p, labels, 170)}; duplicate row: {_said(p, duplicate, 170)}"


def _benchmark(p: Probe, *sets: str) -> subprocess.CompletedProcess:
    data = str(MNIST) if MNIST.is_dir() else "."
    return p.cli("benchmark", "mnist", "--method", "nnpu", "--seeds", "1", "--epochs", "1",
                 "--train-limit", "600", "--test-limit", "200", "--n-labelled", "60",
                 "--threads", "1", "--data-dir", data, "--out", "bm", *_sets(list(sets)))


def negative_lr(p: Probe) -> str:
    """14. train.lr=-0.01; benchmark lr=-1."""
    p.py(TINY + "make_volume_cohort(Path('cohort'))")
    train = _train(p, "cohort/manifest.csv", "run", "--set", "train.lr=-0.01")
    bench = _benchmark(p, "lr=-1")
    return f"train: {_said(p, train, 120)}; benchmark: {_said(p, bench, 120)}"


def failed_rerun(p: Probe) -> str:
    """19. A train that fails on a manifest error caught late, then the fixed manifest."""
    p.py(EDIT + """
shutil.copy('/etc/passwd', 'cohort/vol/passwd')
bad = m.copy(); bad.loc[3, 'scan_path'] = 'vol/passwd'
bad.to_csv('cohort/bad.csv', index=False)
""")
    lazy = ("--set", 'data.cache="none"')  # volumes read in epoch 1, as in the report
    first = _train(p, "cohort/bad.csv", "run", *lazy)
    left = "run folder left" if (p.work / "run").exists() else "no run folder"
    again = _train(p, "cohort/manifest.csv", "run", *lazy)
    # what a run killed (or failed) in its first epoch leaves: its files, no finished epoch
    left_over = p.work / "run2"
    left_over.mkdir()
    (left_over / "run.json").write_text('{"manifest_sha256": "another", "settings": {}}\n')
    (left_over / "data.json").write_text("{}\n")
    reuse = _train(p, "cohort/manifest.csv", "run2")
    return (f"1st: exit {first.returncode}, {left}; rerun, fixed manifest: "
            f"{_said(p, again, 120)}; into a leftover with no finished epoch: "
            f"{_said(p, reuse, 120)}")


def blamed_file(p: Probe) -> str:
    """20. --config fast.toml --set prior=1.5."""
    (p.work / "fast.toml").write_text("[train]\nepochs = 2\n")
    r = p.cli("train", "cohort/manifest.csv", "run", "--config", "fast.toml", "--set",
              "prior=1.5")
    return _said(p, r)


BUILD_INPUTS = """
from pathlib import Path
from test_cohort_build import clinical_rows, summary_rows
c, s = clinical_rows(12), summary_rows(12)
"""


def next_hint(p: Probe) -> str:
    """24. cohort build into a folder with a space: paste the "next:" line back."""
    p.py(BUILD_INPUTS + """
Path('ADNIMERGE.csv').write_text('\\n'.join(c) + '\\n')
Path('summary.csv').write_text('\\n'.join(s) + '\\n')
""")
    r = p.cli("cohort", "build", "ADNIMERGE.csv", "summary.csv", "my cohort")
    line = next((x for x in r.stdout.splitlines() if x.startswith("next:")), "")
    if not line:
        return f"no next: line ({_said(p, r)})"
    words = shlex.split(line.split(", then ", 1)[-1])
    found = (p.work / words[2]).is_file() if len(words) > 2 else False
    return (f"{line.strip()[:90]} -> pasted back, MANIFEST is {words[2]!r}: "
            + ("the manifest" if found else "no such file"))


def silent_values(p: Probe) -> str:
    """27. train.lr=0, benchmark beta=-1 and evaluate --bootstrap -1."""
    run = _trained(p)
    boot = p.cli("evaluate", str(run), "--bootstrap", "-1")
    zero = _train(p, "cohort/manifest.csv", "run0", "--set", "train.lr=0")
    bench = _benchmark(p, "beta=-1")
    return (f"lr=0: {_said(p, zero, 90)}; beta=-1: {_said(p, bench, 90)}; --bootstrap -1: "
            f"{_said(p, boot, 90)}")


def warning_format(p: Probe) -> str:
    """28. A manifest whose split is written 'Train ': how the ManifestWarning prints."""
    (p.work / "m.csv").write_text("subject_id,scan_path,pu_label,truth,split\n"
                                  "a,a.nii,1,1,Train \nb,b.nii,0,0,val\n")
    r = p.cli("train", "m.csv", "run")
    lines = [x.strip().replace(f"{p.work}/", "./") for x in r.stderr.splitlines()
             if "arning" in x]
    return f"{len(lines)} line(s): {lines[0][:140] if lines else '(none)'}"


def ptid_paths(p: Probe) -> str:
    """29. cohort build with PTIDs ../../x and /etc/x."""
    p.py(BUILD_INPUTS + """
c += ['50,../../x,bl,2010-01-03,AD,Dementia,70,Male,1.3,,',
      '51,/etc/x,bl,2010-01-03,CN,CN,70,Male,1.0,,']
s += ['../../x,M000,/raw/a.nii,done,a.nii.gz,,1', '/etc/x,M000,/raw/b.nii,done,b.nii.gz,,1']
Path('ADNIMERGE.csv').write_text('\\n'.join(c) + '\\n')
Path('summary.csv').write_text('\\n'.join(s) + '\\n')
""")
    r = p.cli("cohort", "build", "ADNIMERGE.csv", "summary.csv", "out")
    shown = p.py("""
import pandas as pd
m = pd.read_csv('out/manifest.csv', dtype=str)
e = pd.read_csv('out/excluded.csv', dtype=str)
odd = sorted(x for x in m['scan_id'] if '/' in x or '..' in x)
gone = e[e['subject'].isin(['../../x', '/etc/x'])]
print(f"scan_ids {odd}; excluded: {sorted(set(gone['reason']))}")
""")
    return f"exit {r.returncode}; " + (_last(shown.stdout) or _last(shown.stderr))


def small_demo(p: Probe) -> str:
    """30b. demo --subjects 18 (real preprocessing): when does it fail?"""
    tic = time.perf_counter()
    try:
        r = p.cli("demo", "--subjects", "18", "--out", "demo", "--workers", "2", timeout=480)
    except subprocess.TimeoutExpired:
        return f"still running after {time.perf_counter() - tic:.0f} s"
    made = sorted(x.name for x in (p.work / "demo").iterdir()) if (p.work / "demo").is_dir() \
        else []
    said = _last_full(r.stderr).replace(f"{p.work}/", "./")
    said = said if len(said) <= 230 else f"{said[:90]} ... {said[-130:]}"
    return f"exit {r.returncode} after {time.perf_counter() - tic:.0f} s, made {made}: {said}"


PROBES: list[tuple[str, Callable[[Probe], str]]] = [
    ("3a train, evaluate: a test scan also in train as 999_S_9999", content_leak),
    ("3b train: 002_S_0004 in train, sub-ADNI002S0004 in val", id_leak),
    ("5 train: one subject with pu_label 1 and 0; an exact duplicate row", contradictions),
    ("14 train.lr=-0.01; benchmark lr=-1", negative_lr),
    ("19 train: a failed run, then the fixed manifest into the same RUN", failed_rerun),
    ("20 train --config fast.toml --set prior=1.5", blamed_file),
    ("24 cohort build into 'my cohort': the next: hint pasted back", next_hint),
    ("27 train.lr=0; benchmark beta=-1; evaluate --bootstrap -1", silent_values),
    ("28 train: a manifest whose split is 'Train '", warning_format),
    ("29 cohort build: PTIDs ../../x and /etc/x", ptid_paths),
    ("30b demo --subjects 18", small_demo),
]
