"""Prints one quick-start command of README.md: the single line of the fenced block right after
the marker line `<!-- ci:NAME -->`, so CI runs the commands exactly as a reader copies them.

    python3 .ci/readme_command.py main-job
"""

from __future__ import annotations

import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def command(name: str, text: str) -> str:
  """The command under marker `name` in `text`; ValueError naming what is wrong."""
  lines = text.splitlines()
  marker = f"<!-- ci:{name} -->"
  hits = [i for i, line in enumerate(lines) if line.strip() == marker]
  if len(hits) != 1:
    raise ValueError(f"README.md: expected one {marker} line, found {len(hits)}")
  rest = [line for line in lines[hits[0] + 1:]]
  if not rest or not rest[0].startswith("```"):
    raise ValueError(f"README.md: {marker} is not followed by a fenced code block")
  try:
    end = next(i for i, line in enumerate(rest[1:], 1) if line.startswith("```"))
  except StopIteration:
    raise ValueError(f"README.md: the code block after {marker} is not closed") from None
  body = [line for line in rest[1:end] if line.strip()]
  if len(body) != 1:
    raise ValueError(f"README.md: the code block after {marker} has {len(body)} lines, not 1")
  return body[0].strip()


if __name__ == "__main__":
  if len(sys.argv) != 2:
    raise SystemExit("usage: readme_command.py NAME")
  try:
    print(command(sys.argv[1], README.read_text(encoding="utf-8")))
  except ValueError as e:
    raise SystemExit(f"error: {e}") from None
