"""A CUDA kernel's launch plan: what its host code did, recorded in the sandbox, as data kforge replays itself.

A CUDA candidate is host code (``kf_launch``) plus device code. Its host code runs only in the sandboxed runner:
there the recorder (``evaluate/runner/recorder.c``) sees each fat binary it registers, each kernel's device name,
and, for one call of ``kf_launch``, every launch (function, grid, block, dynamic shared memory, the parameters'
bytes), memset and device-to-device copy, and every function attribute set. Two such records, made with the
tensors at different addresses (and different values), become one :class:`LaunchPlan`: each 8-byte word of the
parameters that points into a tensor or the workspace in both records, at the same offset, becomes a
``(slot, offset)`` that the replay fills in with the call's own address. Anything else makes the kernel not
replayable (:class:`NotReplayable`, with the reason): it is then not deployed.

The plan is data: the replay (``deploy/_replay.py``) loads its fat binaries with the driver API and launches
them on torch's current stream; no code of the candidate's host side ever runs in the user's process.
"""
from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from typing import Any, Sequence

FORMAT_VERSION = 1
# entry kinds of a record (recorder.c)
_FATBIN, _FUNCTION, _LAUNCH, _MEMSET, _COPY, _ATTRIBUTE, _REFUSE = 1, 2, 3, 4, 5, 6, 7
_MAX_STEPS = 4096
_MAX_GRID = (2**31 - 1, 65535, 65535)
_MAX_BLOCK_THREADS = 1024
# cudaFuncAttribute values a plan may set (cudaFuncAttributeMaxDynamicSharedMemorySize,
# cudaFuncAttributePreferredSharedMemoryCarveout): the same numbers as CUfunction_attribute's 8 and 9
ATTRIBUTES = {8: "max_dynamic_shared_memory", 9: "preferred_shared_memory_carveout"}


class NotReplayable(Exception):
    """The kernel's host code did something kforge's launcher cannot replay (the message says what)."""


# ----------------------------------------------------------------------------- one record, as read


@dataclass(frozen=True)
class Launch:
    function: int
    cooperative: bool
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    params: tuple[tuple[int, int], ...]   # (offset, size) of each parameter, as the runtime lays them out
    data: bytes                            # the parameters' bytes, packed at those offsets


@dataclass(frozen=True)
class Memset:
    dst: int
    value: int
    count: int


@dataclass(frozen=True)
class Copy:
    dst: int
    src: int
    count: int


@dataclass(frozen=True)
class Attribute:
    function: int
    attribute: int
    value: int


@dataclass(frozen=True)
class Record:
    """What one call of a candidate's ``kf_launch`` did, as the recorder saw it."""

    modules: tuple[bytes, ...]
    functions: tuple[tuple[int, str], ...]   # (module, device name) by function index
    steps: tuple[Launch | Memset | Copy | Attribute, ...]
    refusals: tuple[str, ...] = ()


def parse_record(data: bytes) -> Record:
    """A recorder's bytes as a :class:`Record`; NotReplayable when they are malformed (the runner wrote them)."""
    modules: dict[int, bytes] = {}
    functions: dict[int, tuple[int, str]] = {}
    steps: list = []
    refusals: list[str] = []
    off = 0
    try:
        while off < len(data):
            kind, size = struct.unpack_from("<II", data, off)
            off += 8
            body = data[off:off + size]
            if len(body) != size:
                raise NotReplayable("the record is truncated")
            off += size
            if kind == _FATBIN:
                (index,) = struct.unpack_from("<I", body)
                modules[index] = bytes(body[4:])
            elif kind == _FUNCTION:
                index, module = struct.unpack_from("<II", body)
                functions[index] = (module, body[8:].decode("ascii"))
            elif kind == _LAUNCH:
                f, coop, gx, gy, gz, bx, by, bz, _pad, shared, n = struct.unpack_from("<9IQI", body)
                p = struct.calcsize("<9IQI")
                params = tuple(struct.unpack_from("<II", body, p + 8 * i) for i in range(n))
                (total,) = struct.unpack_from("<I", body, p + 8 * n)
                packed = body[p + 8 * n + 4:]
                if len(packed) != total:
                    raise NotReplayable("a launch's parameters are truncated in the record")
                steps.append(Launch(f, bool(coop), (gx, gy, gz), (bx, by, bz), shared, params, bytes(packed)))
            elif kind == _MEMSET:
                dst, value, count = struct.unpack_from("<QIQ", body)
                steps.append(Memset(dst, value & 0xFF, count))
            elif kind == _COPY:
                steps.append(Copy(*struct.unpack_from("<QQQ", body)))
            elif kind == _ATTRIBUTE:
                f, attr, value = struct.unpack_from("<IIi", body)
                steps.append(Attribute(f, attr, value))
            elif kind == _REFUSE:
                refusals.append(body.decode("utf-8", "replace")[:300])
            else:
                raise NotReplayable(f"the record holds an entry of unknown kind {kind}")
            if len(steps) > _MAX_STEPS:
                raise NotReplayable(f"more than {_MAX_STEPS} launches, memsets or copies in one call")
    except (struct.error, UnicodeDecodeError) as exc:
        raise NotReplayable(f"the record is malformed ({exc})") from None
    if sorted(modules) != list(range(len(modules))) or sorted(functions) != list(range(len(functions))):
        raise NotReplayable("the record's modules or functions are not numbered in order")
    return Record(tuple(modules[i] for i in range(len(modules))), tuple(functions[i] for i in range(len(functions))),
                  tuple(steps), tuple(refusals))


# ----------------------------------------------------------------------------- the plan

#: a slot: ("input", i), ("output", i) or ("workspace", 0)
Slot = tuple[str, int]


@dataclass(frozen=True)
class Buffers:
    """Where one recorded call's tensors were: each slot's base address and its extent in bytes (an absent
    optional input is left out)."""

    slots: dict[Slot, tuple[int, int]]

    def find(self, address: int) -> tuple[Slot, int] | None:
        """The slot ``address`` points into (one past the end counts, when no other slot starts there), and the
        offset in it."""
        edge = None
        for slot, (base, extent) in self.slots.items():
            if base <= address < base + extent:
                return slot, address - base
            if address == base + extent and extent:
                edge = (slot, extent)
        return edge


@dataclass(frozen=True)
class PlanStep:
    """One step of a plan. ``op``: "launch", "memset", "copy" or "attribute"."""

    op: str
    function: int = -1
    grid: tuple[int, int, int] = (0, 0, 0)
    block: tuple[int, int, int] = (0, 0, 0)
    shared: int = 0
    cooperative: bool = False
    params: tuple[tuple[int, int], ...] = ()
    data: bytes = b""
    # (byte offset in ``data``, slot, offset in the slot) for each pointer the replay fills in
    pointers: tuple[tuple[int, Slot, int], ...] = ()
    dst: tuple[Slot, int] | None = None
    src: tuple[Slot, int] | None = None
    value: int = 0
    count: int = 0
    attribute: int = 0

    def to_json(self) -> dict[str, Any]:
        if self.op == "launch":
            return {"op": "launch", "function": self.function, "grid": list(self.grid), "block": list(self.block),
                    "shared": self.shared, "cooperative": self.cooperative,
                    "params": [list(p) for p in self.params], "data": self.data.hex(),
                    "pointers": [[o, list(s), so] for o, s, so in self.pointers]}
        if self.op == "attribute":
            return {"op": "attribute", "function": self.function, "attribute": self.attribute, "value": self.value}
        out: dict[str, Any] = {"op": self.op, "dst": [list(self.dst[0]), self.dst[1]], "count": self.count}
        if self.op == "memset":
            out["value"] = self.value
        else:
            out["src"] = [list(self.src[0]), self.src[1]]
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "PlanStep":
        op = d["op"]
        if op == "launch":
            return cls("launch", int(d["function"]), _dims(d["grid"]), _dims(d["block"]), int(d["shared"]),
                       bool(d["cooperative"]), tuple((int(o), int(s)) for o, s in d["params"]),
                       bytes.fromhex(d["data"]),
                       tuple((int(o), _slot(s), int(so)) for o, s, so in d["pointers"]))
        if op == "attribute":
            return cls("attribute", int(d["function"]), attribute=int(d["attribute"]), value=int(d["value"]))
        if op in ("memset", "copy"):
            dst = (_slot(d["dst"][0]), int(d["dst"][1]))
            src = (_slot(d["src"][0]), int(d["src"][1])) if op == "copy" else None
            return cls(op, dst=dst, src=src, value=int(d.get("value", 0)) & 0xFF, count=int(d["count"]))
        raise ValueError(f"a plan step of unknown kind {op!r}")


def _dims(v: Sequence[Any]) -> tuple[int, int, int]:
    x, y, z = (int(a) for a in v)
    return x, y, z


def _slot(v: Sequence[Any]) -> Slot:
    kind, index = v
    if kind not in ("input", "output", "workspace"):
        raise ValueError(f"a plan names an unknown slot {kind!r}")
    return str(kind), int(index)


@dataclass(frozen=True)
class LaunchPlan:
    """A CUDA kernel as kforge replays it: fat binaries, function names and the steps of one call."""

    modules: tuple[bytes, ...]
    functions: tuple[tuple[int, str], ...]
    steps: tuple[PlanStep, ...]
    n_inputs: int
    n_outputs: int
    workspace_bytes: int = 0
    module_sha256: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.module_sha256:
            object.__setattr__(self, "module_sha256", tuple(hashlib.sha256(m).hexdigest() for m in self.modules))

    @property
    def digest(self) -> str:
        """SHA-256 of the plan's JSON (which names each module by its SHA-256): the plan's identity."""
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()

    @property
    def launches(self) -> int:
        return sum(s.op == "launch" for s in self.steps)

    def to_json(self) -> dict[str, Any]:
        """The plan without its modules' bytes (named by SHA-256 in ``modules``)."""
        return {"format_version": FORMAT_VERSION, "modules": list(self.module_sha256),
                "functions": [[m, n] for m, n in self.functions], "steps": [s.to_json() for s in self.steps],
                "n_inputs": self.n_inputs, "n_outputs": self.n_outputs, "workspace_bytes": self.workspace_bytes}

    @classmethod
    def from_json(cls, d: dict[str, Any], modules: Sequence[bytes]) -> "LaunchPlan":
        """The plan of ``d`` with ``modules`` (their bytes, in order): each must hash to the SHA-256 ``d`` names,
        and the plan must be well formed (``check``); ValueError otherwise."""
        if int(d.get("format_version", 0)) > FORMAT_VERSION:
            raise ValueError(f"a launch plan of format {d.get('format_version')}: this kforge reads up to "
                             f"{FORMAT_VERSION}")
        names = [str(h) for h in d["modules"]]
        if len(names) != len(modules) or any(hashlib.sha256(m).hexdigest() != h for m, h in zip(modules, names)):
            raise ValueError("a launch plan's module does not match its SHA-256")
        plan = cls(tuple(bytes(m) for m in modules), tuple((int(m), str(n)) for m, n in d["functions"]),
                   tuple(PlanStep.from_json(s) for s in d["steps"]), int(d["n_inputs"]), int(d["n_outputs"]),
                   int(d.get("workspace_bytes", 0)), tuple(names))
        plan.check()
        return plan

    def check(self, extents: dict[Slot, int] | None = None) -> None:
        """ValueError unless every step names a known function and slot, stays within bounds, and (with
        ``extents``, each slot's bytes) every pointer, memset and copy lies inside its slot."""
        slots = {("input", i) for i in range(self.n_inputs)} | {("output", i) for i in range(self.n_outputs)}
        if self.workspace_bytes:
            slots.add(("workspace", 0))
        for m, name in self.functions:
            if not 0 <= m < len(self.modules) or not name or not name.isprintable() or len(name) > 4096:
                raise ValueError(f"a plan's function {name[:60]!r} names no module of it")

        def inside(slot: Slot, offset: int, count: int = 0) -> None:
            if slot not in slots:
                raise ValueError(f"a plan names slot {slot}, which this kernel does not have")
            if offset < 0 or count < 0 or (extents is not None and offset + count > extents.get(slot, 0)):
                raise ValueError(f"a plan step reaches past {slot[0]} {slot[1]}")

        for s in self.steps:
            if s.op in ("launch", "attribute") and not 0 <= s.function < len(self.functions):
                raise ValueError("a plan step names a function the plan does not have")
            if s.op == "launch":
                if any(not 1 <= g <= m for g, m in zip(s.grid, _MAX_GRID)) or min(s.block) < 1 or \
                        s.block[0] * s.block[1] * s.block[2] > _MAX_BLOCK_THREADS or not 0 <= s.shared < 1 << 24:
                    raise ValueError(f"a launch of grid {s.grid}, block {s.block}, {s.shared} bytes of shared "
                                     "memory is out of bounds")
                end = 0
                for o, n in s.params:
                    if o < 0 or n <= 0:
                        raise ValueError("a launch's parameter layout is malformed")
                    end = max(end, o + n)
                if end != len(s.data):
                    raise ValueError("a launch's parameter bytes do not match its layout")
                for o, slot, so in s.pointers:
                    if o % 8 or o + 8 > len(s.data):
                        raise ValueError("a launch's pointer lies outside its parameters")
                    inside(slot, so)
            elif s.op in ("memset", "copy"):
                inside(s.dst[0], s.dst[1], s.count)
                if s.op == "copy":
                    inside(s.src[0], s.src[1], s.count)
            elif s.op == "attribute":
                if s.attribute not in ATTRIBUTES:
                    raise ValueError(f"a plan sets function attribute {s.attribute}, which kforge does not replay")
            else:
                raise ValueError(f"a plan step of unknown kind {s.op!r}")


def _pointer_words(data: bytes) -> list[tuple[int, int]]:
    return [(o, struct.unpack_from("<Q", data, o)[0]) for o in range(0, len(data) - 7, 8)]


def build_plan(first: Record, first_buffers: Buffers, second: Record, second_buffers: Buffers, n_inputs: int,
               n_outputs: int, workspace_bytes: int = 0) -> LaunchPlan:
    """The plan two records of one kernel agree on, the tensors at other addresses in each; NotReplayable with the
    reason when either record holds a refusal or they disagree (a plan that depends on addresses or values, or a
    word that points into a tensor in one record only)."""
    for rec in (first, second):
        if rec.refusals:
            raise NotReplayable(rec.refusals[0])
    if first.modules != second.modules or first.functions != second.functions:
        raise NotReplayable("its device code differs between two calls")
    if len(first.steps) != len(second.steps):
        raise NotReplayable(f"it did {len(first.steps)} steps in one call and {len(second.steps)} in another: what it "
                            "launches depends on its inputs or on earlier calls")
    if not any(isinstance(s, Launch) for s in first.steps):
        raise NotReplayable("it launched no kernel")

    def mapped(a: int, b: int, what: str) -> tuple[Slot, int]:
        where_a, where_b = first_buffers.find(a), second_buffers.find(b)
        if where_a is None or where_a != where_b:
            raise NotReplayable(f"{what} points outside the tensors and workspace kforge gave it, or differently "
                                "in two calls")
        return where_a

    steps: list[PlanStep] = []
    for n, (a, b) in enumerate(zip(first.steps, second.steps)):
        what = f"step {n + 1}"
        if type(a) is not type(b):
            raise NotReplayable(f"{what} differs between two calls")
        if isinstance(a, Launch):
            if (a.function, a.cooperative, a.grid, a.block, a.shared, a.params) != \
                    (b.function, b.cooperative, b.grid, b.block, b.shared, b.params) or len(a.data) != len(b.data):
                raise NotReplayable(f"{what}: the launch's configuration differs between two calls (it depends on "
                                    "the tensors' addresses or values)")
            pointers = []
            words_b = dict(_pointer_words(b.data))
            covered = set()
            for o, va in _pointer_words(a.data):
                vb = words_b[o]
                wa, wb = first_buffers.find(va), second_buffers.find(vb)
                if wa is None and wb is None:
                    continue
                if wa is None or wa != wb:
                    raise NotReplayable(f"{what}: a parameter word points into a tensor in one call and not in the "
                                        "other (a coincidence, or a plan that depends on the data)")
                pointers.append((o, wa[0], wa[1]))
                covered.update(range(o, o + 8))
            if any(x != y for i, (x, y) in enumerate(zip(a.data, b.data)) if i not in covered):
                raise NotReplayable(f"{what}: a parameter differs between two calls and is no pointer into a tensor "
                                    "(it depends on the inputs or on earlier calls)")
            steps.append(PlanStep("launch", a.function, a.grid, a.block, a.shared, a.cooperative, a.params, a.data,
                                  tuple(pointers)))
        elif isinstance(a, Memset):
            if (a.value, a.count) != (b.value, b.count):
                raise NotReplayable(f"{what}: a memset differs between two calls")
            steps.append(PlanStep("memset", dst=mapped(a.dst, b.dst, f"{what}'s memset"), value=a.value,
                                  count=a.count))
        elif isinstance(a, Copy):
            if a.count != b.count:
                raise NotReplayable(f"{what}: a copy differs between two calls")
            steps.append(PlanStep("copy", dst=mapped(a.dst, b.dst, f"{what}'s copy"),
                                  src=mapped(a.src, b.src, f"{what}'s copy"), count=a.count))
        else:
            if a != b:
                raise NotReplayable(f"{what}: a function attribute differs between two calls")
            if a.attribute not in ATTRIBUTES:
                raise NotReplayable(f"it sets function attribute {a.attribute}, which kforge does not replay")
            steps.append(PlanStep("attribute", a.function, attribute=a.attribute, value=a.value))
    plan = LaunchPlan(first.modules, first.functions, tuple(steps), n_inputs, n_outputs, workspace_bytes)
    extents = {slot: extent for slot, (_base, extent) in first_buffers.slots.items()}
    try:
        plan.check(extents)
    except ValueError as exc:
        raise NotReplayable(str(exc)) from None
    return plan
