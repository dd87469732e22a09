"""Where kforge's config file is: a leaf module, read by the LLM proposers' settings and by redaction."""
from __future__ import annotations

import os
from pathlib import Path


def config_path() -> Path:
    """$KFORGE_CONFIG, else $XDG_CONFIG_HOME/kforge/config.toml (~/.config by default)."""
    if os.environ.get("KFORGE_CONFIG"):
        return Path(os.environ["KFORGE_CONFIG"]).expanduser()
    root = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(root) / "kforge" / "config.toml"
