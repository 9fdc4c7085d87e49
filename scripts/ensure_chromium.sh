#!/usr/bin/env bash
# Make sure the browser tests see pages as users do: a Chromium (Playwright drives the system's Debian
# `chromium`, no browser download from Playwright's CDN) and a CJK font, without which the experiment
# card's headings (目标 / 判读标准 / 最小规模 / 前置条件) render as empty boxes.
# - chromium on PATH and `fc-list :lang=zh` lists a font -> one line, exit 0 (fast, no apt)
# - something missing and we are root                    -> install the missing Debian packages
#   (chromium, fonts-noto-cjk, fontconfig for fc-list) with apt-get, check again, exit 0 on success
# - something missing and not root / no apt              -> print what to install and exit 1
set -euo pipefail

have_chromium() {
    command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1
}

# The font fontconfig (which Chromium uses) picks for Simplified Chinese, or nothing when no installed font
# covers Chinese at all (fc-match alone would name a fallback such as DejaVu).
cjk_font() {
    command -v fc-list >/dev/null 2>&1 || return 0
    [[ -n "$(fc-list :lang=zh family 2>/dev/null)" ]] || return 0
    fc-match -f '%{family[0]}' 'sans-serif:lang=zh-cn' 2>/dev/null
}

need=()
have_chromium || need+=(chromium fonts-dejavu-core)
command -v fc-list >/dev/null 2>&1 || need+=(fontconfig)
[[ -n "$(cjk_font)" ]] || need+=(fonts-noto-cjk)
if ((${#need[@]} == 0)); then
    echo "ensure_chromium: $(command -v chromium || command -v chromium-browser) present, CJK font: $(cjk_font)"
    exit 0
fi
if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_chromium: missing Debian package(s) for the browser tests: ${need[*]}" >&2
    echo "  Install them, e.g. (Debian/Ubuntu): sudo apt-get install -y ${need[*]}" >&2
    echo "  (fonts-noto-cjk: without a CJK font the card's headings render as boxes; check: fc-list :lang=zh)" >&2
    exit 1
fi

# shellcheck source=scripts/lib_apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib_apt.sh"
apt_install_binaries ensure_chromium "${need[@]}"

if ! have_chromium; then
    echo "ensure_chromium: installation finished but chromium is still not on PATH" >&2
    exit 1
fi
if [[ -z "$(cjk_font)" ]]; then
    echo "ensure_chromium: installation finished but \`fc-list :lang=zh\` lists no font" \
        "(expected Noto Sans CJK from fonts-noto-cjk; try: fc-cache -f)" >&2
    exit 1
fi
echo "ensure_chromium: installed ${need[*]}; $(command -v chromium || command -v chromium-browser), CJK font: $(cjk_font)"
