#!/usr/bin/env bash
# Installs what the tests need on a fresh machine, reusing whatever is
# already there:
# - Debian's prometheus (prometheus, promtool) and docker-compose (to
#   validate compose/docker-compose.yml without a Docker engine);
# - a JDK 17+ and Maven, for the real engines (scripts/engines.sh fetches
#   Apache Kafka and Apache Cassandra jars from Maven Central once);
# - python3-venv, for the official Python client check and schemathesis.
set -euo pipefail

missing=()
command -v promtool >/dev/null && command -v prometheus >/dev/null || missing+=(prometheus)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v javac >/dev/null || missing+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null || missing+=(maven)
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]} (Debian packages)"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
