"""What the views read of a session."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..deploy import EndToEnd
    from ..ops import Cards
    from ._run import Results, Run
    from ..store import Store


class Session(Protocol):
    """What a view reads of a session (``kforge.Session`` is the one users make): typed here so that the views,
    which the session's display hooks import, do not import the session."""

    workdir: Path
    store: "Store"
    run: "Run | None"
    last_end_to_end: "EndToEnd | None"
    _cards: "Cards | None"   # None until the session has captured (``cards`` raises then)

    @property
    def cards(self) -> "Cards": ...

    @property
    def results(self) -> "Results": ...
