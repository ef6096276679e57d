-- Nexmark q7, highest bid (nexmark/nexmark queries/q7.sql; Kafka sink). The reference's sink table
-- lists (auction, bidder, price, ...) while its SELECT gives (auction, price, bidder, ...): an INSERT
-- fills columns by position, so its bidder column held the price. Here the sink table's columns are
-- in the SELECT's order and each value keeps its name; the query is the reference's.
CREATE TABLE nexmark_q7 (
  auction  BIGINT,
  price  BIGINT,
  bidder  BIGINT,
  `dateTime`  TIMESTAMP(3),
  extra  VARCHAR
) WITH (${SINK});

INSERT INTO nexmark_q7
SELECT B.auction, B.price, B.bidder, B.`dateTime`, B.extra
from bid B
JOIN (
  SELECT MAX(price) AS maxprice, window_end as `dateTime`
  FROM TABLE(
          TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
  GROUP BY window_start, window_end
) B1
ON B.price = B1.maxprice
WHERE B.`dateTime` BETWEEN B1.`dateTime`  - INTERVAL '10' SECOND AND B1.`dateTime`;
