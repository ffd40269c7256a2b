"""The mutants ``mutation_core.py`` tries, made from a module's ``ast`` and spliced into its
text, and ``EQUIVALENT``: those shown unable to change behaviour, listed with their reasons in
``mutation_equivalent.toml`` (see ``mutation_core.py``)."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import tomllib


def _equivalent() -> dict[tuple[str, str, str, str], str]:
    """(module, enclosing class.function, the line's code, the mutation) -> why no test can see it."""
    with open(Path(__file__).with_name("mutation_equivalent.toml"), "rb") as f:
        entries = tomllib.load(f)["equivalent"]
    return {(e["module"], e["scope"], e["code"], e["mutation"]): e["why"] for e in entries}


EQUIVALENT = _equivalent()

FLIPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
         ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.And: ast.Or, ast.Or: ast.And,
         ast.Add: ast.Sub, ast.Sub: ast.Add}  # fmt: skip
TEXT = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.Is: "is",
        ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in", ast.And: "and", ast.Or: "or", ast.Add: "+",
        ast.Sub: "-"}  # fmt: skip
# the operator's token between two operands (only brackets, spaces and comments besides it)
PATTERN = {"<": r"(?<![<>=!])<(?![<=])", ">": r"(?<![<>=-])>(?![>=])", "<=": "<=", ">=": ">=", "==": "==", "!=": "!=",
           "is": r"\bis\b", "is not": r"\bis\s+not\b", "in": r"\bin\b", "not in": r"\bnot\s+in\b", "and": r"\band\b",
           "or": r"\bor\b", "+": r"\+", "-": "-", "+=": r"\+=", "-=": "-="}  # fmt: skip
SKIPPED_NAMES = {"__all__", "__slots__"}
LOG_CALLS = re.compile(r"^(log|logger|logging|warnings)\.")


@dataclass(frozen=True)
class Mutant:
    path: str  # from the repository root
    module: str  # from paged_bench/core/
    scope: str  # the enclosing class and function, dotted ("" at module level)
    line: int
    lines: tuple[int, ...]  # the lines whose tests may see it
    kind: str
    description: str
    text: str  # the mutated line's code, stripped
    original: bytes
    start: int  # byte offsets of the spliced span
    end: int
    replacement: str

    @cached_property
    def source(self) -> bytes:
        return self.original[: self.start] + self.replacement.encode() + self.original[self.end :]

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def code(self) -> str:
        """The line's code without its comment."""
        return self.text.split("  #")[0].strip()

    @property
    def equivalence(self) -> str | None:
        return EQUIVALENT.get((self.module, self.scope, self.code, self.description))


class _Finder:
    def __init__(self, path: str, source: bytes) -> None:
        self.path, self.source = path, source
        self.module = path.split("paged_bench/core/", 1)[-1]
        self.starts = [0]
        for line in source.split(b"\n"):
            self.starts.append(self.starts[-1] + len(line) + 1)
        self.found: list[Mutant] = []
        self.seen: dict[tuple[int, str], int] = {}
        self.scope = ""

    def at(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.at(node.lineno, node.col_offset), self.at(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]

    def code(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.source[start:end].decode()

    def add(self, stmt: ast.stmt, node: ast.AST, kind: str, what: str, start: int, end: int, new: str) -> None:
        line = node.lineno  # type: ignore[attr-defined]
        text = self.source[self.starts[line - 1] : self.starts[line] - 1].decode().strip()
        n = self.seen[(line, what)] = self.seen.get((line, what), 0) + 1
        description = what if n == 1 else f"{what} (#{n} on the line)"
        last = max(node.end_lineno, line if kind != "delete" else stmt.end_lineno)  # type: ignore[attr-defined]
        lines = tuple(range(min(stmt.lineno, line), last + 1))
        m = Mutant(self.path, self.module, self.scope, line, lines, kind, description, text, self.source, start, end, new)
        try:
            compile(m.source, self.path, "exec", dont_inherit=True)
        except SyntaxError:
            return  # a splice this script got wrong: not a mutant
        self.found.append(m)

    def operator(self, stmt: ast.stmt, node: ast.AST, kind: str, left: ast.AST, right: ast.AST, op: str, new: str) -> None:
        """Replace the operator token between ``left`` and ``right``."""
        start, end = self.span(left)[1], self.span(right)[0]
        between = re.sub(rb"#[^\n]*", lambda m: b" " * len(m.group()), self.source[start:end]).decode()
        hits = list(re.finditer(PATTERN[op], between))
        if len(hits) == 1:
            at = start + len(between[: hits[0].start()].encode())
            size = len(hits[0].group().encode())
            self.add(stmt, node, kind, f"`{op}` -> `{new}`", at, at + size, new)

    # -- statements -------------------------------------------------------------------------

    def body(self, stmts: list[ast.stmt], parent: ast.AST | None) -> None:
        for stmt in stmts:
            self.statement(stmt, parent)

    def statement(self, stmt: ast.stmt, parent: ast.AST | None) -> None:
        if _skipped(stmt):
            return
        outer = self.scope
        try:
            self._statement(stmt, parent)
        finally:
            self.scope = outer

    def _statement(self, stmt: ast.stmt, parent: ast.AST | None) -> None:
        if not _is_elif(stmt, parent, self) and not isinstance(stmt, ast.ClassDef):
            first = stmt.decorator_list[0].lineno if getattr(stmt, "decorator_list", None) else stmt.lineno  # type: ignore[attr-defined]
            start, end = self.at(first, stmt.col_offset), self.span(stmt)[1]
            self.add(stmt, stmt, "delete", "delete", start, end, "pass")
        if isinstance(stmt, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            self.scope = f"{self.scope}.{stmt.name}" if self.scope else stmt.name
        for field, value in ast.iter_fields(stmt):
            if field in ("decorator_list", "returns", "annotation", "type_comment"):
                continue
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                self.body(value, stmt)
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.excepthandler):
                        self.body(item.body, stmt)
                    elif isinstance(item, ast.AST):
                        self.expression(stmt, item)
            elif isinstance(value, ast.AST) and not isinstance(value, ast.arguments):
                self.expression(stmt, value)
            elif isinstance(value, ast.arguments):
                for default in [*value.defaults, *value.kw_defaults]:
                    if default is not None:
                        self.expression(stmt, default)
        if isinstance(stmt, ast.AugAssign) and type(stmt.op) in (ast.Add, ast.Sub):
            op = TEXT[type(stmt.op)] + "="
            self.operator(stmt, stmt, "arith", stmt.target, stmt.value, op, TEXT[FLIPS[type(stmt.op)]] + "=")

    # -- expressions ------------------------------------------------------------------------

    def expression(self, stmt: ast.stmt, node: ast.AST) -> None:
        if isinstance(node, ast.JoinedStr):  # an f-string: message text
            return
        if isinstance(node, ast.Call) and LOG_CALLS.match(ast.unparse(node.func)):
            return
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for i, op in enumerate(node.ops):
                self.operator(stmt, node, "compare", operands[i], operands[i + 1], TEXT[type(op)], TEXT[FLIPS[type(op)]])
        elif isinstance(node, ast.BoolOp):
            for a, b in zip(node.values, node.values[1:]):
                self.operator(stmt, node, "boolop", a, b, TEXT[type(node.op)], TEXT[FLIPS[type(node.op)]])
        elif isinstance(node, ast.BinOp) and type(node.op) in (ast.Add, ast.Sub):
            self.operator(stmt, node, "arith", node.left, node.right, TEXT[type(node.op)], TEXT[FLIPS[type(node.op)]])
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            self.add(stmt, node, "not", "drop `not`", *self.span(node), f"({self.code(node.operand)})")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "reversed" and len(node.args) == 1:
            self.add(stmt, node, "reversed", "drop `reversed`", *self.span(node), f"({self.code(node.args[0])})")
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            self.add(stmt, node, "bool", f"`{node.value}` -> `{not node.value}`", *self.span(node), str(not node.value))
        elif isinstance(node, ast.Constant) and isinstance(node.value, int):
            for new in (node.value + 1, node.value - 1):
                self.add(stmt, node, "number", f"`{node.value}` -> `{new}`", *self.span(node), f"({new})")
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.expression(stmt, child)
            elif isinstance(child, ast.comprehension):
                for part in (child.iter, *child.ifs):
                    self.expression(stmt, part)
            elif isinstance(child, ast.keyword):
                self.expression(stmt, child.value)


def _skipped(stmt: ast.stmt) -> bool:
    """Statements no test could see mutated (see mutation_core.py's docstring)."""
    if isinstance(stmt, ast.Import | ast.ImportFrom | ast.Pass | ast.Assert | ast.Global | ast.Nonlocal):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):  # docstrings
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and LOG_CALLS.match(ast.unparse(stmt.value.func)):
        return True
    if isinstance(stmt, ast.AnnAssign) and stmt.value is None:  # an annotation alone
        return True
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
    if any(isinstance(t, ast.Name) and t.id in SKIPPED_NAMES for t in targets):
        return True
    if isinstance(stmt, ast.ClassDef) and any(ast.unparse(b) in ("Protocol", "typing.Protocol") for b in stmt.bases):
        return True  # a type: its methods are declarations, never run
    return isinstance(stmt, ast.If) and ast.unparse(stmt.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _is_elif(stmt: ast.stmt, parent: ast.AST | None, finder: _Finder) -> bool:
    """An ``elif`` (an ``if`` alone in its parent's ``else``): deleting it would splice badly."""
    if not (isinstance(stmt, ast.If) and isinstance(parent, ast.If) and parent.orelse == [stmt]):
        return False
    return finder.source[finder.at(stmt.lineno, stmt.col_offset) :].startswith(b"elif")


def mutants_of(path: str, source: bytes) -> list[Mutant]:
    """Every mutant of one module, in source order."""
    finder = _Finder(path, source)
    tree = ast.parse(source)
    _strip_raises(tree)
    finder.body(tree.body, None)
    return sorted(finder.found, key=lambda m: (m.start, m.kind, m.description))


def _strip_raises(tree: ast.AST) -> None:
    """A ``raise``'s exception and cause are error messages: nothing in them is mutated."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise):
            node.exc = node.cause = None
