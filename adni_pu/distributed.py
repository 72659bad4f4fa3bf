"""Multi-process training under ``torchrun`` with DistributedDataParallel.

One process per GPU (or several CPU processes with the gloo backend). Every rank builds the
same :class:`~adni_pu.pu.trainer.Trainer` from the same seed and passes it the
:class:`DistributedRun` (``Trainer(..., distributed=run)``), which

- gives each rank its share of every epoch's batches (the batch list is drawn from the seed
  and the epoch, so all ranks agree on it; its length is rounded up to a multiple of the
  world size so every rank takes the same number of optimiser steps);
- wraps each student in ``DistributedDataParallel`` for the training forward, so gradients
  are averaged over ranks before every optimiser step (all ranks keep identical weights);
- averages the BatchNorm running statistics over ranks at the end of every epoch, so
  trusted-set selection, validation and checkpoints see the same model on every rank;
- runs the training forward under ``torch.autocast`` (bfloat16) on CUDA when ``amp`` is on
  (never on the CPU);
- lets rank 0 alone write the run folder.

Validation and trusted-set scoring run on every rank (identical results, no communication).
Self-PU's self-calibration (meta) step runs per rank on the rank's own batch, through the
plain module (the virtual step takes gradients with ``torch.autograd.grad``, which does not
trigger DDP's all-reduce); the real step that follows is all-reduced as usual.

Typical use (what ``adni-pu train`` does when started by ``torchrun``)::

    run = init_from_env()                 # None when not started by torchrun
    trainer = Trainer(cfg, data, run_dir, distributed=run)
    trainer.fit()
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from adni_pu.errors import DistributedError


def world_size_from_env() -> int:
    """``WORLD_SIZE`` as torchrun sets it (1 when not started by torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_distributed_env() -> bool:
    """Whether this process was started by torchrun with more than one process."""
    return world_size_from_env() > 1


@dataclass
class DistributedRun:
    """This process's place in a multi-process run and the DDP wrappers of its students."""

    rank: int
    world_size: int
    local_rank: int = 0
    backend: str = "gloo"
    amp: bool = True
    wrappers: list[nn.Module] = field(default_factory=list)

    # ---------------------------------------------------------------- batches

    def round_batches(self, n_batches: int, n_examples: int) -> int:
        """The epoch's batch count rounded up to a multiple of the world size."""
        rounded = int(math.ceil(n_batches / self.world_size) * self.world_size)
        if n_examples < 2 * rounded:
            raise DistributedError(
                f"{n_examples} training examples cannot fill {rounded} batches of at least 2 "
                f"for {self.world_size} processes (BatchNorm needs 2 per batch); use fewer "
                "processes or a smaller batch_size"
            )
        return rounded

    def shard(self, batches: list[np.ndarray], epoch: int) -> list[np.ndarray]:
        """This rank's batches (every ``world_size``-th, starting at ``rank``).

        Also reseeds torch's global generator per rank, so augmentation and dropout draws
        differ between ranks but stay reproducible.
        """
        torch.manual_seed(torch.initial_seed() + 7919 * self.rank)
        return batches[self.rank::self.world_size]

    # ---------------------------------------------------------------- models

    def check_device(self, device: torch.device) -> None:
        """Refuse a backend that cannot reduce tensors on ``device`` (called by the trainer)."""
        if device.type == "cuda" and self.backend != "nccl":
            raise DistributedError(f"backend {self.backend!r} with CUDA tensors; use nccl")
        if device.type == "cpu" and self.backend == "nccl":
            raise DistributedError("backend 'nccl' needs CUDA; use gloo for CPU training")

    def wrap(self, models: list[nn.Module], device: torch.device) -> None:
        """Wrap every student in DistributedDataParallel (called by ``Trainer.fit``)."""
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.amp = self.amp and device.type == "cuda"
        self.wrappers = []
        for model in models:
            ids = [device.index if device.index is not None else torch.cuda.current_device()
                   ] if device.type == "cuda" else None
            self.wrappers.append(DDP(model, device_ids=ids, broadcast_buffers=False))

    def forward(self, k: int, x: Any) -> torch.Tensor:
        """Training forward of student ``k`` through its DDP wrapper (autocast on CUDA)."""
        model = self.wrappers[k]
        if self.amp:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return model(x).float()
        return model(x)

    @torch.no_grad()
    def sync_buffers(self, models: list[nn.Module]) -> None:
        """Average floating-point buffers (BatchNorm running statistics) over ranks."""
        import torch.distributed as dist

        for model in models:
            for buf in model.buffers():
                if buf.is_floating_point():
                    dist.all_reduce(buf, op=dist.ReduceOp.SUM)
                    buf.div_(self.world_size)

    def barrier(self) -> None:
        """Wait for every rank."""
        import torch.distributed as dist

        dist.barrier()


def init_from_env(backend: str = "auto", amp: bool = True) -> DistributedRun | None:
    """Join the process group torchrun describes in the environment (None when single).

    ``backend="auto"`` picks nccl when CUDA is available, else gloo. On CUDA each process
    uses the GPU numbered by ``LOCAL_RANK``.
    """
    world = world_size_from_env()
    if world <= 1:
        return None
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=rank, world_size=world)
    return DistributedRun(rank, world, local_rank, backend, amp)



def shutdown() -> None:
    """Leave the process group (if one was joined)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.barrier()
        dist.destroy_process_group()
