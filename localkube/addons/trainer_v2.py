"""Kubeflow Trainer v2 and JobSet in the local cluster: their build, their processes, their objects.

Both controllers are upstream's own commands, built unmodified from the Go module proxy by the
module ``builds/go-operators`` (Trainer's ``cmd/trainer-controller-manager`` and JobSet's root
``main``; ``builds/operators.py`` builds them with Kueue and the training operator v1), and run as
host processes beside the training operator v1, like every component:

- Each reads a config file written at start: webhook server on ``127.0.0.1:<free port>``, no
  certificate management of its own (upstream's rotates a Secret for a Service; there is no pod
  network here), no leader election, health probe and metrics on free ports of 127.0.0.1.
- Their serving certificates come from the cluster CA. Trainer's config has no cert dir: it reads
  ``$TMPDIR/k8s-webhook-server/serving-certs``, so it gets a TMPDIR of its own; JobSet's config
  names its dir (both default to the same dir and ports, hence the separation).
- Each has its own client identity (``kubeflow-trainer.kubeconfig``, ``jobset.kubeconfig``, see
  ``bootstrap.USERS``) bound to upstream's ClusterRoles.
- Their CRDs, RBAC and webhook configurations are upstream's kustomize output, rendered at build
  time (``builds.operators.render_manifests``) and installed by :func:`apply_objects` with every
  ``clientConfig.service`` replaced by ``url: https://127.0.0.1:<port><path>`` and the CA bundle.
- :func:`install_runtime` installs upstream's ``torch-distributed`` ClusterTrainingRuntime with
  one change, the image: this checkout's trainer image (``builds.images.trainer_ref()``, what
  ``builds.images.trainer_image()`` builds and ``up`` imports into the real node), so a TrainJob
  that names no image of its own runs this checkout's trainer, once Trainer's webhook admits it.

Its progress API (KEP-2779) is on: the ``TrainJobStatus`` feature gate starts upstream's status
server (``pkg/statusserver``), which training pods reach over HTTPS at
``https://kubeflow-trainer-controller-manager.kubeflow-system.svc:<port>`` with a projected
service-account token it verifies by OIDC against the API server (:func:`status_objects`,
:func:`trainer_argv`).

What differs from upstream's manifests, and why, is listed in :data:`DIFFERENCES`.
"""

from __future__ import annotations

import base64
import copy
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from controller import kubeflow

from .. import procs
from ..builds import images
from ..controlplane import bootstrap
from ..controlplane.context import Component, http_get
from ..node.host import GATEWAY
from ..procs import LocalkubeError
from . import gateway, manager

if TYPE_CHECKING:
    from ..controlplane.context import Context

#: The CRDs of both, applied as upstream wrote them (CRDs are megabytes of YAML: PyYAML would
#: take seconds to read them, so they go to kubectl as text).
CRD_FILES = ("trainer-crds.yaml", "jobset-crd.yaml")
CRDS = (
    kubeflow.TRAINJOB_CRD,
    kubeflow.TRAINING_RUNTIME.crd,
    kubeflow.CLUSTER_TRAINING_RUNTIME.crd,
    kubeflow.JOBSET.crd,
)

#: Upstream's public ConfigMap (``kubeflow_trainer_version``) and the Role/RoleBinding that let
#: every authenticated user read it: the Kubeflow SDK (``TrainerClient``) reads it at start and
#: warns without it. Installed in upstream's namespace (the overlay's, ``kubeflow-system``).
PUBLIC = "kubeflow-trainer-public"

#: Ports each controller listens on (each gets a free one at ``up``).
TRAINER_PORTS = ("trainer-webhook", "trainer-probe", "trainer-metrics", "trainer-status")

#: The progress API (v2.3.0): the feature gate, and the names its runtime plugin puts in every
#: trainer pod's KUBEFLOW_TRAINER_SERVER_URL: ``https://<service>.<namespace>.svc:<port>``,
#: the service and the namespace being cert management's defaults (``defaults.go``) and the
#: operator's namespace (``cert.GetOperatorNamespace``: its pod's, else kubeflow-system).
STATUS_FEATURE_GATE = "TrainJobStatus"
STATUS_SERVICE = "kubeflow-trainer-controller-manager"
STATUS_NAMESPACE = "kubeflow-system"
#: The plugin copies ``ca.crt`` of this Secret (cert management's default name) into each
#: TrainJob's ``<name>-tls-config`` ConfigMap, the CA the pods trust the server by.
STATUS_CA_SECRET = "kubeflow-trainer-webhook-cert"
#: What the pods resolve, and what the serving certificate must name.
STATUS_DNS = f"{STATUS_SERVICE}.{STATUS_NAMESPACE}.svc"
#: The status server reads two paths a pod would have (``pkg/util/cert.certDir``, hard-coded:
#: its TLS certificate; ``statusserver.getClusterOIDCIssuerURL``: a service-account token, for
#: the token issuer's URL). A host process gets them in a mount namespace of its own: its
#: folder ``tmp`` over /tmp and ``run`` over /run (where only they are).
SERVICE_ACCOUNT_DIR = "secrets/kubernetes.io/serviceaccount"
JOBSET_PORTS = ("jobset-webhook", "jobset-probe", "jobset-metrics")

#: Client identities: their certificates and kubeconfigs are issued with the others
#: (``bootstrap.USERS``).
TRAINER_USER = "kubeflow-trainer"
JOBSET_USER = "jobset"

#: The ClusterRoles of upstream's manifests each controller is bound to.
TRAINER_ROLES = ("kubeflow-trainer-controller-manager",)
#: manager-role: what the controller does; proxy-role: TokenReview/SubjectAccessReview for its
#: authenticated metrics endpoint.
JOBSET_ROLES = ("jobset-manager-role", "jobset-proxy-role")

#: Everything that differs from upstream's install, and why.
DIFFERENCES = (
    "Processes on 127.0.0.1, not Deployments: webhook configurations use url + caBundle "
    "instead of a Service (no Service network reaches a host process).",
    "Certificates from the cluster CA; certManagement.enable=false (Trainer) and "
    "internalCertManagement.enable=false (JobSet): no cert Secret, no caBundle rotation.",
    "Leader election off (one replica each, as for the other components).",
    "Client certificates bound to the ClusterRoles instead of ServiceAccounts. Not installed: "
    "JobSet's leader-election and secrets Roles (leader election and cert management are off), "
    "its metrics-reader role (for scrapers). Namespace kubeflow-system holds only Trainer's "
    "kubeflow-trainer-public ConfigMap, Role and RoleBinding (what the SDK reads).",
    "JobSet's CRD is config/components/crd/bases (conversion strategy None), not the release's "
    "(strategy Webhook at /convert): v0.12.0 has one version and serves no /convert, so the API "
    "server never converts; the release's patch only adds a dangling reference.",
    "The torch-distributed runtime's image is this checkout's trainer image "
    "(builds.images.trainer_ref()), not pytorch/pytorch.",
    "The progress API is on (feature gate TrainJobStatus; upstream's default is off). Its status "
    "server is a host process: it runs in a mount namespace of its own where /tmp holds its "
    "certificate and /run a service-account token (the two in-pod paths it reads); the API "
    "server's service-account issuer is https://127.0.0.1:<port>, which it discovers by OIDC "
    "(bound to system:service-account-issuer-discovery); a selector-less Service "
    f"{STATUS_DNS} with an EndpointSlice to the node's bridge gateway is how pods reach it; "
    f"the CA the pods trust it by is the cluster CA, in Secret {STATUS_CA_SECRET}.",
)


# ------------------------------------------------------------------------------------ processes


def trainer_tmpdir(ctx: Context) -> Path:
    """Trainer's TMPDIR: its webhook certificates are ``<TMPDIR>/k8s-webhook-server/...``."""
    return manager.folder(ctx, "trainer") / "tmp"


def trainer_config(ctx: Context) -> dict:
    """Trainer's Configuration (config.trainer.kubeflow.org/v1alpha1): upstream's
    ``manifests/base/manager/controller_manager_config.yaml`` with local addresses, no leader
    election and no certificate management."""
    p = ctx.ports
    return {
        "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
        "kind": "Configuration",
        "health": {
            "healthProbeBindAddress": f"127.0.0.1:{p['trainer-probe']}",
            "readinessEndpointName": "readyz",
            "livenessEndpointName": "healthz",
        },
        "metrics": {"bindAddress": f"127.0.0.1:{p['trainer-metrics']}", "secureServing": True},
        "webhook": {"port": p["trainer-webhook"], "host": "127.0.0.1"},
        "leaderElection": {"leaderElect": False},
        "controller": {
            "groupKindConcurrency": {
                "TrainJob.trainer.kubeflow.org": 5,
                "TrainingRuntime.trainer.kubeflow.org": 1,
                "ClusterTrainingRuntime.trainer.kubeflow.org": 1,
            }
        },
        "certManagement": {"enable": False},
        "clientConnection": {"qps": 50, "burst": 100},
        # The progress API: the status server on every interface (upstream binds ":<port>"),
        # which pods reach through the node's bridge gateway.
        "featureGates": {STATUS_FEATURE_GATE: True},
        "statusServer": {"port": p["trainer-status"]},
    }


def trainer_rundir(ctx: Context) -> Path:
    """What the status server sees as /run: a service-account token and namespace."""
    return manager.folder(ctx, "trainer") / "run"


def trainer_prepare(ctx: Context) -> None:
    """Write Trainer's config file, its serving certificate (the webhooks' and the status
    server's: it names the address pods use) and the service-account files of its /run."""
    manager.write_config(ctx, "trainer", trainer_config(ctx))
    manager.serving_cert(
        ctx,
        "trainer-webhook",
        trainer_tmpdir(ctx) / "k8s-webhook-server/serving-certs",
        dns=(STATUS_DNS, f"{STATUS_DNS}.cluster.local"),
        ips=(GATEWAY,),
    )
    account = trainer_rundir(ctx) / SERVICE_ACCOUNT_DIR
    account.mkdir(parents=True, exist_ok=True)
    # Only its `iss` claim is read (the issuer whose OIDC discovery it then asks the API server
    # for); a real token of upstream's service account, so the claim is the API server's own.
    token = ctx.kubectl("create", "token", STATUS_SERVICE, "-n", STATUS_NAMESPACE).stdout
    (account / "token").write_text(token.strip())
    (account / "namespace").write_text(STATUS_NAMESPACE)
    shutil.copyfile(ctx.pki.path("ca.crt"), account / "ca.crt")


def trainer_argv(ctx: Context) -> list[str]:
    """The controller with /tmp and /run of its own (its state's ``tmp`` and ``run``), in a
    mount namespace the host does not see; its binary and state stay where they are, even where
    the checkout lies under /tmp."""
    return procs.in_private_mounts(
        [(trainer_tmpdir(ctx), Path("/tmp")), (trainer_rundir(ctx), Path("/run"))],
        [ctx.state_dir, ctx.bindir],
        manager.argv(ctx, "trainer-controller-manager", "trainer", TRAINER_USER),
    )


def trainer_ready(ctx: Context) -> bool:
    """Ready: its probe says so, and the status server answers over TLS (it listens only once
    its OIDC discovery of the token issuer has worked, and a failure stops the controller)."""
    import ssl
    import urllib.error

    if not manager.probe_ready("trainer-probe")(ctx):
        return False
    tls = ssl.create_default_context(cafile=str(ctx.pki.path("ca.crt")))
    try:
        http_get(f"https://127.0.0.1:{ctx.ports['trainer-status']}/", tls)
    except urllib.error.HTTPError as e:  # 404 for "/": it serves
        return e.code == 404
    return False


def trainer_env(ctx: Context) -> dict[str, str]:
    return {"TMPDIR": str(trainer_tmpdir(ctx))}


def jobset_config(ctx: Context) -> dict:
    """JobSet's Configuration (config.jobset.x-k8s.io/v1alpha1): upstream's
    ``config/components/manager/controller_manager_config.yaml`` with local addresses, our cert
    dir, no leader election and no internal certificate management."""
    p = ctx.ports
    certs = str(ctx.state_dir / "jobset" / "certs")
    return {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": p["jobset-webhook"], "host": "127.0.0.1", "certDir": certs},
        "metrics": {"bindAddress": f"127.0.0.1:{p['jobset-metrics']}", "certDir": certs},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{p['jobset-probe']}"},
    }


def jobset_prepare(ctx: Context) -> None:
    """Write JobSet's config file and its serving certificate (webhook and metrics)."""
    manager.write_config(ctx, "jobset", jobset_config(ctx))
    manager.serving_cert(ctx, "jobset-webhook", ctx.state_dir / "jobset" / "certs")


def jobset_argv(ctx: Context) -> list[str]:
    return manager.argv(ctx, "jobset-controller-manager", "jobset", JOBSET_USER)


# ------------------------------------------------------------------------------------ objects


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def objects(ctx: Context) -> list[dict]:
    """The ClusterRoles, their bindings to our identities and the webhook configurations."""
    mandir = ctx.manifests
    ca_bundle = base64.b64encode(ctx.pki.path("ca.crt").read_bytes()).decode()
    trainer_docs = [*_docs(mandir / "trainer-rbac.yaml"), *_docs(mandir / "trainer-webhooks.yaml")]
    jobset_docs = _docs(mandir / "jobset-rbac-webhooks.yaml")
    hook_kinds = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    others: list[dict] = []
    for docs, port, roles, user in (
        (trainer_docs, ctx.ports["trainer-webhook"], TRAINER_ROLES, TRAINER_USER),
        (jobset_docs, ctx.ports["jobset-webhook"], JOBSET_ROLES, JOBSET_USER),
    ):
        found = {d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRole"}
        if not set(roles) <= found:
            raise RuntimeError(
                f"localkube trainer v2: upstream manifests lack ClusterRoles "
                f"{sorted(set(roles) - found)} (got {sorted(found)}). Rebuild the tools."
            )
        others += [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] in roles]
        cn = bootstrap.USERS[user][0]
        others += [bootstrap.cluster_role_binding(f"{user}:{r}", r, cn) for r in roles]
        others += [
            bootstrap.serve_locally(d, port, ca_bundle) for d in docs if d["kind"] in hook_kinds
        ]
    return others


def public_objects(mandir: Path) -> list[dict]:
    """Upstream's namespace with the SDK's ConfigMap :data:`PUBLIC` (from the overlay's
    ``configMapGenerator``, e.g. ``kubeflow_trainer_version=v2.3.0``) and the Role/RoleBinding
    of ``manifests/base/rbac`` that let every authenticated user read it."""
    overlay = yaml.safe_load((mandir / "trainer-overlay-manager.yaml").read_text())
    namespace = overlay["namespace"]
    generated = [g for g in overlay.get("configMapGenerator") or [] if g["name"] == PUBLIC]
    rbac = [
        copy.deepcopy(d)
        for d in _docs(mandir / "trainer-rbac.yaml")
        if d["kind"] in ("Role", "RoleBinding") and d["metadata"]["name"] == PUBLIC
    ]
    if len(generated) != 1 or sorted(d["kind"] for d in rbac) != ["Role", "RoleBinding"]:
        raise RuntimeError(
            f"localkube trainer v2: upstream's manifests changed: expected one configMapGenerator "
            f"{PUBLIC} and its Role and RoleBinding (got {len(generated)} generators, "
            f"{sorted(d['kind'] for d in rbac)}). Rebuild the tools, or look at the manifests."
        )
    data = dict(literal.split("=", 1) for literal in generated[0].get("literals") or [])
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": PUBLIC, "namespace": namespace},
        "data": data,
    }
    for d in rbac:
        d["metadata"]["namespace"] = namespace
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    return [ns, config_map, *rbac]


def status_objects(ctx: Context) -> list[dict]:
    """What the progress API needs around a status server that runs on the host:

    - upstream's ServiceAccount (its token gives the server the issuer's URL, see
      :func:`trainer_prepare`) and a binding of our Trainer identity to
      ``system:service-account-issuer-discovery`` (the OIDC discovery it does at start);
    - Secret :data:`STATUS_CA_SECRET` with the cluster CA as ``ca.crt`` (the plugin copies it
      into each TrainJob's ConfigMap; without it no TrainJob gets its JobSet);
    - a Service without selector named as the pods' URL says, and an EndpointSlice to the
      node's bridge gateway (10.244.0.1), where the host's status server listens: CoreDNS
      answers its name with that address."""
    port = ctx.ports["trainer-status"]
    ca = base64.b64encode(ctx.pki.path("ca.crt").read_bytes()).decode()
    meta = {"namespace": STATUS_NAMESPACE}
    cn = bootstrap.USERS[TRAINER_USER][0]
    discovery = "system:service-account-issuer-discovery"
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": STATUS_SERVICE, **meta},
        },
        bootstrap.cluster_role_binding(f"{TRAINER_USER}:{discovery}", discovery, cn),
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": STATUS_CA_SECRET, **meta},
            "data": {"ca.crt": ca},
        },
        *gateway.service(STATUS_SERVICE, STATUS_NAMESPACE, "status", port),
    ]


def apply_objects(ctx: Context) -> None:
    """Install the CRDs, ClusterRoles, their bindings, the webhook configurations, the SDK's
    public ConfigMap and what the progress API needs; wait until the CRDs are established (the
    controllers' informers need them at start)."""
    texts = [(ctx.manifests / f).read_text() for f in CRD_FILES]
    texts += [
        yaml.safe_dump(d)
        for d in [*objects(ctx), *public_objects(ctx.manifests), *status_objects(ctx)]
    ]
    ctx.apply("\n---\n".join(texts))
    bootstrap.wait_established(ctx, list(CRDS))


def torch_runtime(manifests: Path, image: str) -> dict:
    """Upstream's torch-distributed ClusterTrainingRuntime with ``image`` in its node container
    (its pods land on the real node, like every pod: nothing to place)."""
    runtime = _docs(manifests / "trainer-torch-distributed.yaml")[0]
    jobs = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    job = next((j for j in jobs if j["name"] == kubeflow.TRAINJOB_REPLICATED_JOB), None)
    containers = job["template"]["spec"]["template"]["spec"]["containers"] if job else []
    node = next((c for c in containers if c["name"] == kubeflow.TRAINJOB_CONTAINER), None)
    if runtime["metadata"]["name"] != kubeflow.DEFAULT_RUNTIME or node is None:
        raise RuntimeError(
            f"localkube trainer v2: upstream's runtime is not {kubeflow.DEFAULT_RUNTIME} with a "
            f"replicated job and container {kubeflow.TRAINJOB_CONTAINER!r} (got "
            f"{runtime['metadata']['name']}, jobs {[j['name'] for j in jobs]}). The contract in "
            f"controller/kubeflow.py needs a look."
        )
    node["image"] = image
    return runtime


def install_runtime(ctx: Context, image: str, timeout_s: float = 30) -> None:
    """Apply the torch-distributed runtime with ``image``; Trainer's validating webhook must
    admit it, so retry while the webhook server is still coming up."""
    runtime = torch_runtime(ctx.manifests, image)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ctx.apply(yaml.safe_dump(runtime), timeout=30)
            return
        except LocalkubeError as exc:
            if time.monotonic() > deadline:
                raise LocalkubeError(
                    f"localkube: the {kubeflow.DEFAULT_RUNTIME} runtime was not admitted after "
                    f"{timeout_s:.0f}s (got {exc}). See {ctx.state_dir / 'logs'}."
                ) from exc
            time.sleep(0.5)


def install_torch_runtime(ctx: Context) -> None:
    """The torch-distributed runtime with this checkout's trainer image (named, not built: the
    node's images step builds and imports it)."""
    install_runtime(ctx, images.trainer_ref())


# ------------------------------------------------------------------------------------ processes

JOBSET_CONTROLLER = Component(
    "jobset-controller-manager",
    jobset_argv,
    manager.probe_ready("jobset-probe"),
    prepare=jobset_prepare,
    ports=JOBSET_PORTS,
)

#: Waited for at once: the torch-distributed runtime is admitted by its webhook, so the step
#: after it needs it ready.
TRAINER_CONTROLLER = Component(
    "trainer-controller-manager",
    trainer_argv,
    trainer_ready,
    wait="now",
    env=trainer_env,
    prepare=trainer_prepare,
    ports=TRAINER_PORTS,
)
