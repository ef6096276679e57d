-- Nexmark q2, selection (nexmark/nexmark queries/q2.sql; Kafka sink)
CREATE TABLE nexmark_q2 (
  auction  BIGINT,
  price  BIGINT
) WITH (${SINK});

INSERT INTO nexmark_q2
SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0;
