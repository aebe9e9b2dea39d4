"""`llmfleet-runtime`: the runtime image's entrypoint.

`serve` reads the runtime config, detects the GPU, plans the engine's command line and runs the
engine behind the life cycle (warm-up before readiness, drain on SIGTERM); `--print-args` prints
the command line as one JSON array instead. `profile` measures an engine's capacity profile.
Every failure is one line on stderr and an exit code of `ExitCode`.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from llmfleet.runtime import gpu as gpus
from llmfleet.runtime.args import EnginePlan, plan_engine
from llmfleet.runtime.config import load_config
from llmfleet.runtime.errors import ExitCode, LauncherError
from llmfleet.runtime.lifecycle import run_serving
from llmfleet.runtime.profiler import ProfileSettings, run_profile
from llmfleet.runtime.redact import redact, secret_values

app = typer.Typer(
    name="llmfleet-runtime",
    help="llmfleet's vLLM launcher, life cycle and capacity profiler.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _fail(error: LauncherError) -> typer.Exit:
    print(f"llmfleet-runtime: error: {error}", file=sys.stderr)
    return typer.Exit(int(error.code))


@app.command()
def serve(
    config: Annotated[Path, typer.Option("--config", help="Runtime config file (YAML or JSON).")],
    print_args: Annotated[
        bool, typer.Option("--print-args", help="Print the engine command line and exit.")
    ] = False,
    engine_command: Annotated[
        str | None,
        typer.Option(
            "--engine-command",
            help="Run this command instead of the planned `vllm serve` (another OpenAI-compatible "
            "engine, or a test stand-in); `{host}`, `{port}` and `{model}` are replaced.",
        ),
    ] = None,
) -> None:
    """Run the engine for this pod (or print its command line)."""
    try:
        loaded = load_config(config, os.environ)
        gpu = gpus.detect(loaded.runtime.gpu, os.environ)
        plan = plan_engine(loaded, gpu, pod_ip=os.environ.get("POD_IP"))
    except LauncherError as error:
        raise _fail(error) from None
    if print_args:
        print(json.dumps(plan.argv))
        return
    secrets = secret_values(os.environ, plan.env)
    for line in (redact(decision, secrets) for decision in plan.decisions):
        kind, _, text = (
            line.partition(" ") if line.startswith("WARNING ") else ("default", "", line)
        )
        print(f"llmfleet-runtime: {kind.lower()} {text}", file=sys.stderr)
    if engine_command is not None:
        serving, served = loaded.serving, loaded.model.served_name or loaded.model.name
        fill = {"{host}": serving.host, "{port}": str(serving.port), "{model}": served}
        argv = [_filled(word, fill) for word in shlex.split(engine_command)]
        plan = EnginePlan(argv, plan.env, plan.decisions, plan.tensor_parallel)
    code = run_serving(loaded, plan)
    raise typer.Exit(int(code))


@app.command()
def profile(  # noqa: PLR0917  (typer reads options from the parameters)
    url: Annotated[str, typer.Option("--url", help="Base URL of an OpenAI-compatible engine.")],
    out: Annotated[Path, typer.Option("--out", help="Where to write the profile (JSON).")],
    model: Annotated[
        str | None, typer.Option("--model", help="Model name; the first served.")
    ] = None,
    prompt_lengths: Annotated[
        str, typer.Option("--prompt-lengths", help="Comma-separated prompt lengths, tokens.")
    ] = "128,512,2048",
    concurrencies: Annotated[
        str, typer.Option("--concurrency", help="Comma-separated concurrency levels.")
    ] = "1,2,4,8",
    output_tokens: Annotated[int, typer.Option("--output-tokens", help="Tokens per request.")] = 32,
    repeats: Annotated[int, typer.Option("--repeats", help="Requests per measurement point.")] = 3,
    max_concurrency: Annotated[
        int, typer.Option("--max-concurrency", help="Upper limit of the saturation search.")
    ] = 256,
) -> None:
    """Measure TTFT vs prompt length, ITL vs concurrency and the concurrency limit."""
    try:
        settings = ProfileSettings(
            url=url.rstrip("/"),
            model=model,
            prompt_lengths=_ints(prompt_lengths, "--prompt-lengths"),
            concurrencies=_ints(concurrencies, "--concurrency"),
            output_tokens=output_tokens,
            repeats=repeats,
            max_concurrency=max_concurrency,
        )
        result = run_profile(settings)
    except LauncherError as error:
        raise _fail(error) from None
    out.write_text(result.model_dump_json(indent=2, by_alias=True) + "\n")
    print(f"llmfleet-runtime: wrote {out}", file=sys.stderr)


def _filled(word: str, fill: dict[str, str]) -> str:
    for placeholder, value in fill.items():
        word = word.replace(placeholder, value)
    return word


def _ints(text: str, option: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise LauncherError(ExitCode.USAGE, f"{option} takes integers like 1,2,4") from None
    if not values or min(values) < 1:
        raise LauncherError(ExitCode.USAGE, f"{option} takes positive integers like 1,2,4")
    return values


def main() -> None:
    app()
