-- Not a query of the Nexmark suite: a WHERE and FILTER (WHERE ...) aggregates over an updating result
-- (issue 35): per bidder bucket, the bidders who spent more than 12,081,771 in all, those of them
-- with 9 bids or more, and what those whose highest bid is below 36,747,385 spent. A bidder's update
-- that stops passing the WHERE retracts them from their bucket; a bucket left empty is deleted.
-- tests/integration/sql/test_updating_vs_flink.py runs it on Flink and Weir and compares the final tables.
CREATE TABLE nexmark_updating_filter (
  bucket BIGINT,
  bidders BIGINT,
  busy BIGINT,
  spent BIGINT,
  PRIMARY KEY (bucket) NOT ENFORCED
) WITH (${UPSERT_SINK});

INSERT INTO nexmark_updating_filter
SELECT
    B.bidder % 10,
    COUNT(*),
    COUNT(*) FILTER (WHERE B.bids >= 9),
    SUM(B.spent) FILTER (WHERE B.top < 36747385)
FROM (
    SELECT bidder, COUNT(*) AS bids, SUM(price) AS spent, MAX(price) AS top
    FROM bid
    GROUP BY bidder
) B
WHERE B.spent > 12081771
GROUP BY B.bidder % 10;
