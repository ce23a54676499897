"""What every serving test shares: the fake backend that runs endpoints, in place of this
machine's run backend, and put back as it was after each test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.serving import fakes


@pytest.fixture(autouse=True)
def endpoint_backend(settings: Any) -> Iterator[None]:
    settings.TAU_BACKEND_CLASSES = fakes.backend_classes(settings)
    fakes.reset()
    yield
    fakes.reset()
