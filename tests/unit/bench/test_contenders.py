"""The Flink and ceiling contenders' pure parts: command lines, the build directory, the checks and
the ratios against them (no services, no JVM)."""

from __future__ import annotations

import re
from pathlib import Path

from bench import report
from bench.contenders import (
    FLINK_KAFKA_CONNECTOR,
    FLINK_MAIN,
    FLINK_VERSION,
    ProcessGroupContender,
    Topics,
    cache_dir,
    ceiling_contender,
    flink_argv,
    flink_build_dir,
    flink_checkpoint_uri,
    flink_contender,
    flink_environment,
    flink_s3_problem,
    raw_contender,
)
from bench.harness import REPO_ROOT
from bench.run import CONTENDER_KEYS, read_check, reads_only
from weir.core.config import Endpoints

POM = REPO_ROOT / "bench" / "flink" / "pom.xml"


def test_cache_dir_resolves_as_deploy_local_does() -> None:
    assert cache_dir({"WEIR_CACHE_DIR": "/c/w", "HOME": "/h"}) == Path("/c/w")
    assert cache_dir({"XDG_CACHE_HOME": "/x", "HOME": "/h"}) == Path("/x/weir")
    assert cache_dir({"HOME": "/h"}) == Path("/h/.cache/weir")
    assert flink_build_dir({"HOME": "/h"}).parent == Path("/h/.cache/weir/bench/flink")


def test_the_build_folder_is_named_by_the_sources_as_build_sh_names_it(tmp_path: Path) -> None:
    """Checkouts of another version of bench/flink on the same machine rebuilt the shared jar under a
    running benchmark (its Flink runs then failed with the old command line): a folder per version."""
    import subprocess

    printed = subprocess.run(
        [str(REPO_ROOT / "bench" / "flink" / "build.sh"), "--print-dir"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "WEIR_CACHE_DIR": str(tmp_path)},
    ).stdout.strip()
    assert Path(printed) == flink_build_dir({"WEIR_CACHE_DIR": str(tmp_path)})
    other = tmp_path / "other"
    (other / "src" / "main").mkdir(parents=True)
    (other / "pom.xml").write_text((REPO_ROOT / "bench" / "flink" / "pom.xml").read_text())
    (other / "src" / "main" / "X.java").write_text("class X {}")
    assert flink_build_dir({"WEIR_CACHE_DIR": "/c"}, other) != flink_build_dir({"WEIR_CACHE_DIR": "/c"})


def test_flink_argv_runs_the_job_from_the_cache_at_parallelism_3() -> None:
    argv = flink_argv(
        Path("/c/bench/flink"),
        bootstrap="127.0.0.1:9092",
        input_topic="in",
        output_topic="out",
        group="g",
        checkpoint_uri="s3://bucket/bench-r1/flink/tp1-flink",
        bounded=True,
        parallelism=3,
    )
    assert argv[:4] == ["java", "-cp", "/c/bench/flink/weir-bench-flink.jar:/c/bench/flink/lib/*", FLINK_MAIN]
    options = dict(zip(argv[4::2], argv[5::2], strict=False))
    assert options["--input"] == "in" and options["--output"] == "out" and options["--parallelism"] == "3"
    assert options["--checkpoint-uri"] == "s3://bucket/bench-r1/flink/tp1-flink"
    assert argv[-1] == "--bounded"
    unbounded = flink_argv(
        Path("/c"), bootstrap="b", input_topic="i", output_topic="o", group="g",
        checkpoint_uri="file:///cp", bounded=False, parallelism=3,
    )  # fmt: skip
    assert "--bounded" not in unbounded


def test_flink_checkpoints_where_weir_does_with_the_s3_plugin_and_keys_off_the_command_line() -> None:
    assert flink_checkpoint_uri("s3://weir-checkpoints/bench-r1", Path("/w"), "tp2-flink") == (
        "s3://weir-checkpoints/bench-r1/flink/tp2-flink"
    )
    assert flink_checkpoint_uri("", Path("/w"), "t") == "file:///w/flink-checkpoints/t"
    e = Endpoints.from_env({"WEIR_LOCAL_MODE": "true", "WEIR_S3_PORT": "19000"})  # the local S3 server's keys
    environ = flink_environment(Path("/c/bench/flink"), e, base={"PATH": "/bin"})
    assert environ == {
        "PATH": "/bin",
        "FLINK_PLUGINS_DIR": "/c/bench/flink/plugins",
        "WEIR_S3_ENDPOINT": "http://127.0.0.1:19000",
        "WEIR_S3_ACCESS_KEY": "weiradmin",
        "WEIR_S3_SECRET_KEY": "weiradmin-secret",  # the secret's value, not its masked form
    }
    argv = flink_contender(e, Path("/w"), "r1", "s3://b/bench-r1").argvs(
        Topics("in", "out"), bounded=True, tag="t", group="g"
    )[0]
    assert not any("weiradmin-secret" in arg for arg in argv)


def test_flink_without_static_s3_keys_is_given_none_and_keeps_the_environment_s_own() -> None:
    """Outside the local mode Weir takes boto3's credential chain: the JVM gets no WEIR_S3_* of ours
    (BenchConf then leaves the S3 plugin to its own chain), and an inherited AWS_* stays."""
    e = Endpoints.from_env({"WEIR_LOCAL_MODE": "false"})
    assert e.s3_endpoint is None and e.s3_access_key is None
    environ = flink_environment(Path("/c"), e, base={"PATH": "/bin", "AWS_PROFILE": "bench"})
    assert environ == {"PATH": "/bin", "AWS_PROFILE": "bench", "FLINK_PLUGINS_DIR": "/c/plugins"}


def test_pom_pins_the_versions_the_label_names() -> None:
    pom = POM.read_text()
    assert f"<flink.version>{FLINK_VERSION}</flink.version>" in pom
    assert f"<flink.kafka.version>{FLINK_KAFKA_CONNECTOR}</flink.kafka.version>" in pom
    # the connector's release line names the Flink minor it is built against
    assert FLINK_KAFKA_CONNECTOR.endswith("-" + ".".join(FLINK_VERSION.split(".")[:2]))
    for artifact in ("flink-streaming-java", "flink-clients", "flink-connector-kafka", "flink-statebackend-rocksdb"):
        assert re.search(rf"<artifactId>{artifact}</artifactId>", pom), artifact
    # the build goes out of the repository
    assert "<directory>${weir.build.dir}</directory>" in pom
    # Flink's S3 plugin, for checkpoints on the S3 server, into its own plugins/ folder
    assert "<artifactId>flink-s3-fs-presto</artifactId>" in pom
    assert "<flink.s3.version>" in pom and "<id>s3-plugin</id>" in pom
    build = (REPO_ROOT / "bench" / "flink" / "build.sh").read_text()
    assert "dependency:copy@s3-plugin" in build and '"$OUT/plugins/.complete"' in build


def test_the_job_keeps_the_benchmark_settings() -> None:
    sources = REPO_ROOT / "bench" / "flink" / "src" / "main" / "java" / "weir" / "bench"
    java = (sources / "WindowJob.java").read_text()
    conf = (sources / "BenchConf.java").read_text()
    for setting in ('"state.backend.type", "rocksdb"', '"execution.checkpointing.mode", "EXACTLY_ONCE"'):
        assert setting in conf, setting
    assert "PluginUtils.createPluginManagerFromRootFolder" in conf  # the S3 plugin in a MiniCluster
    for setting in (
        'BenchConf.checkpointing(conf, checkpointUri, "1s")',
        "BenchConf.fileSystems(conf)",
        "DeliveryGuarantee.EXACTLY_ONCE",
        "TumblingEventTimeWindows.of(Duration.ofMillis(windowMs))",
        "setBounded(OffsetsInitializer.latest())",
        '"isolation.level", "read_committed"',
    ):
        assert setting in java, setting


def endpoints() -> Endpoints:
    return Endpoints.from_env()


def test_ceiling_workers_read_without_output_by_static_assignment(tmp_path: Path) -> None:
    ceiling = ceiling_contender(endpoints(), tmp_path, "r1")
    argvs = ceiling.argvs(Topics("in", "out"), bounded=True, tag="tp1-ceiling", group="g")
    assert len(argvs) == 3
    for index, argv in enumerate(argvs):
        assert argv[1:3] == ["-m", "bench.ceiling_worker"]
        assert "--output" not in argv
        options = dict(zip(argv[3::2], argv[4::2], strict=False))
        assert options["--index"] == str(index) and options["--of"] == "3" and options["--partitions"] == "8"
    assert reads_only(ceiling)
    assert not reads_only(raw_contender(endpoints(), tmp_path, "r1"))


def test_raw_and_flink_command_lines(tmp_path: Path) -> None:
    raw = raw_contender(endpoints(), tmp_path, "r1").argvs(Topics("in", "out"), bounded=True, tag="t", group="g")
    assert all(a[1:3] == ["-m", "bench.raw_worker"] and a[-1] == "--bounded" for a in raw)
    flink = flink_contender(endpoints(), tmp_path, "r1", "s3://weir-checkpoints/bench-r1")
    assert isinstance(flink, ProcessGroupContender)
    (argv,) = flink.argvs(Topics("in", "out"), bounded=True, tag="tp1-flink", group="g")
    assert argv[0] == "java" and FLINK_MAIN in argv
    assert "s3://weir-checkpoints/bench-r1/flink/tp1-flink" in argv
    assert flink.label == f"Apache Flink {FLINK_VERSION}"


def test_contender_keys_include_flink_and_the_ceiling() -> None:
    assert {"flink", "ceiling"} <= set(CONTENDER_KEYS)


def test_read_check_is_ok_only_at_the_exact_count() -> None:
    assert read_check(208, 208)["ok"] is True
    assert not read_check(207, 208)["ok"]
    assert not read_check(210, 208)["ok"]


def test_ratios_against_flink_and_the_ceiling() -> None:
    doc = {
        "throughput": {
            "weir-kafka": {"median_eps": 60_000.0, "median_cpu_s_per_million": 4.0},
            "flink": {"median_eps": 80_000.0, "median_cpu_s_per_million": 8.0},
            "raw": {"median_eps": 100_000.0, "median_cpu_s_per_million": 2.0},
            "ceiling": {"median_eps": 120_000.0, "median_cpu_s_per_million": 0.5},
        }
    }
    r = report.ratios(doc)
    assert r["weir_kafka_vs_flink"] == 0.75
    assert r["weir_kafka_vs_ceiling"] == 0.5
    assert r["weir_kafka_cpu_vs_flink"] == 0.5
    assert r["weir_kafka_cpu_vs_raw"] == 2.0
    assert r["weir_kafka_cpu_vs_quix"] is None


def test_stop_reaps_a_worker_that_exited_just_before_with_its_rusage() -> None:
    """A worker that exited after the last ``done()``: ``stop`` must not poll it (that would reap it
    without rusage, and wait4 would then find no child)."""
    import os
    import subprocess
    import sys

    from bench.contenders import ProcessGroupRunning
    from bench.harness import ProcessSampler

    code = "print('@ready'); print('@progress 5'); print('@done')"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    running = ProcessGroupRunning("t", endpoints(), "g", "in", procs, {}, True, False, True)
    for proc in procs:  # wait until both have exited, without reaping them
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    sampler = ProcessSampler()
    running.stop(sampler)
    assert len(running.reaped) == 2 and all(r.exit_code == 0 for r in running.reaped.values())
    assert running.progress() == 10
    assert {u.name for u in sampler.usage.values()} == {"t-0", "t-1"}
    assert all(u.peak_rss_bytes > 0 for u in sampler.usage.values())


def test_a_contenders_figure_is_failed_by_a_mismatching_run_and_drops_out_of_the_ratios() -> None:
    from bench.report import summarize_throughput

    def run(eps: float, ok: bool) -> dict[str, object]:
        return {
            "sustained_eps": eps,
            "wall_eps": eps / 2,
            "cpu_s_per_million": 20.0,
            "sustained_cpu_s_per_million": 15.0,
            "s3_cpu_s": 0.5,
            "peak_rss_bytes": {"taskmanager-1": 100},
            "output": {"ok": ok, "summary": "ok" if ok else "1 changed"},
            "load": {"under_load": not ok},
        }

    good = summarize_throughput({"runs": [run(80_000.0, True), run(60_000.0, True), run(100_000.0, True)]})
    assert good["median_eps"] == 80_000.0
    assert good["figure"]["sustained_eps"] == {"median": 80_000.0, "min": 60_000.0, "max": 100_000.0, "runs": 3}
    bad = summarize_throughput({"runs": [run(80_000.0, True), run(999_999.0, False), run(90_000.0, True)]})
    assert bad["median_eps"] is None and bad["figure"]["ok"] is False
    assert bad["figure"]["failed"] == ["run 2: output does not match the reference"]
    assert bad["figure"]["runs_under_load"] == 1
    assert report.ratios({"throughput": {"weir-kafka": bad, "flink": good}})["weir_kafka_vs_flink"] is None


def test_flink_s3_checkpoints_without_an_endpoint_or_credentials_are_refused_before_any_run() -> None:
    """Run outside make, the local mode is off: no endpoint, no keys, and Flink would fail every run at
    its final checkpoint after minutes. Found at the start instead, naming the fix."""
    no_endpoint = Endpoints.from_env({"WEIR_LOCAL_MODE": "false"})
    problem = flink_s3_problem("s3://weir-checkpoints/bench-r1", no_endpoint, {"PATH": "/bin"})
    assert problem is not None and "s3://weir-checkpoints/bench-r1" in problem and "make" in problem
    local = Endpoints.from_env({"WEIR_LOCAL_MODE": "true", "WEIR_S3_PORT": "19000"})
    assert flink_s3_problem("s3://weir-checkpoints/bench-r1", local, {}) is None
    assert flink_s3_problem("s3://b/p", no_endpoint, {"AWS_PROFILE": "bench"}) is None  # AWS's own chain
    assert flink_s3_problem("s3://b/p", no_endpoint, {"AWS_ACCESS_KEY_ID": ""}) is not None  # empty is unset
    assert flink_s3_problem("file:///tmp/cp", no_endpoint, {}) is None
