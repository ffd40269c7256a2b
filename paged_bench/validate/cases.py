"""The registry of published cases: ``conf/validation/*.yaml``, read and checked once.

One file is one source (a blog post, a CI dashboard, a paper's table): where it is (a URL, or
a repository path and commit), the engine it measured, the ``setup`` overrides that describe
that engine to ``python -m paged_bench``, and its cases. A case is one published run: GPU,
model, tensor-parallel degree, workload, and each figure the source gives for it (metric,
unit, value, how it was read). A file's ``notes`` (headed sections) say where the simulator is
still off for its cases and why; a figure they quote is written as a reference to the rows
(``FIGURE_REF``), so docs/validation.md prints what this run gave. A bad file is refused in one
line naming the file, the key and what is allowed, before anything is simulated.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from paged_bench.errors import ConfigError, check, check_choice

# what a figure may be: a key of the run's summary.json (or duration_ms, its duration in ms),
# and the unit it is given in (checked, so a figure read in seconds is not compared in ms)
METRICS: dict[str, str] = {
    "request_throughput": "req/s",
    "output_throughput": "tok/s",
    "mean_ttft_ms": "ms",
    "median_ttft_ms": "ms",
    "first_ttft_ms": "ms",  # the least TTFT of a request whose reply had text: the burst's first prompt step
    "mean_tpot_ms": "ms",
    "median_tpot_ms": "ms",
    "mean_itl_ms": "ms",
    "mean_e2el_ms": "ms",
    "median_e2el_ms": "ms",
    "duration_ms": "ms",
}
DATASETS = ("sharegpt", "fixed", "listed")
_SOURCE_KEYS = ("title", "url", "repository", "path", "commit", "published")
_FILE_KEYS = ("source", "engine", "setup", "notes", "cases")
_CASE_KEYS = ("name", "gpu", "model", "tp", "where", "workload", "overrides", "figures")
_FIGURE_KEYS = ("metric", "unit", "published", "read")
# what the notes quote of the rows: "{ratio:CASE:METRIC}", "{simulated:CASE:METRIC}", or the least to the
# greatest ratio of several figures, "{ratios:METRIC:CASE,CASE,...}"; docs/validation.md prints the values
# this run gave, so a note never quotes a figure the code no longer gives
FIGURE_REF = re.compile(r"\{(ratio|simulated):([\w.-]+):(\w+)\}|\{ratios:(\w+):([\w.,-]+)\}")


def quoted_figures(ref: re.Match[str]) -> list[tuple[str, str]]:
    """The (case, metric) pairs one FIGURE_REF match quotes."""
    if ref[1]:
        return [(ref[2], ref[3])]
    return [(case, ref[4]) for case in ref[5].split(",")]


@dataclass(frozen=True)
class Source:
    title: str
    url: str | None  # where to read it; else repository + path (+ commit) name it
    repository: str | None
    path: str | None
    commit: str | None
    published: str  # the date it was published

    @property
    def citation(self) -> str:
        """One line naming it: the title, the date, and where it is."""
        where = [self.url] if self.url else []
        if self.repository:
            where.append(f"{self.repository}: {self.path}" + (f" @ {self.commit[:12]}" if self.commit else ""))
        return f"{self.title} ({self.published}); {'; '.join(where)}"


@dataclass(frozen=True)
class Figure:
    metric: str
    unit: str
    published: float
    read: str  # how the value was read from the source (a table's cell, a plot's bar against its grid)


@dataclass(frozen=True)
class Workload:
    """What the published run sent: ``dataset`` sharegpt (drawn from the shipped ShareGPT lengths
    with the published means: ``workloads``), fixed (``prompt_len`` / ``output_len`` each request)
    or listed (each request's own lengths, as the source published them: ``prompt_lens`` /
    ``output_lens``), ``num_requests`` of them at ``rate`` requests/s (Poisson, as vLLM's
    benchmark_serving.py sends them) or all at once (inf)."""

    dataset: str
    num_requests: int
    rate: float
    prompt_len: int = 0  # fixed: every prompt; sharegpt: the published mean (shown beside the draw's)
    output_len: int = 0
    # listed: request i's prompt and output tokens as the source measured them; an output of 0 is
    # a request whose first token ended it (the model's end of text: the client saw no text)
    prompt_lens: tuple[int, ...] = ()
    output_lens: tuple[int, ...] = ()


@dataclass(frozen=True)
class Case:
    name: str
    file: str  # the registry file it came from (its source's)
    source: Source
    engine: str
    gpu: str
    model: str
    tp: int
    where: str  # where in the source (a figure, a table)
    workload: Workload
    overrides: tuple[str, ...]  # the file's setup, then the case's own
    figures: tuple[Figure, ...]


@dataclass(frozen=True)
class Note:
    """One section of a file's notes: what it is about, then what it says."""

    heading: str  # empty for notes written as one paragraph
    text: str


@dataclass(frozen=True)
class SourceFile:
    """One registry file: its source, engine and cases, and what it says is still off and why."""

    name: str
    source: Source
    engine: str
    setup: tuple[str, ...]  # the overrides every case of the file runs with
    notes: tuple[Note, ...]  # where the simulator is still off for these cases, and why
    cases: tuple[Case, ...]


def registry_folder() -> Path:
    """``conf/validation/``, where the package's config is (``paged_bench.conf``)."""
    return Path(str(resources.files("paged_bench.conf").joinpath("validation")))


def load_registry(folder: Path | None = None) -> list[SourceFile]:
    """Every ``*.yaml`` of ``folder`` (the registry by default), in name order; case names unique."""
    folder = registry_folder() if folder is None else folder
    files = [load_file(path) for path in sorted(folder.glob("*.yaml"))]
    check(bool(files), "validation registry", str(folder), "a folder holding at least one case file (*.yaml)")
    seen: dict[str, str] = {}
    for f in files:
        for case in f.cases:
            check(case.name not in seen, f"{f.name}: cases[].name", case.name,
                  f"a name no other case has (it is {seen.get(case.name)}'s too)")  # fmt: skip
            seen[case.name] = f.name
    metrics = {c.name: {fig.metric for fig in c.figures} for f in files for c in f.cases}
    for f in files:
        for note in f.notes:
            for ref in FIGURE_REF.finditer(note.text):
                for case, metric in quoted_figures(ref):
                    check(metric in metrics.get(case, ()), f"{f.name}: notes.{note.heading or 'text'}", ref[0],
                          "{ratio|simulated:CASE:METRIC} or {ratios:METRIC:CASE,...} naming cases of the "
                          "registry and one of their figures")  # fmt: skip
    return files


def chosen_cases(files: list[SourceFile], names: list[str]) -> list[Case]:
    """The cases of ``files`` named in ``names`` (every case when none is), in registry order; a
    name no case has is a one-line error listing the cases."""
    cases = [c for f in files for c in f.cases]
    known = {c.name for c in cases}
    for name in names:
        check(name in known, "--case", name, f"one of {', '.join(sorted(known))}")
    return [c for c in cases if not names or c.name in names]


def load_file(path: Path) -> SourceFile:
    """One case file, checked: every key known, every value of its type."""
    name = path.name
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(name, str(path), f"a YAML file{at}: {getattr(e, 'problem', None) or e}") from None
    top = _mapping(raw, name, _FILE_KEYS, required=("source", "engine", "cases"))
    source = _source(top["source"], f"{name}: source")
    engine = _text(top["engine"], f"{name}: engine")
    setup = _overrides(top.get("setup", []), f"{name}: setup")
    cases = top["cases"]
    check(isinstance(cases, list) and bool(cases), f"{name}: cases", cases, "a list of at least one case")
    return SourceFile(name, source, engine, setup, _notes(top.get("notes", ""), f"{name}: notes"),
                      tuple(_case(c, f"{name}: cases[{i}]", name, source, engine, setup)
                            for i, c in enumerate(cases)))  # fmt: skip


def _case(raw: Any, key: str, file: str, source: Source, engine: str, setup: tuple[str, ...]) -> Case:
    c = _mapping(raw, key, _CASE_KEYS, required=("name", "gpu", "model", "tp", "workload", "figures"))
    figures = c["figures"]
    check(isinstance(figures, list) and bool(figures), f"{key}.figures", figures, "a list of at least one figure")
    tp = c["tp"]
    check(isinstance(tp, int) and not isinstance(tp, bool) and tp >= 1, f"{key}.tp", tp, "an integer >= 1")
    return Case(_text(c["name"], f"{key}.name"), file, source, engine, _text(c["gpu"], f"{key}.gpu"),
                _text(c["model"], f"{key}.model"), tp, _text(c.get("where", ""), f"{key}.where", empty=True),
                _workload(c["workload"], f"{key}.workload"),
                setup + _overrides(c.get("overrides", []), f"{key}.overrides"),
                tuple(_figure(f, f"{key}.figures[{i}]") for i, f in enumerate(figures)))  # fmt: skip


def _source(raw: Any, key: str) -> Source:
    s = _mapping(raw, key, _SOURCE_KEYS, required=("title", "published"))
    fields = {k: (None if s.get(k) is None else _text(s[k], f"{key}.{k}")) for k in _SOURCE_KEYS}
    check(bool(fields["url"] or (fields["repository"] and fields["path"])), key, raw,
          "a url, or a repository and path (with the commit read)")  # fmt: skip
    return Source(**fields)  # type: ignore[arg-type]


_LISTED = ("prompt_lens", "output_lens")  # dataset listed: each request's own lengths
_LENGTHS = ("prompt_len", "output_len")  # sharegpt (the published means) and fixed (every request's)


def _workload(raw: Any, key: str) -> Workload:
    lengths = _LISTED if isinstance(raw, dict) and raw.get("dataset") == "listed" else _LENGTHS
    w = _mapping(raw, key, ("dataset", "num_requests", "rate", *lengths),
                 required=("dataset", "num_requests", "rate", *lengths))  # fmt: skip
    dataset = check_choice(f"{key}.dataset", w["dataset"], DATASETS)
    rate = float("inf") if w["rate"] in ("inf", float("inf")) else w["rate"]
    check(isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate > 0, f"{key}.rate", w["rate"],
          "requests per second > 0, or inf (every request sent at once)")  # fmt: skip
    n = w["num_requests"]
    check(_is_count(n, 1), f"{key}.num_requests", n, "an integer >= 1")
    if dataset == "listed":
        return Workload(dataset, n, float(rate), prompt_lens=_listed(w["prompt_lens"], f"{key}.prompt_lens", n, 1),
                        output_lens=_listed(w["output_lens"], f"{key}.output_lens", n, 0))  # fmt: skip
    for k in _LENGTHS:
        check(_is_count(w[k], 1), f"{key}.{k}", w[k], "an integer >= 1")
    return Workload(dataset, n, float(rate), w["prompt_len"], w["output_len"])


def _is_count(v: Any, least: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


def _listed(raw: Any, key: str, n: int, least: int) -> tuple[int, ...]:
    """One length a request, ``n`` of them, each an integer >= ``least`` (a bad one named by its index)."""
    shown = f"a list of {len(raw)}" if isinstance(raw, list) else raw
    check(isinstance(raw, list) and len(raw) == n, key, shown, f"a list of num_requests={n} lengths, one a request")
    for i, v in enumerate(raw):
        check(_is_count(v, least), f"{key}[{i}]", v, f"an integer >= {least}")
    return tuple(raw)


def _figure(raw: Any, key: str) -> Figure:
    f = _mapping(raw, key, _FIGURE_KEYS, required=_FIGURE_KEYS)
    metric = check_choice(f"{key}.metric", f["metric"], METRICS)
    check(f["unit"] == METRICS[metric], f"{key}.unit", f["unit"], f"{METRICS[metric]!r}, {metric}'s unit")
    value = f["published"]
    check(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0,
          f"{key}.published", value, "a number > 0")  # fmt: skip
    return Figure(metric, f["unit"], float(value), _text(f["read"], f"{key}.read"))


def _overrides(raw: Any, key: str) -> tuple[str, ...]:
    ok = isinstance(raw, list) and all(isinstance(o, str) and "=" in o for o in raw)
    check(ok, key, raw, "a list of python -m paged_bench overrides (KEY=VALUE)")
    return tuple(raw)


def _mapping(raw: Any, key: str, known: tuple[str, ...], required: tuple[str, ...]) -> Mapping[str, Any]:
    check(isinstance(raw, dict), key, raw, f"a mapping with keys {', '.join(known)}")
    for k in raw:
        check(k in known, f"{key}.{k}", raw[k], f"not a key here; the keys are {', '.join(known)}")
    missing = [k for k in required if k not in raw]
    check(not missing, key, "{...}", f"a mapping that sets {', '.join(missing)} too")
    return raw


def _notes(raw: Any, key: str) -> tuple[Note, ...]:
    """One paragraph (a string), or headed sections (a mapping: heading -> paragraph), in order."""
    if isinstance(raw, dict):
        return tuple(Note(_text(heading, f"{key} (a heading)"), " ".join(_text(text, f"{key}.{heading}").split()))
                     for heading, text in raw.items())  # fmt: skip
    text = " ".join(_text(raw, key, empty=True).split())
    return (Note("", text),) if text else ()


def _text(raw: Any, key: str, empty: bool = False) -> str:
    check(isinstance(raw, str) and (empty or bool(raw.strip())), key, raw, "a non-empty string")
    return raw.strip()
