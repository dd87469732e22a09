"""LLM proposer settings: each from its argument, else the environment, else the config file."""
from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .._config import config_path
from ._base import ProposerError
from ._pricing import PriceLike


def load_config(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """The parsed config file, or {} when there is none."""
    file = Path(path).expanduser() if path is not None else config_path()
    if not file.exists():
        return {}
    try:
        with open(file, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ProposerError(f"{file} is not valid TOML ({e}); fix it or point KFORGE_CONFIG elsewhere") from None


class Settings:
    """One proposer's settings: each looked up in its argument, then the environment, then the
    ``[section]`` table of the config file."""

    def __init__(self, section: str, path: str | os.PathLike | None = None):
        config = load_config(path)
        self.path = Path(path).expanduser() if path is not None else config_path()
        self.section = section
        self.table: Mapping[str, Any] = config.get(section, {})
        self.pricing: dict[str, PriceLike] = dict(config.get("pricing", {}))

    def get(self, key: str, arg: Any, env: Sequence[str] = (), parse: Callable[[Any], Any] = str) -> Any:
        if arg is not None:
            return arg
        for name in env:
            if os.environ.get(name):
                return _parse(parse, os.environ[name], name)
        if key in self.table:
            return _parse(parse, self.table[key], f"{key} in [{self.section}] of {self.path}")
        return None


def _parse(parse: Callable[[Any], Any], value: Any, where: str) -> Any:
    try:
        return parse(value)
    except ValueError:
        raise ValueError(f"{where} = {value!r} is not a valid {getattr(parse, '__name__', 'value')}") from None
