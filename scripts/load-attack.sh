#!/usr/bin/env bash
# Bounded load test: `hindsight dev` on loopback answers `/v1/health` under
# `wrk` while 200 slowloris connections (a partial request head, then one
# byte a second) and 20 slow readers (a large page requested, never read)
# run beside it. Prints /v1/health p50/p99 and the server's peak RSS
# (VmHWM). Everything is on 127.0.0.1 and every loop ends by a deadline.
#
#   scripts/load-attack.sh            # builds the debug binary if missing
#   HINDSIGHT_BIN=target/release/hindsight DURATION=20 scripts/load-attack.sh
#
# Needs wrk (Debian package `wrk`) and python3. Target: p99 < 50 ms, RSS
# bounded (it must not grow with the attack).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-20}
SLOWLORIS=${SLOWLORIS:-200}
SLOW_READERS=${SLOW_READERS:-20}
WRK_CONNECTIONS=${WRK_CONNECTIONS:-10}
HISTORY_HOURS=${HISTORY_HOURS:-12}
BIN=${HINDSIGHT_BIN:-target/debug/hindsight}
KEY=hsk_load_test_key_0123456789abcdef0123456789abcdef

command -v wrk >/dev/null || { echo "wrk is missing: apt-get install wrk" >&2; exit 1; }
[ -x "$BIN" ] || cargo build -p hindsight --bin hindsight

DIR=$(mktemp -d /tmp/hindsight-load.XXXXXX)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
BASE="http://127.0.0.1:$PORT"
SERVER=""
ATTACK=""
cleanup() {
    [ -n "$ATTACK" ] && kill "$ATTACK" 2>/dev/null || true
    [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null && wait "$SERVER" 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT

"$BIN" dev --listen "127.0.0.1:$PORT" --data-dir "$DIR/data" --demo-api-key "$KEY" \
    --demo-history-hours "$HISTORY_HOURS" >"$DIR/dev.log" 2>&1 &
SERVER=$!

# Ready, and the demo history projected (the slow readers want a big page).
MARKET=mkt-fed-cuts-25bps-december-2026
NOW=$(date +%s)
PAGE="/v1/markets/$MARKET/books?start_ts=$((NOW - HISTORY_HOURS * 3600))&end_ts=$NOW&resolution=1m&limit=200"
for _ in $(seq 1 240); do
    size=$(curl -s -o /dev/null -w '%{size_download}' -H "X-API-Key: $KEY" "$BASE$PAGE" || echo 0)
    [ "${size:-0}" -gt 10000 ] && break
    sleep 0.5
done
echo "dev pid $SERVER on $BASE; slow readers request $PAGE ($size bytes when read)"

python3 - "$PORT" "$KEY" "$PAGE" "$SLOWLORIS" "$SLOW_READERS" "$((DURATION + 5))" <<'EOF' &
import socket, sys, time
port, key, page = int(sys.argv[1]), sys.argv[2], sys.argv[3]
n_loris, n_readers, seconds = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
deadline = time.time() + seconds
closed = {"slowloris": 0, "reader": 0}

def loris():
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    s.setblocking(False)
    s.send(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-A: ")
    return s

def reader():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(2)
    s.connect(("127.0.0.1", port))
    s.send(f"GET {page} HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\n\r\n".encode())
    s.setblocking(False)
    return s

socks = [("slowloris", loris()) for _ in range(n_loris)] + [("reader", reader()) for _ in range(n_readers)]
while time.time() < deadline:
    for i, (kind, s) in enumerate(socks):
        try:
            if kind == "slowloris":
                s.send(b"a")
            else:
                # Never read the response; only notice the server closing
                # (an empty peek), not the response waiting to be read.
                if s.recv(1, socket.MSG_PEEK) == b"":
                    raise ConnectionError
        except BlockingIOError:
            pass
        except OSError:
            closed[kind] += 1
            s.close()
            try:
                socks[i] = (kind, loris() if kind == "slowloris" else reader())
            except OSError:
                socks[i] = (kind, socket.socket())
    time.sleep(1)
print(f"attack: {n_loris} slowloris, {n_readers} slow readers for {seconds} s; "
      f"closed by the server (and reopened): {closed}", flush=True)
EOF
ATTACK=$!
sleep 3
OUT=$(wrk -t2 -c"$WRK_CONNECTIONS" -d"${DURATION}s" --latency -H "X-API-Key: $KEY" "$BASE/v1/health")
wait "$ATTACK" || true
ATTACK=""
echo "$OUT"
p50=$(echo "$OUT" | awk '$1 == "50%" {print $2}')
p99=$(echo "$OUT" | awk '$1 == "99%" {print $2}')
non2xx=$(echo "$OUT" | awk '/Non-2xx/ {print $NF}')
hwm=$(awk '/VmHWM/ {print $2, $3}' "/proc/$SERVER/status")
rss=$(awk '/VmRSS/ {print $2, $3}' "/proc/$SERVER/status")
echo "RESULT /v1/health p50=$p50 p99=$p99 non-2xx=${non2xx:-0}; server peak RSS (VmHWM) $hwm, RSS now $rss"
