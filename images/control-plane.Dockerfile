# syntax=docker/dockerfile:1
# llmfleet's control-plane image: `llmfleet operator|gateway|autoscaler`, what the chart runs.
#
#   docker build -f images/control-plane.Dockerfile -t ghcr.io/llmfleet/llmfleet:<version> .
#
# From the repository root (the build context). The same image as `llmfleet images build
# control-plane` (CONTROL_PLANE in core/llmfleet/core/images/recipe.py): tests/images checks
# that this file says what the recipe says. Runs as 10001:10001 with a read-only root
# filesystem; /tmp must be a volume (the chart mounts an emptyDir there). No local tooling
# (core's cluster/, local/ and images/) and no simulator (autoscaler/…/sim/).
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --gid 10001 llmfleet \
    && useradd --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin llmfleet
# A venv without pip of its own: pip runs from Debian's bundled wheel.
RUN python3 -m venv --without-pip /opt/llmfleet
# pyproject.toml's dependencies, as written there.
RUN wheel=$(ls /usr/share/python-wheels/pip-*.whl) \
    && /opt/llmfleet/bin/python "$wheel/pip" install --no-cache-dir --no-compile \
        'typer>=0.12' \
        'rich>=13' \
        'pydantic>=2.7' \
        'pydantic-settings>=2.3' \
        'pyyaml>=6' \
        'kubernetes>=30' \
        'kopf>=1.45' \
        'prometheus-client>=0.20' \
        'httpx>=0.27' \
        'starlette>=0.37' \
        'uvicorn>=0.30' \
        'fastapi>=0.110' \
        'uvicorn[standard]>=0.30' \
        'aiohttp>=3.10' \
        'msgspec>=0.19' \
        'orjson>=3.10' \
        'requests>=2.31'
COPY pyproject.toml /src/
COPY README.md /src/
COPY core/llmfleet/core/*.py /src/core/llmfleet/core/
COPY crds/llmfleet /src/crds/llmfleet/
COPY operator/llmfleet /src/operator/llmfleet/
COPY gateway/llmfleet /src/gateway/llmfleet/
COPY autoscaler/llmfleet/autoscaler/*.py /src/autoscaler/llmfleet/autoscaler/
COPY runtime_image/llmfleet/runtime /src/runtime_image/llmfleet/runtime/
RUN wheel=$(ls /usr/share/python-wheels/pip-*.whl) \
    && /opt/llmfleet/bin/python "$wheel/pip" install --no-cache-dir --no-compile --no-deps /src \
    && rm -rf /src \
    && /opt/llmfleet/bin/python -m compileall -q --invalidation-mode unchecked-hash /opt/llmfleet/lib
USER 10001:10001
ENV PATH=/opt/llmfleet/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /
# The gateway's API, then the operator's and the autoscaler's /metrics.
EXPOSE 8080 8081 8082
ENTRYPOINT ["llmfleet"]
CMD ["--help"]
