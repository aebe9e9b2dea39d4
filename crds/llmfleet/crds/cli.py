"""`llmfleet validate FILE…`: check InferenceService manifests before they reach a cluster.

For CI pipelines and GitOps pre-checks: the same models and rules as admission, with a
person's message for each problem, naming the field, where the API server's own wording is
poor (numbers written as strings, integers past int64, Go internals). One line per problem,
`FILE:DOC: spec.path: message` (DOC counts the YAML documents of FILE from 1); exit 0 when
every InferenceService is valid, 1 otherwise. Documents of other kinds are skipped, so a
GitOps directory's files can be given as they are.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

# The models and PyYAML are imported by `validate`, not here: `llmfleet --help` loads this
# module to list the command and must stay fast.
app = typer.Typer(add_completion=False)


@app.command()
def validate(
    files: Annotated[
        list[str],
        typer.Argument(
            metavar="FILE",
            help="Manifest files (multi-document YAML); `-` reads stdin.",
            show_default=False,
        ),
    ],
) -> None:
    """Check InferenceService manifests as admission would; one line per problem."""
    import yaml

    from llmfleet.crds import validation

    checked = reported = 0

    def report(where: str, field: str, message: str) -> None:
        nonlocal reported
        reported += 1
        typer.echo(f"{where}: {field}: {message}")

    for name in files:
        try:
            text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            report(name, "(file)", f"cannot read: {error}")
            continue
        number = 0
        try:
            for number, document in validation.documents(text):
                if not validation.is_inference_service(document):
                    continue
                checked += 1
                for problem in validation.problems(document):
                    report(f"{name}:{number}", problem.path or "(document)", problem.message)
        except yaml.YAMLError as error:
            report(f"{name}:{number + 1}", "(yaml)", validation.yaml_error(error))
    verdict = f"{reported} problem(s)" if reported else "all valid"
    typer.echo(f"{checked} InferenceService(s) in {len(files)} file(s): {verdict}", err=True)
    if reported:
        raise typer.Exit(1)
