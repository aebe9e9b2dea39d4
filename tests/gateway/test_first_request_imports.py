"""Nothing is imported on the event loop by a gateway's first requests: a module imported there
holds every request in flight (anyio's asyncio backend, imported by the first streamed answer's
task group, held it 15-35 ms at 1,000 x 10: bench/_stall_probe.py). Run in a fresh interpreter,
as the modules this test process has imported already would hide it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
import httpx
from llmfleet.gateway.discovery import Pool, Service, StaticDiscovery
from tests.gateway.servers import ThreadServer, gateway
from tests.gateway.standin import StandIn

imported, watching = [], [False]
sys.addaudithook(lambda event, args: imported.append(args[0])
                 if watching[0] and event == "import" else None)
message = {"role": "user", "content": "hi"}
with ThreadServer(StandIn("engine").app()) as engine:
    pool = Pool("unified", (engine.url,))
    discovery = StaticDiscovery({"m": Service("m", "ns", "m", {"unified": pool})})
    with gateway(discovery) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.get("/readyz").status_code == 200
        watching[0] = True
        answers = [client.post("/v1/chat/completions", json={"model": "m", **extra,
                                                             "messages": [message]})
                   for extra in ({}, {"stream": True})]
        watching[0] = False
print(json.dumps({"statuses": [a.status_code for a in answers],
                  "imported": sorted(set(imported))}))
"""


def test_first_plain_and_streamed_requests_import_nothing() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["statuses"] == [200, 200]
    assert found["imported"] == []
