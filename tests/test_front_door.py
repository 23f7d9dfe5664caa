"""The README is the front door: its two quick-start commands are the ones CI runs (read by
`.ci/readme_command.py`), the first installs without extras and runs the installed console
script, the page stays short, and every relative link of README.md and docs/ resolves."""

from __future__ import annotations

import importlib.util
import re

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _readme_command():
  spec = importlib.util.spec_from_file_location("readme_command", ROOT / ".ci" / "readme_command.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.command


def test_ci_runs_both_readme_commands():
  ci = (ROOT / ".ci" / "run").read_text()
  assert "readme_command.py main-job" in ci and "readme_command.py tests" in ci
  assert 'bash -c "$main_job"' in ci and 'exec bash -c "$tests"' in ci  # both are run
  command = _readme_command()
  text = README.read_text()
  main_job, tests = command("main-job", text), command("tests", text)
  # The main job: a fresh venv, the package with no extras, the installed console script.
  assert "python -m pip install . " in main_job + " " and "[" not in main_job, main_job
  assert main_job.endswith("xrlflow optimize"), main_job
  scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
  assert scripts == {"xrlflow": "xrlflow_jax.cli:run"}, scripts
  assert '".[test]"' in tests and "python -m pytest" in tests, tests


@pytest.mark.parametrize("text, message", [
    ("no marker\n", "expected one <!-- ci:tests --> line, found 0"),
    ("<!-- ci:tests -->\nplain text\n", "not followed by a fenced code block"),
    ("<!-- ci:tests -->\n```bash\nrun\n", "not closed"),
    ("<!-- ci:tests -->\n```bash\na\nb\n```\n", "has 2 lines, not 1"),
    ("<!-- ci:tests -->\n```bash\na\n```\n<!-- ci:tests -->\n", "found 2"),
])
def test_a_readme_without_a_clear_command_is_refused_by_name(text, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    _readme_command()("tests", text)


def test_readme_is_a_short_front_door():
  lines = README.read_text().splitlines()
  assert len(lines) <= 400, len(lines)
  assert "DESIGN.md" not in README.read_text()  # ../shared is not part of the repository
  for doc in ("design.md", "limits.md", "testing.md", "decisions.md", "results/README.md"):
    assert (ROOT / "docs" / doc).is_file(), doc


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_relative_link_of_the_docs_resolves():
  broken = []
  for page in [README, *sorted((ROOT / "docs").rglob("*.md"))]:
    for target in _LINK.findall(page.read_text()):
      if re.match(r"^[a-z]+:", target) or target.startswith("#"):
        continue
      path = target.split("#", 1)[0]
      if not (page.parent / path).exists():
        broken.append(f"{page.relative_to(ROOT)}: {target}")
  assert not broken, "\n".join(broken)


def test_every_job_the_readme_names_exists():
  text = README.read_text()
  names = set(re.findall(r"python -m experiments\.(\w+)", text))
  assert len(names) >= 10, names
  missing = [n for n in sorted(names) if not (ROOT / "experiments" / f"{n}.py").is_file()]
  assert not missing, missing
