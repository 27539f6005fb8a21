"""What every benchmark shares: a launched server, the tasks, the scripted episode, results.

Each benchmark script is run as ``python benchmarks/<name>.py``; this module sits beside
it and is imported as ``harness``. Nothing here is timed by itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

SERVER = "example_multi_step"
RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parents[1]
LOAD_AT_START = os.getloadavg()
"""The load average when the benchmark's process began (``machine()`` is often called at its end)."""


# ---- servers and tasks ---------------------------------------------------------------------------


@contextlib.contextmanager
def launched(server: str = SERVER, *, count: int = 1, **config: Any) -> Iterator[list[Any]]:
    """Start ``count`` processes of a bundled server on loopback; yields their ``ServerProcess`` list.

    ``config`` overrides keys of the server's YAML block (``num_workers=2``, ``max_sessions=...``).
    Each process is started separately (its own port): ``count > 1`` is the sharded layout.
    """
    from nemo_gym_env.launch.catalog import bundled_spec
    from nemo_gym_env.launch.launcher import Launcher

    base = bundled_spec(server)
    with Launcher() as launcher:
        procs = []
        for n in range(count):
            name = f"{base.instance_name}_{n}" if count > 1 else base.instance_name
            spec = dataclasses.replace(base, instance_name=name, config={**base.config, **config})
            procs.append(launcher.start(spec))
        yield procs


def tasks(server: str = SERVER) -> list[dict[str, Any]]:
    """The bundled server's example rows."""
    from nemo_gym_env.launch.catalog import bundled_dataset
    from nemo_gym_env.protocol.dataset import load_rows

    return load_rows(bundled_dataset(server))


def player(server: str = SERVER) -> Any:
    """The bundled server's scripted player, ``scripted_action(row, history, correct=True)``."""
    from nemo_gym_env.policies import scripted_player

    return scripted_player(server)


def scripted_requests(row: dict[str, Any], server: str = SERVER) -> list[tuple[str, bytes]]:
    """The (route, JSON body) requests one scripted episode of ``row`` sends, in order.

    Exactly what the env sends: ``/seed_session`` with the row, each tool call's arguments,
    then ``/verify`` with the row and the whole trajectory as a ``Response``. Tool outputs
    are computed by playing the episode against the real tool logic in-process, so the
    bodies match the env's byte for byte except for ids and timestamps.
    """
    from nemo_gym_env.envs.actions import normalize_action
    from nemo_gym_env.protocol.types import FunctionCallOutput, make_response

    play = player(server)
    tool_logic = _tool_logic(server)
    requests: list[tuple[str, bytes]] = [("/seed_session", _dumps(row))]
    trajectory: list[dict[str, Any]] = []
    history: list[dict[str, Any]] = []
    for turn in range(64):
        items = normalize_action(play(row, history), turn=turn)
        trajectory.extend(items)
        calls = [item for item in items if item["type"] == "function_call"]
        if not calls:
            break
        for call in calls:
            arguments = json.loads(call["arguments"])
            requests.append((f"/{call['name']}", _dumps(arguments)))
            output = FunctionCallOutput(call_id=call["call_id"], output=tool_logic(call["name"], arguments))
            item = output.model_dump(exclude_none=True)
            trajectory.append(item)
            history.append(item)
    tools = list(row["responses_create_params"].get("tools") or [])
    response = make_response(trajectory, tools=tools).model_dump(mode="json", exclude_none=True, by_alias=True)
    requests.append(("/verify", _dumps({**row, "response": response})))
    return requests


def _tool_logic(server: str) -> Any:
    if server != SERVER:
        raise ValueError(f"the load generator knows the tools of {SERVER!r} only, not {server!r}")
    from nemo_gym_env.servers.example_multi_step.app import synonym_value

    def call(name: str, arguments: dict[str, Any]) -> str:
        if name == "get_synonym_value":
            return json.dumps({"synonym_value": synonym_value(arguments["synonym"])}, separators=(",", ":"))
        return json.dumps({"success": True}, separators=(",", ":"))

    return call


def _dumps(body: Any) -> bytes:
    return json.dumps(body, ensure_ascii=False, allow_nan=False).encode()


# ---- memory -------------------------------------------------------------------------------------


def _status_kib(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    try:
        import psutil

        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except (ImportError, OSError, ValueError, LookupError):  # no psutil (CI has only the test extra), or gone
        found = []
        for task in Path(f"/proc/{pid}/task").glob("*"):
            with contextlib.suppress(OSError):
                found += [int(c) for c in (task / "children").read_text().split()]
        return found


def rss_mib(pid: int, *, peak: bool = False, tree: bool = True) -> float:
    """Resident memory of ``pid`` (and its descendants, e.g. uvicorn workers), in MiB.

    ``peak=True`` gives the high-water mark (``VmHWM``) instead of the current ``VmRSS``.
    """
    field = "VmHWM" if peak else "VmRSS"
    pids = [pid, *(_children(pid) if tree else [])]
    return sum(_status_kib(p, field) for p in pids) / 1024


def cpu_seconds(pid: int, *, tree: bool = True) -> float:
    """User + system CPU seconds used so far by ``pid`` (and its descendants)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for p in [pid, *(_children(pid) if tree else [])]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


def self_peak_rss_mib() -> float:
    """Peak resident memory of this process, in MiB (``getrusage``; KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---- numbers and output ---------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(values: Sequence[float]) -> float:
    """Median; NaN for no values."""
    return statistics.median(values) if values else float("nan")


def machine() -> dict[str, Any]:
    """What the figures were taken on (they drift with the machine's load: compare ratios)."""
    import gymnasium
    import httpx
    import uvicorn

    fast = {}
    for module in ("uvloop", "httptools"):
        try:
            fast[module] = __import__(module).__version__
        except ImportError:
            fast[module] = None
    from nemo_gym_env.system.cpu import cpu_flags

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "cpu_flags": cpu_flags(),
        "loadavg_at_start": LOAD_AT_START,
        "loadavg_now": os.getloadavg(),
        "gymnasium": gymnasium.__version__,
        "httpx": httpx.__version__,
        "uvicorn": uvicorn.__version__,
        **fast,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def write_results(name: str, results: dict[str, Any], out_dir: Path | None = None) -> Path:
    """Write ``results`` (plus the machine) to ``<out_dir>/<name>.json``; returns the path."""
    out_dir = Path(out_dir) if out_dir is not None else RESULTS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    payload = {"benchmark": name, "machine": machine(), "argv": [_no_path(arg) for arg in sys.argv[1:]], **results}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_finite(payload), indent=2, default=_jsonable, allow_nan=False) + "\n")
    tmp.replace(path)
    return path


def _no_path(arg: str) -> str:
    """An argument as the results file keeps it: a path of this machine outside the checkout is not kept
    (``--option=/a/path`` included)."""
    option, equals, value = arg.partition("=")
    if equals and arg.startswith("--") and os.path.isabs(value):
        return f"{option}={_no_path(value)}"
    if not os.path.isabs(arg):
        return arg
    try:
        return str(Path(arg).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return "<a path outside the checkout>"


def _finite(value: Any) -> Any:
    """NaN and infinities (no data) as null, so the file is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    """A plain aligned text table on stdout."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    if title:
        print(f"\n{title}")
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)))
    sys.stdout.flush()


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)
