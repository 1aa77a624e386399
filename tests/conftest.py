"""Shared pytest fixtures: a local Hugging Face Hub on 127.0.0.1 (tests/localhub)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from localhub import LocalHub  # noqa: E402
from localhub.client import client_env  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: minutes, not seconds (tests/test_new_kernel.py); part of the default run"
    )


@pytest.fixture(scope="session")
def local_hub(tmp_path_factory):
    """One LocalHub per test session (random ports, store in a tmp dir), stopped at the end."""
    hub = LocalHub(tmp_path_factory.mktemp("localhub")).start()
    yield hub
    hub.stop()


@pytest.fixture
def hub_env(local_hub, tmp_path):
    """`hub_env()` -> environment for a subprocess whose Hub traffic goes to `local_hub`.

    Keyword arguments are passed to `localhub.client.client_env` (token=, telemetry=).
    """

    def make(**kwargs) -> dict[str, str]:
        return client_env(local_hub.endpoint, tmp_path / "client", **kwargs)

    return make
