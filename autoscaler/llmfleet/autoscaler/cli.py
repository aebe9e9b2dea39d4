"""`llmfleet autoscaler`: size every autoscaled InferenceService from Prometheus, every interval."""

from __future__ import annotations

import gc
import logging
import signal
import socket
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from llmfleet.autoscaler.settings import AutoscalerSettings
from llmfleet.core.options import given

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from llmfleet.autoscaler.kube import Kube
    from llmfleet.autoscaler.lease import LeaseElector
    from llmfleet.autoscaler.loop import Outcome
    from llmfleet.autoscaler.metrics import AutoscalerMetrics

# The Kubernetes and Prometheus clients and the policy are imported by `run`, not here:
# `llmfleet --help` loads this module to list the command and must stay fast.
app = typer.Typer(add_completion=False)
log = logging.getLogger("llmfleet.autoscaler")
_DEFAULTS = AutoscalerSettings.model_fields


@app.command()
def run(
    *,
    prometheus_url: Annotated[
        str | None,
        typer.Option(
            help="Prometheus that scrapes the engines.",
            show_default=_DEFAULTS["prometheus_url"].default,
        ),
    ] = None,
    namespace: Annotated[
        list[str] | None,
        typer.Option(
            "--namespace",
            "-n",
            help="Only these namespaces (repeatable).",
            show_default="all namespaces",
        ),
    ] = None,
    interval: Annotated[
        float | None,
        typer.Option(
            help="Seconds between passes.",
            min=0.1,
            show_default=f"{_DEFAULTS['interval_seconds'].default:g}",
        ),
    ] = None,
    profiles_dir: Annotated[
        Path | None,
        typer.Option(
            help="Directory of capacity profiles (JSON), one per model.",
            show_default="none: per-GPU defaults",
        ),
    ] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            help="Kubeconfig.", show_default="in-cluster config, else $KUBECONFIG or ~/.kube/config"
        ),
    ] = None,
    once: Annotated[bool, typer.Option(help="One pass, then exit.")] = False,
) -> None:
    """Run the SLO-aware autoscaler.

    Sizes every autoscaled InferenceService from Prometheus and writes each decision, with its
    reason, to status.autoscaling. Settings: environment LLMFLEET_AUTOSCALER_*."""
    from prometheus_client import start_http_server

    from llmfleet.autoscaler.inputs import PolicyConfig
    from llmfleet.autoscaler.kube import Kube
    from llmfleet.autoscaler.loop import Autoscaler
    from llmfleet.autoscaler.metrics import AutoscalerMetrics
    from llmfleet.autoscaler.profiles import load_profiles
    from llmfleet.autoscaler.signals import PrometheusSignals
    from llmfleet.core.kube import connect
    from llmfleet.core.loopback import LoopbackGuard

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    overrides = given(
        prometheus_url=prometheus_url,
        namespaces=namespace,
        interval_seconds=interval,
        profiles_dir=profiles_dir,
    )
    settings = AutoscalerSettings(**overrides)
    profiles = load_profiles(settings.profiles_dir)
    metrics = AutoscalerMetrics()
    if settings.metrics_port and not once:
        start_http_server(settings.metrics_port, settings.metrics_host, registry=metrics.registry)
        metrics.start.reached("serving")
    kube = Kube(
        connect(str(kubeconfig) if kubeconfig else None, component="autoscaler"),
        settings.namespaces,
        settings.field_manager,
    )
    autoscaler = Autoscaler(
        kube,
        PrometheusSignals(
            settings.prometheus_url,
            rate_window=settings.rate_window,
            peak_window=settings.peak_window,
            peak_step=settings.scrape_interval,
            chunk_services=settings.query_chunk_services,
            concurrency=settings.query_concurrency,
            recorded_rules=settings.recorded_rules,
            guard=LoopbackGuard(
                settings.loopback_only,
                lambda client: metrics.nonlocal_refused.labels(client).inc(),
            ),
        ),
        metrics,
        profiles=profiles,
        config=PolicyConfig(
            latency_quantile=settings.latency_quantile,
            horizon_s=settings.forecast_horizon_seconds,
        ),
        status_refresh_seconds=settings.status_refresh_seconds,
        write_concurrency=settings.status_write_concurrency,
        other_writes_seconds=settings.status_other_writes_seconds,
    )
    log.info(
        "sizing %s every %g s (fast passes every %g s) from %s (%d capacity profiles)",
        ", ".join(settings.namespaces) or "all namespaces",
        settings.interval_seconds,
        settings.fast_interval_seconds,
        settings.prometheus_url,
        len(profiles),
    )
    elector = _elector(settings, kube.api) if settings.leader_election and not once else None
    leads: Callable[[], bool] = (
        (lambda: elector.lead(datetime.now(UTC))) if elector is not None else (lambda: True)
    )
    if elector is not None:
        # SIGTERM (a rollout, a drained node) ends the loop through `finally`: the Lease is
        # given up, so the standby takes over at its next pass instead of after lease_seconds.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    fast = settings.fast_interval_seconds
    frozen = False
    try:
        # The watches start now, the services' and the pods' LISTs together (a standby replica
        # keeps them too, so it acts at once when it takes the Lease over).
        kube.start()
        while True:
            started = time.monotonic()
            if leads() and _log_pass(autoscaler.run_once, "autoscaler pass"):
                note_start(metrics, kube)
            if once:
                return
            if not frozen:
                frozen = True
                log.info("froze %d objects of the heap after the first pass", freeze_heap())
            # Fast passes until the next full one is due (none when disabled or not shorter).
            due = started + settings.interval_seconds
            while 0 < fast < settings.interval_seconds and time.monotonic() + fast < due:
                time.sleep(fast)
                if leads():
                    _log_pass(autoscaler.run_fast, "autoscaler fast pass")
            time.sleep(max(due - time.monotonic(), 0.0))
    finally:
        kube.stop()
        if elector is not None:
            elector.release()


def freeze_heap() -> int:
    """Collect once, then `gc.freeze()` everything alive; the count frozen.

    Done once, after the first full pass: the heap is then mostly what lasts (the modules, the
    informers' services and pods, each service's parsed spec and policy state: ~270k objects at
    1,000 services x 10 pods), which every full collection walked, ~130 ms each, one or more per
    pass (bench/autoscaler_pass_client.py). Frozen, collections walk only what came since. What is
    frozen and dies later (a pod the watch replaced) is freed by reference counting; only garbage
    in a cycle would stay, and the collection just before the freeze leaves none. The gateway does
    the same (gateway/llmfleet/gateway/gc_pauses.py)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _elector(settings: AutoscalerSettings, api: ApiClient) -> LeaseElector:
    from llmfleet.autoscaler.lease import LeaseElector

    identity = f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    log.info("leader election: lease %s/%s as %s", settings.lease_namespace,
             settings.lease_name, identity)  # fmt: skip
    return LeaseElector(
        api, settings.lease_namespace, settings.lease_name, identity, settings.lease_seconds
    )


def note_start(metrics: AutoscalerMetrics, kube: Kube) -> None:
    """After a full pass that went through: the start's last steps
    (`llmfleet_autoscaler_start_seconds`), the first pass now and the watches' first LISTs when
    they were in memory (the pass waited for them)."""
    if not metrics.start.has_reached("listed"):
        listed = kube.synced_at()
        if listed is not None:
            metrics.start.reached("listed", listed)
    metrics.start.reached("first_pass")


def _log_pass(run_pass: Callable[[datetime], list[Outcome]], what: str) -> bool:
    """Run a pass and log what it wrote; whether it went through (a failure is logged)."""
    try:
        for outcome in run_pass(datetime.now(UTC)):
            if outcome.written:
                pools = ", ".join(
                    f"{pool} {p.active}+{p.spares}" for pool, p in outcome.decision.pools.items()
                )
                log.info("%s/%s: %s", outcome.namespace, outcome.name, pools)
    except Exception:  # the API server may be briefly away; the next pass tries again
        log.exception("%s failed", what)
        return False
    return True
