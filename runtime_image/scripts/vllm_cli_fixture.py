"""Regenerate `tests/runtime/fixtures/vllm-serve-cli.json` from the real vLLM CLI, and check
argument lists against the real parser.

Run it with the Python of a virtualenv that has the pinned vLLM installed (never the dev venv):

    python3 -m venv /tmp/vllm-0.33.0
    /tmp/vllm-0.33.0/bin/pip install uv
    # vllm 0.33.0 requires certifi>=2026.10.19, which our PyPI mirror does not have yet; certifi
    # only supplies CA certificates, so the newest release stands in for it.
    echo 'certifi==2026.10.18' > /tmp/overrides.txt
    /tmp/vllm-0.33.0/bin/uv pip install --python /tmp/vllm-0.33.0/bin/python \
        --override /tmp/overrides.txt vllm==0.33.0
    VLLM_TARGET_DEVICE=cpu /tmp/vllm-0.33.0/bin/python runtime_image/scripts/vllm_cli_fixture.py \
        > tests/runtime/fixtures/vllm-serve-cli.json
    # Parse launcher argument lists (a JSON array of arrays, e.g. from
    # `python -m tests.runtime.dump_argvs /tmp/argvs.json`) with the
    # real parser; prints one line per list and exits 1 if any is rejected:
    VLLM_TARGET_DEVICE=cpu /tmp/vllm-0.33.0/bin/python runtime_image/scripts/vllm_cli_fixture.py \
        --check /tmp/argvs.json

`VLLM_TARGET_DEVICE=cpu` lets vLLM pick its CPU platform on a machine without a GPU; without it,
building the parser fails with "Failed to infer device type" (the parser's defaults construct a
DeviceConfig). The parser is the one `vllm serve` uses (`make_arg_parser` on a
`FlexibleArgumentParser`), walked action by action; nothing of vLLM's code is copied, only the
option strings, whether each takes a value, and their choices.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import typing
from typing import Any


def _vllm(module: str) -> Any:
    """A vLLM module; imported by name because only the script's own virtualenv has vLLM."""
    return importlib.import_module(module)


def _serve_parser() -> Any:
    make_arg_parser = _vllm("vllm.entrypoints.common.cli_args").make_arg_parser
    parser_class = _vllm("vllm.utils.argparse_utils").FlexibleArgumentParser
    return make_arg_parser(parser_class(prog="vllm serve"))


def _literal_values(tp: Any) -> list[str]:
    """Flatten a (nested) typing.Literal into its string values."""
    values: list[str] = []
    for arg in typing.get_args(tp):
        if typing.get_origin(arg) is typing.Literal:
            values += _literal_values(arg)
        else:
            values.append(str(arg))
    return values


def _choices(action: argparse.Action) -> list[str] | None:
    """argparse's own choices, or the list vLLM puts in the metavar of Literal-typed fields
    (e.g. `--kv-cache-dtype`), which its config validates after parsing."""
    if action.choices:
        return sorted(str(c) for c in action.choices)
    if isinstance(action.metavar, (list, tuple)):
        return sorted(str(c) for c in action.metavar)
    return None


def dump() -> dict[str, Any]:
    speculative_method = _vllm("vllm.config.speculative").SpeculativeMethod
    factory = _vllm("vllm.distributed.kv_transfer.kv_connector.factory").KVConnectorFactory
    quantizations = _vllm("vllm.model_executor.layers.quantization").QUANTIZATION_METHODS
    options: dict[str, dict[str, Any]] = {}
    # _option_string_actions, not each action's option_strings: vLLM registers hidden spellings
    # there too (`--no-enable-x` beside `--enable-x`/`--disable-x`).
    for option, action in _serve_parser()._option_string_actions.items():
        options[option] = {
            "dest": action.dest,
            "takes_value": action.nargs != 0,
            "nargs": action.nargs if isinstance(action.nargs, (int, str)) else None,
            "choices": _choices(action),
        }
    return {
        "vllm_version": _vllm("vllm").__version__,
        "source": (
            "the argparse parser of `vllm serve` (vllm.entrypoints.common.cli_args.make_arg_parser "
            "on FlexibleArgumentParser), built by the real vLLM package with "
            "VLLM_TARGET_DEVICE=cpu; regenerate with runtime_image/scripts/vllm_cli_fixture.py"
        ),
        "installed_as": (
            "the vllm 0.33.0 wheel from PyPI in its own virtualenv (uv pip install, certifi "
            "overridden to 2026.10.18: vllm asks for >=2026.10.19, which the index lacked); "
            "no GPU, so vLLM's CPU platform (VLLM_TARGET_DEVICE=cpu) built the parser"
        ),
        "preprocessing": (
            "FlexibleArgumentParser rewrites `--a_b` to `--a-b` and `-O<n>`/`-O <n>` to "
            "`--optimization-level <n>` before parsing"
        ),
        "options": dict(sorted(options.items())),
        "kv_connectors": sorted(factory._registry),
        "speculative_methods": sorted(_literal_values(speculative_method)),
        "quantization_methods": sorted(quantizations),
    }


def _validate_configs(namespace: argparse.Namespace) -> None:
    """Build the config objects vLLM builds from the values the parser only reads as text or
    JSON (KV transfer, KV-cache dtype); raises on a value vLLM's own validation refuses."""
    config = _vllm("vllm.config")
    transfer = namespace.kv_transfer_config
    if isinstance(transfer, dict):
        config.KVTransferConfig(**transfer)
    if namespace.kv_cache_dtype is not None:
        config.CacheConfig(cache_dtype=namespace.kv_cache_dtype)


def check(path: str) -> int:
    """Parse each argument list with the real parser and validate its config values; 0 when
    every one is accepted."""
    parser = _serve_parser()
    failures = 0
    with open(path) as handle:
        argvs = json.load(handle)
    for argv in argvs:
        args = [a for a in argv if a != "serve"][1:] if argv[:1] == ["vllm"] else argv
        try:
            _validate_configs(parser.parse_args(args))
        except (SystemExit, ValueError) as error:
            failures += 1
            print("REJECTED", json.dumps(argv), type(error).__name__)
        else:
            print("ok", json.dumps(argv))
    return 1 if failures else 0


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--check", metavar="ARGVS_JSON", help="parse these argument lists instead")
    ns = cli.parse_args()
    if ns.check:
        sys.exit(check(ns.check))
    json.dump(dump(), sys.stdout, indent=1)
    sys.stdout.write("\n")
