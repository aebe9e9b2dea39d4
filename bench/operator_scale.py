"""Benchmark: 200 InferenceServices applied at once on the local cluster.

Reports time until every service is Ready, the operator's reconcile latency (p50/p99 from its
own histogram), its CPU seconds and peak RSS. Baseline in the same run and the same cluster:
the same 200 Deployments applied directly, without the operator — the floor set by the control
plane (scheduler, controllers, kwok) that the operator's own overhead adds to.

    llmfleet isolated -- python bench/operator_scale.py [--services 200] [--kubeconfig FILE]

Without --kubeconfig it starts (and stops) its own cluster with enough fake GPU nodes. It runs
only inside a loopback-only network namespace (`llmfleet isolated`), like the tests, and with
LLMFLEET_LOOPBACK_ONLY on: kwok's pod IPs lead off the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import yaml

from llmfleet.core import netns
from llmfleet.core.cluster import LocalCluster, build
from llmfleet.core.cluster.toolchain import TOOLS_BY_NAME
from llmfleet.crds import render

REPO = Path(__file__).resolve().parents[1]


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    binary = build.binary(TOOLS_BY_NAME["kubernetes"], "kubectl")
    result = subprocess.run(
        [str(binary), "--kubeconfig", str(kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if result.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args[:3])}: {result.stderr.strip()}")
    return result.stdout


def services(count: int) -> str:
    docs = [
        {
            "apiVersion": "llmfleet.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": f"svc-{i:03d}"},
            "spec": {"model": {"name": f"org/model-{i}"}, "topology": {"unified": {"replicas": 1}}},
        }
        for i in range(count)
    ]
    return yaml.safe_dump_all(docs)


def deployments(count: int) -> str:
    docs = [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": f"dep-{i:03d}"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": f"dep-{i:03d}"}},
                "template": {
                    "metadata": {"labels": {"app": f"dep-{i:03d}"}},
                    "spec": {
                        "containers": [
                            {
                                "name": "engine",
                                "image": "fake",
                                "resources": {"limits": {"nvidia.com/gpu": "1"}},
                            }
                        ]
                    },
                },
            },
        }
        for i in range(count)
    ]
    return yaml.safe_dump_all(docs)


def count_ready_services(kubeconfig: Path, namespace: str) -> int:
    """Services whose Ready condition is True (jsonpath: kubectl does not print 1,000 specs)."""
    out = kubectl(kubeconfig, "get", "inferenceservices.llmfleet.dev", "-n", namespace, "-o",
                  "jsonpath={range .items[*]}{.status.conditions[?(@.type=='Ready')].status}"
                  "{'\\n'}{end}")  # fmt: skip
    return out.split().count("True")


def ready_deployments(kubeconfig: Path, namespace: str) -> int:
    items = json.loads(kubectl(kubeconfig, "get", "deployments", "-n", namespace, "-o", "json"))[
        "items"
    ]
    return sum(1 for item in items if item.get("status", {}).get("readyReplicas") == 1)


def histogram_quantile(text: str, name: str, quantile: float) -> float:
    """Prometheus-style quantile from cumulative buckets summed over all label sets."""
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket{{") and 'outcome="ok"' in line:
            bound = line.split('le="')[1].split('"')[0]
            le = float("inf") if bound == "+Inf" else float(bound)
            buckets[le] = buckets.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    ordered = sorted(buckets.items())
    total = ordered[-1][1]
    rank, lower, below = quantile * total, 0.0, 0.0
    for le, cumulative in ordered:
        if cumulative >= rank:
            if le == float("inf"):
                return lower
            return lower + (le - lower) * (rank - below) / max(cumulative - below, 1e-9)
        lower, below = le, cumulative
    return lower


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run(kubeconfig: Path, count: int, workdir: Path) -> None:
    # Baseline: the control plane alone.
    kubectl(kubeconfig, "create", "namespace", "bench-baseline")
    kubectl(kubeconfig, "apply", "-n", "bench-baseline", "-f", "-", stdin=deployments(count))
    started = time.monotonic()
    while ready_deployments(kubeconfig, "bench-baseline") < count:
        time.sleep(1)
    baseline = time.monotonic() - started
    kubectl(kubeconfig, "delete", "namespace", "bench-baseline", "--wait=true", "--timeout=600s")

    for manifest in sorted(render.MANIFESTS_DIR.glob("*.yaml")):
        kubectl(kubeconfig, "apply", "--server-side", "-f", str(manifest))
    kubectl(kubeconfig, "create", "namespace", "bench")
    port = free_port()
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "LLMFLEET_OPERATOR_METRICS_PORT": str(port),
        "LLMFLEET_OPERATOR_PROBE_IN_FLIGHT": "false",  # the figures are the reconcile's own
        "LLMFLEET_LOOPBACK_ONLY": "true",
        "LLMFLEET_OPERATOR_METRICS_HOST": "127.0.0.1",
    }
    log = (workdir / "operator.log").open("w")
    operator = subprocess.Popen(
        [sys.executable, "-m", "llmfleet.core.cli", "operator", "--standalone", "-n", "bench"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    process = psutil.Process(operator.pid)
    try:
        time.sleep(3)
        cpu_before = sum(process.cpu_times()[:2])
        started = time.monotonic()
        kubectl(
            kubeconfig, "apply", "--server-side", "-n", "bench", "-f", "-", stdin=services(count)
        )
        while count_ready_services(kubeconfig, "bench") < count:
            time.sleep(1)
        with_operator = time.monotonic() - started
        cpu = sum(process.cpu_times()[:2]) - cpu_before
        peak_rss = (
            int(Path(f"/proc/{operator.pid}/status").read_text().split("VmHWM:")[1].split()[0])
            / 1024
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            metrics = response.read().decode()
    finally:
        operator.terminate()
        operator.wait(30)
        log.close()

    name = "llmfleet_operator_reconcile_seconds"
    p50 = histogram_quantile(metrics, name, 0.5) * 1000
    p99 = histogram_quantile(metrics, name, 0.99) * 1000
    print(f"\n{count} services, 1 replica x 1 GPU each, kwok nodes\n")
    print(f"{'':38}{'baseline (Deployments)':>24}{'llmfleet operator':>20}")
    print(f"{'time until all Ready [s]':38}{baseline:>24.1f}{with_operator:>20.1f}")
    print(f"{'ratio to baseline':38}{1.0:>24.2f}{with_operator / baseline:>20.2f}")
    print(f"{'reconcile latency p50 / p99 [ms]':38}{'-':>24}{f'{p50:.0f} / {p99:.0f}':>20}")
    print(f"{'operator CPU during the run [s]':38}{'-':>24}{cpu:>20.1f}")
    print(f"{'operator peak RSS [MiB]':38}{'-':>24}{peak_rss:>20.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", type=int, default=200)
    parser.add_argument("--kubeconfig", type=Path, help="use this cluster instead of a new one")
    args = parser.parse_args()
    problem = netns.isolation_problem()
    if problem is not None:
        sys.exit(f"operator_scale: {problem}")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if args.kubeconfig:
            run(args.kubeconfig, args.services, workdir)
            return
        cluster = LocalCluster("llmfleet-bench", state=workdir / "state")
        nodes = -(-args.services // 8) + 1
        print(f"starting a cluster with {nodes} nodes x 8 H100 ...", flush=True)
        cluster.up(node_count=nodes, gpus_per_node=8, gpu_type="H100")
        try:
            run(cluster.kubeconfig, args.services, workdir)
        finally:
            cluster.down()


if __name__ == "__main__":
    main()
