"""The wire to the engines: send a body to a URL (or GET one), get the status, then the bytes.

Three clients behind one small interface (`Upstream`):
- `wire.WireUpstream`, the default: the gateway's own HTTP/1.1 client (see its module);
- `AiohttpUpstream`: aiohttp's connection pool straight, with the header block built once, no
  cookie jar, redirects or decompression (`upstream_client: aiohttp`; the gateway used ~30% more
  CPU with it than with `wire` at 1,500 requests/s, and httpx's stack ~4x aiohttp's per request:
  bench/gateway_overhead.py; encode/httpx#3215);
- `HttpxUpstream`, over any httpx transport: tests pass `httpx.MockTransport` to stand in for
  engines, and `upstream_client: httpx` keeps httpx's own stack as a fallback.

Contracts all keep: failures are the exceptions below, so the proxy's retry and ejection rules
do not depend on the client; bodies are passed through undecoded; closing a response that was
not read to the end closes its connection instead of returning it to the pool, so the engine sees
the client go.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

import aiohttp
import httpx
from yarl import URL

from llmfleet.core.loopback import LoopbackGuard, NonLocalConnectError, NonLocalRefused

_LARGE_BODY = 1 << 20


class UpstreamError(Exception):
    """The engine could not be reached or broke off; `connecting` when nothing was sent."""

    connecting = False


class UpstreamConnectError(UpstreamError):
    """Refused, unreachable, or a connect timeout: nothing reached the engine."""

    connecting = True


class UpstreamRefusedNonLocal(UpstreamConnectError):
    """The loopback guard refused the destination (logged once per endpoint by the guard)."""


class UpstreamTimeout(UpstreamError):
    """No bytes from the engine within the read timeout (headers or the next chunk)."""


class UpstreamResponse(Protocol):
    status_code: int
    content_type: str

    async def aread(self) -> bytes: ...

    def aiter_raw(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class Upstream(Protocol):
    async def send(
        self, url: str, body: bytes, headers: Sequence[tuple[str, str]], read_timeout: float
    ) -> UpstreamResponse:
        """POST `body` to `url`; the response once its headers arrived (UpstreamError if not)."""
        ...

    async def get(self, url: str, read_timeout: float) -> UpstreamResponse:
        """GET `url` (the scraper's read of an engine's /metrics), as `send`."""
        ...

    async def aclose(self) -> None: ...


def _mapped(error: BaseException, *, connecting: bool) -> UpstreamError:
    message = f"{type(error).__name__}: {error}"
    if isinstance(error, aiohttp.ConnectionTimeoutError | aiohttp.ClientConnectorError):
        return UpstreamConnectError(message)
    if isinstance(error, aiohttp.SocketTimeoutError | TimeoutError):
        if connecting and not isinstance(error, aiohttp.SocketTimeoutError):
            return UpstreamConnectError(message)
        return UpstreamTimeout(message)
    return UpstreamError(message)


class _AiohttpResponse:
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status_code = response.status
        self.content_type = response.headers.get("Content-Type", "application/json")

    async def aread(self) -> bytes:
        try:
            return await self._response.read()
        except (TimeoutError, aiohttp.ClientError) as error:
            raise _mapped(error, connecting=False) from error

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as error:
            raise _mapped(error, connecting=False) from error

    async def aclose(self) -> None:
        if self._response.content.at_eof():
            self._response.release()
        else:  # unread: the connection cannot be reused, and closing it tells the engine
            self._response.close()


class AiohttpUpstream:
    """One aiohttp session, opened on first use inside the running loop, closed by `aclose`.
    `name` is the client's in the loopback guard's refusals."""

    def __init__(
        self,
        guard: LoopbackGuard,
        *,
        connect_timeout: float,
        keepalive_seconds: float = 30.0,
        name: str = "upstream",
    ) -> None:
        self._guard = guard
        self._name = name
        self._urls: dict[str, URL] = {}
        """Parsed endpoint URLs (one per endpoint and route; yarl's parsing is not free)."""
        self._connect_timeout = connect_timeout
        self._keepalive = keepalive_seconds
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=self._keepalive)
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    def _url(self, url: str) -> URL:
        """`url` parsed, once it passed the loopback guard (the guard is asked once per URL)."""
        parsed = self._urls.get(url)
        if parsed is None:
            try:
                self._guard.check_url(url, self._name)
            except NonLocalRefused as error:
                raise UpstreamRefusedNonLocal(str(error)) from None
            parsed = URL(url, encoded=True)
            if len(self._urls) >= 4096:  # endpoints come and go; start over rather than grow
                self._urls.clear()
            self._urls[url] = parsed
        return parsed

    def _timeout(self, read: float) -> aiohttp.ClientTimeout:
        timeout = self._timeouts.get(read)
        if timeout is None:
            timeout = aiohttp.ClientTimeout(
                total=None, sock_connect=self._connect_timeout, sock_read=read
            )
            self._timeouts[read] = timeout
        return timeout

    async def send(
        self, url: str, body: bytes, headers: Sequence[tuple[str, str]], read_timeout: float
    ) -> _AiohttpResponse:
        target = self._url(url)
        # aiohttp writes bytes in one piece (and warns past 1 MiB); a file-like goes in chunks.
        data = body if len(body) < _LARGE_BODY else io.BytesIO(body)
        try:
            response = await self._get_session().post(
                target,
                data=data,
                headers=headers,
                timeout=self._timeout(read_timeout),
                allow_redirects=False,
            )
        except (TimeoutError, aiohttp.ClientError) as error:
            raise _mapped(error, connecting=True) from error
        return _AiohttpResponse(response)

    async def get(self, url: str, read_timeout: float) -> _AiohttpResponse:
        try:
            response = await self._get_session().get(
                self._url(url), timeout=self._timeout(read_timeout), allow_redirects=False
            )
        except (TimeoutError, aiohttp.ClientError) as error:
            raise _mapped(error, connecting=True) from error
        return _AiohttpResponse(response)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class _HttpxResponse:
    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status_code = response.status_code
        self.content_type = response.headers.get("content-type", "application/json")

    async def aread(self) -> bytes:
        try:
            return await self._response.aread()
        except httpx.HTTPError as error:
            raise _from_httpx(error) from error

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        if self._response.is_stream_consumed:  # a transport that read the body (MockTransport)
            yield self._response.content
            return
        try:
            async for chunk in self._response.aiter_raw():
                yield chunk
        except httpx.HTTPError as error:
            raise _from_httpx(error) from error

    async def aclose(self) -> None:
        await self._response.aclose()


def _from_httpx(error: httpx.HTTPError) -> UpstreamError:
    message = f"{type(error).__name__}: {error}"
    if isinstance(error, NonLocalConnectError):
        return UpstreamRefusedNonLocal(message)
    if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout):
        return UpstreamConnectError(message)
    if isinstance(error, httpx.TimeoutException):
        return UpstreamTimeout(message)
    return UpstreamError(message)


class HttpxUpstream:
    """The same interface over an httpx client (its transport: a test's, or httpx's own)."""

    def __init__(self, client: httpx.AsyncClient, *, connect_timeout: float) -> None:
        self._client = client
        self._connect_timeout = connect_timeout

    async def send(
        self, url: str, body: bytes, headers: Sequence[tuple[str, str]], read_timeout: float
    ) -> _HttpxResponse:
        timeout = httpx.Timeout(read_timeout, connect=self._connect_timeout)
        request = self._client.build_request(
            "POST", url, content=body, headers=list(headers), timeout=timeout
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as error:
            raise _from_httpx(error) from error
        return _HttpxResponse(response)

    async def get(self, url: str, read_timeout: float) -> _HttpxResponse:
        timeout = httpx.Timeout(read_timeout, connect=self._connect_timeout)
        request = self._client.build_request("GET", url, timeout=timeout)
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as error:
            raise _from_httpx(error) from error
        return _HttpxResponse(response)

    async def aclose(self) -> None:
        await self._client.aclose()
