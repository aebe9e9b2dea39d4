"""The autoscaler at fleet scale, for bench/control_plane_scale.py (issue 28).

`figures` turns autoscaling on for every benchmark service, bounded so that its decisions leave
the pod counts as they are (`minReplicas` = `maxReplicas` = the pods per service, no warm
spares), and runs, against the benchmark's cluster:
- one stand-in exporter (`_fleet_metrics.py`) serving vLLM-style series for every pod of the
  namespace (kwok pods answer nothing), labelled as the autoscaler's query reads them;
- a Prometheus (the cached 2.42 of `llmfleet up`) scraping that one target every 15 s with
  `honor_labels: true`, and holding the series;
- `llmfleet autoscaler` of this checkout for real (it writes `status.autoscaling`), with its
  production cadence: a full pass every 15 s, a fast pass every 2 s.

Over a window (the benchmark's idle window, at least 60 s) after its first full pass it reports:
- each pass's duration, p50 / p99 / max by kind (full, fast), from its own
  `llmfleet_autoscaler_pass_seconds` read every `POLL_SECONDS`: a pass's duration is the
  histogram's `_sum` step when its `_count` steps by one; the full passes also split into those
  that wrote status and those that did not (`durations`);
- Prometheus queries per pass: Prometheus' own `prometheus_http_requests_total` of
  `/api/v1/query` over the passes counted (the benchmark asks nothing during the window);
- its errors by stage (a pass whose query failed is short, and counted here), its status
  writes (the line it logs for each; a full pass rewrites an unchanged decision once
  `status_refresh_seconds`, 60 s, have passed, one PATCH per service in sequence), CPU and peak
  RSS, and Prometheus' head series and peak RSS;
then the autoscaler is restarted and timed from its process start until its first full pass
is done. For both starts, its own `llmfleet_autoscaler_start_seconds` splits that time: /metrics
served, the watches' first LISTs in memory, the first full pass done (the first start's pass
writes every service's status: 1,000 PATCHes at 1,000 services).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import yaml
from _gateways import cpu_seconds, p50_p99_ms, peak_rss_mib, stop_process
from _support import free_port
from operator_scale import kubectl

from llmfleet.core.cluster import build
from llmfleet.crds import labels as L

SCRAPE_SECONDS = 15
POLL_SECONDS = 0.25
PASS = "llmfleet_autoscaler_pass_seconds"
BENCH = Path(__file__).resolve().parent


def _get(url: str, timeout: float = 10) -> str:
    """The body at `url`; "" while nothing answers there."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return str(response.read().decode())
    except (urllib.error.URLError, OSError):
        return ""


def _samples(text: str, name: str) -> dict[str, float]:
    """Label text -> value of each sample `name` in an exposition (labels as exposed)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, value = line.rsplit(" ", 1)
            found[key[len(name) :]] = float(value)
    return found


def _wait(what: str, done: Any, timeout: float, every: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)


def autoscaled(count: int, replicas: int) -> str:
    """Autoscaling on for services svc-0000.. (a server-side apply of these fields only),
    bounded to `replicas` serving pods and no spares."""
    unified = {"replicas": replicas, "minReplicas": replicas, "maxReplicas": replicas}
    spec = {"autoscaling": {"enabled": True, "warmSpares": 0}, "topology": {"unified": unified}}
    return yaml.safe_dump_all(
        {
            "apiVersion": "llmfleet.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": f"svc-{i:04d}"},
            "spec": spec,
        }
        for i in range(count)
    )


def fleet_pods(kubeconfig: Path, namespace: str) -> list[dict[str, str]]:
    """The namespace's engine pods with an IP, as `_fleet_metrics.read_pods` takes them."""
    listed = json.loads(kubectl(kubeconfig, "get", "pods", "-n", namespace, "-l", L.SERVICE,
                                "-o", "json"))  # fmt: skip
    return [
        {"namespace": namespace, "pod": pod["metadata"]["name"],
         "service": pod["metadata"]["labels"][L.SERVICE],
         "pool": pod["metadata"]["labels"].get(L.POOL, ""), "ip": pod["status"]["podIP"]}
        for pod in listed["items"]
        if (pod.get("status") or {}).get("podIP")
    ]  # fmt: skip


CHART_RULES = BENCH.parent / "charts" / "llmfleet" / "files" / "rules"


class Prometheus:
    """Prometheus 2.42 on a free 127.0.0.1 port, scraping the exporter at `target`; with
    `chart_rules`, evaluating the chart's rule files (`charts/llmfleet/files/rules/`: its
    recording rules, which the autoscaler's full pass reads when they are there, and alerts)."""

    def __init__(self, target: str, workdir: Path, *, chart_rules: bool = False) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        interval = f"{SCRAPE_SECONDS}s"
        config = {
            "global": {"scrape_interval": interval, "scrape_timeout": interval,
                       "evaluation_interval": interval},
            "scrape_configs": [{"job_name": "engines", "honor_labels": True,
                                "static_configs": [{"targets": [target]}]}],
        }  # fmt: skip
        if chart_rules:
            config["rule_files"] = [str(path) for path in sorted(CHART_RULES.glob("*.yaml"))]
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        command = [str(build.ensure_binary("prometheus")),
                   f"--config.file={workdir / 'prometheus.yml'}",
                   f"--storage.tsdb.path={workdir / 'data'}",
                   f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"]  # fmt: skip
        with (workdir / "prometheus.log").open("w") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        _wait("Prometheus ready", lambda: _get(f"{self.url}/-/ready", 2) != "", 120)

    def value(self, promql: str) -> float:
        """The first sample of an instant query; 0 when there is none."""
        body = _get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}), 60)
        result = json.loads(body)["data"]["result"] if body else []
        return float(result[0]["value"][1]) if result else 0.0

    def head_series(self) -> float:
        found = _samples(_get(f"{self.url}/metrics"), "prometheus_tsdb_head_series")
        return sum(found.values())

    def rule_groups(self) -> dict[str, tuple[float, float, float]]:
        """Rule group name -> (seconds its last evaluation took, its interval, evaluations
        missed because the one before was still running), from Prometheus' own metrics."""
        text = _get(f"{self.url}/metrics")

        def by_group(name: str) -> dict[str, float]:
            return {labels.split(";")[-1].rstrip('"}'): value
                    for labels, value in _samples(text, name).items()}  # fmt: skip

        last = by_group("prometheus_rule_group_last_duration_seconds")
        interval = by_group("prometheus_rule_group_interval_seconds")
        missed = by_group("prometheus_rule_group_iterations_missed_total")
        return {group: (last[group], interval.get(group, 0.0), missed.get(group, 0.0))
                for group in last}  # fmt: skip

    def queries(self) -> float:
        """Instant queries Prometheus has answered (its own counter)."""
        found = _samples(_get(f"{self.url}/metrics"), "prometheus_http_requests_total")
        return sum(v for labels, v in found.items() if 'handler="/api/v1/query"' in labels)


class Autoscaler:
    """`llmfleet autoscaler` of this checkout on the namespace, its /metrics on a free port."""

    def __init__(self, kubeconfig: Path, namespace: str, prometheus: str, log: Path) -> None:
        self.port = free_port()
        self.log = log
        command = [str(Path(sys.executable).parent / "llmfleet"), "autoscaler",
                   "--kubeconfig", str(kubeconfig), "--namespace", namespace,
                   "--prometheus-url", prometheus]  # fmt: skip
        env = {**os.environ, "LLMFLEET_LOOPBACK_ONLY": "true",
               "LLMFLEET_AUTOSCALER_METRICS_PORT": str(self.port),
               "LLMFLEET_AUTOSCALER_METRICS_HOST": "127.0.0.1"}  # fmt: skip
        self.started = time.monotonic()
        with log.open("w") as out:
            self.process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.ps = psutil.Process(self.process.pid)

    def passes(self) -> dict[str, tuple[float, float]]:
        """Pass kind (full, fast) -> (passes done, seconds spent in them)."""
        text = _get(f"http://127.0.0.1:{self.port}/metrics", 5)
        counts, sums = _samples(text, f"{PASS}_count"), _samples(text, f"{PASS}_sum")
        return {kind: (counts.get(f'{{pass="{kind}"}}', 0.0), sums.get(f'{{pass="{kind}"}}', 0.0))
                for kind in ("full", "fast")}  # fmt: skip

    def errors(self) -> dict[str, float]:
        text = _get(f"http://127.0.0.1:{self.port}/metrics", 5)
        found = _samples(text, "llmfleet_autoscaler_errors_total")
        return {labels.split('"')[1]: value for labels, value in found.items()}

    def writes(self) -> int:
        """Status writes so far: the lines it logs for each (`cli._log_pass`)."""
        return len(re.findall(r"^\S+ \S+ INFO llmfleet\.autoscaler \S+/\S+: ",
                              self.log.read_text(), re.MULTILINE))  # fmt: skip

    def source(self) -> str:
        """What its full passes read, as its log said last ("recorded" or "raw: why"); "-"
        when it said nothing yet."""
        said = "-"
        for line in self.log.read_text().splitlines():
            if "full passes read the recorded series" in line:
                said = "recorded"
            elif "full passes read the engines' raw series: " in line:
                said = "raw: " + line.split("raw series: ", 1)[1][:80]
        return said

    def first_pass(self, timeout: float = 600) -> float:
        """Seconds from its process start until its first full pass was done."""

        def done() -> bool:
            if self.process.poll() is not None:
                raise SystemExit(f"the autoscaler exited ({self.log}):\n{self.log.read_text()}")
            return self.passes()["full"][0] >= 1

        _wait("the autoscaler's first pass", done, timeout, every=0.1)
        return time.monotonic() - self.started

    def start_steps(self) -> str:
        """Seconds from its process's start to serving / listed / first pass
        (`llmfleet_autoscaler_start_seconds`; "-" for a step it has not reached or does not
        report)."""
        text = _get(f"http://127.0.0.1:{self.port}/metrics", 5)
        found = dict(re.findall(r'^llmfleet_autoscaler_start_seconds\{step="(\w+)"\} (\S+)$',
                                text, re.MULTILINE))  # fmt: skip
        return " / ".join(f"{float(found[step]):.1f}" if step in found else "-"
                          for step in ("serving", "listed", "first_pass"))  # fmt: skip


def durations(autoscaler: Autoscaler, seconds: float) -> dict[str, list[float]]:
    """Each pass's duration over `seconds`, by kind: "full", "fast", and the full passes split
    into "writing" (status writes logged between the poll before it ended and the poll after:
    it logs them just after the pass) and "quiet". A poll that finds several passes of a kind
    done since the last counts their mean once each. Fast passes write nothing here (their
    decisions only scale up, and the bounds allow none)."""
    found: dict[str, list[float]] = {"full": [], "fast": [], "writing": [], "quiet": []}
    last, writes = autoscaler.passes(), autoscaler.writes()
    ended: list[tuple[float, int]] = []
    """Full passes seen done at the last poll, with the writes logged at the poll before."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(POLL_SECONDS)
        now, written = autoscaler.passes(), autoscaler.writes()
        for taken, before in ended:
            found["writing" if written > before else "quiet"].append(taken)
        ended = []
        for kind, (count, total) in now.items():
            done = int(count - last[kind][0])
            if done > 0:
                found[kind] += [(total - last[kind][1]) / done] * done
                if kind == "full":
                    ended += [((total - last[kind][1]) / done, writes)] * done
        last, writes = now, written
    return found


def summary_ms(values: list[float]) -> str:
    """ "p50 / p99 / max (n)" in milliseconds (p99 is the largest below 100 values)."""
    if not values:
        return "- (0 passes)"
    return f"{p50_p99_ms(values)} / {max(values) * 1000:.0f} ({len(values)})"


def figures(kubeconfig: Path, namespace: str, args: argparse.Namespace,
            workdir: Path) -> list[tuple[str, str]]:  # fmt: skip
    """(figure, value) rows of the autoscaler over its window (the benchmark's idle window, at
    least 60 s: four full passes) and after its restart."""
    services, pods_per_service = args.services, args.pods_per_service
    window = max(args.idle_seconds, 60.0)
    workdir.mkdir(parents=True, exist_ok=True)
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts",
            "--field-manager=bench-autoscaling", "-n", namespace, "-f", "-",
            stdin=autoscaled(services, pods_per_service))  # fmt: skip
    pods = fleet_pods(kubeconfig, namespace)
    (workdir / "pods.json").write_text(json.dumps(pods))
    port = free_port()
    exporter = subprocess.Popen([sys.executable, str(BENCH / "_fleet_metrics.py"), "--pods",
                                 str(workdir / "pods.json"), "--port", str(port)])  # fmt: skip
    processes: list[subprocess.Popen[bytes]] = [exporter]
    rows: list[tuple[str, str]] = []
    try:
        # With the chart's recording rules, as the chart installs them: the full pass reads
        # the recorded per-pool series once their group has been evaluated.
        prometheus = Prometheus(f"127.0.0.1:{port}", workdir / "prometheus", chart_rules=True)
        processes.append(prometheus.process)
        print(f"Prometheus scraping {len(pods)} pods' stand-in series ...", flush=True)
        # Two scrapes, so every rate the autoscaler asks for has samples; then the pool rules
        # evaluated over them, so the autoscaler's first look at the rules finds them healthy.
        _wait("two scrapes of every pod", lambda: prometheus.value(
            "count(rate(vllm:request_success_total[1m]) > 0)") >= len(pods),
            timeout=SCRAPE_SECONDS * 8, every=2)  # fmt: skip
        _wait("the pool rules evaluated", lambda: prometheus.value(
            "count(llmfleet_pool:requests:rate1m > 0)") >= services,
            timeout=SCRAPE_SECONDS * 8, every=2)  # fmt: skip
        autoscaler = Autoscaler(kubeconfig, namespace, prometheus.url, workdir / "autoscaler.log")
        processes.append(autoscaler.process)
        rows.append(("autoscaler: started until its first pass done [s]",
                     f"{autoscaler.first_pass():.1f}"))  # fmt: skip
        rows.append(("autoscaler: serving / listed / first pass [s]", autoscaler.start_steps()))
        print(f"the autoscaler's passes over {window:.0f} s ...", flush=True)
        prometheus_cpu = cpu_seconds(psutil.Process(prometheus.process.pid))
        cpu, queries, before = cpu_seconds(autoscaler.ps), prometheus.queries(), autoscaler.passes()
        errors, writes = autoscaler.errors(), autoscaler.writes()
        taken = durations(autoscaler, window)
        writes = autoscaler.writes() - writes
        passes = sum(autoscaler.passes()[k][0] - before[k][0] for k in before)
        asked = prometheus.queries() - queries
        failed = {k: v - errors.get(k, 0.0) for k, v in autoscaler.errors().items()}
        rows += [
            ("autoscaler: full pass p50 / p99 / max [ms] (passes)", summary_ms(taken["full"])),
            ("  of which with status writes", summary_ms(taken["writing"])),
            ("  of which without", summary_ms(taken["quiet"])),
            ("autoscaler: fast pass p50 / p99 / max [ms] (passes)", summary_ms(taken["fast"])),
            ("autoscaler: Prometheus queries per pass",
             f"{asked / passes:.2f} ({asked:.0f} / {passes:.0f})" if passes else "-"),
            ("autoscaler: errors over the window (by stage)",
             ", ".join(f"{k} {v:.0f}" for k, v in sorted(failed.items()) if v) or "none"),
            ("autoscaler: status writes over the window", f"{writes}"),
            (f"autoscaler: CPU over {window:.0f} s [s]",
             f"{cpu_seconds(autoscaler.ps) - cpu:.1f}"),
            ("autoscaler: peak RSS [MiB]", f"{peak_rss_mib(autoscaler.process.pid):.0f}"),
            ("autoscaler: what the full passes read (its log)", autoscaler.source()),
            (f"Prometheus: CPU over {window:.0f} s [s] (rules, queries, scrapes)",
             f"{cpu_seconds(psutil.Process(prometheus.process.pid)) - prometheus_cpu:.1f}"),
            ("Prometheus: pool rules evaluation [s] (every [s], missed)",
             "{:.2f} ({:g}, {:.0f})".format(*prometheus.rule_groups().get(
                 "llmfleet.pools", (0.0, 0.0, 0.0)))),
            ("Prometheus: head series / peak RSS [MiB]",
             f"{prometheus.head_series():.0f} / {peak_rss_mib(prometheus.process.pid):.0f}"),
            ("stand-in exporter: CPU [s] / peak RSS [MiB]",
             f"{cpu_seconds(psutil.Process(exporter.pid)):.1f} / "
             f"{peak_rss_mib(exporter.pid):.0f}"),
        ]  # fmt: skip
        stop_process(autoscaler.process)
        again = Autoscaler(kubeconfig, namespace, prometheus.url, workdir / "autoscaler-2.log")
        processes.append(again.process)
        rows.append(("autoscaler restarted: until its first pass done [s]",
                     f"{again.first_pass():.1f}"))  # fmt: skip
        rows.append(("autoscaler restarted: serving / listed / first pass [s]",
                     again.start_steps()))  # fmt: skip
        return rows
    finally:
        for process in reversed(processes):
            if process.poll() is None:
                stop_process(process)
