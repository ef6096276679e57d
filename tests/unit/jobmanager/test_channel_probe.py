"""The JobManager's probe of a TaskManager before deploying to it: a live server, a gone one."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from weir.jobmanager.gateway import channel_connects


# grpc's connectivity poller thread outlives an unsubscribe by up to 0.2 s; closing the test's channel
# right away makes that thread raise "Channel closed!" (the JobManager's channels stay open).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_listening_server_is_reachable() -> None:
    server = grpc.server(ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            assert channel_connects(channel, timeout_s=10)
            assert channel_connects(channel, timeout_s=10)  # an already READY channel
    finally:
        server.stop(None)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_refused_connection_is_unreachable() -> None:
    with socket.socket() as s:  # a port nobody listens on any more
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        assert not channel_connects(channel, timeout_s=10)
