"""`LLMFLEET_LOOPBACK_ONLY`: refuse every outbound destination outside 127.0.0.0/8 and ::1.

On our development and CI machines nothing may send a packet beyond loopback (the local
cluster's pod IPs, 10.0.0.0/16, lead off the machine). With the setting on, each component's
clients ask one `LoopbackGuard` before they connect; a refused destination is one warning line
(the first time that endpoint is refused) and one count per attempt, and the caller sees a
connection error. Off by default: in a real cluster the engines are on pod IPs.

What counts as loopback: an IP literal in 127.0.0.0/8 or ::1 (IPv4-mapped forms too), and the
name `localhost`. Any other name is refused without a lookup, since the lookup itself would ask
a DNS server that may be off the machine. `NETWORKS_ENV` may add networks that exist only inside
the network namespace the process runs in: `llmfleet up` sets it to the local cluster's pod
network, whose every address is a pod's own namespace behind a veth pair (core/local/podnet.py).

Adapters: `GuardedTransport` wraps any httpx async transport (the gateway, the runtime launcher);
the autoscaler's requests session and the operator's urllib probe call `check` themselves.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx
from pydantic import Field, TypeAdapter, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV = "LLMFLEET_LOOPBACK_ONLY"
"""The environment variable every component reads (no component prefix: one switch for all)."""

NETWORKS_ENV = "LLMFLEET_NAMESPACE_NETWORKS"
"""Comma-separated networks (CIDR) allowed like loopback because they exist only inside the
run's own network namespace; only the local system (`llmfleet up`) sets it."""

log = logging.getLogger("llmfleet.loopback")
_BOOL = TypeAdapter(bool)


class LoopbackSettings(BaseSettings):
    """Base of the components' settings classes: adds `loopback_only` from `ENV`."""

    model_config = SettingsConfigDict(populate_by_name=True)

    loopback_only: bool = Field(default=False, validation_alias=ENV)
    """Refuse every outbound connection to an address outside 127.0.0.0/8 and ::1 (before
    connecting). `llmfleet cluster env` exports it and the local tooling sets it for every
    process it starts; off in production."""


def enabled(environ: dict[str, str] | None = None) -> bool:
    """Whether `ENV` is set to a true value (for code without a settings class), read with the
    same boolean parsing as `LoopbackSettings`; an unset or unreadable value is off."""
    value = (environ if environ is not None else os.environ).get(ENV, "").strip()
    try:
        return _BOOL.validate_python(value) if value else False
    except ValidationError:
        return False


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def namespace_networks(environ: dict[str, str] | None = None) -> tuple[Network, ...]:
    """The networks `NETWORKS_ENV` allows besides loopback (none when unset)."""
    value = (environ if environ is not None else os.environ).get(NETWORKS_ENV, "")
    try:
        return tuple(
            ipaddress.ip_network(part.strip()) for part in value.split(",") if part.strip()
        )
    except ValueError as error:
        raise ValueError(f"{NETWORKS_ENV}={value!r}: {error}") from None


def is_loopback(host: str, also: tuple[Network, ...] = ()) -> bool:
    """An address in 127.0.0.0/8 or ::1 (brackets allowed), the name `localhost`, or an address
    in one of the networks `also`."""
    host = host.strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False  # a name: refused without a lookup
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or any(address in network for network in also)


class NonLocalRefused(OSError):
    """A destination outside loopback, refused before connecting (an OSError, like a refused
    connection, so callers that survive an unreachable peer survive this too)."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(
            f"{endpoint} is outside 127.0.0.0/8 and ::1: refused before connecting ({ENV} is on)"
        )
        self.endpoint = endpoint


class NonLocalConnectError(httpx.ConnectError):
    """httpx's face of `NonLocalRefused`: a connect error that never reached the network."""


class LoopbackGuard:
    """Decides, per destination, whether a component may connect; thread-safe.

    `on_refused(client)` runs on every refusal (the component's `…_nonlocal_refused_total`
    counter, labelled with which of its clients tried); the warning is logged once per endpoint
    (host:port), not per attempt.
    """

    def __init__(
        self,
        enabled: bool,
        on_refused: Callable[[str], None] | None = None,
        logger: logging.Logger | None = None,
        also: tuple[Network, ...] | None = None,
    ) -> None:
        self.enabled = enabled
        self.also = namespace_networks() if also is None else also
        """Networks allowed besides loopback (`NETWORKS_ENV` unless given)."""
        self._on_refused = on_refused
        self._log = logger or log
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def check(self, host: str, port: int | None = None, client: str = "") -> None:
        """Raise `NonLocalRefused` when the guard is on and `host` is not loopback; `client`
        names the caller for the counter and the warning."""
        if not self.enabled or is_loopback(host, self.also):
            return
        endpoint = _endpoint(host, port)
        if self._on_refused is not None:
            self._on_refused(client)
        with self._lock:
            first = endpoint not in self._warned
            self._warned.add(endpoint)
        if first:
            self._log.warning(
                "refusing connections to %s%s: outside 127.0.0.0/8 and ::1 (%s is on); "
                "further refusals of it are only counted",
                endpoint,
                f" ({client})" if client else "",
                ENV,
            )
        raise NonLocalRefused(endpoint)

    def check_url(self, url: str, client: str = "") -> None:
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = None
        self.check(parts.hostname or "", port, client)


def _endpoint(host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return shown if port is None else f"{shown}:{port}"


class GuardedTransport(httpx.AsyncBaseTransport):
    """An httpx transport that asks `guard` before `inner` connects (httpx follows no
    redirects unless told to, and each followed one comes through here again)."""

    def __init__(
        self, inner: httpx.AsyncBaseTransport, guard: LoopbackGuard, client: str = ""
    ) -> None:
        self.inner = inner
        self.guard = guard
        self.client = client
        self._allowed: set[tuple[str, int | None]] = set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        key = (request.url.host, request.url.port)
        if key not in self._allowed:  # the common case is one check per endpoint
            try:
                self.guard.check(*key, client=self.client)
            except NonLocalRefused as refused:
                raise NonLocalConnectError(str(refused), request=request) from refused
            self._allowed.add(key)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def guarded(
    transport: httpx.AsyncBaseTransport | None,
    guard: LoopbackGuard,
    client: str = "",
    limits: httpx.Limits | None = None,
) -> httpx.AsyncBaseTransport | None:
    """`transport` (httpx's own, with `limits`, when None) behind `guard`; unchanged when the
    guard is off, so production pays nothing."""
    if not guard.enabled:
        return transport
    inner = transport or httpx.AsyncHTTPTransport(
        limits=limits or httpx.Limits(max_connections=100, max_keepalive_connections=20)
    )  # httpx's own defaults
    return GuardedTransport(inner, guard, client)
