-- Not a query of the Nexmark suite: an 'upsert-kafka' sink keyed by three columns whose PRIMARY KEY
-- is declared in neither their names' order nor the table's (issue 35): Flink writes each record key
-- as the JSON object of the key's columns in the PRIMARY KEY's order, {"channel": ..., "auction": ...,
-- "bidder": ...}, and a compacted topic compares keys as bytes.
-- tests/integration/sql/test_kafka_layout_vs_flink.py runs it on both and compares the record keys'
-- bytes and the topics compacted by them.
CREATE TABLE nexmark_upsert_key_order (
  bidder BIGINT,
  channel STRING,
  auction BIGINT,
  bids BIGINT,
  top BIGINT,
  PRIMARY KEY (channel, auction, bidder) NOT ENFORCED
) WITH (${UPSERT_SINK});

INSERT INTO nexmark_upsert_key_order
SELECT bidder, channel, auction, COUNT(*), MAX(price)
FROM bid
GROUP BY bidder, channel, auction;
