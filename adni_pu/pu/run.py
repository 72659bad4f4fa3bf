"""The run as the pieces around the engine see it, and the events they are told of.

:class:`~adni_pu.pu.trainer.Trainer` owns a run; the method (:mod:`adni_pu.pu.strategies`),
model selection (:mod:`adni_pu.pu.selection`), the checkpoint (:mod:`adni_pu.pu.checkpoint`)
and the recorders (:mod:`adni_pu.pu.recorders`) read it through one typed view:

- :class:`RunView` (frozen): what is fixed for the whole fit: the settings, the data and its
  training entries, the priors, the device, the model factory, the run folder; and
- :class:`RunState`: what changes as it trains: the students (and their teachers), the
  history, the selected model, the finalists and the last validation logits.

Every network has a :class:`Network` ``role`` (``"model"``, ``"student"``, ``"teacher"``,
``"average"``): selection picks its pool by role (teachers once they exist, else the
students or the one model). :func:`role_of` reads the role back from a recorded name
(``metrics.csv`` columns, saved logits).

The events of a fit, one vocabulary for the trainer, the strategies and the recorders
(:data:`EVENTS`), in the order they happen::

    fit_start                  once, after a resume from the checkpoint
    epoch_start                per epoch, before it is timed as training (Self-PU selects)
      training_start           after the epoch's random streams are seeded
        step_end               after each optimiser step of a student
      training_end             after the training pass, before evaluation
    epoch_end                  after evaluation and selection, with the epoch's row
    fit_paused | fit_end       when a time limit stopped the fit between epochs | at the end

Each class implements the events it acts on, under these names.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict

import numpy as np
import torch
from torch import nn

from adni_pu.pu.trusted_set import TrustedSet

if TYPE_CHECKING:
    from adni_pu.data.pu import PUData, PUSplit
    from adni_pu.pu.batching import Entries
    from adni_pu.pu.config import TrainConfig
    from adni_pu.pu.device_data import DeviceData
    from adni_pu.pu.teacher import MeanTeacher

EVENTS = ("fit_start", "epoch_start", "training_start", "step_end", "training_end",
          "epoch_end", "fit_paused", "fit_end")
"""The events of a fit (module docstring), the one vocabulary of every hook."""

Role = Literal["model", "student", "teacher", "average"]


@dataclass(frozen=True)
class Network:
    """One network a run trains (or the average of its candidates), with its role."""

    name: str
    role: Role
    module: nn.Module


def student_name(k: int, n: int) -> str:
    """The name of student ``k`` of ``n``: ``model`` for a single one, else ``studentK``."""
    return f"student{k + 1}" if n > 1 else "model"


def teacher_name(student: str) -> str:
    """The name of the mean teacher of the student named ``student``."""
    return "teacher" if student == "model" else student.replace("student", "teacher", 1)


def role_of(name: str) -> Role:
    """The role of a recorded network name (:func:`student_name`, :func:`teacher_name`)."""
    if name == "average":
        return "average"
    if name.startswith("teacher"):
        return "teacher"
    return "student" if name.startswith("student") else "model"


@dataclass
class Student:
    """One network with its optimiser, trusted set and (in phase 3) mean teacher."""

    name: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    rate: float = 0.0
    trusted: TrustedSet = field(default_factory=TrustedSet.empty)
    teacher: MeanTeacher | None = None
    prior_rest: float = 0.5
    # rest_risk="band": training-split indices of the labelled positives inside the trusted
    # set's score band at the last selection (None: every labelled positive)
    band_pos: np.ndarray | None = None

    def band_share(self, n_p: int) -> float:
        """The fraction of the ``n_p`` labelled positives inside the band (``rest_risk =
        "band"``; 1 before a band is chosen): the nnPU correction term's subset."""
        return 1.0 if self.band_pos is None else len(self.band_pos) / max(n_p, 1)

    def networks(self) -> list[Network]:
        """The student and, once it exists, its teacher."""
        role: Role = "model" if self.name == "model" else "student"
        out = [Network(self.name, role, self.model)]
        if self.teacher is not None:
            out.append(Network(teacher_name(self.name), "teacher", self.teacher.model))
        return out


class Selected(TypedDict):
    """The model selection so far: its validation score (None before the first epoch),
    epoch, candidate name and CPU state (:func:`adni_pu.pu.candidates.candidate_state`)."""

    score: float | None
    epoch: int
    candidate: str
    state: dict[str, Any] | None
    normaliser: NotRequired[float]  # VPU: max phi on the training split, folded into state


class Finalists(TypedDict):
    """After the last epoch: the finalists' validation scores and the one they choose."""

    epoch: int
    choice: str
    val_scores: dict[str, float]


def nothing_selected() -> Selected:
    """The selection before the first epoch."""
    return {"score": None, "epoch": -1, "candidate": "", "state": None}


@dataclass
class RunState:
    """What changes as a run trains (saved in, and restored from, its checkpoint)."""

    students: list[Student] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    best: Selected = field(default_factory=nothing_selected)
    final: Finalists | None = None
    # the last evaluated epoch's validation logits by network name (for recorders)
    last_val_logits: dict[str, np.ndarray] = field(default_factory=dict)
    start_epoch: int = 0

    def networks(self) -> list[Network]:
        """Every network trained now: the students, then their teachers."""
        nets = [n for st in self.students for n in st.networks()]
        return sorted(nets, key=lambda n: n.role == "teacher")


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class RunView:
    """What is fixed for one fit, and its :class:`RunState`."""

    cfg: TrainConfig
    data: PUData
    entries: Entries
    prior: float
    prior_u: float
    device: torch.device
    device_data: DeviceData
    model_factory: Callable[[], nn.Module]
    state: RunState
    run_dir: Path | None = None
    is_main: bool = True
    """Whether this process writes the run folder (always, unless a torchrun rank > 0)."""
    log: Callable[[str], None] = _stderr

    @property
    def n_p(self) -> int:
        """Labelled entries (D_P) of the training split."""
        return self.entries.n_p

    @property
    def n_u(self) -> int:
        """Unlabelled entries (D_U) of the training split."""
        return self.entries.n_u

    @cached_property
    def candidates_u(self) -> np.ndarray:
        """Training examples a trusted set may hold: D_U minus the labelled positives."""
        return np.flatnonzero(~self.data.train.labelled)

    @cached_property
    def n_copies(self) -> int:
        """Labelled positives that D_U also holds (case-control: all of them; censoring:
        none)."""
        return int(self.data.train.labelled[self.entries.base[self.n_p:]].sum())

    def predict_logits(self, model: nn.Module | Callable[[Any], torch.Tensor],
                       split: PUSplit) -> np.ndarray:
        """Logits of ``model`` (eval mode) for every example of ``split`` (un-augmented)."""
        from adni_pu.pu.device_data import scoring_inputs

        return self.device_data.predict_logits(model, scoring_inputs(split))

    def val_scores(self, logits: np.ndarray) -> dict[str, float]:
        """The validation criteria (:func:`adni_pu.pu.criteria.val_scores`) of ``logits``
        of the validation split."""
        from adni_pu.pu.criteria import val_scores

        return val_scores(logits, self.data.val, self.data.scheme, self.prior, self.prior_u,
                          self.cfg.pn_validation)
