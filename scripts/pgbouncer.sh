#!/usr/bin/env bash
# A real PgBouncer in transaction mode in front of the machine's PostgreSQL, for the
# tests, CI and the benchmark's latency group (docs/guides/poolers.md).
#
#   scripts/pgbouncer.sh start    install Debian's pgbouncer if missing, start it, wait
#   scripts/pgbouncer.sh stop     stop the one this script started
#   scripts/pgbouncer.sh status   exit 0 when it answers
#
# Idempotent: `start` with a PgBouncer already answering on the port does nothing.
# Settings come from the environment (defaults in brackets):
#   PGBOUNCER_PORT [6432]         the port it listens on, 127.0.0.1 only
#   PGBOUNCER_DIR  [/tmp/intention-kernel-pgbouncer-$PGBOUNCER_PORT]
#                                 its config, pidfile and log
#   PGBOUNCER_UPSTREAM_HOST [127.0.0.1], PGBOUNCER_UPSTREAM_PORT [5432]
#   PGBOUNCER_POOL_SIZE [20]      server sessions per database and user
#   PGBOUNCER_POOL_MODE [transaction]   or session, to compare
# Clients then connect to postgresql://postgres@127.0.0.1:$PGBOUNCER_PORT/test.
set -euo pipefail

PORT="${PGBOUNCER_PORT:-6432}"
DIR="${PGBOUNCER_DIR:-/tmp/intention-kernel-pgbouncer-$PORT}"
UPSTREAM_HOST="${PGBOUNCER_UPSTREAM_HOST:-127.0.0.1}"
UPSTREAM_PORT="${PGBOUNCER_UPSTREAM_PORT:-5432}"
POOL_SIZE="${PGBOUNCER_POOL_SIZE:-20}"
POOL_MODE="${PGBOUNCER_POOL_MODE:-transaction}"
# PgBouncer refuses to run as root: it runs as the PostgreSQL server's OS user.
RUN_AS="${PGBOUNCER_USER:-postgres}"
CONFIG="$DIR/pgbouncer.ini"
PIDFILE="$DIR/pgbouncer.pid"
LOG="$DIR/pgbouncer.log"

as_user() {
    if [ "$(id -un)" = "$RUN_AS" ]; then
        sh -c "$1"
    else
        # su resets the open-files limit to 1024, too few for max_client_conn.
        su "$RUN_AS" -s /bin/sh -c "$1"
    fi
}

answers() {
    # The admin console answers SHOW VERSION once PgBouncer accepts clients.
    psql "postgresql://postgres@127.0.0.1:$PORT/pgbouncer" -qAtc 'SHOW VERSION' \
        >/dev/null 2>&1
}

install() {
    if command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ]; then
        return
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq pgbouncer >/dev/null
}

write_config() {
    mkdir -p "$DIR"
    # trust: the machine's PostgreSQL trusts local connections, so PgBouncer does too;
    # auth_file still lists the users it accepts.
    printf '"postgres" ""\n' >"$DIR/userlist.txt"
    cat >"$CONFIG" <<EOF
[databases]
* = host=$UPSTREAM_HOST port=$UPSTREAM_PORT

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PORT
unix_socket_dir =
auth_type = trust
auth_file = $DIR/userlist.txt
admin_users = postgres
stats_users = postgres
pidfile = $PIDFILE
logfile = $LOG
; A server session serves one transaction, then goes back to the pool: no session
; state (advisory locks, SET, prepared statements) survives between transactions.
pool_mode = $POOL_MODE
; The latency benchmark runs up to 2,000 conversations at once through one adapter
; pool, and the tests open many adapters: clients are cheap here, sessions are not.
max_client_conn = 5000
default_pool_size = $POOL_SIZE
reserve_pool_size = 0
; PgBouncer refuses a startup parameter it does not know; some drivers (JDBC) send this one.
ignore_startup_parameters = extra_float_digits
; Version 1.18 (Debian 12) cannot track prepared statements (max_prepared_statements
; came in 1.21): clients must not prepare statements on the server.
server_reset_query = DISCARD ALL
log_connections = 0
log_disconnections = 0
EOF
    chown -R "$RUN_AS" "$DIR"
}

start() {
    if answers; then
        echo "pgbouncer already answers on 127.0.0.1:$PORT"
        return
    fi
    install
    write_config
    rm -f "$PIDFILE"
    as_user "ulimit -n 8192 && exec /usr/sbin/pgbouncer -d -q '$CONFIG'"
    for _ in $(seq 1 100); do
        if answers; then
            echo "pgbouncer answers on 127.0.0.1:$PORT ($POOL_MODE mode; $DIR)"
            return
        fi
        sleep 0.1
    done
    echo "pgbouncer did not answer on 127.0.0.1:$PORT within 10 s; its log:" >&2
    tail -n 20 "$LOG" >&2 || true
    exit 1
}

stop() {
    if [ ! -s "$PIDFILE" ]; then
        echo "no pgbouncer started from $DIR"
        return
    fi
    pid="$(cat "$PIDFILE")"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
        if ! kill -0 "$pid" 2>/dev/null; then
            rm -f "$PIDFILE"
            echo "pgbouncer stopped"
            return
        fi
        sleep 0.1
    done
    echo "pgbouncer (pid $pid) did not stop within 10 s" >&2
    exit 1
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) answers ;;
*)
    echo "usage: $0 start|stop|status" >&2
    exit 2
    ;;
esac
