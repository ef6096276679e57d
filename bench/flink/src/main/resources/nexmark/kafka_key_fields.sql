-- Not a query of the Nexmark suite: a 'kafka' sink whose record key holds some columns (issue 35),
-- Flink's 'key.format' = 'json', 'key.fields', 'key.fields-prefix' and 'value.fields-include' =
-- 'EXCEPT_KEY': each bid's key the JSON object {"bidder": ..., "auction": ...} (the prefix k_ taken
-- off), its value {"price": ..., "channel": ...}. tests/integration/sql/test_kafka_layout_vs_flink.py
-- runs it on both and compares the records, key and value, as multisets; then reads both topics back
-- with the same options on Weir.
CREATE TABLE nexmark_kafka_key_fields (
  k_bidder BIGINT,
  k_auction BIGINT,
  price BIGINT,
  channel STRING
) WITH (${SINK}, 'key.format' = 'json', 'key.fields' = 'k_bidder;k_auction', 'key.fields-prefix' = 'k_',
  'value.fields-include' = 'EXCEPT_KEY');

INSERT INTO nexmark_kafka_key_fields
SELECT bidder, auction, price, channel
FROM bid;
