"""The custom op ``torch.ops.kforge.run`` that compiled graphs call, and the table it runs from.

A graph names a kernel by its ``run_name``: the same in every process for the same kernel binary
and variant, and it carries the variant, so a graph whose kernel is removed, switched off or not
loaded here (an on-disk compile cache) runs that call eagerly instead.
"""
from __future__ import annotations

import json
import threading
import weakref

import torch

from ..ops import Variant, torch_dtype
from ._launch import DeployedKernel
from ._worker import eager_outputs


class RunTable:
    """Process-wide: which kernel each run name launches (None: run the operator eagerly).

    Several holders can register kernels of the same run name (a Deployment, a compiled model of the
    session, an artifact loaded twice): the same binary and variant. The name launches the newest
    kernel still registered, so one holder's ``release`` never takes the kernel from the others. The
    table holds kernels weakly: a kernel nobody else holds (its compiled model gone) drops out.
    """

    def __init__(self):
        self._holders: dict[str, list[weakref.ref[DeployedKernel]]] = {}
        # what each name runs now: (a weak reference to the newest live kernel or None, its variant)
        self._entries: dict[str, tuple[weakref.ref[DeployedKernel] | None, Variant]] = {}
        self._lock = threading.Lock()

    def register(self, dk: DeployedKernel) -> None:
        with self._lock:
            holders = self._holders.setdefault(dk.run_name, [])
            holders[:] = [r for r in holders if r() is not None and r() is not dk] + [weakref.ref(dk)]
            self._entries[dk.run_name] = (holders[-1], dk.variant)

    def release(self, dk: DeployedKernel) -> None:
        """``dk``'s holder is done with it: graphs calling its name run another holder's kernel of the
        same name, or the operator eagerly when none is left."""
        with self._lock:
            if dk.run_name in self._holders:
                self._holders[dk.run_name] = [r for r in self._holders[dk.run_name] if r() is not dk]
                self._refresh(dk.run_name, dk.variant)

    def _refresh(self, name: str, variant: Variant) -> DeployedKernel | None:
        holders = [r for r in self._holders.get(name, ()) if r() is not None]
        self._holders[name] = holders
        self._entries[name] = (holders[-1] if holders else None, variant)
        return holders[-1]() if holders else None

    def entry(self, name: str) -> tuple[DeployedKernel | None, Variant]:
        found = self._entries.get(name)
        if found is None:  # a graph compiled elsewhere names a kernel not loaded here
            return None, Variant.from_json(json.loads(name.split("|", 1)[1]))
        ref, variant = found
        dk = ref() if ref is not None else None
        if dk is None and ref is not None:   # the newest kernel is gone: an older holder's, or eager
            with self._lock:
                dk = self._refresh(name, variant)
        return dk, variant


RUN_TABLE = RunTable()


def _run_impl(name: str, inputs: list[torch.Tensor | None]) -> list[torch.Tensor]:
    dk, variant = RUN_TABLE.entry(name)
    ready = dk.conform(inputs) if dk is not None else None
    if ready is None:   # no kernel here, or the call is not the kernel's variant: the operator as eager runs it
        # NB: run_eager, not the reference (the gated delta rule's reference is a Python loop over the tokens), laid
        # out as the fake gives the outputs (the variant's layout, e.g. a channels-last twin's), which the graph reads
        return eager_outputs(variant, inputs)
    return dk(tuple(ready))


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
    # NB: the same call for a graph whose layout Inductor changes (channels-last convolutions): Inductor
    # gives a custom operator's inputs the traced strides (``run``: a copy in front of the call when its
    # buffer is laid out otherwise) but hands a flexible one its buffers as they are; the kernel's
    # variant is the layout Inductor is expected to give (kforge.regions._layout), and ``conform``
    # copies an input that comes otherwise
    lib.define("run_flexible(str key, Tensor?[] inputs) -> Tensor[]", tags=(torch.Tag.flexible_layout,))
    lib.impl("run_flexible", _run_impl, "CompositeExplicitAutograd")
    torch.library.register_fake("kforge::run_flexible", _run_fake, lib=lib)
    return lib


_LIB = _register()
