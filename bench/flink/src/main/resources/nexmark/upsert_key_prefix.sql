-- Not a query of the Nexmark suite: an 'upsert-kafka' sink whose primary key column carries Flink's
-- 'key.fields-prefix' (issue 35), with 'value.fields-include' = 'EXCEPT_KEY': each bidder's bid
-- count and highest price, the record key {"bidder": ...} (the prefix k_ taken off), the value
-- {"bids": ..., "top": ...}. tests/integration/sql/test_kafka_layout_vs_flink.py runs it on both and
-- compares the topics compacted by key; then reads both topics back with the same options on Weir.
CREATE TABLE nexmark_upsert_key_prefix (
  k_bidder BIGINT,
  bids BIGINT,
  top BIGINT,
  PRIMARY KEY (k_bidder) NOT ENFORCED
) WITH (${UPSERT_SINK}, 'key.fields-prefix' = 'k_', 'value.fields-include' = 'EXCEPT_KEY');

INSERT INTO nexmark_upsert_key_prefix
SELECT bidder, COUNT(*), MAX(price)
FROM bid
GROUP BY bidder;
