#!/usr/bin/env bash
# Sourced by scripts/ensure_*.sh: install Debian packages for their binaries only.
# apt_install_binaries WHO PACKAGE...: as root with apt-get, installs the packages while policy-rc.d
# denies service starts (their postinst would start system services; the tests run private ones on
# 127.0.0.1). Not root or no apt-get: names the packages and returns 1.

apt_install_binaries() {
    local who=$1
    shift
    if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        echo "$who: missing Debian package(s): $*" >&2
        echo "  Install them, e.g. (Debian/Ubuntu): sudo apt-get install -y $*" >&2
        echo "  The tests run private instances on 127.0.0.1; no system service is needed." >&2
        return 1
    fi
    local policy=/usr/sbin/policy-rc.d created=0 rc=0
    if [[ ! -e "$policy" ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod +x "$policy"
        created=1
    fi
    echo "$who: installing $*"
    DEBIAN_FRONTEND=noninteractive apt-get update -q \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" || rc=$?
    if ((created)); then rm -f "$policy"; fi
    return "$rc"
}
