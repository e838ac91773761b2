"""Kubeconfig shapes against the real API server, each used by a real command: what
``controller/kube/transport.py`` reads itself (certificates embedded as data, checked against
``tls-server-name``; a token file with ``insecure-skip-tls-verify``) and what it hands to the
kubernetes client's loader (an ``exec`` credential program); inside a pod, the service account.
A wrong token gets the plain 401 line, and a certificate kubeconfig pointed at another name than
the server's certificate holds is refused by TLS, so the embedded CA really is what is checked.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.e2e.helpers import ddpjob

pytestmark = [pytest.mark.cluster]

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]


def _admin(cluster) -> tuple[dict, dict]:
    """The local cluster's admin kubeconfig: its cluster entry and its user entry."""
    doc = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    return doc["clusters"][0]["cluster"], doc["users"][0]["user"]


def _b64(path: str) -> str:
    return base64.b64encode(Path(path).read_bytes()).decode()


def _kubeconfig(path: Path, cluster: dict, user: dict, namespace: str | None = None) -> Path:
    context = {"cluster": "c", "user": "u", **({"namespace": namespace} if namespace else {})}
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": context}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    return path


PROBE = """\
import sys
from controller.kube.client import Cluster
c = Cluster(kubeconfig=sys.argv[1])
print(c.version()["gitVersion"], c.can_i("create", "pods", namespace=sys.argv[2])[0],
      c.default_namespace(), "kubernetes" in sys.modules)
"""


def _probe(kubeconfig: Path, namespace: str) -> list[str]:
    """(server version, may it create pods, the default namespace, kubernetes imported?)"""
    r = subprocess.run(
        [PY, "-c", PROBE, str(kubeconfig), namespace],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def _works_as_admin(cluster, kubeconfig: Path, namespace: str) -> str:
    """The admin's rights through ``kubeconfig``, the context's namespace the default of every
    command (``list`` without ``-n``); whether the kubernetes client was imported."""
    version, allowed, ns, imported = _probe(kubeconfig, namespace)
    assert version.startswith("v1.") and allowed == "True" and ns == namespace
    r = ddpjob(cluster, "list", "--kubeconfig", str(kubeconfig))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("no PyTorchJobs or TrainJobs in " + namespace), r.stdout
    return imported


def test_embedded_certificates_and_tls_server_name(cluster, namespace, tmp_path):
    server, user = _admin(cluster)
    data = {
        "server": server["server"],
        "certificate-authority-data": _b64(server["certificate-authority"]),
        # The server is dialled at 127.0.0.1; its certificate is checked for this name.
        "tls-server-name": "kubernetes.default.svc",
    }
    creds = {
        "client-certificate-data": _b64(user["client-certificate"]),
        "client-key-data": _b64(user["client-key"]),
    }
    kubeconfig = _kubeconfig(tmp_path / "data", data, creds, namespace)
    assert _works_as_admin(cluster, kubeconfig, namespace) == "False"
    # A name the certificate does not hold: TLS refuses before anything is sent.
    wrong = _kubeconfig(tmp_path / "wrong", {**data, "tls-server-name": "not-it.example"}, creds)
    r = ddpjob(cluster, "list", "-n", namespace, "--kubeconfig", str(wrong))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "does not answer" in r.stderr and "not-it.example" in r.stderr, r.stderr


def test_a_token_file_and_a_wrong_token(cluster, namespace, tmp_path):
    """The namespace's default ServiceAccount (no Role): authenticated, and refused pods."""
    server, _ = _admin(cluster)
    token = cluster.kubectl("create", "token", "default", "-n", namespace).stdout.strip()
    (tmp_path / "sa").mkdir()
    (tmp_path / "sa" / "token").write_text(token)
    insecure = {"server": server["server"], "insecure-skip-tls-verify": True}
    kubeconfig = _kubeconfig(tmp_path / "sa" / "config", insecure, {"tokenFile": "token"})
    version, allowed, ns, imported = _probe(kubeconfig, namespace)
    assert version.startswith("v1.") and allowed == "False" and ns == "default"
    assert imported == "False"
    r = ddpjob(cluster, "list", "-n", namespace, "--kubeconfig", str(kubeconfig))
    assert r.returncode == 1 and "RBAC forbids this" in r.stderr, r.stderr
    bad = _kubeconfig(tmp_path / "bad", insecure, {"token": token[:-4] + "AAAA"})
    r = ddpjob(cluster, "list", "-n", namespace, "--kubeconfig", str(bad))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "rejected our credentials (got 401" in r.stderr, r.stderr
    assert "Refresh the kubeconfig's token" in r.stderr


def test_an_exec_credential_program(cluster, namespace, tmp_path):
    """A user whose credentials a program prints (as EKS's, GKE's and OIDC logins do): loaded by
    the kubernetes client's loader, run, and its client certificate used for real."""
    server, user = _admin(cluster)
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {
            "clientCertificateData": Path(user["client-certificate"]).read_text(),
            "clientKeyData": Path(user["client-key"]).read_text(),
        },
    }
    (tmp_path / "credential.json").write_text(json.dumps(credential))
    execs = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": "cat",
            "args": [str(tmp_path / "credential.json")],
            "interactiveMode": "Never",
        }
    }
    cluster_entry = {
        "server": server["server"],
        "certificate-authority": server["certificate-authority"],
    }
    kubeconfig = _kubeconfig(tmp_path / "exec", cluster_entry, execs, namespace)
    assert _works_as_admin(cluster, kubeconfig, namespace) == "True"


def test_inside_a_pod_the_service_account(cluster, namespace, tmp_path, monkeypatch):
    """No kubeconfig and KUBERNETES_SERVICE_HOST set, as in a pod: the service account's
    folder (CA, token, namespace) and the service address, here pointed at the real API server
    with a real token of the namespace's default ServiceAccount."""
    from urllib.parse import urlparse

    from controller.errors import Forbidden
    from controller.kube import transport
    from controller.kube.client import Cluster

    server, _ = _admin(cluster)
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "ca.crt").write_bytes(Path(server["certificate-authority"]).read_bytes())
    (account / "namespace").write_text(namespace)
    token = cluster.kubectl("create", "token", "default", "-n", namespace).stdout.strip()
    (account / "token").write_text(token)
    url = urlparse(server["server"])
    monkeypatch.setattr(transport, "SERVICE_ACCOUNT", account)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", url.hostname)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(url.port))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    c = Cluster()
    assert c.server == server["server"] and c.default_namespace() == namespace
    assert c.can_i("list", "pods", namespace=namespace)[0] is False  # authenticated, no Role
    with pytest.raises(Forbidden, match="RBAC forbids this"):
        c.list_pods(namespace, "a=b")
