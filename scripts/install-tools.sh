#!/usr/bin/env bash
# Installs what the tests need on a fresh machine, reusing whatever is
# already there:
# - Debian's prometheus (prometheus, promtool) and docker-compose (to
#   validate compose/docker-compose.yml without a Docker engine);
# - a JDK 17+ and Maven, for the real engines (scripts/engines.sh fetches
#   Apache Kafka and Apache Cassandra jars from Maven Central once);
# - python3-venv, for the official Python client check and schemathesis;
# - Debian's wrk, for the load test (scripts/load-attack.sh);
# - Debian's chromium and chromium-driver, for the dashboard's browser test;
# - cargo-fuzz from crates.io into ~/.cargo/bin (once: an installed one of
#   the pinned version is kept), for the fuzz targets (scripts/fuzz.sh);
# - for the benchmarks: Debian's nginx (the static-file anchor of
#   `hindsight-bench api`), and DuckDB and chdb (the anchors of
#   `hindsight-bench shapes`, bench/requirements.txt) in the virtualenv the
#   Python checks share ($HINDSIGHT_VENV, default ~/.cache/hindsight-venv),
#   with the official Python client and schemathesis (tests/sdk/requirements.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v promtool >/dev/null && command -v prometheus >/dev/null || missing+=(prometheus)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v javac >/dev/null || missing+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null || missing+=(maven)
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
command -v wrk >/dev/null || missing+=(wrk)
[ -x /usr/sbin/nginx ] || missing+=(nginx)
# The dashboard's browser test (tests/app/dashboard_browser.rs): Debian's
# Chromium and its chromedriver, never a browser a tool downloads itself.
[ -x /usr/bin/chromium ] || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]} (Debian packages)"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Pinned: `cargo fuzz` flags and output are what scripts/fuzz.sh reads.
CARGO_FUZZ_VERSION=0.13.2
export PATH="$HOME/.cargo/bin:$PATH"
if [ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz $CARGO_FUZZ_VERSION" ]; then
  echo "== installing cargo-fuzz $CARGO_FUZZ_VERSION (crates.io, into ~/.cargo/bin)"
  cargo install --locked --quiet "cargo-fuzz@$CARGO_FUZZ_VERSION"
fi

venv="${HINDSIGHT_VENV:-$HOME/.cache/hindsight-venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# Both pinned sets, here: the browser test (tests/app/dashboard_browser.rs)
# runs the official client under `cargo test`, before tests/sdk/run.sh.
"$venv/bin/pip" install --quiet --disable-pip-version-check \
  -r bench/requirements.txt -r tests/sdk/requirements.txt
