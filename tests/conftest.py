"""pytest wiring for every test folder: the session fixtures ``cluster`` and ``real_node``, and
the ``cluster`` marker.

``cluster`` is a live local cluster (``localkube``) for the whole session. One started earlier
by ``make cluster-up`` is reused and left running; otherwise the fixture starts one (building
missing tools first) and the last session that leases it stops exactly what was started.
``DDPJOB_CLUSTER=skip`` skips every test that asks for it (they are then reported as skipped).

Every pod runs on the cluster's real node, in this checkout's trainer image, so ``cluster`` also
makes sure of both: the node Ready, the image rebuilt if the code changed and imported (under its
own name and the one the examples use). ``real_node`` is the same cluster, named for the tests
that are about the node itself. Where the node cannot run (no root, missing packages,
``DDPJOB_NODE=off``) every test that needs the cluster fails with the one line that says why.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# One intra-op thread in every process the tests start and in the test processes themselves, as
# the examples' specs ask of each rank: with torch's default (one thread per CPU) the ranks and
# workers that share this machine's CPUs spin-wait for each other's threads.
os.environ.setdefault("OMP_NUM_THREADS", "1")

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:  # `localkube` and `tests.*` importable whatever the import mode
    sys.path.insert(0, _ROOT)

from localkube.builds import gotools  # noqa: E402
from localkube.handle import start_or_reuse, wait_until  # noqa: E402
from localkube.node import host, kubelet  # noqa: E402
from localkube.procs import LocalkubeError  # noqa: E402
from tests.timeouts import outside_test_timeout  # noqa: E402


@pytest.fixture(scope="session")
def cluster():
    """A live local cluster for the whole test session (see the module docstring), its node
    Ready with this checkout's trainer image.

    Concurrent sessions (two engineers' runs, ``pytest -n``) share it safely through leases.
    """
    if os.environ.get("DDPJOB_CLUSTER") == "skip":
        pytest.skip("DDPJOB_CLUSTER=skip: cluster tests disabled")
    # One line that says why and how to fix (no root, missing packages, ...): every test that
    # needs the cluster fails with it (outside the except block: no chained traceback).
    handle, error = None, None
    try:
        with outside_test_timeout():
            if not gotools.is_built():
                gotools.build(sys.stderr)
            handle = start_or_reuse()
            host.require()
            handle.trainer_image()
    except LocalkubeError as exc:
        error = str(exc)
    if error:
        if handle is not None:
            handle.control_plane.release()
        pytest.fail(error, pytrace=False)
    wait_until("node Ready", lambda: kubelet.node_ready(handle), 60)
    try:
        yield handle
    finally:
        handle.control_plane.release()


@pytest.fixture(scope="session")
def real_node(cluster):
    """The cluster, for tests about its real node (the same session fixture)."""
    return cluster


#: Fixtures that mean a test needs the cluster, or something else `make test` builds (the images,
#: the Go tools' helm and kubectl). The markers follow from them, so `make test`'s phases
#: (-m "not cluster and not built" beside the builds, then the rest) cannot put a test in the
#: wrong one.
CLUSTER_FIXTURES = frozenset({"cluster", "real_node"})
BUILT_FIXTURES = frozenset(
    {"image", "built_image", "pause_ref", "init_ref", "containerd", "helm_bin", "kubectl_bin"}
)


#: Where every test marked ``cluster`` or ``built`` lives. make test's sessions of those
#: collect only these (``--built-only``), not the modules of the thousand offline tests (and the
#: torch many of them import): that is seconds of CPU in each of their workers. A test of either
#: kind anywhere else fails the collection of any session that reaches it, as the offline
#: phase's, which collects everything, does on every run.
BUILT_PATHS = (
    "tests/e2e",
    "tests/localkube",
    "tests/packaging",
    "tests/controller/test_local_container.py",
)
_BUILT = tuple(Path(_ROOT, p) for p in BUILT_PATHS)


def _in_built_paths(path: Path) -> bool:
    return any(path == p or p in path.parents for p in _BUILT)


def pytest_addoption(parser):
    parser.addoption(
        "--built-only",
        action="store_true",
        help="collect only the files and folders of tests/conftest.py's BUILT_PATHS, where every "
        "test marked cluster or built lives (make test's sessions of those)",
    )
    parser.addoption(
        "--phase-order",
        action="store_true",
        help="run the tests marked long first, then the unmarked ones, then the other slow ones "
        "(make test's offline phase; see _phase_order)",
    )


def _phase_order(item) -> int:
    """make test's offline phase runs beside the cluster tests, one test at a time to each of
    its workers (--maxschedchunk 1). The longest tests go first, so that none of them ends the
    phase alone; the short tests, mostly waiting on a timeout or a thread, next, while the
    cluster tests keep the CPUs busy; the multi-process tests last, to fill the CPUs the
    cluster tests leave when they end."""
    if item.get_closest_marker("long"):
        return 0
    return 2 if item.get_closest_marker("slow") else 1


def pytest_ignore_collect(collection_path: Path, config):
    """With ``--built-only``, skip every path that neither lies in :data:`BUILT_PATHS` nor holds
    one of them."""
    if config.getoption("--built-only"):
        path = Path(collection_path)
        if not (_in_built_paths(path) or any(path in p.parents for p in _BUILT)):
            return True
    return None


def pytest_collection_modifyitems(config, items):
    """Mark each test ``cluster`` and ``built`` by the fixtures it uses, directly or not (and
    refuse such a test outside :data:`BUILT_PATHS`); with ``--phase-order``, order them by
    :func:`_phase_order`."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & CLUSTER_FIXTURES:
            item.add_marker(pytest.mark.cluster)
        if used & BUILT_FIXTURES:
            item.add_marker(pytest.mark.built)
    stray = [
        item.nodeid
        for item in items
        if (item.get_closest_marker("cluster") or item.get_closest_marker("built"))
        and not _in_built_paths(Path(item.path))
    ]
    if stray:
        raise pytest.UsageError(
            f"{', '.join(stray)}: marked cluster or built outside tests/conftest.py's "
            "BUILT_PATHS, so make test's cluster and image sessions would not collect it; move "
            "it, or add its file or folder to BUILT_PATHS"
        )
    if config.getoption("--phase-order"):
        items.sort(key=_phase_order)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """An MLflow tracking server on this machine, one for the session
    (tests/trainer/mlflow_server.py)."""
    from tests.trainer.mlflow_server import MlflowServer

    with MlflowServer(tmp_path_factory.mktemp("mlflow")) as server:
        yield server
