"""Can the Hugging Face hub be used now? Checked up front so that a machine without network
fails in seconds with our message, not after the hub client's retries (~25 s)."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse


def hub_offline() -> bool:
    """True when HF_HUB_OFFLINE or HF_DATASETS_OFFLINE asks for offline mode."""
    flags = (os.environ.get(k, "") for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    return any(f.upper() in {"1", "ON", "YES", "TRUE"} for f in flags)


def hub_reachable(timeout: float = 3.0) -> bool:
    """A quick TCP connect to the hub endpoint. Assumed reachable behind a proxy."""
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=timeout).close()
        return True
    except OSError:
        return False


def hub_usable() -> bool:
    return not hub_offline() and hub_reachable()
