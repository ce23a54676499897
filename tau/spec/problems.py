"""Problems found in a tau.yaml, and the one exception type the spec package raises.

A researcher fixes a file faster when every mistake is listed at once, each pointing at the
exact place (``compute.gpus`` on line 9, column 9) with a hint about what to write instead.
The loader and the schema both report into a :class:`ProblemCollector`; callers only ever see
:class:`SpecProblem` values, either returned by ``validate()`` or carried by :class:`SpecError`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

#: Path of problems about the document as a whole (size, encoding, YAML syntax, empty file).
DOCUMENT_PATH = "(document)"

#: A file with more mistakes than this is reported in part: nobody reads the thousandth line,
#: and a server must not answer one request with megabytes of errors.
MAX_PROBLEMS = 100

_IDENTIFIER_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


@dataclass(frozen=True, slots=True)
class SpecProblem:
    """One mistake: where it is and what to do about it.

    ``line`` and ``column`` are 1-based positions in the file. They are 0 only for problems
    in data that did not come from a file (``spec_from_dict``).
    """

    path: str
    line: int
    column: int
    message: str
    hint: str | None = None

    def to_dict(self) -> dict[str, str | int | None]:
        return {
            "path": self.path,
            "line": self.line,
            "column": self.column,
            "message": self.message,
            "hint": self.hint,
        }

    def format(self, filename: str | None = None, *, warning: bool = False) -> str:
        """``FILE:LINE:COLUMN: path: message (hint)``, the shape editors and CI logs link;
        ``FILE:LINE:COLUMN: warning: path: …`` for a warning."""
        where = f"{self.line}:{self.column}"
        if filename is not None:
            where = f"{filename}:{where}"
        if warning:
            where += ": warning"
        text = f"{where}: {self.path}: {self.message}"
        if self.hint:
            text += f" ({self.hint})"
        return text

    def __str__(self) -> str:
        return self.format()


class SpecError(ValueError):
    """The spec is not valid; ``errors`` lists every problem found, in file order."""

    def __init__(self, errors: Sequence[SpecProblem], *, filename: str | None = None) -> None:
        self.errors: list[SpecProblem] = list(errors)
        self.filename = filename
        super().__init__(self._summary())

    def _summary(self) -> str:
        name = self.filename or "tau.yaml"
        count = len(self.errors)
        heading = f"{name} is not valid ({count} problem{'s' if count != 1 else ''})"
        return "\n".join([heading, *(f"  {p.format(self.filename)}" for p in self.errors)])


class Located(Protocol):
    """Anything with a 1-based position: the spec's YAML nodes."""

    @property
    def line(self) -> int: ...

    @property
    def column(self) -> int: ...


class ProblemCollector:
    """Gathers problems from the loader and the schema; sorted by position when done."""

    def __init__(self) -> None:
        self._problems: list[SpecProblem] = []
        self._dropped = 0

    def add(self, path: str, at: Located, message: str, hint: str | None = None) -> None:
        self.add_at(path, at.line, at.column, message, hint)

    def add_at(
        self, path: str, line: int, column: int, message: str, hint: str | None = None
    ) -> None:
        if len(self._problems) >= MAX_PROBLEMS:
            self._dropped += 1
            return
        self._problems.append(SpecProblem(path or DOCUMENT_PATH, line, column, message, hint))

    @property
    def full(self) -> bool:
        """Whether further problems are only counted: callers may skip working out their
        words (a hint that searches for a near name costs more than reading the key)."""
        return len(self._problems) >= MAX_PROBLEMS

    def __bool__(self) -> bool:
        return bool(self._problems)

    def __len__(self) -> int:
        return len(self._problems)

    def sorted(self) -> list[SpecProblem]:
        """Problems in file order; a last entry says how many were left out, if any."""
        problems = sorted(self._problems, key=lambda problem: (problem.line, problem.column))
        if self._dropped:
            last = problems[-1]
            problems.append(
                SpecProblem(
                    DOCUMENT_PATH,
                    last.line,
                    last.column,
                    f"{self._dropped} more problem{'s' if self._dropped != 1 else ''} "
                    f"not shown (only the first {MAX_PROBLEMS} are listed)",
                    "fix these first and validate again",
                )
            )
        return problems


def join_path(parent: str, key: str) -> str:
    """``compute`` + ``gpus`` → ``compute.gpus``; odd keys are quoted: ``env["A B"]``."""
    part = key if _IDENTIFIER_KEY.fullmatch(key) else f"[{json.dumps(key)}]"
    if not parent:
        return part if not part.startswith("[") else f"(document){part}"
    return f"{parent}{part}" if part.startswith("[") else f"{parent}.{part}"


def index_path(parent: str, index: int) -> str:
    """``runtime.pip`` + 0 → ``runtime.pip[0]``."""
    return f"{parent or DOCUMENT_PATH}[{index}]"


def quote(text: str, limit: int = 60) -> str:
    """A value shown inside a message, in backticks and shortened when long."""
    shown = text if len(text) <= limit else text[: limit - 1] + "…"
    shown = shown.encode("unicode_escape").decode("ascii") if not shown.isprintable() else shown
    return f"`{shown}`"
