-- Not a query of the Nexmark suite: a GROUP BY written to an upsert sink keyed by fewer columns than
-- it groups by (issue 35). Each auction with a bidder who bid on it exactly once: the group of an
-- auction and a bidder leaves the result at the bidder's second bid (HAVING), and the auction must
-- stay in the sink while another of its bidders has bid once, which Flink's SinkUpsertMaterializer
-- ('table.exec.sink.upsert-materialize' = 'AUTO') keeps. Every row of an auction is the same, so the
-- final table does not depend on the order in which the rows of an auction arrive.
-- tests/integration/sql/test_upsert_materialize_vs_flink.py runs it on both and compares the final
-- tables.
CREATE TABLE nexmark_materialize_group_by (
  auction BIGINT,
  PRIMARY KEY (auction) NOT ENFORCED
) WITH (${UPSERT_SINK});

INSERT INTO nexmark_materialize_group_by
SELECT auction
FROM bid
GROUP BY auction, bidder
HAVING COUNT(*) = 1;
