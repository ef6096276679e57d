#!/usr/bin/env bash
# Build the Apache Flink contender (bench/flink/) with Maven, from Maven Central into a cache outside
# the repository: the local Maven repository in $WEIR_CACHE_DIR/maven, the job's jar and its
# dependencies (lib/) in $WEIR_CACHE_DIR/bench/flink/<sources hash>/, a folder per version of
# bench/flink's sources (pom.xml and src/, by content), so that checkouts of other versions on the
# same machine never overwrite the build another one runs. Run by `make bench-deps`; does nothing
# when that folder holds a complete build. `build.sh --force` rebuilds; `build.sh --print-dir`
# prints the folder (bench/contenders.py computes the same hash: a unit test holds the two
# together). Flink's S3 file system plugin (flink-s3-fs-presto, for checkpoints on the S3 server)
# goes to its plugins/s3-fs-presto/, the FLINK_PLUGINS_DIR the benchmarks give the JVM.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WEIR_CACHE_DIR="${WEIR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/weir}"
# sha256 of "<sha256 of the file>  <path>" lines of pom.xml and src/, sorted bytewise: 12 hex digits
SOURCES="$(cd "$HERE" && find pom.xml src -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-12)"
OUT="$WEIR_CACHE_DIR/bench/flink/$SOURCES"
JAR="$OUT/weir-bench-flink.jar"

if [[ "${1:-}" == "--print-dir" ]]; then
  echo "$OUT"
  exit 0
fi
up_to_date() {
  [[ -f "$JAR" && -f "$OUT/lib/.complete" && -f "$OUT/plugins/.complete" ]]
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
