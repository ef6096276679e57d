#!/usr/bin/env bash
# Weir's local PostgreSQL: a private cluster of its own (initdb, not the Debian default cluster)
# in $WEIR_RUN_DIR/postgres/data, listening on 127.0.0.1:$WEIR_POSTGRES_PORT only.
# Usage: postgres.sh install|start|stop|status|health
#   install  apt-get install postgresql only when the server binaries are missing; idempotent
#   start    install if needed, initdb once, start, wait until ready, create the role and database
#            named in $WEIR_POSTGRES_DSN (weir/weir/weir by default); idempotent
#   stop     fast shutdown (SIGINT) of our postmaster by its pid;  status  print up/down
#   health   exit 0 iff our postmaster runs and a login with $WEIR_POSTGRES_DSN works
#
# Running as root: postgres refuses to run as root, so the cluster is owned and run by the
# `postgres` system user (created by Debian's postgresql-common). The run dir usually lies under
# /root (mode 700), which that user cannot traverse. Rather than opening /root to everyone
# (chmod o+x) or moving the data elsewhere, `start` grants the postgres user alone search (x)
# permission on each blocking parent directory with a POSIX ACL (setfacl -m u:postgres:x), and
# falls back to chmod o+x only where the filesystem has no ACLs. Nothing is made readable.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PG_USER=postgres
PG_RUN="$(svc_dir postgres)"
PG_DATA="$PG_RUN/data"
PG_SHARED_CONF="$DEPLOY_LOCAL_DIR/postgres/weir.conf"   # settings shared with docker-compose.yml
PG_SOCK="$PG_RUN/sock"   # unix socket dir: admin connections as the postgres user (peer auth)
# A unix socket path must fit in 107 bytes; a long run dir falls back to a short path in /tmp.
(( ${#PG_SOCK} + 20 < 107 )) || PG_SOCK="/tmp/weir-pg-$WEIR_POSTGRES_PORT"

# Server binaries: PostgreSQL 15 (Debian 12's), else the newest installed major.
pg_bin() {
  if [[ -n "${WEIR_PG_BIN:-}" ]]; then echo "$WEIR_PG_BIN"; return; fi
  if [[ -x /usr/lib/postgresql/15/bin/postgres ]]; then echo /usr/lib/postgresql/15/bin; return; fi
  local d; d="$(printf '%s\n' /usr/lib/postgresql/*/bin | grep -v '[*]' | sort -V | tail -n 1 || true)"
  echo "${d:-/usr/lib/postgresql/15/bin}"
}
PG_BIN="$(pg_bin)"

# Role, password and database come from the DSN, so an overridden DSN still works.
if [[ "$WEIR_POSTGRES_DSN" =~ ^postgres(ql)?://([^:@/]+):([^@/]*)@[^/]+/([^?/]+) ]]; then
  DB_ROLE="${BASH_REMATCH[2]}" DB_PASS="${BASH_REMATCH[3]}" DB_NAME="${BASH_REMATCH[4]}"
else
  fail postgres "WEIR_POSTGRES_DSN must look like postgresql://USER:PASSWORD@HOST:PORT/DB, got '$WEIR_POSTGRES_DSN'"
fi

install() {
  mkdir -p "$PG_RUN"
  local pkgs=()
  [[ -x "$PG_BIN/postgres" && -x "$PG_BIN/initdb" && -x "$PG_BIN/psql" ]] || pkgs+=(postgresql)
  command -v setfacl >/dev/null || pkgs+=(acl)
  (( ${#pkgs[@]} == 0 )) || apt_get_install postgres "${pkgs[@]}"
  PG_BIN="$(pg_bin)"
  [[ -x "$PG_BIN/postgres" ]] || fail postgres "no server binary in $PG_BIN after installing postgresql"
  id -u "$PG_USER" >/dev/null 2>&1 || fail postgres "no '$PG_USER' system user (it comes with postgresql-common)"
}

# as_pg CMD...: run CMD as the postgres user with a clean environment, from / (root's cwd may be
# unreadable to it). setpriv execs, so no waiting parent stands between us and the process.
as_pg() { (cd / && exec setpriv --reuid="$PG_USER" --regid="$PG_USER" --init-groups --reset-env "$@"); }

# let_pg_reach DIR: give the postgres user search permission on every parent of DIR it cannot pass.
let_pg_reach() {
  as_pg test -x "$1" && return 0
  local path="" part
  local -a parts
  IFS=/ read -r -a parts <<<"${1#/}"
  for part in "${parts[@]}"; do
    path="$path/$part"
    [[ -d "$path" ]] || break
    as_pg test -x "$path" && continue
    if setfacl -m "u:$PG_USER:x" "$path" 2>/dev/null; then
      info "postgres: granted user $PG_USER search (x) on $path with an ACL"
    else
      chmod o+x "$path"
      info "postgres: chmod o+x $path (no ACL support) so that user $PG_USER can reach its data"
    fi
  done
  as_pg test -x "$1" || fail postgres "user $PG_USER cannot reach $1"
}

prepare_dirs() {
  mkdir -p "$PG_DATA" "$PG_SOCK"
  chown "$PG_USER:$PG_USER" "$PG_DATA" "$PG_SOCK"
  chmod 700 "$PG_DATA" "$PG_SOCK"
  let_pg_reach "$PG_DATA"
  let_pg_reach "$PG_SOCK"
}

init_cluster() {
  if [[ -f "$PG_DATA/PG_VERSION" ]]; then
    local have want; have="$(cat "$PG_DATA/PG_VERSION")"
    want="$("$PG_BIN/postgres" --version | awk '{print $3}' | cut -d. -f1)"
    [[ "$have" == "$want" ]] || fail postgres "$PG_DATA holds a PostgreSQL $have cluster but the server is $want: remove that directory"
    return 0
  fi
  info "postgres: initdb $PG_DATA (once)"
  as_pg "$PG_BIN/initdb" -D "$PG_DATA" -U postgres -E UTF8 --locale=C --no-sync \
      --auth-local=peer --auth-host=scram-sha-256 >>"$(svc_log postgres)" 2>&1 \
    || fail postgres "initdb of $PG_DATA failed"
  echo "include = 'weir.conf'   # written by deploy/local/postgres.sh" >>"$PG_DATA/postgresql.conf"
}

write_config() {
  {
    cat <<CONF
# written by deploy/local/postgres.sh on every start; edit the script or
# deploy/local/postgres/weir.conf (the settings shared with docker-compose.yml), not this file
listen_addresses = '127.0.0.1'
port = $WEIR_POSTGRES_PORT
unix_socket_directories = '$PG_SOCK'
CONF
    cat "$PG_SHARED_CONF"
    cat <<CONF
shared_buffers = 64MB
# A throw-away local test cluster: durability is traded for speed. A crash of the machine may
# lose or corrupt this data. Never copy these three settings to a real deployment.
fsync = off
synchronous_commit = off
full_page_writes = off
CONF
  } >"$PG_DATA/weir.conf"
  chown "$PG_USER:$PG_USER" "$PG_DATA/weir.conf"
}

ready() { "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$WEIR_POSTGRES_PORT" -t 2; }

# psql_admin ARGS...: psql as the postgres superuser over the unix socket (peer auth).
psql_admin() {
  as_pg "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$PG_SOCK" -p "$WEIR_POSTGRES_PORT" -U postgres -d postgres "$@"
}

# Create (or reset the password of) the DSN's role, and create its database; idempotent.
bootstrap() {
  psql_admin -v role="$DB_ROLE" -v pass="$DB_PASS" -v db="$DB_NAME" >>"$(svc_log postgres)" 2>&1 <<'SQL' \
    || fail postgres "could not create role $DB_ROLE and database $DB_NAME"
SELECT format('CREATE ROLE %I', :'role') WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'role') \gexec
SELECT format('ALTER ROLE %I LOGIN SUPERUSER PASSWORD %L', :'role', :'pass') \gexec
SELECT format('CREATE DATABASE %I OWNER %I', :'db', :'role') WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'db') \gexec
SQL
}

can_login() { [[ "$("$PG_BIN/psql" -X -qtA -c 'SELECT 1' "$WEIR_POSTGRES_DSN" 2>/dev/null)" == 1 ]]; }

health() { pid_alive postgres && ready && can_login; }

# stale_settings: the settings of deploy/local/postgres/weir.conf the running server does not have
# (name=running_value, space-separated; empty when it has them all).
stale_settings() {
  local name value running stale=()
  while IFS='=' read -r name value; do
    name="$(echo "$name" | tr -d '[:space:]')"; value="$(echo "$value" | tr -d "[:space:]'")"
    [[ -z "$name" || "$name" == \#* ]] && continue
    running="$(psql_admin -tA -c "SELECT current_setting('$name')" 2>/dev/null)" || running="?"
    [[ "$running" == "$value" ]] || stale+=("$name=$running(want $value)")
  done <"$PG_SHARED_CONF"
  echo "${stale[*]}"
}

start() {
  install
  if pid_alive postgres; then   # ours is running: healthy now, or still starting
    wait_until postgres 60 ready
    local stale; stale="$(stale_settings)"
    if [[ -z "$stale" ]]; then
      bootstrap
      wait_until postgres 10 can_login
      info "postgres: already up at $WEIR_POSTGRES_DSN"
      return 0
    fi
    # A setting of weir.conf changed since this server started (wal_level for the CDC source, say):
    # the shared settings need a restart to take effect.
    info "postgres: restarting to apply $stale (deploy/local/postgres/weir.conf)"
    stop
  fi
  rm -f "$(svc_pidfile postgres)"
  require_port_free postgres "$WEIR_POSTGRES_PORT"
  prepare_dirs
  init_cluster
  write_config
  start_daemon postgres setpriv --reuid="$PG_USER" --regid="$PG_USER" --init-groups --reset-env \
    "$PG_BIN/postgres" -D "$PG_DATA"
  wait_until postgres 60 ready
  bootstrap
  wait_until postgres 10 can_login
  info "postgres: up at $WEIR_POSTGRES_DSN (pid $(cat "$(svc_pidfile postgres)"), $("$PG_BIN/postgres" --version))"
}

# SIGINT asks the postmaster for a fast shutdown (abort open transactions, checkpoint, exit);
# stop_pid's SIGTERM after it (a smart shutdown) is then a no-op, and it waits for the exit.
stop() {
  if pid_alive postgres; then kill -INT "$(cat "$(svc_pidfile postgres)")" 2>/dev/null || true; fi
  stop_pid postgres
}

case "${1:-}" in
  install) install ;;
  start)   start ;;
  stop)    stop ;;
  status)  status_line postgres ;;
  health)  health ;;
  *) echo "usage: $0 install|start|stop|status|health" >&2; exit 2 ;;
esac
