"""Talking to the model/dataset hub only when it can be reached.

Without a network, huggingface_hub retries each request for about a minute before it gives up.
One fast name lookup tells whether the hub is reachable at all; when it is not, the hub client
is switched to offline mode so that loads fall back to the local cache at once.
"""

import functools
import os
import socket
from urllib.parse import urlparse


@functools.lru_cache(maxsize=1)
def hub_reachable() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
        return True
    except OSError:
        return False


def offline_unless_reachable() -> bool:
    """Switch the hub clients to offline mode when the hub cannot be reached; returns reachability."""
    if hub_reachable():
        return True
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    import huggingface_hub.constants

    huggingface_hub.constants.HF_HUB_OFFLINE = True  # read at import time, so set it directly too
    try:
        import datasets.config

        datasets.config.HF_HUB_OFFLINE = True
    except ImportError:
        pass
    return False
