"""Every public error of ``nemo_gym_env``, under one base class.

A caller that wants to handle anything this package raises on purpose catches one name::

    from nemo_gym_env.errors import NemoGymError

    try:
        env.step(action)
    except NemoGymError as exc:
        print(exc)

Each error also derives from the built-in it has always been (``ValueError``, ``RuntimeError``,
``KeyError``), so ``except ValueError`` around an action keeps working. The module imports
nothing beyond the standard library: server processes, the launcher and the env all import it.

Which side raises what:

- the env and its user: :class:`ActionError` (a model turn the env cannot read),
  :class:`ServerError` (a resources server failed or answered unusably; :class:`VerifyFailed`
  when its ``/verify`` reply judged nothing); below it, the transport's :class:`ConnectFailed`
  and :class:`TransportError`;
- the server kit: :class:`SessionLostError` (answered ``410 Gone``), :class:`TaskTimeout` (and
  :class:`TaskLost`), :class:`McpError` (an MCP call failed, either way); a conversational server's
  :class:`ToolError` (a tool call it refuses) and :class:`UserFailure` (its simulated user could not answer);
- configs, launching, the catalog: :class:`ConfigError`, :class:`LaunchError`,
  :class:`ServerCrashed`, :class:`UnknownServerError`, :class:`ScaffoldError`;
- data and rollout files: :class:`DatasetError`, :class:`RolloutFileError`;
- policies: :class:`PolicyError` (and :class:`PolicyTimeout`, :class:`EndpointUnreachable`),
  :class:`ModelProvisionError`, :class:`NoContinuation`;
- scale-out and trainer adapters: :class:`ClusterConnectionError`, :class:`ClusterCapacityError`,
  :class:`WorkersLost`, :class:`NemoRLFormatError`, :class:`RolloutFailed`;
- the command line: :class:`UsageError`;
- the rollout viewer and play pages: :class:`PageRequestError` (a request their API refuses),
  :class:`RowGoneError` (a file rewritten under the viewer's index).

One exception is not an error and is not under :class:`NemoGymError`: :class:`Stopped`, raised
by SIGTERM inside :func:`~nemo_gym_env.system.processes.sigterm_raises`. It is a
``KeyboardInterrupt``, as Ctrl-C is, so that no ``except Exception`` on the way swallows a
request to stop and every ``finally`` runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "ActionError",
    "ClusterCapacityError",
    "ClusterConnectionError",
    "ConfigError",
    "ConnectFailed",
    "DatasetError",
    "EndpointUnreachable",
    "LaunchError",
    "McpError",
    "ModelProvisionError",
    "NemoGymError",
    "NemoRLFormatError",
    "NoContinuation",
    "PageRequestError",
    "PolicyError",
    "PolicyTimeout",
    "RolloutFailed",
    "RolloutFileError",
    "RowGoneError",
    "ScaffoldError",
    "ServerCrashed",
    "ServerError",
    "SessionLostError",
    "Stopped",
    "TaskLost",
    "TaskTimeout",
    "ToolError",
    "TransportError",
    "UnknownServerError",
    "UsageError",
    "UserFailure",
    "VerifyFailed",
    "WorkersLost",
]


class NemoGymError(Exception):
    """Base class of every error this package raises on purpose."""


# ---- the env ---------------------------------------------------------------------------------


class ActionError(NemoGymError, ValueError):
    """An action the env cannot interpret; the episode is left exactly as it was."""


class ServerError(NemoGymError, RuntimeError):
    """A resources server could not be reached or answered unusably.

    Attributes name the server URL, the route and the task index so the message says where
    to look; ``status_code`` is the HTTP status when there was one.
    """

    def __init__(self, message: str, *, server: str, route: str, task_index: int | None = None,
                 status_code: int | None = None):
        where = f"{server}{route}" + (f" (task {task_index})" if task_index is not None else "")
        super().__init__(f"{where}: {message}")
        self.server = server
        self.route = route
        self.task_index = task_index
        self.status_code = status_code


class VerifyFailed(ServerError):
    """``/verify`` answered, but with no judgement of the model (an infrastructure or task-row failure,
    see :mod:`nemo_gym_env.protocol.failures`): the episode has no reward.

    Attributes:
        kind: The reply's ``failure_kind`` (``"masked"`` for a bare ``mask_sample: true``).
        reply: The ``/verify`` reply as it came.
    """

    def __init__(self, message: str, *, server: str, route: str, kind: str, reply: dict[str, Any],
                 task_index: int | None = None):
        super().__init__(message, server=server, route=route, task_index=task_index)
        self.kind = kind
        self.reply = reply


class ConnectFailed(NemoGymError):
    """Nothing was sent: the connection could not be opened (safe to retry)."""


class TransportError(NemoGymError):
    """The connection failed or the reply was malformed after the request was sent (not retried:
    the request may have reached the server)."""


# ---- the server kit ----------------------------------------------------------------------------


class SessionLostError(NemoGymError):
    """The request's session cookie was not signed by this launch of the server; answered 410."""

    def __str__(self) -> str:
        return ("the session cookie was not issued by this launch of the server (the server restarted, "
                "the session expired, or the cookie is forged): this session's state is gone. "
                "Start a new episode with POST /seed_session.")


class TaskTimeout(NemoGymError):
    """A task did not finish within its time limit; the worker that ran it was stopped."""


class McpError(NemoGymError, RuntimeError):
    """An MCP call failed, either way: an MCP server behind a resources server did not start, did not
    answer in time, or exited; or a call of an MCP client's episode could not be made. ``gone`` is
    True when the connection to the MCP server is closed for good (the episode cannot go on);
    ``timed_out`` when the call got no answer in time."""

    def __init__(self, message: str, *, gone: bool = False, timed_out: bool = False):
        super().__init__(message)
        self.gone = gone
        self.timed_out = timed_out


class TaskLost(TaskTimeout):
    """The worker running a task was lost (its process killed, its node gone) before it answered.

    A :class:`TaskTimeout` too: either way the task gave no result, and retrying it can succeed.
    """


# ---- configs, launching, the catalog ----------------------------------------------------------


class ToolError(NemoGymError):
    """A conversational server refuses a tool call (bad arguments, against its rules): the agent reads the message."""


class UserFailure(NemoGymError, RuntimeError):
    """A conversation's simulated user could not answer (its model failed, timed out or said nothing): the
    episode fails, it is never rewarded."""


class ConfigError(NemoGymError, ValueError):
    """A user-facing configuration problem; the message names the file or key and the fix."""


class LaunchError(NemoGymError, RuntimeError):
    """A server could not be started, restarted or found.

    ``status_code`` is the HTTP status when a server (a head server, say) answered one.
    """

    def __init__(self, message: str = "", *, status_code: int | None = None):
        super().__init__(message)
        self.status_code = status_code


CANNOT_START = ": cannot start: "
"""What a server that fails to start writes after its name, then the cause, on one line (``server.serving``);
:class:`ServerCrashed` makes that line its message."""


class ServerCrashed(LaunchError):
    """A server process exited while starting.

    Attributes:
        name: The instance name.
        returncode: The exit code (negative: killed by that signal).
        log_tail: The last lines of its log.
    """

    def __init__(self, name: str, returncode: int | None, log_tail: str):
        self.name = name
        self.returncode = returncode
        self.log_tail = log_tail
        mark = f"{name}{CANNOT_START}"
        said = [line for line in log_tail.splitlines() if line.startswith(mark)]
        if said:  # the server named its own failure in one line (``server.serving``): that is the message
            super().__init__(f"server {name!r} did not start: {said[-1][len(mark):]}")
        else:
            super().__init__(f"server {name!r} exited with code {returncode} during start-up; last log lines:\n"
                             f"{log_tail}")


class UnknownServerError(NemoGymError, KeyError):
    """No bundled server has this name; the message lists the available ones."""

    def __str__(self) -> str:  # KeyError would show the message quoted
        return str(self.args[0]) if self.args else ""


class ScaffoldError(NemoGymError, ValueError):
    """The name or the target folder cannot be used; the message says why and what to do."""


# ---- data and rollout files --------------------------------------------------------------------


class DatasetError(NemoGymError, ValueError):
    """A dataset that cannot be used; ``problems`` lists each offending line (``line`` and ``reason``)."""

    def __init__(self, path: str, problems: Sequence[Any]):
        shown = "; ".join(str(p) for p in problems[:5])
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        super().__init__(f"{path}: {len(problems)} invalid row(s): {shown}{more}")
        self.path = path
        self.problems = list(problems)


class RolloutFileError(NemoGymError, ValueError):
    """An existing rollouts file that cannot be resumed (a damaged line that is not the last)."""


# ---- policies ------------------------------------------------------------------------------------


class PolicyError(NemoGymError, RuntimeError):
    """A model call that failed for good: after retries, or with a reply that is not a turn.

    The message never contains the API key.

    Attributes:
        status_code: The HTTP status of the last reply, when there was one.
    """

    def __init__(self, message: str, *, status_code: int | None = None):
        super().__init__(message)
        self.status_code = status_code


class PolicyTimeout(PolicyError):
    """A model call that got no reply in time: every attempt timed out, or the turn's deadline passed.

    A rollout that fails with it is a ``policy_timeout``; a reply that came (a 429 whose wait would
    pass the deadline included) is a plain :class:`PolicyError`.
    """


class EndpointUnreachable(PolicyError):
    """The policy's endpoint refuses every connection: a run stops on it rather than failing each rollout."""


class NoContinuation(NemoGymError):
    """A chat template cannot render new messages as a suffix of the earlier ones, so a multi-turn
    prompt cannot extend the previous one token for token."""


class ModelProvisionError(NemoGymError, RuntimeError):
    """The default model could not be downloaded or converted; the message says what to do."""


# ---- scale-out and trainer adapters --------------------------------------------------------------


class WorkersLost(NemoGymError, RuntimeError):
    """Every Ray worker died before the collection finished.

    Attributes:
        missing: The keys of the rollouts that never finished.
    """

    def __init__(self, message: str, missing: list[Any]):
        super().__init__(message)
        self.missing = missing

    def __reduce__(self) -> tuple:
        return type(self), (self.args[0], self.missing)


class ClusterConnectionError(NemoGymError, ConnectionError):
    """The Ray cluster cannot be joined: nothing listens at its address, or it wants a token this
    process lacks; the message names the address, the cause and what to set."""


class ClusterCapacityError(NemoGymError, RuntimeError):
    """What was asked of the Ray cluster cannot fit in it (CPUs or GPUs); the message gives the numbers:
    what is needed, what the cluster has, and what servers and other reservations already hold."""


class NemoRLFormatError(NemoGymError, ValueError):
    """An episode NeMo RL would reject; the message names the turn and the fix."""


class RolloutFailed(NemoGymError, RuntimeError):
    """A row whose rollout failed on every attempt (its policy or server kept failing)."""


# ---- the command line ----------------------------------------------------------------------------


class UsageError(NemoGymError):
    """A mistake in how a command was called; printed as one line, exit code 1."""


class RowGoneError(NemoGymError, LookupError):
    """A row's line is no longer where the viewer's index put it (the file was rewritten): refresh and retry."""


class PageRequestError(NemoGymError):
    """A request the viewer's or play page's API refuses: answered ``{"error": message}`` with ``status``."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


# ---- signals -------------------------------------------------------------------------------------


class Stopped(KeyboardInterrupt):
    """SIGTERM arrived: stop as on Ctrl-C (``signum`` says which signal; the exit code is 128 + it)."""

    def __init__(self, signum: int = 15):
        super().__init__(signum)
        self.signum = signum
