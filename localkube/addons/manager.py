"""What the add-ons' operator managers share as host processes: Kueue, Trainer v2 and JobSet
are upstream's controller-runtime managers, each reading a config file (``config.yaml`` in its
state folder, :func:`write_config`) named on one command line (:func:`argv`); they and the
training operator v1 serve webhooks with a certificate from the cluster CA
(:func:`serving_cert`) and say they are ready on ``/readyz`` (:func:`probe_ready`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from ..controlplane.context import http_get

if TYPE_CHECKING:
    from ..controlplane.context import Context

#: The managers' log level: upstream's ``manager_config_patch.yaml`` for each of them.
ZAP_LOG_LEVEL = "2"


def folder(ctx: Context, name: str) -> Path:
    """The manager's state folder (``<state>/<name>``), created."""
    path = ctx.state_dir / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def config_path(ctx: Context, name: str) -> Path:
    return ctx.state_dir / name / "config.yaml"


def write_config(ctx: Context, name: str, config: dict) -> None:
    """The manager's Configuration, as the file :func:`argv` names."""
    folder(ctx, name)
    config_path(ctx, name).write_text(yaml.safe_dump(config))


def argv(ctx: Context, binary: str, name: str, user: str) -> list[str]:
    """``<bindir>/<binary>`` with its config file, the kubeconfig of its client identity
    ``user`` (``bootstrap.USERS``) and upstream's log level."""
    return [
        str(ctx.bindir / binary),
        "--config",
        str(config_path(ctx, name)),
        "--kubeconfig",
        ctx.kubeconfig(user),
        "--zap-log-level",
        ZAP_LOG_LEVEL,
    ]


def serving_cert(
    ctx: Context, name: str, cert_dir: Path, dns: tuple[str, ...] = (), ips: tuple[str, ...] = ()
) -> None:
    """A serving certificate ``name`` for 127.0.0.1 and localhost (and ``dns``, ``ips``) from
    the cluster CA, as ``cert_dir``'s tls.crt and tls.key."""
    crt, key = ctx.pki.issue(
        name, name, server=True, dns=("localhost", *dns), ips=("127.0.0.1", *ips)
    )
    cert_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(crt, cert_dir / "tls.crt")
    shutil.copyfile(key, cert_dir / "tls.key")


def probe_ready(port: str) -> Callable[[Context], bool]:
    """Ready: the health probe on port ``port`` (a name in ``ctx.ports``) answers ``ok`` at
    ``/readyz``."""

    def ready(ctx: Context) -> bool:
        return http_get(f"http://127.0.0.1:{ctx.ports[port]}/readyz") == "ok"

    return ready
