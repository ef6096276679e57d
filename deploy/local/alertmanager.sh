#!/usr/bin/env bash
# Weir's local Alertmanager: Debian's /usr/bin/prometheus-alertmanager run as a plain process on
# 127.0.0.1:$WEIR_ALERTMANAGER_PORT with deploy/alertmanager/alertmanager.yml and its data in
# $WEIR_RUN_DIR/alertmanager/data. The local Prometheus (prometheus-local.yml) sends its alerts here.
# Usage: alertmanager.sh install|start|stop|status|health
#   install  apt-get install prometheus-alertmanager only when it is missing, and make sure the
#            package's own system service (port 9093) is neither running nor enabled; idempotent
#   start    install if needed, check the config with amtool, start (no cluster gossip: one
#            instance), wait until /-/ready; idempotent
#   stop     stop our server by its pid;  status  print up/down;  health  exit 0 iff /-/ready answers
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

export WEIR_ALERTMANAGER_PORT="${WEIR_ALERTMANAGER_PORT:-19099}"
export WEIR_ALERTMANAGER_URL="${WEIR_ALERTMANAGER_URL:-http://127.0.0.1:$WEIR_ALERTMANAGER_PORT}"
AM_BIN=/usr/bin/prometheus-alertmanager
AMTOOL=/usr/bin/amtool
AM_RUN="$(svc_dir alertmanager)"
AM_CONFIG="$REPO_ROOT/deploy/alertmanager/alertmanager.yml"

# The Debian package ships a system service (user prometheus, port 9093) that Weir never uses:
# policy-rc.d keeps the package from starting it; disable it so that no boot starts it.
no_system_service() {
  local log; log="$(svc_log alertmanager)"
  if command -v systemctl >/dev/null; then
    if [[ -d /run/systemd/system ]]; then systemctl disable --now prometheus-alertmanager >>"$log" 2>&1 || true
    else systemctl disable prometheus-alertmanager >>"$log" 2>&1 || true; fi
  fi
  if [[ -x /etc/init.d/prometheus-alertmanager ]]; then
    service prometheus-alertmanager stop >>"$log" 2>&1 || true
    update-rc.d prometheus-alertmanager disable >>"$log" 2>&1 || true
  fi
}

install() {
  mkdir -p "$AM_RUN"
  if [[ ! -x "$AM_BIN" || ! -x "$AMTOOL" ]]; then
    apt_get_install alertmanager prometheus-alertmanager
    [[ -x "$AM_BIN" && -x "$AMTOOL" ]] || fail alertmanager "no $AM_BIN or $AMTOOL after installing prometheus-alertmanager"
    no_system_service
  fi
}

ready() {
  if command -v curl >/dev/null; then
    curl -fsS -o /dev/null --max-time 2 "$WEIR_ALERTMANAGER_URL/-/ready"
  else
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$WEIR_ALERTMANAGER_URL/-/ready"
  fi
}

health() { pid_alive alertmanager && ready; }

start() {
  install
  if pid_alive alertmanager; then
    wait_until alertmanager 60 ready
    info "alertmanager: already up at $WEIR_ALERTMANAGER_URL"
    return 0
  fi
  rm -f "$(svc_pidfile alertmanager)"
  require_port_free alertmanager "$WEIR_ALERTMANAGER_PORT"
  "$AMTOOL" check-config "$AM_CONFIG" >>"$(svc_log alertmanager)" 2>&1 \
    || fail alertmanager "amtool check-config $AM_CONFIG failed"
  mkdir -p "$AM_RUN/data"
  start_daemon alertmanager "$AM_BIN" \
    --config.file="$AM_CONFIG" \
    --storage.path="$AM_RUN/data" \
    --web.listen-address="127.0.0.1:$WEIR_ALERTMANAGER_PORT" \
    --cluster.listen-address=
  wait_until alertmanager 60 ready
  info "alertmanager: up at $WEIR_ALERTMANAGER_URL (pid $(cat "$(svc_pidfile alertmanager)"))"
}

case "${1:-}" in
  install) install ;;
  start)   start ;;
  stop)    stop_pid alertmanager ;;
  status)  status_line alertmanager ;;
  health)  health ;;
  *) echo "usage: $0 install|start|stop|status|health" >&2; exit 2 ;;
esac
