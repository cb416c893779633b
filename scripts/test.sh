#!/usr/bin/env bash
# Every test Hindsight has: formatting, lints, unit, integration and
# end-to-end tests (which start the real binary on loopback ports).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

scripts/install-tools.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --workspace --locked
echo "== official Python client and schemathesis against a live server"
tests/sdk/run.sh
