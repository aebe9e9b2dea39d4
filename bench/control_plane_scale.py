"""Benchmark (first version, issue 28): what an idle fleet costs the API server.

Applies `--services` InferenceServices of `--pods-per-service` replicas on the local cluster,
waits until all are Ready, then counts the API server's requests over an idle window (its own
`apiserver_request_total`, by verb and resource) and reports them per second, beside:
- the same number of plain Deployments (same pods) with no operator, in the same run: what the
  control plane itself (controllers, kwok) costs while idle;
- with `--baseline COMMIT`, the operator of that commit (run from `git archive` of it, on this
  checkout's environment) on the same services, in the same run and cluster.

    llmfleet isolated -- python bench/control_plane_scale.py --services 20 --pods-per-service 2 \\
        [--baseline main] [--idle-seconds 60] [--resync-seconds 10] [--kubeconfig FILE]

Only the operator runs (not yet the gateway replicas, the autoscaler with a Prometheus, or the
change/restart figures of issue 28). `apiserver_request_total` has no user agent, so the
requests are not split by component: each figure is the whole API server's, and the operator's
share is its difference from the plain-Deployments row. The idle window should span several of
the operator's resync periods (`--resync-seconds`, 30 s by default in production).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml
from operator_scale import count_ready_services, kubectl

from llmfleet.core import netns
from llmfleet.core.cluster import LocalCluster
from llmfleet.crds import render

REPO = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = ("core", "crds", "operator", "autoscaler", "gateway", "runtime_image")
WRITES = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})
_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Counts = Counter[tuple[str, str]]


def requests(kubeconfig: Path) -> Counts:
    """(verb, resource[/subresource]) -> requests the API server has served so far."""
    counts: Counts = Counter()
    for line in kubectl(kubeconfig, "get", "--raw", "/metrics").splitlines():
        found = _SAMPLE.match(line)
        if found is None:
            continue
        labels = dict(_LABEL.findall(found["labels"]))
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += f"/{labels['subresource']}"
        counts[(labels.get("verb", ""), resource)] += int(float(found["value"]))
    return counts


def idle_rates(kubeconfig: Path, seconds: float) -> dict[tuple[str, str], float]:
    """Requests per second by (verb, resource) over `seconds` of nothing being changed."""
    before, started = requests(kubeconfig), time.monotonic()
    time.sleep(seconds)
    after, elapsed = requests(kubeconfig), time.monotonic() - started
    # The benchmark's own reads of /metrics are not the fleet's.
    return {
        key: (after[key] - before[key]) / elapsed
        for key in after
        if after[key] != before[key] and key[1] != ""
    }


def services(count: int, replicas: int) -> str:
    return yaml.safe_dump_all(
        {
            "apiVersion": "llmfleet.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": f"svc-{i:04d}"},
            "spec": {
                "model": {"name": f"org/model-{i}"},
                "topology": {"unified": {"replicas": replicas}},
            },
        }
        for i in range(count)
    )


def deployments(count: int, replicas: int) -> str:
    def one(i: int) -> dict[str, object]:
        app = {"app": f"dep-{i:04d}"}
        container = {"name": "engine", "image": "fake",
                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}  # fmt: skip
        return {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": f"dep-{i:04d}"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": app},
                     "template": {"metadata": {"labels": app},
                                  "spec": {"containers": [container]}}},
        }  # fmt: skip

    return yaml.safe_dump_all(one(i) for i in range(count))


def ready_pods(kubeconfig: Path, namespace: str) -> int:
    out = kubectl(kubeconfig, "get", "pods", "-n", namespace, "-o",
                  "jsonpath={range .items[*]}{.status.conditions[?(@.type=='Ready')].status}"
                  "{'\\n'}{end}")  # fmt: skip
    return out.split().count("True")


def wait(what: str, done: object, timeout: float = 1800) -> float:
    """Seconds until `done()` is true (checked every 2 s)."""
    started = time.monotonic()
    while not done():  # type: ignore[operator]
        if time.monotonic() - started > timeout:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(2)
    return time.monotonic() - started


def checkout(commit: str, into: Path) -> Path:
    """The source roots of `commit` (git archive), for PYTHONPATH."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, *SOURCE_ROOTS],
                             capture_output=True, check=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def run_operator(kubeconfig: Path, namespace: str, log: Path, resync: float,
                 source: Path | None) -> subprocess.Popen[bytes]:  # fmt: skip
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "LLMFLEET_OPERATOR_METRICS_PORT": "0",
        "LLMFLEET_OPERATOR_PROBE_IN_FLIGHT": "false",
        "LLMFLEET_OPERATOR_RESYNC_SECONDS": str(resync),
        "LLMFLEET_LOOPBACK_ONLY": "true",
    }
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(str(source / root) for root in SOURCE_ROOTS)
    return subprocess.Popen(
        [sys.executable, "-m", "llmfleet.core.cli", "operator", "--standalone", "-n", namespace],
        env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip


def run(kubeconfig: Path, args: argparse.Namespace, workdir: Path) -> None:
    count, replicas, idle = args.services, args.pods_per_service, args.idle_seconds
    columns: dict[str, dict[tuple[str, str], float]] = {}
    ready: dict[str, float] = {}

    kubectl(kubeconfig, "create", "namespace", "bench-plain")
    kubectl(kubeconfig, "apply", "-n", "bench-plain", "-f", "-", stdin=deployments(count, replicas))
    ready["plain Deployments"] = wait(
        "the plain Deployments", lambda: ready_pods(kubeconfig, "bench-plain") >= count * replicas
    )
    time.sleep(5)
    columns["plain Deployments"] = idle_rates(kubeconfig, idle)
    kubectl(kubeconfig, "delete", "namespace", "bench-plain", "--timeout=600s")

    for manifest in sorted(render.MANIFESTS_DIR.glob("*.yaml")):
        kubectl(kubeconfig, "apply", "--server-side", "-f", str(manifest))
    variants: list[tuple[str, Path | None]] = []
    if args.baseline:
        variants.append((f"operator @{args.baseline}", checkout(args.baseline, workdir / "base")))
    variants.append(("operator (this checkout)", None))
    for index, (label, source) in enumerate(variants):
        namespace = f"bench-op-{index}"
        kubectl(kubeconfig, "create", "namespace", namespace)
        operator = run_operator(kubeconfig, namespace, workdir / f"operator-{index}.log",
                                args.resync_seconds, source)  # fmt: skip
        try:
            kubectl(kubeconfig, "apply", "--server-side", "-n", namespace, "-f", "-",
                    stdin=services(count, replicas))  # fmt: skip
            ready[label] = wait(
                label, lambda ns=namespace: count_ready_services(kubeconfig, ns) >= count
            )
            time.sleep(5)
            columns[label] = idle_rates(kubeconfig, idle)
        finally:
            operator.terminate()
            operator.wait(30)
        kubectl(kubeconfig, "delete", "namespace", namespace, "--timeout=600s")
    report(args, columns, ready)


def report(args: argparse.Namespace, columns: dict[str, dict[tuple[str, str], float]],
           ready: dict[str, float]) -> None:  # fmt: skip
    names = list(columns)
    print(
        f"\n{args.services} services x {args.pods_per_service} pods, kwok nodes; idle window "
        f"{args.idle_seconds:.0f} s, operator resync {args.resync_seconds:.0f} s; "
        "API requests per second counted by the API server (apiserver_request_total)\n"
    )
    print(f"{'verb resource':44}" + "".join(f"{name:>28}" for name in names))
    keys = sorted({key for column in columns.values() for key in column})
    for key in keys:
        print(
            f"{key[0] + ' ' + key[1]:44}"
            + "".join(f"{columns[name].get(key, 0.0):>28.2f}" for name in names)
        )
    for title, verbs in (("all writes", WRITES), ("all reads", None)):
        totals = [sum(rate for (verb, _), rate in columns[name].items()
                      if (verb in WRITES) == (verbs is not None)) for name in names]  # fmt: skip
        print(f"{title:44}" + "".join(f"{total:>28.2f}" for total in totals))
    print(f"{'time until all Ready [s]':44}" + "".join(f"{ready[n]:>28.1f}" for n in names))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", type=int, default=20)
    parser.add_argument("--pods-per-service", type=int, default=1)
    parser.add_argument("--idle-seconds", type=float, default=60)
    parser.add_argument("--resync-seconds", type=float, default=10)
    parser.add_argument("--baseline", help="a commit whose operator runs beside this one")
    parser.add_argument("--kubeconfig", type=Path, help="use this cluster instead of a new one")
    args = parser.parse_args()
    problem = netns.isolation_problem()
    if problem is not None:
        sys.exit(f"control_plane_scale: {problem}")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if args.kubeconfig:
            run(args.kubeconfig, args, workdir)
            return
        cluster = LocalCluster("llmfleet-bench-cp", state=workdir / "state")
        nodes = -(-args.services * args.pods_per_service // 8) + 1
        print(f"starting a cluster with {nodes} nodes x 8 H100 ...", flush=True)
        cluster.up(node_count=nodes, gpus_per_node=8, gpu_type="H100")
        try:
            run(cluster.kubeconfig, args, workdir)
        finally:
            cluster.down()


if __name__ == "__main__":
    main()
