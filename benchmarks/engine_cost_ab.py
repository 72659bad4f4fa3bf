"""CPU cost per epoch of nnPU and Self-PU, base vs branch, interleaved.

usage: OMP_NUM_THREADS=1 python bench.py BASE_TREE BRANCH_TREE [ROUNDS]
Each measurement is a fresh process with PYTHONPATH=<tree>; it trains a 20-D Gaussian PU
problem (12,000 training examples, MLP 64x2, batch 128) and prints the process CPU seconds
per epoch of Trainer.fit (training, evaluation, selection)."""
import json, os, statistics, subprocess, sys, time

CHILD = r'''
import json, sys, time
import numpy as np, torch
torch.set_num_threads(1)
from adni_pu import config as cfgmod
from adni_pu.data.pu import make_pu_data
from adni_pu.pu.config import TrainConfig
from adni_pu.pu.trainer import Trainer

def blobs(n, seed, dim=20):
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.4).astype(np.int64)
    x = rng.normal(size=(n, dim)).astype(np.float32)
    x[:, 0] += 1.6 * (2 * y - 1)
    return torch.from_numpy(x), y

method = sys.argv[1]
x, y = blobs(15000, 0); xt, yt = blobs(1000, 1)
data = make_pu_data(x, y, xt, yt, n_labelled=1200, prior=0.4, val_fraction=0.2, seed=0, name="b")
cfg = {"model": "mlp6", "model_args": {"in_features": 20, "hidden": 64, "depth": 2},
       "epochs": 6, "batch_size": 128, "lr": 1e-3, "weight_decay": 0.0, "progress": False,
       "device": "cpu", "method": method}
if method == "selfpu":
    cfg["selfpu"] = {"warmup_epochs": 1, "self_paced_end": 3, "select_every": 1,
                     "teacher_rampup_epochs": 1}
passes = []
_train_epoch = Trainer.train_epoch

def timed(self, *a, **k):
    c = time.process_time()
    out = _train_epoch(self, *a, **k)
    passes.append(time.process_time() - c)
    return out

Trainer.train_epoch = timed
trainer = Trainer(cfgmod.from_dict(TrainConfig, cfg), data, log=lambda m: None)
c0, w0 = time.process_time(), time.perf_counter()
fit = trainer.fit()
cpu, wall = time.process_time() - c0, time.perf_counter() - w0
train = sum(r["time/train_seconds"] for r in fit.history)
print(json.dumps({"cpu_per_epoch": cpu / 6, "pass_cpu_per_epoch": sum(passes) / len(passes), "wall_per_epoch": wall / 6,
                  "train_wall_per_epoch": train / 6,
                  "last": fit.history[-1].get("val/accuracy", fit.history[-1].get("selected/score"))}))
'''

def measure(tree, method):
    env = {**os.environ, "PYTHONPATH": tree, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", CHILD, method], env=env, cwd=tree,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])

base, branch = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
ratios = {m: {"cpu": [], "train_wall": [], "pass_cpu": []} for m in ("nnpu", "selfpu")}
for r in range(rounds):
    for method in ("nnpu", "selfpu"):
        order = [("base", base), ("branch", branch)] if r % 2 == 0 else [("branch", branch), ("base", base)]
        got = {name: measure(tree, method) for name, tree in order}
        ratios[method]["cpu"].append(got["branch"]["cpu_per_epoch"] / got["base"]["cpu_per_epoch"])
        ratios[method]["pass_cpu"].append(got["branch"]["pass_cpu_per_epoch"]
                                          / got["base"]["pass_cpu_per_epoch"])
        ratios[method]["train_wall"].append(got["branch"]["train_wall_per_epoch"]
                                            / got["base"]["train_wall_per_epoch"])
        print(f"round {r} {method}: base {got['base']['cpu_per_epoch']:.3f} s "
              f"branch {got['branch']['cpu_per_epoch']:.3f} s CPU/epoch (training pass: base "
              f"{got['base']['pass_cpu_per_epoch']:.3f} s, branch "
              f"{got['branch']['pass_cpu_per_epoch']:.3f} s); same last score: "
              f"{got['base']['last'] == got['branch']['last']}", flush=True)
for method, rs in ratios.items():
    print(f"{method}: median CPU ratio branch/base {statistics.median(rs['cpu']):.3f} "
          f"(all {[round(v, 3) for v in rs['cpu']]}); training pass CPU ratio "
          f"{statistics.median(rs['pass_cpu']):.3f} (all {[round(v, 3) for v in rs['pass_cpu']]}); "
          f"median train-wall ratio "
          f"{statistics.median(rs['train_wall']):.3f}")
