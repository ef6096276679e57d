"""A Nexmark query in Weir's SQL as a job file, for ``python -m bench.cpu_bench --sql q5,q11-tumble``:
the query's SQL (``bench/flink/src/main/resources/nexmark/<query>.sql``, or :data:`EXTRA_QUERIES`)
over the ``nexmark`` topic (examples/sql/nexmark-ddl.sql with the Kafka options the Nexmark benchmark
gives it), an exactly-once Kafka sink. Parameters: ``query``, ``columnar`` (``true``: ``SET
'weir.columnar' = 'true'`` first), ``mini_batch`` (``true``: the mini-batch settings the Nexmark
benchmark gives Flink, ``bench.nexmark_bench.MINI_BATCH_SETTINGS``)."""

from __future__ import annotations

from typing import Final

from bench.nexmark_bench import MINI_BATCH_SETTINGS, kafka_events_ddl, sink_options, weir_sql_script
from weir.api import Environment
from weir.sql import sql

EXTRA_QUERIES: Final = {
    # q11 with a TUMBLE window TVF instead of its SESSION group window: a window count, sum and max per
    # bidder, as the examples' window counts
    "q11-tumble": """
CREATE TABLE nexmark_q11_tumble (bidder BIGINT, bid_count BIGINT, total BIGINT, top BIGINT,
  starttime TIMESTAMP(3), endtime TIMESTAMP(3)) WITH (${SINK});
INSERT INTO nexmark_q11_tumble
SELECT bidder, COUNT(*), SUM(price), MAX(price), window_start, window_end
FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
GROUP BY bidder, window_start, window_end;
""",
}
TOPIC: Final = "nexmark"
BOOTSTRAP: Final = "127.0.0.1:19092"  # never reached: the CPU benchmark's stand-in consumer and producer


def script(query: str, columnar: bool, mini_batch: bool = False) -> str:
    group = f"cpu-bench-{query}"
    if query in EXTRA_QUERIES:
        text = kafka_events_ddl(TOPIC, bootstrap=BOOTSTRAP, group=group) + EXTRA_QUERIES[query].replace(
            "${SINK}", sink_options("nexmark-out", BOOTSTRAP, group)
        )
    else:
        text = weir_sql_script(query, topic=TOPIC, output="nexmark-out", bootstrap=BOOTSTRAP, group=group)
    return ("SET 'weir.columnar' = 'true';\n" if columnar else "") + (MINI_BATCH_SETTINGS if mini_batch else "") + text


def build(env: Environment) -> None:
    p = env.params
    sql(env, script(p.get_str("query", "q5"), p.get_bool("columnar", False), p.get_bool("mini_batch", False)))
