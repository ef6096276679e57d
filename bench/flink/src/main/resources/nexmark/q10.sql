-- Nexmark q10, log to file system (nexmark/nexmark queries/q10.sql): every bid into a 'filesystem'
-- table partitioned by its day and minute (PARTITIONED BY (dt, hm), CSV part files), each partition
-- committed with a _SUCCESS file once the watermark passed its minute and one more. The query text and
-- the table's columns and options are the suite's but its path, ${FILE_OUTPUT} (the query's output
-- folder, weir.bench.NexmarkSql's --file-output). Compared as rows: each part file's CSV lines with
-- the partition values of its folder (bench.nexmark_bench.file_records), not by file names; and the
-- partitions holding a _SUCCESS file.
CREATE TABLE nexmark_q10 (
  auction  BIGINT,
  bidder  BIGINT,
  price  BIGINT,
  `dateTime`  TIMESTAMP(3),
  extra  VARCHAR,
  dt STRING,
  hm STRING
) PARTITIONED BY (dt, hm) WITH (
  'connector' = 'filesystem',
  'path' = '${FILE_OUTPUT}',
  'format' = 'csv',
  'sink.partition-commit.trigger' = 'partition-time',
  'sink.partition-commit.delay' = '1 min',
  'sink.partition-commit.policy.kind' = 'success-file',
  'partition.time-extractor.timestamp-pattern' = '$dt $hm:00',
  'sink.rolling-policy.rollover-interval' = '1min',
  'sink.rolling-policy.check-interval' = '1min'
);

INSERT INTO nexmark_q10
SELECT auction, bidder, price, `dateTime`, extra, DATE_FORMAT(`dateTime`, 'yyyy-MM-dd'), DATE_FORMAT(`dateTime`, 'HH:mm')
FROM bid;
