"""VPU (Chen et al., NeurIPS 2020): one model, the variational loss with MixUp (its partners
and weights drawn here, on the host, so both engines mix alike: :meth:`VPU.mixup`) and the
normalised decision rule folded into the selected model (:meth:`VPU.fit_end`)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from adni_pu.errors import ConfigError
from adni_pu.pu.batching import EpochPlan
from adni_pu.pu.metrics import sigmoid
from adni_pu.pu.run import RunView
from adni_pu.pu.strategies.baseline import Baseline, MixPlan


class VPU(Baseline):
    """VPU (Chen et al., NeurIPS 2020): one model, the variational loss (no class prior)
    with MixUp; the decision rule phi(x) / max phi > 1/2 over the training distribution."""

    def __init__(self, run: RunView) -> None:
        super().__init__(run)
        self.vp = run.cfg.vpu
        self._epoch = 0

    def training_start(self, epoch: int, phase: int) -> None:
        self._epoch = epoch

    def row_sets(self, plan: EpochPlan, phase: int) -> list[dict[str, np.ndarray]]:
        """The common row sets plus "marginal": the rows drawn from the training
        distribution (D_U under the case-control scheme, every row under censoring)."""
        sets = super().row_sets(plan, phase)
        name = "unl" if self.run.data.scheme == "case-control" else "valid"
        return [{**rows, "marginal": rows[name]} for rows in sets]

    def mixup(self, plan: EpochPlan) -> MixPlan | None:
        """Each batch's lambda and every row's partner among the batch's labelled positives
        (drawn with replacement), from the epoch's own stream (the seed, the epoch)."""
        if not self.vp.mixup:
            return None
        rng = np.random.default_rng([self.cfg.seed, self._epoch, 0x5650])  # "VP"
        lam = rng.beta(self.vp.mix_alpha, self.vp.mix_alpha, size=len(plan.sizes))
        positive = self.run.entries.s[plan.order] == 1
        partner = np.empty(len(plan.order), dtype=np.int64)
        for b, (start, size) in enumerate(zip(plan.starts, plan.sizes)):
            where = np.flatnonzero(positive[start:start + size])
            if len(where) == 0:
                lam[b] = 1.0
                partner[start:start + size] = np.arange(size)
            else:
                partner[start:start + size] = rng.choice(where, size)
        return MixPlan(lam, partner)

    def fit_end(self) -> None:
        """With ``vpu.normalise``: the selected model decides phi(x) / m > 1/2, where m is
        the largest phi over the training split (the training distribution's examples);
        the shift -logit(m / 2) is added to its output bias, so that its logits decide at
        0 wherever the model is used (``best["normaliser"]`` records m)."""
        from adni_pu.pu.candidates import load_selected

        best = self.run.state.best
        if (not self.vp.normalise or best["state"] is None or "normaliser" in best
                or "single" not in best["state"]):
            return
        e = self.run
        model = load_selected(best["state"], e.model_factory, e.device)
        m = float(sigmoid(e.predict_logits(model, e.data.train)).max())
        shifted = shift_output_bias(best["state"]["single"], model,
                                    -math.log((m / 2) / (1 - m / 2)))
        e.state.best = {**best, "state": {"single": shifted}, "normaliser": m}
        e.log(f"VPU: max phi over the training split {m:.4f}; decision threshold phi > "
              f"{m / 2:.4f} folded into the selected model's output bias")


def shift_output_bias(state: dict[str, torch.Tensor], model: nn.Module, shift: float
                      ) -> dict[str, torch.Tensor]:
    """``state`` (``model``'s state dict) with ``shift`` added to the bias of the model's
    output layer, its last module, which must be a Linear with one output and a bias: the
    logits move by ``shift`` and the scores keep their order."""
    name, last = [(n, m) for n, m in model.named_modules()][-1]
    if not isinstance(last, nn.Linear) or last.out_features != 1 or last.bias is None:
        raise ConfigError(f"vpu.normalise: the model's last layer {name!r} is "
                          f"{type(last).__name__}; expected a Linear with one output and a "
                          "bias (or set vpu.normalise = false)")
    key = f"{name}.bias"
    return {**state, key: state[key] + shift}

