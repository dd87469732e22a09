"""The user's handle: capture a model, optimize its cards, apply or export the winners."""
from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from .capture import Batches, CaptureError, CaptureLimits, Cards, capture_cards
from .store import Store, WorkdirError


def model_fingerprint(model: Any) -> str:
    """Architecture identity: class plus every parameter's name, shape and dtype (not values)."""
    h = hashlib.sha256(type(model).__qualname__.encode())
    if isinstance(model, torch.nn.Module):
        for name, p in model.named_parameters():
            h.update(f"{name}:{tuple(p.shape)}:{p.dtype}".encode())
    return h.hexdigest()[:16]


class Session:
    """One model, the inputs it runs on, and everything kforge learns about it.

    >>> model, inputs = kforge.example("tiny_cnn")
    >>> session = kforge.Session(model, inputs, device="cpu")
    >>> cards = session.capture()
    """

    def __init__(self, model: Callable | None, example_inputs: Any = None, *, device: str | None = None,
                 workdir: str | Path | None = None, limits: CaptureLimits | None = None):
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        device = str(device)
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise CaptureError(
                'device="cuda" was asked for, but this machine has no usable CUDA GPU (torch.cuda.is_available() '
                'is False): use device="cpu" to run kforge\'s CPU backend, or run on a GPU machine')
        if device != "cpu" and not device.startswith("cuda"):
            raise CaptureError(f"device {device!r} is not supported: use 'cuda', 'cuda:N' or 'cpu'")
        self.model = model
        self.device = device
        self.batches = Batches(example_inputs) if isinstance(example_inputs, Batches) else Batches([example_inputs])
        self.limits = limits or CaptureLimits()
        if workdir is None:
            workdir = tempfile.mkdtemp(prefix="kforge-")
        self.workdir = Path(workdir)
        self.store = Store(self.workdir)
        self._cards: Cards | None = None
        if model is not None:
            self._claim_workdir(model)
        if self.store.get_meta("device") is not None:
            self._cards = self.store.load_cards() or None

    def _claim_workdir(self, model: Any) -> None:
        fp = model_fingerprint(model)
        existing = self.store.get_meta("model_fingerprint")
        if existing is not None and existing != fp:
            raise WorkdirError(
                f"{self.workdir} holds the session of a different model ({self.store.get_meta('model_class')}); "
                "use another workdir for this model, or delete that one to start over")
        self.store.set_meta("model_fingerprint", fp)
        self.store.set_meta("model_class", type(model).__qualname__)

    @classmethod
    def open(cls, workdir: str | Path, model: Callable | None = None) -> "Session":
        """Reopen a session from its workdir: cards, candidates and results come back from disk."""
        path = Path(workdir)
        if not (path / "kforge.db").exists():
            raise WorkdirError(f"{path} holds no kforge session (no kforge.db); create one with kforge.Session(...)")
        store = Store(path)
        device = store.get_meta("device") or "cpu"
        store.close()
        return cls(model, None, device=device, workdir=path)

    # ------------------------------------------------------------------ capture

    def capture(self, *, timing_budget_ms: float | None = None, check_repeatable: bool = True) -> Cards:
        """Run the model eagerly on the example inputs, record its operators and time each variant."""
        if self.model is None:
            raise CaptureError("this session was opened without a model: pass model= to Session.open to capture again")
        if self.batches == [None]:
            raise CaptureError("no example inputs: pass the inputs the model runs on, e.g. Session(model, x)")
        budget = timing_budget_ms if timing_budget_ms is not None else (100.0 if self.device != "cpu" else 20.0)
        cards = capture_cards(self.model, self.batches, device=self.device, store=self.store, limits=self.limits,
                              timing_budget_ms=budget, check_repeatable=check_repeatable)
        self.store.save_cards(cards)
        self.store.set_meta("device", self.device)
        self._cards = cards
        return cards

    @property
    def cards(self) -> Cards:
        if self._cards is None:
            raise CaptureError("no cards yet: call session.capture() first")
        return self._cards

    def __repr__(self) -> str:
        n = len(self._cards) if self._cards is not None else 0
        return f"<kforge.Session {type(self.model).__name__ if self.model is not None else '?'} on {self.device}, " \
               f"{n} cards, workdir={str(self.workdir)!r}>"
