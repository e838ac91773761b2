"""What a piece of the cluster is (a :class:`Component`, a process; a :class:`Step`, work between
them) and what its command line, probe and step may use (the :class:`Context`: paths, ports,
certificates, kubectl). Every room declares its pieces with these; ``localkube/sequence.py``
puts them in order."""

from __future__ import annotations

import ssl
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .pki import PKI


@dataclass
class Context:
    """What a component's command line and probe may use: paths, ports, certificates."""

    repo: Path
    state_dir: Path
    bindir: Path
    manifests: Path
    ports: dict[str, int]
    pki: PKI
    kubectl: Callable[..., object]

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    def kubeconfig(self, user: str) -> str:
        """The kubeconfig ``up`` wrote for ``user`` (``admin`` is the one users export)."""
        if user == "admin":
            return str(self.state_dir / "kubeconfig")
        return str(self.state_dir / f"{user}.kubeconfig")

    def apply(self, text: str, timeout: float = 120) -> None:
        """Server-side apply of YAML ``text`` as field manager ``ddpjob-cluster`` (which owns
        every object the local cluster applies, so a second ``up`` takes them over again)."""
        self.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager",
            "ddpjob-cluster",
            "-f",
            "-",
            input_text=text,
            timeout=timeout,
        )

    def admin_ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.path("ca.crt")))
        ctx.load_cert_chain(str(self.pki.path("admin.crt")), str(self.pki.path("admin.key")))
        return ctx


def http_get(url: str, ctx: ssl.SSLContext | None = None, timeout_s: float = 2.0) -> str:
    """The body of a GET (health endpoints), as text."""
    with urllib.request.urlopen(url, context=ctx, timeout=timeout_s) as resp:
        return resp.read().decode()


@dataclass(frozen=True)
class Component:
    """One long-running process of the cluster."""

    name: str
    argv: Callable[[Context], list[str]]
    ready: Callable[[Context], bool]
    #: "now": wait for it before starting the next entry; "end": wait with the rest at the end.
    wait: Literal["now", "end"] = "end"
    timeout_s: float = 60
    env: Callable[[Context], dict[str, str]] | None = None
    #: Files the command line needs, written just before the start.
    prepare: Callable[[Context], None] | None = None
    ports: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class Step:
    """Work between components (not a process)."""

    name: str
    run: Callable[[Context], None]
