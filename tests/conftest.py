"""Shared test fixtures: where ../shared lives, and a skip when it is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
  """The ../shared folder beside the repository; skips the test when it is absent."""
  if not SHARED.is_dir():
    pytest.skip(f"../shared is absent (looked for {SHARED}); it holds the ONNX models and "
                "TASO's rule file these tests read")
  return SHARED
