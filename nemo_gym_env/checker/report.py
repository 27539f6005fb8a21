"""What ``nemo-gym-env check`` found: one :class:`Check` per property, a table for people and JSON for CI.

Example:
    >>> report = Report("http://127.0.0.1:8000")
    >>> report.add("reachable", "pass", "GET / -> 200 in 3 ms").status
    'pass'
    >>> _ = report.add("tools", "warn", "no /openapi.json")
    >>> report.failed, report.counts()
    (False, {'pass': 1, 'warn': 1, 'fail': 0, 'skip': 0})
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["STATUSES", "Check", "Report"]

STATUSES = ("pass", "warn", "fail", "skip")
"""``skip``: the check does not apply to this server (a contract it does not claim, tools it has none of)."""


@dataclass
class Check:
    """One property of the server, and the evidence for the verdict."""

    name: str
    status: str
    evidence: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    """Every check of one server."""

    target: str
    protocol: str | None = None
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, status: str, evidence: str, **details: Any) -> Check:
        """Record a check (``status`` one of :data:`STATUSES`)."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        check = Check(name, status, evidence, details)
        self.checks.append(check)
        return check

    @property
    def failed(self) -> bool:
        """Whether any check failed (the command then exits non-zero)."""
        return any(c.status == "fail" for c in self.checks)

    def counts(self) -> dict[str, int]:
        """How many checks have each status."""
        return {status: sum(c.status == status for c in self.checks) for status in STATUSES}

    def as_json(self) -> dict[str, Any]:
        """The report as plain JSON (``--json``)."""
        return {"target": self.target, "protocol": self.protocol, "ok": not self.failed, "counts": self.counts(),
                "checks": [asdict(c) for c in self.checks]}

    def table(self, width: int = 110) -> str:
        """The report as a table for a terminal: check, verdict, evidence (wrapped)."""
        name_w = max([len("check"), *(len(c.name) for c in self.checks)])
        lines = [f"{self.target}  (protocol: {self.protocol or 'unknown'})",
                 f"{'check':<{name_w}}  result  evidence", f"{'-' * name_w}  ------  {'-' * 40}"]
        room = max(30, width - name_w - 10)
        for check in self.checks:
            wrapped = textwrap.wrap(check.evidence, room) or [""]
            lines.append(f"{check.name:<{name_w}}  {check.status.upper():<6}  {wrapped[0]}")
            lines += [f"{'':<{name_w}}          {more}" for more in wrapped[1:]]
        counts = self.counts()
        lines.append(", ".join(f"{n} {status}" for status, n in counts.items() if n) or "no checks")
        return "\n".join(lines)

    def dumps(self) -> str:
        """``as_json()`` as text."""
        return json.dumps(self.as_json(), indent=2)
