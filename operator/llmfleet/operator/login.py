"""kopf's login, with the operator's own User-Agent on kopf's requests.

kopf sends `kopf/<version>` and has no setting for it; its documented way to shape the HTTP
session is a login handler that returns a `kopf.AiohttpSession`. This one is built the way kopf
builds its own from a `kopf.ConnectionInfo` (same TLS context, credentials, proxy), plus the
header, so the API server's audit log tells the operator's watches and patches from the other
components' (`llmfleet.core.kube.user_agent`).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import kopf

from llmfleet.core.kube import user_agent


def identified(info: kopf.ConnectionInfo, agent: str) -> kopf.AiohttpSession:
    """A session for `info` whose requests say `agent`; kopf closes it when it drops the login.

    Must be called on the operator's event loop (aiohttp binds the session to it)."""
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ssl=info.as_ssl_context()),
        headers={**info.as_http_headers(), "User-Agent": agent},
        proxy=info.proxy_url,
        trust_env=info.trust_env,
    )
    return kopf.AiohttpSession(
        server=info.server,
        default_namespace=info.default_namespace,
        priority=info.priority,
        expiration=info.expiration,
        aiohttp_session=session,
    )


async def login(**kwargs: Any) -> kopf.AiohttpSession | None:
    """kopf's `login_via_client` (the Kubernetes client's configuration), identified."""
    info = kopf.login_via_client(**kwargs)
    return None if info is None else identified(info, user_agent("operator"))
