-- Nexmark q18, find last bid (nexmark/nexmark queries/q18.sql): each bidder's last bid on each
-- auction, a deduplication (ROW_NUMBER() ... ORDER BY `dateTime` DESC, rank 1). An updating result:
-- the sink is upsert-kafka keyed by the partition (${UPSERT_SINK}: JSON key {"bidder": ..., "auction":
-- ...}, exactly-once); the query text is the suite's with `dateTime` backquoted (Flink 2's parser
-- reserves the word, as q0's file quotes it), the sink table its columns with that key.
CREATE TABLE nexmark_q18 (
    auction  BIGINT,
    bidder  BIGINT,
    price  BIGINT,
    channel  VARCHAR,
    url  VARCHAR,
    `dateTime`  TIMESTAMP(3),
    extra  VARCHAR,
    PRIMARY KEY (bidder, auction) NOT ENFORCED
) WITH (${UPSERT_SINK});

INSERT INTO nexmark_q18
SELECT auction, bidder, price, channel, url, `dateTime`, extra
 FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY bidder, auction ORDER BY `dateTime` DESC) AS rank_number
       FROM bid)
 WHERE rank_number <= 1;
