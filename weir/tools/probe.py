"""``python -m weir.tools.probe URL``: a container healthcheck, the same check as the Kubernetes probes.

* ``http://HOST:PORT/PATH``: healthy when the answer is 2xx (the JobManager's ``/healthz``, which is
  503 while it takes over its jobs; a TaskManager's ``/metrics``), as an ``httpGet`` probe;
* ``https://HOST:PORT/PATH``: the same over TLS (the REST API with ``WEIR_TLS_CERT_FILE`` set), the
  server's certificate checked against ``WEIR_TLS_CA_FILE`` (else the system's CAs) for the URL's
  host, and ``WEIR_TLS_CERT_FILE``/``WEIR_TLS_KEY_FILE`` shown when the server asks for a client
  certificate: the process's own settings, so a container's healthcheck needs no flag;
* ``tcp://HOST:PORT``: healthy when the port accepts a connection, as a ``tcpSocket`` probe.

Exit 0 healthy, 1 not, with one line saying why (Docker keeps it in ``docker inspect``). The standard
library only for ``http`` and ``tcp`` (it starts fast); ``https`` reads the TLS settings too.
"""

from __future__ import annotations

import socket
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

TIMEOUT_S = 4.0


def probe(url: str, timeout_s: float = TIMEOUT_S, environ: Mapping[str, str] | None = None) -> str | None:
    """None when healthy, else why not; ``environ``: the TLS settings of an ``https`` probe (None: the
    process's environment)."""
    parts = urlsplit(url)
    match parts.scheme:
        case "http" | "https":
            context: ssl.SSLContext | None = None
            if parts.scheme == "https":
                context_or_reason = tls_context(environ)
                if isinstance(context_or_reason, str):
                    return f"{url}: {context_or_reason}"
                context = context_or_reason
            try:
                with urllib.request.urlopen(url, timeout=timeout_s, context=context) as response:  # noqa: S310
                    status = int(response.status)
            except urllib.error.HTTPError as exc:
                return f"{url} answered {exc.code}"
            except (OSError, ValueError) as exc:  # ssl.SSLError among them
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


def tls_context(environ: Mapping[str, str] | None = None) -> ssl.SSLContext | str:
    """The client side of TLS from ``WEIR_TLS_*``: trust ``WEIR_TLS_CA_FILE`` (else the system's CAs),
    show ``WEIR_TLS_CERT_FILE`` and its key when set; or why it cannot be built."""
    # Imported here: an http or tcp probe stays standard library only.
    from weir.core.config import SecuritySettings
    from weir.core.errors import ConfigurationError

    try:
        settings = SecuritySettings.from_env(environ)
        cafile = None if settings.tls_ca_file is None else str(settings.tls_ca_file)
        context = ssl.create_default_context(cafile=cafile)
        if settings.tls_cert_file is not None and settings.tls_key_file is not None:
            context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
    except (ConfigurationError, OSError, ValueError) as exc:
        return str(exc)
    return context


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.stderr.write("usage: python -m weir.tools.probe http[s]://HOST:PORT/PATH | tcp://HOST:PORT\n")
        return 2
    reason = probe(args[0])
    if reason is not None:
        sys.stderr.write(f"unhealthy: {reason}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
