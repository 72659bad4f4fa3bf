"""A training step replayed as one CUDA graph.

A population's step (:mod:`adni_pu.pu.population`) launches a few thousand small kernels per
batch, and from Python each launch costs more than the GPU's work on it. Captured once in a
CUDA graph (PyTorch's whole-network capture: forward, backward, optimiser step), the step
runs with one launch: each batch's inputs are copied into the graph's own input tensors, the
graph is replayed, and its outputs are read.

A step may be captured only if, at every batch of the capture's lifetime, it (1) never
waits for the device, (2) issues the same operations with the same shapes and the same
host-side arguments, and (3) keeps every number that changes between batches in a device
tensor. Python side effects in the step happen once, at capture, and never again. The tests
check (1)-(3) on the CPU (tests/test_trainer_speed.py, tests/test_population.py); the
capture itself only where a GPU is present (tests/test_replay.py).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

Outputs = dict[str, torch.Tensor]


class StepReplay:
    """Calls ``step(*inputs) -> outputs`` (a dict of tensors) eagerly, or on a CUDA device
    with ``capture=True``: ``warmup`` eager calls on a side stream (lazy initialisation of
    cuBLAS and autograd happens there, not in the graph), then one capture and replays.

    Every call is one real step: the capture call replays the graph it has just recorded.
    Inputs are pytrees of tensors (tuples, dicts, None); their structure and shapes must not
    change after the capture (a new :class:`StepReplay` is made when they do).
    """

    def __init__(self, step: Callable[..., Outputs], capture: bool = False,
                 warmup: int = 3) -> None:
        self.step = step
        self.capture = capture
        self.warmup = warmup
        self.calls = 0
        self.graph: Any = None
        self._inputs: list[Any] = []
        self._spec: Any = None
        self._outputs: Outputs = {}

    def __call__(self, *inputs: Any) -> Outputs:
        self.calls += 1
        if not self.capture:
            return self.step(*inputs)
        if self.calls <= self.warmup:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), warnings.catch_warnings():
                # a capturable optimiser warns when it steps outside a graph, as it must here
                warnings.filterwarnings("ignore", message="This instance was constructed "
                                        "with capturable=True")
                out = self.step(*inputs)
            torch.cuda.current_stream().wait_stream(side)
            return out
        if self.graph is None:
            self._record(inputs)
        flat, spec = tree_flatten(inputs)
        if spec != self._spec:
            raise ValueError(f"a replayed step's inputs changed structure: captured {self._spec}, "
                             f"found {spec}")
        for static, value in zip(self._inputs, flat):
            if not isinstance(static, torch.Tensor):
                if value != static:
                    raise ValueError(f"a replayed step's input changed: captured {static!r}, "
                                     f"found {value!r}")
                continue
            seen, found = (static.shape, static.dtype, static.device), (
                value.shape, value.dtype, value.device)
            if seen != found:
                raise ValueError(f"a replayed step's input changed shape, dtype or device: "
                                 f"captured {seen}, found {found}")
            static.copy_(value)
        self.graph.replay()
        return {key: value.clone() for key, value in self._outputs.items()}

    def _record(self, inputs: tuple[Any, ...]) -> None:
        """Capture the step on copies of ``inputs`` (the graph's own input tensors)."""
        static = tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, inputs)
        self._inputs, self._spec = tree_flatten(static)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._outputs = self.step(*static)
        self.graph = graph
