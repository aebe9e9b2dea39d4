"""The gateway's settings: one pydantic-settings class, environment `LLMFLEET_GATEWAY_*`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import SettingsConfigDict

from llmfleet.core.loopback import LoopbackSettings


class ProfileConfig(BaseModel):
    """One routing profile: plugin names from the registry (`llmfleet.gateway.routing`)."""

    model_config = {"frozen": True}

    filters: tuple[str, ...] = ("healthy",)
    """Filters applied in order; a filter that would leave no candidate is skipped."""
    scorers: dict[str, float] = {}
    """Scorer name -> weight; the endpoint with the highest weighted sum wins."""
    picker: str = "max-score"
    """How one endpoint is chosen from the scored candidates."""


DEFAULT_PROFILES: dict[str, ProfileConfig] = {
    # Prefix affinity dominates while the target is not busier than its peers; the load scorers
    # (each in [0,1]) break the tie and pull traffic away from queues and full KV caches.
    "prefix-load": ProfileConfig(
        scorers={
            "prefix-affinity": 3.0,
            "queue-depth": 2.0,
            "kv-cache": 1.0,
            "inflight-tokens": 1.0,
        }
    ),
    "least-loaded": ProfileConfig(scorers={"least-loaded": 1.0}),
    "round-robin": ProfileConfig(picker="round-robin"),
}


class GatewaySettings(LoopbackSettings):
    """Everything the gateway process reads from its environment (or the CLI's options);
    `loopback_only` (env `LLMFLEET_LOOPBACK_ONLY`) guards the upstream client and the scraper."""

    model_config = SettingsConfigDict(env_prefix="LLMFLEET_GATEWAY_", frozen=True)

    host: str = "127.0.0.1"
    """Address the HTTP server binds: loopback, for a local run; `0.0.0.0` (or the pod's
    address) to serve other machines, as in a pod."""
    port: int = Field(default=8080, ge=1, le=65535)
    """Port of the OpenAI-compatible API, /healthz and /readyz, and of the admin routes
    (/metrics, /docs, /redoc, /openapi.json) unless `admin_port` is set (the operator's metrics
    have 8081 and the autoscaler's 8082)."""
    admin_port: int | None = Field(default=None, ge=1, le=65535)
    """Serve the admin routes on this port (and `host`) instead, with /healthz and /readyz;
    `port` then answers 404 for them, so only what may reach this port (Prometheus, say) sees
    them. None: all on `port`."""
    admin_requires_key: bool = False
    """The admin routes answer only requests with a valid API key (`Authorization: Bearer KEY`,
    any tenant's; 401 otherwise), on whichever port serves them. Needs API keys
    (`api_keys_file` or `api_keys_secret`)."""
    static_config: Path | None = None
    """YAML file mapping served model names to pools of endpoint URLs (no Kubernetes needed)."""
    kubeconfig: Path | None = None
    """Without a static config, discover services from this cluster (in-cluster config, then
    ~/.kube/config, when unset): InferenceServices and their pools' EndpointSlices."""
    namespace: str | None = None
    """Discover only this namespace's services (all namespaces when unset)."""
    discovery_interval_seconds: float = Field(default=1.0, gt=0)
    """Kubernetes discovery rebuilds its snapshot when its watches see a change; this is the
    longest a lost wake-up delays that (it re-reads a change counter this often, nothing more)."""
    api_keys_file: Path | None = None
    """YAML mapping tenants to API keys and per-minute limits (`tenants.py`); None: no auth."""
    api_keys_secret: str | None = None
    """`NAMESPACE/NAME` of a Kubernetes Secret whose `tenants.yaml` holds that document (read
    through `kubeconfig` or the in-cluster config); used when no keys file is set."""
    api_keys_reload_seconds: float = Field(default=10.0, ge=0)
    """Re-read the keys file or Secret this often and apply a changed document at once (keys
    added or revoked; a tenant keeps its rate-limit buckets). 0: read once at start."""
    require_api_keys: bool = False
    """Refuse to start without API keys (`api_keys_file` or `api_keys_secret`), so a missing
    Secret cannot silently leave the gateway open. The chart sets it unless its
    `gateway.auth` is `none`."""
    shutdown_timeout_seconds: int | None = Field(default=None, gt=0)
    """After SIGTERM (the server stops accepting at once), how long the requests in flight,
    streams included, may go on before they are cut: their connections are closed. A stream
    still running `server.CUT_BEFORE_SECONDS` (1 s) before that ends with an SSE error event
    (code `gateway_shutdown`) instead of its final `data: [DONE]`. None: as long as they take.
    Keep it below the pod's terminationGracePeriodSeconds (the chart derives that from it)."""
    limit_replicas: int = Field(default=1, ge=1)
    """Gateway replicas that share each tenant's limits: each replica enforces
    `limit / limit_replicas` with buckets of its own (the chart sets its replica count)."""
    profile: str = "prefix-load"
    """Routing profile used for every pool (a key of `profiles`)."""
    profiles: dict[str, ProfileConfig] = Field(default_factory=lambda: dict(DEFAULT_PROFILES))
    """Routing profiles by name (JSON in the environment); the defaults are `DEFAULT_PROFILES`."""
    scrape_interval_seconds: float = Field(default=1.0, gt=0)
    """How often each active engine's /metrics is read (queue depth, running requests, KV
    usage), ±10% so that scrapes spread out; only active endpoints are scraped."""
    scrape_active_seconds: float = Field(default=30.0, gt=0)
    """An endpoint is active, and scraped, while this replica's routing read its figures
    within this many seconds: the pools it sends traffic to (every endpoint of them). An idle
    pool costs no GET; when traffic comes back it routes on this replica's exact in-flight
    counts until its first scrape lands (within 50 ms plus the GET)."""
    scrape_concurrency: int = Field(default=32, ge=1)
    """Scrapes in flight at once, over all endpoints; the due ones beyond it wait for the next
    tick (`llmfleet_gateway_scrape_lag_seconds` shows the wait). With scrapes of ~5 ms that is
    ~6,000 endpoints a second; scrapes that time out hold a slot for `scrape_timeout_seconds`."""
    scrape_max_per_second: float = Field(default=200.0, gt=0)
    """Scrapes a second at most, over all endpoints (a token bucket): what keeps a replica's
    scraping to a bounded share of its CPU (~0.5 ms each) when thousands of endpoints are
    active. Beyond it the due scrapes wait, most overdue first, and figures that age past
    `metrics_stale_seconds` read as unknown: routing goes on its in-flight counts there."""
    scrape_timeout_seconds: float = Field(default=0.5, gt=0)
    """A scrape (the whole GET) slower than this counts as missing (outcome `timeout`); the
    endpoint keeps its last figures."""
    metrics_stale_seconds: float = 5.0
    """Scraped figures older than this are treated as unknown (zero) by the scorers."""
    connect_timeout_seconds: float = 2.0
    """Connecting to an engine; a refused or timed-out connect is retried on another endpoint."""
    request_timeout_seconds: float = 600.0
    """Longest wait for the next bytes from an engine (a service's `timeoutSeconds` overrides)."""
    max_tokens: int | None = None
    """Cap on `max_tokens` for every request (a service's `maxTokens` overrides); None: no cap."""
    max_in_flight_per_pool: int = 4096
    """Requests a pool may have in flight through this gateway; beyond it the answer is 429."""
    sheddable_share: float = Field(default=0.7, gt=0, le=1)
    """Share of `max_in_flight_per_pool` up to which a pool admits sheddable requests; beyond it
    they go to the service's cheaper tier (`traffic.degradation`) or get 429."""
    standard_share: float = Field(default=0.9, gt=0, le=1)
    """Share up to which a pool admits standard requests (429 beyond it); the rest of the pool's
    capacity is kept for critical requests. A share admits at least one request."""
    retry_after_seconds: int = 1
    """`Retry-After` sent with 429 and 503 answers."""
    eject_after_failures: int = 3
    """Consecutive failures (connect errors, 5xx, broken streams) after which an endpoint is
    ejected. A read timeout (no answer, or a stream stalled, for the request timeout) ejects
    it at once: an engine silent that long is hung, and every request sent to it would wait
    as long."""
    eject_seconds: float = 10.0
    """How long an ejected endpoint receives no traffic (unless every endpoint is ejected)."""
    prefix_block_chars: int = 256
    """Prompt characters per hashed block (about 64 tokens)."""
    prefix_blocks: int = 8
    """Leading blocks whose hash is the prefix-affinity key (the shared system prompt region)."""
    bounded_load_factor: float = 1.25
    """Consistent hashing with bounded load: an endpoint takes a key while its in-flight count
    stays within factor x the pool's mean; otherwise the key moves on along the ring."""
    keepalive_connections: int = 4096
    """Idle keep-alive connections kept to all engines together with the httpx upstream client
    (the aiohttp one keeps every idle connection for 30 s)."""
    upstream_client: Literal["wire", "aiohttp", "httpx"] = "wire"
    """Client to the engines: the gateway's own HTTP/1.1 client on asyncio and httptools
    (`wire.py`), aiohttp's, or httpx's (`upstream.py`; each costs more CPU per request than the
    one before it, see upstream.py; the other two are fallbacks)."""
    coalesce_max_lag_chunks: int = Field(default=1024, ge=1)
    """A reader of a coalesced stream that falls this many chunks behind the shared upstream
    (chunks that arrived since it joined and it has not taken) is dropped with an SSE error
    event; the other readers and the upstream never wait for it."""
    coalesce_window_entries: int = Field(default=1024, ge=0)
    """Finished answers kept to answer identical requests within `traffic.coalesce.windowMs`,
    over all services; beyond it the oldest go first."""
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    """Largest request body accepted (413 beyond, before reading it when Content-Length says
    so). 8 MiB holds a million-token text prompt (about 4 MiB) or a 1M-token-id prompt."""
    body_read_timeout_seconds: float = Field(default=30.0, gt=0)
    """Longest time to receive a request's whole body once its headers are in (408 beyond)."""
    header_read_timeout_seconds: float = Field(default=10.0, gt=0)
    """Longest time from a connection's (or a request's) first byte to its last header line;
    beyond it the server answers 408 and closes the connection (slow-header clients)."""
    max_header_bytes: int = Field(default=65_536, ge=1024)
    """Largest total size of a request's headers (431 and the connection closed beyond)."""
    max_connections: int | None = Field(default=10_000, ge=1)
    """Connections the server serves at once; a request on one more is answered 503 (with
    `Retry-After`). None: no limit."""
    keepalive_timeout_seconds: int = Field(default=75, gt=0)
    """An idle keep-alive connection is closed after this long (longer than the usual
    load balancer's 60 s idle timeout, so the balancer closes first)."""
    freeze_startup_heap: bool = True
    """`gc.freeze()` the heap once started and again once discovery's first snapshot is in, so
    full collections do not walk it (`gc_pauses`)."""
    refreeze_after_pause_seconds: float | None = Field(default=0.005, gt=0)
    """After a full garbage collection that took this much CPU, freeze what it left alive too
    (the state traffic makes per pool and engine), at most 12 times an hour
    (`gc_pauses.Refreezer`). CPU, not wall time: a collection preempted on a busy machine lasts
    longer but a freeze would not shorten it. None: never after start-up. The default is the
    event-loop lag the gateway is built to stay under (issue 28's goal)."""
    gil_switch_interval_seconds: float = Field(default=0.001, gt=0, le=0.1)
    """How long a thread may keep the GIL while another waits for it (`sys.setswitchinterval`;
    Python's default is 5 ms). The gateway's threads (discovery's rebuild, the /metrics render,
    the informers' JSON) then give the event loop the GIL back within this: at 1,000 services a
    rebuild held the loop up to 6-7 ms at 1 ms, 10-11 ms at 5 ms (bench/discovery_rebuild.py).
    """
    log_level: str = "INFO"
    """Python logging level of the gateway."""

    @model_validator(mode="after")
    def _ports_differ(self) -> GatewaySettings:
        if self.admin_port is not None and self.admin_port == self.port:
            raise ValueError(f"admin_port must differ from port (both are {self.port})")
        return self
