-- Orders per user: per minute (a tumbling event-time window, appended to a Kafka topic) and in all
-- (a GROUP BY without a window, an updating result upserted into a PostgreSQL table). Run it with
-- `weir sql examples/sql/orders.sql`; test it without services, failures injected at every
-- checkpoint, with `weir test examples/sql/orders.sql --source orders=examples/sql/orders.jsonl --failures`
-- (docs/jobs.md).
CREATE TABLE orders (
  id BIGINT,
  `user` STRING,
  amount BIGINT,
  ts TIMESTAMP(3),
  WATERMARK FOR ts AS ts - INTERVAL '5' SECOND
) WITH (
  'connector' = 'kafka',
  'topic' = 'orders',
  'scan.startup.mode' = 'earliest-offset',
  'format' = 'json'
);

CREATE TABLE orders_per_minute (who STRING, minute TIMESTAMP(3), orders BIGINT, total BIGINT)
  WITH ('connector' = 'kafka', 'topic' = 'orders-per-minute', 'format' = 'json');

CREATE TABLE orders_per_user (who STRING, orders BIGINT, total BIGINT, PRIMARY KEY (who) NOT ENFORCED)
  WITH ('connector' = 'jdbc', 'url' = 'jdbc:postgresql://localhost:5432/weir', 'table-name' = 'orders_per_user');

EXECUTE STATEMENT SET BEGIN
INSERT INTO orders_per_minute
SELECT `user`, window_start, COUNT(*), SUM(amount)
FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(ts), INTERVAL '1' MINUTE))
GROUP BY `user`, window_start, window_end;
INSERT INTO orders_per_user SELECT `user`, COUNT(*), SUM(amount) FROM orders GROUP BY `user`;
END;
