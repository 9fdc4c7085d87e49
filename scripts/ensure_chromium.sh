#!/usr/bin/env bash
# Make sure a Chromium exists for the browser tests (Playwright drives the system's Debian `chromium`,
# no browser download from Playwright's CDN).
# - chromium on PATH              -> exit 0
# - missing and we are root        -> install Debian's chromium with apt-get, exit 0 on success
# - missing and not root / no apt  -> print what to install and exit 1
set -euo pipefail

if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    echo "ensure_chromium: $(command -v chromium || command -v chromium-browser) present"
    exit 0
fi
if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_chromium: no chromium on PATH." >&2
    echo "  Install it, e.g. (Debian): sudo apt-get install -y chromium" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q && apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
command -v chromium >/dev/null 2>&1
echo "ensure_chromium: installed $(command -v chromium)"
