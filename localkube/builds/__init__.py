"""What the cluster is built from, before anything runs: the Go tools and operators into a
versioned tools folder (``gotools.py``, ``operators.py``, Go modules ``go/`` and
``go-operators/``), and the node's images (``images.py``). Imports no other room."""
