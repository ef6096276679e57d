-- Nexmark q0, pass-through (nexmark/nexmark nexmark-flink/src/main/resources/queries/q0.sql; the sink
-- is a Kafka topic instead of blackhole, ${SINK} is filled in by weir.bench.NexmarkSql)
CREATE TABLE nexmark_q0 (
  auction  BIGINT,
  bidder  BIGINT,
  price  BIGINT,
  `dateTime`  TIMESTAMP(3),
  extra  VARCHAR
) WITH (${SINK});

INSERT INTO nexmark_q0
SELECT auction, bidder, price, `dateTime`, extra FROM bid;
