"""`llmfleet operator`: run the InferenceService operator (kopf) against the current kubeconfig."""

from __future__ import annotations

import logging
import secrets
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any

import typer

from llmfleet.operator.settings import OperatorSettings

if TYPE_CHECKING:
    from kubernetes import client

    from llmfleet.operator.reconcile import BeforeStatus

# kopf, the Kubernetes client and the operator's modules are imported by `run`, not here:
# `llmfleet --help` loads this module to list the command and must stay fast.
app = typer.Typer(add_completion=False)


def ensure_peering(api: client.ApiClient, name: str, namespaces: list[str]) -> None:
    """Create the kopf peering object(s) replicas meet on, when the peering CRDs exist."""
    from kubernetes.client import CustomObjectsApi
    from kubernetes.client.exceptions import ApiException

    custom = CustomObjectsApi(api)
    body: dict[str, Any] = {"metadata": {"name": name}}
    try:
        if namespaces:
            for namespace in namespaces:
                custom.create_namespaced_custom_object(
                    "kopf.dev",
                    "v1",
                    namespace,
                    "kopfpeerings",
                    {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", **body},
                )
        else:
            custom.create_cluster_custom_object(
                "kopf.dev",
                "v1",
                "clusterkopfpeerings",
                {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", **body},
            )
    except ApiException as error:
        if error.status != 409:  # 409: it exists already
            raise


@app.command()
def run(
    namespace: Annotated[
        list[str] | None,
        typer.Option(
            "--namespace",
            "-n",
            help="Watch only these namespaces (repeatable).",
            show_default="all namespaces",
        ),
    ] = None,
    peering: Annotated[
        str | None,
        typer.Option(
            help="Peering name replicas share (only one acts at a time).",
            show_default=OperatorSettings.model_fields["peering"].default,
        ),
    ] = None,
    standalone: Annotated[
        bool, typer.Option(help="No peering: for a single replica or a cluster without the CRDs.")
    ] = False,
) -> None:
    """Run the InferenceService operator.

    Reconciles each InferenceService into pools of engine pods, Services and disruption budgets,
    against the current kubeconfig. Settings: environment LLMFLEET_OPERATOR_*."""
    serve(namespace, peering, standalone=standalone)


def serve(
    namespace: list[str] | None,
    peering: str | None,
    *,
    standalone: bool,
    before_status: BeforeStatus | None = None,
) -> None:
    """`run`'s body; `before_status` is the reconciler's test seam (`reconcile.BeforeStatus`),
    none from the command line."""
    import kopf
    from prometheus_client import start_http_server

    from llmfleet.core.kube import connect
    from llmfleet.core.loopback import LoopbackGuard
    from llmfleet.operator.handlers import build_registry
    from llmfleet.operator.inflight import probe_in_flight
    from llmfleet.operator.kube import PLURALS, Kube
    from llmfleet.operator.metrics import OperatorMetrics
    from llmfleet.operator.reconcile import Reconciler
    from llmfleet.operator.watched import Watched

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # kopf logs every watch-event handler call at INFO; ours log what they do themselves.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    settings = OperatorSettings()
    namespaces = list(namespace or settings.namespaces)
    peering_name = peering or settings.peering
    if not standalone and any(set("*?[") & set(ns) for ns in namespaces):
        raise typer.BadParameter(
            "namespace patterns need --standalone: peering objects live in named namespaces"
        )
    api = connect(component="operator")
    if not standalone:
        ensure_peering(api, peering_name, namespaces)
    metrics = OperatorMetrics()
    if settings.metrics_port:
        start_http_server(settings.metrics_port, settings.metrics_host, registry=metrics.registry)
        metrics.reached("serving")
    guard = LoopbackGuard(
        settings.loopback_only, lambda client: metrics.nonlocal_refused.labels(client).inc()
    )
    watched = Watched(api, namespaces, PLURALS)
    kube = Kube(api, settings.field_manager, watched, partial(probe_in_flight, guard=guard))
    if not settings.probe_in_flight:
        kube.in_flight = lambda _ip, _port: None
    reconciler = Reconciler(kube, settings, metrics, before_status=before_status)
    registry = build_registry(reconciler, watched)
    peering_args: dict[str, Any] = {"standalone": True}
    if not standalone:
        # Distinct priorities make exactly one replica active; the others wait as standbys.
        # (A peering name makes peering mandatory in kopf, so it is only passed here.)
        peering_args = {"peering_name": peering_name, "priority": secrets.randbelow(2**31)}
    kopf.run(registry=registry, clusterwide=not namespaces, namespaces=namespaces, **peering_args)
