"""The client side of the autoscaler's passes at fleet scale: its own process's time, this
checkout beside `--baseline` (issue 28).

What a pass costs the autoscaler's process, apart from Prometheus' evaluation: the HTTP
exchange, the JSON, parsing it into per-pool signals, counting each service's pods, the
policy's decisions and the status it compares. To take Prometheus out of it, its answers are
recorded once and replayed:

1. record (`--answers` names a file that does not exist yet): the stand-in exporter
   (`_fleet_metrics.py`) for `--services` x `--pods-per-service` pods and a Prometheus 2.42
   evaluating the chart's rule files (as `autoscaler_query_scale.py` starts them); once every
   pool's recorded series exist, the answers to exactly the requests a pass makes (the rules,
   the recorded full pass's chunks, the fast pass's gauges) are saved, with the time asked;
2. replay: a stub Prometheus on 127.0.0.1 answers those requests from the file at once (any
   other query: 400, so a pass that asks something else fails loudly);
3. measure: `llmfleet.autoscaler.loop.Autoscaler` of this checkout and of the `--baseline`
   commit (its source roots extracted as `_support.checkout` does, run with PYTHONPATH), each
   in a process of its own, against a Kube whose informers hold the services and their pods
   (all Ready and serving; status writes merge into the held services as the API server would),
   its passes' clock at the recording's time. Each process makes one full and one fast pass
   unmeasured, then `--repeats` of each in turn, measured; the two revisions' processes take
   turns, `--rounds` each. Per pass: wall time and the process's CPU time (the stub's own work
   is in another process), and the full pass's `read_services` alone (HTTP + JSON + parse).
   Medians over every measured pass. The decisions (pools' counts, floors and reasons, and
   which were written) of every pass are compared between the revisions: they must be equal.

    .venv/bin/llmfleet isolated -- nice -n 19 .venv/bin/python bench/autoscaler_pass_client.py \\
        --answers /tmp/answers-1000x10.json.gz [--services 1000 --pods-per-service 10] \\
        [--baseline f41b14c] [--rounds 3] [--repeats 3] [--profile full|fast]

`--profile` instead runs this checkout once under cProfile (one measured pass of that kind) and
prints its heaviest functions. Refuses to start outside a loopback-only namespace.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import gzip
import hashlib
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import autoscaler_query_scale as query_scale
import requests
from _autoscaler import SCRAPE_SECONDS, Prometheus, _wait
from _gateways import stop_process
from _support import checkout, free_port, revision_env
from kubernetes import client

# A worker process imports these from the revision it measures (PYTHONPATH).
from llmfleet.autoscaler import cli, loop
from llmfleet.autoscaler.kube import Kube
from llmfleet.autoscaler.metrics import AutoscalerMetrics
from llmfleet.autoscaler.promql import QueryOptions, chunks, combined_query, gauge_queries
from llmfleet.autoscaler.promql import matchers as matching
from llmfleet.autoscaler.recorded import recorded_queries
from llmfleet.autoscaler.signals import PrometheusSignals
from llmfleet.core import netns

BENCH = Path(__file__).resolve().parent
NAMESPACE = "bench"
POOL = "unified"


# ---------------------------------------------------------------------------------------------
# Record


def record(path: Path, services: int, per_service: int, warmup_s: float) -> None:
    """Prometheus' answers to one full (recorded) and one fast pass's requests, saved at `path`."""
    fleet = query_scale.pods(services, per_service)
    with tempfile.TemporaryDirectory(prefix="llmfleet-pass-client-") as tmp:
        workdir = Path(tmp)
        (workdir / "pods.json").write_text(json.dumps(fleet))
        port = free_port()
        exporter = subprocess.Popen([sys.executable, str(BENCH / "_fleet_metrics.py"), "--pods",
                                     str(workdir / "pods.json"), "--port", str(port)])  # fmt: skip
        processes: list[subprocess.Popen[bytes]] = [exporter]
        try:
            prometheus = Prometheus(f"127.0.0.1:{port}", workdir / "prometheus", chart_rules=True)
            processes.append(prometheus.process)
            print(f"Prometheus scraping {len(fleet)} pods' stand-in series ...", flush=True)
            _wait("two scrapes of every pod",
                  lambda: prometheus.value("count(rate(vllm:request_success_total[1m]) > 0)")
                  >= len(fleet), timeout=SCRAPE_SECONDS * 12, every=2)  # fmt: skip
            time.sleep(warmup_s)
            _wait("the recorded series of every pool",
                  lambda: prometheus.value("count(llmfleet_pool:time_to_first_token_seconds_bucket"
                                           ':increase1m{le="+Inf"} > 0)') >= services,
                  timeout=SCRAPE_SECONDS * 8, every=2)  # fmt: skip
            url = prometheus.url
            rules = requests.get(f"{url}/api/v1/rules", params={"type": "record"}, timeout=60)
            wanted = [(NAMESPACE, f"svc-{s:04d}") for s in range(services)]
            options = QueryOptions()
            queries = [combined_query(recorded_queries(options, c.match))
                       for c in chunks(wanted, 100)]  # fmt: skip
            queries.append(combined_query(gauge_queries(matching(NAMESPACE))))
            asked_at = time.time()
            answers = {}
            for promql in queries:
                answer = requests.post(f"{url}/api/v1/query", data={"query": promql}, timeout=120)
                answer.raise_for_status()
                answers[promql] = answer.text
        finally:
            for process in reversed(processes):
                if process.poll() is None:
                    stop_process(process)
    saved = {"asked_at": asked_at, "services": services, "per_service": per_service,
             "rules": rules.text, "queries": answers}  # fmt: skip
    with gzip.open(path, "wt") as out:
        json.dump(saved, out)
    print(f"recorded {len(answers)} answers at {path}", flush=True)


# ---------------------------------------------------------------------------------------------
# Replay


@contextmanager
def stub(answers: Mapping[str, Any]) -> Iterator[str]:
    """A Prometheus on 127.0.0.1 answering the recorded requests at once; its URL."""
    rules = answers["rules"].encode()
    queries = {promql: body.encode() for promql, body in answers["queries"].items()}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path.startswith("/api/v1/rules"):
                self._send(200, rules)
            else:
                self._send(404, b"{}")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            form = urllib.parse.parse_qs(self.rfile.read(length).decode())
            body = queries.get(form.get("query", [""])[0])
            if body is None:
                self._send(400, b'{"status":"error","errorType":"bad_data","error":"not recorded"}')
            else:
                self._send(200, body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------------------------------------
# One revision's passes (in a process of its own)


class _Held:
    """An informer holding fixed objects (`Kube`'s informer seam)."""

    def __init__(self, what: str, objects: list[dict[str, Any]]) -> None:
        self.what = what
        self.objects = objects

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def wait_synced(self, timeout: float) -> bool:
        return True

    def items(self) -> list[Mapping[str, Any]]:
        return list(self.objects)


def _fleet(services: int, per_service: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The services (as the API server lists them) and their pods (as `kept.pod` keeps them)."""
    bodies, pods = [], []
    for s in range(services):
        name = f"svc-{s:04d}"
        unified = {"replicas": per_service, "minReplicas": 1, "maxReplicas": 2 * per_service}
        bodies.append({
            "apiVersion": "llmfleet.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"namespace": NAMESPACE, "name": name, "uid": f"uid-{s}",
                         "resourceVersion": "1"},
            "spec": {"model": {"name": "bench/model"},
                     "runtime": {"gpu": {"type": "H100", "count": 1}},
                     "topology": {"mode": "Unified", "unified": unified},
                     "slo": {"ttftP95Ms": 1800, "itlP95Ms": 50, "maxKvCacheUsage": 0.8},
                     "autoscaling": {"enabled": True, "warmSpares": 0}},
        })  # fmt: skip
        for p in range(per_service):
            pods.append({
                "metadata": {"name": f"{name}-{p}", "namespace": NAMESPACE, "resourceVersion": "1",
                             "labels": {"llmfleet.dev/service": name, "llmfleet.dev/pool": POOL,
                                        "llmfleet.dev/serving": "true"}},
                "status": {"conditions": [{"type": "Ready", "status": "True"},
                                          {"type": "PodScheduled", "status": "True"}]},
            })  # fmt: skip
    return bodies, pods


def _merged(old: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386) applied to `old`."""
    result = dict(old)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, Mapping):
            result[key] = _merged(result.get(key) or {}, value)
        else:
            result[key] = value
    return result


def _digest(outcomes: list[Any]) -> str:
    """The decisions of a pass, as text to compare between revisions."""
    lines = []
    for o in outcomes:
        pools = ";".join(f"{pool}={p.active}+{p.spares} floor {p.floor} {p.reason}"
                         for pool, p in sorted(o.decision.pools.items()))  # fmt: skip
        lines.append(f"{o.namespace}/{o.name} written={o.written} {pools}")
    return "\n".join(lines)


class _HeldKube(Kube):
    """`Kube` on held services and pods; a status write merges into the held service (and
    bumps its resourceVersion) as the API server would."""

    def __init__(self, bodies: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        def informer(what: str, call: Any, transform: Any = None) -> _Held:
            return _Held(what, pods if what == "pods" else bodies)

        super().__init__(client.ApiClient(), [NAMESPACE], "bench", informer=informer)
        self.by_key = {(b["metadata"]["namespace"], b["metadata"]["name"]): b for b in bodies}

    def write_autoscaling(self, namespace: str, name: str, autoscaling: Mapping[str, Any]) -> bool:
        body = self.by_key[(namespace, name)]
        status = body.get("status") or {}
        merged = _merged(status.get("autoscaling") or {}, autoscaling)
        body["status"] = {**status, "autoscaling": merged}
        version = str(int(body["metadata"]["resourceVersion"]) + 1)
        body["metadata"] = {**body["metadata"], "resourceVersion": version}
        return True

    def event(self, service: Mapping[str, Any], reason: str, message: str) -> None:
        pass


class _Timer:
    """Times passes (wall, CPU, garbage collection) and keeps their decisions' digests."""

    def __init__(self, asked_at: float) -> None:
        start = datetime.fromtimestamp(asked_at, UTC)
        self.clock = (start + timedelta(seconds=2 * i) for i in range(10_000))
        self.digests: list[str] = []
        self._since, self._collecting = 0.0, 0.0
        gc.callbacks.append(self._collected)

    def _collected(self, phase: str, info: Mapping[str, Any]) -> None:
        if phase == "start":
            self._since = time.perf_counter()
        else:
            self._collecting += time.perf_counter() - self._since

    def __call__(self, run: Callable[[datetime], list[Any]]) -> tuple[float, float, float]:
        now = next(self.clock)
        wall, cpu, collecting = time.perf_counter(), time.process_time(), self._collecting
        outcomes = run(now)
        taken = time.perf_counter() - wall, time.process_time() - cpu
        self.digests.append(_digest(outcomes))
        return *taken, self._collecting - collecting


def _profiled(timer: _Timer, run: Callable[[datetime], list[Any]]) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    timer(run)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(45)
    stats.sort_stats("tottime").print_stats(30)
    print(out.getvalue())


def worker(args: argparse.Namespace) -> None:
    """One revision's passes; prints its figures as JSON."""
    kube = _HeldKube(*_fleet(args.services, args.pods_per_service))
    signals = PrometheusSignals(args.url, timeout_s=120)
    autoscaler = loop.Autoscaler(kube, signals, AutoscalerMetrics(), status_refresh_seconds=60.0)
    wanted = {key: [POOL] for key in kube.by_key}
    timer = _Timer(args.asked_at)
    timer(autoscaler.run_once)
    # What `llmfleet autoscaler` does after its first pass, where the revision does it.
    if hasattr(cli, "freeze_heap"):
        cli.freeze_heap()
    timer(autoscaler.run_fast)
    if signals.source() != "recorded":
        raise SystemExit(f"the pass does not read the recorded series: {signals.rules.problem}")
    if args.profile:
        _profiled(timer, autoscaler.run_once if args.profile == "full" else autoscaler.run_fast)
        return

    def read(now: datetime) -> list[Any]:
        found = signals.read_services(wanted)
        if sum(len(p) for p in found.values() if isinstance(p, dict)) != len(wanted):
            raise SystemExit("the read found another number of pools than services")
        return []

    figures: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for kind, run in (("full", autoscaler.run_once), ("fast", autoscaler.run_fast),
                          ("read", read)):  # fmt: skip
            for what, value in zip(("wall", "cpu", "gc"), timer(run), strict=True):
                figures.setdefault(f"{kind}_{what}", []).append(value)
    signals.close()
    digest = hashlib.sha256("\n--\n".join(timer.digests).encode()).hexdigest()
    writes = sum(d.count("written=True") for d in timer.digests)
    print(json.dumps({"figures": figures, "digest": digest, "loop": loop.__file__,
                      "writes": writes}))  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Both revisions, in turn


def _run_worker(
    url: str, answers: Mapping[str, Any], args: argparse.Namespace, source: Path | None
) -> dict[str, Any]:
    env = revision_env(source)
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--url", url,
               "--asked-at", str(answers["asked_at"]), "--services", str(answers["services"]),
               "--pods-per-service", str(answers["per_service"]),
               "--repeats", str(args.repeats)]  # fmt: skip
    if args.profile:
        command += ["--profile", args.profile]
        subprocess.run(command, env=env, check=True)
        return {}
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--answers", type=Path, required=False)
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--pods-per-service", type=int, default=10)
    parser.add_argument("--warmup-seconds", type=float, default=45.0)
    parser.add_argument("--baseline", default="", help="git revision to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", choices=("full", "fast"), default="")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", default="", help=argparse.SUPPRESS)
    parser.add_argument("--asked-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    problem = netns.isolation_problem()
    if problem:
        raise SystemExit(problem)
    path = args.answers or Path(tempfile.gettempdir()) / "llmfleet-pass-client-answers.json.gz"
    if not path.exists():
        record(path, args.services, args.pods_per_service, args.warmup_seconds)
    with gzip.open(path, "rt") as saved:
        answers = json.load(saved)
    with stub(answers) as url, tempfile.TemporaryDirectory(prefix="llmfleet-base-") as tmp:
        if args.profile:
            _run_worker(url, answers, args, None)
            return
        revisions: dict[str, Path | None] = {"this checkout": None}
        if args.baseline:
            revisions[f"baseline {args.baseline}"] = checkout(args.baseline, Path(tmp) / "src")
        runs: dict[str, list[dict[str, Any]]] = {label: [] for label in revisions}
        for _ in range(args.rounds):
            for label, source in revisions.items():
                runs[label].append(_run_worker(url, answers, args, source))
    print(f"\n{answers['services']} services x {answers['per_service']} pods (answers recorded "
          f"from Prometheus 2.42 with the chart's rules, replayed by a stub on 127.0.0.1), "
          f"{os.cpu_count()} CPUs, medians of {args.rounds} processes x {args.repeats} "
          "passes")  # fmt: skip
    rows = [(f"{name}: {what} [ms]", f"{kind}_{key}")
            for kind, name in (("full", "full pass"), ("fast", "fast pass"),
                               ("read", "read_services alone (HTTP + JSON + parse)"))
            for key, what in (("wall", "wall"), ("cpu", "CPU"),
                              ("gc", "of which in the garbage collector"))]  # fmt: skip
    labels = list(revisions)
    width = max(len(label) for label, _ in rows)
    print(f"{'':{width}}  " + "  ".join(f"{label:>22}" for label in labels))
    for label, key in rows:
        cells = [statistics.median(x for run in runs[r] for x in run["figures"][key]) * 1000
                 for r in labels]  # fmt: skip
        print(f"{label:{width}}  " + "  ".join(f"{cell:>22.0f}" for cell in cells))
    digests = {r: {run["digest"] for run in runs[r]} for r in labels}
    for r in labels:
        print(
            f"{r}: loop from {runs[r][0]['loop']}, status writes per process "
            f"{runs[r][0]['writes']}, decisions digest {sorted(digests[r])}"
        )
    same = len({d for ds in digests.values() for d in ds}) == 1
    print(f"decisions identical across revisions and processes: {same}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
