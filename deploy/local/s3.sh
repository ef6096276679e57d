#!/usr/bin/env bash
# Weir's local S3 server (checkpoint storage): versitygw, Apache-2.0, serving S3 from a
# plain directory (posix backend). Built from the Go module proxy, never vendored.
#
#   deploy/local/s3.sh install   build the pinned versitygw into $WEIR_CACHE_DIR/s3/ (idempotent)
#   deploy/local/s3.sh start     install if needed, start on 127.0.0.1:$WEIR_S3_PORT, wait until it
#                                serves S3, create $WEIR_S3_BUCKET (idempotent: up and healthy -> 0)
#   deploy/local/s3.sh stop      stop it (idempotent)
#   deploy/local/s3.sh status    one line: up or down
#   deploy/local/s3.sh health    exit 0 when it serves S3 with Weir's keys and the bucket exists
#
# Needs: go >= 1.25 (first install only; PATH or /usr/local/go/bin), curl >= 7.75 (--aws-sigv4),
# and a data directory on a filesystem with user xattrs (versitygw keeps object metadata there;
# where the filesystem has none, the server exits with "xattr check failed": set WEIR_S3_SIDECAR=1 to
# keep metadata in $WEIR_RUN_DIR/s3/meta instead, on a fresh data directory: do not switch a used one).
# Clients: endpoint $WEIR_S3_ENDPOINT, region $WEIR_S3_REGION (the server's too), path-style addressing,
# the keys WEIR_S3_ACCESS_KEY/WEIR_S3_SECRET_KEY: endpoints.env's, which Weir's processes take in the local mode.
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

SERVICE=s3
S3_NAME=versitygw
S3_MODULE=github.com/versity/versitygw
S3_VERSION="${WEIR_S3_SERVER_VERSION:-v1.8.0}"
S3_PACKAGE="$S3_MODULE/cmd/versitygw"
S3_REGION="${WEIR_S3_REGION:-us-east-1}"
S3_INSTALL_DIR="$WEIR_CACHE_DIR/s3/$S3_NAME-$S3_VERSION"
S3_BIN="$S3_INSTALL_DIR/bin/versitygw"
S3_DATA_DIR="$(svc_dir "$SERVICE")/data"
S3_META_DIR="$(svc_dir "$SERVICE")/meta"
S3_BUILD_TIMEOUT="${WEIR_S3_BUILD_TIMEOUT:-1200}"   # a cold build takes ~2.5 min on 2 cores
S3_START_TIMEOUT="${WEIR_S3_START_TIMEOUT:-30}"
S3_LOCAL_URL="http://127.0.0.1:$WEIR_S3_PORT"
# sha256 of the empty body, which every request made here has.
EMPTY_SHA256=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855

log_line() { mkdir -p "$(svc_dir "$SERVICE")"; echo "[$(date -u +%FT%TZ)] s3.sh: $*" >>"$(svc_log "$SERVICE")"; }

find_go() {
  if command -v go >/dev/null 2>&1; then command -v go
  elif [[ -x /usr/local/go/bin/go ]]; then echo /usr/local/go/bin/go
  else return 1
  fi
}

require_curl() {
  command -v curl >/dev/null 2>&1 \
    || fail "$SERVICE" "curl not found (needed for the health check and bucket creation; apt-get install curl)"
  curl --help all 2>/dev/null | grep -q -- '--aws-sigv4' \
    || fail "$SERVICE" "curl $(curl --version | head -n1 | cut -d' ' -f2) lacks --aws-sigv4 (need curl >= 7.75)"
}

cmd_install() {
  if [[ -x "$S3_BIN" ]]; then return 0; fi
  local go; go="$(find_go)" || fail "$SERVICE" "go toolchain not found (need Go >= 1.25 on PATH or in /usr/local/go/bin to build $S3_NAME)"
  mkdir -p "$WEIR_CACHE_DIR/s3"
  local tmp; tmp="$(mktemp -d "$WEIR_CACHE_DIR/s3/.$S3_NAME-$S3_VERSION.partial.XXXXXX")"; chmod 755 "$tmp"
  info "building $S3_NAME $S3_VERSION from the Go module proxy (a few minutes the first time; log: $(svc_log "$SERVICE"))"
  log_line "go install $S3_PACKAGE@$S3_VERSION with $("$go" version)"
  # Built outside any module/workspace, with cgo off (static binary, no C compiler needed).
  if ! (cd "$tmp" && GOBIN="$tmp/bin" GOWORK=off GOFLAGS='' CGO_ENABLED=0 \
          timeout "$S3_BUILD_TIMEOUT" "$go" install -trimpath \
            -ldflags "-X=main.Version=$S3_VERSION -X=main.Build=module-proxy" \
            "$S3_PACKAGE@$S3_VERSION") >>"$(svc_log "$SERVICE")" 2>&1; then
    rm -rf "$tmp"
    fail "$SERVICE" "building $S3_PACKAGE@$S3_VERSION failed or took over ${S3_BUILD_TIMEOUT}s"
  fi
  # Publish atomically: a half-built install never looks installed.
  if ! mv -T "$tmp" "$S3_INSTALL_DIR" 2>/dev/null; then
    rm -rf "$tmp"   # another install won the race
  fi
  [[ -x "$S3_BIN" ]] || fail "$SERVICE" "build finished but $S3_BIN is missing"
  log_line "installed $S3_BIN"
}

# s3_answers: true when the port answers an anonymous request with an S3 XML error.
s3_answers() {
  local body
  if command -v curl >/dev/null 2>&1; then
    body="$(curl -s --max-time 2 "$S3_LOCAL_URL/")" || return 1
  else  # no curl: a raw HTTP/1.0 request through bash's /dev/tcp
    # shellcheck disable=SC2016  # $1 expands in the inner bash
    body="$(timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"; printf "GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" >&3; cat <&3' _ "$WEIR_S3_PORT")" || return 1
  fi
  [[ "$body" == *"<Error>"*"<Code>"* ]]
}

# s3_signed PATH [curl args...]: a SigV4-signed request with Weir's keys; prints the HTTP code.
# The keys go to curl on stdin, so they never show up in the process list.
s3_signed() {
  local path="$1"; shift
  printf 'user = "%s:%s"\n' "$WEIR_S3_ACCESS_KEY" "$WEIR_S3_SECRET_KEY" \
    | curl -s --max-time 5 -K - -o /dev/null -w '%{http_code}' \
        --aws-sigv4 "aws:amz:$S3_REGION:s3" -H "x-amz-content-sha256: $EMPTY_SHA256" \
        "$@" "$S3_LOCAL_URL$path"
}

ensure_bucket() {
  local code
  code="$(s3_signed "/$WEIR_S3_BUCKET" --head)" || true
  case "$code" in
    200) return 0 ;;
    404) ;;
    403) stop_pid "$SERVICE"; fail "$SERVICE" "the server rejected Weir's keys (HTTP 403 on HEAD /$WEIR_S3_BUCKET)" ;;
    *)   stop_pid "$SERVICE"; fail "$SERVICE" "HEAD /$WEIR_S3_BUCKET answered HTTP '$code'" ;;
  esac
  code="$(s3_signed "/$WEIR_S3_BUCKET" -X PUT)" || true
  case "$code" in
    200|409) log_line "bucket $WEIR_S3_BUCKET created (HTTP $code)" ;;   # 409: created concurrently
    *) stop_pid "$SERVICE"; fail "$SERVICE" "creating bucket $WEIR_S3_BUCKET answered HTTP '$code'" ;;
  esac
}

cmd_start() {
  require_curl
  # One start (or install) at a time: concurrent starts would race for the port and the pid file.
  mkdir -p "$(svc_dir "$SERVICE")"
  exec 9>"$(svc_dir "$SERVICE")/start.lock"
  flock -w "$(( S3_BUILD_TIMEOUT + 60 ))" 9 || fail "$SERVICE" "another s3.sh start still holds $(svc_dir "$SERVICE")/start.lock"
  if pid_alive "$SERVICE"; then
    if s3_answers; then
      ensure_bucket
      info "s3 already up at $WEIR_S3_ENDPOINT (pid $(cat "$(svc_pidfile "$SERVICE")"))"
      return 0
    fi
    # Recorded process alive but not serving: it may still be starting; wait, or stop it and fail.
    wait_until "$SERVICE" "$S3_START_TIMEOUT" s3_answers
    ensure_bucket
    return 0
  fi
  rm -f "$(svc_pidfile "$SERVICE")"
  cmd_install
  require_port_free "$SERVICE" "$WEIR_S3_PORT"
  mkdir -p "$S3_DATA_DIR"
  local backend_opts=()
  if [[ -n "${WEIR_S3_SIDECAR:-}" && "${WEIR_S3_SIDECAR}" != 0 ]]; then
    mkdir -p "$S3_META_DIR"; backend_opts=(--sidecar "$S3_META_DIR")
  fi
  log_line "starting $S3_NAME $S3_VERSION on 127.0.0.1:$WEIR_S3_PORT, data $S3_DATA_DIR"
  trap 'stop_pid "$SERVICE"; exit 130' INT TERM
  # Keys via the environment (not argv); --quiet drops the per-request log lines.
  start_daemon "$SERVICE" env ROOT_ACCESS_KEY="$WEIR_S3_ACCESS_KEY" ROOT_SECRET_KEY="$WEIR_S3_SECRET_KEY" \
    "$S3_BIN" --port "127.0.0.1:$WEIR_S3_PORT" --region "$S3_REGION" --quiet \
    posix "${backend_opts[@]}" "$S3_DATA_DIR" 9>&-   # the server must not inherit the start lock
  wait_until "$SERVICE" "$S3_START_TIMEOUT" s3_answers
  ensure_bucket
  trap - INT TERM
  info "s3 up at $WEIR_S3_ENDPOINT ($S3_NAME $S3_VERSION, bucket $WEIR_S3_BUCKET, data $S3_DATA_DIR)"
}

cmd_stop() {
  stop_pid "$SERVICE"
  info "s3 stopped"
}

cmd_health() {
  pid_alive "$SERVICE" || fail "$SERVICE" "not running"
  s3_answers || fail "$SERVICE" "127.0.0.1:$WEIR_S3_PORT does not answer S3 requests"
  require_curl
  local code; code="$(s3_signed "/$WEIR_S3_BUCKET" --head)" || true
  [[ "$code" == 200 ]] || fail "$SERVICE" "HEAD /$WEIR_S3_BUCKET with Weir's keys answered HTTP '$code'"
  echo "s3: healthy ($WEIR_S3_ENDPOINT, bucket $WEIR_S3_BUCKET)"
}

case "${1:-}" in
  install) cmd_install ;;
  start)   cmd_start ;;
  stop)    cmd_stop ;;
  status)  status_line "$SERVICE" ;;
  health)  cmd_health ;;
  *) echo "usage: $0 install|start|stop|status|health" >&2; exit 2 ;;
esac
