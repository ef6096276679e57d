"""The settings classes of weir.core.config: types, defaults from endpoints.env and their expansion, and
one line naming every bad value; the processes' entry points refuse a bad value with exit code 2."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from weir.core.config import (
    LOCAL_MODE,
    SETTINGS,
    CrashPointSettings,
    Diagnostics,
    Directories,
    Endpoints,
    JobManagerSettings,
    LogFormat,
    LogLevel,
    TaskManagerSettings,
    check_environment,
    checkpoint_dir,
    endpoint_defaults,
    env_name,
    resolve_environment,
    run_dir,
)
from weir.core.errors import ConfigurationError, Fault, WeirError
from weir.tools.config_doc import SCRIPT_VARIABLES

REPO = Path(__file__).resolve().parents[4]
ALL_NAMES = {env_name(field) for settings in SETTINGS for field in settings.model_fields}


def _value(value: object) -> str:
    return value.get_secret_value() if isinstance(value, SecretStr) else str(value)


def test_the_defaults_are_those_of_endpoints_env_expanded() -> None:
    endpoints = Endpoints.from_env({"WEIR_LOCAL_MODE": "true"})
    assert endpoints.kafka_bootstrap == "127.0.0.1:19092"
    assert endpoints.postgres_dsn == "postgresql://weir:weir@127.0.0.1:15432/weir"
    assert endpoints.s3_endpoint == "http://127.0.0.1:19000"
    assert endpoints.jobmanager_address == "127.0.0.1:16123"
    assert endpoints.jobmanager_metrics_port == 19249
    assert endpoints.jobmanager_rest_port == 18081
    assert endpoints.taskmanager_metrics_base_port == 19250
    resolved = resolve_environment({})
    for field in Endpoints.model_fields:
        if field != "local_mode":
            assert _value(getattr(endpoints, field)) == resolved[env_name(field)], field


def test_endpoints_env_and_the_endpoints_class_name_the_same_variables() -> None:
    """Every field but the local mode's switch, which endpoints.env must not hold: its defaults are
    every process's, and the local mode is the one a process is put in."""
    assert {name for name, _ in endpoint_defaults()} == {env_name(f) for f in Endpoints.model_fields} - {LOCAL_MODE}


def test_a_port_moves_the_defaults_that_refer_to_it_and_an_explicit_value_wins() -> None:
    moved = Endpoints.from_env({"WEIR_KAFKA_PORT": "29092", "WEIR_JOBMANAGER_PORT": "26123"})
    assert moved.kafka_port == 29092
    assert moved.kafka_bootstrap == "127.0.0.1:29092"
    assert moved.jobmanager_address == "127.0.0.1:26123"
    explicit = Endpoints.from_env({"WEIR_KAFKA_PORT": "29092", "WEIR_KAFKA_BOOTSTRAP": "kafka:9092,kafka2:9092"})
    assert explicit.kafka_bootstrap == "kafka:9092,kafka2:9092"


def test_an_empty_value_is_unset() -> None:
    assert Endpoints.from_env({"WEIR_S3_BUCKET": ""}).s3_bucket == "weir-checkpoints"
    assert TaskManagerSettings.from_env({"WEIR_TASKMANAGER_SLOTS": ""}).taskmanager_slots == 2


def test_values_are_typed() -> None:
    tm = TaskManagerSettings.from_env(
        {
            "WEIR_TASKMANAGER_PORT": "7001",
            "WEIR_TASKMANAGER_SLOTS": "4",
            "WEIR_TASKMANAGER_LOCAL_CHANNELS": "0",
            "WEIR_TASKMANAGER_ID": "taskmanager-7",
        }
    )
    assert (tm.taskmanager_port, tm.taskmanager_slots, tm.taskmanager_local_channels) == (7001, 4, False)
    assert tm.taskmanager_id == "taskmanager-7"
    assert TaskManagerSettings.from_env({}).taskmanager_local_channels is True
    assert TaskManagerSettings.from_env({}).taskmanager_id is None
    diagnostics = Diagnostics.from_env({"WEIR_LOG_FORMAT": "JSON", "WEIR_LOG_LEVEL": "warning", "WEIR_DEBUG": "1"})
    assert diagnostics == Diagnostics(log_format=LogFormat.JSON, log_level=LogLevel.WARNING, debug=True)
    assert Diagnostics.from_env({}).log_format is None
    assert JobManagerSettings.from_env({"WEIR_JOBMANAGER_BIND": "0.0.0.0"}).jobmanager_bind == "0.0.0.0"
    crash = CrashPointSettings.from_env({"WEIR_CRASH_ONCE_DIR": "/tmp/fired"})
    assert crash.crash_once_dir == Path("/tmp/fired")


def test_directories_default_from_one_another() -> None:
    env = {"WEIR_CACHE_DIR": "/c"}
    assert run_dir(env) == Path("/c/run")
    assert checkpoint_dir(env) == "file:///c/run/checkpoints"
    assert checkpoint_dir({"WEIR_RUN_DIR": "/r"}) == "file:///r/checkpoints"
    assert checkpoint_dir({"WEIR_CHECKPOINT_DIR": "s3://b/p"}) == "s3://b/p"
    assert Directories.from_env({}).checkpoint_dir is None


def test_the_settings_are_frozen() -> None:
    endpoints = Endpoints.from_env({})
    with pytest.raises(ValueError):
        endpoints.s3_bucket = "other"  # type: ignore[misc]
    assert endpoints.model_copy(update={"s3_bucket": "other"}).s3_bucket == "other"


def test_the_secret_key_stays_out_of_the_repr() -> None:
    endpoints = Endpoints.from_env({"WEIR_LOCAL_MODE": "true"})
    assert endpoints.s3_secret_key is not None and endpoints.s3_secret_key.get_secret_value() == "weiradmin-secret"
    assert "weiradmin-secret" not in repr(endpoints) and "weiradmin-secret" not in str(endpoints)


BAD_VALUES = [
    (Endpoints, "WEIR_JOBMANAGER_PORT", "abc", "valid integer"),
    (Endpoints, "WEIR_KAFKA_PORT", "0", "greater than or equal to 1"),
    (Endpoints, "WEIR_KAFKA_CONTROLLER_PORT", "65536", "less than or equal to 65535"),
    (Endpoints, "WEIR_POSTGRES_PORT", "5432.5", "valid integer"),
    (Endpoints, "WEIR_S3_PORT", "-1", "greater than or equal to 1"),
    (Endpoints, "WEIR_PROMETHEUS_PORT", "x", "valid integer"),
    (Endpoints, "WEIR_JOBMANAGER_METRICS_PORT", "70000", "less than or equal to 65535"),
    (Endpoints, "WEIR_JOBMANAGER_REST_PORT", "rest", "valid integer"),
    (Endpoints, "WEIR_TASKMANAGER_METRICS_BASE_PORT", "-5", "greater than or equal to 0"),
    (Endpoints, "WEIR_KAFKA_BOOTSTRAP", "kafka", "expected host:port"),
    (Endpoints, "WEIR_KAFKA_BOOTSTRAP", "a:1,b", "expected host:port"),
    (Endpoints, "WEIR_POSTGRES_DSN", "host=db user=weir", "postgresql://"),
    (Endpoints, "WEIR_S3_ENDPOINT", "127.0.0.1:19000", "http:// or https://"),
    (Endpoints, "WEIR_PROMETHEUS_URL", "prometheus:9090", "http:// or https://"),
    (Endpoints, "WEIR_JOBMANAGER_ADDRESS", "jobmanager", "expected host:port"),
    (Endpoints, "WEIR_JOBMANAGER_ADDRESS", "jobmanager:99999", "expected host:port"),
    (Directories, "WEIR_CHECKPOINT_DIR", "/var/lib/weir/checkpoints", "s3://bucket/prefix or file:///directory"),
    (TaskManagerSettings, "WEIR_TASKMANAGER_PORT", "any", "valid integer"),
    (TaskManagerSettings, "WEIR_TASKMANAGER_SLOTS", "0", "greater than or equal to 1"),
    (TaskManagerSettings, "WEIR_TASKMANAGER_LOCAL_CHANNELS", "maybe", "valid boolean"),
    (TaskManagerSettings, "WEIR_TASKMANAGER_METRICS_PORT", "65536", "less than or equal to 65535"),
    (Diagnostics, "WEIR_LOG_FORMAT", "xml", "'json' or 'console'"),
    (Diagnostics, "WEIR_LOG_LEVEL", "loud", "'DEBUG', 'INFO', 'WARNING', 'ERROR' or 'CRITICAL'"),
    (Diagnostics, "WEIR_DEBUG", "sometimes", "valid boolean"),
]


@pytest.mark.parametrize(
    ("settings", "name", "value", "why"), BAD_VALUES, ids=[f"{n}={v}" for _, n, v, _ in BAD_VALUES]
)
def test_a_bad_value_is_one_line_naming_the_variable(settings: type, name: str, value: str, why: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        settings.from_env({name: value})
    message = str(raised.value)
    assert message.startswith(f"bad configuration: {name}={value!r}: "), message
    assert why in message
    assert "\n" not in message
    assert isinstance(raised.value, WeirError) and raised.value.fault is Fault.USER


def test_every_bad_value_is_named_and_a_default_expanded_from_one_is_not() -> None:
    with pytest.raises(ConfigurationError) as raised:
        Endpoints.from_env({"WEIR_JOBMANAGER_PORT": "abc", "WEIR_S3_PORT": "0"})
    message = str(raised.value)
    assert "WEIR_JOBMANAGER_PORT='abc'" in message and "WEIR_S3_PORT='0'" in message
    assert "WEIR_JOBMANAGER_ADDRESS" not in message, "127.0.0.1:abc is a consequence, not a second mistake"


def test_check_environment_names_the_bad_variables_of_every_class() -> None:
    check_environment({})
    with pytest.raises(ConfigurationError) as raised:
        check_environment({"WEIR_KAFKA_PORT": "k", "WEIR_TASKMANAGER_SLOTS": "none", "WEIR_LOG_LEVEL": "loud"})
    message = str(raised.value)
    assert message.count("bad configuration: ") == 1
    for name in ("WEIR_KAFKA_PORT", "WEIR_TASKMANAGER_SLOTS", "WEIR_LOG_LEVEL"):
        assert name in message


def test_every_weir_variable_the_code_names_is_a_settings_field() -> None:
    named: dict[str, str] = {}
    for package in ("weir", "jobmanager", "taskmanager", "connectors", "operators"):
        for path in (REPO / package).rglob("*.py"):
            if "_pb2" in path.name:
                continue
            for name in re.findall(r"\bWEIR_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8")):
                named.setdefault(name, str(path.relative_to(REPO)))
    unknown = {name: where for name, where in named.items() if name not in ALL_NAMES | set(SCRIPT_VARIABLES)}
    assert not unknown, f"WEIR_* names with no settings field: {unknown}"
    scripts = "".join(p.read_text(encoding="utf-8") for p in (REPO / "deploy/local").glob("*.sh"))
    for name in SCRIPT_VARIABLES:
        assert f"${{{name}" in scripts, f"{name} is named as a deploy/local variable but no script reads it"


def _entry_point(module: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("WEIR_")}
    environ.update(env, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", module, "--help"], env=environ, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize(
    ("module", "name", "value"),
    [
        ("weir.jobmanager", "WEIR_JOBMANAGER_PORT", "abc"),
        ("weir.jobmanager", "WEIR_CHECKPOINT_DIR", "/no/scheme"),
        ("weir.taskmanager", "WEIR_TASKMANAGER_SLOTS", "two"),
        ("weir.taskmanager", "WEIR_LOG_LEVEL", "loud"),
    ],
)
def test_a_process_refuses_a_bad_value_with_one_line_and_exit_2(module: str, name: str, value: str) -> None:
    result = _entry_point(module, **{name: value})
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    role = module.rpartition(".")[2]  # the process's name: jobmanager, taskmanager
    assert line.startswith(f"{role}: error: bad configuration: {name}={value!r}: ")


def test_a_process_with_good_values_starts_its_option_parsing() -> None:
    result = _entry_point("weir.taskmanager", WEIR_TASKMANAGER_SLOTS="3")
    assert result.returncode == 0, result.stderr
    assert "--slots" in result.stdout
