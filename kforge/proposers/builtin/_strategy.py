"""Strategies: parameterised kernel templates specialised to one variant, and their registry.

A strategy is registered next to its code by decorating its render function with ``@strategy``
(as torch's flop_counter registers formulas with ``register_flop_formula``).
"""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from ...kernels import DeviceInfo
from ...ops import TensorSig, Variant

Config = dict[str, Any]
Render = Callable[[Variant, Config, DeviceInfo], str]

FLOATS = ("float32", "bfloat16", "float16")
CUDA_TYPES = {"float32": "float", "bfloat16": "__nv_bfloat16", "float16": "__half"}
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Strategy:
    """One kernel design for one operator, with the knobs a search may turn.

    ``applies`` says whether the design handles a variant at all (layout, dtype, sizes);
    ``valid`` filters configurations of ``space`` for a variant; ``fit`` ranks applicable
    strategies (higher is more promising, the level by default); ``render`` returns a complete
    source file implementing the kernel contract for the variant and one configuration.
    """

    name: str
    op: str
    backend: str
    level: int
    doc: str
    space: dict[str, tuple] = field(compare=False)
    applies_fn: Callable[[Variant, DeviceInfo], bool] = field(compare=False)
    default_fn: Callable[[Variant, DeviceInfo], Config] = field(compare=False)
    render_fn: Callable[[Variant, Config, DeviceInfo], str] = field(compare=False)
    valid_fn: Callable[[Variant, Config, DeviceInfo], bool] | None = field(default=None, compare=False)
    fit_fn: Callable[[Variant, DeviceInfo], float] | None = field(default=None, compare=False)
    explain_fn: Callable[[Variant, Config], str] | None = field(default=None, compare=False)

    def applies(self, variant: Variant, device: DeviceInfo) -> bool:
        return variant.op == self.op and device.backend == self.backend and self.applies_fn(variant, device)

    def default(self, variant: Variant, device: DeviceInfo) -> Config:
        return dict(self.default_fn(variant, device))

    def valid(self, variant: Variant, config: Config, device: DeviceInfo) -> bool:
        return self.valid_fn is None or self.valid_fn(variant, config, device)

    def fit(self, variant: Variant, device: DeviceInfo) -> float:
        return self.fit_fn(variant, device) if self.fit_fn is not None else float(self.level)

    def explain(self, variant: Variant, config: Config) -> str:
        """What this configuration does on this variant, in one short phrase."""
        if self.explain_fn is not None:
            return self.explain_fn(variant, config)
        knobs = ", ".join(f"{k}={v}" for k, v in config.items())
        return self.doc + (f" [{knobs}]" if knobs else "")

    def configs(self, variant: Variant, device: DeviceInfo) -> Iterator[Config]:
        """Every valid configuration of the space for ``variant``, the default first."""
        default = self.default(variant, device)
        yield default
        keys = list(self.space)
        for values in itertools.product(*(self.space[k] for k in keys)):
            config = dict(zip(keys, values))
            if config != default and self.valid(variant, config, device):
                yield config

    def render(self, variant: Variant, config: Config, device: DeviceInfo) -> str:
        return self.render_fn(variant, config, device)


_REGISTRY: dict[str, Strategy] = {}


def register(strategy: Strategy) -> Strategy:
    if strategy.name in _REGISTRY:
        raise ValueError(f"strategy {strategy.name!r} is registered twice")
    _REGISTRY[strategy.name] = strategy
    return strategy


def strategy(ops: str | Sequence[str], backend: str, name: str, *, level: int, doc: str,
             applies: Callable[[Variant, DeviceInfo], bool], default: Callable[[Variant, DeviceInfo], Config],
             space: dict[str, tuple] | None = None, valid: Callable[[Variant, Config, DeviceInfo], bool] | None = None,
             fit: Callable[[Variant, DeviceInfo], float] | None = None,
             explain: Callable[[Variant, Config], str] | None = None) -> Callable[[Render], Render]:
    """Register the decorated render function as the strategy ``<op>.<backend>.<name>`` of each op.

    >>> @strategy("softmax", "cuda", "block_row", level=0, doc="one block per row",
    ...           space={"threads": (128, 256)}, applies=lambda v, d: True, default=lambda v, d: {"threads": 256})
    ... def _block_row(v, config, device): ...

    ``applies`` says whether the design handles a variant (layout, dtype, sizes), ``default`` its
    first configuration, ``valid`` filters the configurations of ``space``, ``fit`` ranks
    applicable strategies (the level by default), ``explain`` describes one configuration.
    """
    def register_render(render: Render) -> Render:
        for op in ((ops,) if isinstance(ops, str) else ops):
            register(Strategy(f"{op}.{backend}.{name}", op, backend, level, doc, dict(space or {}), applies, default,
                              render, valid, fit, explain))
        return render
    return register_render


def all_strategies() -> list[Strategy]:
    return list(_REGISTRY.values())


def get_strategy(name: str) -> Strategy:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no built-in strategy named {name!r}") from None


def strategies_for(op: str, backend: str | None = None) -> list[Strategy]:
    return [s for s in _REGISTRY.values() if s.op == op and (backend is None or s.backend == backend)]


# ----------------------------------------------------------------------------- templating

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def fill(template: str, **values: Any) -> str:
    """Replace ``{{name}}`` placeholders (C braces stay untouched); every name must be given."""

    def sub(m: re.Match) -> str:
        if m.group(1) not in values:
            raise KeyError(f"template placeholder {m.group(1)!r} has no value")
        return _literal(values[m.group(1)])

    return _PLACEHOLDER.sub(sub, template)


def _literal(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        if math.isinf(v):
            return "KF_POS_INF" if v > 0 else "KF_NEG_INF"
        return f"{v!r}f" if abs(v) < 3e38 else repr(v)
    return str(v)


# ----------------------------------------------------------------------------- variant helpers


def floats_only(*sigs: TensorSig | None) -> bool:
    return all(s is None or s.dtype in FLOATS for s in sigs)


def contiguous(*sigs: TensorSig | None) -> bool:
    return all(s is None or s.is_contiguous for s in sigs)


def prod(xs) -> int:
    return math.prod(int(x) for x in xs)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def vec_width(dtype: str, bytes_: int = 16) -> int:
    """Elements of ``dtype`` in one ``bytes_``-wide vector access."""
    return bytes_ // ITEMSIZE[dtype]


def rows_of(variant: Variant, trailing: int) -> tuple[int, int]:
    """(rows, row length) of a contiguous input normalised over its ``trailing`` last dims."""
    shape = variant.inputs[0].shape
    d = prod(shape[len(shape) - trailing:])
    return (prod(shape) // d if d else 0), d
