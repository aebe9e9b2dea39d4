"""`llmfleet gateway`: serve the OpenAI-compatible API (registered through an entry point)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from llmfleet.core.errors import UserError
from llmfleet.core.options import given
from llmfleet.core.problems import problems
from llmfleet.gateway.settings import DEFAULT_PROFILES, GatewaySettings

# uvicorn and the app's modules (FastAPI, aiohttp) are imported by `run`, not here:
# `llmfleet --help` loads this module to list the command and must stay fast.
app = typer.Typer(add_completion=False)
_DEFAULTS = GatewaySettings.model_fields


@app.command()
def run(
    *,
    static_config: Annotated[
        Path | None,
        typer.Option("--static-config", help="YAML mapping model names to endpoint URLs."),
    ] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            help="Without --static-config: discover services in this cluster.",
            show_default="in-cluster config, else $KUBECONFIG or ~/.kube/config",
        ),
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option(help="Kubernetes discovery: only this namespace.", show_default="all"),
    ] = None,
    api_keys_secret: Annotated[
        str | None,
        typer.Option(
            help="NAMESPACE/NAME of a Secret with `tenants.yaml` (API keys).",
            show_default="no API keys",
        ),
    ] = None,
    host: Annotated[
        str | None,
        typer.Option(
            help="Bind address (0.0.0.0: every interface).", show_default=_DEFAULTS["host"].default
        ),
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port.", show_default=str(_DEFAULTS["port"].default))
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            help=f"Routing profile: {', '.join(DEFAULT_PROFILES)}.",
            show_default=_DEFAULTS["profile"].default,
        ),
    ] = None,
) -> None:
    """Run the OpenAI-compatible gateway.

    Serves the OpenAI API, /metrics, /healthz and /readyz in front of the engines a static file
    lists or the cluster's InferenceServices. Settings: environment LLMFLEET_GATEWAY_*."""
    from llmfleet.gateway.app import create_app
    from llmfleet.gateway.discovery import StaticConfigError
    from llmfleet.gateway.server import serve
    from llmfleet.gateway.tenants import TenantsError

    overrides = given(
        static_config=static_config,
        kubeconfig=kubeconfig,
        namespace=namespace,
        api_keys_secret=api_keys_secret,
        host=host,
        port=port,
        profile=profile,
    )
    try:
        settings = GatewaySettings(**overrides)
    except ValidationError as error:  # an option or an LLMFLEET_GATEWAY_* variable
        raise UserError("\n".join(f"gateway setting {line}" for line in problems(error))) from None
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s llmfleet-gateway %(levelname)s %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        gateway = create_app(settings)
    except (StaticConfigError, TenantsError, ValueError) as error:
        raise UserError(str(error)) from None
    serve(gateway, settings)


def main() -> None:
    app()
