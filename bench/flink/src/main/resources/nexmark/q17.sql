-- Nexmark q17, auction statistics report (nexmark/nexmark queries/q17.sql). An updating result: the sink is
-- upsert-kafka keyed by the GROUP BY's columns (auction, day: ${UPSERT_SINK}, exactly-once), each update one
-- record; the PRIMARY KEY is added for it (upsert-kafka needs one), the query is the suite's.
-- tests/integration/sql/test_nexmark_vs_flink.py compares the final tables.
CREATE TABLE nexmark_q17 (
  auction BIGINT,
  `day` VARCHAR,
  total_bids BIGINT,
  rank1_bids BIGINT,
  rank2_bids BIGINT,
  rank3_bids BIGINT,
  min_price BIGINT,
  max_price BIGINT,
  avg_price BIGINT,
  sum_price BIGINT,
  PRIMARY KEY (auction, `day`) NOT ENFORCED
) WITH (${UPSERT_SINK});

INSERT INTO nexmark_q17
SELECT
     auction,
     DATE_FORMAT(`dateTime`, 'yyyy-MM-dd') as `day`,
     count(*) AS total_bids,
     count(*) filter (where price < 10000) AS rank1_bids,
     count(*) filter (where price >= 10000 and price < 1000000) AS rank2_bids,
     count(*) filter (where price >= 1000000) AS rank3_bids,
     min(price) AS min_price,
     max(price) AS max_price,
     avg(price) AS avg_price,
     sum(price) AS sum_price
FROM bid
GROUP BY auction, DATE_FORMAT(`dateTime`, 'yyyy-MM-dd');
