package weir.bench;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.flink.api.common.JobStatus;
import org.apache.flink.api.common.state.CheckpointListener;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.AggregateFunction;
import org.apache.flink.api.common.functions.MapFunction;
import org.apache.flink.api.common.serialization.DeserializationSchema;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.functions.KeySelector;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.api.java.tuple.Tuple3;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.connector.base.DeliveryGuarantee;
import org.apache.flink.connector.kafka.sink.KafkaRecordSerializationSchema;
import org.apache.flink.connector.kafka.sink.KafkaSink;
import org.apache.flink.connector.kafka.source.KafkaSource;
import org.apache.flink.connector.kafka.source.KafkaSourceBuilder;
import org.apache.flink.connector.kafka.source.enumerator.initializer.OffsetsInitializer;
import org.apache.flink.connector.kafka.source.reader.deserializer.KafkaRecordDeserializationSchema;
import org.apache.flink.core.execution.JobClient;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.windowing.ProcessWindowFunction;
import org.apache.flink.streaming.api.windowing.assigners.TumblingEventTimeWindows;
import org.apache.flink.streaming.api.windowing.windows.TimeWindow;
import org.apache.flink.util.Collector;
import org.apache.kafka.clients.producer.ProducerRecord;

/**
 * The Apache Flink contender of bench/run.py: Weir's keyed aggregation (examples/keyed_aggregation.py)
 * in Java on a local MiniCluster in this JVM.
 *
 * <p>JSON events {"id", "key", "value", "ts"} from Kafka (event time = ts, watermarks per partition,
 * no out-of-orderness), projected to (key, value), keyed by key, tumbling event-time windows of 1 s,
 * count + sum incrementally, results {"key", "window_start", "window_end", "count", "sum"} to Kafka
 * through an exactly-once KafkaSink. RocksDB state, a checkpoint every second to {@code
 * --checkpoint-uri} (the S3 server Weir's checkpoints go to: BenchConf), parallelism 3.
 *
 * <p>{@code --bounded} reads up to the end offsets present at start; the job then fires every window,
 * takes its final checkpoint (which commits the last transaction) and finishes. Progress goes to stdout
 * as {@code @progress <events deserialized>} ten times a second, {@code @ready} once its first
 * checkpoint completed (every task runs) and {@code @done} once it finished.
 */
public final class WindowJob {
  /** Events deserialized by the source subtasks of this JVM (the MiniCluster runs in it). */
  static final AtomicLong CONSUMED = new AtomicLong();

  /** Checkpoints completed in this JVM (one only completes once every task of the job runs). */
  static final AtomicLong CHECKPOINTS = new AtomicLong();

  private WindowJob() {}

  public static void main(String[] argv) throws Exception {
    Map<String, String> args = parseArgs(argv);
    String bootstrap = args.get("bootstrap");
    String input = args.get("input");
    String output = args.get("output");
    String group = args.get("group");
    boolean bounded = args.containsKey("bounded");
    int parallelism = Integer.parseInt(args.getOrDefault("parallelism", "3"));
    long windowMs = Long.parseLong(args.getOrDefault("window-ms", "1000"));
    String checkpointUri = args.get("checkpoint-uri");
    if (bootstrap == null || input == null || output == null || group == null || checkpointUri == null) {
      System.err.println(
          "usage: WindowJob --bootstrap B --input T --output T --group G --checkpoint-uri URI [--bounded]"
              + " [--parallelism 3] [--window-ms 1000]");
      System.exit(2);
    }

    Configuration conf = new Configuration();
    BenchConf.checkpointing(conf, checkpointUri, "1s");
    conf.setString("parallelism.default", Integer.toString(parallelism));
    conf.setString("taskmanager.numberOfTaskSlots", Integer.toString(parallelism));
    conf.setString("rest.port", "0");
    BenchConf.fileSystems(conf);
    StreamExecutionEnvironment env = StreamExecutionEnvironment.createLocalEnvironment(parallelism, conf);

    KafkaSourceBuilder<Tuple3<String, Long, Long>> source =
        KafkaSource.<Tuple3<String, Long, Long>>builder()
            .setBootstrapServers(bootstrap)
            .setTopics(input)
            .setGroupId(group)
            .setStartingOffsets(OffsetsInitializer.earliest())
            .setProperty("isolation.level", "read_committed")
            .setDeserializer(KafkaRecordDeserializationSchema.valueOnly(new EventSchema()));
    if (bounded) {
      source.setBounded(OffsetsInitializer.latest());
    }
    WatermarkStrategy<Tuple3<String, Long, Long>> watermarks =
        WatermarkStrategy.<Tuple3<String, Long, Long>>forMonotonousTimestamps()
            .withTimestampAssigner((event, previous) -> event.f2);

    DataStream<Tuple2<String, String>> results =
        env.fromSource(source.build(), watermarks, "events-source")
            .uid("events-source")
            .map(new Project())
            .uid("key-value")
            .name("project")
            .keyBy(new ByKey())
            .window(TumblingEventTimeWindows.of(Duration.ofMillis(windowMs)))
            .aggregate(new CountAndSum(), new ToResult())
            .uid("count-per-key")
            .name("count-per-key");

    KafkaSink<Tuple2<String, String>> sink =
        KafkaSink.<Tuple2<String, String>>builder()
            .setBootstrapServers(bootstrap)
            .setRecordSerializer(new ResultSerializer(output))
            .setDeliveryGuarantee(DeliveryGuarantee.EXACTLY_ONCE)
            .setTransactionalIdPrefix(group)
            .setProperty("transaction.timeout.ms", "60000")
            .setProperty("linger.ms", "5")
            .build();
    results.sinkTo(sink).uid("window-results").name("window-results");

    Thread reporter =
        new Thread(
            () -> {
              try {
                while (true) {
                  System.out.println("@progress " + CONSUMED.get());
                  System.out.flush();
                  Thread.sleep(100);
                }
              } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
              }
            },
            "progress");
    reporter.setDaemon(true);
    reporter.start();

    JobClient job = env.executeAsync("weir-bench-keyed-aggregation");
    // Ready once a checkpoint completed: Flink triggers one only when every task runs (a RUNNING
    // job may still be deploying its tasks, opening RocksDB and the Kafka clients).
    while (CHECKPOINTS.get() == 0) {
      JobStatus status = job.getJobStatus().get();
      if (status.isTerminalState()) {
        break;
      }
      Thread.sleep(50);
    }
    System.out.println("@ready");
    System.out.flush();
    job.getJobExecutionResult().get(); // throws when the job failed
    System.out.println("@progress " + CONSUMED.get());
    System.out.println("@done");
    System.out.flush();
    System.exit(0);
  }

  static Map<String, String> parseArgs(String[] argv) {
    Map<String, String> out = new HashMap<>();
    for (int i = 0; i < argv.length; i++) {
      if (!argv[i].startsWith("--")) {
        throw new IllegalArgumentException("unexpected argument " + argv[i]);
      }
      String name = argv[i].substring(2);
      if (i + 1 < argv.length && !argv[i + 1].startsWith("--")) {
        out.put(name, argv[++i]);
      } else {
        out.put(name, "");
      }
    }
    return out;
  }

  /**
   * One event, checked as Weir's parse_event checks it: a JSON object with string id and key, integer
   * value and ts; (key, value, ts). A malformed event is skipped (Weir sends it to a dead-letter topic;
   * the benchmark's input has none).
   */
  static final class EventSchema implements DeserializationSchema<Tuple3<String, Long, Long>> {
    private static final ObjectMapper MAPPER = new ObjectMapper();

    @Override
    public Tuple3<String, Long, Long> deserialize(byte[] message) throws IOException {
      CONSUMED.incrementAndGet();
      if (message == null) {
        return null;
      }
      JsonNode event = MAPPER.readTree(message);
      JsonNode id = event.get("id");
      JsonNode key = event.get("key");
      JsonNode value = event.get("value");
      JsonNode ts = event.get("ts");
      if (id == null || !id.isTextual() || key == null || !key.isTextual()) {
        return null;
      }
      if (value == null || !value.isIntegralNumber()) {
        return null;
      }
      if (ts == null || !ts.isIntegralNumber()) {
        return null;
      }
      return Tuple3.of(key.textValue(), value.longValue(), ts.longValue());
    }

    @Override
    public boolean isEndOfStream(Tuple3<String, Long, Long> next) {
      return false;
    }

    @Override
    public TypeInformation<Tuple3<String, Long, Long>> getProducedType() {
      return Types.TUPLE(Types.STRING, Types.LONG, Types.LONG);
    }
  }

  /**
   * Only what the window needs crosses the shuffle: (key, value); the event time is the timestamp.
   * Also counts completed checkpoints, for {@code @ready}.
   */
  static final class Project
      implements MapFunction<Tuple3<String, Long, Long>, Tuple2<String, Long>>, CheckpointListener {
    @Override
    public Tuple2<String, Long> map(Tuple3<String, Long, Long> event) {
      return Tuple2.of(event.f0, event.f1);
    }

    @Override
    public void notifyCheckpointComplete(long checkpointId) {
      CHECKPOINTS.incrementAndGet();
    }
  }

  static final class ByKey implements KeySelector<Tuple2<String, Long>, String> {
    @Override
    public String getKey(Tuple2<String, Long> pair) {
      return pair.f0;
    }
  }

  /** (count, sum) per key and window, incrementally. */
  static final class CountAndSum
      implements AggregateFunction<Tuple2<String, Long>, Tuple2<Long, Long>, Tuple2<Long, Long>> {
    @Override
    public Tuple2<Long, Long> createAccumulator() {
      return Tuple2.of(0L, 0L);
    }

    @Override
    public Tuple2<Long, Long> add(Tuple2<String, Long> pair, Tuple2<Long, Long> acc) {
      return Tuple2.of(acc.f0 + 1, acc.f1 + pair.f1);
    }

    @Override
    public Tuple2<Long, Long> getResult(Tuple2<Long, Long> acc) {
      return acc;
    }

    @Override
    public Tuple2<Long, Long> merge(Tuple2<Long, Long> a, Tuple2<Long, Long> b) {
      return Tuple2.of(a.f0 + b.f0, a.f1 + b.f1);
    }
  }

  /** (key, JSON result) of one window, in Weir's output shape. */
  static final class ToResult
      extends ProcessWindowFunction<Tuple2<Long, Long>, Tuple2<String, String>, String, TimeWindow> {
    private static final ObjectMapper MAPPER = new ObjectMapper();

    @Override
    public void process(
        String key, Context context, Iterable<Tuple2<Long, Long>> aggregates, Collector<Tuple2<String, String>> out)
        throws IOException {
      Tuple2<Long, Long> acc = aggregates.iterator().next();
      TimeWindow window = context.window();
      String json =
          "{\"key\":"
              + MAPPER.writeValueAsString(key)
              + ",\"window_start\":"
              + window.getStart()
              + ",\"window_end\":"
              + window.getEnd()
              + ",\"count\":"
              + acc.f0
              + ",\"sum\":"
              + acc.f1
              + "}";
      out.collect(Tuple2.of(key, json));
    }
  }

  /** The result record: Kafka key = the window's key, value = its JSON. */
  static final class ResultSerializer implements KafkaRecordSerializationSchema<Tuple2<String, String>> {
    private final String topic;

    ResultSerializer(String topic) {
      this.topic = topic;
    }

    @Override
    public ProducerRecord<byte[], byte[]> serialize(
        Tuple2<String, String> result, KafkaSinkContext context, Long timestamp) {
      return new ProducerRecord<>(
          topic, result.f0.getBytes(StandardCharsets.UTF_8), result.f1.getBytes(StandardCharsets.UTF_8));
    }
  }
}
