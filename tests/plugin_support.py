"""Fake installed distributions for plugin tests: a folder that, on PYTHONPATH, holds a
package's modules and a ``.dist-info`` with its entry points, as pip would install them."""

from __future__ import annotations

from pathlib import Path


def fake_distribution(root: Path, name: str, entry_points: dict[str, dict[str, str]], modules: dict[str, str]) -> Path:
    """Create distribution ``name`` under ``root``; returns ``root`` (put it on PYTHONPATH)."""
    root.mkdir(parents=True, exist_ok=True)
    dist_info = root / f"{name.replace('-', '_')}-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    lines = []
    for group, points in entry_points.items():
        lines.append(f"[{group}]")
        lines += [f"{n} = {target}" for n, target in points.items()]
    (dist_info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    for module, source in modules.items():  # a dotted name is a module in a (namespace) package
        path = root / f"{module.replace('.', '/')}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return root
