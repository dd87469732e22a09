"""Build hook: the notebook front end's one committed copy (widgets/) goes into the wheel.

Everything else is in pyproject.toml.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

FRONT_END = ("kforge.js", "kforge.css")


class BuildPy(build_py):
    """build_py, then widgets/* -> kforge/views/static/ in the build tree."""

    def run(self) -> None:
        super().run()
        source = Path(__file__).parent / "widgets"
        target = Path(self.build_lib) / "kforge" / "views" / "static"
        target.mkdir(parents=True, exist_ok=True)
        for name in FRONT_END:
            shutil.copyfile(source / name, target / name)


setup(cmdclass={"build_py": BuildPy})
