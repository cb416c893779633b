#!/usr/bin/env bash
# Runs the official Python client (tests/sdk/check_official_client.py) and
# schemathesis (over the dataset and configuration in tests/sdk/schemathesis/)
# against a live `hindsight dev` on a loopback port, and prints how many
# cases schemathesis ran on each operation and what they were answered.
#
# Python packages live in a virtualenv reused across runs
# ($HINDSIGHT_VENV, default ~/.cache/hindsight-venv).
set -euo pipefail
cd "$(dirname "$0")/../.."
# This check runs the embedded deployment: the engine addresses that
# scripts/test.sh exports would send `keys create` to Cassandra.
unset HINDSIGHT_KAFKA_BROKERS HINDSIGHT_SCYLLA_NODES

target="${CARGO_TARGET_DIR:-target}"
cargo build --locked --quiet --bin hindsight
bin="$target/debug/hindsight"

venv="${HINDSIGHT_VENV:-$HOME/.cache/hindsight-venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/sdk/requirements.txt

work="$(mktemp -d)"
server=""
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

cat > "$work/plans.json" <<'JSON'
{"tiny": {"requests_per_minute": 3, "granularity_allowed": "1m", "max_history_days": 36500,
          "metrics": true, "prices": true, "books": true, "before_coverage": true}}
JSON
export HINDSIGHT_KEY_ENTERPRISE="hsk_sdk_check_enterprise_$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
export HINDSIGHT_INGEST_TOKEN="hsi_sdk_check_$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
HINDSIGHT_DEMO_API_KEY="$HINDSIGHT_KEY_ENTERPRISE" HINDSIGHT_LOG=warn \
  "$bin" dev --no-demo --listen 127.0.0.1:0 --data-dir "$work/data" --plans-file "$work/plans.json" \
  > "$work/dev.out" 2> "$work/dev.err" &
server=$!
for _ in $(seq 1 200); do
  url="$(awk '$1 == "API" { sub("/v1$", "", $2); print $2; exit }' "$work/dev.out")"
  [ -n "$url" ] && break
  sleep 0.1
done
[ -n "$url" ] || { echo "hindsight dev did not start"; cat "$work/dev.err"; exit 1; }
export HINDSIGHT_URL="$url"
export HINDSIGHT_KEY_FREE="$("$bin" keys create --data-dir "$work/data" --org sdk --plan free 2>/dev/null)"
export HINDSIGHT_KEY_TINY="$("$bin" keys create --data-dir "$work/data" --plans-file "$work/plans.json" --org sdk --plan tiny 2>/dev/null)"

echo "== official client (polymarketdata-sdk) against $url"
"$venv/bin/python" tests/sdk/check_official_client.py

echo "== schemathesis against $url/openapi.json"
# Known data first: tests/sdk/schemathesis/schemathesis.toml draws path ids,
# filters and time ranges from the ids and times of dataset.ndjson, so that
# generated requests reach the detail and history handlers with data.
st=tests/sdk/schemathesis
"$venv/bin/python" "$st/support.py" seed "$url" "$st/dataset.ndjson"
# No 5xx and no response that violates the document. (Schema-valid requests
# may still be refused: the document cannot express start_ts <= end_ts.)
status=0
"$venv/bin/schemathesis" --config-file "$st/schemathesis.toml" run "$url/openapi.json" \
  --header "X-API-Key: $HINDSIGHT_KEY_ENTERPRISE" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance \
  --max-examples 100 --generation-deterministic --no-color \
  --report ndjson --report-ndjson-path "$work/schemathesis.ndjson" || status=$?
echo "== schemathesis coverage: cases per operation"
"$venv/bin/python" "$st/support.py" report "$work/schemathesis.ndjson" api/openapi.json || status=1
exit "$status"
