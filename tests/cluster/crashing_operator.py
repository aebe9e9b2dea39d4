"""`python -m tests.cluster.crashing_operator operator [-n NS …] [--standalone]`: the operator
as `llmfleet operator` runs it, but the process dies (exit status 137, as a SIGKILL leaves it)
in its first pass that gets past applying the children, before that pass writes status
(`reconcile.BeforeStatus`, the reconciler's test seam). What a crash at the worst moment looks
like to the next operator (`tests/cluster/test_operator.py`)."""

from __future__ import annotations

import argparse
import logging
import os

from llmfleet.operator.cli import serve

KILLED = 137

log = logging.getLogger("llmfleet.operator")


def die_before_status(namespace: str, name: str) -> None:
    log.error("%s/%s: fault injected: exiting before writing status", namespace, name)
    logging.shutdown()
    os._exit(KILLED)


def main() -> None:
    parser = argparse.ArgumentParser(prog="crashing_operator")
    parser.add_argument("command", choices=["operator"])
    parser.add_argument("-n", "--namespace", action="append")
    parser.add_argument("--standalone", action="store_true")
    args = parser.parse_args()
    serve(args.namespace, None, standalone=args.standalone, before_status=die_before_status)


if __name__ == "__main__":
    main()
