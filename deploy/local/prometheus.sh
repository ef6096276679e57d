#!/usr/bin/env bash
# Weir's local Prometheus: Debian's /usr/bin/prometheus run as a plain process on
# 127.0.0.1:$WEIR_PROMETHEUS_PORT with deploy/prometheus/prometheus-local.yml and its data in
# $WEIR_RUN_DIR/prometheus/data (kept 2 days). It reads a copy of that config and of its rules in
# $WEIR_RUN_DIR/prometheus/config/, shared by every checkout: a checkout whose config or rules differ
# copies its own there and reloads the server (no restart), and the targets tests add at run time go
# to $WEIR_RUN_DIR/prometheus/config/targets/ whichever checkout runs them.
# Usage: prometheus.sh install|start|stop|status|health
#   install  apt-get install prometheus only when it is missing, and make sure the package's own
#            system service (port 9090) is neither running nor enabled; idempotent
#   start    install if needed, check the config with promtool, start, wait until /-/ready; idempotent
#   stop     stop our server by its pid;  status  print up/down;  health  exit 0 iff /-/ready answers
# The config is reloaded without a restart by: curl -X POST $WEIR_PROMETHEUS_URL/-/reload
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PROM_BIN=/usr/bin/prometheus
PROMTOOL=/usr/bin/promtool
PROM_RUN="$(svc_dir prometheus)"
PROM_SOURCE="$REPO_ROOT/deploy/prometheus"
PROM_CONFIG_DIR="$PROM_RUN/config"
PROM_CONFIG="$PROM_CONFIG_DIR/prometheus-local.yml"

# The Debian package ships a system service (user prometheus, port 9090) that Weir never uses.
# policy-rc.d keeps the package from starting it; should anything have started it anyway, stop
# it through its own init system, and disable it so that no boot starts it.
no_system_service() {
  local log; log="$(svc_log prometheus)"
  if command -v systemctl >/dev/null; then   # without a running systemd this only drops the links
    if [[ -d /run/systemd/system ]]; then systemctl disable --now prometheus >>"$log" 2>&1 || true
    else systemctl disable prometheus >>"$log" 2>&1 || true; fi
  fi
  if [[ -x /etc/init.d/prometheus ]]; then    # sysvinit script: pid file /run/prometheus/prometheus.pid
    service prometheus stop >>"$log" 2>&1 || true
    update-rc.d prometheus disable >>"$log" 2>&1 || true
  fi
  if ps -u prometheus -o stat=,comm= 2>/dev/null | awk '$1 !~ /^Z/ && $2 == "prometheus"' | grep -q .; then
    info "prometheus: WARNING: the Debian package's own prometheus (user prometheus) still runs; stop it by hand"
  fi
}

install() {
  mkdir -p "$PROM_RUN"
  if [[ ! -x "$PROM_BIN" || ! -x "$PROMTOOL" ]]; then
    apt_get_install prometheus prometheus
    [[ -x "$PROM_BIN" && -x "$PROMTOOL" ]] || fail prometheus "no $PROM_BIN or $PROMTOOL after installing prometheus"
    no_system_service
  fi
}

# ready: GET /-/ready answers 200 (curl when present, else python3's urllib).
ready() {
  if command -v curl >/dev/null; then
    curl -fsS -o /dev/null --max-time 2 "$WEIR_PROMETHEUS_URL/-/ready"
  else
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$WEIR_PROMETHEUS_URL/-/ready"
  fi
}

health() { pid_alive prometheus && ready; }

# The --config.file of the running Prometheus (empty when it cannot be read).
running_config() {
  tr '\0' '\n' <"/proc/$(cat "$(svc_pidfile prometheus)")/cmdline" 2>/dev/null | sed -n 's/^--config.file=//p'
}

# 0 when the shared copy holds this checkout's config and rules as they are.
config_current() {
  cmp -s "$PROM_SOURCE/prometheus-local.yml" "$PROM_CONFIG" && diff -rq "$PROM_SOURCE/rules" "$PROM_CONFIG_DIR/rules" >/dev/null 2>&1
}

# This checkout's config and rules copied to the shared directory, checked by promtool first (a
# broken config never replaces a working one); the targets tests wrote there are kept.
copy_config() {
  local staged="$PROM_RUN/config.new"
  rm -rf "$staged"; mkdir -p "$staged"
  cp "$PROM_SOURCE/prometheus-local.yml" "$staged/"; cp -r "$PROM_SOURCE/rules" "$staged/rules"
  "$PROMTOOL" check config "$staged/prometheus-local.yml" >>"$(svc_log prometheus)" 2>&1 \
    || fail prometheus "promtool check config $PROM_SOURCE/prometheus-local.yml failed"
  mkdir -p "$PROM_CONFIG_DIR/targets"
  rm -rf "$PROM_CONFIG_DIR/rules"; mv "$staged/rules" "$PROM_CONFIG_DIR/rules"
  mv "$staged/prometheus-local.yml" "$PROM_CONFIG"; rmdir "$staged"
}

reload() {
  if command -v curl >/dev/null; then
    curl -fsS -o /dev/null --max-time 10 -X POST "$WEIR_PROMETHEUS_URL/-/reload"
  else
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(urllib.request.Request(sys.argv[1], method="POST"), timeout=10)' "$WEIR_PROMETHEUS_URL/-/reload"
  fi
}

start() {
  install
  if pid_alive prometheus; then   # ours is running: healthy now, or still starting
    local config; config="$(running_config)"
    if [[ -n "$config" && "$config" != "$PROM_CONFIG" ]]; then
      # Started by a checkout from before the shared config: it watches that checkout's targets only.
      info "prometheus: the running one reads $config; restarting it with the shared $PROM_CONFIG"
      stop_pid prometheus
    else
      wait_until prometheus 60 ready
      if ! config_current; then   # another checkout's config or rules: this one's, reloaded
        copy_config
        reload || fail prometheus "reloading $PROM_CONFIG failed"
        info "prometheus: already up at $WEIR_PROMETHEUS_URL; reloaded with $PROM_SOURCE's config and rules"
      else
        info "prometheus: already up at $WEIR_PROMETHEUS_URL"
      fi
      return 0
    fi
  fi
  rm -f "$(svc_pidfile prometheus)"
  require_port_free prometheus "$WEIR_PROMETHEUS_PORT"
  copy_config
  mkdir -p "$PROM_RUN/data"
  start_daemon prometheus "$PROM_BIN" \
    --config.file="$PROM_CONFIG" \
    --storage.tsdb.path="$PROM_RUN/data" \
    --storage.tsdb.retention.time=2d \
    --web.listen-address="127.0.0.1:$WEIR_PROMETHEUS_PORT" \
    --web.enable-lifecycle
  wait_until prometheus 60 ready
  info "prometheus: up at $WEIR_PROMETHEUS_URL (pid $(cat "$(svc_pidfile prometheus)"), $("$PROM_BIN" --version 2>&1 | head -n 1))"
}

case "${1:-}" in
  install) install ;;
  start)   start ;;
  stop)    stop_pid prometheus ;;
  status)  status_line prometheus ;;
  health)  health ;;
  *) echo "usage: $0 install|start|stop|status|health" >&2; exit 2 ;;
esac
