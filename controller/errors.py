"""The project's errors. The CLI maps each to an exit code and one plain line (no traceback).

Exit codes: 0 ok, 1 the job or the cluster failed, 2 bad input.
"""

from __future__ import annotations


class DdpjobError(Exception):
    """Base class: ``str(err)`` is the whole message a user sees."""

    exit_code = 1


class UserError(DdpjobError):
    """Bad input (spec, flags, files). Nothing was submitted. One line per problem."""

    exit_code = 2

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class ClusterError(DdpjobError):
    """The cluster could not do what was asked; the message says what to do about it."""

    exit_code = 1


class Unreachable(ClusterError):
    """No kubeconfig, or the API server does not answer."""


class NotFound(ClusterError):
    """The object (job, pod, CRD) does not exist."""


class Conflict(ClusterError):
    """The object already exists (HTTP 409)."""


class Forbidden(ClusterError):
    """RBAC refused the request (HTTP 403)."""


class JobFailed(DdpjobError):
    """The training job ended Failed; the message carries the reason and the last log lines."""

    exit_code = 1
