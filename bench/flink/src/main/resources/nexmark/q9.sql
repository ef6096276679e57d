-- Nexmark q9, winning bids (nexmark/nexmark queries/q9.sql): per auction the highest bid between its
-- opening and its expiry (the earliest of equal prices), a regular join with a condition beyond its
-- key (B.`dateTime` BETWEEN A.`dateTime` AND A.expires: not an interval join, A.expires is no event
-- time) ranked by a Top-N without a window (ROW_NUMBER() ... <= 1). An updating result: the sink is
-- upsert-kafka keyed by the auction (${UPSERT_SINK}: JSON key {"id": ...}, exactly-once); the query
-- text is the suite's, the sink table its columns with that key.
CREATE TABLE nexmark_q9 (
  id  BIGINT,
  itemName  VARCHAR,
  description  VARCHAR,
  initialBid  BIGINT,
  reserve  BIGINT,
  `dateTime`  TIMESTAMP(3),
  expires  TIMESTAMP(3),
  seller  BIGINT,
  category  BIGINT,
  extra  VARCHAR,
  auction  BIGINT,
  bidder  BIGINT,
  price  BIGINT,
  bid_dateTime  TIMESTAMP(3),
  bid_extra  VARCHAR,
  PRIMARY KEY (id) NOT ENFORCED
) WITH (${UPSERT_SINK});

INSERT INTO nexmark_q9
SELECT
    id, itemName, description, initialBid, reserve, `dateTime`, expires, seller, category, extra,
    auction, bidder, price, bid_dateTime, bid_extra
FROM (
   SELECT A.*, B.auction, B.bidder, B.price, B.`dateTime` AS bid_dateTime, B.extra AS bid_extra,
     ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.`dateTime` ASC) AS rownum
   FROM auction A, bid B
   WHERE A.id = B.auction AND B.`dateTime` BETWEEN A.`dateTime` AND A.expires
)
WHERE rownum <= 1;
