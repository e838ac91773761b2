"""Local Kubernetes control plane for ddpjob's tests (issue 4).

``python -m tests.cluster up|down|build|status`` (``make cluster-up`` / ``make cluster-down``);
the pytest fixture ``cluster`` lives in :mod:`tests.cluster.fixture`.
"""
