"""Shared fixtures and helpers of the whole suite.

- bundled servers: :func:`scripted` players, :func:`example_rows`, :func:`play_episode` on an
  env, and the ``launched`` fixture (the three example servers, one process each, for the
  session);
- the launcher's fixture servers: ``launch_specs`` (``tests/fixtures/servers/launch``) and a
  ``launcher`` per test;
- processes, read from ``/proc``: :func:`pid_alive`, :func:`group_members`,
  :func:`descendants`, :func:`wait_until`, :func:`wait_gone`.

Fixture servers and data live in ``tests/fixtures`` (:mod:`tests.fixtures`).

Under pytest-xdist (the README's test command: ``-n 3 --dist loadgroup``) every module runs whole
on one worker, so a module-scoped server starts once; the folders of :data:`SHARED_STACKS`,
whose tests share one package-scoped stack, run whole on one worker each. The reliability
suite's figures travel in the reports and are printed (and written) here, on the controller.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

# The suite's workers keep both cores busy, where OpenMP threads that spin between a decoding
# step's parallel regions cost more than they win (nemo_gym_env/policies/batching.py): they sleep
# here, in this process and the commands it starts. Set before anything imports torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# And each worker's share of the cores for its threads: an OpenMP team of two on cores the other
# workers also want waits at every barrier for its descheduled thread (a GRPO step of the recipe
# took 233 s with two threads against 120 s with one, next to a busy core). Ray sets its own.
# The CPUs are counted here, not with nemo_gym_env's available_cpus(): importing the package loads
# numpy, whose OpenBLAS reads its thread count once, at load.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    _share = str(max(1, len(os.sched_getaffinity(0)) // _workers))
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_name, _share)

import pytest

from nemo_gym_env.bridge.targets import hosted_library
from nemo_gym_env.launch.catalog import bundled_servers, bundled_spec, missing_extra
from nemo_gym_env.server import testing

if TYPE_CHECKING:
    from nemo_gym_env.launch.config import ServerSpec
    from nemo_gym_env.launch.launcher import Launcher

EXAMPLES = ["example_single_tool_call", "example_multi_step", "example_session_state_mgmt"]
BUNDLED = sorted(bundled_servers())
HOSTED = [name for name in BUNDLED if hosted_library(bundled_spec(name).config)]
"""Bundled servers that host another library's env (the bridge): their rewards are that env's own
(a taxi's -1 a step, a blackjack loss), checked against the raw env in tests/bridge."""
JUDGED = [name for name in BUNDLED if name not in HOSTED]
"""Bundled servers whose ``/verify`` judges the episode: a correct play scores 1.0, a wrong one 0.0."""


def with_extras(servers: list[str]) -> list[Any]:
    """``servers`` as parameters; one whose config ``requires`` an extra not installed here is
    skipped, saying which extra and how to install it."""
    def marks(server: str) -> list[Any]:
        need = missing_extra(server)
        reason = f"{server} needs the {need} extra: pip install 'nemo-gym-env[{need}]'"
        return [pytest.mark.skip(reason=reason)] if need else []

    return [pytest.param(server, marks=marks(server)) for server in servers]


TESTS = Path(__file__).resolve().parent
SHARED_STACKS = {
    "interop": "one ng_run of NeMo Gym 0.4.0 (the package-scoped ng_stack fixture)",
    "ray_cluster": "one two-node Ray cluster (the package-scoped ray_cluster fixture)",
}
"""Folders under tests/ whose tests share a package-scoped stack: one xdist group each."""
FIGURE = "figure"
"""The ``user_properties`` key of a figure the reliability suite measured."""
FIGURES_ENV = "NEMO_GYM_ENV_FIGURES"


def scripted(server: str) -> Callable:
    """The bundled server's scripted player: ``scripted_action(row, history, correct=...)``."""
    return importlib.import_module(f"nemo_gym_env.servers.{server}.scripted").scripted_action


def example_rows(server: str) -> list[dict]:
    from nemo_gym_env.launch.catalog import bundled_dataset

    return [json.loads(line) for line in Path(bundled_dataset(server)).read_text().splitlines() if line.strip()]


def play_episode(env, server: str, *, correct: bool = True, **reset_kwargs) -> tuple[float, bool, bool, dict]:
    """Play one scripted episode on a (single) env; returns the last (reward, terminated, truncated, info)."""
    return testing.play_episode(env, scripted(server), correct=correct, max_turns=50, **reset_kwargs)


@pytest.fixture(scope="session")
def launched() -> Iterator[dict[str, str]]:
    """One launched process per example server for the whole session: name -> base URL."""
    from nemo_gym_env.launch.catalog import bundled_spec
    from nemo_gym_env.launch.launcher import Launcher

    with Launcher() as launcher:
        processes = launcher.start_all([bundled_spec(name) for name in EXAMPLES])
        yield {p.name: p.url for p in processes}


@pytest.fixture(scope="session")
def launch_specs() -> dict[str, ServerSpec]:
    """The launcher's fixture servers (``tests/fixtures/servers/launch``), by instance name."""
    from .fixtures import fixture_specs

    return fixture_specs("launch")


@pytest.fixture
def launcher() -> Iterator[Launcher]:
    """A :class:`Launcher` for one test, closed (every server stopped) after it."""
    from nemo_gym_env.launch.launcher import Launcher

    with Launcher(ready_timeout_s=30) as launcher:
        yield launcher


# ---- processes ---------------------------------------------------------------------------------


def proc_state(pid: int) -> tuple[str, int] | None:
    """(state, process group) of a pid from /proc, or None if it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0], int(fields[2])


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has exited)."""
    state = proc_state(pid)
    return state is not None and state[0] not in "ZX"


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) members of a process group, by scanning /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            state = proc_state(int(entry))
            if state is not None and state[1] == pgid and state[0] not in "ZX":
                members.append(int(entry))
    return members


def descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (walking /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def wait_until(predicate: Callable[[], Any], timeout_s: float, interval_s: float = 0.05) -> Any:
    """Poll ``predicate`` until it is truthy or ``timeout_s`` passes; returns its last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval_s)


_EXEC_WITH_SIGINT_IGNORED = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                             "os.execvp(sys.argv[1], sys.argv[1:])")


def as_a_background_job(command: list[str]) -> list[str]:
    """``command`` started as a shell without job control starts a background job: with SIGINT ignored, which
    exec keeps (the same process id; no ``preexec_fn`` in a threaded test process)."""
    return [sys.executable, "-c", _EXEC_WITH_SIGINT_IGNORED, *command]


def wait_gone(pids: set[int], timeout: float = 15.0) -> set[int]:
    """The pids still alive after waiting up to ``timeout``."""
    wait_until(lambda: not any(pid_alive(p) for p in pids), timeout, 0.1)
    return {p for p in pids if pid_alive(p)}


# ---- pytest-xdist groups, and the figures of the run --------------------------------------------


def xdist_group(path: Path) -> str:
    """The xdist group of a test file: its folder's when the folder shares one stack, else the file."""
    relative = path.resolve().relative_to(TESTS.parent)  # tests/... or servers/<name>/tests/...
    if relative.parts[0] == "tests" and relative.parts[1] in SHARED_STACKS:
        return "/".join(relative.parts[:2])
    return relative.as_posix()


def group_of(item: pytest.Item) -> str:
    """The group pytest-xdist gives ``item`` (the ``@group`` of its node id): its xdist_group names, sorted, joined."""
    names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    return "_".join(sorted(names))


GROUP_SECONDS: dict[str, float] = json.loads((TESTS / "group_seconds.json").read_text())
"""Seconds each group took in a measured run (``scripts/group_seconds.py`` writes them): only their order counts."""


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks (it runs only with --dist loadgroup)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(xdist_group(item.path)))
    # The longest groups first (pytest-xdist hands out groups in this order, see pytest_configure): a long
    # group left for the end would run alone while the other workers idle. A group the file does not know
    # (a new test file) counts as the median; the sort is stable, so each group keeps its tests' order.
    known = sorted(GROUP_SECONDS.values())
    median = known[len(known) // 2] if known else 0.0
    items.sort(key=lambda item: -GROUP_SECONDS.get(group_of(item), median))


def pytest_configure(config: pytest.Config) -> None:
    """Refuse ``--dist loadgroup`` when it would split the groups: pytest-xdist tags each test's node id
    with its group through the ``_nodeid`` attribute, which pytest 9.2 no longer has; untagged, every
    worker would start its own copy of a shared stack (a Ray cluster, NeMo Gym, a GRPO run)."""
    import _pytest.nodes

    if config.getoption("dist", "no") == "loadgroup" and not hasattr(_pytest.nodes.Node, "_nodeid"):
        raise pytest.UsageError(
            f"--dist loadgroup cannot group tests under pytest {pytest.__version__}: "
            "install the versions the 'test' extra names (pip install -e '.[test]')")
    # Hand the groups out in the order pytest_collection_modifyitems gives them (longest first), not
    # sorted by their number of tests (pytest-xdist's default).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    if not hasattr(config, "workerinput"):  # once, on the controller, before any worker starts
        _compile_sources()


def _compile_sources() -> None:
    """Byte-compile this checkout's packages once: the suite starts some 1,500 Python processes (servers,
    commands, workers), and where ``PYTHONDONTWRITEBYTECODE`` is set each would compile every module of the
    package it imports from source again (0.05-0.1 s of CPU a process, measured). An installed wheel has
    these files from pip already."""
    import compileall

    root = Path(__file__).resolve().parents[1]
    for folder in ("nemo_gym_env", "servers", "adapters"):
        if (root / folder).is_dir():
            compileall.compile_dir(root / folder, quiet=2, workers=1)


_FIGURES: list[dict[str, Any]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":  # the last report of a test carries every figure it recorded
        _FIGURES.extend(value for key, value in report.user_properties if key == FIGURE)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _FIGURES:
        return
    terminalreporter.section("reliability figures")
    for fig in _FIGURES:
        value = fig["value"]
        text = f"{value:.4g}" if isinstance(value, float) else json.dumps(value) if not isinstance(value, str) else value
        terminalreporter.write_line(f"{fig['test']}: {fig['name']} = {text} {fig['unit']}".rstrip())
    path = os.environ.get(FIGURES_ENV)
    if path:
        existing = json.loads(Path(path).read_text()) if Path(path).is_file() else []
        keys = {(f["test"], f["name"]) for f in _FIGURES}
        merged = [f for f in existing if (f["test"], f["name"]) not in keys] + _FIGURES
        Path(path).write_text(json.dumps(merged, indent=1) + "\n")
