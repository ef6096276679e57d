package weir.bench;

import java.util.Map;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.core.fs.FileSystem;
import org.apache.flink.core.plugin.PluginUtils;

/**
 * What both Flink contenders (WindowJob, NexmarkSql) configure alike: RocksDB state with
 * incremental checkpoints written where Weir writes its own, and the S3 file system.
 *
 * <p>Checkpoints go to {@code --checkpoint-uri}: an {@code s3://bucket/prefix} on the same S3 server
 * Weir's checkpoints go to (so that the server's CPU is counted for both in the same way), or a
 * {@code file://} directory. {@code s3://} is served by Flink's {@code flink-s3-fs-presto} plugin,
 * which bench/flink/build.sh puts in {@code plugins/s3-fs-presto/} beside the jar; the benchmark
 * passes that folder as {@code FLINK_PLUGINS_DIR} and the S3 server's address and keys as
 * {@code WEIR_S3_ENDPOINT}, {@code WEIR_S3_ACCESS_KEY} and {@code WEIR_S3_SECRET_KEY} (the
 * environment, not the command line, so the keys are not in the process list).
 */
final class BenchConf {
  private BenchConf() {}

  /** RocksDB, incremental checkpoints every {@code interval} (a Flink duration, e.g. 1s, 180s). */
  static void checkpointing(Configuration conf, String checkpointUri, String interval) {
    conf.setString("state.backend.type", "rocksdb");
    conf.setString("execution.checkpointing.incremental", "true");
    conf.setString("execution.checkpointing.storage", "filesystem");
    conf.setString("execution.checkpointing.dir", checkpointUri);
    conf.setString("execution.checkpointing.interval", interval);
    conf.setString("execution.checkpointing.mode", "EXACTLY_ONCE");
  }

  /**
   * The S3 file system's options from the environment, then the file systems initialized with the
   * plugins of {@code FLINK_PLUGINS_DIR}: a MiniCluster started from {@code
   * createLocalEnvironment} does not load plugins itself, a Flink cluster's entry point does.
   */
  static void fileSystems(Configuration conf) {
    Map<String, String> env = System.getenv();
    String endpoint = env.get("WEIR_S3_ENDPOINT");
    if (endpoint != null && !endpoint.isEmpty()) {
      conf.setString("s3.endpoint", endpoint);
      conf.setString("s3.path.style.access", "true");
      conf.setString("s3.access-key", env.getOrDefault("WEIR_S3_ACCESS_KEY", ""));
      conf.setString("s3.secret-key", env.getOrDefault("WEIR_S3_SECRET_KEY", ""));
    }
    FileSystem.initialize(conf, PluginUtils.createPluginManagerFromRootFolder(conf));
  }
}
