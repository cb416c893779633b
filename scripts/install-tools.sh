#!/usr/bin/env bash
# Installs the tools the tests need, reusing any already installed at the
# right version:
# - tansu 0.6.0, a Kafka-protocol broker (built from crates.io; about 15
#   minutes the first time on 2 cores);
# - Debian's prometheus (prometheus, promtool) and docker-compose (to
#   validate compose/docker-compose.yml without a Docker engine).
set -euo pipefail

missing=()
command -v promtool >/dev/null && command -v prometheus >/dev/null || missing+=(prometheus)
command -v docker-compose >/dev/null || missing+=(docker-compose)
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]} (Debian packages)"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

TANSU_VERSION=0.6.0
if ! cargo install --list | grep -q "^tansu v$TANSU_VERSION:"; then
  echo "== installing tansu $TANSU_VERSION (once; about 15 minutes)"
  CARGO_TARGET_DIR="$HOME/.cache/tansu-target" \
    cargo install tansu --version "$TANSU_VERSION" --locked --no-default-features --features libsql
fi
export PATH="$HOME/.cargo/bin:$PATH"
command -v tansu >/dev/null || { echo "tansu is not on PATH after installation"; exit 1; }
