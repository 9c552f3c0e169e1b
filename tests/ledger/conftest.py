"""Fixtures of the ledger tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ledger_testkit import Harness


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness()
    try:
        yield h
    finally:
        h.close()
