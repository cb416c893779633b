#!/usr/bin/env bash
# Every test Hindsight has: formatting, lints, unit, integration and
# end-to-end tests (which start the real binary, a Kafka-protocol broker and
# Prometheus on loopback ports), the official Python client and schemathesis
# against a live server, and the deployment's configuration checks.
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
echo "== ScyllaDB conformance suite (against a node when HINDSIGHT_SCYLLA_NODES is set)"
cargo test --locked -p hindsight-scylla --test conformance -- --nocapture 2>&1 | grep -E "SKIPPED|test result"
echo "== compose and Prometheus configuration"
docker-compose -f compose/docker-compose.yml config -q && echo "compose/docker-compose.yml: valid"
promtool check config compose/prometheus/prometheus.yml
promtool check rules compose/prometheus/alerts.yml
echo "== official Python client and schemathesis against a live server"
tests/sdk/run.sh
