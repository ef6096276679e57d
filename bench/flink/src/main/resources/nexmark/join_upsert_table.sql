-- Not a query of the Nexmark suite: bids joined with an 'upsert-kafka' table (issue 35), each
-- auction's tag and weight, updated and deleted by key in the topic <events topic>-upsert; the bid
-- count and weighted volume per tag. A tag's update retracts the bids joined with its old row.
-- tests/integration/sql/test_changelog_join_vs_flink.py writes that topic, runs it on both and
-- compares the final tables.
CREATE TABLE auction_tag (
  auction BIGINT,
  tag STRING,
  weight BIGINT,
  PRIMARY KEY (auction) NOT ENFORCED
) WITH (${UPSERT_SOURCE});

CREATE TABLE nexmark_join_upsert_table (
  tag STRING,
  bids BIGINT,
  volume BIGINT,
  PRIMARY KEY (tag) NOT ENFORCED
) WITH (${UPSERT_SINK});

INSERT INTO nexmark_join_upsert_table
SELECT T.tag, COUNT(*), SUM(B.price * T.weight)
FROM bid AS B JOIN auction_tag AS T ON B.auction = T.auction
GROUP BY T.tag;
