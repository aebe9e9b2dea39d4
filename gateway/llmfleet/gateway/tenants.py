"""API keys mapped to tenants, and each tenant's requests- and tokens-per-minute limits.

Keys file (`LLMFLEET_GATEWAY_API_KEYS_FILE`; a Kubernetes Secret will carry the same document)::

    tenants:
      team-a:
        keys: [sk-a-1, sk-a-2]
        requestsPerMinute: 600        # optional
        tokensPerMinute: 200000       # optional; prompt + max output tokens, estimated
        priority: critical            # optional: critical, standard (default) or sheddable
        models: [llama-8b, qwen-72b]  # optional: the served models it may use (default: all)
      batch:
        keys: [sk-b]

Limits are token buckets (capacity = the per-minute figure, refilled continuously at 1/60 of it
per second), so a tenant may burst up to one minute's worth and then runs at the rate. A request
is charged in full when admitted; a refusal says how long until it would fit (`Retry-After`).

Each gateway replica keeps its own buckets: the document's limits are for the whole gateway, and
each replica enforces its share, `limit / replicas` (`GatewaySettings.limit_replicas`, which the
chart sets to its replica count). A client whose connections the gateway Service spreads over
the replicas gets about the whole limit; one held to a single replica gets its share.

`reload` swaps in a new document (the gateway re-reads its keys every
`api_keys_reload_seconds`): keys added or removed count at once, and a tenant that stays keeps
its buckets, so a reload neither resets nor re-grants anyone's minute.

A tenant with `models` may name only those in a request (any other is answered 404, as a model
that does not exist), and `/v1/models` lists only those to its keys. The list is of the model
the request names: where that service's own traffic policies send it on (a cascade tier, a
cheaper service under load) is the service's choice, not the tenant's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmfleet.core.problems import problems, yaml_problem

if TYPE_CHECKING:
    from llmfleet.gateway.proxy import Priority


@dataclass
class Bucket:
    """A token bucket: `capacity` units, refilled at `capacity / 60` per second."""

    capacity: float
    level: float
    updated: float

    def take(self, amount: float, now: float) -> float:
        """Take `amount` and return 0, or take nothing and return seconds until it would fit."""
        rate = self.capacity / 60.0
        self.level = min(self.capacity, self.level + (now - self.updated) * rate)
        self.updated = now
        wanted = min(amount, self.capacity)  # larger than a minute's worth: wait for a full one
        if self.level >= wanted:
            self.level -= wanted
            return 0.0
        return (wanted - self.level) / rate


@dataclass
class Tenant:
    name: str
    requests_per_minute: float | None = None
    """This replica's share of the tenant's request limit."""
    tokens_per_minute: float | None = None
    """This replica's share of the tenant's token limit."""
    priority: Priority | None = None
    """The tenant's priority class (its requests may ask for a lower one); None: standard."""
    models: frozenset[str] | None = None
    """Served model names the tenant may use; None: every model."""
    _buckets: dict[str, Bucket] = field(default_factory=dict)

    def admit(self, tokens: int, now: float) -> float:
        """0 when the request may go, else the seconds the client should wait."""
        limits = {
            "requests": (self.requests_per_minute, 1),
            "tokens": (self.tokens_per_minute, tokens),
        }
        buckets: list[tuple[Bucket, float]] = []
        for kind, (limit, amount) in limits.items():
            if limit is None:
                continue
            bucket = self._buckets.get(kind)
            if bucket is None:
                bucket = self._buckets[kind] = Bucket(limit, limit, now)
            wait = bucket.take(amount, now)
            if wait:
                for taken, charged in buckets:  # refund what this refused request took
                    taken.level += charged
                return wait
            buckets.append((bucket, min(amount, bucket.capacity)))
        return 0.0

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models


class TenantsError(ValueError):
    """The keys file is missing or malformed (the message names the field)."""


class _TenantModel(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    keys: list[str] = Field(min_length=1)
    requests_per_minute: int | None = Field(default=None, alias="requestsPerMinute", gt=0)
    tokens_per_minute: int | None = Field(default=None, alias="tokensPerMinute", gt=0)
    priority: Literal["critical", "standard", "sheddable"] | None = None
    models: list[str] | None = Field(default=None, min_length=1)


class _KeysFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tenants: dict[str, _TenantModel]


class Tenants:
    """Who is calling (by API key) and whether they may, now."""

    def __init__(
        self,
        by_key: dict[str, Tenant],
        clock: Callable[[], float] = time.monotonic,
        replicas: int = 1,
    ):
        self._by_key = by_key
        self._clock = clock
        self._replicas = replicas

    @classmethod
    def parse(
        cls, text: str, clock: Callable[[], float] = time.monotonic, replicas: int = 1
    ) -> Tenants:
        """The keys document `text`, each limit divided by `replicas` (the gateway replicas
        that share it)."""
        return cls(_by_key(text, replicas), clock, replicas)

    @classmethod
    def from_file(
        cls, path: Path, clock: Callable[[], float] = time.monotonic, replicas: int = 1
    ) -> Tenants:
        try:
            return cls.parse(path.read_text(), clock, replicas)
        except OSError as error:
            raise TenantsError(f"cannot read API keys file {path}: {error}") from error

    def reload(self, text: str) -> None:
        """Replace the keys and limits by those of `text` (TenantsError: they stay as they
        were). A tenant of the same name keeps its buckets, their capacity set to a changed
        limit."""
        by_key = _by_key(text, self._replicas)
        kept = {tenant.name: tenant._buckets for tenant in self._by_key.values()}
        for tenant in {id(t): t for t in by_key.values()}.values():
            limits = {"requests": tenant.requests_per_minute, "tokens": tenant.tokens_per_minute}
            for kind, bucket in kept.get(tenant.name, {}).items():
                limit = limits[kind]
                if limit is not None:
                    bucket.capacity = limit
                    bucket.level = min(bucket.level, limit)
                    tenant._buckets[kind] = bucket
        self._by_key = by_key

    def identify(self, authorization: str | None) -> Tenant | None:
        """The tenant of an `Authorization: Bearer KEY` header, or None."""
        if not authorization or not authorization.startswith("Bearer "):
            return None
        return self._by_key.get(authorization[7:].strip())

    def retry_after(self, tenant: Tenant, tokens: int) -> int:
        """0 when admitted (and charged), else whole seconds to wait (at least 1)."""
        wait = tenant.admit(tokens, self._clock())
        return math.ceil(wait) if wait else 0


def _by_key(text: str, replicas: int) -> dict[str, Tenant]:
    """Key -> tenant of the keys document `text`, each limit divided by `replicas`."""
    try:
        parsed = _KeysFile.model_validate(yaml.safe_load(text))
    except yaml.YAMLError as error:
        raise TenantsError(f"invalid API keys file: {yaml_problem(error)}") from error
    except ValidationError as error:
        lines = (f"invalid API keys file: {line}" for line in problems(error))
        raise TenantsError("\n".join(lines)) from error
    by_key: dict[str, Tenant] = {}
    for name, spec in parsed.tenants.items():
        models = frozenset(spec.models) if spec.models is not None else None
        rpm, tpm = spec.requests_per_minute, spec.tokens_per_minute
        tenant = Tenant(
            name,
            None if rpm is None else rpm / replicas,
            None if tpm is None else tpm / replicas,
            spec.priority,
            models,
        )
        for key in spec.keys:
            if key in by_key:
                raise TenantsError(f"invalid API keys file: a key is listed twice ({name})")
            by_key[key] = tenant
    return by_key
