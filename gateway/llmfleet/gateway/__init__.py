"""The OpenAI-compatible gateway: discovery, routing, P/D orchestration (issue 5)."""
