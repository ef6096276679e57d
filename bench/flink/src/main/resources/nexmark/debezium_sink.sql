-- Not a query of the Nexmark suite: an updating GROUP BY (the number of accounts and their total
-- balance per owner, over the Debezium topic <events topic>-debezium read as a changelog) written
-- into an append-only topic in 'debezium-json': each change a Debezium envelope, +I and +U with op
-- "c" and the new row in "after", -U and -D with op "d" and the old row in "before".
-- tests/integration/sql/test_debezium_vs_flink.py runs it on both and compares the records.
CREATE TABLE account_history (
  id BIGINT,
  owner STRING,
  balance BIGINT,
  PRIMARY KEY (id) NOT ENFORCED
) WITH (${DEBEZIUM_SOURCE});

CREATE TABLE nexmark_debezium_sink (
  owner STRING,
  accounts BIGINT,
  total BIGINT
) WITH (${DEBEZIUM_SINK});

INSERT INTO nexmark_debezium_sink
SELECT owner, COUNT(*), SUM(balance)
FROM account_history
GROUP BY owner;
