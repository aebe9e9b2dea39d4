"""Benchmark: what validating one InferenceService spec costs, this checkout beside `--baseline`
(issue 28).

    .venv/bin/python bench/spec_validation.py [--services 1000] [--rounds 5] [--baseline REV]

The gateway's discovery thread validates each service's spec once per generation (`from_objects
.Specs`): 1,000 at once when a replica starts, one per change after that. The thread holds the
GIL meanwhile, which the event loop then waits for, so a validation's cost is loop lag.

Each revision's process (this checkout, and `--baseline`'s source roots with PYTHONPATH as
`_support.checkout` gives them) validates, as `Specs.parse` does, `--services` specs of three
fleets, a round at a time, and reports the median milliseconds per spec over the rounds:
- "alike": the fleet of `control_plane_scale.py` (one model each, nothing else set);
- "samples": the repository's sample services (e2e/samples, the local system's, the cluster
  tests'), each copied under new names until there are `--services`: the rules' mix of fields;
- "each its own args": every spec sets extraArgs and a typed field that no other spec has, so
  nothing made for one spec can be reused for another (a fleet with no two services alike).
Compare within the run.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from _support import REPO, checkout, worker

SAMPLES = ("e2e/samples", "core/llmfleet/core/local/samples", "tests/cluster/samples")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", help="a commit to measure beside this checkout")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args()


def samples() -> list[dict[str, Any]]:
    """The specs of every InferenceService in the sample manifests."""
    found = []
    for folder in SAMPLES:
        for path in sorted((REPO / folder).glob("*.yaml")):
            for document in yaml.safe_load_all(path.read_text()):
                if isinstance(document, dict) and document.get("kind") == "InferenceService":
                    found.append(document["spec"])
    return found


def fleets(count: int) -> dict[str, list[dict[str, Any]]]:
    """Fleet name -> `count` specs (see the module's docstring)."""
    alike = [{"model": {"name": f"org/model-{i}"}, "topology": {"unified": {"replicas": 10}}}
             for i in range(count)]  # fmt: skip
    found = samples()
    mixed = []
    for i in range(count):
        spec = copy.deepcopy(found[i % len(found)])
        spec["model"]["servedName"] = f"model-{i}"
        mixed.append(spec)
    own = [{"model": {"name": f"org/model-{i}"},
            "runtime": {"maxNumSeqs": 8 + i, "extraArgs": ["--max-num-batched-tokens",
                                                            str(8192 + i), "--seed", str(i)]},
            "topology": {"unified": {"replicas": 2}}}
           for i in range(count)]  # fmt: skip
    return {"alike": alike, "samples": mixed, "each its own args": own}


def measure(args: argparse.Namespace) -> dict[str, float]:
    """In this process: the median ms per spec of each fleet."""
    from llmfleet.crds.inference_service import InferenceService  # noqa: PLC0415 (revision's)

    def validate(spec: dict[str, Any]) -> None:
        InferenceService.model_validate({"metadata": {}, "spec": spec})

    result = {}
    for name, specs in fleets(args.services).items():
        for spec in specs[:20]:  # imports, schema caches
            validate(spec)
        rounds = []
        for _ in range(args.rounds):
            started = time.perf_counter()
            for spec in specs:
                validate(spec)
            rounds.append((time.perf_counter() - started) / len(specs) * 1000)
        result[name] = statistics.median(rounds)
    return result


def run(args: argparse.Namespace, source: Path | None) -> dict[str, float]:
    command = [__file__, "--worker", "--services", str(args.services), "--rounds", str(args.rounds)]
    return dict(worker(command, source))


def main() -> None:
    args = parse_args()
    if args.worker:
        print(json.dumps(measure(args)))
        return
    with tempfile.TemporaryDirectory() as work:
        revisions: dict[str, Path | None] = {"this checkout": None}
        if args.baseline:
            revisions[f"@{args.baseline}"] = checkout(args.baseline, Path(work) / "b")
        results = {name: run(args, source) for name, source in revisions.items()}
    print(f"{args.services} specs a fleet, median of {args.rounds} rounds; ms per spec validated")
    names = list(results)
    print(f"{'fleet':<22}" + "".join(f"{name:>18}" for name in names))
    for fleet in results[names[0]]:
        print(f"{fleet:<22}" + "".join(f"{results[n][fleet]:>18.3f}" for n in names))
    if len(names) > 1:
        print("ratio (baseline / this checkout): " + ", ".join(
            f"{fleet} {results[names[1]][fleet] / results[names[0]][fleet]:.1f}x"
            for fleet in results[names[0]]))  # fmt: skip


if __name__ == "__main__":
    main()
