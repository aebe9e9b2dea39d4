"""Benchmark (issue 28): what the operator's watch caches hold at fleet scale, whole and trimmed.

The operator keeps every pod and child of every InferenceService, and the services themselves,
in informers (`operator/watched.py` over `core/informer.py`). This builds those caches for
`--services` services of `--pods-per-service` pods from objects as the local cluster makes them
(`tests/operator/cluster_objects.json`: one service's pods, children and the service, read raw
from the API server: the operator's Deployments made the pods, kwok filled their status) and
reports, for each way of keeping them, in a fresh process each:

- retained: the bytes still allocated once the cache is built (tracemalloc, a run of its own);
- RSS: the process's resident set after building (without tracemalloc), and its peak;
- what each part of a whole pod costs (managedFields, spec, status, ...), measured by
  dropping that part alone;

the objects arriving by WATCH (one JSON document per event, as when the operator was running
while the fleet was made) and by one LIST (as when it starts beside a running fleet). The
kinds are as the operator watches them: pods, then its children (ConfigMap, Service,
Deployment, PodDisruptionBudget, NetworkPolicy), then the InferenceServices.

    .venv/bin/python bench/operator_cache_memory.py [--services 1000] [--pods-per-service 10]
    .venv/bin/llmfleet isolated -- .venv/bin/python bench/operator_cache_memory.py --capture

`--capture` refreshes the sample objects: it starts the local cluster (2 nodes x 8 H100), runs
this checkout's operator, applies one service of 10 replicas as `control_plane_scale.py` does,
waits until it is Ready and writes what the API server returns (managedFields included).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from llmfleet.core.informer import PAGE_SIZE

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "tests" / "operator" / "cluster_objects.json"
SERVICE_NAME = "svc-0000"
NAMESPACE = "bench-cache"
PODS_KEPT = 2
"""Pods written to the samples (the service's ten differ only in names, uids and IPs)."""
CHILD_PATHS = {
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "Service": "/api/v1/namespaces/{ns}/services",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "PodDisruptionBudget": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
    "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
}


# -- capture: the sample objects from the local cluster ------------------------------------------


def capture() -> None:
    from llmfleet.core import netns  # noqa: PLC0415
    from llmfleet.core.cluster import LocalCluster  # noqa: PLC0415
    from llmfleet.crds import render  # noqa: PLC0415

    problem = netns.isolation_problem()
    if problem is not None:
        sys.exit(f"operator_cache_memory --capture: {problem}")
    sys.path.insert(0, str(REPO / "bench"))
    from operator_scale import count_ready_services, kubectl  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster("llmfleet-bench-cache", state=Path(tmp) / "state")
        print("starting a cluster with 2 nodes x 8 H100 ...", flush=True)
        cluster.up(node_count=2, gpus_per_node=8, gpu_type="H100")
        config = cluster.kubeconfig
        operator: subprocess.Popen[bytes] | None = None
        try:
            for manifest in sorted(render.MANIFESTS_DIR.glob("*.yaml")):
                kubectl(config, "apply", "--server-side", "-f", str(manifest))
            kubectl(config, "wait", "--for=condition=Established", "--timeout=60s",
                    f"crd/{render.CRD_NAME}")  # fmt: skip
            kubectl(config, "create", "namespace", NAMESPACE)
            env = {**os.environ, "KUBECONFIG": str(config), "LLMFLEET_LOOPBACK_ONLY": "true",
                   "LLMFLEET_OPERATOR_PROBE_IN_FLIGHT": "false",
                   "LLMFLEET_OPERATOR_METRICS_HOST": "127.0.0.1",
                   "LLMFLEET_OPERATOR_METRICS_PORT": "0"}  # fmt: skip
            operator = subprocess.Popen(
                [sys.executable, "-m", "llmfleet.core.cli", "operator", "--standalone",
                 f"--namespace={NAMESPACE}"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            service = {
                "apiVersion": "llmfleet.dev/v1alpha1", "kind": "InferenceService",
                "metadata": {"name": SERVICE_NAME},
                "spec": {"model": {"name": "org/model-0"},
                         "topology": {"unified": {"replicas": 10}}},
            }  # fmt: skip
            kubectl(config, "apply", "--server-side", "-n", NAMESPACE, "-f", "-",
                    stdin=json.dumps(service))  # fmt: skip
            deadline = time.monotonic() + 300
            while count_ready_services(config, NAMESPACE) < 1:
                if time.monotonic() > deadline:
                    sys.exit("the service was not Ready in 300 s")
                time.sleep(2)
            time.sleep(5)  # the operator's last pod changes and status write

            def raw(path: str, selector: str = "?labelSelector=llmfleet.dev/service") -> Any:
                # As the operator's watches select them (`watched.py`): the service's label.
                text = kubectl(config, "get", "--raw", path.format(ns=NAMESPACE) + selector)
                return list(json.loads(text)["items"])

            pods = raw("/api/v1/namespaces/{ns}/pods")[:PODS_KEPT]
            children = {kind: raw(path) for kind, path in CHILD_PATHS.items()}
            services = raw("/apis/llmfleet.dev/v1alpha1/namespaces/{ns}/inferenceservices", "")
        finally:
            if operator is not None:
                operator.terminate()
                operator.wait(30)
            cluster.down()
    samples = {
        "captured": time.strftime("%Y-%m-%d", time.gmtime()),
        "how": "bench/operator_cache_memory.py --capture",
        "pods": pods,
        "children": {kind: items for kind, items in children.items() if items},
        "services": services,
    }
    SAMPLES.write_text(json.dumps(samples, indent=1, sort_keys=True) + "\n")
    print(f"{len(pods)} pods, {sum(map(len, children.values()))} children, "
          f"{len(services)} services -> {SAMPLES.relative_to(REPO)}")  # fmt: skip


# -- the fleet: the samples, renamed per service and pod -----------------------------------------


def _renamed(obj: Mapping[str, Any], service: int, pod: int, version: int) -> dict[str, Any]:
    """The sample `obj` as service `service`'s (and its pod `pod`'s) would be: every string
    naming the service, the pod, its uid, IP or version distinct, as the API server's are."""
    text = json.dumps(obj)
    name = f"svc-{service:04d}"
    text = text.replace(SERVICE_NAME, name).replace("org/model-0", f"org/model-{service}")
    found = json.loads(text)
    meta = found["metadata"]
    meta["uid"] = f"{service:08x}-{pod:04x}-4000-8000-{version:012x}"
    meta["resourceVersion"] = str(version)
    if "status" in found and "podIP" in found["status"]:
        ip = f"10.{service // 250}.{service % 250}.{pod + 10}"
        found["status"]["podIP"] = ip
        found["status"]["podIPs"] = [{"ip": ip}]
        meta["name"] = f"{name}-main-{version:x}"
        meta["creationTimestamp"] = f"2026-11-28T0{service % 10}:{pod % 60:02d}:{version % 60:02d}Z"
    return found


def fleet(samples: Mapping[str, Any], services: int, pods: int) -> dict[str, list[dict[str, Any]]]:
    """kind -> the objects of `services` services of `pods` pods each."""
    version = 1000
    found: dict[str, list[dict[str, Any]]] = {"Pod": []}
    pod_samples = samples["pods"]
    for service in range(services):
        for pod in range(pods):
            version += 1
            sample = pod_samples[pod % len(pod_samples)]
            found["Pod"].append(_renamed(sample, service, pod, version))
        groups = [*samples["children"].items(), ("InferenceService", samples["services"])]
        for kind, items in groups:
            for item in items:
                version += 1
                found.setdefault(kind, []).append(_renamed(item, service, 0, version))
    return found


# -- one measurement, in a process of its own ----------------------------------------------------


def _dropping(path: tuple[str, ...]) -> Callable[[Mapping[str, Any]], Mapping[str, Any]]:
    """A transform that drops the one field at `path` (what that field costs)."""

    def drop(obj: Mapping[str, Any]) -> Mapping[str, Any]:
        found = copy.copy(dict(obj))
        parent: dict[str, Any] = found
        for key in path[:-1]:
            if key not in parent:
                return found
            parent[key] = dict(parent[key])
            parent = parent[key]
        parent.pop(path[-1], None)
        return found

    return drop


PARTS: dict[str, tuple[str, ...]] = {
    "metadata.managedFields": ("metadata", "managedFields"),
    "metadata.ownerReferences": ("metadata", "ownerReferences"),
    "metadata.labels": ("metadata", "labels"),
    "metadata.annotations": ("metadata", "annotations"),
    "spec": ("spec",),
    "status": ("status",),
    "status.conditions": ("status", "conditions"),
    "status.containerStatuses": ("status", "containerStatuses"),
}
"""The parts of a pod whose cost is measured one by one (dropping that part alone)."""


def transforms(variant: str) -> dict[str, Callable[[Mapping[str, Any]], Mapping[str, Any]] | None]:
    """kind -> the informer's transform in `variant` (None: the object kept whole)."""
    kinds = ["Pod", *CHILD_PATHS, "InferenceService"]
    if variant == "whole":
        return dict.fromkeys(kinds)
    if variant.startswith("pod-without:"):
        return {"Pod": _dropping(PARTS[variant.split(":", 1)[1]])}  # the pods alone
    from llmfleet.operator import kept  # noqa: PLC0415

    interned = variant == "trimmed+interned"
    return {kind: kept.transform(kind, intern=interned) for kind in kinds}


def _rss_kib() -> tuple[int, int]:
    """(resident set, its peak) of this process, KiB."""
    found = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0])
    return found["VmRSS"], found["VmHWM"]


def write_fleet(args: argparse.Namespace, into: Path) -> None:
    """What the API server would send for the fleet, per kind: one LIST body
    (`KIND.list.json`) and the WATCH events, one JSON document a line (`KIND.watch.jsonl`)."""
    samples = json.loads(SAMPLES.read_text())
    for kind, items in fleet(samples, args.services, args.pods_per_service).items():
        listing = {"kind": f"{kind}List", "metadata": {"resourceVersion": "1"}, "items": items}
        (into / f"{kind}.list.json").write_text(json.dumps(listing))
        for number, first in enumerate(range(0, len(items), PAGE_SIZE)):
            metadata = {"resourceVersion": "1"}
            if first + PAGE_SIZE < len(items):
                metadata["continue"] = str(number + 1)
            page = {"metadata": metadata, "items": items[first : first + PAGE_SIZE]}
            (into / f"{kind}.page{number}.json").write_text(json.dumps(page))
        with (into / f"{kind}.watch.jsonl").open("w") as events:
            for item in items:
                events.write(json.dumps({"type": "ADDED", "object": item}) + "\n")


def measure(args: argparse.Namespace) -> None:
    """Build the caches of `args.variant` from the documents in `args.fleet` (by
    `args.delivery`) and print one JSON line: what each kind's cache holds."""
    kinds = transforms(args.variant)
    gc.collect()
    if args.trace:
        tracemalloc.start()
    base_rss, _ = _rss_kib()
    held: dict[str, float] = {}
    informers = []
    for kind, transform in kinds.items():
        before = tracemalloc.get_traced_memory()[0] if args.trace else 0
        informers.append(_fed(kind, args.fleet, args.delivery, transform))
        gc.collect()
        held[kind] = (tracemalloc.get_traced_memory()[0] - before) / 2**20 if args.trace else 0
    rss, peak = _rss_kib()
    result = {"variant": args.variant, "delivery": args.delivery,
              "objects": {informer.what: len(informer.items()) for informer in informers},
              "rss_mib": (rss - base_rss) / 1024, "peak_rss_mib": peak / 1024,
              "retained_mib": held, "base_rss_mib": base_rss / 1024}  # fmt: skip
    print(json.dumps(result))


def _fed(kind: str, fleet: Path, delivery: str,
         transform: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None) -> Any:  # fmt: skip
    """An informer of `kind` fed its documents (the informer's own code: its LIST, then its
    WATCH, each document parsed as the client parses it), synced and stopped."""
    import threading  # noqa: PLC0415

    from llmfleet.core.informer import Informer, paged  # noqa: PLC0415

    done = threading.Event()

    def lister() -> Mapping[str, Any]:
        if delivery == "list":
            return dict(json.loads((fleet / f"{kind}.list.json").read_bytes()))
        if delivery == "pages":
            return paged(lambda token: json.loads((fleet / f"{kind}.page{token or 0}.json")
                                                  .read_bytes()))  # fmt: skip
        return {"metadata": {"resourceVersion": "1"}, "items": []}

    def watcher(version: str) -> Iterator[Mapping[str, Any]]:
        if delivery == "watch" and not done.is_set():
            with (fleet / f"{kind}.watch.jsonl").open("rb") as events:
                for line in events:
                    yield json.loads(line)
        done.set()
        informer.stop()

    informer = Informer(kind, lister, watcher, index=_service_label, transform=transform)
    informer.start()
    informer.join(600)
    return informer


def _service_label(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    meta = obj.get("metadata") or {}
    service = (meta.get("labels") or {}).get("llmfleet.dev/service")
    return (meta.get("namespace") or "", service) if service else None


# -- the report ----------------------------------------------------------------------------------


def _run(args: argparse.Namespace, variant: str, delivery: str, trace: bool) -> dict[str, Any]:
    command = [sys.executable, __file__, "--measure", "--variant", variant,
               "--delivery", delivery, "--fleet", str(args.fleet)]  # fmt: skip
    if trace:
        command.append("--trace")
    out = subprocess.run(command, capture_output=True, text=True, check=False, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"{variant}/{delivery}: {out.stderr.strip()[-2000:]}")
    result = dict(json.loads(out.stdout.strip().splitlines()[-1]))
    samples = json.loads(SAMPLES.read_text())
    wanted = {"Pod": args.services * args.pods_per_service, "InferenceService": args.services}
    wanted |= {kind: args.services * len(items) for kind, items in samples["children"].items()}
    held = result["objects"]
    if any(held[kind] != wanted[kind] for kind in held):  # renamed objects would collapse
        raise SystemExit(f"{variant}/{delivery}: the caches held {held}, not {wanted}")
    return result


def sizes(samples: Mapping[str, Any]) -> list[str]:
    """Each sample kind's JSON size, whole and trimmed (bytes of compact JSON per object)."""
    from llmfleet.operator import kept  # noqa: PLC0415

    lines = []
    groups = [("Pod", samples["pods"]), *samples["children"].items(),
              ("InferenceService", samples["services"])]  # fmt: skip
    for kind, items in groups:
        whole = sum(len(json.dumps(item, separators=(",", ":"))) for item in items) / len(items)
        trim = kept.transform(kind)
        cut = sum(len(json.dumps(trim(item), separators=(",", ":"))) for item in items)
        managed = sum(len(json.dumps(item["metadata"].get("managedFields") or [],
                                     separators=(",", ":"))) for item in items)  # fmt: skip
        lines.append(f"{kind:<22} {whole:>9.0f} {managed / len(items):>14.0f} "
                     f"{cut / len(items):>9.0f}")  # fmt: skip
    return lines


DELIVERIES = {"watch": "by WATCH:", "list": "one LIST:", "pages": f"LIST, {PAGE_SIZE} a page:"}
"""How the objects come: one WATCH event each (the operator ran while the fleet was made),
one LIST body (as the informer read a LIST before issue 28), or a LIST in pages (`paged`,
as it reads one now): the last two as when the operator starts beside a running fleet."""
VARIANTS = ("whole", "trimmed", "trimmed+interned")
"""whole: no transform (the operator before this change); trimmed: `kept.transform` without
interning; trimmed+interned: as the operator keeps them now (`kept.transform`)."""


def _groups(retained: Mapping[str, float]) -> dict[str, float]:
    children = sum(retained[kind] for kind in CHILD_PATHS)
    return {"pods": retained["Pod"], "children": children,
            "InferenceServices": retained["InferenceService"],
            "all": sum(retained.values())}  # fmt: skip


def report(args: argparse.Namespace) -> None:
    samples = json.loads(SAMPLES.read_text())
    services, pods = args.services, args.pods_per_service
    print(f"{services} services x {pods} pods: {services * pods} pods, "
          f"{services * sum(map(len, samples['children'].values()))} children, "
          f"{services} InferenceServices; samples captured {samples['captured']} "
          f"({samples['how']})\n")  # fmt: skip
    print("one object as the API server sends it, compact JSON [bytes]")
    print(f"{'kind':<22} {'whole':>9} {'managedFields':>14} {'kept':>9}")
    print("\n".join(sizes(samples)))
    with tempfile.TemporaryDirectory() as tmp:
        args.fleet = Path(tmp)
        write_fleet(args, args.fleet)
        print(
            "\nthe caches as the informers build them; each column a fresh process per "
            "delivery [MiB]"
        )
        print(f"{'':<40}" + "".join(f"{v:>18}" for v in VARIANTS))
        for delivery, title in DELIVERIES.items():
            traced = {v: _run(args, v, delivery, trace=True) for v in VARIANTS}
            plain = {v: _run(args, v, delivery, trace=False) for v in VARIANTS}
            print(title)
            groups = {v: _groups(traced[v]["retained_mib"]) for v in VARIANTS}
            if delivery == "watch":
                pods_by_watch = groups["whole"]["pods"]
            rows = [(f"  retained (tracemalloc): {group}", {v: groups[v][group] for v in VARIANTS})
                    for group in ("pods", "children", "InferenceServices", "all")]  # fmt: skip
            rows += [
                ("  RSS added (no tracemalloc)", {v: plain[v]["rss_mib"] for v in VARIANTS}),
                ("  peak RSS of the process", {v: plain[v]["peak_rss_mib"] for v in VARIANTS}),
            ]
            for name, cells in rows:
                print(f"{name:<40}" + "".join(f"{cells[v]:>18.1f}" for v in VARIANTS))
        print(f"(the process before building: {plain['whole']['base_rss_mib']:.0f} MiB RSS)")
        print(
            "\nwhat each part of the pods costs: the pods' cache by WATCH, whole, less the same "
            "without that part (tracemalloc) [MiB]"
        )
        whole = pods_by_watch
        for part in PARTS:
            variant = f"pod-without:{part}"
            without = _run(args, variant, "watch", trace=True)["retained_mib"]["Pod"]
            print(f"  {part:<44} {whole - without:>9.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--pods-per-service", type=int, default=10)
    parser.add_argument("--capture", action="store_true", help="refresh the sample objects")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="whole", help=argparse.SUPPRESS)
    parser.add_argument("--delivery", default="watch", help=argparse.SUPPRESS)
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fleet", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.capture:
        capture()
    elif args.measure:
        measure(args)
    else:
        report(args)


if __name__ == "__main__":
    main()
