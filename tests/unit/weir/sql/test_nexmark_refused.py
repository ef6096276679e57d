"""The Nexmark suite's queries Weir does not run are refused before anything runs, each with one line
naming the construct and its line:column in the script (nothing runs wrong): q6 (the suite's text
names ``rownum`` in the WHERE of the SELECT that defines it, which Flink 2.2.1 refuses the same way,
"Column 'rownum' not found in any table", at the same place; written validly, it is an OVER
aggregation of a Top-N's changelog, which Flink's streaming OVER does not take either); and q12's
shape with a processing-time HOP (q12 itself, a processing-time TUMBLE, runs:
tests/unit/weir/sql/test_nexmark_q12.py). The queries' text is the suite's (nexmark/nexmark
queries/q6.sql, q12.sql), their sinks a Kafka table."""

from __future__ import annotations

from pathlib import Path

import pytest

from weir.sql import plan_script
from weir.sql.errors import SqlError

ROOT = Path(__file__).resolve().parents[4]
DDL = (ROOT / "examples/sql/nexmark-ddl.sql").read_text() + "\n"
SINK = "'connector' = 'kafka', 'topic' = 'out', 'format' = 'json'"

Q6 = f"""CREATE TABLE nexmark_q6 (
  seller VARCHAR,
  avg_price  BIGINT
) WITH ({SINK});

INSERT INTO nexmark_q6
SELECT
    Q.seller,
    AVG(Q.price) OVER
        (PARTITION BY Q.seller ORDER BY Q.`dateTime` ROWS BETWEEN 10 PRECEDING AND CURRENT ROW)
FROM (
    SELECT *, ROW_NUMBER() OVER (PARTITION BY A.id, A.seller ORDER BY B.price DESC) AS rownum
    FROM (SELECT A.id, A.seller, B.price, B.`dateTime`
        FROM auction AS A,
            bid AS B
        WHERE A.id = B.auction
            and B.`dateTime` between A.`dateTime` and A.expires)
    WHERE rownum <= 1
) AS Q;
"""
Q6_RANKED_FIRST = f"""CREATE TABLE nexmark_q6 (seller VARCHAR, avg_price BIGINT) WITH ({SINK});

INSERT INTO nexmark_q6
SELECT
    Q.seller,
    AVG(Q.price) OVER
        (PARTITION BY Q.seller ORDER BY Q.`dateTime` ROWS BETWEEN 10 PRECEDING AND CURRENT ROW)
FROM (
    SELECT * FROM (
        SELECT *, ROW_NUMBER() OVER (PARTITION BY id, seller ORDER BY price DESC) AS rownum
        FROM (SELECT A.id, A.seller, B.price, B.`dateTime`
            FROM auction AS A, bid AS B
            WHERE A.id = B.auction and B.`dateTime` between A.`dateTime` and A.expires))
    WHERE rownum <= 1
) AS Q;
"""
Q12 = f"""CREATE TABLE nexmark_q12 (
  bidder BIGINT,
  bid_count BIGINT,
  starttime TIMESTAMP(3),
  endtime TIMESTAMP(3)
) WITH ({SINK});

CREATE VIEW B AS SELECT *, PROCTIME() as p_time FROM bid;

INSERT INTO nexmark_q12
SELECT
    bidder,
    count(*) as bid_count,
    window_start AS starttime,
    window_end AS endtime
FROM TABLE(
        TUMBLE(TABLE B, DESCRIPTOR(p_time), INTERVAL '10' SECOND))
GROUP BY bidder, window_start, window_end;
"""


@pytest.mark.parametrize(
    ("query", "message", "at"),
    [
        (Q6, "column rownum is not in the input", "rownum <= 1"),
        (Q6_RANKED_FIRST, "an OVER aggregation of an updating result", "AVG(Q.price) OVER"),
        (
            Q12.replace(
                "TUMBLE(TABLE B, DESCRIPTOR(p_time), INTERVAL '10' SECOND)",
                "HOP(TABLE B, DESCRIPTOR(p_time), INTERVAL '5' SECOND, INTERVAL '10' SECOND)",
            ),
            "HOP over B.p_time: a processing-time HOP (over a PROCTIME() column) is not supported; a processing-time "
            "TUMBLE and event-time windows are",
            "DESCRIPTOR",
        ),
    ],
    ids=["q6", "q6-ranked-first", "q12-hop"],
)
def test_a_nexmark_query_weir_does_not_run_is_refused_with_its_position(query: str, message: str, at: str) -> None:
    script = DDL + query
    with pytest.raises(SqlError) as raised:
        plan_script(script)
    text = str(raised.value)
    assert "\n" not in text
    assert message in text, text
    offset = script.index(at, len(DDL))
    line = script[:offset].count("\n") + 1
    column = offset - (script.rfind("\n", 0, offset) + 1) + 1
    assert text.startswith(f"SQL {line}:{column}: "), text
