#!/usr/bin/env bash
# Start, stop and report Weir's local services: PostgreSQL, the S3 server, Kafka, Prometheus, Alertmanager.
#   infra.sh up [SERVICE...]     install on first use, start, health-check (idempotent)
#   infra.sh down [SERVICE...]   stop by pid
#   infra.sh status              endpoints as NAME=value lines, then each service's state
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ALL_SERVICES=(postgres s3 kafka prometheus alertmanager)

cmd="${1:-status}"; shift || true
services=("$@"); (( ${#services[@]} )) || services=("${ALL_SERVICES[@]}")

# One `up` or `down` at a time: callers at once (the test sessions' `services` fixture, the workers of
# `make test`'s parallel integration run, `make infra-up` beside them) would each find a service down
# and start it twice. fd 8: the services (start_daemon) inherit no descriptor, so none holds the lock.
INFRA_LOCK_TIMEOUT_S=1800   # a first `up` installs the services
lock_infra() {
  mkdir -p "$WEIR_RUN_DIR"
  exec 8>"$WEIR_RUN_DIR/infra.lock"
  flock -w "$INFRA_LOCK_TIMEOUT_S" 8 \
    || { echo "weir infra: another infra.sh up/down held $WEIR_RUN_DIR/infra.lock for ${INFRA_LOCK_TIMEOUT_S}s" >&2; exit 1; }
}

case "$cmd" in
  up)
    lock_infra
    started=()
    for s in "${services[@]}"; do
      was_up=0; "$DEPLOY_LOCAL_DIR/$s.sh" health >/dev/null 2>&1 && was_up=1
      t0=$(date +%s%N)
      if ! "$DEPLOY_LOCAL_DIR/$s.sh" start; then
        # Nothing left half-started: stop what this invocation started.
        for t in "${started[@]}"; do "$DEPLOY_LOCAL_DIR/$t.sh" stop || true; done
        exit 1
      fi
      (( was_up )) || started+=("$s")
      ms=$(( ($(date +%s%N) - t0) / 1000000 ))
      info "$s ready in $((ms / 1000)).$(printf '%03d' $((ms % 1000)))s"
    done
    ;;
  down)
    lock_infra
    for s in "${services[@]}"; do "$DEPLOY_LOCAL_DIR/$s.sh" stop || true; done
    ;;
  status)
    env | grep -E '^WEIR_' | sort
    echo "WEIR_CACHE_DIR=$WEIR_CACHE_DIR"
    echo "WEIR_RUN_DIR=$WEIR_RUN_DIR"
    for s in "${ALL_SERVICES[@]}"; do "$DEPLOY_LOCAL_DIR/$s.sh" status >&2 || true; done
    ;;
  *)
    echo "usage: infra.sh up|down|status [SERVICE...]" >&2; exit 2;;
esac
