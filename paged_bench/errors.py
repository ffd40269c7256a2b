"""Errors a user can act on. Each carries a one-line message; the CLI prints it and exits."""

from __future__ import annotations

import math
import sys
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any


class PagedBenchError(Exception):
    """Base of every error the command line reports as one line, without a traceback."""

    exit_code = 1


class ConfigError(PagedBenchError):
    """A config value is wrong: names the key, the bad value and what is allowed."""

    exit_code = 2

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key}={value!r} is not allowed: {allowed}")


class PluginError(PagedBenchError):
    """A plugin could not be found or loaded."""

    exit_code = 2


class EngineError(PagedBenchError):
    """The engine cannot go on: the run stops, unfinished requests are reported as errors."""


class PoolExhaustedError(EngineError):
    """A running sequence needs a KV block and the policy does not preempt."""


ERROR_CHARS = 300  # an error from elsewhere (a store, a tokenizer), as it is shown: one line, about this long


def one_line(error: BaseException, limit: int = ERROR_CHARS) -> str:
    """``Type: message`` (the message alone when the error names its cause), the line of it that
    says what failed, in at most ``limit`` characters. A longer one keeps its head (what failed;
    whole sentences or words) and its tail (a chained cause says why there: "Connection refused")."""
    first = _cause_line(error)
    text = first if getattr(error, "names_its_cause", False) else f"{type(error).__name__}: {first}"
    if len(text) <= limit:
        return text
    head_room = limit * 2 // 3
    sentence = text.rfind(". ", limit // 3, head_room)
    head = text[: sentence + 1] if sentence > 0 else text[: max(text.rfind(" ", 0, head_room), limit // 3)]
    tail_room = limit - len(head) - len(" ... ")
    space = text.find(" ", len(text) - tail_room)
    tail = text[space + 1 :] if space > 0 else text[-tail_room:]
    return f"{head} ... {tail}"


# SQLAlchemy's (and so MLflow's) first line when a flush fails: the cause is on a later line
_WRAPPER = "(raised as a result of"


def _cause_line(error: BaseException) -> str:
    """The first line of ``error``'s message, unless it is empty or only SQLAlchemy's wrapper:
    then its next line that is neither, else the first such line of its chained causes
    (innermost first)."""
    for e in (error, *reversed(_chain(error))):
        line = next((line for line in _lines(e) if not line.startswith(_WRAPPER)), None)
        if line is not None:
            return line
    return (_lines(error) or [""])[0]


def _lines(error: BaseException) -> list[str]:
    return [line.strip() for line in str(error).splitlines() if line.strip()]


def _chain(error: BaseException) -> list[BaseException]:
    """``error``'s causes (``__cause__``, else ``__context__``), outermost first."""
    chain: list[BaseException] = []
    cause = error.__cause__ or error.__context__
    while cause is not None and cause not in chain and cause is not error:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    return chain


def crash_message(error: BaseException) -> str:
    """A bug's exception (a plugin's hook, or ours) as one line that says where it was raised:
    ``Type: message (raised at file:line in function)``. The whole traceback is logged apart."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return one_line(error)
    last = frames[-1]
    return f"{one_line(error)} (raised at {_importable_path(last.filename)}:{last.lineno} in {last.name})"


def _importable_path(filename: str) -> str:
    """``filename`` from the folder it is imported from (``paged_bench_sjf/scheduler.py``, not
    a bare ``scheduler.py`` that every plugin package has, nor a site-packages path)."""
    path = Path(filename).resolve()
    roots = [Path(p).resolve() for p in sys.path if p and Path(p).is_dir()]
    relative = [path.relative_to(root) for root in roots if path.is_relative_to(root)]
    return str(min(relative, key=lambda r: len(r.parts))) if relative else path.name


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless one: "1 row", "3 rows"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def check(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Raise ConfigError(key, value, allowed) unless ``ok``."""
    if not ok:
        raise ConfigError(key, value, allowed)


def check_choice(key: str, value: Any, choices: Iterable[str], sep: str = ", ") -> str:
    """Return ``value`` if it names one of ``choices`` (a list or mapping from the command line
    is refused here too, not a TypeError from looking it up)."""
    check(isinstance(value, str) and value in choices, key, value, sep.join(choices))
    return value


# the most tokens one count may hold (a prompt, an output, a block): what vLLM's int32 token
# positions hold, and far below where numpy's int64 columns overflow
MAX_TOKENS = 2**31 - 1


def check_int(key: str, value: Any, minimum: int = 1, maximum: int | None = None) -> int:
    """Return ``value`` if it is an integer >= minimum (and <= maximum; bools are not integers here)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
    if maximum is None:
        check(ok, key, value, f"an integer >= {minimum}")
    else:
        check(ok and value <= maximum, key, value, f"an integer from {minimum} to {maximum:,}")
    return value


def check_number(key: str, value: Any, minimum: float = 0.0, *, strict: bool = False, finite: bool = True) -> float:
    """Return ``value`` as a float if it is a number >= minimum (> minimum when strict), and
    finite unless ``finite`` is False (where inf means something: a rate with no gaps, no limit).
    An infinite cost or latency would put the clock at inf: every request unfinished, or every
    figure inf or nan."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and (value > minimum if strict else value >= minimum) and (not finite or math.isfinite(value))
    check(ok, key, value, f"a {'finite ' if finite else ''}number {'>' if strict else '>='} {minimum}")
    return float(value)
