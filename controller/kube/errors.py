"""The API layer's one error translation: an HTTP or connection error in, a ``controller.errors``
error out, carrying the HTTP status, a reason code and the object it was about. No advice: what
the user should do is the CLI's (``controller.cli.advice``).
"""

from __future__ import annotations

import json
from typing import Any

from controller.errors import (
    ClusterError,
    Conflict,
    Forbidden,
    NotFound,
    Refused,
    Unreachable,
)


def translate(exc: BaseException, where: str, what: str = "", server: str = "") -> ClusterError:
    """Map a client exception to a project error (returned, for ``raise ... from None``).

    ``where`` starts the message (the command or call, e.g. ``submit``); ``what`` names the
    object (``PyTorchJob ns/name``). The error carries ``status`` and a ``reason`` code; no
    advice.
    """
    from controller.kube.transport import ApiError

    if not isinstance(exc, ApiError):
        return Unreachable(
            f"{where}: the API server at {server or '?'} does not answer (got {short_reason(exc)})",
            reason="NoAnswer",
        )
    status = exc.status or 0
    message = api_message(exc)
    details = _details(exc)
    kind, namespace, name = _about(what)
    data = {"status": status, "kind": kind, "namespace": namespace, "name": name}
    if status == 401:
        return Unreachable(
            f"{where}: the API server rejected our credentials (got 401 {message})",
            reason="Unauthorized",
            **data,
        )
    if status == 403 and "admission webhook" in message:
        return Refused(
            f"{where}: the cluster refused {what or 'the request'} ({message})",
            status=status,
            reason="AdmissionDenied",
        )
    if status == 403 and "exceeded quota" in message:
        # The namespace's ResourceQuota, not RBAC: the request itself was allowed.
        return Refused(
            f"{where}: the namespace's quota refused {what or 'the request'} ({message})",
            status=status,
            reason="QuotaExceeded",
        )
    if status == 403:
        return Forbidden(f"{where}: RBAC forbids this (got {message})", reason="Forbidden", **data)
    if status == 404 and kind and not details.get("name"):
        return NotFound(
            f"{where}: the cluster does not serve {kind}s (got 404 {message})",
            reason="APINotServed",
            **data,
        )
    if status == 404 and details.get("kind") == "namespaces":
        ns = details.get("name", "?")
        return NotFound(
            f"{where}: namespace {ns} does not exist (got 404 {message})",
            reason="NamespaceNotFound",
            **{**data, "namespace": ns},
        )
    if status == 404:
        return NotFound(
            f"{where}: {what or 'object'} not found (got 404 {message})", reason="NotFound", **data
        )
    if status == 409:
        return Conflict(
            f"{where}: {what or 'the object'} already exists (got 409 {message})",
            reason="AlreadyExists",
            **data,
        )
    if status in (400, 422):
        return Refused(
            f"{where}: the API server rejected {what or 'the request'} (got {status} {message})",
            status=status,
            reason="Invalid",
        )
    if "failed calling webhook" in message:
        return ClusterError(
            f"{where}: an admission webhook did not answer (got {status} {message})",
            reason="WebhookUnreachable",
            **data,
        )
    return ClusterError(
        f"{where}: the API server failed (got {status} {message})", reason="ServerError", **data
    )


def _about(what: str) -> tuple[str, str, str]:
    """``"PyTorchJob ns/name"`` -> ("PyTorchJob", "ns", "name"); ``"PyTorchJob list in ns"``
    -> ("PyTorchJob", "ns", ""). Only job kinds are picked out; anything else gives blanks."""
    from controller.kubeflow import JOB_APIS

    head, _, rest = what.partition(" ")
    if head not in {api.kind for api in JOB_APIS}:
        return "", "", ""
    if rest.startswith("list in "):
        return head, rest.removeprefix("list in "), ""
    namespace, _, name = rest.partition("/")
    return head, namespace, name


def api_message(exc: Any) -> str:
    """The ``message`` of the API's Status body, else the HTTP reason."""
    body = getattr(exc, "body", None)
    if body:
        try:
            data = json.loads(body)
            if isinstance(data, dict) and data.get("message"):
                return str(data["message"])
        except (ValueError, TypeError):
            text = body.decode() if isinstance(body, bytes) else str(body)
            return text.strip()[:300]
    return str(getattr(exc, "reason", "") or exc)


def _details(exc: Any) -> dict[str, Any]:
    """The ``details`` of the API's Status body ({} if none)."""
    try:
        data = json.loads(exc.body or "{}")
    except (ValueError, TypeError):
        return {}
    return (data.get("details") or {}) if isinstance(data, dict) else {}


def short_reason(exc: BaseException) -> str:
    """One line for a connection error: urllib3 nests the real cause several levels deep."""
    seen = exc
    reason = getattr(seen, "reason", None)
    while isinstance(reason, BaseException):
        seen, reason = reason, getattr(reason, "reason", None)
    text = str(seen)
    if "Connection refused" in text:
        return "connection refused"
    if "timed out" in text.lower():
        return "timed out"
    text = text.split(": ", 1)[-1] if "object at 0x" in text else text
    return text.strip()[:160] or type(exc).__name__
