"""Write every argument list of the launcher's table to a JSON file (an array of arrays), to be
parsed by the real vLLM parser: `python -m tests.runtime.dump_argvs /tmp/argvs.json`, then
`runtime_image/scripts/vllm_cli_fixture.py --check /tmp/argvs.json` (see that script)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from llmfleet.runtime.args import plan_engine
from tests.runtime.cases import CASES
from tests.runtime.helpers import config_of, gpu_of


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m tests.runtime.dump_argvs FILE")
    argvs = [plan_engine(config_of(c.config), gpu_of(c.gpu), pod_ip="10.0.0.7").argv for c in CASES]
    Path(sys.argv[1]).write_text(json.dumps(argvs, indent=1))


if __name__ == "__main__":
    main()
