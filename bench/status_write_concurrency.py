"""Benchmark: an autoscaler pass's status writes, one at a time against several at once
(`AutoscalerSettings.status_write_concurrency`), on the local cluster (issue 28).

A pass writes `status.autoscaling` of every service whose decision changed: all of them at its
first pass after an install, or when the signals go away for every service. At 1,000 services
that first pass took 102 s in bench/control_plane_scale.py, writing one PATCH after another.
This measures what the concurrency buys at the API server itself, without the rest of the
control plane: `--services` InferenceServices (no operator, so nothing reacts to the writes),
then, in each round and for each concurrency in turn, one decision per service written through
the autoscaler's own write step (`loop.Autoscaler._write` over `kube.Kube.write_autoscaling`,
a JSON merge patch of the status subresource). Each round's decisions differ from the last,
so every PATCH changes the object. Writes per second per round, then the medians and their
ratio to one at a time.

    llmfleet isolated -- python bench/status_write_concurrency.py [--services 300]
        [--concurrency 1,4,8] [--rounds 3]

It starts (and stops) its own cluster, and runs only inside a loopback-only network namespace
(`llmfleet isolated`). On the 2-core machine the API server, etcd and this client share the
cores: the API server's CPU per PATCH is what bounds it here, so the ratio is a floor of what
a control plane with cores to spare gives.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import yaml
from operator_scale import kubectl

from llmfleet.autoscaler.kube import Kube
from llmfleet.autoscaler.loop import Autoscaler, SignalSource
from llmfleet.autoscaler.metrics import AutoscalerMetrics
from llmfleet.core import netns
from llmfleet.core.cluster import LocalCluster
from llmfleet.core.kube import api_client
from llmfleet.crds import render

NAMESPACE = "bench-writes"


def services(count: int) -> str:
    return yaml.safe_dump_all(
        {
            "apiVersion": "llmfleet.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": f"svc-{i:04d}"},
            "spec": {
                "model": {"name": f"org/model-{i}"},
                "topology": {"unified": {"replicas": 1}},
                "autoscaling": {"enabled": True},
            },
        }
        for i in range(count)
    )


def decision(round_: int) -> dict[str, Any]:
    """A status.autoscaling patch as a pass writes one; `round_` makes each round's differ."""
    return {
        "pools": {
            "unified": {
                "active": 1 + round_ % 3,
                "spares": 0,
                "reason": f"scale to {1 + round_ % 3}: needs it for 40 concurrent streams at 32 "
                "per replica within the ITL target (profile, correction 1.00)",
            }
        },
        "lastDecisionTime": f"2026-11-29T00:{round_ % 60:02d}:00Z",
    }


def run(kubeconfig: Path, args: argparse.Namespace) -> None:
    for manifest in sorted(render.MANIFESTS_DIR.glob("*.yaml")):
        kubectl(kubeconfig, "apply", "--server-side", "--field-manager=bench", "-f", str(manifest))
    kubectl(kubeconfig, "wait", "--for=condition=Established", "--timeout=60s",
            f"crd/{render.CRD_NAME}")  # fmt: skip
    kubectl(kubeconfig, "create", "namespace", NAMESPACE)
    kubectl(kubeconfig, "apply", "--server-side", "--field-manager=bench", "-n", NAMESPACE,
            "-f", "-", stdin=services(args.services))  # fmt: skip
    kube = Kube(api_client(str(kubeconfig), component="autoscaler"), [NAMESPACE], "bench")
    keys = [(NAMESPACE, f"svc-{i:04d}") for i in range(args.services)]
    levels = [int(level) for level in args.concurrency.split(",")]
    rates: dict[int, list[float]] = {level: [] for level in levels}
    round_ = 0
    print(f"{args.services} services, status writes per second (rounds in turn)", flush=True)
    for number in range(1, args.rounds + 1):
        for level in levels:
            round_ += 1
            scaler = Autoscaler(kube, cast(SignalSource, None), AutoscalerMetrics(),
                                write_concurrency=level)  # fmt: skip
            patch = decision(round_)
            started = time.monotonic()
            written = scaler._write([(key, patch) for key in keys])
            seconds = time.monotonic() - started
            failed = [w for w in written if w is not True]
            if failed:
                raise SystemExit(f"{len(failed)} writes failed, the first: {failed[0]!r}")
            rates[level].append(args.services / seconds)
            print(f"round {number}, {level} at once: {args.services} writes in {seconds:.2f} s "
                  f"= {args.services / seconds:.0f}/s", flush=True)  # fmt: skip
    one = statistics.median(rates[levels[0]])
    print(f"\n{'at once':>8}{'writes/s median':>18}{'range':>14}{'vs ' + str(levels[0]):>10}")
    for level in levels:
        median = statistics.median(rates[level])
        spread = f"{min(rates[level]):.0f}-{max(rates[level]):.0f}"
        print(f"{level:>8}{median:>18.0f}{spread:>14}{median / one:>9.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", type=int, default=300)
    parser.add_argument("--concurrency", default="1,4,8", help="comma-separated, first = base")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    problem = netns.isolation_problem()
    if problem is not None:
        sys.exit(f"status_write_concurrency: {problem}")
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster("llmfleet-bench-writes", state=Path(tmp) / "state")
        print("starting a cluster ...", flush=True)
        cluster.up(node_count=1, gpus_per_node=8, gpu_type="H100")
        try:
            run(cluster.kubeconfig, args)
        finally:
            cluster.down()


if __name__ == "__main__":
    main()
