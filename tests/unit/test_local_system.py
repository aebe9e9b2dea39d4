"""The local system's pure parts: engine command lines, pod links, the pod view, Prometheus's
configuration and the guard's namespace networks. (e2e/ runs the whole system.)"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest

from llmfleet.core import loopback
from llmfleet.core.local import chart, engines, kubelet_targets, layout, podnet, podrunner


def config(role: str = "unified", **runtime: Any) -> dict[str, Any]:
    return {
        "role": role,
        "port": 8000,
        "model": {
            "name": "meta-llama/Llama-3.1-8B-Instruct",
            "servedName": "llama",
            "maxModelLen": 4096,
        },
        "runtime": runtime,
    }


def flags(argv: list[str]) -> dict[str, str]:
    return dict(arg.removeprefix("--").split("=", 1) for arg in argv[1:] if "=" in arg)


def test_engine_argv_follows_the_runtime_config() -> None:
    argv = engines.engine_argv("/sim", config(maxNumSeqs=7), {})
    got = flags(argv)
    assert argv[0] == "/sim"
    assert got["served-model-name"] == "llama"
    assert got["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert got["max-model-len"] == "4096"
    assert got["max-num-seqs"] == "7"
    assert got["port"] == "8000"
    assert "--enable-kvcache" in argv
    assert "--force-dummy-tokenizer" in argv


def test_engine_defaults_when_the_spec_leaves_them_unset() -> None:
    bare = {"role": "unified", "model": {"name": "m"}, "runtime": {}}
    got = flags(engines.engine_argv("/sim", bare, {}))
    assert got["max-num-seqs"] == str(engines.DEFAULT_MAX_NUM_SEQS)
    assert got["max-model-len"] == str(engines.DEFAULT_MAX_MODEL_LEN)
    assert got["served-model-name"] == "m"


@pytest.mark.parametrize(
    ("seqs", "model_len", "waiting"),
    [
        pytest.param(32, 32_768, 224, id="defaults: 256 slots of 32k tokens"),
        pytest.param(4, 32_768, 252, id="a small batch queues more"),
        pytest.param(32, 4_096, 2_016, id="a short context queues more"),
        pytest.param(32, 131_072, 32, id="a long context: one batch waits"),
        pytest.param(256, 32_768, 256, id="a large batch: one batch waits, the ring doubles"),
    ],
)
def test_the_waiting_queue_bounds_the_simulators_token_ring(
    seqs: int, model_len: int, waiting: int
) -> None:
    runtime = config(maxNumSeqs=seqs)
    runtime["model"]["maxModelLen"] = model_len
    got = flags(engines.engine_argv("/sim", runtime, {}))
    assert got["max-waiting-queue-length"] == str(waiting)
    ring = engines.TPOT_SLOT_BYTES * (seqs + waiting) * model_len
    assert ring <= max(engines.TPOT_RING_BYTES, engines.TPOT_SLOT_BYTES * 2 * seqs * model_len)


def test_roles_get_their_own_latency() -> None:
    by_role = {
        role: flags(engines.engine_argv("/sim", config(role), {})) for role in engines.ROLE_LATENCY
    }
    assert "kv-cache-transfer-time-per-token" in by_role["decode"]
    assert "kv-cache-transfer-time-per-token" not in by_role["prefill"]
    assert by_role["decode"]["inter-token-latency"] != by_role["prefill"]["inter-token-latency"]
    assert (
        by_role["prefill"]["prefill-time-per-token"] != by_role["decode"]["prefill-time-per-token"]
    )


def test_local_args_from_the_pod_env_come_last() -> None:
    env = {engines.LOCAL_ARGS_ENV: "--time-to-first-token=500ms --failure-injection-rate 10"}
    argv = engines.engine_argv("/sim", config(), env)
    assert argv[-3:] == ["--time-to-first-token=500ms", "--failure-injection-rate", "10"]


@pytest.mark.parametrize(
    ("bad", "env", "says"),
    [
        ({"role": "router", "model": {"name": "m"}}, {}, "role 'router'"),
        ({"role": "unified", "model": {}}, {}, "model.name"),
        (config(), {engines.LOCAL_ARGS_ENV: "--x 'unclosed"}, engines.LOCAL_ARGS_ENV),
    ],
)
def test_engine_config_errors_name_the_field(
    bad: dict[str, Any], env: dict[str, str], says: str
) -> None:
    with pytest.raises(engines.EngineConfigError, match=says):
        engines.engine_argv("/sim", bad, env)


def test_link_names_are_short_stable_and_distinct() -> None:
    names = {podnet.link_name(f"10.0.0.{i}") for i in range(1, 255)}
    assert len(names) == 254
    assert all(len(name) <= 15 and name.startswith(podnet.HOST_PREFIX) for name in names)
    assert podnet.link_name("10.0.0.7") == podnet.link_name("10.0.0.7")


def test_only_pod_network_addresses_get_links() -> None:
    assert podnet.in_pod_network("10.0.0.9")
    assert podnet.in_pod_network("10.0.39.17")  # the 10,000th pod of a large fleet
    assert not podnet.in_pod_network("10.1.0.9")
    assert not podnet.in_pod_network("127.0.0.1")
    assert not podnet.in_pod_network("not-an-ip")
    with pytest.raises(podnet.PodNetError, match="not in the pod network"):
        podnet.attach(1, "192.168.1.5")


def pod(
    phase: str = "Running", ip: str | None = "10.0.0.5", deleting: bool = False, ready: str = "True"
) -> NS:
    return NS(
        metadata=NS(
            uid="u1",
            namespace="default",
            name="chat-unified-abc",
            labels={podrunner.SERVICE_LABEL: "chat", podrunner.POOL_LABEL: "unified"},
            annotations={podrunner.CONFIG_HASH: "h1"},
            deletion_timestamp="now" if deleting else None,
        ),
        spec=NS(
            containers=[
                NS(
                    name="engine",
                    image="ghcr.io/llmfleet/runtime:0.1.0",
                    command=["llmfleet-runtime", "serve", "--config", "/etc/llmfleet/unified.json"],
                    args=None,
                    env=[
                        NS(name="A", value="1", value_from=None),
                        NS(name="POD_IP", value=None, value_from=NS()),
                    ],
                )
            ],
            volumes=[NS(name=podrunner.CONFIG_VOLUME, config_map=NS(name="chat-runtime"))],
        ),
        status=NS(phase=phase, pod_ip=ip, conditions=[NS(type="Ready", status=ready)]),
    )


def test_pod_view_reads_what_the_runner_needs() -> None:
    view = podrunner.pod_view(pod())
    assert view is not None
    assert (view.ip, view.service, view.pool, view.revision) == (
        "10.0.0.5",
        "chat",
        "unified",
        "h1",
    )
    assert (view.config_map, view.config_key, view.container) == (
        "chat-runtime",
        "unified.json",
        "engine",
    )
    assert view.env == {"A": "1"}
    assert view.ready is True


@pytest.mark.parametrize(
    "skipped",
    [pod(phase="Pending"), pod(ip=None), pod(ip="192.168.0.3"), pod(deleting=True)],
    ids=["pending", "no-ip", "ip-outside-pod-network", "deleting"],
)
def test_pods_without_an_engine(skipped: NS) -> None:
    assert podrunner.pod_view(skipped) is None


def test_prometheus_scrapes_engines_from_the_runner_file_and_the_components() -> None:
    paths = layout.Paths(Path("/state/system"))
    ports = layout.Ports(gateway=1, prometheus=2, api=3, operator=4, autoscaler=5)
    config = layout.prometheus_config(paths, ports)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["engines"]["file_sd_configs"][0]["files"] == [str(paths.engine_targets)]
    targets = {
        group["labels"]["component"]: group["targets"]
        for group in jobs["llmfleet"]["static_configs"]
    }
    assert targets == {
        "gateway": ["127.0.0.1:1"],
        "operator": ["127.0.0.1:4"],
        "autoscaler": ["127.0.0.1:5"],
    }
    assert set(ports.relayed()) == {"gateway", "prometheus", "api"}


def test_record_round_trips_and_unreadable_is_none(tmp_path: Path) -> None:
    record = layout.Record(12, "net:[4026]", layout.Ports(gateway=9), 1.5)
    record.write(tmp_path / "system.json")
    assert layout.Record.read(tmp_path / "system.json") == record
    (tmp_path / "bad.json").write_text("{not json")
    assert layout.Record.read(tmp_path / "bad.json") is None
    assert layout.Record.read(tmp_path / "missing.json") is None


def test_namespace_networks_widen_the_guard_only_where_set() -> None:
    pods = loopback.namespace_networks({loopback.NETWORKS_ENV: "10.0.0.0/24"})
    assert pods == (ipaddress.ip_network("10.0.0.0/24"),)
    assert loopback.namespace_networks({}) == ()
    guard = loopback.LoopbackGuard(True, also=pods)
    guard.check("10.0.0.7", 8000)
    with pytest.raises(loopback.NonLocalRefused):
        guard.check("10.0.1.7", 8000)
    with pytest.raises(loopback.NonLocalRefused):
        loopback.LoopbackGuard(True, also=()).check("10.0.0.7", 8000)
    with pytest.raises(ValueError, match=loopback.NETWORKS_ENV):
        loopback.namespace_networks({loopback.NETWORKS_ENV: "10.0.0.0/33"})


# -- with a real node (`llmfleet up --real-node`) ------------------------------------------------


@pytest.mark.parametrize(
    ("candidate", "kubelet_runs"),
    [
        (pod(ip="198.18.0.7"), True),
        (pod(ip="10.0.0.5"), False),  # on a fake node: the pod runner runs it
        (pod(ip="198.18.0.7", phase="Pending"), False),
        (pod(ip="198.18.0.7", deleting=True), False),
        (pod(ip=None), False),
    ],
    ids=["real-node", "fake-node", "pending", "deleting", "no-ip"],
)
def test_only_running_pods_on_the_real_nodes_bridge_are_the_kubelets(
    candidate: NS, kubelet_runs: bool
) -> None:
    assert kubelet_targets.on_real_node(candidate) is kubelet_runs
    # ...and the pod runner never starts an engine for a pod the kubelet runs.
    if kubelet_runs:
        assert podrunner.pod_view(candidate) is None


def test_the_real_nodes_engines_are_scraped_with_the_runners_labels() -> None:
    groups = kubelet_targets.engine_groups(
        [pod(ip="198.18.0.7"), pod(ip="10.0.0.5")], podrunner._target_labels
    )
    assert groups == [
        {
            "targets": ["198.18.0.7:8000"],
            "labels": {
                "namespace": "default",
                "pod": "chat-unified-abc",
                "llmfleet_dev_service": "chat",
                "llmfleet_dev_pool": "unified",
                "revision": "h1",
            },
        }
    ]


def test_component_pods_are_scraped_on_their_metrics_and_admin_ports() -> None:
    gateway = pod(ip="198.18.0.3")
    gateway.metadata.labels = {kubelet_targets.COMPONENT_LABEL: "gateway"}
    gateway.spec.containers[0].ports = [
        NS(name="http", container_port=8080),
        NS(name="admin", container_port=8090),
    ]
    assert kubelet_targets.component_groups([gateway]) == [
        {
            "targets": ["198.18.0.3:8090"],
            "labels": {"component": "gateway", "pod": "chat-unified-abc"},
        }
    ]


def test_prometheus_reads_the_component_pods_from_a_file_with_a_real_node() -> None:
    paths, ports = layout.Paths(Path("/state")), layout.Ports()
    config = layout.prometheus_config(paths, ports, real_node=True)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["llmfleet"]["file_sd_configs"][0]["files"] == [str(paths.component_targets)]
    assert jobs["engines"]["file_sd_configs"][0]["files"] == [str(paths.engine_targets)]


def test_the_chart_on_the_real_node_runs_the_built_images_and_is_never_pulled() -> None:
    values = chart.real_node_values(
        layout.Ports(prometheus=19090),
        {"control-plane": "ghcr.io/llmfleet/llmfleet:1.2.3", "engine-local": "e.local/engine:1"},
    )
    assert values["image"] == {
        "repository": "ghcr.io/llmfleet/llmfleet", "tag": "1.2.3", "pullPolicy": "Never",
    }  # fmt: skip
    operator = values["operator"]
    assert isinstance(operator, dict)
    assert operator["settings"]["runtimeImage"] == "e.local/engine:1"
    assert operator["prometheusUrl"] == "http://192.0.2.200:19090"
    assert values["loopbackOnly"] is False
    for name in chart.RESTRICTED_NAMESPACES:
        labels = chart.namespace(name)["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_chart_on_the_real_node_runs_fast_passes_within_a_scrape() -> None:
    """Issue 30: a warm spare is promoted within about one scrape plus one fast pass of the
    first queued request, so the fast pass runs, and at least once per scrape."""
    values = chart.real_node_values(
        layout.Ports(), {"control-plane": "c.local/cp:1", "engine-local": "e.local/engine:1"}
    )
    autoscaler = values["autoscaler"]
    assert isinstance(autoscaler, dict)
    settings = autoscaler["settings"]
    assert 0 < settings["fastIntervalSeconds"] < settings["intervalSeconds"]
    assert settings["fastIntervalSeconds"] <= layout.SCRAPE_SECONDS
