-- Not a query of the Nexmark suite: a 'kafka' table of 'debezium-json' (the change envelopes a
-- Debezium connector writes of a table of accounts: snapshot reads, inserts, updates with their old
-- row, deletes and tombstones) in the topic <events topic>-debezium, read as a changelog; the number
-- of accounts and their total balance per owner, into upsert-kafka (an owner whose last account
-- leaves is deleted). tests/integration/sql/test_debezium_vs_flink.py writes that topic, runs it on
-- both and compares the final tables.
CREATE TABLE account_changes (
  id BIGINT,
  owner STRING,
  balance BIGINT,
  PRIMARY KEY (id) NOT ENFORCED
) WITH (${DEBEZIUM_SOURCE});

CREATE TABLE nexmark_debezium_group_by (
  owner STRING,
  accounts BIGINT,
  total BIGINT,
  PRIMARY KEY (owner) NOT ENFORCED
) WITH (${UPSERT_SINK});

INSERT INTO nexmark_debezium_group_by
SELECT owner, COUNT(*), SUM(balance)
FROM account_changes
GROUP BY owner;
