"""What the views read of a run and of a session's results."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator, Protocol, Sequence

if TYPE_CHECKING:
    from ..ops import Card, CardStatus
    from .._events import Event


class PlannedCard(Protocol):
    @property
    def card(self) -> "Card": ...


class Budget(Protocol):
    @property
    def iterations(self) -> int: ...   # candidates per card


class RunState(Protocol):
    @property
    def value(self) -> str: ...


class Run(Protocol):
    """What a view reads of a run (``kforge.search.OptimizationRun`` is the one a session starts): typed here so
    that the views, which the run's display hook imports, do not import the run."""

    @property
    def events(self) -> "Sequence[Event]": ...

    @property
    def planned(self) -> Sequence[PlannedCard]: ...

    @property
    def budget(self) -> Budget: ...

    @property
    def state(self) -> RunState: ...

    @property
    def done(self) -> bool: ...

    @property
    def error(self) -> BaseException | None: ...

    @property
    def dollars(self) -> float: ...

    def subscribe(self, callback: "Callable[[Event], None]") -> None: ...

    def start(self, background: bool) -> object: ...

    def wait(self, timeout: float | None = None) -> object: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def stop(self) -> None: ...


class CardResult(Protocol):
    @property
    def key(self) -> str: ...

    @property
    def status(self) -> "CardStatus": ...

    @property
    def winner_speedup(self) -> float | None: ...


class Results(Protocol):
    """What a view reads of a session's results (``kforge.search.Results``), one row per card."""

    def __iter__(self) -> Iterator[CardResult]: ...

    @property
    def winners(self) -> Sequence[CardResult]: ...
