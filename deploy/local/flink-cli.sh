#!/usr/bin/env bash
# Apache Flink's command-line client, from Maven Central into a cache outside the repository (the
# local Maven repository $WEIR_CACHE_DIR/maven, shared with bench/flink/build.sh; the jars in
# $WEIR_CACHE_DIR/flink-cli/lib). `flink-cli.sh --print-dir` prints that directory; `flink-cli.sh
# install` fetches when missing; `flink-cli.sh ARGS...` runs `flink ARGS` (CliFrontend) with a
# minimal configuration directory, e.g. `flink-cli.sh list -m 127.0.0.1:8081` against Weir's REST API.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WEIR_CACHE_DIR="${WEIR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/weir}"
OUT="$WEIR_CACHE_DIR/flink-cli"

if [[ "${1:-}" == "--print-dir" ]]; then
  echo "$OUT"
  exit 0
fi
install() {
  [[ -f "$OUT/lib/.complete" ]] && return 0
  for tool in java mvn; do
    command -v "$tool" >/dev/null || { echo "flink-cli: $tool not found (Java 17 and Maven 3.8 are needed)" >&2; exit 1; }
  done
  mkdir -p "$OUT"
  exec 9>"$OUT/.install.lock"
  flock 9
  [[ -f "$OUT/lib/.complete" ]] && return 0
  echo "flink-cli: fetching flink-clients into $OUT/lib (Maven Central)" >&2
  rm -rf "$OUT/lib.new"
  mvn -B -q -f "$HERE/flink-cli/pom.xml" -Dmaven.repo.local="$WEIR_CACHE_DIR/maven" \
    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$OUT/lib.new"
  touch "$OUT/lib.new/.complete"
  rm -rf "$OUT/lib"
  mv "$OUT/lib.new" "$OUT/lib"
  mkdir -p "$OUT/conf"
  # the CLI reads config.yaml from FLINK_CONF_DIR; -m on the command line names the REST endpoint
  printf 'rest.address: 127.0.0.1\nclient.timeout: 60 s\n' >"$OUT/conf/config.yaml"
}
install
if [[ "${1:-}" == "install" ]]; then
  exit 0
fi
export FLINK_CONF_DIR="${FLINK_CONF_DIR:-$OUT/conf}"
exec java -cp "$OUT/lib/*" org.apache.flink.client.cli.CliFrontend "$@"
