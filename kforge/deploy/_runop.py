"""The custom op ``torch.ops.kforge.run`` that compiled graphs call, and the table it runs from.

A graph names a kernel by its ``run_name``: the same in every process for the same kernel binary
and variant, and it carries the variant, so a graph whose kernel is removed, switched off or not
loaded here (an on-disk compile cache) runs that call eagerly instead.
"""
from __future__ import annotations

import json
import threading

import torch

from ..ops import Variant, get_spec, torch_dtype
from ._launch import DeployedKernel


class RunTable:
    """Process-wide: which kernel each run name launches (None: run the operator eagerly)."""

    def __init__(self):
        self._entries: dict[str, tuple[DeployedKernel | None, Variant]] = {}
        self._lock = threading.Lock()

    def register(self, dk: DeployedKernel) -> None:
        with self._lock:
            self._entries[dk.run_name] = (dk, dk.variant)

    def release(self, dk: DeployedKernel) -> None:
        """From now on graphs calling ``dk`` run its operator eagerly (and no longer hold the kernel)."""
        with self._lock:
            entry = self._entries.get(dk.run_name)
            if entry is not None and entry[0] is dk:  # another holder of the same kernel keeps it
                self._entries[dk.run_name] = (None, dk.variant)

    def entry(self, name: str) -> tuple[DeployedKernel | None, Variant]:
        found = self._entries.get(name)
        if found is None:  # a graph compiled elsewhere names a kernel not loaded here
            found = (None, Variant.from_json(json.loads(name.split("|", 1)[1])))
        return found


RUN_TABLE = RunTable()


def _run_impl(name: str, inputs: list[torch.Tensor | None]) -> list[torch.Tensor]:
    dk, variant = RUN_TABLE.entry(name)
    if dk is None:
        out = get_spec(variant.op).reference(list(inputs), variant.param_dict)
        return list(out) if isinstance(out, (tuple, list)) else [out]
    return dk(tuple(inputs))


def _run_fake(name: str, inputs: list[torch.Tensor | None]) -> list[torch.Tensor]:
    _, variant = RUN_TABLE.entry(name)
    return [torch.empty_strided(s.shape, s.stride, dtype=torch_dtype(s.dtype), device=torch.device(s.device))
            for s in variant.outputs]


def _register() -> torch.library.Library:
    # NB: the graph keeps the kernel as one opaque node; outputs are fresh tensors from the
    # caching allocator and the launch takes the current stream, so CUDA graphs can capture it.
    lib = torch.library.Library("kforge", "FRAGMENT")
    lib.define("run(str key, Tensor?[] inputs) -> Tensor[]")
    lib.impl("run", _run_impl, "CompositeExplicitAutograd")
    torch.library.register_fake("kforge::run", _run_fake, lib=lib)
    return lib


_LIB = _register()
