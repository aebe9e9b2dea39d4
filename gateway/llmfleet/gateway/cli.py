"""`llmfleet gateway`: serve the OpenAI-compatible API (registered through an entry point)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer
import uvicorn

from llmfleet.core.errors import UserError
from llmfleet.core.options import given
from llmfleet.gateway.app import create_app
from llmfleet.gateway.discovery import StaticConfigError
from llmfleet.gateway.settings import GatewaySettings
from llmfleet.gateway.tenants import TenantsError

app = typer.Typer(help="Run the OpenAI-compatible gateway.", invoke_without_command=True)


@app.callback()
def run(
    *,
    static_config: Annotated[
        Path | None,
        typer.Option("--static-config", help="YAML mapping model names to endpoint URLs."),
    ] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(help="Without --static-config: discover services in this cluster."),
    ] = None,
    namespace: Annotated[
        str | None, typer.Option(help="Kubernetes discovery: only this namespace.")
    ] = None,
    api_keys_secret: Annotated[
        str | None, typer.Option(help="NAMESPACE/NAME of a Secret with `tenants.yaml` (API keys).")
    ] = None,
    host: Annotated[str | None, typer.Option(help="Bind address.")] = None,
    port: Annotated[int | None, typer.Option(help="Port.")] = None,
    profile: Annotated[
        str | None, typer.Option(help="Routing profile: prefix-load, least-loaded, round-robin.")
    ] = None,
) -> None:
    """Serve the OpenAI API, /metrics, /healthz, /readyz (settings: env LLMFLEET_GATEWAY_*)."""
    overrides = given(
        static_config=static_config,
        kubeconfig=kubeconfig,
        namespace=namespace,
        api_keys_secret=api_keys_secret,
        host=host,
        port=port,
        profile=profile,
    )
    settings = GatewaySettings(**overrides)
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s llmfleet-gateway %(levelname)s %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        gateway = create_app(settings)
    except (StaticConfigError, TenantsError, ValueError) as error:
        raise UserError(str(error)) from None
    uvicorn.run(
        gateway,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level=settings.log_level.lower(),
    )


def main() -> None:
    app()
