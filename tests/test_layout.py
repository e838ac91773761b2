"""The import graph keeps the layout docs/architecture.md describes.

Read from the sources (every ``import``, at module level or inside a function), so a lazy import
counts as much as a top-level one: no cycle among our modules; nothing imports ``controller.cli``;
only ``controller.kube`` imports the kubernetes client; ``controller.render`` is pure; the
controller never imports torch or boto3; nothing outside tests/ imports tests/; nothing but
tests imports ``controller.generate``; localkube's rooms import downwards only and its builds no
room; the product's image and lock (``tools``) import nothing of localkube; ``controller.jobs.read``
imports nothing that holds a Cluster.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("controller", "trainer", "localkube", "tools", "bench", "examples")


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; relative imports resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    package = _module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


@functools.cache
def graph() -> dict[str, set[str]]:
    """The import graph, read once per process and only where a test asks for it (not at
    collection, which every pytest worker does)."""
    files = [p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")]
    files += list((REPO / "tests").rglob("*.py"))
    modules = {_module_name(p): p for p in files}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = {m for m in _imports(path) if m in modules and m != name}
    return graph


def _importers(target: str) -> list[str]:
    return sorted(
        m
        for m, deps in graph().items()
        if any(d == target or d.startswith(target + ".") for d in deps)
    )


def test_the_graph_was_read():
    """Guards the tests below against an empty graph (a wrong root would make them vacuous)."""
    assert "controller.cli.main" in graph() and "controller.kube.client" in graph()
    assert "controller.kube.client" in graph()["controller.jobs.status"]


def test_no_import_cycles():
    """Tarjan's strongly connected components: any component of two or more is a cycle.

    A package's ``__init__`` and its own modules are not counted as a cycle (Python loads the
    package first, by design)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def edges(m: str) -> set[str]:
        return {d for d in graph()[m] if not m.startswith(d + ".")}

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for m in graph():
        if m not in index:
            visit(m)
    assert cycles == [], f"import cycles: {cycles}"


def test_nothing_imports_the_cli():
    outside = [
        m for m in _importers("controller.cli") if not m.startswith(("controller.cli", "tests."))
    ]
    assert outside == ["controller.__main__"], outside


def test_only_the_api_layer_imports_kubernetes():
    users = []
    for path in (REPO / "controller").rglob("*.py"):
        if any(m == "kubernetes" or m.startswith("kubernetes.") for m in _imports(path)):
            users.append(_module_name(path))
    assert users and all(u.startswith("controller.kube.") for u in users), users


@pytest.mark.parametrize("layer", ["controller.kube", "controller.jobs", "controller.cli"])
def test_render_is_pure(layer):
    renderers = [m for m in graph() if m.startswith("controller.render")]
    assert renderers
    for m in renderers:
        assert not any(d == layer or d.startswith(layer + ".") for d in graph()[m]), (m, layer)


def test_the_api_layer_gives_no_advice():
    """Advice is the CLI's: the API layer imports nothing from cli/ or jobs/."""
    for m in (m for m in graph() if m.startswith("controller.kube")):
        assert not any(d.startswith(("controller.cli.", "controller.jobs.")) for d in graph()[m]), m


#: controller.jobs in two rooms: the pure readers below, the modules that hold a Cluster above.
PURE_JOBS = "controller.jobs.read"
#: What the pure room may take from the API layer: the watch protocol's name, no call.
PURE_FROM_KUBE = {"controller.kube.watch", "controller.kube.watch.RESYNC"}
#: Modules that do I/O or keep time; the pure room reads what it is given.
IO_MODULES = ("socket", "subprocess", "threading", "time", "urllib3", "kubernetes", "http")


def _pure_jobs() -> list[str]:
    return sorted(m for m in graph() if m == PURE_JOBS or m.startswith(PURE_JOBS + "."))


def test_the_jobs_rooms_were_read():
    """Guards the rules below against an empty room: the readers are below, and the modules
    that call the cluster are above."""
    assert {f"{PURE_JOBS}.{m}" for m in ("apis", "explain", "why", "queue", "view")} <= set(
        _pure_jobs()
    )
    above = [m for m in graph() if m.startswith("controller.jobs.") and m not in _pure_jobs()]
    assert {"controller.jobs.status", "controller.jobs.wait", "controller.jobs.follow"} <= set(
        above
    )
    assert "controller.kube.client" in graph()["controller.jobs.watches"]


def test_the_pure_readers_import_nothing_that_holds_a_cluster():
    """``controller.jobs.read`` imports no module of ``controller.jobs`` outside it (those hold
    a Cluster) and nothing of ``controller.kube`` but the watch protocol's ``RESYNC``: never the
    client, even for a type."""
    for m in _pure_jobs():
        deps = graph()[m]
        above = [d for d in deps if d.startswith("controller.jobs.") and d not in _pure_jobs()]
        assert above == [], (m, above)
        path = REPO / (m.replace(".", "/") + ".py")
        if not path.exists():
            path = REPO / m.replace(".", "/") / "__init__.py"
        kube = {d for d in _imports(path) if d.split(".")[:2] == ["controller", "kube"]}
        assert kube <= PURE_FROM_KUBE, (m, sorted(kube - PURE_FROM_KUBE))


def test_the_pure_readers_do_no_io():
    for m in _pure_jobs():
        path = REPO / (m.replace(".", "/") + ".py")
        if not path.exists():
            path = REPO / m.replace(".", "/") / "__init__.py"
        io = [d for d in _imports(path) if d.split(".")[0] in IO_MODULES]
        assert io == [], (m, io)


def test_every_import_of_our_own_modules_names_one_that_exists():
    """A module that moves leaves no import of its old path behind, a lazy one included (the
    graph above keeps only the imports it can resolve)."""
    missing = []
    for path in [p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            missing += [
                (str(path.relative_to(REPO)), n)
                for n in names
                if n.split(".")[0] in PACKAGES
                and n not in graph()
                and not (REPO / n.replace(".", "/")).is_dir()  # a namespace package
            ]
    assert missing == [], missing


def test_the_controller_never_imports_torch_or_an_s3_client():
    heavy = ("torch", "boto3", "botocore", "s3transfer")  # ddpjob[trainer]'s, not the laptop's
    for path in (REPO / "controller").rglob("*.py"):
        assert not any(m.split(".")[0] in heavy for m in _imports(path)), path
    # What the controller imports of the trainer (its config, its contract, the model-state
    # estimate, the workdir's archive format) reaches neither at import.
    torch_free = {"trainer", "trainer.config", "trainer.contract", "trainer.sizing"}
    for m in (m for m in graph() if m.startswith("controller")):
        reached = {d for d in graph()[m] if d.startswith("trainer")}
        assert reached <= torch_free | {"trainer.workdir"}, (m, reached)
    for m in torch_free - {"trainer"}:
        path = REPO / (m.replace(".", "/") + ".py")
        assert not any(d.split(".")[0] in heavy for d in _imports(path)), m


def test_the_workdir_reaches_s3_only_on_demand():
    """``trainer.workdir`` (the archive's format, read by the controller too) imports the
    standard library and the contract at module level; the S3 store, and boto3 with it, only
    inside the functions that fetch or upload ``s3://`` (a laptop without ``ddpjob[s3]`` packs
    and ships through a ConfigMap)."""
    path = REPO / "trainer" / "workdir.py"
    tree = ast.parse(path.read_text())
    top = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            top.add(node.module if node.module.startswith("trainer") else node.module.split(".")[0])
    ours = {m for m in top if m.startswith("trainer")}
    assert ours == {"trainer.contract"}, ours
    assert top - ours <= set(sys.stdlib_module_names) | {"__future__"}, top - ours
    assert "trainer.checkpoint.storage" in graph()["trainer.workdir"]  # lazily, for s3://


def test_nothing_outside_tests_imports_tests():
    outside = [m for m in _importers("tests") if not m.startswith("tests")]
    assert outside == [], outside


def test_nothing_imports_the_generator():
    """controller.generate (make generate) is a development tool that writes files: no command
    and no other module may depend on it."""
    assert "controller.generate" in graph()
    outside = [m for m in _importers("controller.generate") if not m.startswith("tests.")]
    assert outside == [], outside


def _closure(start: str) -> set[str]:
    """``start`` and every module it imports, directly or not."""
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph().get(m, ()))
    return seen


def _in(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


#: localkube's rooms, lowest first: each may import the rooms below it, never one above.
ROOMS = ("localkube.builds", "localkube.controlplane", "localkube.node", "localkube.addons")
#: What every room may use besides the rooms below it.
ROOM_FLOOR = ("localkube.versions", "localkube.procs", "tools", "controller")


def test_localkube_is_in_rooms():
    for room in ROOMS:
        assert any(m.startswith(room + ".") for m in graph()), f"no modules in {room}"
    # The package's top floor: the front door, the versions, and what ties the rooms together.
    flat = sorted(
        m for m in graph() if m.startswith("localkube.") and m.count(".") == 1 and m not in ROOMS
    )
    assert flat == [
        "localkube.__main__",
        "localkube.cluster",
        "localkube.handle",
        "localkube.kind",
        "localkube.procs",
        "localkube.sequence",
        "localkube.versions",
    ], flat


@pytest.mark.parametrize("index", range(len(ROOMS)))
def test_each_room_imports_only_the_rooms_below_it(index):
    """The builds import no room (not the add-ons whose binaries they build), the control plane
    neither the node nor the add-ons, the node no add-on; no room imports what ties them
    together (sequence, cluster, handle)."""
    room, below = ROOMS[index], ROOMS[:index]
    for m in (m for m in graph() if _in(m, room)):
        wrong = [
            d
            for d in graph()[m]
            if _in(d, "localkube") and d != "localkube" and not _in(d, room, *below, *ROOM_FLOOR)
        ]
        assert wrong == [], f"{m} imports {wrong}: {room} may use only {below} and the floor"


def test_the_product_image_and_lock_import_nothing_of_localkube():
    """What `make image`, `make base-image` and `make lock` run is tools.*, and nothing it
    imports, directly or not, is the local cluster's."""
    text = (REPO / "Makefile").read_text().replace("\\\n", " ")
    recipes: dict[str, list[str]] = {}
    target = None
    for line in text.splitlines():
        if line and not line[0].isspace() and ":" in line and not line.startswith("#"):
            target = line.split(":", 1)[0].strip()
        elif line.startswith("\t") and target:
            recipes.setdefault(target, []).append(line)
    modules = set()
    for name in ("image", "base-image", "lock"):
        for recipe in recipes[name]:
            modules |= set(re.findall(r"-m ([\w.]+)", recipe))
    assert modules == {"tools.image", "tools.lock"}, modules
    for module in modules:
        cluster = sorted(d for d in _closure(module) if _in(d, "localkube", "tests"))
        assert cluster == [], f"{module} imports {cluster}"
    # And the package as a whole: localkube builds on tools, never the reverse.
    tools = [m for m in graph() if _in(m, "tools")]
    assert tools and all(not _in(d, "localkube") for m in tools for d in graph()[m]), tools


def test_localkube_imports_nothing_from_tests():
    users = [
        m
        for m, deps in graph().items()
        if _in(m, "localkube", "tools") and any(_in(d, "tests") for d in deps)
    ]
    assert users == [], users


#: The trainer's floor: what every room may use (torch-free but ``distributed``).
TRAINER_FLOOR = (
    "trainer.contract",
    "trainer.config",
    "trainer.launch",
    "trainer.distributed",
    "trainer.sizing",
)
#: The trainer's rooms, and what each may use besides the floor and itself.
TRAINER_ROOMS = {
    "trainer.tasks": (),
    "trainer.telemetry": (),
    "trainer.checkpoint": (),
    "trainer.parts": ("trainer.tasks", "trainer.telemetry"),
    # The ledger observes the loop's phases and keeps its record in the checkpoints' store.
    "trainer.health": ("trainer.telemetry", "trainer.parts.phases", "trainer.checkpoint.storage"),
}
#: What ties the rooms together: the Trainer and the entrypoint; beside them the pod's other
#: entrypoint, which unpacks a shipped workdir before the trainer (python -m trainer.workdir).
TRAINER_TOP = ("trainer.train", "trainer.__main__", "trainer.workdir")


def test_the_trainer_is_in_rooms():
    for room in TRAINER_ROOMS:
        assert any(m.startswith(room + ".") for m in graph()), f"no modules in {room}"
    flat = sorted(m for m in graph() if m.startswith("trainer.") and m.count(".") == 1)
    assert flat == sorted([*TRAINER_FLOOR, *TRAINER_ROOMS, *TRAINER_TOP]), flat


@pytest.mark.parametrize("room", TRAINER_ROOMS)
def test_each_trainer_room_imports_only_the_floor_and_what_it_is_allowed(room):
    """No room imports the Trainer or the entrypoint; checkpoint/ and telemetry/ import no other
    room (checkpointing reports through whatever it is handed), parts/ no health/ or
    checkpoint/, health/ no part but the phases it observes."""
    allowed = (room, *TRAINER_FLOOR, *TRAINER_ROOMS[room])
    for m in (m for m in graph() if _in(m, room)):
        wrong = [
            d for d in graph()[m] if _in(d, "trainer") and d != "trainer" and not _in(d, *allowed)
        ]
        assert wrong == [], f"{m} imports {wrong}: {room} may use only {allowed}"


def test_the_trainers_floor_imports_no_room_and_launching_needs_no_torch():
    """The floor is below every room; what a pod's first process runs before it re-launches
    itself under torchrun (the entrypoint, the config, the launch) never imports torch."""
    for m in TRAINER_FLOOR:
        wrong = [
            d
            for d in graph()[m]
            if _in(d, "trainer") and d != "trainer" and not _in(d, *TRAINER_FLOOR)
        ]
        assert wrong == [], f"{m} imports {wrong}"
    for m in ("trainer.__main__", "trainer.contract", "trainer.config", "trainer.launch"):
        # What they import at the top of the module, directly or not (__main__ imports the
        # Trainer inside main(), once it knows it will not re-launch).
        seen, todo = set(), [m]
        while todo:
            here = todo.pop()
            if here in seen:
                continue
            seen.add(here)
            path = REPO / (here.replace(".", "/") + ".py")
            if not path.exists():
                path = REPO / here.replace(".", "/") / "__init__.py"
            top = _top_level_imports(path)
            assert not any(d.split(".")[0] == "torch" for d in top), (m, here)
            todo += [d for d in top if d in graph()]


def _top_level_imports(path: Path) -> set[str]:
    """The modules ``path`` imports at module level (not inside a function)."""
    out: set[str] = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_only_the_entrypoint_imports_the_trainer():
    users = [m for m in _importers("trainer.train") if m.startswith("trainer")]
    assert users == ["trainer.__main__"], users
