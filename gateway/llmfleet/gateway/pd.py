"""Disaggregated serving: prefill on one engine, decode on another (vLLM's NixlConnector proxy).

The protocol (vLLM `tests/v1/kv_connector/nixl_integration/toy_proxy_server.py`):
1. Send the request to a prefill engine with `max_tokens: 1`, `stream: false`, no
   `stream_options`, and `kv_transfer_params: {"do_remote_decode": true, "do_remote_prefill":
   false, "remote_engine_id": null, "remote_block_ids": null, "remote_host": null,
   "remote_port": null}`. The engine computes the KV cache, keeps it for pickup and answers with
   `kv_transfer_params` saying where it is (engine id, block ids, host, port).
2. Send the client's original request to a decode engine with those `kv_transfer_params`; it
   pulls the KV blocks over NIXL and generates. Its response (streamed or not) goes to the client.

Both bodies are the client's bytes with the changed fields appended (`openai_request.spliced`:
`stream_options` is set to null rather than removed), never a re-encoded copy.

Without prefill endpoints the request goes to the decode pool alone (its engines run `kv_both`
and can prefill themselves); without decode endpoints the answer is 503.
"""

from __future__ import annotations

from typing import Any

from llmfleet.gateway.discovery import Pool
from llmfleet.gateway.errors import error_response
from llmfleet.gateway.openai_request import spliced
from llmfleet.gateway.proxy import Call, Failure, Forwarder

PREFILL_KV_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


PREFILL_FIELDS: dict[str, Any] = {
    "max_tokens": 1,
    "max_completion_tokens": 1,
    "stream": False,
    "stream_options": None,
    "kv_transfer_params": PREFILL_KV_PARAMS,
}
"""What the prefill step changes in the client's body: one token, no stream, keep the KV."""


def prefill_body(raw: bytes) -> bytes:
    """The prefill step's request: the client's body with `PREFILL_FIELDS` spliced in."""
    return spliced(raw, PREFILL_FIELDS)


def decode_body(raw: bytes, kv_transfer_params: dict[str, Any]) -> bytes:
    """The decode step's request: the client's body with the prefill's `kv_transfer_params`."""
    return spliced(raw, {"kv_transfer_params": kv_transfer_params})


async def serve_disaggregated(forwarder: Forwarder, call: Call, raw: bytes) -> Any:
    """Run both steps; returns the client's response (streamed from the decode engine)."""
    pools = call.service.pools
    decode = pools.get("decode")
    if decode is None or not decode.endpoints:
        raise Failure(
            error_response(
                503,
                f"model {call.service.model!r} has no serving decode endpoint",
                code="no_endpoint",
            ),
            "unavailable",
        )
    prefill: Pool | None = pools.get("prefill")
    if prefill is None or not prefill.endpoints:
        opened = await forwarder.open(call, decode, raw)
        return await forwarder.relay(call, opened, {"x-llmfleet-prefill-endpoint": "none"})
    prefilled = await forwarder.open(call, prefill, prefill_body(raw))
    answer = await forwarder.read_json(call, prefilled)
    params = answer.get("kv_transfer_params")
    status = prefilled.response.status_code
    if status != 200 or not isinstance(params, dict):
        error = answer.get("error")
        detail = f": {error.get('message')}" if isinstance(error, dict) else ""
        raise Failure(
            error_response(
                status if 400 <= status < 500 else 502,
                f"the prefill engine at {prefilled.url} answered {status} without "
                f"kv_transfer_params{detail} (is its kv-transfer-config a NixlConnector?)",
                code="prefill_failed",
            ),
            "upstream_error",
        )
    opened = await forwarder.open(call, decode, decode_body(raw, params))
    return await forwarder.relay(call, opened, {"x-llmfleet-prefill-endpoint": prefilled.url})
