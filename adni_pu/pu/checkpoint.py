"""The checkpoint format, in one place: what ``checkpoints/last.pt`` and ``best_model.pt`` hold.

``last.pt`` (written after every epoch, read on resume)::

    {"epoch": int, "fingerprint": str (the settings that must match to resume),
     "students": [{"model", "optimizer", "scheduler", "trusted", "prior_rest", "band_pos",
                   "teacher"}],
     "history": [epoch rows], "best": {"score", "epoch", "candidate", "state"},
     "final": None or {"epoch", "choice", "val_scores"} (the finalists after the last epoch)}

The teachers' state holds their BatchNorm statistics as they are after the epoch (recomputed
with ``teacher_bn = "recompute"``), so a resumed run continues from the same teachers.

``best_model.pt`` (written when the fit ends)::

    {"state": {"single": state_dict} or {"average": [state_dict, ...]},
     "config": the TrainConfig as a dict, "epoch": int, "candidate": str}

With ``checkpoint_precision = "bfloat16"`` the floating tensors of ``last.pt`` are stored
in bfloat16 (half the size; loading casts back to the parameters' dtype).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from adni_pu import config as cfgmod
from adni_pu.errors import ResumeError
from adni_pu.fileio import atomic_torch_save
from adni_pu.pu.config import TrainConfig
from adni_pu.pu.run import RunState, RunView
from adni_pu.pu.trusted_set import TrustedSet

LAST = Path("checkpoints") / "last.pt"
SELECTED = Path("best_model.pt")
# settings that may change between a run and its resumption
_RESUMABLE_CHANGES = ("epochs", "progress", "num_workers", "threads", "device", "track_test",
                      "record_val_logits", "checkpoint_every")


# settings added after checkpoints existed, with the value that reproduces the behaviour from
# before: at that value they are left out of the fingerprint (adni_pu.config.drop_added_later)
_ADDED_LATER: dict[tuple[str, str], Any] = {("selfpu", "meta_bn"): "batch",
                                            ("selfpu", "hypergradient"): "double-backward"}


def config_fingerprint(cfg: TrainConfig) -> str:
    """The settings a checkpoint must have been made with to be resumed."""
    settings = cfgmod.to_dict(cfg)
    for key in _RESUMABLE_CHANGES:
        settings.pop(key, None)
    cfgmod.drop_added_later(settings, _ADDED_LATER)
    return json.dumps(settings, sort_keys=True)


def half_size(obj: Any) -> Any:
    """A copy of ``obj`` with every floating tensor of more than one element in bfloat16.

    Scalars (Adam's step counters) keep their precision; loading casts back to the
    parameters' dtype (``load_state_dict`` of modules and optimisers does).
    """
    if isinstance(obj, torch.Tensor):
        return obj.to(torch.bfloat16) if obj.is_floating_point() and obj.numel() > 1 else obj
    if isinstance(obj, dict):
        return {k: half_size(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(half_size(v) for v in obj)
    return obj


def save_last(run: RunView, epoch: int, path: Path) -> None:
    """Write the resumable state of ``run`` after ``epoch`` to ``path``."""
    state = run.state
    saved = {
        "epoch": epoch,
        "fingerprint": config_fingerprint(run.cfg),
        "students": [
            {"model": st.model.state_dict(), "optimizer": st.optimizer.state_dict(),
             "scheduler": st.scheduler.state_dict(), "trusted": st.trusted.state(),
             "prior_rest": st.prior_rest, "band_pos": st.band_pos,
             "teacher": st.teacher.state_dict() if st.teacher is not None else None}
            for st in state.students
        ],
        "history": state.history,
        "best": state.best,
        "final": state.final,
    }
    if run.cfg.checkpoint_precision == "bfloat16":
        saved["students"] = half_size(saved["students"])
        saved["best"] = {**state.best, "state": half_size(state.best["state"])}
    atomic_torch_save(saved, path)


def read_last(path: Path, cfg: TrainConfig, device: torch.device, settings_file: Path
              ) -> dict[str, Any] | None:
    """The checkpoint at ``path`` (None when there is none); :class:`ResumeError` when it
    was made with other settings than ``cfg``."""
    if not path.is_file():
        return None
    state = torch.load(path, map_location=device, weights_only=False)
    if state["fingerprint"] != config_fingerprint(cfg):
        raise ResumeError(
            f"{path}: checkpoint made with other settings; expected the settings in "
            f"{settings_file}; use a new run folder or delete the checkpoint"
        )
    return state


def check_resume(run: RunView) -> dict[str, Any] | None:
    """The run folder's checkpoint (None when there is none).

    Raises :class:`ResumeError` when it was made with other settings. Callers that write
    into the run folder before fitting call this first, so a refused rerun leaves the
    folder as it was.
    """
    if run.run_dir is None:
        return None
    return read_last(run.run_dir / LAST, run.cfg, run.device, run.run_dir / "config.toml")


def resume(run: RunView, make_teachers: Callable[[], None]) -> None:
    """Restore ``run`` from its run folder's checkpoint, if there is one (``make_teachers``:
    the strategy's, for a checkpoint written in phase 3)."""
    saved = check_resume(run)
    if saved is None:
        return
    restore(run.state, saved, make_teachers)
    run.log(f"resumed from {run.run_dir / LAST} after epoch {saved['epoch'] + 1}")


def restore(state: RunState, saved: dict[str, Any], make_teachers: Callable[[], None]
            ) -> None:
    """Put a checkpoint's students, history and selection back into ``state``."""
    for st, kept in zip(state.students, saved["students"]):
        st.model.load_state_dict(kept["model"])
        st.optimizer.load_state_dict(kept["optimizer"])
        st.scheduler.load_state_dict(kept["scheduler"])
        st.trusted = TrustedSet.from_state(kept["trusted"])
        st.prior_rest = kept["prior_rest"]
        st.band_pos = kept["band_pos"]
    if any(kept["teacher"] is not None for kept in saved["students"]):
        make_teachers()  # the one place teachers are made
        for st, kept in zip(state.students, saved["students"]):
            st.teacher.load_state_dict(kept["teacher"])  # type: ignore[union-attr]
    state.history = saved["history"]
    state.best = saved["best"]
    state.final = saved.get("final")  # absent in checkpoints of earlier versions
    state.start_epoch = saved["epoch"] + 1


def save_selected(run: RunView, path: Path) -> None:
    """Write the selected model (``best_model.pt``)."""
    best = run.state.best
    extra = {"normaliser": best["normaliser"]} if "normaliser" in best else {}
    atomic_torch_save({"state": best["state"], "config": cfgmod.to_dict(run.cfg),
                       "epoch": best["epoch"], "candidate": best["candidate"], **extra}, path)


def read_selected(path: Path) -> dict[str, Any]:
    """Read ``best_model.pt``: ``state`` (for :func:`adni_pu.pu.candidates.load_selected`),
    ``config``, ``epoch``, ``candidate``; a damaged or foreign file is a
    :class:`ResumeError` naming it."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=False)
        saved["state"], saved["config"]  # noqa: B018 - the keys this format promises
    except Exception as exc:  # truncated, not a torch file, another format
        raise ResumeError(f"{path}: cannot read the selected model ({type(exc).__name__}: "
                          f"{exc}); retrain the run") from exc
    return saved


