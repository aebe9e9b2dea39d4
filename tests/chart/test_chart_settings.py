"""The chart's environment against the components' settings classes.

Every variable the chart sets is a field of that component's settings class (read back through
the class itself, so a value the class would refuse fails here too), every field can be set
from values, and values.schema.json's `settings` maps are exactly the classes' fields.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from pydantic import ValidationError
from pydantic_settings import BaseSettings

from tests.chart import helm
from tests.chart.settings_schema import COMPONENTS, SCHEMA_FILE, camel, env_name, expected_schema

TYPED: dict[str, dict[str, tuple[str, Any]]] = {
    "operator": {
        "namespaces": ("watchNamespaces", ["models-a", "models-b"]),
        "metrics_port": ("operator.metricsPort", 9181),
        "gateway_url": ("operator.gatewayUrl", "https://llm.example.com"),
        "prometheus_url": ("operator.prometheusUrl", "http://prometheus.example:9090"),
        "loopback_only": ("loopbackOnly", True),
        "operator_namespace": ("operator.enabled", True),
        "operator_pod_labels": ("operator.enabled", True),
        "service_monitor_labels": ("monitoring.serviceMonitors.labels", {"release": "kps"}),
    },
    "autoscaler": {
        "namespaces": ("watchNamespaces", ["models-a"]),
        "metrics_port": ("autoscaler.metricsPort", 9182),
        "prometheus_url": ("autoscaler.prometheusUrl", "http://prometheus.example:9090"),
        "loopback_only": ("loopbackOnly", True),
        "leader_election": ("autoscaler.leaderElection", True),
        "lease_name": ("autoscaler.leaderElection", True),
        "lease_namespace": ("autoscaler.leaderElection", True),
    },
    "gateway": {
        "namespace": ("watchNamespaces", ["models-a"]),
        "port": ("gateway.port", 9180),
        "api_keys_secret": ("gateway.apiKeys.existingSecret", "my-keys"),
        "loopback_only": ("loopbackOnly", True),
        "require_api_keys": ("gateway.auth", "apiKeys"),
        "limit_replicas": ("gateway.replicas", 3),
        "shutdown_timeout_seconds": ("gateway.shutdownTimeoutSeconds", 300),
    },
}
"""Fields the chart always sets from a typed value: field -> (values path, a value to set)."""
TYPED_READ_BACK = {
    ("gateway", "namespace"): "models-a",
    ("gateway", "api_keys_secret"): "serving/my-keys",
    ("gateway", "require_api_keys"): True,
    ("autoscaler", "lease_name"): "t-llmfleet-autoscaler",
    ("autoscaler", "lease_namespace"): "serving",
    ("operator", "operator_namespace"): "serving",
    ("operator", "operator_pod_labels"): {
        "app.kubernetes.io/name": "llmfleet",
        "app.kubernetes.io/instance": "t",
        "app.kubernetes.io/component": "operator",
    },
}
"""What those fields read back as where it is not the value itself."""


Load = Callable[[type[BaseSettings], Mapping[str, str]], Any]


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch) -> Load:
    """Builds a settings object from exactly the given variables (the test's own LLMFLEET_*
    variables, such as LLMFLEET_LOOPBACK_ONLY from `llmfleet isolated`, are cleared)."""
    for name in list(os.environ):
        if name.startswith("LLMFLEET_"):
            monkeypatch.delenv(name)

    def load(settings: type[BaseSettings], env: Mapping[str, str]) -> BaseSettings:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        try:
            return settings()
        finally:
            for name in env:
                monkeypatch.delenv(name)

    return load


def field_of(settings: type[BaseSettings], variable: str) -> str | None:
    names = {env_name(settings, field): field for field in settings.model_fields}
    return names.get(variable)


def sample(settings: type[BaseSettings], field: str) -> Any:
    """A value of `field` other than its default that the class accepts (JSON-like)."""
    info = settings.model_fields[field]
    default = info.get_default(call_default_factory=True)
    schema = settings.model_json_schema(by_alias=False)["properties"][field]
    kinds = {option.get("type") for option in schema.get("anyOf", [schema])}
    if "enum" in schema:
        candidates: list[Any] = [value for value in schema["enum"] if value != default]
    elif "boolean" in kinds:
        candidates = [not default]
    elif "array" in kinds:
        candidates = [["models-a", "models-b"]]
    elif "object" in kinds:
        candidates = [{"sample": {"scorers": {"queue-depth": 1.0}}}, {"example.com/role": "x"}]
    elif "integer" in kinds or "number" in kinds:
        base = default if isinstance(default, int | float) and not isinstance(default, bool) else 3
        candidates = [base * 2, base + 1, base / 2, 0.75, 7]
        if "integer" in kinds:
            candidates = [int(value) for value in candidates if float(value).is_integer()]
    else:
        candidates = ["/etc/llmfleet/sample" if "path" in json.dumps(schema) else "sample-value"]
    for candidate in candidates:
        try:
            settings.model_validate({field: candidate})
        except ValidationError:
            continue
        if candidate != default:
            return candidate
    raise AssertionError(f"no sample value for {settings.__name__}.{field}: extend sample()")


def read_back(value: Any) -> Any:
    """A field's parsed value in the form it was given in values."""
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, dict):
        return {key: read_back(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [read_back(item) for item in value]
    return str(value) if type(value).__name__.endswith("Path") else value


def only(component: str) -> dict[str, Any]:
    """Values that render only `component` (its conditional typed values left off)."""
    return {f"{name}.enabled": name == component for name in helm.COMPONENTS}


@pytest.mark.parametrize("component", helm.COMPONENTS)
def test_every_settings_field_is_reachable_from_values(component: str, environ: Load) -> None:
    settings = COMPONENTS[component]
    typed = TYPED[component]
    free = {field: sample(settings, field) for field in settings.model_fields if field not in typed}
    values = {
        **only(component),
        f"{component}.settings": {camel(field): value for field, value in free.items()},
        **{path: value for path, value in typed.values()},
    }
    # A release namespace other than any default, so that a field set from it shows.
    env = helm.container_env(helm.template(values, namespace="serving"), component)
    loaded = environ(settings, env)
    given = {
        field: TYPED_READ_BACK.get((component, field), value) for field, (_, value) in typed.items()
    }
    expected = settings.model_validate(free | given)  # no environment: only these values
    for field in settings.model_fields:
        assert env_name(settings, field) in env, f"{field} is not set from values"
        assert read_back(getattr(loaded, field)) == read_back(getattr(expected, field)), field
        assert getattr(loaded, field) != settings.model_fields[field].get_default(
            call_default_factory=True
        ), f"{field} kept its default"


@pytest.mark.parametrize("values_file", [None, helm.VALUES_FULL], ids=["defaults", "values-full"])
@pytest.mark.parametrize("component", helm.COMPONENTS)
def test_every_variable_the_chart_sets_is_a_settings_field(
    component: str, values_file: Any, environ: Load
) -> None:
    docs = helm.template(files=[values_file] if values_file else [])
    env = helm.container_env(docs, component)
    settings = COMPONENTS[component]
    strangers = [name for name in env if field_of(settings, name) is None]
    assert not strangers, f"{component} sets variables its {settings.__name__} does not read"
    environ(settings, env)  # every value parses


def test_a_field_left_null_stays_at_its_default(environ: Load) -> None:
    values = {**only("operator"), "operator.settings": {"metricsHost": None, "drainSeconds": 9}}
    env = helm.container_env(helm.template(values), "operator")
    assert "LLMFLEET_OPERATOR_METRICS_HOST" not in env
    assert env["LLMFLEET_OPERATOR_DRAIN_SECONDS"] == "9"


REFUSED = [
    ("unknown-key", {"operator.settings": {"drainSecond": 3}},
     "additional properties 'drainSecond'"),
    ("wrong-type", {"operator.settings": {"drainSeconds": "soon"}}, "want integer"),
    ("out-of-bounds", {"operator.settings": {"drainSeconds": -1}}, "minimum"),
    ("not-in-enum", {"gateway.settings": {"upstreamClient": "curl"}}, "upstreamClient"),
    ("typed-operator-port", {"operator.settings": {"metricsPort": 1}},
     "operator.settings.metricsPort: the chart sets this one; use operator.metricsPort"),
    ("typed-namespaces", {"operator.settings": {"namespaces": ["a"]}}, "use watchNamespaces"),
    ("typed-prometheus", {"operator.settings": {"prometheusUrl": "x"}},
     "use operator.prometheusUrl"),
    ("typed-keys", {"gateway.settings": {"apiKeysSecret": "a/b"}}, "use gateway.apiKeys"),
    ("typed-loopback", {"autoscaler.settings": {"loopbackOnly": True}}, "use loopbackOnly"),
    ("computed-gateway-namespace", {"operator.settings": {"gatewayNamespace": "x"}},
     "the release namespace (gateway.enabled)"),
    ("typed-profiles",
     {"autoscaler.profilesConfigMap": "p", "autoscaler.settings": {"profilesDir": "/p"}},
     "use autoscaler.profilesConfigMap"),
]  # fmt: skip
"""Settings the chart refuses: id, values, what helm's error says."""


@pytest.mark.parametrize(("values", "message"), [pytest.param(v, m, id=i) for i, v, m in REFUSED])
def test_bad_settings_are_refused_with_the_key(values: dict[str, Any], message: str) -> None:
    assert message in helm.template_error(values)


def test_the_schema_lists_exactly_the_settings_fields() -> None:
    committed = json.loads(SCHEMA_FILE.read_text())
    assert committed == expected_schema(committed), (
        "values.schema.json's settings maps differ from the settings classes: run "
        "`.venv/bin/python -m tests.chart.settings_schema` and commit the result"
    )


def test_the_operator_admits_exactly_this_releases_gateway_pods(environ: Load) -> None:
    """The NetworkPolicy contract: the operator's gateway labels and namespace are the gateway
    pods' own."""
    docs = helm.template(release="edge", namespace="serving")
    env = helm.container_env(docs, "operator")
    settings: Any = environ(COMPONENTS["operator"], env)
    gateway = helm.deployment(docs, "gateway")
    pod_labels = gateway["spec"]["template"]["metadata"]["labels"]
    assert settings.gateway_namespace == gateway["metadata"]["namespace"] == "serving"
    assert settings.gateway_pod_labels == gateway["spec"]["selector"]["matchLabels"]
    assert settings.gateway_pod_labels.items() <= pod_labels.items()
    assert settings.gateway_pod_labels == {
        "app.kubernetes.io/name": "llmfleet",
        "app.kubernetes.io/instance": "edge",
        "app.kubernetes.io/component": "gateway",
    }


def test_capacity_profiles_are_mounted_where_the_autoscaler_reads_them(environ: Load) -> None:
    docs = helm.template({"autoscaler.profilesConfigMap": "capacity-profiles"})
    pod = helm.deployment(docs, "autoscaler")["spec"]["template"]["spec"]
    settings: Any = environ(COMPONENTS["autoscaler"], helm.container_env(docs, "autoscaler"))
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert str(settings.profiles_dir) == mounts["profiles"]["mountPath"]
    assert mounts["profiles"]["readOnly"] is True
    assert volumes["profiles"]["configMap"]["name"] == "capacity-profiles"


@pytest.mark.parametrize(
    ("values", "url"),
    [({}, "http://prometheus-operated.monitoring.svc:9090"),
     ({"autoscaler.prometheusUrl": "http://a:9090"}, "http://a:9090"),
     ({"operator.prometheusUrl": "http://o:9090"}, "http://o:9090")],
    ids=["default", "the-autoscalers", "its-own"],
)  # fmt: skip
def test_canary_analysis_asks_the_autoscalers_prometheus_unless_told(
    values: dict[str, Any], url: str
) -> None:
    env = helm.container_env(helm.template(values), "operator")
    assert env["LLMFLEET_OPERATOR_PROMETHEUS_URL"] == url
