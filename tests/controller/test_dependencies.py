"""``pip install "ddpjob[controller]"`` is all a laptop needs: every third-party import of
controller/ is declared, in that extra or, for what is imported only on demand, in its own."""

from __future__ import annotations

import importlib.metadata as md
import sys

from tests.trainer.test_dependencies import REPO, _declared, _dist_name, _top_level_imports

# Imported on demand only, with their own extra: `plot` draws with matplotlib.
ON_DEMAND = {"matplotlib": "plot"}


def test_every_third_party_import_of_controller_is_declared() -> None:
    imported = set()
    for path in (REPO / "controller").rglob("*.py"):
        imported |= _top_level_imports(path)
    third_party = imported - set(sys.stdlib_module_names) - {"controller", "trainer", "__future__"}
    # Sanity: the scan sees the imports we know are there (a broken scan would find nothing).
    assert {"urllib3", "yaml", "pydantic", "kubernetes", "rich"} <= third_party
    owners = md.packages_distributions()
    for module in sorted(third_party):
        dists = {_dist_name(d) for d in owners.get(module, [])}
        assert dists, f"{module}: imported by controller/ but no installed distribution has it"
        extra = ON_DEMAND.get(module, "controller")
        assert dists & _declared(extra), f"{module} (from {dists}) is not in ddpjob[{extra}]"
