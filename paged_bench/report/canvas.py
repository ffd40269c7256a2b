"""What every report figure is drawn with (matplotlib, Agg: no display needed), and the record
of which runs a figure shows.

Each artist drawn from runs carries their sources as its gid (``mark``); a run a figure cannot
draw (no steps, not finished) is named in a note under it, and ``save`` reads both back from
the figure's artists into a ``Plot``. A run neither drawn nor named is missing from the figure,
and a test of every experiment's report counts them. Panels beyond a page go onto further pages
(``pages``), never dropped; legends of many entries go beside the axes, not over the data.
"""

from __future__ import annotations

import math
import textwrap
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paged_bench.report.load import Run
from paged_bench.run.flat import display_value

MAX_PANELS = 12  # panels on one page; more go on further pages
MANY = 8  # legend entries from which one legend stands beside the panels, not over the data
LOG_SPAN = 100  # a panel whose values span this factor or more is log-scaled (30 ms next to 9,854 ms)
_NOTED = "noted:"  # the gid of a note's text: the runs it names, after this


@dataclass(frozen=True)
class Plot:
    """A PNG written, and the runs (their ``source``) it draws and names in a note."""

    path: Path
    drawn: frozenset[str]
    noted: frozenset[str]

    @property
    def shown(self) -> frozenset[str]:
        return self.drawn | self.noted


@dataclass(frozen=True)
class Note:
    """Runs a figure does not draw, and why: printed under the figure."""

    why: str
    runs: list[Run]
    labels: list[str]


def pyplot():
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font cache notice is not ours to show

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def grid(plt, n: int, width: float = 4.2, height: float = 3.0, cols: int | None = None):
    cols = cols or min(n, 4 if n > 6 else 3 if n > 2 else n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def pages(items: Sequence[Any], per_page: int = MAX_PANELS) -> list[list[Any]]:
    """``items`` in pages of at most ``per_page``, as even as they go (16 -> 8 + 8, not 12 + 4)."""
    count = max(1, math.ceil(len(items) / per_page))
    size = math.ceil(len(items) / count)
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def page_path(out_dir: Path, stem: str, index: int) -> Path:
    """``stem.png`` for the first page, ``stem_2.png``... for the next."""
    return out_dir / (f"{stem}.png" if index == 0 else f"{stem}_{index + 1}.png")


def drop_later_pages(out_dir: Path, stem: str, count: int) -> None:
    """Remove the pages past ``count`` that an earlier report into this folder left (a sweep
    reported again with fewer runs): ``report.md`` would not link them, a reader would find them."""
    index = count
    while (path := page_path(out_dir, stem, index)).is_file():
        path.unlink()
        index += 1


def page_title(fig, what: str, index: int, total: int, first: int, last: int, of: int) -> None:
    if total > 1:
        fig.suptitle(f"{what}: page {index + 1} of {total} (runs {first}-{last} of {of})", fontsize=11)


def wrap(text: str, width: int = 44) -> str:
    return "\n".join(textwrap.wrap(text, width)) or text


def mark(artists, runs: Sequence[Run]) -> None:
    """Tag what was drawn with the runs it shows (an artist, or the list ``ax.plot`` returns)."""
    gid = "\n".join(r.source for r in runs)
    for artist in artists if isinstance(artists, list) else [artists]:
        artist.set_gid(gid)


def legends(fig, axes) -> None:
    """A legend per panel; where the panels' entries together are many, one beside them all."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    if len(seen) >= MANY:
        fig.legend(list(seen.values()), list(seen), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
        return
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)


def x_ticks(ax, xs: list[float]) -> None:
    """A tick at each value swept (a few), on a log2 scale where they span 8x or more: a replica
    count or a batch size reads 1, 2, 3, never 1.5."""
    if len(xs) > 2 and min(xs) > 0 and max(xs) / min(xs) >= 8:
        ax.set_xscale("log", base=2)
    if len(xs) <= MAX_PANELS:
        ax.set_xticks(xs, [display_value(x) for x in xs])
        ax.minorticks_off()
    elif all(float(x).is_integer() for x in xs):
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def y_scale(ax, ys: list[Any]) -> None:
    """Log-scale a panel whose values (all above 0) span orders of magnitude."""
    values = [y for y in ys if isinstance(y, (int, float)) and math.isfinite(y)]
    if values and min(values) > 0 and max(values) / min(values) >= LOG_SPAN:
        ax.set_yscale("log")


def _note_text(fig, notes: list[Note]) -> None:
    lines = [wrap(f"{n.why}: {', '.join(n.labels)}", 150) for n in notes if n.runs]
    if lines:
        sources = "\n".join(r.source for n in notes for r in n.runs)
        fig.text(0.01, 0.0, "\n".join(lines), fontsize=8, va="top", ha="left", gid=_NOTED + sources)


def shown_runs(fig) -> tuple[frozenset[str], frozenset[str]]:
    """The runs a figure draws and the runs it names in a note, read from its artists' gids."""
    drawn: set[str] = set()
    noted: set[str] = set()
    # what ``mark`` and a note tag: lines, filled areas, the figure's texts (``fig.findobj()``
    # also walks every axis, making its ticks: most of a figure's drawing time)
    artists = [a for ax in fig.axes for a in (*ax.lines, *ax.collections)] + list(fig.texts)
    for artist in artists:
        gid = artist.get_gid()
        if not gid:
            continue
        if gid.startswith(_NOTED):
            noted.update(filter(None, gid[len(_NOTED) :].split("\n")))
        else:
            drawn.update(gid.split("\n"))
    return frozenset(drawn), frozenset(noted)


def write_png(fig, path: Path) -> None:
    with warnings.catch_warnings():  # labels too long to lay out tightly: the figure is still drawn whole
        warnings.simplefilter("ignore", UserWarning)
        fig.tight_layout()
    with warnings.catch_warnings():  # a long run's curves: placing the legend is slow, not wrong
        warnings.filterwarnings("ignore", message='Creating legend with loc="best" can be slow', category=UserWarning)
        fig.savefig(path, dpi=110, bbox_inches="tight")  # tight: a legend or a note beside or under the panels


def save(plt, fig, path: Path, notes: list[Note] | None = None) -> Plot:
    _note_text(fig, notes or [])
    drawn, noted = shown_runs(fig)
    write_png(fig, path)
    plt.close(fig)
    return Plot(path, drawn, noted)
