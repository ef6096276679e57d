"""Who a TaskManager is and where its peers reach it, when its command line does not say.

In a container the answer comes from the host name: a scaled compose service or a StatefulSet gives
each replica its own (the container's id, the pod's name), and the host name resolves to the
replica's own address on the network (``/etc/hosts``, written by Docker and by the kubelet). So one
command line serves every replica: ``python -m weir.taskmanager --bind 0.0.0.0``.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable

# Bind addresses that mean "every interface": not an address a peer can dial.
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]"})


def default_taskmanager_id(hostname: Callable[[], str] = socket.gethostname) -> str:
    """The id of a TaskManager started without ``--id``: its host name (unique per replica)."""
    return hostname()


def advertised_host(
    bind: str,
    host: str | None,
    hostname: Callable[[], str] = socket.gethostname,
    resolve: Callable[[str], str] = socket.gethostbyname,
) -> str:
    """The address the JobManager and the other TaskManagers dial: ``host`` when given; else the bind
    address when it is one (127.0.0.1 in the local mode); else, bound to every interface, the address
    the host name resolves to (the container's or pod's own)."""
    if host:
        return host
    if bind not in _WILDCARDS:
        return bind
    return str(ipaddress.ip_address(resolve(hostname())))
