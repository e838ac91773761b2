"""The machine under the local cluster's real node: what the node changes on it, and how it is
put back.

The kubelet, containerd and the CNI plugins change the host beyond their own files: a bridge and
one veth per pod, iptables chains (the kubelet's KUBE-FIREWALL, KUBE-KUBELET-CANARY and
KUBE-IPTABLES-HINT in iptables and ip6tables; the bridge plugin's CNI-* chains), ``/kubepods``
cgroups in every hierarchy, sysctls (the kubelet's kernel tunables, the bridge plugin's
``net.ipv4.ip_forward``), mounts (the kubelet's root-dir bind mount, pod volumes, container
rootfs and shm, network namespaces under /run/netns), and log entries in /var/log/pods and
/var/log/containers.

Before the node starts, :func:`record` writes what the machine looked like to :data:`RECORD`
(in /run, a tmpfs on most systems, so a reboot clears it with the changes it describes; where
/run is on disk, the first ``up`` after a reboot restores the same boot values). It is written
once and removed only by a complete :func:`reset`, so a node that was killed with ``kill -9`` is
still undone by the next ``up`` or ``down``, against the values from before the first start.
There is one node per machine (it owns /kubepods, the bridge, port 53 on the gateway); the
record names the checkout whose cluster holds it.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from ..controlplane import bootstrap
from ..procs import LocalkubeError, proc_start_time

#: ``DDPJOB_NODE=off`` starts the cluster without its real node (non-root machines, or a second
#: checkout on a machine whose node another checkout's cluster holds).
ENABLED = os.environ.get("DDPJOB_NODE", "on") != "off"
DISABLED_HINT = (
    "localkube node: the cluster runs without its real node (got DDPJOB_NODE=off). "
    "Unset DDPJOB_NODE and run `make cluster-down cluster-up`."
)

#: Machine-scoped runtime state (sockets, configs, IPAM leases, the record): usually a tmpfs,
#: like the kernel state it goes with.
RUN_DIR = Path("/run/ddpjob")
#: On disk: containerd's root (imported images survive ``down``) and the kubelet's root-dir
#: (emptyDir volumes live on disk, not in memory).
VAR_DIR = Path("/var/lib/ddpjob")
CONTAINERD_ROOT = VAR_DIR / "containerd"
CONTAINERD_STATE = RUN_DIR / "containerd"
CONTAINERD_CONFIG = RUN_DIR / "containerd.toml"
CONTAINERD_SOCKET = CONTAINERD_STATE / "containerd.sock"
RUNC_ROOT = RUN_DIR / "runc"
CNI_CONF_DIR = RUN_DIR / "cni" / "net.d"
CNI_DATA_DIR = RUN_DIR / "cni" / "networks"
KUBELET_ROOT = VAR_DIR / "kubelet"
#: The folders of the node's ``local`` PersistentVolumes (volumes.py): removed by ``down``.
VOLUMES_DIR = VAR_DIR / "volumes"
COREDNS_CONFIG = RUN_DIR / "Corefile"
RECORD = RUN_DIR / "node.json"

BRIDGE = "ddpjob0"
CNI_NETWORK = "ddpjob"
POD_SUBNET = "10.244.0.0/24"
GATEWAY = "10.244.0.1"
#: The bridge's own MAC address, set so that the kernel keeps it (NET_ADDR_SET): an address
#: nobody set is the lowest of the bridge's ports', and changes as pods come and go
#: (:func:`create_bridge`). Locally administered, unicast.
BRIDGE_MAC = "02:dd:00:f4:00:01"

#: Kernel settings the node changes: the kubelet's tunables (setupKernelTunables) and the CNI
#: bridge plugin's forwarding switch (isGateway).
SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.ip_forward",
)
#: The one rule of ours in the nat table: pods reach the API server at the ``kubernetes``
#: Service's address, as kube-proxy would let them (:func:`forward_kubernetes_service`).
SERVICE_COMMENT = "ddpjob: the kubernetes Service"
#: The kubelet's iptables chains (pkg/kubelet/kubelet_network_linux.go).
KUBELET_CHAINS = ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT")
#: How the CNI plugins mark the iptables rules of our network (as iptables-save prints it).
CNI_COMMENT = f'name: \\"{CNI_NETWORK}\\"'
#: Top-level chains the portmap plugin shares between CNI networks: removed only when we made
#: them and nothing else uses them.
SHARED_CNI_CHAINS = ("CNI-HOSTPORT-DNAT", "CNI-HOSTPORT-SETMARK", "CNI-HOSTPORT-MASQ")
#: Where containerd mounts the pods' network namespaces (and podman its containers').
NETNS_DIR = "/run/netns"
#: Host paths the kubelet or containerd create outside our own folders.
SHARED_PATHS = (
    NETNS_DIR,
    "/var/log/pods",
    "/var/log/containers",
    "/var/lib/cni",
    "/run/containerd",
    # Defaults the node's configuration moves elsewhere; a snapshot shows if one comes back.
    "/var/lib/kubelet",
    "/var/lib/containerd",
    "/usr/libexec/kubernetes",
    "/opt/containerd",
    "/etc/kubernetes",
)
IPTABLES = ("iptables", "ip6tables")
TABLES = ("filter", "nat", "mangle")

#: How each node process is told apart from anything else on the machine (an exact argument),
#: so that a node whose pids were lost with its state file is still stopped.
PROCESS_MARKS = {
    "containerd": str(CONTAINERD_CONFIG),
    "kubelet": f"--root-dir={KUBELET_ROOT}",
    "coredns": str(COREDNS_CONFIG),
    "containerd-shim": str(CONTAINERD_SOCKET),
}

Say = Callable[[str], None]


# ------------------------------------------------------------------------------ reading the host


def sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctls() -> dict[str, str]:
    return {name: sysctl_path(name).read_text().strip() for name in SYSCTLS}


def cgroup_hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy (v1 controllers, named ones, and the unified v2 one)."""
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] in ("cgroup", "cgroup2"):
            out.append(Path(fields[1]))
    return out


def _unescape(field: str) -> str:
    return field.encode().decode("unicode_escape") if "\\" in field else field


def mountpoints() -> list[str]:
    """Mount points in /proc/self/mountinfo order (parents before children)."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [_unescape(line.split()[4]) for line in lines]


def links() -> list[str]:
    proc = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=False)
    return [line.split(":")[1].strip().split("@")[0] for line in proc.stdout.splitlines()]


def iptables_rules(cmd: str, table: str) -> tuple[list[str], list[str]]:
    """(chains, rules) of one table as ``<cmd>-save`` prints them; empty if the table is
    unavailable (no IPv6, no module)."""
    proc = subprocess.run([f"{cmd}-save", "-t", table], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return [], []
    chains = [line[1:].split()[0] for line in proc.stdout.splitlines() if line.startswith(":")]
    rules = [line for line in proc.stdout.splitlines() if line.startswith("-A ")]
    return chains, rules


def snapshot() -> dict:
    """What the node may change, as it is now (JSON-able): compared before and after."""
    chains = {cmd: {table: iptables_rules(cmd, table)[0] for table in TABLES} for cmd in IPTABLES}
    return {
        "sysctls": read_sysctls(),
        "links": links(),
        "chains": chains,
        "kubepods": [str(h) for h in cgroup_hierarchies() if (h / "kubepods").exists()],
        "mounts": mountpoints(),
        "paths": {p: os.path.lexists(p) for p in SHARED_PATHS},
        "entries": {
            p: sorted(os.listdir(p)) if os.path.isdir(p) else []
            for p in ("/var/log/pods", "/var/log/containers", NETNS_DIR)
        },
    }


def read_record() -> dict | None:
    try:
        return json.loads(RECORD.read_text())
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------------------ preflight


#: Host programs the node runs, and those its images are built with (Debian packages;
#: `make node-deps` installs them).
REQUIRED_PROGRAMS = {
    "containerd": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "iptables": "iptables",
    "ip6tables": "iptables",
    "iptables-save": "iptables",
    "ip": "iproute2",
    "mount": "mount",
    "podman": "podman",
    "skopeo": "skopeo",
    "busybox": "busybox-static",
    "mksh-static": "mksh",
    "gcc": "gcc",
}
REQUIRED_FILES = {
    "/usr/lib/cni/bridge": "containernetworking-plugins",
    "/usr/lib/cni/host-local": "containernetworking-plugins",
    "/usr/lib/cni/portmap": "containernetworking-plugins",
    "/usr/lib/cni/loopback": "containernetworking-plugins",
}


def _fix_packages(packages: set[str]) -> str:
    names = " ".join(sorted(packages))
    if shutil.which("apt-get"):
        return f"Run `make node-deps` (as root: apt-get install {names})."
    return f"Install {names} with this system's package manager (no apt-get here)."


def preflight(repo: Path) -> None:
    """Fail in one line when this machine cannot run the real node, before anything starts."""
    where = "localkube node"
    if os.geteuid() != 0:
        raise LocalkubeError(
            f"{where}: the kubelet and containerd need root (got uid {os.geteuid()}). "
            "Run `sudo make cluster-up` (after `sudo make node-deps`), or set "
            "DDPJOB_NODE=off to start the cluster without its real node."
        )
    missing = {pkg for prog, pkg in REQUIRED_PROGRAMS.items() if shutil.which(prog) is None}
    missing |= {pkg for path, pkg in REQUIRED_FILES.items() if not os.access(path, os.X_OK)}
    if missing:
        got = ", ".join(sorted(missing))
        raise LocalkubeError(f"{where}: missing packages (got no {got}). {_fix_packages(missing)}")
    if "overlay" not in Path("/proc/filesystems").read_text():
        raise LocalkubeError(
            f"{where}: containerd's overlayfs snapshotter needs the overlay filesystem "
            "(got none in /proc/filesystems). Load it: modprobe overlay."
        )
    if not any(h.name in ("memory", "unified") for h in cgroup_hierarchies()):
        raise LocalkubeError(
            f"{where}: no memory cgroup (got {[str(h) for h in cgroup_hierarchies()]}). "
            "Mount the cgroup hierarchies (cgroup v1 memory or cgroup2)."
        )
    check_owner(repo)


def require() -> None:
    """Fail in one line when the running cluster has no real node (for the node's tests)."""
    if not ENABLED:
        raise LocalkubeError(DISABLED_HINT)


def check_owner(repo: Path) -> None:
    """Refuse when the node of another checkout's live cluster holds this machine."""
    owner = _live_other_owner(repo)
    if owner is not None:
        raise LocalkubeError(
            f"localkube node: this machine's node belongs to the cluster of {owner[0]} "
            f"(got it running, pid {owner[1]}). One node per machine: run "
            f"`make cluster-down` there, or set DDPJOB_NODE=off here."
        )


def _live_other_owner(repo: Path) -> tuple[str, int] | None:
    """(checkout, a live pid of its cluster) when another checkout's cluster holds the node:
    any of its recorded processes still runs (its kubelet may not have started yet)."""
    rec = read_record()
    if not rec or Path(rec["owner"]) == repo:
        return None
    state = _read_json(Path(rec["owner"]) / ".cluster" / "state.json")
    processes = (state or {}).get("processes", {})
    for name in ("kubelet", *processes):
        info = processes.get(name)
        if info and proc_start_time(info["pid"]) == info["start"]:
            return rec["owner"], info["pid"]
    return None


@contextlib.contextmanager
def machine_lock():
    """Serialise node start-up and reset between checkouts (one node per machine)."""
    with open("/run/ddpjob-node.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------------------ changing the host


def record(repo: Path) -> dict:
    """Write :data:`RECORD` (what the machine looks like before the node) unless a previous
    node's record is still there: that one holds the values from before that node changed
    anything, and stays until a complete :func:`reset`."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    existing = read_record()
    if existing is not None:
        existing["owner"] = str(repo)
        _write_record(existing)
        return existing
    rec = {"owner": str(repo), "recorded": time.time(), "before": snapshot()}
    if rec["before"]["kubepods"]:
        raise LocalkubeError(
            f"localkube node: /kubepods cgroups exist before the node starts (got "
            f"{', '.join(rec['before']['kubepods'])}): another kubelet runs on this machine. "
            "Stop it first; there is one node per machine."
        )
    _write_record(rec)
    return rec


def _write_record(rec: dict) -> None:
    tmp = RECORD.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, indent=1) + "\n")
    tmp.replace(RECORD)


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run a host command; on failure raise with its stderr in one line."""
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise LocalkubeError(
            f"localkube node: {' '.join(argv)} failed (got exit {proc.returncode}: "
            f"{proc.stderr.strip()})"
        )
    return proc


def share_netns_dir() -> None:
    """Make /run/netns a shared mount point of its own before the first pod, as ``ip netns``
    and podman do when they find it is not one.

    containerd 1.6 mounts each pod's network namespace at /run/netns/cni-<uuid> and leaves the
    folder as it is. podman (a ``controller run --local`` container, anyone's) binds the
    folder onto itself (recursively) when it is not a mount point yet: the pods' namespaces
    mounted before then stay underneath, where the copy containerd unmounts is not, and their
    files cannot be removed ("device or resource busy"). Such a pod never leaves Terminating.
    With the folder a mount point already, podman only makes it shared. ``down`` unmounts it
    (:func:`_ours`)."""
    Path(NETNS_DIR).mkdir(parents=True, exist_ok=True)
    if NETNS_DIR not in mountpoints():
        run("mount", "--rbind", NETNS_DIR, NETNS_DIR)
    run("mount", "--make-shared", NETNS_DIR)


def create_bridge() -> None:
    """The pods' bridge with the gateway address, before the kubelet (its node IP) and CoreDNS
    (bound to it) start. The CNI bridge plugin finds it and attaches each pod's veth."""
    if BRIDGE not in links():
        run("ip", "link", "add", BRIDGE, "type", "bridge")
    prefix = POD_SUBNET.split("/")[1]
    addrs = run("ip", "-o", "-4", "addr", "show", "dev", BRIDGE).stdout
    if f"{GATEWAY}/{prefix}" not in addrs:
        run("ip", "addr", "add", f"{GATEWAY}/{prefix}", "dev", BRIDGE)
    # The gateway's MAC must not change under the pods. Unset, a bridge's address is the lowest
    # of its ports' (br_stp_recalculate_bridge_id), and every pod's veth is a port with a random
    # one: when the pod whose veth lent it goes, every other pod's ARP entry for the gateway
    # names an address no port has, and the pod reaches neither CoreDNS nor the status server
    # on the gateway until that entry goes stale, tens of seconds. The bridge plugin does not
    # set it on a bridge it finds.
    run("ip", "link", "set", BRIDGE, "address", BRIDGE_MAC)
    run("ip", "link", "set", BRIDGE, "up")


def forward_kubernetes_service(apiserver_port: int) -> None:
    """Let pods reach the API server where the kubelet tells them it is (the ``kubernetes``
    Service's address and port, ``KUBERNETES_SERVICE_HOST``/``PORT``), as kube-proxy would for
    that Service: one DNAT rule for what comes in on the bridge, to the API server on this
    machine's loopback, where it listens. ``route_localnet`` on the bridge lets the kernel route
    a pod's packet to a loopback address; the bridge (and with it the setting) goes at ``down``,
    the rule too (:func:`_remove_iptables`). Nothing else of the host is reachable so."""
    run("sysctl", "-q", "-w", f"net.ipv4.conf.{BRIDGE}.route_localnet=1")
    rule = [
        "-i", BRIDGE, "-d", f"{bootstrap.KUBERNETES_SERVICE_IP}/32", "-p", "tcp",
        "--dport", str(bootstrap.KUBERNETES_SERVICE_PORT),
        "-m", "comment", "--comment", SERVICE_COMMENT,
        "-j", "DNAT", "--to-destination", f"127.0.0.1:{apiserver_port}",
    ]  # fmt: skip
    if run("iptables", "-t", "nat", "-C", "PREROUTING", *rule, check=False).returncode != 0:
        run("iptables", "-t", "nat", "-A", "PREROUTING", *rule)


# ------------------------------------------------------------------------------ reset


def reset(repo: Path, say: Say, cri_reset: Path | None) -> None:
    """Undo everything the node changed on this machine, whether it stopped cleanly or was
    killed. A no-op when nothing of the node is left, or when it is another checkout's running
    node. ``cri_reset`` is the built ``kube cri-reset`` (None: remove containers with runc)."""
    if (read_record() is None and not _leftovers()) or _live_other_owner(repo) is not None:
        return
    if os.geteuid() != 0:
        raise LocalkubeError(
            f"localkube node: putting the machine back needs root (got uid {os.geteuid()}, "
            f"and the node's changes recorded in {RECORD}). Run `sudo make cluster-down`."
        )
    with machine_lock():
        if _live_other_owner(repo) is not None:
            return  # another checkout's node started meanwhile: not ours to undo
        rec = read_record()
        if rec is None and not _leftovers():
            return
        _reset(rec, say, cri_reset)


def _reset(rec: dict | None, say: Say, cri_reset: Path | None) -> None:
    before = (rec or {}).get("before") or {}
    t0 = time.monotonic()
    _stop_node_processes(say)
    _remove_pods(say, cri_reset)
    _unmount_ours(before, say)
    _remove_cgroups(say)
    _remove_iptables(before, say)
    _remove_network(say)
    _restore_sysctls(before, say)
    _remove_files(before, say)
    RECORD.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        RUN_DIR.rmdir()
    say(f"node: machine restored in {time.monotonic() - t0:.1f}s")


def _leftovers() -> bool:
    return (
        RUN_DIR.exists()
        or BRIDGE in links()
        or any((h / "kubepods").exists() for h in cgroup_hierarchies())
        or bool(_sandbox_dirs())
        or any(node_processes().values())
    )


def _sandbox_dirs() -> list[Path]:
    root = CONTAINERD_ROOT / "io.containerd.grpc.v1.cri" / "sandboxes"
    try:
        return list(root.iterdir())
    except OSError:  # none, or not ours to read (not root)
        return []


def node_processes() -> dict[str, list[int]]:
    """Pids of node processes (by their :data:`PROCESS_MARKS`), whoever started them."""
    found: dict[str, list[int]] = {name: [] for name in PROCESS_MARKS}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        prog = os.path.basename(argv[0])
        for name, mark in PROCESS_MARKS.items():
            if mark in argv and (prog == name or (name == "containerd-shim" and "shim" in prog)):
                found[name].append(int(entry.name))
    return found


def _terminate(pids: list[int], timeout_s: float) -> None:
    starts = {pid: proc_start_time(pid) for pid in pids}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(proc_start_time(p) != s for p, s in starts.items()):
            return
        time.sleep(0.05)
    for pid, start in starts.items():
        if proc_start_time(pid) == start:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _stop_node_processes(say: Say) -> None:
    """The kubelet, CoreDNS and containerd if still running (state file lost, killed harness)."""
    procs = node_processes()
    for name in ("kubelet", "coredns", "containerd"):
        if procs[name]:
            say(f"node: stopping leftover {name} (pids {procs[name]})")
            _terminate(procs[name], 10)


def _remove_pods(say: Say, cri_reset: Path | None) -> None:
    """Stop and remove every pod through containerd's CRI (it runs CNI DEL for each: veth, IP,
    iptables), then whatever runc still knows about if that failed."""
    if _sandbox_dirs() and cri_reset is not None and cri_reset.exists():
        containerd = _start_containerd()
        try:
            proc = subprocess.run(
                [str(cri_reset), f"--endpoint=unix://{CONTAINERD_SOCKET}"],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            removed = proc.stdout.count("removed pod sandbox")
            if removed:
                say(f"node: removed {removed} pod sandboxes through CRI")
            if proc.returncode != 0:
                say(f"node: cri-reset failed (exit {proc.returncode}): {proc.stderr.strip()}")
        finally:
            if containerd is not None:
                _terminate([containerd.pid], 10)
                containerd.wait()
    shims = node_processes()["containerd-shim"]
    for ns_root in RUNC_ROOT.glob("*") if RUNC_ROOT.is_dir() else []:
        for cid in [p.name for p in ns_root.iterdir() if p.is_dir()]:
            run("runc", "--root", str(ns_root), "delete", "--force", cid, check=False)
            say(f"node: deleted leftover container {cid[:12]} with runc")
    if shims:
        _terminate(shims, 5)


def _start_containerd() -> subprocess.Popen | None:
    """containerd with the node's config (if it is not running), to remove pods through CRI."""
    if not CONTAINERD_CONFIG.exists():
        return None
    log = open(RUN_DIR / "containerd-reset.log", "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        ["containerd", "--config", str(CONTAINERD_CONFIG)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    log.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        ok = subprocess.run(
            ["ctr", "--address", str(CONTAINERD_SOCKET), "version"],
            capture_output=True,
            check=False,
        )
        if ok.returncode == 0:
            return proc
        if proc.poll() is not None:
            return None
        time.sleep(0.1)
    return proc


_MNT_DETACH = 2


def _umount(path: str) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(path.encode(), 0) == 0:
        return True
    return libc.umount2(path.encode(), _MNT_DETACH) == 0


def _ours(mount: str, before: dict) -> bool:
    if mount in before.get("mounts", []):
        return False
    roots = (str(KUBELET_ROOT), str(RUN_DIR), str(CONTAINERD_ROOT), str(VOLUMES_DIR))
    if any(mount == r or mount.startswith(r + "/") for r in roots):
        return True
    # containerd names its pod network namespaces cni-<uuid> (podman's are netns-<uuid>). The
    # node makes /run/netns a mount point of its own (share_netns_dir): one made since the
    # record is the node's, even where the folder existed before. A namespace can lie hidden
    # under a later bind of the folder, by podman before the node shared it (_unmount_ours).
    return mount.startswith(f"{NETNS_DIR}/cni-") or mount == NETNS_DIR


def _unmount_ours(before: dict, say: Say) -> None:
    """Unmount what the node mounted, children first, in passes: a mount can lie hidden under
    a later one at its parent (a pod's netns at /run/netns/cni-<uuid>, then containerd's bind of
    /run/netns onto itself over it), and unmounting its path fails (EINVAL) until the one above
    it is gone. A pass that unmounts nothing ends it."""
    mine = [m for m in mountpoints() if _ours(m, before)]
    while True:
        failed: dict[str, int] = {}
        done = 0
        for mount in reversed([m for m in mountpoints() if _ours(m, before)]):
            if mount == NETNS_DIR and any(not n.startswith("cni-") for n in os.listdir(NETNS_DIR)):
                continue  # someone else's namespaces live there now (podman): leave it mounted
            if _umount(mount):
                done += 1
            else:
                failed[mount] = ctypes.get_errno()
        if not done or not failed:
            break
    for mount, errno in failed.items():
        say(f"node: could not unmount {mount} (errno {errno})")
    if mine:
        say(f"node: unmounted {len(mine) - len(failed)} of {len(mine)} leftover mounts")


def _remove_cgroups(say: Say) -> None:
    """rmdir /kubepods in every hierarchy, deepest first; processes still inside are pods'
    (killed: everything under /kubepods is the node's)."""
    for hierarchy in cgroup_hierarchies():
        top = hierarchy / "kubepods"
        if not top.exists():
            continue
        for attempt in range(50):
            dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
            for d in [*dirs, top]:
                with contextlib.suppress(OSError):
                    d.rmdir()
            if not top.exists():
                break
            if attempt == 5:
                for procs_file in top.rglob("cgroup.procs"):
                    for pid in procs_file.read_text().split():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.1)
        if top.exists():
            say(f"node: could not remove {top}")


def _remove_iptables(before: dict, say: Say) -> None:
    removed = []
    for cmd in IPTABLES:
        for table in TABLES:
            had = set(before.get("chains", {}).get(cmd, {}).get(table, []))
            chains, rules = iptables_rules(cmd, table)
            ours = {c for c in chains if c in KUBELET_CHAINS and c not in had}
            ours |= {
                c
                for c in chains
                if c.startswith("CNI-")
                and c not in had
                and c not in SHARED_CNI_CHAINS
                and any(CNI_COMMENT in r for r in rules if r.split()[1] == c)
            }
            # Rules that jump to our chains, or that carry our network's comment.
            for rule in rules:
                args = shlex.split(rule)
                target = args[args.index("-j") + 1] if "-j" in args else ""
                if target in ours or CNI_COMMENT in rule or SERVICE_COMMENT in rule:
                    run(cmd, "-t", table, "-D", *args[1:], check=False)
            for chain in ours:
                run(cmd, "-t", table, "-F", chain, check=False)
            for chain in ours:
                run(cmd, "-t", table, "-X", chain, check=False)
            chains, rules = iptables_rules(cmd, table)
            for chain in SHARED_CNI_CHAINS:
                if chain in chains and chain not in had and not _chain_used(chain, rules):
                    run(cmd, "-t", table, "-X", chain, check=False)
                    ours.add(chain)
            removed += [f"{cmd}/{table}/{c}" for c in sorted(ours)]
    if removed:
        say(f"node: removed iptables chains {', '.join(removed)}")


def _chain_used(chain: str, rules: list[str]) -> bool:
    """True when ``chain`` has rules or another chain jumps to it."""
    for rule in rules:
        args = rule.split()
        if args[1] == chain or ("-j" in args and args[args.index("-j") + 1] == chain):
            return True
    return False


def _remove_network(say: Say) -> None:
    if BRIDGE not in links():
        return
    ports = run("ip", "-o", "link", "show", "master", BRIDGE, check=False).stdout
    for line in ports.splitlines():
        run("ip", "link", "del", line.split(":")[1].strip().split("@")[0], check=False)
    run("ip", "link", "del", BRIDGE, check=False)
    say(f"node: removed bridge {BRIDGE}")


def _restore_sysctls(before: dict, say: Say) -> None:
    changed = []
    for name, value in before.get("sysctls", {}).items():
        path = sysctl_path(name)
        if path.read_text().strip() != value:
            path.write_text(value + "\n")
            changed.append(f"{name}={value}")
    if changed:
        say(f"node: restored {', '.join(changed)}")


def _remove_files(before: dict, say: Say) -> None:
    """The kubelet's and containerd's entries in shared host folders, and our own folders."""
    existed = before.get("paths", {})
    entries = before.get("entries", {})
    for folder in ("/var/log/pods", "/var/log/containers", NETNS_DIR):
        if not os.path.isdir(folder) or os.path.ismount(folder):
            continue
        for name in set(os.listdir(folder)) - set(entries.get(folder, [])):
            path = Path(folder) / name
            if folder == NETNS_DIR and not name.startswith("cni-"):
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
                continue
            try:
                path.unlink(missing_ok=True)
            except OSError as e:  # still a mount point (EBUSY): said, and left for the next reset
                say(f"node: could not remove {path} ({e.strerror})")
        if not existed.get(folder, True) and not os.listdir(folder):
            os.rmdir(folder)
    if os.path.isdir("/var/lib/cni"):
        # Our network's leases and results go whoever made the folder (podman's networks
        # share it); the folder itself only if it was not there before and is empty now.
        _remove_ours(Path("/var/lib/cni"))
        if not existed.get("/var/lib/cni", True):
            _remove_empty_tree(Path("/var/lib/cni"))
    # The kubelet's device manager keeps its socket in /var/lib/kubelet/device-plugins whatever
    # --root-dir says; shims keep theirs in /run/containerd/s whatever containerd's state says.
    if not existed.get("/var/lib/kubelet", True):
        _remove_tree_without_mounts(Path("/var/lib/kubelet"))
    if not existed.get("/run/containerd", True) and not os.path.exists(
        "/run/containerd/containerd.sock"  # a containerd of the system's own started since
    ):
        _remove_tree_without_mounts(Path("/run/containerd"))
    left = [m for m in mountpoints() if m.startswith((str(KUBELET_ROOT), str(RUN_DIR)))]
    if left:
        raise LocalkubeError(
            f"localkube node: mounts left under the node's folders (got {', '.join(left)}). "
            "Unmount them (umount -R) and run `make cluster-down` again."
        )
    shutil.rmtree(KUBELET_ROOT, ignore_errors=True)
    shutil.rmtree(VOLUMES_DIR, ignore_errors=True)
    for path in RUN_DIR.glob("*"):
        if path != RECORD:
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def _remove_tree_without_mounts(top: Path) -> None:
    if top.is_dir() and not [m for m in mountpoints() if m.startswith(f"{top}/")]:
        shutil.rmtree(top, ignore_errors=True)


def _remove_ours(top: Path) -> None:
    """Our CNI network's results files and lease folder under ``top``, nothing else."""
    for path in sorted(top.rglob(f"{CNI_NETWORK}*"), key=lambda p: -len(p.parts)):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                path.unlink()


def _remove_empty_tree(top: Path) -> None:
    """Remove ``top`` and the empty folders under it; stop at anything else (what was ours in
    it :func:`_remove_ours` removed first)."""
    for path in sorted(top.rglob("*"), key=lambda p: -len(p.parts)):
        if path.is_dir() and not path.is_symlink():
            with contextlib.suppress(OSError):
                path.rmdir()
    with contextlib.suppress(OSError):
        top.rmdir()
