#!/usr/bin/env bash
# Weir's local Kafka: one KRaft node (broker + controller) run as a plain java process.
# Usage: kafka.sh install|start|stop|status|health
#   install  resolve the pinned jars (kafka/pom.xml) into $WEIR_CACHE_DIR/kafka/<version>/libs; idempotent
#   start    install if needed, format storage once, start, wait until it answers requests; idempotent
#   stop     stop our broker by its pid;  status  print up/down;  health  exit 0 iff it answers requests
# WEIR_KAFKA_START_TIMEOUT (default 300) bounds the wait for a healthy broker, in seconds: a broker
# that was killed recovers every partition log first, which takes minutes with thousands of them.
# Topics are NOT auto-created (auto.create.topics.enable=false): Weir creates its topics explicitly.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

KAFKA_FILES="$DEPLOY_LOCAL_DIR/kafka"
KAFKA_VERSION="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$KAFKA_FILES/pom.xml")"
KAFKA_HOME="$WEIR_CACHE_DIR/kafka/$KAFKA_VERSION"
KAFKA_RUN="$(svc_dir kafka)"
KAFKA_CONF="$KAFKA_RUN/server.properties"
KAFKA_BROKER_PROPS="$KAFKA_FILES/broker.properties"   # shared with docker-compose.yml
START_TIMEOUT="${WEIR_KAFKA_START_TIMEOUT:-300}"
CLUSTER_ID="d2Vpci1sb2NhbC1rYWZrYQ"   # base64url of "weir-local-kafka": fixed, so data dirs stay valid
JVM=(java -Xms256m -Xmx512m -XX:+UseG1GC -Djava.awt.headless=true
     "-Dlog4j2.configurationFile=$KAFKA_FILES/log4j2.properties" -cp "$KAFKA_HOME/libs/*")

require_java() {
  command -v java >/dev/null || fail kafka "no java on PATH (install openjdk-17-jre-headless)"
  local v; v="$(java -XshowSettings:properties -version 2>&1 | sed -n 's/.*java.specification.version = //p')"
  (( ${v%%.*} >= 17 )) || fail kafka "Kafka $KAFKA_VERSION needs Java 17 or newer, found Java $v"
}

install() {
  require_java
  [[ -f "$KAFKA_HOME/.installed" ]] && return 0
  command -v mvn >/dev/null || fail kafka "no mvn on PATH (install maven)"
  mkdir -p "$KAFKA_RUN" "$KAFKA_HOME"
  info "kafka: resolving Kafka $KAFKA_VERSION jars from Maven Central (once)"
  local tmp="$KAFKA_HOME/libs.tmp.$$"
  rm -rf "$tmp"
  if ! mvn -q -B -f "$KAFKA_FILES/pom.xml" dependency:copy-dependencies \
         -DincludeScope=runtime -DoutputDirectory="$tmp" >>"$(svc_log kafka)" 2>&1; then
    rm -rf "$tmp"
    fail kafka "maven could not resolve org.apache.kafka:kafka_2.13:$KAFKA_VERSION (see deploy/local/kafka/pom.xml)"
  fi
  rm -rf "$KAFKA_HOME/libs" && mv "$tmp" "$KAFKA_HOME/libs" && touch "$KAFKA_HOME/.installed"
}

write_config() {
  mkdir -p "$KAFKA_RUN/data"
  cat >"$KAFKA_CONF" <<CONF
# written by deploy/local/kafka.sh on every start; edit the script or deploy/local/kafka/broker.properties, not this file
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$WEIR_KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$WEIR_KAFKA_PORT,CONTROLLER://127.0.0.1:$WEIR_KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$WEIR_KAFKA_PORT,CONTROLLER://127.0.0.1:$WEIR_KAFKA_CONTROLLER_PORT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs=$KAFKA_RUN/data
CONF
  cat "$KAFKA_BROKER_PROPS" >>"$KAFKA_CONF"
}

format_storage() {
  [[ -f "$KAFKA_RUN/data/meta.properties" ]] && return 0
  "${JVM[@]}" kafka.tools.StorageTool format -t "$CLUSTER_ID" -c "$KAFKA_CONF" >>"$(svc_log kafka)" 2>&1 \
    || fail kafka "could not format the storage in $KAFKA_RUN/data"
}

# answers_requests: send a Kafka ApiVersions v0 request (correlation id 1) and expect
# correlation id 1 with error code 0 back: proves the broker serves the protocol, no JVM needed.
answers_requests() (
  exec 3<>"/dev/tcp/127.0.0.1/$WEIR_KAFKA_PORT" || exit 1
  printf '\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff' >&3
  reply="$(timeout 2 head -c 10 <&3 | od -An -tx1 | tr -d ' \n')"
  [[ "$reply" == ????????000000010000 ]]
)

health() { pid_alive kafka && answers_requests; }

start() {
  install
  if pid_alive kafka; then   # ours is running: healthy now, or still starting
    wait_until kafka "$START_TIMEOUT" health
    info "kafka: already up at $WEIR_KAFKA_BOOTSTRAP"
    return 0
  fi
  rm -f "$(svc_pidfile kafka)"
  require_port_free kafka "$WEIR_KAFKA_PORT"
  require_port_free kafka "$WEIR_KAFKA_CONTROLLER_PORT"
  write_config
  format_storage
  echo "=== $(date -u +%FT%TZ) weir: starting Kafka $KAFKA_VERSION" >>"$(svc_log kafka)"
  start_daemon kafka "${JVM[@]}" kafka.Kafka "$KAFKA_CONF"
  wait_until kafka "$START_TIMEOUT" health
  info "kafka: up at $WEIR_KAFKA_BOOTSTRAP (pid $(cat "$(svc_pidfile kafka)"), Kafka $KAFKA_VERSION)"
}

case "${1:-}" in
  install) install ;;
  start)   start ;;
  stop)    stop_pid kafka ;;
  status)  status_line kafka ;;
  health)  health ;;
  *) echo "usage: $0 install|start|stop|status|health" >&2; exit 2 ;;
esac
