#!/usr/bin/env bash
# Throw-away PostgreSQL server for tests, on 127.0.0.1 only.
#
# Source this file, then:
#   pg_start   installs Debian's `postgresql` if no initdb is found, creates a
#              cluster in a fresh temporary directory, starts it on a free
#              loopback port with trust authentication and exports
#                SEAWALL_TEST_POSTGRES_URL  postgres://postgres@127.0.0.1:PORT/postgres
#                SEAWALL_TEST_POSTGRES_DIR  the temporary directory
#                SEAWALL_TEST_POSTGRES_BIN  the directory of the server binaries
#   pg_stop    stops that server and removes the directory.
#
# PostgreSQL refuses to run as root: when run as root, the cluster is owned by
# and run as the `postgres` OS user (created by the Debian package).

_pg_find_bindir() {
    local dir
    if [ -n "${SEAWALL_TEST_POSTGRES_BIN:-}" ] && [ -x "$SEAWALL_TEST_POSTGRES_BIN/initdb" ]; then
        echo "$SEAWALL_TEST_POSTGRES_BIN"
        return 0
    fi
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
            echo "$dir"
            return 0
        fi
    done
    if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        dirname "$(command -v initdb)"
        return 0
    fi
    return 1
}

_pg_as_owner() {
    if [ "$(id -u)" = "0" ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

_pg_free_port() {
    if command -v python3 >/dev/null 2>&1; then
        python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
        return
    fi
    local port
    for port in $(seq 20000 40000 | shuf 2>/dev/null || seq 20000 40000); do
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "$port"
            return
        fi
    done
    return 1
}

pg_start() {
    local bindir dir port i
    if ! bindir="$(_pg_find_bindir)"; then
        echo "pg_start: no initdb found, installing postgresql with apt-get" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >&2 && apt-get install -y -qq postgresql >&2 || {
            echo "pg_start: could not install postgresql" >&2
            return 1
        }
        bindir="$(_pg_find_bindir)" || {
            echo "pg_start: postgresql installed but initdb not found" >&2
            return 1
        }
    fi
    if [ "$(id -u)" = "0" ] && ! id postgres >/dev/null 2>&1; then
        echo "pg_start: running as root but there is no postgres user" >&2
        return 1
    fi
    dir="$(mktemp -d "${TMPDIR:-/tmp}/seawall-pg.XXXXXX")" || return 1
    chmod 755 "$dir"
    if [ "$(id -u)" = "0" ]; then
        chown postgres: "$dir"
    fi
    if ! _pg_as_owner "$bindir/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 \
        --no-instructions >"$dir/initdb.log" 2>&1; then
        echo "pg_start: initdb failed:" >&2
        cat "$dir/initdb.log" >&2
        rm -rf "$dir"
        return 1
    fi
    for i in 1 2 3 4 5; do
        port="$(_pg_free_port)" || { rm -rf "$dir"; return 1; }
        if _pg_as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
            -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=300 -c shared_buffers=64MB" \
            start >/dev/null 2>&1; then
            break
        fi
        port=""
    done
    if [ -z "$port" ]; then
        echo "pg_start: postgres did not start:" >&2
        tail -n 20 "$dir/server.log" >&2 2>/dev/null
        rm -rf "$dir"
        return 1
    fi
    for i in $(seq 1 100); do
        if "$bindir/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres; then
            break
        fi
        sleep 0.1
    done
    if ! "$bindir/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres; then
        echo "pg_start: postgres on port $port is not ready" >&2
        _pg_as_owner "$bindir/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1
        rm -rf "$dir"
        return 1
    fi
    export SEAWALL_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$port/postgres"
    export SEAWALL_TEST_POSTGRES_DIR="$dir"
    export SEAWALL_TEST_POSTGRES_BIN="$bindir"
    echo "pg_start: postgres $("$bindir/postgres" --version | awk '{print $3}') on 127.0.0.1:$port ($dir)" >&2
}

pg_stop() {
    local dir="${SEAWALL_TEST_POSTGRES_DIR:-}" bindir
    if [ -z "$dir" ] || [ ! -d "$dir" ]; then
        return 0
    fi
    bindir="${SEAWALL_TEST_POSTGRES_BIN:-$(_pg_find_bindir)}"
    if [ -n "$bindir" ] && [ -d "$dir/data" ]; then
        _pg_as_owner "$bindir/pg_ctl" -D "$dir/data" -m fast -w -t 30 stop >/dev/null 2>&1 ||
            _pg_as_owner "$bindir/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1
    fi
    rm -rf "$dir"
    unset SEAWALL_TEST_POSTGRES_URL SEAWALL_TEST_POSTGRES_DIR
}
