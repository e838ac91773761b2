"""Every version the local cluster pins: what ``builds/`` builds and what the rooms run.

The operators' versions are the product's contract (``controller/kubeflow.py``: the versions
``doctor`` and the hints name), so the local cluster runs exactly those. The Go modules must
require the same (``builds/go/go.mod``, ``builds/go-operators/go.mod``, ``builds/go-s3/go.mod``,
``builds/go-prometheus/go.mod``): ``builds.operators`` and ``builds.gocommand`` check at build
time, ``tests/localkube/test_tools_unit.py``, ``test_s3_unit.py`` and ``test_prometheus_unit.py``
without building.
"""

from __future__ import annotations

from controller import kubeflow

KUBERNETES = "v1.33.13"
ETCD = "v3.5.21"
KWOK = "v0.7.0"
HELM = "v3.18.6"
COREDNS = "v1.12.0"
TRAINING_OPERATOR = kubeflow.OPERATOR_VERSION
TRAINER = kubeflow.TRAINER_VERSION
JOBSET = kubeflow.JOBSET_VERSION
KUEUE = kubeflow.KUEUE_VERSION
VERSITYGW = "v1.8.0"
#: Prometheus 3.x is published on the Go module proxy as module versions v0.3xx.y.
PROMETHEUS = "v0.316.0"
PROMETHEUS_RELEASE = "3.16.0"

#: Built by the Kubernetes module (``builds/go``): the multi-call ``kube``, helm and CoreDNS.
GO_TOOLS = {
    "kubernetes": KUBERNETES,
    "etcd": ETCD,
    "kwok": KWOK,
    "helm": HELM,
    "coredns": COREDNS,
}
#: Built by the operators' module (``builds/go-operators``).
OPERATORS = {
    "training-operator": TRAINING_OPERATOR,
    "kubeflow-trainer": TRAINER,
    "jobset": JOBSET,
    "kueue": KUEUE,
}
#: Built by the S3 server's module (``builds/go-s3``): the Versity S3 Gateway.
S3_SERVER = {"versitygw": VERSITYGW}
#: Built by Prometheus' module (``builds/go-prometheus``).
PROMETHEUS_SERVER = {"prometheus": PROMETHEUS}
#: Every pin by name: recorded in the tools folder's name (its hash), build-times.json and the
#: cluster's state file.
VERSIONS = {**GO_TOOLS, **OPERATORS, **S3_SERVER, **PROMETHEUS_SERVER}
