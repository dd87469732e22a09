#!/usr/bin/env bash
# What the browser test (tests/test_notebooks_browser.py, marker "browser") needs beyond kforge[test]:
# Debian's Chromium and Playwright for Python. Playwright drives /usr/bin/chromium directly;
# `playwright install` (a browser download) is neither needed nor possible without network.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

if [ ! -x /usr/bin/chromium ]; then
    $SUDO apt-get update
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends chromium
fi
python -m pip install --quiet "playwright>=1.40"
# the test imports these with the interpreter that runs pytest (this one), whatever PATH says
python - <<'PY'
import subprocess
import sys

import jupyterlab  # noqa: F401
import playwright.sync_api  # noqa: F401

version = subprocess.run(["/usr/bin/chromium", "--version"], check=True, capture_output=True, text=True).stdout.strip()
print(f"browser test deps ready for {sys.executable}: {version}, playwright, jupyterlab")
PY
