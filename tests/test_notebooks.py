"""The notebooks of experiments/notebooks run headless (nbclient) in their smoke settings
(`XRLFLOW_NOTEBOOK_SMOKE=1`): no cell errors, and the outputs a reader expects are there.

Skipped when nbformat/nbclient/ipykernel are not installed (`pip install -e ".[test]"`).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "experiments" / "notebooks"
_MISSING = [m for m in ("nbformat", "nbclient", "ipykernel", "matplotlib")
            if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(
    bool(_MISSING), reason=f"notebook tests need {', '.join(_MISSING)} (pip install -e '.[test]')")


def _execute(name: str, timeout: int = 600):
  """Runs a notebook in its directory with the smoke settings; the executed notebook."""
  import nbclient  # pylint: disable=g-import-not-at-top
  import nbformat  # pylint: disable=g-import-not-at-top
  nb = nbformat.read(NOTEBOOKS / name, as_version=4)
  old = os.environ.get("XRLFLOW_NOTEBOOK_SMOKE")
  os.environ["XRLFLOW_NOTEBOOK_SMOKE"] = "1"
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  try:
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()  # raises CellExecutionError on the first failing cell
  finally:
    if old is None:
      os.environ.pop("XRLFLOW_NOTEBOOK_SMOKE", None)
    else:
      os.environ["XRLFLOW_NOTEBOOK_SMOKE"] = old
  return nb


def _outputs(nb) -> tuple[str, int]:
  """(all stream/text output joined, number of PNG images) of an executed notebook."""
  text, images = [], 0
  for cell in nb.cells:
    if cell.cell_type != "code":
      continue
    for out in cell.get("outputs", []):
      assert out.get("output_type") != "error", out
      if out.get("output_type") == "stream":
        text.append(out.get("text", ""))
      data = out.get("data", {})
      text.append(data.get("text/plain", ""))
      images += "image/png" in data
  return "".join(text), images


@pytest.mark.parametrize("name", ["quickstart.ipynb", "train_agent.ipynb"])
def test_notebook_is_colab_ready(name):
  """First code cell installs the package when missing; parameters sit in one early cell."""
  import nbformat  # pylint: disable=g-import-not-at-top
  nb = nbformat.read(NOTEBOOKS / name, as_version=4)
  code = [c.source for c in nb.cells if c.cell_type == "code"]
  assert "except ImportError" in code[0] and "pip install" in code[0]
  assert "XRLFLOW_NOTEBOOK_SMOKE" in code[1]
  assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "saved outputs"


def test_quickstart_runs():
  nb = _execute("quickstart.ipynb")
  text, images = _outputs(nb)
  assert "nodes in" in text  # the imported model
  assert "rewrites returned" in text
  assert "max relative error of the outputs" in text
  assert "measured speedup: x" in text
  assert images >= 1  # the before/after latency plot


@pytest.mark.slow
def test_train_agent_runs():
  """(Slow: compiling a PPO update takes about 1-2 minutes on 2 CPU cores.)"""
  nb = _execute("train_agent.ipynb")
  text, images = _outputs(nb)
  assert "update   2:" in text  # the smoke run's two updates
  assert "measured" in text and "greedy rollout" in text
  assert images >= 1  # the training curve
