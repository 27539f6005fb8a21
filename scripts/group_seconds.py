"""Rewrite ``tests/group_seconds.json`` from a test run's JUnit XML: the seconds each pytest-xdist group took.

The suite starts its longest groups first (``tests/conftest.py``), so that no long group is left to
run alone at the end while the other workers idle. The figures only order the groups; a group
missing from the file takes the median. Refresh them after a change that makes a group much
longer or shorter::

    python -m pytest -q -n 3 --dist loadgroup --junitxml=run.xml
    python scripts/group_seconds.py run.xml
"""

from __future__ import annotations

import argparse
import collections
import json
import xml.etree.ElementTree as ET
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "group_seconds.json"


def group_seconds(junit: Path) -> dict[str, float]:
    """Seconds per xdist group (setup, call and teardown of its tests), from the ``@group`` suffix of each test's id."""
    seconds: collections.Counter[str] = collections.Counter()
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "")
        if "@" in name:
            seconds[name.rsplit("@", 1)[1]] += float(case.get("time") or 0.0)
    if not seconds:
        raise SystemExit(f"{junit}: no test carries an xdist group (run with -n N --dist loadgroup)")
    return {group: round(value, 1) for group, value in sorted(seconds.items(), key=lambda kv: -kv[1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit", type=Path, help="the run's --junitxml file")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    figures = group_seconds(args.junit)
    args.out.write_text(json.dumps(figures, indent=1) + "\n")
    print(f"{args.out}: {len(figures)} groups, {sum(figures.values()):.0f} s in all")


if __name__ == "__main__":
    main()
