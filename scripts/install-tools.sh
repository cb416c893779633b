#!/usr/bin/env bash
# Installs the tools the tests need, reusing any already installed at the
# right version: tansu (a Kafka-protocol broker, built from crates.io; about
# 15 minutes the first time on 2 cores).
set -euo pipefail

TANSU_VERSION=0.6.0
if ! cargo install --list | grep -q "^tansu v$TANSU_VERSION:"; then
  echo "== installing tansu $TANSU_VERSION (once; about 15 minutes)"
  CARGO_TARGET_DIR="$HOME/.cache/tansu-target" \
    cargo install tansu --version "$TANSU_VERSION" --locked --no-default-features --features libsql
fi
export PATH="$HOME/.cargo/bin:$PATH"
command -v tansu >/dev/null || { echo "tansu is not on PATH after installation"; exit 1; }
