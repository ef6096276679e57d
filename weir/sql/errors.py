"""The one error of the SQL layer: a statement Weir refuses, with its line and column in the script."""

from __future__ import annotations

from dataclasses import dataclass

from weir.core.errors import JobDefinitionError


@dataclass(frozen=True)
class Position:
    """A place in the script text: 1-based line and column."""

    line: int
    column: int

    @classmethod
    def of(cls, text: str, offset: int) -> Position:
        offset = max(0, min(offset, len(text)))
        line = text.count("\n", 0, offset) + 1
        column = offset - (text.rfind("\n", 0, offset) + 1) + 1
        return cls(line, column)

    def __str__(self) -> str:
        return f"{self.line}:{self.column}"


class SqlError(JobDefinitionError):
    """A SQL script Weir does not run: one line, naming what and where (``line:column``)."""

    def __init__(self, message: str, position: Position | None = None) -> None:
        self.message = message
        self.position = position
        super().__init__(message if position is None else f"SQL {position}: {message}")


__all__ = ["Position", "SqlError"]
