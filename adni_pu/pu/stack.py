"""Several networks of one architecture as one module: weights with a leading model axis.

A :class:`Stack` of M copies runs all M in one call (``torch.func.vmap`` over
``torch.func.functional_call``): a linear layer becomes one batched matmul, a convolution
one grouped convolution, and BatchNorm keeps each model's own batch and running statistics.
Adam is elementwise, so one optimiser over the stacked weights takes the same steps as M
optimisers over the M networks. :mod:`adni_pu.pu.population` trains Self-PU's students (and
several seeds' runs) this way; the networks are copied in before and back after an epoch.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


def key(name: str) -> str:
    """A parameter or buffer name of the member network as a name in the stack."""
    return name.replace(".", "__")


def _inner_name(skeleton: nn.Module, name: str) -> str:
    """The member's parameter name in the skeleton (``norm.`` after a wrapped BatchNorm)."""
    parts = name.split(".")
    module = skeleton
    out = []
    for part in parts[:-1]:
        module = getattr(module, part)
        out.append(part)
        if isinstance(module, MaskedBatchNorm):
            module = module.norm
            out.append("norm")
    return ".".join([*out, parts[-1]])


class MaskedBatchNorm(nn.Module):
    """A BatchNorm whose training statistics come from the valid rows only (runs whose
    batches differ in size are padded to one size; padding must not move the statistics)."""

    def __init__(self, norm: _BatchNorm) -> None:
        super().__init__()
        self.norm = norm
        self.valid: torch.Tensor | None = None  # set by the stack around each call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm, valid = self.norm, self.valid
        if valid is None or not norm.training:
            return norm(x)
        shape = [-1] + [1] * (x.dim() - 1)
        weight = valid.to(x.dtype).reshape(shape)
        dims = [d for d in range(x.dim()) if d != 1]
        count = weight.sum() * (x[0, 0].numel() if x.dim() > 2 else 1)
        mean = (x * weight).sum(dims) / count
        centred = x - mean.reshape(1, -1, *[1] * (x.dim() - 2))
        var = (centred * centred * weight).sum(dims) / count
        if norm.track_running_stats and norm.running_mean is not None:
            with torch.no_grad():
                norm.num_batches_tracked.add_(1)
                momentum = (1.0 / float(norm.num_batches_tracked) if norm.momentum is None
                            else norm.momentum)
                unbiased = var * count / (count - 1).clamp(min=1)
                norm.running_mean.mul_(1 - momentum).add_(momentum * mean.detach())
                norm.running_var.mul_(1 - momentum).add_(momentum * unbiased.detach())
        view = [1, -1] + [1] * (x.dim() - 2)
        out = centred * torch.rsqrt(var + norm.eps).reshape(view)
        if norm.affine:
            out = out * norm.weight.reshape(view) + norm.bias.reshape(view)
        return out


def _masked_norms(module: nn.Module) -> nn.Module:
    """``module`` with every BatchNorm wrapped in :class:`MaskedBatchNorm` (in place)."""
    for name, child in module.named_children():
        if isinstance(child, _BatchNorm):
            setattr(module, name, MaskedBatchNorm(child))
        else:
            _masked_norms(child)
    return module


class Stack(nn.Module):
    """M networks of one architecture; ``forward`` takes M x B inputs, returns M x B logits.

    ``forward(x, valid)``: ``valid`` (M x B, 0/1) marks the rows that are examples when the
    members' batches were padded to one size; BatchNorm then normalises by those rows only.
    """

    def __init__(self, members: Sequence[nn.Module]) -> None:
        super().__init__()
        if not members:
            raise ValueError("a stack needs at least one network")
        params, buffers = torch.func.stack_module_state(list(members))
        # the names as in the member (the skeleton's, whose BatchNorms are wrapped, differ)
        self.names = list(params)
        self.buffer_names = list(buffers)
        self.params = nn.ParameterDict()  # filled in the member's order (a dict is sorted)
        for n, v in params.items():
            self.params[key(n)] = nn.Parameter(v.detach(), requires_grad=v.requires_grad)
        for n, b in buffers.items():
            self.register_buffer(key(n), b)
        # the architecture without weights (not a submodule: its parameters are not ours)
        skeleton = _masked_norms(copy.deepcopy(members[0]).to("meta"))
        object.__setattr__(self, "_skeleton", skeleton)
        object.__setattr__(self, "_norms", [m for m in skeleton.modules()
                                            if isinstance(m, MaskedBatchNorm)])
        object.__setattr__(self, "_inner", {n: _inner_name(skeleton, n)
                                            for n in self.names + self.buffer_names})
        self.train(members[0].training)

    @property
    def skeleton(self) -> nn.Module:
        """The member architecture (on the meta device); its modules' modes are the stack's."""
        return self._skeleton  # type: ignore[no-any-return]

    def stacked_parameters(self) -> list[nn.Parameter]:
        """The stacked parameters in the order of the member's ``parameters()``."""
        return [self.params[key(n)] for n in self.names]

    def inner_name(self, name: str) -> str:
        """A member's parameter or buffer name as the skeleton names it."""
        return self._inner[name]  # type: ignore[attr-defined, no-any-return]

    def train(self, mode: bool = True) -> Stack:
        super().train(mode)
        self.skeleton.train(mode)
        return self

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Model m's output on ``x[m]`` for every m (``x``: M x B x ...)."""
        params = {self.inner_name(n): self.params[key(n)] for n in self.names}
        buffers = {self.inner_name(n): getattr(self, key(n)) for n in self.buffer_names}
        skeleton = self.skeleton

        norms = self._norms  # type: ignore[attr-defined]

        def one(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor], xb: torch.Tensor,
                vb: torch.Tensor | None) -> torch.Tensor:
            # each call sets the mask afresh (attributes, not a context variable: the
            # forward then compiles as one graph with torch.compile)
            for norm in norms:
                norm.valid = vb
            out = torch.func.functional_call(skeleton, (p, b), (xb,))
            for norm in norms:
                norm.valid = None
            return out

        return torch.func.vmap(one, in_dims=(0, 0, 0, None if valid is None else 0))(
            params, buffers, x, valid)

    @torch.no_grad()
    def unstack_into(self, members: Sequence[nn.Module]) -> None:
        """Copy model m's weights and buffers into ``members[m]``."""
        for m, member in enumerate(members):
            for n, p in member.named_parameters():
                p.copy_(self.params[key(n)][m])
            for n, b in member.named_buffers():
                b.copy_(getattr(self, key(n))[m])
