"""Reading a draining engine's in-flight requests from its metrics, against a real HTTP server
(the counting itself: tests/unit/test_vllm_metrics.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from llmfleet.operator.inflight import probe_in_flight

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 2.0
vllm:num_requests_waiting_by_reason{reason="capacity"} 7.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.4
"""


@pytest.fixture
def engine() -> Iterator[int]:
    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = VLLM_METRICS.encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_probe_reads_a_real_endpoint(engine: int) -> None:
    assert probe_in_flight("127.0.0.1", engine) == 5


def test_an_unreachable_engine_is_unknown() -> None:
    # Port 9 (discard) on loopback: nothing listens, the connection is refused.
    assert probe_in_flight("127.0.0.1", 9, timeout=0.2) is None
