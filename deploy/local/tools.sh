#!/usr/bin/env bash
# Deployment tools the tests use to check docker-compose.yml and deploy/kubernetes/ without a
# container engine or a cluster: the compose CLI (`docker-compose config`) and kustomize
# (`kustomize build`), pinned, built from the Go module proxy into $WEIR_CACHE_DIR/tools/, never
# vendored. CI builds them once (`make tools`) and keeps them in the shared cache.
#
#   deploy/local/tools.sh install [NAME...]   build the pinned tools (default: all) if missing (idempotent)
#   deploy/local/tools.sh path NAME           print the installed binary's path (exit 1 when not installed)
#   deploy/local/tools.sh versions            one line per tool: NAME VERSION
#
# NAME: docker-compose | kustomize. Exit status of install: 0 installed, 3 the Go module proxy cannot
# be reached (the tests that need the tool then fail, saying so), 1 any other failure.
# Needs: go >= 1.24 (PATH or /usr/local/go/bin). A cold build on 2 cores: docker-compose ~6-8 min,
# kustomize ~1-2 min (measured under load; see docs/deployment.md).
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

SERVICE=tools
TOOLS_DIR="$WEIR_CACHE_DIR/tools"
TOOLS_BUILD_TIMEOUT="${WEIR_TOOLS_BUILD_TIMEOUT:-1800}"
EXIT_PROXY_UNREACHABLE=3
info() { echo "weir tools: $*" >&2; }

# NAME -> module, version, package inside the module (relative to the module root)
declare -A TOOL_MODULE=(
  [docker-compose]=github.com/docker/compose/v2
  [kustomize]=sigs.k8s.io/kustomize/kustomize/v5
)
declare -A TOOL_VERSION=(
  [docker-compose]="${WEIR_COMPOSE_VERSION:-v2.40.3}"
  [kustomize]="${WEIR_KUSTOMIZE_VERSION:-v5.8.1}"
)
declare -A TOOL_PACKAGE=(
  [docker-compose]=./cmd
  [kustomize]=.
)
# How the build stamps the version into the binary (what `NAME version` prints).
declare -A TOOL_LDFLAGS=(
  [docker-compose]="-X github.com/docker/compose/v2/internal.Version=${TOOL_VERSION[docker-compose]}"
  [kustomize]="-X sigs.k8s.io/kustomize/api/provenance.version=${TOOL_VERSION[kustomize]}"
)
TOOLS=(docker-compose kustomize)

log_file() { echo "$WEIR_RUN_DIR/$SERVICE/$SERVICE.log"; }
log_line() { mkdir -p "$WEIR_RUN_DIR/$SERVICE"; echo "[$(date -u +%FT%TZ)] tools.sh: $*" >>"$(log_file)"; }

find_go() {
  if command -v go >/dev/null 2>&1; then command -v go
  elif [[ -x /usr/local/go/bin/go ]]; then echo /usr/local/go/bin/go
  else return 1
  fi
}

tool_bin() { echo "$TOOLS_DIR/$1-${TOOL_VERSION[$1]}/bin/$1"; }

require_tool_name() {
  [[ -n "${TOOL_MODULE[$1]:-}" ]] || { echo "tools.sh: unknown tool $1 (known: ${TOOLS[*]})" >&2; exit 1; }
}

# proxy_reachable GO MODULE VERSION: true when the first proxy of GOPROXY serves the module's .info.
proxy_reachable() {
  local go="$1" module="$2" version="$3" proxy
  proxy="$("$go" env GOPROXY | cut -d, -f1 | cut -d'|' -f1)"
  case "$proxy" in off | direct | "") return 1 ;; esac
  command -v curl >/dev/null 2>&1 || return 0   # cannot tell: treat the failure as a real one
  curl -sf --max-time 15 -o /dev/null "$proxy/$module/@v/$version.info"
}

install_one() {
  local name="$1"
  local bin; bin="$(tool_bin "$name")"
  [[ -x "$bin" ]] && return 0
  local module="${TOOL_MODULE[$name]}" version="${TOOL_VERSION[$name]}" package="${TOOL_PACKAGE[$name]}"
  local go; go="$(find_go)" || { echo "tools.sh: go not found (need Go >= 1.24 on PATH or in /usr/local/go/bin to build $name)" >&2; return 1; }
  mkdir -p "$TOOLS_DIR"
  local tmp; tmp="$(mktemp -d "$TOOLS_DIR/.$name-$version.partial.XXXXXX")"; chmod 755 "$tmp"
  info "building $name $version from the Go module proxy (minutes the first time; log: $(log_file))"
  log_line "build $module@$version ($package) with $("$go" version)"
  local started=$SECONDS
  # The module is built as the main module, in its own directory of the module cache: its go.mod
  # (replace/exclude directives that `go install pkg@version` refuses) and go.sum decide every
  # dependency. cgo off: a static binary, no C compiler needed.
  local dir
  if dir="$(GOWORK=off GOFLAGS='' timeout 600 "$go" mod download -json "$module@$version" 2>>"$(log_file)" \
              | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')" && [[ -n "$dir" ]] \
     && (cd "$dir" && GOWORK=off GOFLAGS=-mod=readonly CGO_ENABLED=0 timeout "$TOOLS_BUILD_TIMEOUT" \
            "$go" build -trimpath -ldflags "-s -w ${TOOL_LDFLAGS[$name]}" -o "$tmp/bin/$name" "$package") \
          >>"$(log_file)" 2>&1; then
    if ! mv -T "$tmp" "$TOOLS_DIR/$name-$version" 2>/dev/null; then rm -rf "$tmp"; fi   # another install won
    log_line "installed $bin in $((SECONDS - started))s"
    [[ -x "$bin" ]] || { echo "tools.sh: build finished but $bin is missing" >&2; return 1; }
    return 0
  fi
  rm -rf "$tmp"
  if ! proxy_reachable "$go" "$module" "$version"; then
    log_line "the Go module proxy does not answer for $module@$version"
    echo "tools.sh: $name not built: the Go module proxy cannot be reached ($("$go" env GOPROXY)); log: $(log_file)" >&2
    return "$EXIT_PROXY_UNREACHABLE"
  fi
  echo "tools.sh: building $module@$version failed or took over ${TOOLS_BUILD_TIMEOUT}s (log: $(log_file))" >&2
  return 1
}

cmd_install() {
  local names=("$@") status=0 rc
  (( ${#names[@]} )) || names=("${TOOLS[@]}")
  for name in "${names[@]}"; do
    require_tool_name "$name"
    rc=0; install_one "$name" || rc=$?
    if (( rc == EXIT_PROXY_UNREACHABLE && status == 0 )); then status=$rc; elif (( rc != 0 && rc != EXIT_PROXY_UNREACHABLE )); then status=1; fi
  done
  return "$status"
}

cmd_path() {
  require_tool_name "${1:?usage: tools.sh path NAME}"
  local bin; bin="$(tool_bin "$1")"
  [[ -x "$bin" ]] || { echo "tools.sh: $1 ${TOOL_VERSION[$1]} is not installed (deploy/local/tools.sh install $1)" >&2; return 1; }
  echo "$bin"
}

case "${1:-}" in
  install) shift; cmd_install "$@" ;;
  path) shift; cmd_path "$@" ;;
  versions) for name in "${TOOLS[@]}"; do echo "$name ${TOOL_VERSION[$name]}"; done ;;
  *) echo "usage: deploy/local/tools.sh install [NAME...] | path NAME | versions   (NAME: ${TOOLS[*]})" >&2; exit 2 ;;
esac
