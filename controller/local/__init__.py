"""Runs of a job spec on this machine, no cluster: ``run --local`` (``processes.py``: one process
per node with the operator's environment) and ``run --local --container`` (``container.py``: one
container of the image per node, through ``engine.py``'s docker or podman; ``janitor.py`` cleans
up when the controller cannot)."""
