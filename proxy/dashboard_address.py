"""Whether an address the dashboard listens on is reachable from other machines, and the warning then.

Here, below both, because `proxy run` (which starts the dashboard as its own process) and `proxy status`
repeat the warning, and the proxy imports nothing of dashboard/; dashboard/server.py imports it too.
"""

from __future__ import annotations

import ipaddress


def exposure_warning(host: str) -> str | None:
    """The warning for a dashboard bound to an address other machines can reach (None for loopback)."""
    if is_loopback(host):
        return None
    return f"the dashboard listens on {host}, reachable from other machines, with no authentication (read-only)"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
