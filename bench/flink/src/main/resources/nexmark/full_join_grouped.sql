-- Not a query of the Nexmark suite: a GROUP BY over a FULL JOIN of two changelogs (issue 35), the
-- sides of full_join_changelogs.sql: per note ('unnoted' for the groups without a note), the joined
-- rows, how many have a group and a note, the groups' bid counts and the notes' weights summed (NULL
-- where none has one). Each padded row the join retracts is retracted from the aggregates.
-- tests/integration/sql/test_outer_join_vs_flink.py runs it on both and compares the final tables.
CREATE TABLE note_grouped (
  id BIGINT,
  auction BIGINT,
  note STRING,
  weight BIGINT,
  PRIMARY KEY (id) NOT ENFORCED
) WITH (${UPSERT_SOURCE});

CREATE TABLE nexmark_full_join_grouped (
  note STRING,
  total BIGINT,
  grouped BIGINT,
  noted BIGINT,
  bids BIGINT,
  weight BIGINT,
  PRIMARY KEY (note) NOT ENFORCED
) WITH (${UPSERT_SINK});

INSERT INTO nexmark_full_join_grouped
SELECT COALESCE(N.note, 'unnoted'), COUNT(*), COUNT(B.bids), COUNT(N.id), SUM(B.bids), SUM(N.weight)
FROM (
  SELECT auction, COUNT(*) AS bids
  FROM (SELECT CASE WHEN MOD(auction, 10) = 3 THEN CAST(NULL AS BIGINT) ELSE auction END AS auction, price FROM bid)
  GROUP BY auction
  HAVING MAX(price) < 25000000 OR auction IS NULL
) AS B
FULL JOIN note_grouped AS N ON B.auction = N.auction
GROUP BY COALESCE(N.note, 'unnoted');
