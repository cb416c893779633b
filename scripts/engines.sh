#!/usr/bin/env bash
# Real engines for tests, on loopback, from Maven Central jars alone (no
# Docker, no tarballs): Apache Kafka 4.1 (KRaft, one broker+controller) and
# Apache Cassandra 5.0 (one node; speaks the CQL protocol ScyllaDB speaks).
#
#   scripts/engines.sh start [kafka|cassandra]    fresh, empty engines
#   scripts/engines.sh status [kafka|cassandra]   exit 0 only if they answer
#   scripts/engines.sh stop                       idempotent
#   scripts/engines.sh start-again kafka|cassandra
#        relaunch an engine (e.g. after a fault test SIGKILLed it) with the
#        same command line, port and data directory; waits until ready.
#
# `start` and `start-again` print only `export NAME=VALUE` lines on stdout
# (everything else goes to stderr), so this works:
#   eval "$(scripts/engines.sh start)"
#   -> HINDSIGHT_KAFKA_BROKERS=127.0.0.1:P  HINDSIGHT_SCYLLA_NODES=127.0.0.1:P
#
# Environment:
#   HINDSIGHT_ENGINES_RUN      run directory (default $CACHE/run); wiped by start
#   HINDSIGHT_ENGINES_TIMEOUT  seconds to wait for each engine (default 120)
#   HINDSIGHT_KAFKA_HEAP / HINDSIGHT_CASSANDRA_HEAP   (default 512m / 2g)
#   JAVA_HOME                  a JDK 17+ (default: java on PATH)
# where CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/hindsight-engines holds the jars
# (kafka-VERSION/lib, cassandra-VERSION/lib), fetched once by Maven from the
# POMs in engines/ (the versions are read from those POMs).
#
# Run directory layout (for fault tests):
#   RUN/kafka.pid RUN/kafka.port RUN/kafka.controller.port RUN/kafka.cmd
#   RUN/cassandra.pid RUN/cassandra.port RUN/cassandra.storage.port
#   RUN/cassandra.jmx.port RUN/cassandra.cmd
#   RUN/kafka/{conf,data,logs,tmp}  RUN/cassandra/{conf,data,logs,tmp}
#   logs/server.log (Kafka) or logs/system.log (Cassandra), WARN and up plus
#   a few startup milestones; logs/stdout.log (the JVM's own stdout/stderr);
#   kafka/logs/format.log (kafka-storage format).
# A *.cmd file is the exact command line (shell-quoted, one line) run in the
# engine's directory; `start-again` runs it again.
#
# Why things are done the way they are:
# - Ports: picked at random in 20000-32767 and checked free on 127.0.0.1 at
#   every start, so parallel runs and leftovers never collide. That range is
#   below Linux's ephemeral range (32768-60999), so an outgoing connection of
#   some other process cannot take the port between the pick and the JVM's
#   bind (port 0 would give exactly such an ephemeral port).
# - Readiness is a real request (scripts/engines_probe.py: Kafka ApiVersions +
#   Metadata with a live broker; CQL STARTUP + SELECT from system.local), not a
#   TCP connect nor a log line: both engines bind before they serve.
# - Detached launch: `setsid` (new session, no controlling terminal, so no
#   SIGHUP when the caller's terminal or CI step ends) with stdin from
#   /dev/null and output to a file, so the JVMs outlive this script and never
#   hold the caller's pipes open (`$(scripts/engines.sh start)` returns).
#   A small `bash -c` writes its own pid, then execs java: the pid file is the
#   JVM's pid whether or not setsid had to fork.
# - stop/status only touch the pid in RUN/*.pid if /proc says it is a live
#   java whose command line carries -Dhindsight.engine=NAME and this run
#   directory: a recycled pid is never signalled.
# - Both JVMs start in parallel (Cassandra first: it is the slow one; Kafka's
#   storage format runs meanwhile), then each is waited for.
# - If anything fails during start, every engine this invocation launched is
#   stopped again (EXIT trap) and the script exits non-zero: no orphans.
# - Cassandra system properties (see cassandra_cmd below):
#   * -Dcassandra.config must be a URL (file:///...): a plain path is looked up
#     as a classpath resource and rejected ("Expecting URI in variable:
#     [cassandra.config]").
#   * -Dcassandra-foreground=yes: otherwise the daemon closes System.out/err
#     once started (it assumes a pid-file daemon), losing late fatal errors.
#   * -Dcassandra.storagedir: data, commitlog, hints, saved_caches default to
#     subdirectories of it, so cassandra.yaml needs no paths.
#   * skip_wait_for_gossip_to_settle=0, ring_delay_ms, superuser_setup_delay_ms:
#     a single node has nobody to wait for; these cut ~30 s of sleeps.
#   * NOT -Dcassandra.unsafesystem=true (which the recipe suggested): it keeps
#     schema changes out of the commit log, so after a `kill -9` the node comes
#     back without the keyspaces/tables created since start ("keyspace ... does
#     not exist"; the log says "Skipped N mutations from unknown ... CF").
#     Fault tests kill -9 and `start-again`, so schema must be durable.
#   * logback.configurationFile: without it logback logs DEBUG to stdout.
# - Kafka: `kafka.tools.StorageTool format` before the first launch (KRaft
#   refuses an unformatted log dir); the cluster id is generated here instead
#   of by `StorageTool random-uuid`, which would cost one more JVM start.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ENGINES=$ROOT/engines
PROBE=$ROOT/scripts/engines_probe.py
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/hindsight-engines
RUN=${HINDSIGHT_ENGINES_RUN:-$CACHE/run}
TIMEOUT=${HINDSIGHT_ENGINES_TIMEOUT:-120}
KAFKA_HEAP=${HINDSIGHT_KAFKA_HEAP:-512m}
# A test run creates a keyspace per test (about 20 tables each) on one
# node: at 1g the heap ran out during the CQL conformance suite once.
CASSANDRA_HEAP=${HINDSIGHT_CASSANDRA_HEAP:-2g}
JAVA=${JAVA_HOME:+$JAVA_HOME/bin/}java
STOP_GRACE_S=20
RUN_MARKER=.hindsight-engines-run

log() { printf 'engines: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

pom_version() { # FILE PROPERTY
  sed -n "s:.*<$2>\(.*\)</$2>.*:\1:p" "$1" | head -n1
}
KAFKA_VERSION=$(pom_version "$ENGINES/pom-kafka.xml" kafka.version)
CASSANDRA_VERSION=$(pom_version "$ENGINES/pom-cassandra.xml" cassandra.version)

engine_lib() { # ENGINE
  case $1 in
    kafka) echo "$CACHE/kafka-$KAFKA_VERSION/lib" ;;
    cassandra) echo "$CACHE/cassandra-$CASSANDRA_VERSION/lib" ;;
  esac
}

check_engine_name() {
  case ${1:-} in
    kafka | cassandra) ;;
    *) die "unknown engine '${1:-}' (expected kafka or cassandra)" ;;
  esac
}

# Kafka 4 brokers need Java 17+; Cassandra 5.0 runs on Java 11 and 17 only
# (its SecurityManager use fails on 24+).
need_tools() {
  command -v "$JAVA" >/dev/null || die "no java (install a JDK 17 or set JAVA_HOME)"
  command -v python3 >/dev/null || die "no python3 (needed by $PROBE)"
  local major
  major=$("$JAVA" -version 2>&1 | sed -n 's/.* version "\([0-9]*\).*/\1/p' | head -n1)
  [[ ${major:-0} -ge 17 ]] || die "$JAVA is Java ${major:-?}; Kafka 4 needs 17"
  [[ $major -eq 17 ]] || log "warning: Java $major; Cassandra 5.0 supports Java 11 and 17 only"
}

# ---------------------------------------------------------------- jars ----

# Fetch the runtime jars of ENGINE once. The directory is complete only when
# its .complete stamp holds the POM's checksum: an interrupted download, or an
# edited POM, fetches again. A lock serialises concurrent starts.
fetch_jars() { # ENGINE
  local engine=$1 pom lib sum
  pom=$ENGINES/pom-$engine.xml
  lib=$(engine_lib "$engine")
  sum=$(sha256sum "$pom" | cut -d' ' -f1)
  if [[ -f $lib/.complete && $(<"$lib/.complete") == "$sum" ]]; then
    return 0
  fi
  command -v mvn >/dev/null || die "no mvn (needed once to fetch the $engine jars)"
  mkdir -p "$CACHE"
  (
    flock 9
    if [[ -f $lib/.complete && $(<"$lib/.complete") == "$sum" ]]; then
      exit 0
    fi
    log "fetching $engine jars with Maven into $lib (once)"
    local tmp=$lib.partial.$$
    rm -rf "$tmp"
    # -f: the POM stays in the repo; mvn runs from the cache directory so it
    # writes nothing into the repo. Its output (which even with -B -q holds
    # stray ANSI resets) goes to a log, shown only if it fails.
    local mvnlog=$CACHE/mvn-$engine.log
    if ! (cd "$CACHE" && mvn -B -q -f "$pom" \
      org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy-dependencies \
      -DoutputDirectory="$tmp" -DincludeScope=runtime) >"$mvnlog" 2>&1 </dev/null; then
      tail -n 40 "$mvnlog" >&2
      rm -rf "$tmp"
      exit 1
    fi
    echo "$sum" >"$tmp/.complete"
    rm -rf "$lib"
    mkdir -p "$(dirname "$lib")"
    mv "$tmp" "$lib"
  ) 9>"$CACHE/.fetch.lock" || die "could not fetch the $engine jars (mvn failed; see above)"
}

# --------------------------------------------------------------- ports ----

# N distinct free TCP ports on 127.0.0.1, from 20000-32767 (see header).
free_ports() { # N
  python3 - "$1" <<'EOF'
import random, socket, sys
n, got, socks = int(sys.argv[1]), [], []
for _ in range(2000):
    if len(got) == n:
        break
    p = random.randint(20000, 32767)
    if p in got:
        continue
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        s.close()
        continue
    socks.append(s)  # held until all are picked, so they are distinct
    got.append(p)
for s in socks:
    s.close()
if len(got) < n:
    sys.exit("no free ports found")
print(" ".join(map(str, got)))
EOF
}

# ------------------------------------------------------------ processes ----

# Is PID a live (not zombie) java process of ENGINE started from this RUN?
is_ours() { # ENGINE PID
  local engine=$1 pid=$2 stat cmdline
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat%% *} != Z ]] || return 1
  cmdline=$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
  grep -qxF -- "-Dhindsight.engine=$engine" <<<"$cmdline" || return 1
  grep -qF -- "$RUN/$engine/" <<<"$cmdline" || return 1
  [[ $(basename "$(head -n1 <<<"$cmdline")") == java ]]
}

engine_pid() { # ENGINE -> pid on stdout if running, else fails
  local pid
  pid=$(cat "$RUN/$1.pid" 2>/dev/null) || return 1
  is_ours "$1" "$pid" || return 1
  echo "$pid"
}

# SIGTERM the given engines, wait up to STOP_GRACE_S for them to exit, then
# SIGKILL what is left and wait until it is gone.
stop_engines() { # ENGINE...
  local engine pid deadline pids=() names=()
  for engine in "$@"; do
    if pid=$(engine_pid "$engine"); then
      log "stopping $engine (pid $pid)"
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
      names+=("$engine")
    fi
  done
  deadline=$((SECONDS + STOP_GRACE_S))
  local i alive
  while :; do
    alive=0
    for i in "${!pids[@]}"; do
      is_ours "${names[$i]}" "${pids[$i]}" && alive=1
    done
    ((alive)) || break
    if ((SECONDS >= deadline)); then
      for i in "${!pids[@]}"; do
        if is_ours "${names[$i]}" "${pids[$i]}"; then
          log "${names[$i]} (pid ${pids[$i]}) still runs after ${STOP_GRACE_S}s: SIGKILL"
          kill -KILL "${pids[$i]}" 2>/dev/null || true
        fi
      done
      deadline=$((SECONDS + 3600))
    fi
    sleep 0.2
  done
  for engine in "$@"; do
    rm -f "$RUN/$engine.pid"
  done
}

# Launch the command line in ENGINE's .cmd file, detached (see header).
launch() { # ENGINE
  local engine=$1
  rm -f "$RUN/$engine.pid"
  # shellcheck disable=SC2016
  setsid bash -c 'cd "$1" && echo $$ >"$2" && eval "exec $(<"$3")"' \
    launch "$RUN/$engine" "$RUN/$engine.pid" "$RUN/$engine.cmd" \
    </dev/null >>"$RUN/$engine/logs/stdout.log" 2>&1 &
  local i
  for ((i = 0; i < 100; i++)); do
    [[ -s $RUN/$engine.pid ]] && break
    sleep 0.05
  done
  [[ -s $RUN/$engine.pid ]] || die "$engine did not launch (see $RUN/$engine/logs/stdout.log)"
  log "launched $engine (pid $(<"$RUN/$engine.pid"))"
}

log_tail() { # ENGINE
  local f
  for f in "$RUN/$1/logs/"*.log; do
    [[ -f $f ]] || continue
    printf -- '----- last lines of %s -----\n' "$f" >&2
    tail -n 40 "$f" >&2
  done
}

probe() { # ENGINE ADDR [QUIET]
  local kind=cql
  [[ $1 == kafka ]] && kind=kafka
  python3 "$PROBE" "$kind" "$2"
}

# Wait until ENGINE answers a real request; fail early if its JVM exits.
wait_ready() { # ENGINE
  local engine=$1 port pid start=$SECONDS
  port=$(<"$RUN/$engine.port")
  pid=$(<"$RUN/$engine.pid")
  while :; do
    if probe "$engine" "127.0.0.1:$port" >/dev/null 2>&1; then
      log "$engine answers on 127.0.0.1:$port after $((SECONDS - start))s of waiting"
      return 0
    fi
    if ! is_ours "$engine" "$pid"; then
      log "$engine (pid $pid) exited during startup"
      log_tail "$engine"
      die "$engine failed to start"
    fi
    if ((SECONDS - start >= TIMEOUT)); then
      probe "$engine" "127.0.0.1:$port" >/dev/null || true
      log_tail "$engine"
      die "$engine not ready on 127.0.0.1:$port after ${TIMEOUT}s"
    fi
    sleep 0.5
  done
}

export_line() { # ENGINE
  case $1 in
    kafka) echo "export HINDSIGHT_KAFKA_BROKERS=127.0.0.1:$(<"$RUN/kafka.port")" ;;
    cassandra) echo "export HINDSIGHT_SCYLLA_NODES=127.0.0.1:$(<"$RUN/cassandra.port")" ;;
  esac
}

# ---------------------------------------------------------- templates ----

# Copy SRC to DST replacing @KEY@ with VALUE; fails on a leftover @NAME@.
render() { # SRC DST KEY=VALUE...
  local src=$1 dst=$2 content kv
  shift 2
  content=$(<"$src")
  for kv in "$@"; do
    content=${content//@${kv%%=*}@/${kv#*=}}
  done
  if grep -qE '@[A-Z_]+@' <<<"$content"; then
    die "$src: unreplaced placeholder $(grep -oE '@[A-Z_]+@' <<<"$content" | head -n1)"
  fi
  printf '%s\n' "$content" >"$dst"
}

# JVM flags from a jvm.options file: one per line, comments skipped.
read_jvm_options() { # FILE -> appends to array JVM_OPTS
  local line
  JVM_OPTS=()
  while IFS= read -r line || [[ -n $line ]]; do
    line=${line#"${line%%[![:space:]]*}"}
    [[ -z $line || $line == \#* ]] && continue
    JVM_OPTS+=("$line")
  done <"$1"
}

write_cmd() { # ENGINE ARGS...
  local engine=$1
  shift
  printf '%q ' "$@" >"$RUN/$engine.cmd"
  echo >>"$RUN/$engine.cmd"
}

# --------------------------------------------------------------- kafka ----

prepare_kafka() { # PORT CONTROLLER_PORT
  local dir=$RUN/kafka lib conf cluster_id
  lib=$(engine_lib kafka)
  conf=$dir/conf
  mkdir -p "$conf" "$dir/data" "$dir/logs" "$dir/tmp"
  echo "$1" >"$RUN/kafka.port"
  echo "$2" >"$RUN/kafka.controller.port"
  render "$ENGINES/kafka/server.properties" "$conf/server.properties" \
    PORT="$1" CONTROLLER_PORT="$2" DATA_DIR="$dir/data"
  cp "$ENGINES/kafka/log4j2.properties" "$conf/"
  render "$ENGINES/kafka/jvm.options" "$conf/jvm.options" \
    HEAP="$KAFKA_HEAP" ENGINE_DIR="$dir" CONF="$conf"
  read_jvm_options "$conf/jvm.options"
  write_cmd kafka "$JAVA" -Dhindsight.engine=kafka "${JVM_OPTS[@]}" \
    -cp "$lib/*" kafka.Kafka "$conf/server.properties"

  # A Kafka cluster id: 16 random bytes, URL-safe base64 without padding,
  # not starting with '-' (what Uuid.randomUuid guarantees).
  cluster_id=$(python3 -c 'import base64,os
while True:
    s = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
    if not s.startswith("-"): print(s); break')
  # Short-lived tool JVM: C1 only and a small serial heap start faster.
  if ! "$JAVA" -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xmx256m \
    -Dlog4j2.configurationFile="$conf/log4j2.properties" -Dkafka.logdir="$dir/logs" \
    -cp "$lib/*" kafka.tools.StorageTool format --ignore-formatted \
    -t "$cluster_id" -c "$conf/server.properties" \
    </dev/null >>"$dir/logs/format.log" 2>&1; then
    log_tail kafka
    die "kafka storage format failed"
  fi
}

# ----------------------------------------------------------- cassandra ----

prepare_cassandra() { # PORT STORAGE_PORT JMX_PORT
  local dir=$RUN/cassandra lib conf jamm
  lib=$(engine_lib cassandra)
  conf=$dir/conf
  mkdir -p "$conf/triggers" "$dir/data" "$dir/logs" "$dir/tmp"
  echo "$1" >"$RUN/cassandra.port"
  echo "$2" >"$RUN/cassandra.storage.port"
  echo "$3" >"$RUN/cassandra.jmx.port"
  render "$ENGINES/cassandra/cassandra.yaml" "$conf/cassandra.yaml" \
    PORT="$1" STORAGE_PORT="$2"
  cp "$ENGINES/cassandra/logback.xml" "$conf/"
  jamm=$(compgen -G "$lib/jamm-*.jar" | head -n1) || die "no jamm jar in $lib"
  jamm=${jamm##*/}
  render "$ENGINES/cassandra/jvm.options" "$conf/jvm.options" \
    HEAP="$CASSANDRA_HEAP" ENGINE_DIR="$dir" CONF="$conf" LIB="$lib" \
    JAMM_JAR="$jamm" JMX_PORT="$3"
  read_jvm_options "$conf/jvm.options"
  # Why each -Dcassandra.* property: see the header of this script.
  write_cmd cassandra "$JAVA" -Dhindsight.engine=cassandra "${JVM_OPTS[@]}" \
    -Dcassandra.config="file://$conf/cassandra.yaml" \
    -Dcassandra-foreground=yes \
    -Dcassandra.storagedir="$dir/data" \
    -Dcassandra.logdir="$dir/logs" \
    -Dlogback.configurationFile="$conf/logback.xml" \
    -Dcassandra.skip_wait_for_gossip_to_settle=0 \
    -Dcassandra.ring_delay_ms=1000 \
    -Dcassandra.superuser_setup_delay_ms=0 \
    -cp "$conf:$lib/*" org.apache.cassandra.service.CassandraDaemon
}

# ------------------------------------------------------------ commands ----

# Refuse to wipe anything but a run directory this script made (or an empty
# or missing one): RUN comes from the environment.
wipe_run_dir() {
  [[ $RUN == /* && $RUN != / ]] || die "HINDSIGHT_ENGINES_RUN must be an absolute path, not '$RUN'"
  if [[ -d $RUN && ! -f $RUN/$RUN_MARKER ]] && [[ -n $(ls -A "$RUN") ]]; then
    die "$RUN is not empty and not an engines run directory: not wiping it"
  fi
  rm -rf "$RUN"
  mkdir -p "$RUN"
  touch "$RUN/$RUN_MARKER"
  # JNA and Netty load native code unpacked into RUN/*/tmp.
  if command -v findmnt >/dev/null &&
    findmnt -n -o OPTIONS -T "$RUN" 2>/dev/null | tr ',' '\n' | grep -qx noexec; then
    die "$RUN is on a noexec filesystem (JNA cannot load its library there); set HINDSIGHT_ENGINES_RUN elsewhere"
  fi
}

LAUNCHED=()
START_OK=0
on_start_exit() {
  local rc=$?
  if ((!START_OK)) && ((${#LAUNCHED[@]})); then
    log "start failed: stopping ${LAUNCHED[*]}"
    stop_engines "${LAUNCHED[@]}" || true
    wait 2>/dev/null || true # reap them (they are children of this shell)
  fi
  exit "$rc"
}

cmd_start() {
  local engines=(kafka cassandra) engine ports t0=$SECONDS
  if (($#)); then
    check_engine_name "$1"
    engines=("$1")
  fi
  need_tools
  for engine in "${engines[@]}"; do fetch_jars "$engine"; done

  # Engines left over from an earlier start of this run directory.
  [[ -d $RUN ]] && stop_engines kafka cassandra
  wipe_run_dir

  trap on_start_exit EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  read -r -a ports <<<"$(free_ports 5)"
  # Cassandra first: it takes longest; Kafka's format runs while it boots.
  if [[ " ${engines[*]} " == *" cassandra "* ]]; then
    prepare_cassandra "${ports[2]}" "${ports[3]}" "${ports[4]}"
    launch cassandra
    LAUNCHED+=(cassandra)
  fi
  if [[ " ${engines[*]} " == *" kafka "* ]]; then
    prepare_kafka "${ports[0]}" "${ports[1]}"
    launch kafka
    LAUNCHED+=(kafka)
  fi
  for engine in "${engines[@]}"; do wait_ready "$engine"; done
  START_OK=1
  log "ready in $((SECONDS - t0))s (run directory $RUN)"
  for engine in "${engines[@]}"; do export_line "$engine"; done
}

cmd_start_again() {
  check_engine_name "${1:-}"
  local engine=$1
  need_tools
  [[ -f $RUN/$engine.cmd ]] || die "no $RUN/$engine.cmd: start $engine first"
  stop_engines "$engine"
  trap on_start_exit EXIT
  launch "$engine"
  LAUNCHED+=("$engine")
  wait_ready "$engine"
  START_OK=1
  export_line "$engine"
}

cmd_stop() {
  if [[ ! -d $RUN ]]; then
    log "nothing to stop ($RUN does not exist)"
    return 0
  fi
  local engine any=0
  for engine in kafka cassandra; do
    engine_pid "$engine" >/dev/null && any=1
    # A stale pid file (engine killed) is just removed.
    engine_pid "$engine" >/dev/null || rm -f "$RUN/$engine.pid"
  done
  if ((any)); then
    stop_engines kafka cassandra
    log "stopped"
  else
    log "no engine running"
  fi
}

cmd_status() {
  local engines=(kafka cassandra) engine pid port rc=0 answer
  if (($#)); then
    check_engine_name "$1"
    engines=("$1")
  fi
  for engine in "${engines[@]}"; do
    port=$(cat "$RUN/$engine.port" 2>/dev/null || true)
    if ! pid=$(engine_pid "$engine"); then
      echo "$engine: not running${port:+ (was 127.0.0.1:$port)}"
      rc=1
    elif answer=$(probe "$engine" "127.0.0.1:$port" 2>&1); then
      echo "$engine: running (pid $pid), answers at 127.0.0.1:$port: $answer"
    else
      echo "$engine: running (pid $pid) but not answering at 127.0.0.1:$port: $answer"
      rc=1
    fi
  done
  return "$rc"
}

usage() {
  sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

case ${1:-} in
  start) shift; cmd_start "$@" ;;
  start-again) shift; cmd_start_again "$@" ;;
  stop) cmd_stop ;;
  status) shift; cmd_status "$@" ;;
  *) usage ;;
esac
