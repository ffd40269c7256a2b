"""docs/engine.md opens with the engine's step loop, copied from ``paged_bench/core/engine.py``
line for line (issue 34): the copy must stay under 60 lines and must still be the code."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def opening_code() -> list[str]:
    text = (ROOT / "docs" / "engine.md").read_text()
    first = re.search(r"```python\n(.*?)```", text, re.S)
    assert first is not None and text.index(first.group(0)) < text.index("\n## ")  # before the first section
    return first.group(1).splitlines()


def test_the_step_loop_in_the_docs_is_under_60_lines():
    assert 40 < len(opening_code()) < 60


def test_every_line_of_the_docs_loop_is_the_engines_in_order():
    """The block is parts, each opened by a comment line of the doc's own naming a method
    (``# Engine.step: ...``); each part's lines are engine.py's, consecutive, in that order."""
    source = [line.strip() for line in (ROOT / "paged_bench" / "core" / "engine.py").read_text().splitlines()]
    parts: list[list[str]] = []
    for line in opening_code():
        if line.startswith("# Engine."):
            parts.append([])
        elif line.strip():
            parts[-1].append(line.strip())
    assert len(parts) == 2
    for part in parts:
        starts = [i for i, line in enumerate(source) if line == part[0]]
        assert any(source[i : i + len(part)] == part for i in starts), f"docs/engine.md's {part[0]!r} is not engine.py's"
