from __future__ import annotations

import pytest

from weir.core.checkpointing import CheckpointingMode
from weir.core.codec import checkpointing_mode_from_proto, checkpointing_mode_to_proto
from weir.jobmanager.checkpointing.config import parse_checkpoint_settings
from weir.jobmanager.errors import ConfigError
from weir.wire import common_pb2


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, CheckpointingMode.EXACTLY_ONCE),
        ({"checkpointing.unaligned": "false"}, CheckpointingMode.EXACTLY_ONCE),
        ({"checkpointing.unaligned": "true"}, CheckpointingMode.UNALIGNED),
        ({"checkpointing.unaligned": " TRUE "}, CheckpointingMode.UNALIGNED),
        ({"checkpointing.unaligned": "true", "checkpointing.mode": "exactly-once"}, CheckpointingMode.UNALIGNED),
        ({"checkpointing.mode": "at_least_once", "checkpointing.unaligned": "false"}, CheckpointingMode.AT_LEAST_ONCE),
    ],
)
def test_checkpointing_unaligned_selects_the_unaligned_mode(
    params: dict[str, str], expected: CheckpointingMode
) -> None:
    assert parse_checkpoint_settings(params).mode is expected


def test_unaligned_is_refused_with_at_least_once() -> None:
    with pytest.raises(ConfigError, match="at_least_once"):
        parse_checkpoint_settings({"checkpointing.unaligned": "true", "checkpointing.mode": "at_least_once"})


def test_unaligned_is_not_a_checkpointing_mode_value_and_the_flag_is_a_boolean() -> None:
    with pytest.raises(ConfigError, match="checkpointing.unaligned=true"):
        parse_checkpoint_settings({"checkpointing.mode": "unaligned"})
    with pytest.raises(ConfigError, match="true or false"):
        parse_checkpoint_settings({"checkpointing.unaligned": "yes please"})


def test_the_unaligned_mode_crosses_the_wire() -> None:
    assert checkpointing_mode_to_proto(CheckpointingMode.UNALIGNED) == common_pb2.CHECKPOINTING_MODE_UNALIGNED
    assert checkpointing_mode_from_proto(common_pb2.CHECKPOINTING_MODE_UNALIGNED) is CheckpointingMode.UNALIGNED


def test_the_aligned_checkpoint_timeout_needs_unaligned_checkpoints_and_a_duration() -> None:
    assert parse_checkpoint_settings({}).aligned_checkpoint_timeout_s == 0.0
    settings = parse_checkpoint_settings(
        {"checkpointing.unaligned": "true", "checkpointing.aligned-checkpoint-timeout": "5s"}
    )
    assert settings.mode is CheckpointingMode.UNALIGNED and settings.aligned_checkpoint_timeout_s == 5.0
    with pytest.raises(ConfigError, match="checkpointing.unaligned=true"):
        parse_checkpoint_settings({"checkpointing.aligned-checkpoint-timeout": "5s"})
    with pytest.raises(ConfigError, match="duration"):
        parse_checkpoint_settings({"checkpointing.unaligned": "true", "checkpointing.aligned-checkpoint-timeout": "x"})
    with pytest.raises(ConfigError, match="aligned-checkpoint-timeout"):
        parse_checkpoint_settings(
            {"checkpointing.unaligned": "true", "checkpointing.aligned-checkpoint-timeout": "-1s"}
        )
