"""The project's errors. The CLI maps each to an exit code and plain lines (no traceback).

Exit codes: 0 ok, 1 the job or the cluster failed, 2 bad input.

Errors carry data, not advice: the API layer (``controller.kube``) says what happened (the
message, the HTTP status, a ``reason`` code like the API's own Status reasons, the object it was
about); the CLI (``controller.cli.advice``) adds what the user should do about it.
"""

from __future__ import annotations


class DdpjobError(Exception):
    """Base class: ``str(err)`` is the message; the CLI may add a hint after it."""

    exit_code = 1


class UserError(DdpjobError):
    """Bad input (spec, flags, files). Nothing was submitted. One line per problem."""

    exit_code = 2

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class ClusterError(DdpjobError):
    """The cluster could not do what was asked.

    ``status`` is the HTTP status (None without an answer); ``reason`` a code saying what went
    wrong (``AlreadyExists``, ``APINotServed``, ``NamespaceNotFound``, ``WebhookUnreachable``,
    ``Unauthorized``, ``NoAnswer``, ``ServerError``, ...); ``kind``/``namespace``/``name`` the
    object it was about, where known.
    """

    exit_code = 1

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        reason: str = "",
        kind: str = "",
        namespace: str = "",
        name: str = "",
    ):
        super().__init__(message)
        self.status, self.reason = status, reason
        self.kind, self.namespace, self.name = kind, namespace, name


class Unreachable(ClusterError):
    """No kubeconfig, or the API server does not answer or rejects our credentials."""


class NotFound(ClusterError):
    """The object (job, pod, namespace) or the whole API (no CRD) does not exist."""


class Conflict(ClusterError):
    """The object already exists (HTTP 409)."""


class Forbidden(ClusterError):
    """RBAC refused the request (HTTP 403)."""


class BadKubeconfig(UserError):
    """The kubeconfig is missing, unreadable or malformed: bad input (exit 2), nothing was sent.
    ``reason``: ``NoKubeconfig`` (no such file) or ``BadKubeconfig``; ``path``: where it looked."""

    def __init__(self, message: str, *, reason: str, path: str):
        super().__init__(message)
        self.reason, self.path = reason, path


class Refused(UserError):
    """The API server or an admission webhook refused what we sent (400, 422, a webhook's
    403): bad input, nothing was created. Carries the status like a ClusterError."""

    def __init__(self, message: str, *, status: int | None = None, reason: str = ""):
        super().__init__(message)
        self.status, self.reason = status, reason


class JobFailed(DdpjobError):
    """The training job ended Failed; the message carries the reason and the last log lines."""

    exit_code = 1
