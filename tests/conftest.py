"""Fixtures only; the constants and builders they use live in helpers.py (import them from ``helpers``)."""

from pathlib import Path

import pytest

from helpers import write_fake_cifar10


@pytest.fixture(scope="session")
def fake_data(tmp_path_factory) -> Path:
    """A data_dir holding fake CIFAR-10 (320 training and 64 test images); read it with verify=False."""
    return write_fake_cifar10(tmp_path_factory.mktemp("fake_cifar"))


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """A temporary working directory: the runs/ folder of a command lands here."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
