"""The local cluster's S3 server without running it: its pin is what its Go module requires and
what the tools folder records; the objects pods and specs read (the Service, its EndpointSlice,
the Secret); the port check before ``up``. ``test_s3.py`` runs it."""

from __future__ import annotations

import base64
import json
import os

from localkube import procs, sequence, versions
from localkube.addons import s3
from localkube.builds import gotools, s3server
from localkube.node import host
from tests.localkube.namespaces import run_unshared


def test_the_go_module_requires_the_pinned_gateway():
    go_mod = (s3server.GO_DIR / "go.mod").read_text()
    assert s3server.required_version(go_mod) == versions.VERSITYGW
    assert versions.VERSIONS["versitygw"] == versions.VERSITYGW
    # A Kubernetes module never pulls it in (its graph is its own).
    assert s3server.MODULE not in (gotools.GO_DIR / "go.mod").read_text()


def test_required_version_reads_require_lines_only():
    go_mod = (
        "module x\n\nrequire github.com/versity/versitygw v1.8.0\n\n"
        "require (\n\tgithub.com/versity/versitygw-extra v9.9.9 // indirect\n)\n"
        "replace github.com/versity/versitygw => ../vgw\n"
    )
    assert s3server.required_version(go_mod) == "v1.8.0"
    assert s3server.required_version("module x\n") is None


def test_a_changed_pin_names_a_fresh_tools_folder(monkeypatch):
    before = gotools.tools_dir()
    monkeypatch.setitem(versions.S3_SERVER, "versitygw", "v1.7.0")
    assert gotools.tools_dir() != before


def test_pods_reach_the_server_by_a_service_of_the_gateway_address():
    creds = {"AWS_ACCESS_KEY_ID": "ddpjob", "AWS_SECRET_ACCESS_KEY": "s3cr3t"}
    ns, service, slice_, secret = s3.objects(creds)
    assert ns == {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ddpjob-system"}}
    assert service["metadata"] == {"name": "s3", "namespace": "ddpjob-system"}
    # Headless: CoreDNS answers the name with the endpoint's address, and the port is the
    # server's own (no kube-proxy maps one).
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [{"name": "s3", "port": s3.PORT, "targetPort": s3.PORT}]
    assert slice_["metadata"]["labels"]["kubernetes.io/service-name"] == "s3"
    assert slice_["endpoints"] == [{"addresses": [host.GATEWAY], "conditions": {"ready": True}}]
    assert slice_["ports"] == [{"name": "s3", "port": s3.PORT, "protocol": "TCP"}]
    assert f"http://s3.ddpjob-system.svc:{s3.PORT}" == s3.ENDPOINT
    assert secret["metadata"] == {"name": "s3-credentials", "namespace": "default"}
    decoded = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert decoded == creds


def test_the_fixed_port_is_outside_the_pool_of_the_other_components():
    # Below the pool, the NodePort range and the kernel's ephemeral range.
    assert s3.PORT < procs.PORTS_FROM
    assert ("s3" in [c.name for c in sequence.components()]) == s3.ENABLED
    assert s3.preflight in sequence.HOST_CHECKS


def test_preflight_names_the_port_when_something_holds_it():
    """In a network namespace of its own (the machine's may run a cluster's server on it): free,
    then held on every address by another socket."""
    flags = ["--net"] if os.geteuid() == 0 else ["-r", "--net"]
    script = (
        "import json, socket\n"
        "from pathlib import Path\n"
        "from localkube.addons import s3\n"
        "from localkube.procs import LocalkubeError\n"
        "s3.ENABLED = True\n"
        "s3.preflight(Path('.'))\n"  # free: no error
        "held = socket.socket()\n"
        "held.bind(('', s3.PORT))\n"
        "held.listen()\n"
        "try:\n"
        "    s3.preflight(Path('.'))\n"
        "    said = None\n"
        "except LocalkubeError as e:\n"
        "    said = str(e)\n"
        "print(json.dumps({'said': said}))"
    )
    said = json.loads(run_unshared(flags, script).splitlines()[-1])["said"]
    assert said is not None
    assert f"port {s3.PORT} is taken" in said and f"{host.GATEWAY}:{s3.PORT}" in said
    assert "\n" not in said


def test_preflight_passes_while_a_stopped_servers_connections_wait_out_time_wait():
    """The server closes its connections, so each leaves a TIME_WAIT on the gateway's port for
    a minute after it stopped: the next ``up`` (a restart) must not read that as an owner."""
    flags = ["--net"] if os.geteuid() == 0 else ["-r", "--net"]
    script = (
        "import json, socket, subprocess\n"
        "from pathlib import Path\n"
        "from localkube.addons import s3\n"
        "from localkube.node import host\n"
        "s3.ENABLED = True\n"
        "subprocess.run(['ip', 'link', 'set', 'lo', 'up'], check=True)\n"
        "subprocess.run(['ip', 'addr', 'add', host.GATEWAY + '/32', 'dev', 'lo'], check=True)\n"
        "server = socket.socket()\n"
        "server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "server.bind((host.GATEWAY, s3.PORT))\n"
        "server.listen()\n"
        "client = socket.create_connection((host.GATEWAY, s3.PORT))\n"
        "conn, _ = server.accept()\n"
        "conn.close()\n"  # the server's side closes first: its end waits in TIME_WAIT
        "client.recv(1)\n"
        "client.close()\n"
        "server.close()\n"
        "states = subprocess.run(['ss', '-tanH', 'state', 'time-wait'], capture_output=True,\n"
        "                        text=True, check=True).stdout\n"
        "s3.preflight(Path('.'))\n"
        "print(json.dumps({'time_wait': states}))"
    )
    out = json.loads(run_unshared(flags, script).splitlines()[-1])
    assert f"{host.GATEWAY}:{s3.PORT}" in out["time_wait"]  # the state the test is about


def test_credentials_are_drawn_once_per_state_folder(tmp_path):
    first = s3._write_credentials(tmp_path)
    assert first["AWS_ACCESS_KEY_ID"] == s3.ACCESS_KEY
    assert len(first["AWS_SECRET_ACCESS_KEY"]) == 40
    assert s3._write_credentials(tmp_path) == first == s3.credentials(tmp_path)
    assert (s3.data_dir(tmp_path) / "credentials.json").stat().st_mode & 0o077 == 0
    assert s3._write_credentials(tmp_path / "other") != first
