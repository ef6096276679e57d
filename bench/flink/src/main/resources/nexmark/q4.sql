-- Nexmark q4, average price per category (nexmark/nexmark queries/q4.sql). An updating result: the
-- sink is upsert-kafka keyed by the category (${UPSERT_SINK}: JSON key {"id": ...}, exactly-once),
-- each update one record; bench/nexmark_bench.py compares the final table (the upserts applied in
-- order) with the reference. Weir's examples/nexmark/q4.py runs with -D q4.updates=true: the same
-- updating program, keyed the same way.
CREATE TABLE nexmark_q4 (
  id BIGINT,
  final BIGINT,
  PRIMARY KEY (id) NOT ENFORCED
) WITH (${UPSERT_SINK});

INSERT INTO nexmark_q4
SELECT
    Q.category,
    AVG(Q.final)
FROM (
    SELECT MAX(B.price) AS final, A.category
    FROM auction A, bid B
    WHERE A.id = B.auction AND B.`dateTime` BETWEEN A.`dateTime` AND A.expires
    GROUP BY A.id, A.category
) Q
GROUP BY Q.category;
