-- Nexmark q13, bounded side input join (nexmark/nexmark queries/q13.sql): each bid enriched with the
-- side input's row of mod(auction, 10000), a processing-time lookup join. The side input is the
-- suite's SideInputGenerator file (10,000 lines "i,i"; bench.nexmark_bench.write_side_input), its
-- table's connector options the current 'filesystem' connector's ('path' = ${SIDE_INPUT}, the file,
-- 'format' = 'csv') instead of the legacy 'connector.type' / 'connector.path' / 'format.type' that
-- Flink 2 no longer has. The query text is the suite's, `dateTime` backquoted (Flink 2's parser
-- reserves the word, as q0's file quotes it). Apache Flink 2.2.1 refuses it: its 'filesystem'
-- connector is no lookup source ("Temporal Table Join requires primary key in versioned table").
CREATE TABLE side_input (
  key BIGINT,
  `value` VARCHAR
) WITH (
  'connector' = 'filesystem',
  'path' = '${SIDE_INPUT}',
  'format' = 'csv'
);

CREATE TABLE nexmark_q13 (
  auction  BIGINT,
  bidder  BIGINT,
  price  BIGINT,
  `dateTime`  TIMESTAMP(3),
  `value`  VARCHAR
) WITH (${SINK});

INSERT INTO nexmark_q13
SELECT
    B.auction,
    B.bidder,
    B.price,
    B.`dateTime`,
    S.`value`
FROM (SELECT *, PROCTIME() as p_time FROM bid) B
JOIN side_input FOR SYSTEM_TIME AS OF B.p_time AS S
ON mod(B.auction, 10000) = S.key;
