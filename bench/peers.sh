#!/usr/bin/env bash
# The peers and tools bench/gateway_overhead.py compares against, pinned, outside the project's
# venv (`make bench-peers` runs this; a second run only checks and skips what is there):
#   ~/.cache/llmfleet/bench-peers/vllm-router/   PyPI vllm-router (vLLM's Rust router)
#   ~/.cache/llmfleet/bench-peers/litellm/       PyPI litellm[proxy] (LiteLLM's proxy server)
#   ~/.cache/llmfleet/bench-peers/py-spy/        PyPI py-spy (the --profile flame graphs)
#   ~/.cache/llmfleet/bin/oha                    crates.io oha (closed-loop load generator)
# Each peer gets a venv of its own, so none of their dependencies reaches the project's.
# A peer that does not install is reported and skipped; the benchmark prints "n/a" for it.
set -uo pipefail

VLLM_ROUTER_VERSION=0.1.17
# litellm[proxy] 1.108.9 and later (1.108.9, .10, .13, 1.109.3, 1.110.2 tried) pin releases of
# litellm-proxy, litellm-proxy-extras or litellm-enterprise that the package index does not
# serve, so pip cannot install them; 1.108.6 resolves.
LITELLM_VERSION=1.108.6
PY_SPY_VERSION=0.4.3
OHA_VERSION=1.16.0

CACHE="${LLMFLEET_CACHE_DIR:-$HOME/.cache/llmfleet}"
PEERS="$CACHE/bench-peers"
PYTHON="${PYTHON:-python3}"
mkdir -p "$PEERS" "$CACHE/bin"
failed=()

step() { echo "bench-peers: $*"; }

# pip_peer NAME REQUIREMENT DIST VERSION: a venv at $PEERS/NAME with REQUIREMENT installed,
# unless DIST==VERSION is already there.
pip_peer() {
  local name=$1 requirement=$2 dist=$3 version=$4 venv="$PEERS/$1"
  if [ -x "$venv/bin/python" ] && \
     [ "$("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('$dist'))" 2>/dev/null)" = "$version" ]; then
    step "$name $version already in $venv"
    return
  fi
  step "installing $requirement into $venv"
  if "$PYTHON" -m venv "$venv" && "$venv/bin/pip" install --quiet --upgrade pip && \
     "$venv/bin/pip" install --progress-bar off "$requirement"; then
    step "$name $version installed"
  else
    step "FAILED: $requirement (the benchmark will print n/a for it)"
    failed+=("$name")
  fi
}

pip_peer vllm-router "vllm-router==$VLLM_ROUTER_VERSION" vllm-router "$VLLM_ROUTER_VERSION"
pip_peer litellm "litellm[proxy]==$LITELLM_VERSION" litellm "$LITELLM_VERSION"
pip_peer py-spy "py-spy==$PY_SPY_VERSION" py-spy "$PY_SPY_VERSION"

if [ "$("$CACHE/bin/oha" --version 2>/dev/null)" = "oha $OHA_VERSION" ]; then
  step "oha $OHA_VERSION already in $CACHE/bin"
elif ! command -v cargo >/dev/null; then
  step "FAILED: oha needs cargo (Rust), which this machine lacks"
  failed+=(oha)
else
  step "building oha $OHA_VERSION with cargo into $CACHE/bin (a few minutes on 2 cores)"
  if cargo install --locked --quiet --root "$CACHE" --version "$OHA_VERSION" oha; then
    step "oha $OHA_VERSION installed"
  else
    step "FAILED: cargo install oha $OHA_VERSION"
    failed+=(oha)
  fi
fi

if [ ${#failed[@]} -gt 0 ]; then
  step "not installed: ${failed[*]}"
  exit 1
fi
step "all peers ready under $PEERS and $CACHE/bin"
