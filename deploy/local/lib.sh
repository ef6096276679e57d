#!/usr/bin/env bash
# Shared helpers for Weir's local services. Source it; do not run it.
# Every service script uses the same layout:
#   $WEIR_CACHE_DIR/<service>/...   installed binaries and jars (kept between runs)
#   $WEIR_RUN_DIR/<service>/data    data directory
#   $WEIR_RUN_DIR/<service>/<service>.log   log file
#   $WEIR_RUN_DIR/<service>/<service>.pid   pid of the running server
set -euo pipefail

WEIR_CACHE_DIR="${WEIR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/weir}"
WEIR_RUN_DIR="${WEIR_RUN_DIR:-$WEIR_CACHE_DIR/run}"
DEPLOY_LOCAL_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$DEPLOY_LOCAL_DIR/../.." && pwd)"
# Endpoint defaults live in weir/core/endpoints.env (shared with weir/core/config.py); the environment wins.
load_endpoints() {
  local name value
  while IFS='=' read -r name value; do
    [[ -z "$name" || "$name" == \#* ]] && continue
    if [[ -z "${!name:-}" ]]; then eval "export $name=\"$value\""; else export "${name?}"; fi
  done <"$REPO_ROOT/weir/core/endpoints.env"
}
load_endpoints

svc_dir()  { echo "$WEIR_RUN_DIR/$1"; }
svc_log()  { echo "$WEIR_RUN_DIR/$1/$1.log"; }
svc_pidfile() { echo "$WEIR_RUN_DIR/$1/$1.pid"; }

# fail SERVICE CAUSE: one clear line naming the service, the cause and the log file; exit 1.
fail() {
  local service="$1" cause="$2"
  echo "weir infra: $service failed: $cause (log: $(svc_log "$service"))" >&2
  exit 1
}

info() { echo "weir infra: $*" >&2; }

# pid_alive SERVICE: true when the pid file names a live process.
pid_alive() {
  local pidfile; pidfile="$(svc_pidfile "$1")"
  [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

# port_free PORT: true when nothing listens on 127.0.0.1:PORT.
port_free() {
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# require_port_free SERVICE PORT
require_port_free() {
  if ! port_free "$2"; then
    fail "$1" "port 127.0.0.1:$2 is already taken by another process (free it or set the WEIR_*_PORT variable)"
  fi
}

# wait_until SERVICE SECONDS CMD...: poll CMD every 0.2 s until it succeeds or the deadline passes.
# Fails (and stops the service) when the process died or the deadline passed.
wait_until() {
  local service="$1" seconds="$2"; shift 2
  local deadline=$(( $(date +%s) + seconds ))
  while (( $(date +%s) < deadline )); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    if ! pid_alive "$service"; then
      tail -n 20 "$(svc_log "$service")" >&2 || true
      rm -f "$(svc_pidfile "$service")"
      fail "$service" "process exited during start-up"
    fi
    sleep 0.2
  done
  tail -n 20 "$(svc_log "$service")" >&2 || true
  stop_pid "$service"
  fail "$service" "not healthy after ${seconds}s"
}

# start_daemon SERVICE CMD...: run CMD in the background with its output in the log, record its pid.
start_daemon() {
  local service="$1"; shift
  mkdir -p "$(svc_dir "$service")"
  # The daemon inherits no descriptor but its log and /dev/null: not the start lock of the calling
  # script (fd 9), nor a lock or pipe of whatever ran the script (`flock LOCK make test` would
  # otherwise leave the lock held by the daemon for as long as it runs).
  (
    for fd in /proc/self/fd/*; do
      fd="${fd##*/}"
      if (( fd > 2 )); then eval "exec ${fd}>&-" 2>/dev/null || true; fi
    done
    exec nohup setsid "$@"
  ) >>"$(svc_log "$service")" 2>&1 </dev/null &
  echo $! >"$(svc_pidfile "$service")"
}

# stop_pid SERVICE: SIGTERM the recorded pid, wait up to 20 s, then SIGKILL. Idempotent.
stop_pid() {
  local service="$1" pidfile pid
  pidfile="$(svc_pidfile "$service")"
  [[ -f "$pidfile" ]] || return 0
  pid="$(cat "$pidfile")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$(( $(date +%s) + 20 ))
    while kill -0 "$pid" 2>/dev/null && (( $(date +%s) < deadline )); do sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}

# apt_get_install SERVICE PKG...: apt-get update, install without recommends, and keep the packages'
# maintainer scripts from starting a system service (policy-rc.d answers 101). Output goes to the log.
apt_get_install() {
  local service="$1"; shift
  local guard=0 rc=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && guard=1
  fi
  info "$service: apt-get install $* (once)"
  mkdir -p "$(svc_dir "$service")"
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"; } \
    >>"$(svc_log "$service")" 2>&1 || rc=$?
  (( guard )) && rm -f /usr/sbin/policy-rc.d
  (( rc == 0 )) || fail "$service" "apt-get install $* failed"
}

# status_line SERVICE: "up" or "down"
status_line() {
  if pid_alive "$1"; then echo "$1: up (pid $(cat "$(svc_pidfile "$1")"), log $(svc_log "$1"))"; else echo "$1: down"; fi
}
