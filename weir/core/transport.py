"""gRPC settings every Weir process uses, client and server: message size and keepalive."""

from __future__ import annotations

from typing import Final

MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024
"""The largest gRPC message Weir sends or accepts (control and data plane)."""
LEADER_TERM_METADATA: Final = "weir-leader-term"
"""The gRPC metadata key of a JobManager's leader term (Flink's fencing token) on its calls to
TaskManagers, which refuse a term lower than the highest they have seen (``weir.taskmanager.leader_fence``)."""
RECONNECT_BACKOFF_MIN_MS: Final = 100
RECONNECT_BACKOFF_MAX_MS: Final = 500

GRPC_OPTIONS: Final = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Server side (the same list configures servers): accept the clients' 10 s keepalive pings, or
    # the server answers GOAWAY "too_many_pings" and idle data-plane streams break.
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
    # Client side: reconnect to a restarted peer within half a second. gRPC's default backoff grows
    # 1.6x per failed attempt up to 120 s, so a TaskManager that tried through a JobManager's restart
    # found it again only 10-17 s after it was up (the chaos run's kill-jobmanager recoveries); with
    # 2 s at most, still 1.6-2.6 s (make bench-recovery). A connect attempt to a local port is cheap.
    ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MIN_MS),
    ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_MIN_MS),
    ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MAX_MS),
]
