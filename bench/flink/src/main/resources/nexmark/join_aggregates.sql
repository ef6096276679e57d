-- Not a query of the Nexmark suite: a regular join of two updating results (issue 35), each
-- person's auction count as a seller beside their bid count and highest bid as a bidder. Both sides
-- are changelogs (-U/+U of each GROUP BY key); the join retracts a joined row when either side's row
-- changes. tests/integration/sql/test_changelog_join_vs_flink.py runs it on both and compares the
-- final tables.
CREATE TABLE nexmark_join_aggregates (
  seller BIGINT,
  auctions BIGINT,
  bids BIGINT,
  top BIGINT,
  PRIMARY KEY (seller) NOT ENFORCED
) WITH (${UPSERT_SINK});

INSERT INTO nexmark_join_aggregates
SELECT S.seller, S.auctions, B.bids, B.top
FROM (SELECT seller, COUNT(*) AS auctions FROM auction GROUP BY seller) AS S
JOIN (SELECT bidder, COUNT(*) AS bids, MAX(price) AS top FROM bid GROUP BY bidder) AS B
ON S.seller = B.bidder;
