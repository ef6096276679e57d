-- Not a query of the Nexmark suite: a Top-N without a window over an updating result (issue 35),
-- each auction's three most frequent bidders (by their bid count, then their id). A bidder's count
-- rises with each bid: the rows at its row number and after change, and the result is keyed by the
-- auction and the row number. tests/integration/sql/test_changelog_join_vs_flink.py runs it on both
-- and compares the final tables.
CREATE TABLE nexmark_top_n_updating (
  auction BIGINT,
  bidder BIGINT,
  bids BIGINT,
  rownum BIGINT,
  PRIMARY KEY (auction, rownum) NOT ENFORCED
) WITH (${UPSERT_SINK});

INSERT INTO nexmark_top_n_updating
SELECT auction, bidder, bids, rownum
FROM (
  SELECT auction, bidder, bids,
    ROW_NUMBER() OVER (PARTITION BY auction ORDER BY bids DESC, bidder) AS rownum
  FROM (SELECT auction, bidder, COUNT(*) AS bids FROM bid GROUP BY auction, bidder)
)
WHERE rownum <= 3;
