#!/usr/bin/env bash
# Bounded load test: `hindsight dev` on loopback serves normal traffic —
# `wrk` on `/v1/health` and, beside it, on a history page — while 200
# slowloris connections (a partial request head, then one byte a second)
# and 20 slow readers run against the same listener. A slow reader asks for
# a large page (200 book snapshots of 1 000 levels a side, ~6 MB of JSON,
# fed through ingest first) and never reads it, so the server holds that
# response until the idle timeout drops the connection. Asserts, and prints:
# - /v1/health p99 under MAX_P99_MS (50) and no error answers;
# - the server's RSS bounded: during the attack at most READER_PAGES_MB_MAX
#   (twice the pages the slow readers hold) above its RSS before (what it
#   keeps after the attack is printed: the allocator may keep freed pages);
# - the slowloris connections dropped by the server (header timeout), and
#   every connection accepted (the attack stays under the listener's
#   512-connection bound).
# Everything is on 127.0.0.1 and every loop ends by a deadline (about
# DURATION + 30 s in all, once the demo history is projected).
#
#   scripts/load-attack.sh            # the debug binary (built if missing)
#   HINDSIGHT_BIN=target/release/hindsight DURATION=30 scripts/load-attack.sh
#
# Needs wrk (Debian package `wrk`, installed by scripts/install-tools.sh),
# curl and python3.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-20}
SLOWLORIS=${SLOWLORIS:-200}
SLOW_READERS=${SLOW_READERS:-20}
WRK_CONNECTIONS=${WRK_CONNECTIONS:-10}
HISTORY_HOURS=${HISTORY_HOURS:-12}
MAX_P99_MS=${MAX_P99_MS:-50}
# Under DURATION: every slowloris connection is dropped at least once, and
# the slow readers' connections (and the pages they pin) within the attack.
HEADER_TIMEOUT_SECS=${HEADER_TIMEOUT_SECS:-10}
IDLE_TIMEOUT_SECS=${IDLE_TIMEOUT_SECS:-10}
BIN=${HINDSIGHT_BIN:-${CARGO_TARGET_DIR:-target}/debug/hindsight}
KEY=hsk_load_test_key_0123456789abcdef0123456789abcdef
export HINDSIGHT_INGEST_TOKEN=hsi_load_test_token_0123456789abcdef

command -v wrk >/dev/null || { echo "wrk is missing: apt-get install wrk" >&2; exit 1; }
[ -x "$BIN" ] || cargo build --locked -p hindsight --bin hindsight

DIR=$(mktemp -d /tmp/hindsight-load.XXXXXX)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
BASE="http://127.0.0.1:$PORT"
SERVER=""
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null && wait "$SERVER" 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT

"$BIN" dev --listen "127.0.0.1:$PORT" --data-dir "$DIR/data" --demo-api-key "$KEY" \
    --demo-history-hours "$HISTORY_HOURS" --http-header-timeout-secs "$HEADER_TIMEOUT_SECS" \
    --http-idle-timeout-secs "$IDLE_TIMEOUT_SECS" >"$DIR/dev.log" 2>&1 &
SERVER=$!

# Ready, with the demo history projected (the normal traffic reads it).
TOKEN=tok-fed-cuts-25bps-december-2026-yes
NOW=$(date +%s)
HISTORY="/v1/tokens/$TOKEN/prices?start_ts=$((NOW - 3600))&end_ts=$NOW&resolution=1m&limit=60"
count_points='import json, sys; print(len(json.load(sys.stdin)["data"]))'
points=0
for _ in $(seq 1 240); do
    points=$(curl -s -H "X-API-Key: $KEY" "$BASE$HISTORY" | python3 -c "$count_points" 2>/dev/null || echo 0)
    [ "$points" -ge 30 ] && break
    sleep 0.5
done
[ "$points" -ge 30 ] || { echo "the demo history was not served in 2 minutes"; tail "$DIR/dev.log"; exit 1; }

# The slow readers' page: 200 snapshots of 1 000 levels a side, in the
# last 200 minutes.
FROM=$((NOW - 12000))
python3 - "$FROM" >"$DIR/deep.ndjson" <<'PY'
import json, sys
start = int(sys.argv[1])
print(json.dumps({"kind": "market", "id": "load-deep", "slug": "load-deep", "status": "open",
                  "tokens": [{"id": "load-deep-yes", "label": "Yes"}]}))
for i in range(200):
    bids = [[round(0.5 - j * 0.0004, 4), 100.0 + j] for j in range(1000)]
    asks = [[round(0.5004 + j * 0.0004, 4), 100.0 + j] for j in range(1000)]
    print(json.dumps({"kind": "book", "market_id": "load-deep", "token_id": "load-deep-yes",
                      "ts": start + 60 * i, "bids": bids, "asks": asks}))
PY
curl -fsS -o /dev/null -H "Authorization: Bearer $HINDSIGHT_INGEST_TOKEN" \
    --data-binary @"$DIR/deep.ndjson" "$BASE/ingest/v1/events"
PAGE="/v1/tokens/load-deep-yes/books?start_ts=$FROM&end_ts=$NOW&resolution=1m&limit=200"
size=0
for _ in $(seq 1 240); do
    size=$(curl -s -o /dev/null -w '%{size_download}' -H "X-API-Key: $KEY" "$BASE$PAGE" || echo 0)
    [ "${size:-0}" -gt 5000000 ] && break
    sleep 0.5
done
[ "${size:-0}" -gt 5000000 ] || { echo "the deep books page was not served (${size} bytes)"; exit 1; }
PAGE_MB=$((size / 1048576 + 1))
READER_PAGES_MB_MAX=${READER_PAGES_MB_MAX:-$((2 * SLOW_READERS * PAGE_MB))}
echo "dev pid $SERVER on $BASE ($BIN); slow readers request $PAGE ($size bytes when read)"

rss_mb() { awk '/VmRSS/ {printf "%d", $2 / 1024}' "/proc/$SERVER/status"; }
sockets() { find "/proc/$SERVER/fd" -lname 'socket:*' 2>/dev/null | wc -l; }
# Warm: the routes once under load, then the RSS everything is measured from.
wrk -t1 -c"$WRK_CONNECTIONS" -d2s -H "X-API-Key: $KEY" "$BASE/v1/health" >/dev/null
wrk -t1 -c2 -d2s -H "X-API-Key: $KEY" "$BASE$HISTORY" >/dev/null
curl -s -o /dev/null -H "X-API-Key: $KEY" "$BASE$PAGE"
RSS_BEFORE=$(rss_mb)

python3 - "$PORT" "$KEY" "$PAGE" "$SLOWLORIS" "$SLOW_READERS" "$((DURATION + 6))" >"$DIR/attack.out" <<'PY' &
import socket, sys, time
port, key, page = int(sys.argv[1]), sys.argv[2], sys.argv[3]
n_loris, n_readers, seconds = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
deadline = time.time() + seconds
dropped = failed = 0

def loris():
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setblocking(False)
    s.send(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-A: ")
    return s

def reader():
    # A small receive buffer, never read: the server's writes stall.
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    s.send(f"GET {page} HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\n\r\n".encode())
    return s

def opened(open_one):
    global failed
    try:
        return open_one()
    except OSError:
        failed += 1
        return None

readers = [opened(reader) for _ in range(n_readers)]
lorises = [opened(loris) for _ in range(n_loris)]
while time.time() < deadline:
    for i, s in enumerate(lorises):
        if s is None:
            lorises[i] = opened(loris)
            continue
        try:
            s.send(b"a")
        except BlockingIOError:
            pass
        except OSError:
            dropped += 1
            s.close()
            lorises[i] = opened(loris)
    time.sleep(1)
print(dropped, failed, flush=True)
PY
ATTACK=$!
PIDS+=("$ATTACK")
# RSS and the server's open sockets, sampled every second while the
# attack runs.
echo "$RSS_BEFORE $(sockets)" >"$DIR/peaks"
(
    rss=0 socks=0
    while kill -0 "$ATTACK" 2>/dev/null; do
        r=$(rss_mb) n=$(sockets)
        [ "$r" -gt "$rss" ] && rss=$r
        [ "$n" -gt "$socks" ] && socks=$n
        echo "$rss $socks" >"$DIR/peaks"
        sleep 1
    done
) &
PIDS+=($!)
# The slow readers' pages are built before the measurement starts.
sleep 5
wrk -t1 -c2 -d"${DURATION}s" --latency -H "X-API-Key: $KEY" "$BASE$HISTORY" >"$DIR/history.out" &
HISTORY_WRK=$!
PIDS+=("$HISTORY_WRK")
HEALTH=$(wrk -t1 -c"$WRK_CONNECTIONS" -d"${DURATION}s" --latency -H "X-API-Key: $KEY" "$BASE/v1/health")
wait "$HISTORY_WRK"
wait "$ATTACK"
read -r LORIS_DROPPED CONNECT_FAILED <"$DIR/attack.out" || { echo "the attack did not finish"; exit 1; }
read -r RSS_PEAK SOCKETS_PEAK <"$DIR/peaks"
sleep 2
RSS_AFTER=$(rss_mb)
SOCKETS_AFTER=$(sockets)

ms() { # wrk's latency ("812.00us", "1.20ms", "2.01s") in ms
    awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) n /= 1000; else if (v ~ /ms$/) n += 0;
        else if (v ~ /s$/) n *= 1000; printf "%.2f", n }'
}
summary() { # requests/s, p50, p99 (ms) and errors of one wrk output
    local out=$1 p50 p99 rps errors
    p50=$(ms "$(echo "$out" | awk '$1 == "50%" {print $2}')")
    p99=$(ms "$(echo "$out" | awk '$1 == "99%" {print $2}')")
    rps=$(echo "$out" | awk '/^Requests\/sec/ {print $2}')
    errors=$(echo "$out" | awk '/Non-2xx|Socket errors/ {s = s $0 "; "} END {print s}')
    echo "$rps req/s, p50 ${p50} ms, p99 ${p99} ms${errors:+, $errors}"
}
HEALTH_P99=$(ms "$(echo "$HEALTH" | awk '$1 == "99%" {print $2}')")
echo "RESULT /v1/health ($WRK_CONNECTIONS connections): $(summary "$HEALTH")"
echo "RESULT history page (2 connections): $(summary "$(cat "$DIR/history.out")")"
echo "RESULT attack: $SLOWLORIS slowloris and $SLOW_READERS slow readers for $((DURATION + 6)) s;" \
    "slowloris connections dropped by the server (and reopened): $LORIS_DROPPED;" \
    "connections not accepted within 10 s: $CONNECT_FAILED"
echo "RESULT server sockets: peak $SOCKETS_PEAK during the attack, $SOCKETS_AFTER after it"
echo "RESULT server RSS: $RSS_BEFORE MB before the attack, peak $RSS_PEAK MB during it" \
    "(at most $READER_PAGES_MB_MAX MB above), $RSS_AFTER MB after it"

fail=0
awk -v p="$HEALTH_P99" -v max="$MAX_P99_MS" 'BEGIN { exit !(p < max) }' \
    || { echo "FAIL: /v1/health p99 $HEALTH_P99 ms is not under $MAX_P99_MS ms"; fail=1; }
if echo "$HEALTH" | grep -q 'Non-2xx\|Socket errors'; then
    echo "FAIL: /v1/health had error answers or socket errors"
    fail=1
fi
[ $((RSS_PEAK - RSS_BEFORE)) -le "$READER_PAGES_MB_MAX" ] \
    || { echo "FAIL: RSS grew by $((RSS_PEAK - RSS_BEFORE)) MB under the attack (at most $READER_PAGES_MB_MAX)"; fail=1; }
[ "$LORIS_DROPPED" -ge "$SLOWLORIS" ] \
    || { echo "FAIL: the server dropped only $LORIS_DROPPED slowloris connections of $SLOWLORIS"; fail=1; }
[ "$CONNECT_FAILED" -eq 0 ] \
    || { echo "FAIL: $CONNECT_FAILED connections were not accepted within 10 s"; fail=1; }
[ "$fail" -eq 0 ] && echo "load test passed: p99 under $MAX_P99_MS ms, RSS bounded, slowloris dropped"
exit "$fail"
