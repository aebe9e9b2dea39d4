"""Where the gateway learns which models exist and which engines serve them.

A discovery source keeps a snapshot `{served model name: Service}` current. The static source
reads a YAML file once; a Kubernetes source (watching InferenceServices and the EndpointSlices
of their pool Services, so only serving pods appear) implements the same
`Discovery` protocol and plugs in beside it without touching routing or the proxy.

Static file format::

    models:
      llama-8b:                         # the `model` clients send
        unified: [http://10.0.0.1:8000, http://10.0.0.2:8000]
        limits: {maxTokens: 1024, timeoutSeconds: 120}    # optional, like spec.traffic.limits
      llama-70b:
        namespace: prod                 # optional metric labels (default: "static", the model)
        service: llama-70b
        prefill: [http://10.0.1.1:8000]
        decode: [http://10.0.1.2:8000, http://10.0.1.3:8000]
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import yaml
from pydantic import BaseModel, ConfigDict, Field, HttpUrl, ValidationError, model_validator

from llmfleet.core.problems import problems, yaml_problem
from llmfleet.crds.policy import LimitsSpec, TrafficSpec
from llmfleet.crds.spec import SloSpec

Role = Literal["unified", "prefill", "decode"]


@dataclass(frozen=True)
class Pool:
    """The serving endpoints of one pool (base URLs without a trailing slash)."""

    role: Role
    endpoints: tuple[str, ...]


@dataclass(frozen=True)
class Service:
    """One served model: its pools (unified, or prefill + decode), its traffic policies
    (`spec.traffic` of the InferenceService, the same model) and its SLO."""

    model: str
    namespace: str
    name: str
    pools: Mapping[Role, Pool]
    traffic: TrafficSpec = field(default_factory=TrafficSpec)
    slo: SloSpec = field(default_factory=SloSpec)
    max_model_len: int | None = None
    """The engines' context length (`spec.model.maxModelLen`); output limits above it are
    capped to it. None: unknown (capped to the API's largest context)."""
    revision: str = ""
    """The revision of the engines behind `pools` (`status.revision`, or the canary's); the
    response header `x-llmfleet-revision` and every pool metric carry it."""
    canary: Split | None = None
    """A canary rollout in progress: the share of sessions that go to the canary's pools."""

    @property
    def disaggregated(self) -> bool:
        return "prefill" in self.pools or "decode" in self.pools

    @property
    def limits(self) -> LimitsSpec:
        return self.traffic.limits

    @property
    def serving_pool(self) -> Role:
        """The pool whose engines produce the answer (and whose load says "saturated")."""
        return "decode" if self.disaggregated else "unified"


@dataclass(frozen=True)
class Split:
    """A canary of a service: its own pools and revision, and the percent of sessions it gets.

    A session's bucket is a CRC-32 of its key seeded by the canary's revision, out of 10,000:
    the same session always lands on the same side while the rollout lasts (a session in the
    canary at 10% stays there at 25%, as its bucket stays below the weight), different
    rollouts draw different sessions, and it is the same number in every gateway replica."""

    service: Service
    """The canary: the same model and policies, the canary's pools and revision."""
    weight: int
    """Percent of sessions routed to the canary (0-100)."""
    seed: int = 0
    """CRC-32 of the canary's revision, the start value of each session's checksum."""

    @classmethod
    def of(cls, service: Service, weight: int) -> Split:
        return cls(service, max(0, min(100, weight)), zlib.crc32(service.revision.encode()))

    def takes(self, session: str) -> bool:
        """Whether `session` goes to the canary (its bucket is below the weight)."""
        return zlib.crc32(session.encode(), self.seed) % 10_000 < self.weight * 100


def for_session(service: Service, session: str) -> Service:
    """The revision that serves `session`: the canary for its share of sessions, else the
    stable one. A side without an endpoint in its serving pool gives way to the other (the
    canary's pods are still starting, or drained at a rollback before the weight said 0)."""
    split = service.canary
    if split is None or split.weight == 0:
        return service
    canary = split.service
    chosen, other = (canary, service) if split.takes(session) else (service, canary)
    return chosen if _serves(chosen) or not _serves(other) else other


def _serves(service: Service) -> bool:
    pool = service.pools.get(service.serving_pool)
    return pool is not None and bool(pool.endpoints)


def index_by_name(services: Mapping[str, Service]) -> dict[tuple[str, str], Service]:
    """(namespace, InferenceService name) -> Service: how cascade tiers and degradation name
    the services they send to."""
    return {(s.namespace, s.name): s for s in services.values()}


class Discovery(Protocol):
    """A source of services; `services()` is read on every request, so it must be cheap."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def services(self) -> Mapping[str, Service]: ...

    def by_name(self, namespace: str, name: str) -> Service | None:
        """The service an InferenceService `namespace/name` describes (a cheap read too)."""
        ...

    def ready(self) -> bool:
        """True once the first complete snapshot is in (readiness of the gateway)."""
        ...


class StaticConfigError(ValueError):
    """The static configuration file is missing or malformed: one line per problem, each
    naming the file and the key path."""


class _ServiceModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    namespace: str = "static"
    service: str | None = None
    unified: list[HttpUrl] | None = None
    prefill: list[HttpUrl] | None = None
    decode: list[HttpUrl] | None = None
    traffic: TrafficSpec = Field(default_factory=TrafficSpec)
    slo: SloSpec = Field(default_factory=SloSpec)
    max_model_len: int | None = Field(default=None, alias="maxModelLen", ge=16)

    @model_validator(mode="after")
    def _one_topology(self) -> _ServiceModel:
        if self.unified is not None and (self.prefill is not None or self.decode is not None):
            raise ValueError("a model has either `unified` or `prefill`/`decode` pools, not both")
        if self.unified is None and self.prefill is None and self.decode is None:
            raise ValueError("a model needs `unified` or `prefill` and `decode` endpoints")
        return self


class _StaticFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    models: dict[str, _ServiceModel]


def parse_static_config(text: str, source: str = "static config") -> dict[str, Service]:
    """The services a static YAML document describes; StaticConfigError when it is invalid,
    with one line per problem: `SOURCE: KEY.PATH: what is wrong` (`source`: the file's name)."""
    try:
        parsed = _StaticFile.model_validate(yaml.safe_load(text))
    except yaml.YAMLError as error:
        raise StaticConfigError(f"{source}: {yaml_problem(error)}") from error
    except ValidationError as error:
        lines = problems(error)
        raise StaticConfigError("\n".join(f"{source}: {line}" for line in lines)) from error
    services: dict[str, Service] = {}
    for model, spec in parsed.models.items():
        pools: dict[Role, Pool] = {}
        for role in ("unified", "prefill", "decode"):
            urls = getattr(spec, role)
            if urls is not None:
                pools[role] = Pool(role, tuple(str(url).rstrip("/") for url in urls))
        services[model] = Service(
            model=model,
            namespace=spec.namespace,
            name=spec.service or model,
            pools=pools,
            traffic=spec.traffic,
            slo=spec.slo,
            max_model_len=spec.max_model_len,
        )
    return services


class StaticDiscovery:
    """Services read from a YAML file (or given directly, as tests and benchmarks do)."""

    def __init__(self, services: Mapping[str, Service]) -> None:
        self._services = dict(services)
        self._by_name = index_by_name(self._services)

    @classmethod
    def from_file(cls, path: Path) -> StaticDiscovery:
        try:
            text = path.read_text()
        except OSError as error:
            raise StaticConfigError(f"cannot read static config {path}: {error}") from error
        return cls(parse_static_config(text, str(path)))

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def services(self) -> Mapping[str, Service]:
        return self._services

    def by_name(self, namespace: str, name: str) -> Service | None:
        return self._by_name.get((namespace, name))

    def ready(self) -> bool:
        return True
