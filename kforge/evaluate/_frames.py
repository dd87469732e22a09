"""The runner's wire format: fixed 64-byte frames, and the sandbox facts a runner reports.

Nothing in a frame is executed or trusted beyond "the launch returned code X" and the runner's
claimed times; the judge checks everything else itself.
"""
from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

MAGIC = 0x4E52464B  # "KFRN"
DESC_MAGIC = 0x4353454446464B
FRAME = struct.Struct("<IIIiQQQddQ")
FRAME_BYTES = FRAME.size  # 64
DESC_HEADER = struct.Struct("<16Q")


class Op(enum.IntEnum):
    READY = 1
    PING = 2
    FLOOR = 3
    LOAD = 4
    RUN = 5
    FAULT = 6
    QUIT = 7
    RECORD = 8   # CUDA, with the recorder loaded: one call recorded (kforge/kernels/_plan.py)


class Code(enum.IntEnum):
    """The runner's status field."""

    OK = 0
    LAUNCH = 1       # kf_launch returned non-zero (code in c)
    DEVICE = 2       # the CUDA device reported an error after the calls (error in c)
    LOAD = 3         # dlopen failed or the workspace could not be allocated
    NO_ENTRY = 4     # no kf_launch
    SETUP = 5        # the runner could not set itself up (not the candidate's fault)
    BAD_REQUEST = 6


class Sandbox(enum.IntFlag):
    """What holds in a runner, as it reports in its ready frame."""

    ENV = 1 << 0
    SESSION = 1 << 1
    PRIVATE_DIR = 1 << 2
    RLIMITS = 1 << 3
    LOG = 1 << 4
    NO_NEW_PRIVS = 1 << 5
    NETNS = 1 << 6
    LANDLOCK_FS = 1 << 7
    LANDLOCK_NET = 1 << 8
    LANDLOCK_SCOPE = 1 << 9
    SECCOMP = 1 << 10
    RO_INPUTS = 1 << 11
    GUARD_PAGES = 1 << 12
    NO_CAPS = 1 << 13

    def describe(self) -> str:
        return ", ".join(m.name.lower() for m in Sandbox if m in self) or "nothing"


class ProtocolError(Exception):
    """A runner's answer that is not a well-formed answer to the request just sent."""


@dataclass(frozen=True)
class Frame:
    seq: int
    op: int
    status: int
    a: int = 0
    b: int = 0
    c: int = 0
    t: float = 0.0
    u: float = 0.0

    def encode(self) -> bytes:
        return FRAME.pack(MAGIC, self.seq & 0xFFFFFFFF, self.op, self.status, self.a, self.b, self.c,
                          self.t, self.u, 0)

    @classmethod
    def decode(cls, data: bytes) -> "Frame":
        if len(data) != FRAME_BYTES:
            raise ProtocolError(f"a frame of {len(data)} bytes (frames are {FRAME_BYTES})")
        magic, seq, op, status, a, b, c, t, u, _ = FRAME.unpack(data)
        if magic != MAGIC:
            raise ProtocolError(f"wrong magic 0x{magic:08x}")
        return cls(seq, op, status, a, b, c, t, u)


def check_answer(frame: Frame, seq: int, op: Op) -> Frame:
    """``frame`` if it answers request ``seq`` of kind ``op``; a fault frame passes through."""
    if frame.op == Op.FAULT:
        return frame
    if frame.seq != seq or frame.op != op:
        raise ProtocolError(f"an answer to request {frame.seq} ({frame.op}) where {seq} ({int(op)}) was due")
    return frame
