"""The local Kubernetes cluster for development and tests (``python -m localkube up|down``).

A product feature (``make cluster-up``; hints in error messages point at it), in rooms by job:

    builds/         what is built before anything runs: the Go tools (the Kubernetes multi-call
                    binary, helm, CoreDNS), the operators and their manifests, the images
    controlplane/   etcd, the API server, controller-manager, scheduler, kwok; credentials
    node/           the real node: the machine under it, containerd, kubelet, CoreDNS, the
                    images it holds, local volumes, pod logs
    addons/         what runs on top: the Kubeflow training operator, Trainer v2 + JobSet, Kueue
    versions.py     every pinned version, read by the builds and the rooms alike
    sequence.py     the rooms' components in start order; cluster.py starts and stops them
    handle.py       the running cluster as tests and bench use it

The rooms import downwards only (builds < controlplane < node < addons), the builds import no
room, and nothing here imports ``tests``: ``tests/test_layout.py`` holds it. The product's own
image and lock (``make image``, ``make lock``) live in ``tools/``, which this package imports.
"""
