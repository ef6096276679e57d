#!/usr/bin/env bash
# Build the Apache Flink contender (bench/flink/) with Maven, from Maven Central into a cache outside
# the repository: the local Maven repository in $WEIR_CACHE_DIR/maven, the job's jar and its
# dependencies (lib/) in $WEIR_CACHE_DIR/bench/flink/. Run by `make bench-deps`; does nothing when
# the jar is newer than the sources. `build.sh --force` rebuilds; `build.sh --print-dir` prints the
# output directory. Flink's S3 file system plugin (flink-s3-fs-presto, for checkpoints on the S3
# server) goes to $WEIR_CACHE_DIR/bench/flink/plugins/s3-fs-presto/, the FLINK_PLUGINS_DIR the
# benchmarks give the JVM.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WEIR_CACHE_DIR="${WEIR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/weir}"
OUT="$WEIR_CACHE_DIR/bench/flink"
JAR="$OUT/weir-bench-flink.jar"

if [[ "${1:-}" == "--print-dir" ]]; then
  echo "$OUT"
  exit 0
fi
up_to_date() {
  [[ -f "$JAR" && -f "$OUT/lib/.complete" && -f "$OUT/plugins/.complete" ]] &&
    [[ -z "$(find "$HERE/pom.xml" "$HERE/src" -newer "$JAR" -type f -print -quit)" ]]
}
if [[ "${1:-}" != "--force" ]] && up_to_date; then
  exit 0
fi
mkdir -p "$OUT"
# One build at a time; a benchmark starting meanwhile waits here and finds the jar built.
exec 9>"$OUT/.build.lock"
flock 9
if [[ "${1:-}" != "--force" ]] && up_to_date; then
  exit 0
fi
for tool in java mvn; do
  command -v "$tool" >/dev/null || { echo "bench/flink: $tool not found (Java 17 and Maven 3.8 are needed)" >&2; exit 1; }
done
echo "bench/flink: building the Flink contender into $OUT (first build downloads Flink from Maven Central)" >&2
rm -rf "$OUT/lib.new" "$OUT/plugins.new"
mvn -B -q -f "$HERE/pom.xml" \
  -Dmaven.repo.local="$WEIR_CACHE_DIR/maven" \
  -Dweir.build.dir="$OUT/target" \
  -Dweir.plugins.dir="$OUT/plugins.new" \
  package dependency:copy-dependencies dependency:copy@s3-plugin \
  -DincludeScope=runtime -DoutputDirectory="$OUT/lib.new"
touch "$OUT/lib.new/.complete" "$OUT/plugins.new/.complete"
rm -rf "$OUT/lib" "$OUT/plugins"
mv "$OUT/lib.new" "$OUT/lib"
mv "$OUT/plugins.new" "$OUT/plugins"
cp "$OUT/target/weir-bench-flink.jar" "$JAR.tmp"
mv "$JAR.tmp" "$JAR"
echo "bench/flink: $JAR" >&2
