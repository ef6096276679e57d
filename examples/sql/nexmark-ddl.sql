-- The Nexmark tables for Weir's streaming SQL (weir sql, docs/sql.md): the DDL Weir's Flink benchmark
-- runs (bench/flink/.../NexmarkSql.java: one flat `events` table, the person, auction and bid views),
-- with only the connector options changed: 'nexmark' is Weir's generator (weir.nexmark), here 100,000
-- events at 10,000 events per second of event time. For a Kafka topic loaded by weir.tools.nexmark_load,
-- use 'connector' = 'kafka', 'topic' = 'nexmark', 'format' = 'json', 'scan.startup.mode' =
-- 'earliest-offset', 'scan.bounded.mode' = 'latest-offset'.
CREATE TABLE events (
  event_type INT,
  id BIGINT, name STRING, emailAddress STRING, creditCard STRING, city STRING, state STRING,
  itemName STRING, description STRING, initialBid BIGINT, reserve BIGINT, expires BIGINT,
  seller BIGINT, category BIGINT,
  auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING,
  `dateTime` BIGINT, extra STRING,
  rowtime AS CAST(TO_TIMESTAMP_LTZ(`dateTime`, 3) AS TIMESTAMP(3)),
  WATERMARK FOR rowtime AS rowtime - INTERVAL '4' SECOND
) WITH (
  'connector' = 'nexmark',
  'events.num' = '100000',
  'first-event.rate' = '10000'
);

CREATE VIEW person AS SELECT id, name, emailAddress, creditCard, city, state, rowtime AS `dateTime`, extra
  FROM events WHERE event_type = 0;

CREATE VIEW auction AS SELECT id, itemName, description, initialBid, reserve, rowtime AS `dateTime`,
  CAST(TO_TIMESTAMP_LTZ(expires, 3) AS TIMESTAMP(3)) AS expires, seller, category, extra
  FROM events WHERE event_type = 1;

CREATE VIEW bid AS SELECT auction, bidder, price, channel, url, rowtime AS `dateTime`, extra
  FROM events WHERE event_type = 2;
