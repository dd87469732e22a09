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
python - <<'PY'
import playwright.sync_api  # noqa: F401
print("browser test deps ready: /usr/bin/chromium and playwright")
PY
