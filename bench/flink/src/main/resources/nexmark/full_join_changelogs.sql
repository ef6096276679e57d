-- Not a query of the Nexmark suite: a FULL JOIN of two changelogs (issue 35), the sides of
-- right_join_changelogs.sql (each auction's bids as a GROUP BY result with a NULL key and groups
-- leaving through HAVING; notes on auctions in an 'upsert-kafka' table, some with a NULL auction).
-- Every note and every group is in the result, padded with NULLs while it has no match; a row is
-- identified by its note's id and its group's auction, -1 where that side is missing (a NULL key's
-- group: auction -1 too). tests/integration/sql/test_outer_join_vs_flink.py runs it on both and
-- compares the final tables.
CREATE TABLE note_full (
  id BIGINT,
  auction BIGINT,
  note STRING,
  weight BIGINT,
  PRIMARY KEY (id) NOT ENFORCED
) WITH (${UPSERT_SOURCE});

CREATE TABLE nexmark_full_join_changelogs (
  id BIGINT,
  auction BIGINT,
  note STRING,
  bids BIGINT,
  top BIGINT,
  PRIMARY KEY (id, auction) NOT ENFORCED
) WITH (${UPSERT_SINK});

INSERT INTO nexmark_full_join_changelogs
SELECT COALESCE(N.id, -1), COALESCE(B.auction, -1), N.note, B.bids, B.top
FROM (
  SELECT auction, COUNT(*) AS bids, MAX(price) AS top
  FROM (SELECT CASE WHEN MOD(auction, 10) = 3 THEN CAST(NULL AS BIGINT) ELSE auction END AS auction, price FROM bid)
  GROUP BY auction
  HAVING MAX(price) < 25000000 OR auction IS NULL
) AS B
FULL JOIN note_full AS N ON B.auction = N.auction;
