"""Fails any test that logs a warning or error it did not declare.

A test that expects one uses the ``expect_log`` fixture: ``expect_log("pack .* missing")``.
(After S3QL's checklogs plugin: silent failures in background threads surface as logs.)
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


@pytest.fixture
def expect_log(request: pytest.FixtureRequest) -> Callable[[str], None]:
    patterns: list[re.Pattern[str]] = []
    request.node.stash[_KEY] = patterns
    return lambda pattern: patterns.append(re.compile(pattern))


_KEY = pytest.StashKey[list[re.Pattern[str]]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    handler = _Collect()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
    allowed = item.stash.get(_KEY, [])
    bad = [
        r.getMessage()
        for r in handler.records
        if not any(p.search(r.getMessage()) for p in allowed)
    ]
    if bad:
        pytest.fail("unexpected log records at WARNING or above:\n" + "\n".join(bad))


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
