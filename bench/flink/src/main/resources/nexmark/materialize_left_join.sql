-- Not a query of the Nexmark suite: a LEFT JOIN of two changelogs written to an upsert sink keyed by
-- a column that is no unique key of the join's result (issue 35). Each tag of the 'upsert-kafka'
-- table of auction tags (the topic <events topic>-upsert, updated and deleted by key) carried by an
-- auction without a bid. Several auctions share a tag: an auction's first bid, or its tag changed or
-- deleted, retracts its row, and the tag must stay in the sink while another auction without a bid
-- carries it, which Flink's SinkUpsertMaterializer ('table.exec.sink.upsert-materialize' = 'AUTO')
-- keeps. Every row of a tag is the same, so the final table does not depend on the order in which
-- the rows of a tag arrive. tests/integration/sql/test_upsert_materialize_vs_flink.py runs it on both
-- and compares the final tables.
CREATE TABLE tagged_auction (
  auction BIGINT,
  tag STRING,
  weight BIGINT,
  PRIMARY KEY (auction) NOT ENFORCED
) WITH (${UPSERT_SOURCE});

CREATE TABLE nexmark_materialize_left_join (
  tag STRING,
  PRIMARY KEY (tag) NOT ENFORCED
) WITH (${UPSERT_SINK});

INSERT INTO nexmark_materialize_left_join
SELECT T.tag
FROM tagged_auction AS T
LEFT JOIN (SELECT auction, COUNT(*) AS bids FROM bid GROUP BY auction) AS B
ON T.auction = B.auction
WHERE B.bids IS NULL;
