"""``python -m weir.tools.probe URL``: a container healthcheck, the same check as the Kubernetes probes.

* ``http://HOST:PORT/PATH``: healthy when the answer is 2xx (the JobManager's ``/healthz``, which is
  503 while it takes over its jobs; a TaskManager's ``/metrics``), as an ``httpGet`` probe;
* ``tcp://HOST:PORT``: healthy when the port accepts a connection, as a ``tcpSocket`` probe.

Exit 0 healthy, 1 not, with one line saying why (Docker keeps it in ``docker inspect``). The standard
library only: it starts fast and runs in any image with Python.
"""

from __future__ import annotations

import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from urllib.parse import urlsplit

TIMEOUT_S = 4.0


def probe(url: str, timeout_s: float = TIMEOUT_S) -> str | None:
    """None when healthy, else why not."""
    parts = urlsplit(url)
    match parts.scheme:
        case "http" | "https":
            try:
                with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - scheme checked
                    status = int(response.status)
            except urllib.error.HTTPError as exc:
                return f"{url} answered {exc.code}"
            except (OSError, ValueError) as exc:
                return f"{url}: {exc}"
            return None if 200 <= status < 300 else f"{url} answered {status}"
        case "tcp":
            if parts.hostname is None or parts.port is None:
                return f"{url}: expected tcp://HOST:PORT"
            try:
                socket.create_connection((parts.hostname, parts.port), timeout_s).close()
            except OSError as exc:
                return f"{url}: {exc}"
            return None
        case _:
            return f"{url}: expected an http://, https:// or tcp:// URL"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.stderr.write("usage: python -m weir.tools.probe http://HOST:PORT/PATH | tcp://HOST:PORT\n")
        return 2
    reason = probe(args[0])
    if reason is not None:
        sys.stderr.write(f"unhealthy: {reason}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
