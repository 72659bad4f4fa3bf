"""Data-quality issues found while building a cohort: collected, counted, never hidden.

Every check that changes or leaves out data adds an :class:`Issue` saying what was found,
how often, a few examples, and what the builder did about it. Input that cannot be used
at all raises :class:`CohortInputError` before anything is written.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from adni_pu.errors import CohortInputError  # noqa: F401 - re-exported

Severity = Literal["error", "warning", "info"]
MAX_EXAMPLES = 5


@dataclass
class Issue:
    """One kind of problem in one table, with a count and a few examples."""

    kind: str
    table: str
    count: int
    message: str
    action: str
    severity: Severity = "warning"
    examples: list[str] = field(default_factory=list)

    def as_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["examples"] = "; ".join(self.examples)
        return row


class QualityReport:
    """An ordered list of :class:`Issue`, one per (kind, table)."""

    COLUMNS = ("kind", "table", "severity", "count", "message", "action", "examples")

    def __init__(self) -> None:
        self.issues: list[Issue] = []

    def add(
        self,
        kind: str,
        table: str,
        count: int,
        message: str,
        action: str,
        examples: list[Any] | tuple[Any, ...] = (),
        severity: Severity = "warning",
    ) -> None:
        """Record ``count`` occurrences of ``kind`` (no-op for a zero count)."""
        if count <= 0:
            return
        shown = [str(e) for e in list(examples)[:MAX_EXAMPLES]]
        self.issues.append(Issue(kind, table, int(count), message, action, severity, shown))

    def count(self, kind: str) -> int:
        """Total count of issues of ``kind`` over all tables."""
        return sum(i.count for i in self.issues if i.kind == kind)

    def kinds(self) -> set[str]:
        return {i.kind for i in self.issues}

    def to_frame(self):
        """The issues as a DataFrame (one row per issue)."""
        import pandas as pd

        return pd.DataFrame([i.as_row() for i in self.issues], columns=list(self.COLUMNS))

    @classmethod
    def from_frame(cls, frame) -> QualityReport:
        """Rebuild a report from :meth:`to_frame` output (e.g. a quality.csv)."""
        report = cls()
        for row in frame.to_dict("records"):
            examples = str(row.get("examples") or "")
            report.issues.append(Issue(
                kind=str(row["kind"]), table=str(row["table"]), count=int(row["count"]),
                message=str(row["message"]), action=str(row["action"]),
                severity=str(row.get("severity") or "warning"),  # type: ignore[arg-type]
                examples=[e for e in examples.split("; ") if e and examples != "nan"],
            ))
        return report

    def __len__(self) -> int:
        return len(self.issues)

    def __iter__(self):
        return iter(self.issues)
