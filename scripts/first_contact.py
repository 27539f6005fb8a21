"""First contact: the README's main job and a new user's next steps, each in a fresh virtualenv.

The test suite runs in one virtualenv with every extra, which hides a dependency that one extra
misses. This script walks the paths a new user takes, with exactly the installs they name:

1. ``main-job``: the README's main-job command, read from README.md (``scripts/readme_commands.py``),
   run as written in a copy of this checkout (its own ``.venv``, only the extras it names) with
   an empty model cache (``NEMO_GYM_ENV_CACHE`` in a new folder); exit 0 and a rollouts file;
2. ``pip-check``: that virtualenv's installed requirements are all there (``pip check``);
3. ``view``: ``nemo-gym-env view`` on that file answers its page, its scripts and its API, shows
   every row, and its summary agrees with ``rollouts_metrics.json``;
4. ``reverify``: ``nemo-gym-env reverify`` on that file exits 0;
5. ``resume``: the same command with ``--resume`` says it has nothing left to run and adds no row;
6. ``core-install``: a second fresh virtualenv with ``pip install -e .`` alone (no extras);
7. ``core-gym-make``: ``examples/quickstart.py`` there plays the example servers through
   ``gymnasium.make`` (every correct scripted play scores 1, every wrong one 0);
8. ``core-rollouts``: ``nemo-gym-env rollouts --policy scripted`` there, on an example server.

Each step prints its name, its time and its outcome; the script exits 1 when any step failed.
Standard library only (it runs before any virtualenv exists). The virtualenvs go to a temporary
folder outside the checkout, removed at the end unless ``--keep``.

    python3 scripts/first_contact.py                 # about 10 minutes on 2 cores, warm pip cache
    python3 scripts/first_contact.py --keep --workdir /tmp/fc
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from readme_commands import named_extras, readme_command, steps

REPO = Path(__file__).resolve().parent.parent
OUTPUT = Path("results/rollouts.jsonl")
"""Where the main job writes (the ``rollouts`` default, relative to where it runs)."""
EXAMPLE_SERVER = "example_multi_step"
"""The server the core install plays with ``--policy scripted``."""


PIP_NOISE = ("WARNING: Location", "Looking in", "Processing ", "Collecting ", "Downloading ", "Using cached",
             "Requirement already", "Obtaining ", "Installing build", "Checking if", "Getting requirements",
             "Preparing ", "Building ", "Created wheel", "Stored in", "Attempting uninstall", "Found existing",
             "Uninstalling ", "Successfully uninstalled")
"""Progress lines of pip not shown (they are in the step's log)."""


NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""The viewer listens on loopback: no proxy from the environment in between."""


class StepFailed(Exception):
    """A step's check did not hold; the message says which and what was seen."""


def log(message: str) -> None:
    print(f"[first-contact] {message}", flush=True)


def user_env(**extra: str) -> dict[str, str]:
    """This environment as a new user's shell has it: no virtualenv active, stdin closed by the caller."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    active = os.environ.get("VIRTUAL_ENV")
    if active:
        env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                      if Path(p) != Path(active) / "bin")
    env.update(extra)
    return env


def run(command: list[str] | str, cwd: Path, env: dict[str, str], timeout_s: float, log_file: Path) -> str:
    """Run a command with its output shown and kept in ``log_file``; returns the output, raises on failure."""
    shown = command if isinstance(command, str) else " ".join(command)
    log(f"  $ {shown}")
    with log_file.open("w") as out:
        proc = subprocess.Popen(command, cwd=cwd, env=env, shell=isinstance(command, str), text=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                executable="/bin/bash" if isinstance(command, str) else None,
                                start_new_session=True)
        lines = []
        timed_out = threading.Event()

        def kill() -> None:  # a silent hang is cut off too, not only one that prints
            timed_out.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

        timer = threading.Timer(timeout_s, kill)
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                out.write(line)
                if not line.lstrip().startswith(PIP_NOISE) and "━━" not in line:
                    sys.stdout.write(f"    {line}")
            code = proc.wait()
        finally:
            timer.cancel()
    if timed_out.is_set():
        raise StepFailed(f"{shown!r} ran past {timeout_s:.0f} s (log: {log_file})")
    text = "".join(lines)
    if code != 0:
        raise StepFailed(f"{shown!r} exited {code} (log: {log_file}); last lines:\n{''.join(lines[-15:])}")
    return text


def count_rows(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip())


def get(url: str, timeout_s: float = 30.0) -> tuple[int, str, bytes]:
    """GET ``url``: (status, content type, body); a non-2xx status is a failure of the step."""
    try:
        with NO_PROXY.open(url, timeout=timeout_s) as reply:
            return reply.status, reply.headers.get("content-type", ""), reply.read()
    except OSError as exc:
        raise StepFailed(f"GET {url}: {exc}") from None


def get_json(url: str) -> dict:
    status, kind, body = get(url)
    if "json" not in kind:
        raise StepFailed(f"GET {url}: {status} {kind}, not JSON")
    return json.loads(body)


class FirstContact:
    """The steps, sharing the folders and what earlier steps made."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.job_dir = work / "main-job"
        self.core_dir = work / "core"
        self.model_cache = work / "model-cache"
        self.main_job = readme_command("main-job")
        self.env = user_env(NEMO_GYM_ENV_CACHE=str(self.model_cache))
        self.output = self.job_dir / OUTPUT
        self.main_job_output = ""

    def copy_checkout(self, target: Path) -> None:
        """This checkout's files as a fresh clone would have them (tracked and not ignored)."""
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
        for name in filter(None, listed):
            source = REPO / name
            if source.is_file():
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target / name)

    def venv_bin(self, folder: Path, name: str) -> str:
        return str(folder / ".venv" / "bin" / name)

    # ---- the main job and the user's next steps ------------------------------------------------

    def step_main_job(self) -> str:
        self.copy_checkout(self.job_dir)
        self.model_cache.mkdir()
        log(f"  extras named: {', '.join(named_extras(self.main_job)) or '(none)'}; "
            f"NEMO_GYM_ENV_CACHE={self.model_cache} (empty)")
        out = self.main_job_output = run(self.main_job, self.job_dir, self.env, 45 * 60, self.logs / "main-job.log")
        if not self.output.is_file() or count_rows(self.output) == 0:
            raise StepFailed(f"the main job exited 0 but wrote no rows to {OUTPUT}")
        if str(OUTPUT) not in out:
            raise StepFailed(f"the main job's output does not name its rollouts file {OUTPUT}")
        return f"{count_rows(self.output)} rows in {OUTPUT}"

    def step_pip_check(self) -> str:
        out = run([self.venv_bin(self.job_dir, "python"), "-m", "pip", "check"], self.job_dir, self.env, 300,
                  self.logs / "pip-check.log")
        return out.strip().splitlines()[-1] if out.strip() else "ok"

    def step_view(self) -> str:
        rows = count_rows(self.output)
        metrics = json.loads(self.output.with_name(f"{self.output.stem}_metrics.json").read_text())
        log_file = (self.logs / "view.log").open("w")
        proc = subprocess.Popen([self.venv_bin(self.job_dir, "nemo-gym-env"), "view", str(OUTPUT), "--port", "0"],
                                cwd=self.job_dir, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=log_file, text=True)
        try:
            assert proc.stdout is not None
            first = proc.stdout.readline()
            match = re.search(r"(http://127\.0\.0\.1:\d+)/", first)
            if not match:
                raise StepFailed(f"view printed no URL on its first line: {first!r} (log: {self.logs / 'view.log'})")
            base = match[1]
            _, kind, page = get(base + "/")
            if "html" not in kind:
                raise StepFailed(f"GET / answered {kind}, not HTML")
            assets = re.findall(rb'(?:src|href)="(/static/[^"]+)"', page)
            if not assets:
                raise StepFailed("the page links none of its scripts or styles")
            for asset in assets:
                get(base + asset.decode())
            status_reply = get_json(base + "/api/status")
            listing = get_json(base + "/api/rollouts?limit=500")
            if listing["total"] != rows or listing["matched"] != rows:
                raise StepFailed(f"the viewer lists {listing['total']} rows ({listing['matched']} matched), "
                                 f"the file has {rows}")
            for number in (0, rows - 1):
                detail = get_json(f"{base}/api/rollouts/0/{number}")
                if not isinstance(detail.get("row"), dict):
                    raise StepFailed(f"/api/rollouts/0/{number} has no row")
            errors = get_json(base + "/api/errors")
            if errors["count"]:
                raise StepFailed(f"the viewer found {errors['count']} unreadable rows: {errors['errors'][:3]}")
            [summary] = get_json(base + "/api/summary")["files"]
            self.check_same_summary(summary, metrics)
        finally:
            proc.send_signal(signal.SIGINT)
            stopping = time.monotonic()
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise StepFailed("view did not stop within 60 s of Ctrl-C") from None
            finally:
                log_file.close()
        if code != 0:
            raise StepFailed(f"view exited {code} on Ctrl-C")
        return (f"the page and its {len(assets)} scripts and styles, /api/status {sorted(status_reply)}, all {rows} "
                f"rows, the summary = the printed table and the metrics file; stopped "
                f"{time.monotonic() - stopping:.1f} s after Ctrl-C")

    def check_same_summary(self, summary: dict, written: dict) -> None:
        """The viewer's summary is the table the main job printed, and counts as ``rollouts_metrics.json`` does.

        Compared: the table's text, and per server and in total the counts, the failure kinds and
        every reward figure (``mean/reward``, ``pass@k/reward``, ...).
        """
        table = summary.get("table", "").strip()
        if not table or table not in self.main_job_output:
            raise StepFailed(f"the viewer's summary table is not the one the main job printed:\n{table}")
        shown = summary["metrics"]
        for scope, ours, theirs in [("total", shown, written),
                                    *[(name, shown.get("per_server", {}).get(name, {}), entry)
                                      for name, entry in written.get("per_server", {}).items()]]:
            for key in ("num_rollouts", "num_failed", "num_masked", "failure_kinds", "agent_metrics"):
                mine, file = ours.get(key), theirs.get(key)
                if key == "agent_metrics":
                    mine, file = ({k: v for k, v in (d or {}).items() if k.endswith("/reward")} for d in (mine, file))
                if mine != file:
                    raise StepFailed(f"{scope}: the viewer's summary has {key} = {mine!r}, rollouts_metrics.json "
                                     f"{file!r}")

    def step_reverify(self) -> str:
        out = run([self.venv_bin(self.job_dir, "nemo-gym-env"), "reverify", str(OUTPUT)], self.job_dir, self.env,
                  15 * 60, self.logs / "reverify.log")
        return out.strip().splitlines()[-1] if out.strip() else "exit 0"

    def step_resume(self) -> str:
        before = self.output.read_bytes()
        *install, job = steps(self.main_job)
        activate = [s for s in install if "activate" in s]
        out = run(" && ".join([*activate, f"{job} --resume"]), self.job_dir, self.env, 15 * 60,
                  self.logs / "resume.log")
        if not re.search(r"\b0 to run\b", out):
            raise StepFailed("the resumed run does not say it has nothing left to run ('0 to run')")
        if self.output.read_bytes() != before:
            raise StepFailed(f"the resumed run changed {OUTPUT} ({count_rows(self.output)} rows now)")
        return "0 to run, file unchanged"

    # ---- the core install alone -----------------------------------------------------------------

    def step_core_install(self) -> str:
        self.copy_checkout(self.core_dir)
        run("python3 -m venv .venv && . .venv/bin/activate && pip install -e . && pip check", self.core_dir,
            self.env, 15 * 60, self.logs / "core-install.log")
        return "pip install -e . (no extras)"

    def step_core_gym_make(self) -> str:
        out = run([self.venv_bin(self.core_dir, "python"), "examples/quickstart.py"], self.core_dir, self.env,
                  5 * 60, self.logs / "core-gym-make.log")
        plays = re.findall(r"scripted (correct|wrong)\s+play: reward (\S+)", out)
        wrong = [(kind, reward) for kind, reward in plays if float(reward) != (1.0 if kind == "correct" else 0.0)]
        if not plays or wrong or "error:" in out:
            raise StepFailed(f"quickstart: {len(plays)} plays, unexpected rewards {wrong[:5]}")
        return f"{len(plays)} scripted episodes through gymnasium.make"

    def step_core_rollouts(self) -> str:
        output = self.core_dir / "results" / "scripted.jsonl"
        run([self.venv_bin(self.core_dir, "nemo-gym-env"), "rollouts", EXAMPLE_SERVER, "--policy", "scripted",
             "--output", str(output)], self.core_dir, self.env, 5 * 60, self.logs / "core-rollouts.log")
        rows = [json.loads(line) for line in output.read_text().splitlines() if line.strip()]
        tasks = count_rows(self.core_dir / "servers" / EXAMPLE_SERVER / "data" / "example.jsonl")
        if len(rows) != tasks or any(row.get("reward") != 1.0 for row in rows):
            raise StepFailed(f"{len(rows)} rows for {tasks} tasks, rewards {[r.get('reward') for r in rows]}")
        return f"{len(rows)} rows, all reward 1.0"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, help="where the virtualenvs go (default: a new temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (virtualenvs, outputs, logs)")
    args = parser.parse_args(argv)
    if args.workdir and args.workdir.exists() and any(args.workdir.iterdir()):
        parser.error(f"--workdir {args.workdir} is not empty: a fresh one is the point")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="first_contact."))
    work.mkdir(parents=True, exist_ok=True)
    guard = FirstContact(work)
    log(f"work folder {work}; the README's main-job command: {guard.main_job}")
    plan: list[tuple[str, Callable[[], str], str | None]] = [
        ("main-job", guard.step_main_job, None),
        ("pip-check", guard.step_pip_check, "main-job"),
        ("view", guard.step_view, "main-job"),
        ("reverify", guard.step_reverify, "main-job"),
        ("resume", guard.step_resume, "main-job"),
        ("core-install", guard.step_core_install, None),
        ("core-gym-make", guard.step_core_gym_make, "core-install"),
        ("core-rollouts", guard.step_core_rollouts, "core-install"),
    ]
    results: dict[str, tuple[str, float, str]] = {}
    started = time.monotonic()
    for number, (name, step, needs) in enumerate(plan, 1):
        log(f"step {number}/{len(plan)} {name}")
        t0 = time.monotonic()
        if needs and results[needs][0] != "ok":
            results[name] = ("skipped", 0.0, f"needs {needs}")
        else:
            try:
                results[name] = ("ok", 0.0, step())
            except StepFailed as exc:
                results[name] = ("FAILED", 0.0, str(exc))
            except Exception as exc:  # noqa: BLE001 (a bug here is a failed step, reported like one)
                results[name] = ("FAILED", 0.0, f"{type(exc).__name__}: {exc}")
        outcome, _, detail = results[name]
        results[name] = (outcome, time.monotonic() - t0, detail)
        log(f"step {number}/{len(plan)} {name}: {outcome} in {results[name][1]:.0f} s: {detail}")
    log(f"summary ({(time.monotonic() - started) / 60:.1f} min in all):")
    for name, (outcome, seconds, detail) in results.items():
        log(f"  {name:<14} {outcome:<7} {seconds:6.0f} s  {detail.splitlines()[0] if detail else ''}")
    failed = [name for name, (outcome, _, _) in results.items() if outcome != "ok"]
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        log(f"kept {work}")
    if failed:
        log(f"FAILED: {', '.join(failed)}")
        return 1
    log("all steps passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
