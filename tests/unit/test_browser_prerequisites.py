"""The browser tests see the card as users do: Chromium with a CJK font.

Without a font covering Chinese, Chromium draws the card's headings (目标 / 判读标准 / 最小规模 / 前置条件)
as empty boxes and a screenshot shows something no user sees. `make test` runs
``scripts/ensure_chromium.sh`` first (``.ci/run`` installs the same packages on a fresh machine): it
installs Debian's ``fonts-noto-cjk`` when ``fc-list :lang=zh`` lists nothing, and names the package
when it cannot install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "ensure_chromium.sh"
FIX = "run `make ensure-chromium` as root (scripts/ensure_chromium.sh), or: sudo apt-get install -y fonts-noto-cjk"


def test_this_machine_has_chromium_and_a_cjk_font():
    assert shutil.which("chromium") or shutil.which("chromium-browser"), f"no chromium on PATH: {FIX} chromium"
    assert shutil.which("fc-list"), f"no fc-list (fontconfig): {FIX} fontconfig"
    fonts = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True, timeout=60).stdout
    assert fonts.strip(), f"`fc-list :lang=zh` lists no font: the card's CJK headings would render as boxes; {FIX}"


def test_install_lists_check_the_font_the_same_way():
    for path in (SCRIPT, REPO / ".ci" / "run"):
        text = path.read_text()
        assert "fonts-noto-cjk" in text and "fc-list :lang=zh" in text, path


def test_without_a_cjk_font_the_script_names_the_package(tmp_path):
    """No font (an empty fontconfig) and not root (a stand-in `id`): exit 1 naming fonts-noto-cjk, nothing installed."""
    conf = tmp_path / "fonts.conf"
    conf.write_text('<?xml version="1.0"?><!DOCTYPE fontconfig SYSTEM "fonts.dtd"><fontconfig>'
                    f"<dir>{tmp_path / 'none'}</dir><cachedir>{tmp_path / 'cache'}</cachedir></fontconfig>")
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "id").write_text("#!/bin/sh\necho 1000\n")
    (shim / "id").chmod(0o755)
    env = {**os.environ, "FONTCONFIG_FILE": str(conf), "PATH": f"{shim}:{os.environ['PATH']}"}
    out = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    if not shutil.which("fc-list"):
        assert out.returncode == 1 and "fontconfig" in out.stderr, out.stderr
        return
    assert out.returncode == 1, out.stdout + out.stderr
    assert "fonts-noto-cjk" in out.stderr and "apt-get install" in out.stderr, out.stderr


def test_with_everything_present_it_says_so_in_one_line_and_installs_nothing():
    test_this_machine_has_chromium_and_a_cjk_font()  # otherwise it fails here, naming the fix (no apt-get from a test)
    out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert len(out.stdout.splitlines()) == 1 and "present, CJK font: " in out.stdout, out.stdout
