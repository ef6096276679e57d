package weir.bench;

import java.io.IOException;
import java.io.InputStream;
import java.net.HttpURLConnection;
import java.net.URL;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.flink.api.common.JobStatus;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.core.execution.JobClient;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.table.api.EnvironmentSettings;
import org.apache.flink.table.api.StatementSet;
import org.apache.flink.table.api.TableResult;
import org.apache.flink.table.api.bridge.java.StreamTableEnvironment;

/**
 * The Apache Flink contender of bench/nexmark_bench.py: one Nexmark query in Flink SQL on a local
 * MiniCluster in this JVM, configured as the Nexmark reference configures Flink.
 *
 * <p>The input is the Kafka topic weir.tools.nexmark_load wrote: flat JSON events with an {@code
 * event_type} (0 person, 1 auction, 2 bid) and the reference's field names, times in epoch
 * milliseconds. One Kafka table holds every field; the views {@code person}, {@code auction} and
 * {@code bid} are those of the reference's ddl_views.sql, with {@code dateTime} the rowtime (watermark
 * 4 s behind, the reference's DDL). The query is the reference's qN.sql (resources nexmark/qN.sql)
 * with a Kafka sink (exactly-once, transactions) instead of blackhole, so its output can be checked;
 * an updating query writes to upsert-kafka, exactly-once too. The scan is bounded ({@code
 * scan.bounded.mode = latest-offset}).
 *
 * <p>The reference's nexmark-flink/src/main/resources/conf/config.yaml, what applies of it: RocksDB
 * state with incremental checkpoints, exactly-once checkpoints every {@code --checkpoint-interval}
 * (the reference's 180 s by default; the benchmark gives Weir the same interval), mini-batch
 * ({@code table.exec.mini-batch.*}: enabled, 2 s, 50,000 rows) and split distinct aggregates. Not
 * applied: its parallelism of 8 (both contenders run at {@code --parallelism}, 3: Weir's three
 * TaskManagers), its TaskManager memory (one JVM here, the JVM's default heap), and {@code
 * checkpoints-after-tasks-finish.enabled: false}, which the reference can set because its sink is a
 * blackhole: here the final checkpoint commits the sink's last transaction.
 *
 * <p>stdout: {@code @job <job id>} once submitted (the benchmark reads the source's progress from the
 * REST API with it), {@code @running <epoch ms>} once every task is RUNNING ({@code --rest-port}:
 * the MiniCluster's REST API is polled for it; without it, once the job is RUNNING), {@code @done
 * <epoch ms>} once it finished; the JVM then waits for stdin to close (so its CPU time can be read)
 * and exits.
 *
 * <p>{@code --query q0,q1,...} runs several queries in one job (a statement set: the source read
 * once), each into the topic {@code <output>-<query>} with the transactional id prefix {@code
 * <group>-<query>} (tests/integration/sql/test_nexmark_vs_flink.py: one JVM for every query).
 *
 * <p>{@code --side-input FILE}: the file a query's {@code ${SIDE_INPUT}} names (q13's side input
 * table's {@code 'path'}); {@code --file-output DIR}: a query's {@code ${FILE_OUTPUT}} is the folder
 * {@code DIR/<its output topic's name>} (q10's 'filesystem' sink). A query's {@code ${UPSERT_SOURCE}}
 * is an 'upsert-kafka' table of the topic {@code <topic>-upsert} (JSON key and value, read up to its
 * latest offsets): join_upsert_table.sql's. A query's {@code ${DEBEZIUM_SOURCE}} is a 'kafka' table of
 * 'debezium-json' of the topic {@code <topic>-debezium} (read up to its latest offsets), its {@code
 * ${DEBEZIUM_SINK}} the {@code ${SINK}} in 'debezium-json': debezium_group_by.sql's and
 * debezium_sink.sql's.
 */
public final class NexmarkSql {
  /**
   * A transaction stays open from one checkpoint to the next: 15 min (the broker's largest by
   * default, Weir's Kafka sink's default) covers the reference's 3 min interval and a bounded run.
   */
  private static final String TRANSACTION_TIMEOUT = "'properties.transaction.timeout.ms' = '900000'";

  private NexmarkSql() {}

  public static void main(String[] argv) {
    int code = 0;
    try {
      run(argv);
    } catch (Throwable e) { // the MiniCluster's threads would keep a failed JVM alive
      e.printStackTrace();
      code = 1;
    }
    System.exit(code);
  }

  private static void run(String[] argv) throws Exception {
    Map<String, String> args = parseArgs(argv);
    String query = args.get("query");
    String bootstrap = args.get("bootstrap");
    String topic = args.get("topic");
    String output = args.get("output");
    String group = args.get("group");
    String checkpointUri = args.get("checkpoint-uri");
    String checkpointInterval = args.getOrDefault("checkpoint-interval", "180s");
    boolean miniBatch = !"false".equals(args.getOrDefault("mini-batch", "true"));
    int parallelism = Integer.parseInt(args.getOrDefault("parallelism", "3"));
    String restPort = args.getOrDefault("rest-port", "0");
    // q13's side input file (bench.nexmark_bench.write_side_input), its table's 'path'
    String sideInput = args.get("side-input");
    // a 'filesystem' query's (q10) folder: <file-output>/<its output topic's name>
    String fileOutput = args.get("file-output");
    if (query == null || bootstrap == null || topic == null || output == null || group == null
        || checkpointUri == null) {
      System.err.println(
          "usage: NexmarkSql --query qN --bootstrap B --topic T --output T --group G --checkpoint-uri URI"
              + " [--checkpoint-interval 180s] [--mini-batch true] [--parallelism 3] [--rest-port P]"
              + " [--side-input FILE] [--file-output DIR]");
      System.exit(2);
    }
    // --query q0,q1,...: every query in one job (a statement set), each into the topic <output>-<query>
    String[] queries = query.split(",");

    Configuration conf = new Configuration();
    BenchConf.checkpointing(conf, checkpointUri, checkpointInterval);
    if (miniBatch) { // the reference's config.yaml
      conf.setString("table.exec.mini-batch.enabled", "true");
      conf.setString("table.exec.mini-batch.allow-latency", "2s");
      conf.setString("table.exec.mini-batch.size", "50000");
      conf.setString("table.optimizer.distinct-agg.split.enabled", "true");
    }
    conf.setString("parallelism.default", Integer.toString(parallelism));
    conf.setString("taskmanager.numberOfTaskSlots", Integer.toString(parallelism));
    conf.setString("rest.port", restPort);
    conf.setString("rest.address", "127.0.0.1");
    conf.setString("web.refresh-interval", "20"); // the REST job details are cached this long (default 3 s)
    // the REST API's metrics are fetched from the tasks this often (default 10 s); Weir's TaskManagers
    // update theirs twice a second, and the benchmark reads the source's progress from both
    conf.setString("metrics.fetcher.update-interval", "500");
    conf.setString("table.local-time-zone", "UTC");
    conf.setString("restart-strategy.type", "none"); // a failure ends the run, with its cause
    BenchConf.fileSystems(conf);
    StreamExecutionEnvironment env = StreamExecutionEnvironment.createLocalEnvironment(parallelism, conf);
    StreamTableEnvironment tables =
        StreamTableEnvironment.create(env, EnvironmentSettings.newInstance().inStreamingMode().withConfiguration(conf).build());

    tables.executeSql(
        "CREATE TABLE events (\n"
            + "  event_type INT,\n"
            + "  id BIGINT, name STRING, emailAddress STRING, creditCard STRING, city STRING, state STRING,\n"
            + "  itemName STRING, description STRING, initialBid BIGINT, reserve BIGINT, expires BIGINT,\n"
            + "  seller BIGINT, category BIGINT,\n"
            + "  auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING,\n"
            + "  `dateTime` BIGINT, extra STRING,\n"
            + "  rowtime AS CAST(TO_TIMESTAMP_LTZ(`dateTime`, 3) AS TIMESTAMP(3)),\n"
            + "  WATERMARK FOR rowtime AS rowtime - INTERVAL '4' SECOND\n"
            + ") WITH (\n"
            + "  'connector' = 'kafka',\n"
            + "  'topic' = '" + topic + "',\n"
            + "  'properties.bootstrap.servers' = '" + bootstrap + "',\n"
            + "  'properties.group.id' = '" + group + "',\n"
            + "  'properties.isolation.level' = 'read_committed',\n"
            + "  'scan.startup.mode' = 'earliest-offset',\n"
            + "  'scan.bounded.mode' = 'latest-offset',\n"
            + "  'format' = 'json'\n"
            + ")");
    tables.executeSql(
        "CREATE VIEW person AS SELECT id, name, emailAddress, creditCard, city, state,"
            + " rowtime AS `dateTime`, extra FROM events WHERE event_type = 0");
    tables.executeSql(
        "CREATE VIEW auction AS SELECT id, itemName, description, initialBid, reserve, rowtime AS `dateTime`,"
            + " CAST(TO_TIMESTAMP_LTZ(expires, 3) AS TIMESTAMP(3)) AS expires, seller, category, extra"
            + " FROM events WHERE event_type = 1");
    tables.executeSql(
        "CREATE VIEW bid AS SELECT auction, bidder, price, channel, url, rowtime AS `dateTime`, extra"
            + " FROM events WHERE event_type = 2");

    String sink =
        "'connector' = 'kafka', 'topic' = '@OUTPUT@', 'properties.bootstrap.servers' = '" + bootstrap
            + "', 'format' = 'json', 'sink.delivery-guarantee' = 'exactly-once',"
            + " 'sink.transactional-id-prefix' = '@GROUP@', " + TRANSACTION_TIMEOUT
            + ", 'properties.linger.ms' = '5'";
    String upsertSink =
        "'connector' = 'upsert-kafka', 'topic' = '@OUTPUT@', 'properties.bootstrap.servers' = '"
            + bootstrap + "', 'key.format' = 'json', 'value.format' = 'json',"
            + " 'sink.delivery-guarantee' = 'exactly-once', 'sink.transactional-id-prefix' = '@GROUP@', "
            + TRANSACTION_TIMEOUT + ", 'properties.linger.ms' = '5'";
    String upsertSource =
        "'connector' = 'upsert-kafka', 'topic' = '" + topic + "-upsert', 'properties.bootstrap.servers' = '"
            + bootstrap + "', 'key.format' = 'json', 'value.format' = 'json',"
            + " 'scan.bounded.mode' = 'latest-offset'";
    // a 'kafka' table of Debezium change envelopes (a CDC topic) read as a changelog: <topic>-debezium
    String debeziumSource =
        "'connector' = 'kafka', 'topic' = '" + topic + "-debezium', 'properties.bootstrap.servers' = '"
            + bootstrap + "', 'format' = 'debezium-json', 'scan.startup.mode' = 'earliest-offset',"
            + " 'scan.bounded.mode' = 'latest-offset'";
    // an updating result written as Debezium change envelopes into an append-only topic
    String debeziumSink = sink.replace("'format' = 'json'", "'format' = 'debezium-json'");
    TableResult result = null;
    StatementSet set = tables.createStatementSet();
    for (String name : queries) {
      String topicOut = queries.length == 1 ? output : output + "-" + name;
      String prefix = queries.length == 1 ? group : group + "-" + name;
      String text = resource("/nexmark/" + name + ".sql");
      if (text.contains("${SIDE_INPUT}")) {
        if (sideInput == null) {
          throw new IllegalArgumentException(name + ".sql reads a side input: give --side-input FILE");
        }
        text = text.replace("${SIDE_INPUT}", sideInput);
      }
      if (text.contains("${FILE_OUTPUT}")) {
        if (fileOutput == null) {
          throw new IllegalArgumentException(name + ".sql writes files: give --file-output DIR");
        }
        text = text.replace("${FILE_OUTPUT}", "file://" + fileOutput + "/" + topicOut);
      }
      // an 'upsert-kafka' table read by a query (a join with a changelog): the topic <topic>-upsert
      text = text.replace("${UPSERT_SOURCE}", upsertSource).replace("${DEBEZIUM_SOURCE}", debeziumSource);
      String insertSql =
          text.replace("${SINK}", sink.replace("@OUTPUT@", topicOut).replace("@GROUP@", prefix))
              .replace("${DEBEZIUM_SINK}", debeziumSink.replace("@OUTPUT@", topicOut).replace("@GROUP@", prefix))
              .replace("${UPSERT_SINK}", upsertSink.replace("@OUTPUT@", topicOut).replace("@GROUP@", prefix));
      for (String statement : statements(insertSql)) {
        if (queries.length > 1 && statement.strip().toUpperCase().startsWith("INSERT")) {
          set.addInsertSql(statement);
        } else {
          result = tables.executeSql(statement);
        }
      }
    }
    if (queries.length > 1) {
      result = set.execute();
    }
    if (result == null || result.getJobClient().isEmpty()) {
      throw new IllegalStateException(query + ".sql has no INSERT statement");
    }
    JobClient job = result.getJobClient().get();
    System.out.println("@job " + job.getJobID());
    System.out.flush();
    // "running" as bench/nexmark_bench.py takes it for Weir: every task RUNNING (deployed, state
    // initialized), read from the MiniCluster's REST API when its port is known, else the job's status
    while (!allTasksRunning(job, restPort, parallelism)) {
      if (job.getJobStatus().get().isGloballyTerminalState()) {
        break;
      }
      Thread.sleep(10);
    }
    System.out.println("@running " + System.currentTimeMillis());
    System.out.flush();
    job.getJobExecutionResult().get(); // throws when the job failed
    System.out.println("@done " + System.currentTimeMillis());
    System.out.flush();
    InputStream in = System.in;
    while (in.read() != -1) {
      // wait for the benchmark to read this JVM's CPU time and close stdin
    }
  }

  private static boolean allTasksRunning(JobClient job, String restPort, int parallelism) throws Exception {
    if ("0".equals(restPort)) {
      return job.getJobStatus().get() == JobStatus.RUNNING;
    }
    HttpURLConnection connection =
        (HttpURLConnection) new URL("http://127.0.0.1:" + restPort + "/jobs/" + job.getJobID()).openConnection();
    connection.setConnectTimeout(1000);
    connection.setReadTimeout(1000);
    try (InputStream in = connection.getInputStream()) {
      JsonNode details = new ObjectMapper().readTree(in);
      JsonNode vertices = details.path("vertices");
      if (!vertices.isArray() || vertices.size() == 0) {
        return false;
      }
      for (JsonNode vertex : vertices) {
        if (vertex.path("tasks").path("RUNNING").asInt() != vertex.path("parallelism").asInt()) {
          return false;
        }
      }
      return true;
    } catch (IOException e) {
      return false; // the REST endpoint not up yet
    }
  }

  /** The statements of a .sql resource: comment lines dropped, split at a ';' ending a line. */
  static List<String> statements(String sql) {
    StringBuilder current = new StringBuilder();
    List<String> out = new ArrayList<>();
    for (String line : sql.split("\n")) {
      if (line.strip().startsWith("--")) {
        continue;
      }
      String stripped = line.stripTrailing();
      if (stripped.endsWith(";")) {
        current.append(stripped, 0, stripped.length() - 1);
        if (!current.toString().isBlank()) {
          out.add(current.toString());
        }
        current.setLength(0);
      } else {
        current.append(line).append('\n');
      }
    }
    if (!current.toString().isBlank()) {
      out.add(current.toString());
    }
    return out;
  }

  private static String resource(String name) throws IOException {
    try (InputStream in = NexmarkSql.class.getResourceAsStream(name)) {
      if (in == null) {
        throw new IllegalArgumentException("no Flink SQL for this query: " + name);
      }
      return new String(in.readAllBytes(), StandardCharsets.UTF_8);
    }
  }

  private static Map<String, String> parseArgs(String[] argv) {
    Map<String, String> out = new HashMap<>();
    for (int i = 0; i < argv.length; i++) {
      if (!argv[i].startsWith("--")) {
        throw new IllegalArgumentException("unexpected argument " + argv[i]);
      }
      String key = argv[i].substring(2);
      if (i + 1 < argv.length && !argv[i + 1].startsWith("--")) {
        out.put(key, argv[++i]);
      } else {
        out.put(key, "");
      }
    }
    return out;
  }
}
