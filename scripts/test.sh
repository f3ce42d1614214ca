#!/usr/bin/env bash
# The test command: installs what the tests need (redis-server, PostgreSQL,
# RabbitMQ, Chromium for the demo's live page),
# starts a throw-away PostgreSQL on 127.0.0.1, then runs the format check,
# clippy and the whole test suite. Redis servers are started by the tests
# themselves (one per test, on a free loopback port, in a temp dir; a Redis
# Cluster of six such servers for the cluster tests).
#
# Usage: scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() {
    if [ "$(id -u)" = "0" ]; then "$@"; else sudo "$@"; fi
}

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
# redis-cli creates the test clusters (`redis-cli --cluster create`).
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
# The RabbitMQ broker's tests (feature `rabbitmq` of seawall-saga) start
# Debian's server script directly (as root, /usr/sbin/rabbitmq-server would
# switch users).
[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || command -v rabbitmq-server >/dev/null 2>&1 ||
    missing+=(rabbitmq-server)
# The demo's live page is loaded in headless Chromium (no Node).
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if [ "${#missing[@]}" -gt 0 ]; then
    echo "==> installing ${missing[*]}"
    # Keep the packages from starting system-wide services: the tests start
    # their own servers on free loopback ports.
    policy=/usr/sbin/policy-rc.d
    made_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' | as_root tee "$policy" >/dev/null
        as_root chmod +x "$policy"
        made_policy=1
    fi
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    if [ "$made_policy" = 1 ]; then as_root rm -f "$policy"; fi
    # A policy that was already there may have let the package start the
    # system-wide node: stop it (the tests start their own).
    if [[ " ${missing[*]} " == *" rabbitmq-server "* ]] && command -v rabbitmqctl >/dev/null 2>&1; then
        as_root timeout 30 rabbitmqctl stop >/dev/null 2>&1 || true
    fi
fi
# The Debian package may start a system-wide redis on 6379; the tests never
# use it (each test starts its own server on a free port).

# The live page's test runs (rather than skips) with this browser.
SEAWALL_TEST_CHROMIUM="$(command -v chromium)"
export SEAWALL_TEST_CHROMIUM

# shellcheck source=lib/postgres.sh
source scripts/lib/postgres.sh
pg_start
# Redis and RabbitMQ servers the tests start list their process ids here
# (RabbitMQ: the Erlang VM and its port mapper); whatever a test left
# running (a server held for a whole test binary, a killed test process) is
# stopped at the end.
SEAWALL_TEST_SERVERS="$(mktemp -d)"
export SEAWALL_TEST_SERVERS
stop_test_servers() {
    local file pid
    for file in "$SEAWALL_TEST_SERVERS"/*; do
        [ -e "$file" ] || continue
        pid="$(basename "$file")"
        case "$(cat "/proc/$pid/comm" 2>/dev/null)" in
            redis-server | beam.smp | epmd) kill -9 "$pid" 2>/dev/null || true ;;
        esac
    done
    rm -rf "$SEAWALL_TEST_SERVERS"
}
cleanup() {
    stop_test_servers
    pg_stop
}
trap cleanup EXIT
echo "==> PostgreSQL at $SEAWALL_TEST_POSTGRES_URL"

# Incremental state is of no use to a one-off run and doubles the size of
# the target directory.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
echo "==> disk: $(df -h . | awk 'NR==2 {print $4 " free of " $2}')"

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings

echo "==> cargo test"
cargo test --workspace --all-features --locked --no-fail-fast "$@"
