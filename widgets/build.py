"""Copy the view sources into the package (kforge/views/static/), where the wheel ships them.

Plain ES module and CSS, no bundler: run ``python widgets/build.py`` after editing widgets/.
"""
from __future__ import annotations

import shutil
from pathlib import Path

SOURCES = ("kforge.js", "kforge.css")
HERE = Path(__file__).parent
STATIC = HERE.parent / "kforge" / "views" / "static"


def main() -> None:
    STATIC.mkdir(parents=True, exist_ok=True)
    for name in SOURCES:
        shutil.copyfile(HERE / name, STATIC / name)
        print(f"{HERE / name} -> {STATIC / name}")


if __name__ == "__main__":
    main()
