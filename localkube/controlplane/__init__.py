"""The control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok
(``components.py``), its credentials and first objects (``bootstrap.py``, ``pki.py``), and what
every component of every room is (``context.py``)."""
