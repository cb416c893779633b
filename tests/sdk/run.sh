#!/usr/bin/env bash
# Runs the official Python client (tests/sdk/check_official_client.py) and
# schemathesis (over the dataset and configuration in tests/sdk/schemathesis/)
# against a live Hindsight on loopback ports, and prints how many cases
# schemathesis ran on each operation and what they were answered. In one of
# two deployments:
#
#   tests/sdk/run.sh embedded      `hindsight dev`: one process, local files
#   tests/sdk/run.sh distributed   every service its own process on the real
#                                  engines: two ingest replicas, two projectors
#                                  in one consumer group, two API replicas over
#                                  Kafka (HINDSIGHT_KAFKA_BROKERS) and a CQL
#                                  store (HINDSIGHT_SCYLLA_NODES)
#
# In the distributed deployment the client seeds through one ingest replica
# and reads through one API replica while schemathesis probes the other, so
# keys, plans and rate limits must hold across replicas; schemathesis's
# dataset goes through the other ingest replica.
#
# Python packages live in a virtualenv reused across runs
# ($HINDSIGHT_VENV, default ~/.cache/hindsight-venv).
set -euo pipefail
cd "$(dirname "$0")/../.."
deployment="${1:-embedded}"

target="${CARGO_TARGET_DIR:-target}"
cargo build --locked --quiet --bin hindsight
bin="$target/debug/hindsight"

venv="${HINDSIGHT_VENV:-$HOME/.cache/hindsight-venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/sdk/requirements.txt

work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

cat > "$work/plans.json" <<'JSON'
{"tiny": {"requests_per_minute": 3, "granularity_allowed": "1m", "max_history_days": 36500,
          "metrics": true, "prices": true, "books": true, "before_coverage": true}}
JSON
export HINDSIGHT_PLANS_FILE="$work/plans.json"
export HINDSIGHT_INGEST_TOKEN="hsi_sdk_check_$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
export HINDSIGHT_LOG=warn

# The address a service prints in its "listening on http://…" line.
listening() {
  local log="$1" url=""
  for _ in $(seq 1 300); do
    url="$(grep -o 'listening on http://[0-9.:]*' "$log" 2>/dev/null | head -1 | sed 's/listening on //')" || true
    [ -n "$url" ] && { echo "$url"; return; }
    sleep 0.1
  done
  echo "no service started; its log ($log):" >&2
  cat "$log" >&2
  exit 1
}

case "$deployment" in
embedded)
  # The engine addresses scripts/test.sh exports would send `keys create`
  # to Cassandra.
  unset HINDSIGHT_KAFKA_BROKERS HINDSIGHT_SCYLLA_NODES
  backend=(--data-dir "$work/data")
  export HINDSIGHT_KEY_ENTERPRISE="hsk_sdk_check_enterprise_$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
  HINDSIGHT_DEMO_API_KEY="$HINDSIGHT_KEY_ENTERPRISE" \
    "$bin" dev --no-demo --listen 127.0.0.1:0 "${backend[@]}" > "$work/dev.out" 2> "$work/dev.err" &
  pids+=($!)
  # The shell may reach the first read before the background process has
  # opened dev.out: a missing file is "not yet", not a failure.
  for _ in $(seq 1 300); do
    api_url="$(awk '$1 == "API" { sub("/v1$", "", $2); print $2; exit }' "$work/dev.out" 2>/dev/null)" || true
    [ -n "$api_url" ] && break
    sleep 0.1
  done
  [ -n "$api_url" ] || { echo "hindsight dev did not start"; cat "$work/dev.err"; exit 1; }
  export HINDSIGHT_URL="$api_url" HINDSIGHT_INGEST_URL="$api_url"
  probe_url="$api_url" seed_ingest_url="$api_url"
  ;;
distributed)
  : "${HINDSIGHT_KAFKA_BROKERS:?start the engines first: eval \"\$(scripts/engines.sh start)\"}"
  : "${HINDSIGHT_SCYLLA_NODES:?start the engines first: eval \"\$(scripts/engines.sh start)\"}"
  run="sdk_$$_$(date +%s)"
  # Both API replicas sign and check cursors with one secret.
  export HINDSIGHT_CURSOR_SECRET="sdk_check_cursor_secret_$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')"
  kafka=(--kafka-brokers "$HINDSIGHT_KAFKA_BROKERS" --kafka-topic-prefix "$run")
  cql=(--scylla-nodes "$HINDSIGHT_SCYLLA_NODES" --scylla-keyspace "$run" --scylla-consistency ONE)
  backend=(--data-dir "$work/keys" "${cql[@]}")
  "$bin" kafka init "${kafka[@]}" --kafka-partitions 4 > /dev/null
  "$bin" scylla migrate "${cql[@]}" \
    --scylla-replication "{'class': 'SimpleStrategy', 'replication_factor': 1}" > /dev/null
  for i in 0 1; do
    # Ingest checks lines against the catalog in the CQL store.
    HINDSIGHT_LOG=warn,hindsight::lifecycle=info "$bin" ingest --listen 127.0.0.1:0 "${kafka[@]}" \
      "${cql[@]}" --data-dir "$work/ingest-$i" 2> "$work/ingest-$i.err" &
    pids+=($!)
    "$bin" projector --metrics-listen 127.0.0.1:0 "${kafka[@]}" --kafka-group "$run-projector" \
      --kafka-instance-id "projector-$i" "${cql[@]}" --data-dir "$work/projector-$i" \
      2> "$work/projector-$i.err" &
    pids+=($!)
    HINDSIGHT_LOG=warn,hindsight::lifecycle=info "$bin" api --listen 127.0.0.1:0 "${cql[@]}" \
      --data-dir "$work/api-$i" 2> "$work/api-$i.err" &
    pids+=($!)
  done
  # Plain assignments, so that a service that did not start ends the run.
  HINDSIGHT_INGEST_URL="$(listening "$work/ingest-1.err")"
  seed_ingest_url="$(listening "$work/ingest-0.err")"
  HINDSIGHT_URL="$(listening "$work/api-0.err")"
  probe_url="$(listening "$work/api-1.err")"
  export HINDSIGHT_INGEST_URL HINDSIGHT_URL
  HINDSIGHT_KEY_ENTERPRISE="$("$bin" keys create "${backend[@]}" --org sdk --plan enterprise 2>/dev/null)"
  export HINDSIGHT_KEY_ENTERPRISE
  ;;
*)
  echo "usage: tests/sdk/run.sh embedded|distributed" >&2
  exit 2
  ;;
esac
export HINDSIGHT_KEY_FREE="$("$bin" keys create "${backend[@]}" --org sdk --plan free 2>/dev/null)"
export HINDSIGHT_KEY_TINY="$("$bin" keys create "${backend[@]}" --org sdk --plan tiny 2>/dev/null)"

echo "== official client (polymarketdata-sdk), $deployment deployment: API $HINDSIGHT_URL, ingest $HINDSIGHT_INGEST_URL"
"$venv/bin/python" tests/sdk/check_official_client.py

echo "== schemathesis, $deployment deployment, against $probe_url/openapi.json"
# Known data first: tests/sdk/schemathesis/schemathesis.toml draws path ids,
# filters and time ranges from the ids and times of dataset.ndjson, so that
# generated requests reach the detail and history handlers with data. Fed
# through ingest, and served by the API replica schemathesis probes.
st=tests/sdk/schemathesis
"$venv/bin/python" "$st/support.py" seed "$seed_ingest_url" "$probe_url" "$st/dataset.ndjson"
echo "== bulk exports, $deployment deployment: Parquet (read with pyarrow) and CSV against the pages"
"$venv/bin/python" "$st/support.py" exports "$probe_url" "$st/dataset.ndjson"
# No 5xx and no response that violates the document. (Schema-valid requests
# may still be refused: the document cannot express start_ts <= end_ts.)
status=0
# $st/hooks.py: rules of the API the document cannot state (one of two
# parameters), which generated requests then follow. Run in the work
# directory, where schemathesis and Hypothesis keep what they learn
# (`.schemathesis/`, `.hypothesis/`): each run starts from nothing, as on a
# fresh clone, and the directory goes with the run.
(cd "$work" && SCHEMATHESIS_HOOKS=hooks PYTHONPATH="$OLDPWD/$st" \
  "$venv/bin/schemathesis" --config-file "$OLDPWD/$st/schemathesis.toml" run "$probe_url/openapi.json" \
  --header "X-API-Key: $HINDSIGHT_KEY_ENTERPRISE" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance \
  --max-examples 100 --generation-deterministic --no-color \
  --report ndjson --report-ndjson-path "$work/schemathesis.ndjson") || status=$?
echo "== schemathesis coverage, $deployment deployment: cases per operation"
"$venv/bin/python" "$st/support.py" report "$work/schemathesis.ndjson" api/openapi.json || status=1
exit "$status"
