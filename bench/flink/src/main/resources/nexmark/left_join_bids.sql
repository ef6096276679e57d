-- Not a query of the Nexmark suite: a LEFT JOIN of an append input and an updating result (issue
-- 35), each auction with its bid count and highest bid, NULL while it has no bid: its row padded
-- with NULLs is retracted when its first bid arrives. tests/integration/sql/test_changelog_join_vs_flink.py
-- runs it on both and compares the final tables.
CREATE TABLE nexmark_left_join_bids (
  id BIGINT,
  seller BIGINT,
  bids BIGINT,
  top BIGINT,
  PRIMARY KEY (id) NOT ENFORCED
) WITH (${UPSERT_SINK});

INSERT INTO nexmark_left_join_bids
SELECT A.id, A.seller, B.bids, B.top
FROM auction AS A
LEFT JOIN (SELECT auction, COUNT(*) AS bids, MAX(price) AS top FROM bid GROUP BY auction) AS B
ON A.id = B.auction;
