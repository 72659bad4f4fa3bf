"""The models that compete for selection, as saved and as rebuilt: one network's CPU state,
the teachers' average (:class:`AveragedModel`), and the selected model loaded back.

Selection (:mod:`adni_pu.pu.selection`) keeps a candidate's state after every epoch, the
checkpoint saves it, and inference rebuilds it; this module is what the three share.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def cpu_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """A detached CPU copy of a model's state (a selection candidate's weights)."""
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def candidate_state(models: dict[str, nn.Module], candidates: dict[str, nn.Module],
                    name: str) -> dict[str, Any]:
    """The CPU state of the model ``name`` for the selection: one of ``models`` (every
    network trained now), or the ``"average"`` of the ``candidates``."""
    if name == "average":
        return {"average": [cpu_state(m) for m in candidates.values()]}
    return {"single": cpu_state(models[name])}


class AveragedModel(nn.Module):
    """The average of several models' probabilities, returned as a logit."""

    def __init__(self, models: list[nn.Module]) -> None:
        super().__init__()
        self.members = nn.ModuleList(models)

    def forward(self, x: Any) -> torch.Tensor:
        p = torch.stack([torch.sigmoid(m(x)) for m in self.members]).mean(0).clamp(1e-7, 1 - 1e-7)
        return torch.log(p / (1 - p))


def load_selected(state: dict[str, Any], factory: Callable[[], nn.Module],
                  device: torch.device) -> nn.Module:
    """Rebuild the selected model (single or averaged) from its saved state."""
    if "single" in state:
        model = factory().to(device)
        model.load_state_dict(state["single"])
        return model.eval()
    members = []
    for sd in state["average"]:
        m = factory().to(device)
        m.load_state_dict(sd)
        members.append(m.eval())
    return AveragedModel(members).eval()
