-- Not a query of the Nexmark suite: a RIGHT JOIN of two changelogs (issue 35). The left side is a
-- GROUP BY result: each auction's bid count and highest bid, the auctions ending in 3 grouped under a
-- NULL key (a NULL join key matches nothing), a group leaving the result once its highest bid reaches
-- a bound (HAVING: its -U without a +U). The right side is an 'upsert-kafka' table of notes on
-- auctions, updated, deleted and re-inserted by id in <events topic>-upsert, some without an auction
-- (NULL). Each note is in the result, padded with NULLs while its auction has no group.
-- tests/integration/sql/test_outer_join_vs_flink.py writes that topic, runs it on both and compares
-- the final tables.
CREATE TABLE note_right (
  id BIGINT,
  auction BIGINT,
  note STRING,
  weight BIGINT,
  PRIMARY KEY (id) NOT ENFORCED
) WITH (${UPSERT_SOURCE});

CREATE TABLE nexmark_right_join_changelogs (
  id BIGINT,
  note STRING,
  auction BIGINT,
  bids BIGINT,
  top BIGINT,
  PRIMARY KEY (id) NOT ENFORCED
) WITH (${UPSERT_SINK});

INSERT INTO nexmark_right_join_changelogs
SELECT N.id, N.note, B.auction, B.bids, B.top
FROM (
  SELECT auction, COUNT(*) AS bids, MAX(price) AS top
  FROM (SELECT CASE WHEN MOD(auction, 10) = 3 THEN CAST(NULL AS BIGINT) ELSE auction END AS auction, price FROM bid)
  GROUP BY auction
  HAVING MAX(price) < 25000000 OR auction IS NULL
) AS B
RIGHT JOIN note_right AS N ON B.auction = N.auction;
