"""``files.write_whole``: a real process rewriting a file, killed with SIGKILL again and again,
leaves the old text or the new one, never part of one (a plain ``write_text`` leaves the file
empty or cut short: it truncates, then writes)."""

from __future__ import annotations

import subprocess
import sys
import time

WRITER = """
import sys
from pathlib import Path
from paged_bench.results.whole_files import write_whole
path, n = Path(sys.argv[1]), 0
while True:
    write_whole(path, "ab"[n % 2] * 4_000_000 + "\\n")
    n += 1
"""
TEXTS = {c * 4_000_000 + "\n" for c in "ab"}


def test_a_file_killed_mid_write_is_the_old_text_or_the_new(tmp_path):
    path = tmp_path / "run_info.json"
    for kill in range(12):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)])
        try:
            deadline = time.monotonic() + 60
            while not path.exists() and time.monotonic() < deadline:  # past start-up: it writes now
                time.sleep(0.005)
            time.sleep(0.003 * kill)  # at a different point of a write each time
        finally:
            proc.kill()
            proc.wait()
        assert path.read_text() in TEXTS, f"kill {kill}: a file of {path.stat().st_size} bytes"
