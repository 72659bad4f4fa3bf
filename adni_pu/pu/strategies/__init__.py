"""How each method trains, as the events of a fit (:data:`adni_pu.pu.run.EVENTS`) that the
engine (:mod:`adni_pu.pu.trainer`) tells it of; one module per family.

A strategy reads the run through :class:`~adni_pu.pu.run.RunView` (the settings, data,
priors and device, and the students in its state); it never sees the trainer.

- :class:`Baseline` (:mod:`.baseline`): naive PN, uPU or nnPU, one model throughout;
- :class:`VPU` (:mod:`.vpu`): one model, the variational loss with MixUp and the
  normalised decision rule;
- :class:`SelfPU` (:mod:`.selfpu`): two students, the self-paced trusted sets, the
  self-calibration and the mean teachers.

The loss of every phase is :func:`adni_pu.pu.objective.step_loss`, a function of tensors
and settings that the population engine calls too; a strategy feeds it: the batch's row
sets as masks (:meth:`Baseline.layouts`) and what only the method knows of each network
(:meth:`Baseline.network_inputs`).
"""

from __future__ import annotations

from adni_pu.pu.run import RunView
from adni_pu.pu.strategies.baseline import Baseline, Batch, Layout, Meta, MixPlan
from adni_pu.pu.strategies.selfpu import SelfPU
from adni_pu.pu.strategies.vpu import VPU, shift_output_bias

__all__ = ["VPU", "Baseline", "Batch", "Layout", "Meta", "MixPlan", "SelfPU",
           "shift_output_bias", "strategy_for"]


def strategy_for(run: RunView) -> Baseline:
    """The strategy of ``run.cfg.method``."""
    if run.cfg.method == "selfpu":
        return SelfPU(run)
    return VPU(run) if run.cfg.method == "vpu" else Baseline(run)
