"""Memory the judge shares with a runner: an input arena, an output arena, a descriptor table.

CPU: memfd + mmap; the runner maps inputs read-only (a write faults), the input memfd is sealed
against writes through any descriptor (F_SEAL_FUTURE_WRITE), and the guard pages after each output
are PROT_NONE. CUDA: two device allocations shared by CUDA IPC, in a memory pool of their own (an IPC
handle opens a whole segment of torch's allocator: nothing else of the judge may live there).
Either way the judge writes the inputs, poisons the outputs, and reads everything back itself.

Layouts come in uniform groups: set ``j`` of a group holds every input and every output of one
call at a constant stride, so a whole group is checked with a handful of tensor operations.
"""
from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..kernels import KfTensor
from ..kernels._library import MAX_DIMS
from ..ops import DTYPE_CODES, TensorSig, torch_dtype
from ._frames import DESC_HEADER, DESC_MAGIC

PAGE = mmap.PAGESIZE
NULL_OFFSET = (1 << 64) - 1


def _round_up(n: int, m: int = PAGE) -> int:
    return (n + m - 1) // m * m


def extent(sig: TensorSig) -> int:
    """Elements between the first and one past the last element a strided tensor touches."""
    if not all(sig.shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(sig.shape, sig.stride))


def _itemsize(sig: TensorSig) -> int:
    return torch.empty((), dtype=torch_dtype(sig.dtype)).element_size()


def canary_bytes(sig: TensorSig) -> int:
    """Bytes of canary after an output: catches writes well past the end, not just the next element."""
    return max(4096 * _itemsize(sig), extent(sig) * _itemsize(sig) // 4)


@dataclass(frozen=True)
class Group:
    """``count`` uniform sets starting at layout ``first``."""

    first: int
    count: int
    in_base: int
    in_stride: int
    out_base: int
    out_stride: int


class ArenaLayout:
    """Where every tensor of every layout lives in the arenas, decided before any memory is allocated."""

    def __init__(self, inputs: Sequence[TensorSig | None], outputs: Sequence[TensorSig]):
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.in_offsets: list[int | None] = []
        off = 0
        for s in self.inputs:
            if s is None:
                self.in_offsets.append(None)
                continue
            self.in_offsets.append(off)
            off += _round_up(max(extent(s) * _itemsize(s), 1)) + PAGE
        self.in_set_bytes = max(off, PAGE)
        # output slot: [guard page][canary page][output ... canary][next slot's guard page]
        self.out_offsets: list[int] = []
        self.out_slot: list[int] = []
        off = 0
        for s in self.outputs:
            self.out_offsets.append(off + 2 * PAGE)
            size = 2 * PAGE + _round_up(extent(s) * _itemsize(s) + canary_bytes(s))
            self.out_slot.append(size)
            off += size
        self.out_set_bytes = off
        self.groups: list[Group] = []
        self.in_bytes = 0
        self.out_bytes = 0

    @property
    def set_bytes(self) -> int:
        """Bytes one call reads and writes (what a cache would have to hold per set)."""
        return (sum(extent(s) * _itemsize(s) for s in self.inputs if s is not None)
                + sum(extent(s) * _itemsize(s) for s in self.outputs))

    def add_group(self, count: int) -> Group:
        first = sum(g.count for g in self.groups)
        g = Group(first, count, self.in_bytes, self.in_set_bytes, self.out_bytes, self.out_set_bytes)
        self.groups.append(g)
        self.in_bytes += count * self.in_set_bytes
        self.out_bytes += count * self.out_set_bytes
        return g

    @property
    def n_layouts(self) -> int:
        return sum(g.count for g in self.groups)

    def guard_pages(self) -> list[int]:
        """Output-arena offsets of the pages the runner makes inaccessible."""
        pages = []
        for g in self.groups:
            for j in range(g.count):
                base = g.out_base + j * g.out_stride
                for o, slot in zip(self.out_offsets, self.out_slot):
                    pages.append(base + o - 2 * PAGE)
        pages.append(self.out_bytes)  # the last slot's guard
        return pages

    def descriptor(self, params: Sequence[float]) -> bytes:
        guards = self.guard_pages()
        header = DESC_HEADER.pack(DESC_MAGIC, self.n_layouts, len(self.inputs), len(self.outputs), len(params),
                                  len(guards), self.in_bytes, self.out_bytes + PAGE, PAGE, *([0] * 7))
        recs = (KfTensor * max(self.n_layouts * (len(self.inputs) + len(self.outputs)), 1))()
        i = 0
        for g in self.groups:
            for j in range(g.count):
                for sig, off in zip(self.inputs, self.in_offsets):
                    _describe(recs[i], sig, None if off is None else g.in_base + j * g.in_stride + off)
                    i += 1
                for sig, off in zip(self.outputs, self.out_offsets):
                    _describe(recs[i], sig, g.out_base + j * g.out_stride + off)
                    i += 1
        body = (ctypes.c_double * max(len(params), 1))(*[float(p) for p in params])
        return (header + bytes(body)[:8 * len(params)] + b"".join(p.to_bytes(8, "little") for p in guards)
                + bytes(recs)[:i * ctypes.sizeof(KfTensor)])

    def output_at(self, offset: int) -> int | None:
        """Which output's slot an output-arena offset falls in (None: outside every slot)."""
        for g in self.groups:
            if g.out_base <= offset < g.out_base + g.count * g.out_stride:
                rel = (offset - g.out_base) % g.out_stride
                for o, (start, slot) in enumerate(zip(self.out_offsets, self.out_slot)):
                    if start - 2 * PAGE <= rel < start - 2 * PAGE + slot:
                        return o
        return None




def _describe(slot: KfTensor, sig: TensorSig | None, offset: int | None) -> None:
    if sig is None or offset is None:
        slot.data = NULL_OFFSET
        slot.ndim = 0
        slot.dtype = -1
        return
    if len(sig.shape) > MAX_DIMS:
        raise ValueError(f"kforge kernels take at most {MAX_DIMS} dimensions, got {len(sig.shape)}")
    slot.data = offset
    slot.ndim = len(sig.shape)
    slot.dtype = DTYPE_CODES[sig.dtype]
    for d, (s, st) in enumerate(zip(sig.shape, sig.stride)):
        slot.sizes[d] = s
        slot.strides[d] = st


#: Linux >= 5.1: no write and no new writable shared mapping through any descriptor of the file from now on; the
#: writable mappings that already exist (the judge's) keep working. Python 3.11's fcntl does not name it.
F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010)


class _Memfd:
    """A memfd mapped into the judge, with a read-only fd to hand to a runner.

    ``runner_writes=False``: sealed against writes once the judge has mapped it (``sealed`` says whether the kernel
    took the seal): a runner that reopens its read-only descriptor through ``/proc/self/fd`` with write access can
    neither write through it nor map it writable.
    """

    def __init__(self, name: str, size: int, runner_writes: bool = True):
        self.size = max(_round_up(size), PAGE)
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, self.size)
        # NB: its size sealed before any runner sees it: a candidate that shrank its output arena with
        # ftruncate (the runner holds that fd writable) made the judge's next read of it a SIGBUS,
        # killing two judges an evaluation and never being judged (found by review 4, 2026-12-02)
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        self.map = mmap.mmap(self.fd, self.size)
        self.sealed = False
        if not runner_writes:
            # NB: found by an attacker (issue 42): the read-only descriptor reopened O_RDWR through /proc/self/fd
            # wrote the timed sets' inputs, and eager's reference was computed from them. Older kernels refuse the
            # seal (EINVAL); the judge's re-check of every timed batch's inputs still catches a write there.
            try:
                fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, F_SEAL_FUTURE_WRITE)
                self.sealed = bool(fcntl.fcntl(self.fd, fcntl.F_GET_SEALS) & F_SEAL_FUTURE_WRITE)
            except OSError:
                pass
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL)
        self.tensor = torch.frombuffer(self.map, dtype=torch.uint8)

    def read_only_fd(self) -> int:
        return os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)

    def close(self) -> None:
        del self.tensor
        try:
            self.map.close()
        except BufferError:  # NB: a view still exported; the mapping goes with the last reference
            pass
        os.close(self.fd)


class Arenas:
    """The memory of one layout, on the CPU (memfd) or on a CUDA device (IPC)."""

    def __init__(self, layout: ArenaLayout, device: str, params: Sequence[float], generator: torch.Generator):
        self.layout = layout
        self.device = device
        self.cuda = device.startswith("cuda")
        out_total = layout.out_bytes + PAGE
        desc = layout.descriptor(params)
        self._desc = _Memfd("kforge-desc", len(desc), runner_writes=False)
        self._desc.tensor[:len(desc)] = torch.frombuffer(bytearray(desc), dtype=torch.uint8)
        self._times = _Memfd("kforge-times", 8 * max(layout.n_layouts, 1))
        self.times = self._times.tensor[:8 * layout.n_layouts].view(torch.float64)
        self.pattern = torch.randint(0, 256, (PAGE,), dtype=torch.uint8, generator=generator)
        self._mem: list[_Memfd] = []
        if self.cuda:
            self.inp = _cuda_arena(device, "inputs", layout.in_bytes)
            self.out = _cuda_arena(device, "outputs", out_total)
        else:
            self._mem = [_Memfd("kforge-inputs", layout.in_bytes, runner_writes=False),
                         _Memfd("kforge-outputs", out_total)]
            self.inp, self.out = self._mem[0].tensor, self._mem[1].tensor
        #: whether no runner can write the inputs however it reopens or maps them (CPU, where the kernel seals)
        self.inputs_sealed = bool(self._mem) and self._mem[0].sealed
        self.pattern = self.pattern.to(device)
        self._expected: dict[int, torch.Tensor] = {}
        # NB: the pattern goes only where canaries_broken() looks (guard, canary page, canary zone);
        # every output's own extent is poisoned before any call, so writing it twice would be waste.
        for g in layout.groups:
            for o, sig in enumerate(layout.outputs):
                rows, expected, end = self._slots(g, o)
                rows[:, :2 * PAGE].copy_(expected[:2 * PAGE].expand(g.count, 2 * PAGE))
                rows[:, end:].copy_(expected[end:].expand(g.count, expected.numel() - end))
        self.out[layout.out_bytes:layout.out_bytes + PAGE].copy_(self.pattern)

    # ---- what a runner is given
    def runner_fds(self) -> tuple[int, int, int, int]:
        """(descriptor, inputs, outputs, times) fds for a CPU runner; the first two read-only."""
        desc = self._desc.read_only_fd()
        if self.cuda:
            return desc, -1, -1, self._times.fd
        return desc, self._mem[0].read_only_fd(), self._mem[1].fd, self._times.fd

    def ipc_args(self) -> list[str]:
        """[device, input handle, offset, output handle, offset] for a CUDA runner."""
        args = [str(torch.device(self.device).index or 0)]
        for t in (self.inp, self.out):
            shared = t.untyped_storage()._share_cuda_()
            args += [_ipc_mem_handle(bytes(shared[1])).hex(), str(int(shared[3]) + t.storage_offset())]
        return args

    # ---- typed views over a group
    def inputs(self, group: Group, i: int) -> torch.Tensor:
        """Input ``i`` of every set of ``group``: shape (count, *shape)."""
        sig = self.layout.inputs[i]
        return self._view(self.inp, sig, group.in_base + self.layout.in_offsets[i], group.in_stride, group.count)

    def outputs(self, group: Group, o: int) -> torch.Tensor:
        sig = self.layout.outputs[o]
        return self._view(self.out, sig, group.out_base + self.layout.out_offsets[o], group.out_stride, group.count)

    def _view(self, arena: torch.Tensor, sig: TensorSig, offset: int, stride: int, count: int,
              flat: bool = False) -> torch.Tensor:
        dtype = torch_dtype(sig.dtype)
        size = _itemsize(sig)
        typed = arena[:arena.numel() // size * size].view(dtype)
        if flat:
            return typed.as_strided((count, extent(sig)), (stride // size, 1), offset // size)
        return typed.as_strided((count, *sig.shape), (stride // size, *sig.stride), offset // size)

    def flat_inputs(self, group: Group, i: int) -> torch.Tensor:
        sig = self.layout.inputs[i]
        return self._view(self.inp, sig, group.in_base + self.layout.in_offsets[i], group.in_stride, group.count,
                          flat=True)

    def poison(self, group: Group, round_: int) -> None:
        """Fill every output of ``group`` (its whole extent) with round ``round_``'s poison."""
        for o, sig in enumerate(self.layout.outputs):
            view = self._view(self.out, sig, group.out_base + self.layout.out_offsets[o], group.out_stride,
                              group.count, flat=True)
            view.fill_(poison_value(torch_dtype(sig.dtype), round_))

    def _slots(self, group: Group, o: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Output ``o``'s slots in ``group`` as rows, the pattern they hold outside the output, and where
        the output ends in a slot."""
        sig = self.layout.outputs[o]
        slot_start = group.out_base + self.layout.out_offsets[o] - 2 * PAGE
        slot = self.layout.out_slot[o]
        rows = self.out.as_strided((group.count, slot), (group.out_stride, 1), slot_start)
        if slot not in self._expected:
            self._expected[slot] = self.pattern.repeat(slot // PAGE)
        return rows, self._expected[slot], 2 * PAGE + extent(sig) * _itemsize(sig)

    def canaries_broken(self, group: Group) -> dict[int, int]:
        """{set index: first output whose canaries changed} for the sets of ``group`` (empty: intact)."""
        first_bad = torch.full((group.count,), -1, dtype=torch.int64, device=self.out.device)
        for o in reversed(range(len(self.layout.outputs))):
            rows, expected, end = self._slots(group, o)
            bad = (rows[:, :2 * PAGE] != expected[:2 * PAGE]).any(dim=1) | (rows[:, end:] != expected[end:]).any(dim=1)
            first_bad = torch.where(bad, torch.full_like(first_bad, o), first_bad)
        if group is self.layout.groups[-1]:
            # the guard page after the last slot of the arena belongs to the last output of the last set
            tail = self.out[self.layout.out_bytes:self.layout.out_bytes + PAGE]
            if not torch.equal(tail, self.pattern) and int(first_bad[-1]) < 0:
                first_bad[-1] = len(self.layout.outputs) - 1
        rows = torch.nonzero(first_bad >= 0).flatten().tolist()
        return {r: int(first_bad[r]) for r in rows}

    def close(self) -> None:
        for m in (*self._mem, self._desc, self._times):
            m.close()
        self._mem = []


def _ipc_mem_handle(handle: bytes) -> bytes:
    """The cudaIpcMemHandle_t (64 bytes) inside what torch's ``_share_cuda_`` gives.

    NB: torch >= 2.5 prefixes the handle with a version byte and a kind byte ('c': cudaMalloc
    memory, 'e': an expandable segment, which a C runner cannot open); older torch gives it bare.
    """
    if len(handle) == 64:
        return handle
    if len(handle) == 66 and handle[1:2] == b"c":
        return handle[2:]
    if len(handle) >= 2 and handle[1:2] == b"e":
        raise RuntimeError("torch shares this memory as an expandable segment, which the CUDA runner cannot open: "
                           "unset PYTORCH_CUDA_ALLOC_CONF=expandable_segments for the process that runs kforge")
    raise RuntimeError(f"torch gave a {len(handle)}-byte CUDA IPC handle kforge does not know (torch "
                       f"{torch.__version__}): report it with this message")


_CUDA_ARENAS: dict[tuple[str, str], torch.Tensor] = {}


def _cuda_arena(device: str, role: str, nbytes: int) -> torch.Tensor:
    """A device buffer of at least ``nbytes``, kept for the judge's lifetime and grown by doubling.

    NB: torch never frees memory it has shared by CUDA IPC until the consumers release it through
    its own reference counter, which a C runner does not hold: fresh buffers per candidate would
    leak. The judge rewrites every byte a candidate can see before each use.
    """
    need = _round_up(max(nbytes, PAGE))
    have = _CUDA_ARENAS.get((device, role))
    if have is None or have.numel() < need:
        size = max(need, 2 * have.numel() if have is not None else 0)
        # NB: a runner opens the whole segment of torch's allocator its arena lies in (cudaIpcOpenMemHandle maps
        # the allocation, not the tensor): in the default pool the judge's own tensors (its private copy of the
        # inputs, eager's references) could share that segment, and the runner could rewrite them. A pool of
        # the arenas' own keeps every segment a runner can open free of anything else.
        with torch.cuda.use_mem_pool(_arena_pool(device), device=torch.device(device)):
            have = torch.empty(size, dtype=torch.uint8, device=device)
        _CUDA_ARENAS[(device, role)] = have
    return have[:need]


_CUDA_POOLS: dict[str, Any] = {}


def _arena_pool(device: str):
    """The memory pool only the arenas of ``device`` are allocated from (kept for the process's lifetime)."""
    if device not in _CUDA_POOLS:
        _CUDA_POOLS[device] = torch.cuda.MemPool()
    return _CUDA_POOLS[device]


def poison_value(dtype: torch.dtype, round_: int) -> float | int | bool:
    if dtype.is_floating_point:
        return float("nan")
    if dtype == torch.bool:
        return round_ % 2 == 0
    info = torch.iinfo(dtype)
    return info.max - 7 - round_ % 64 if round_ % 2 == 0 else info.min + 7 + round_ % 64
