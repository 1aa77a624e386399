"""Environment for client processes (scripts/upload.py, the `kernels` loader) that talk to a LocalHub."""

from __future__ import annotations

import os
from pathlib import Path

# Variables that would send traffic elsewhere, change the cache, or bypass the Hub.
_DROP = (
    "HF_ENDPOINT",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_TOKEN_PATH",
    "HF_HUB_OFFLINE",
    "HF_XET_CACHE",
    "KERNELS_CACHE",
    "KERNELS_ORG",
    "LOCAL_KERNELS",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
)

FAKE_TOKEN = "hf_localhub_fake_token_0123456789"


def client_env(
    endpoint: str, home: Path, *, token: str | None = FAKE_TOKEN, telemetry: bool = False
) -> dict[str, str]:
    """An environment whose Hub traffic all goes to `endpoint`, with caches under `home`.

    Xet is disabled (the local hub speaks the LFS protocol only). `telemetry=False` sets
    HF_HUB_DISABLE_TELEMETRY=1; the `kernels` 0.17.2 loader cannot run with it (see
    tests/test_hub_e2e.py), so loader processes pass `telemetry=True`: every request still goes
    to `endpoint`, only the User-Agent header is longer.
    """
    env = {k: v for k, v in os.environ.items() if k not in _DROP}
    home = Path(home)
    env.update(
        HF_ENDPOINT=endpoint,
        HF_HOME=str(home / "hf_home"),
        HF_HUB_CACHE=str(home / "hf_cache"),
        KERNELS_CACHE=str(home / "kernels_cache"),
        HF_XET_CACHE=str(home / "xet_cache"),
        HF_HUB_DISABLE_XET="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    if not telemetry:
        env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    else:
        env.pop("HF_HUB_DISABLE_TELEMETRY", None)
    if token is not None:
        env["HF_TOKEN"] = token
    return env
