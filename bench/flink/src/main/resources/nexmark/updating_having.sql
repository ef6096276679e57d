-- Not a query of the Nexmark suite: an updating result whose rows leave it (issue 35), each auction's
-- bid count and highest price while that price stays below 27,634,713. An auction whose highest bid
-- passes it stops passing HAVING and is deleted: Flink keeps the UPDATE_BEFORE for a filter on an
-- updating result and its upsert-kafka sink writes it as a tombstone, as Weir's does.
-- tests/integration/sql/test_updating_vs_flink.py runs it on both and compares the final tables.
CREATE TABLE nexmark_updating_having (
  auction BIGINT,
  bids BIGINT,
  top BIGINT,
  PRIMARY KEY (auction) NOT ENFORCED
) WITH (${UPSERT_SINK});

INSERT INTO nexmark_updating_having
SELECT auction, COUNT(*), MAX(price)
FROM bid
GROUP BY auction
HAVING MAX(price) < 27634713;
