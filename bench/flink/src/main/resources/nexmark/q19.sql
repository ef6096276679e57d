-- Nexmark q19, auction top-10 price (nexmark/nexmark queries/q19.sql): per auction its 10 highest
-- bids with their row number, a Top-N without a window. An updating result: the sink is upsert-kafka
-- keyed by the auction and the row number (${UPSERT_SINK}: JSON key {"auction": ..., "rank_number":
-- ...}, exactly-once); the query text is the suite's, the sink table its columns (`dateTime`
-- backquoted, as q0's) with that key. Bids of one auction at the same price take their row numbers
-- in arrival order on Flink and by their values on Weir: compared with both ranked as the first of
-- them (bench.nexmark_bench.QuerySpec.rank_ties).
CREATE TABLE nexmark_q19 (
    auction  BIGINT,
    bidder  BIGINT,
    price  BIGINT,
    channel  VARCHAR,
    url  VARCHAR,
    `dateTime`  TIMESTAMP(3),
    extra  VARCHAR,
    rank_number  BIGINT,
    PRIMARY KEY (auction, rank_number) NOT ENFORCED
) WITH (${UPSERT_SINK});

INSERT INTO nexmark_q19
SELECT * FROM
(SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) AS rank_number FROM bid)
WHERE rank_number <= 10;
