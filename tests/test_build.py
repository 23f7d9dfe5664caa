"""The Bazel BUILD file covers every Python file of the project, and names only files that exist."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RULES = ("py_library", "py_binary", "py_test")


def _targets() -> list[dict]:
  """Every py_* rule call in BUILD: kind, name, srcs, main (string literals only)."""
  tree = ast.parse((ROOT / "BUILD").read_text(), filename="BUILD")
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in RULES:
      kw = {k.arg: k.value for k in node.keywords}
      srcs = kw.get("srcs")
      assert isinstance(srcs, ast.List), f"{ast.unparse(node)[:80]}: srcs must be a literal list"
      out.append({
          "kind": node.func.id,
          "name": ast.literal_eval(kw["name"]),
          "srcs": [ast.literal_eval(s) for s in srcs.elts],
          "main": ast.literal_eval(kw["main"]) if "main" in kw else None,
          "data": [ast.literal_eval(s) for s in kw["data"].elts]
                  if isinstance(kw.get("data"), ast.List) else [],
      })
  return out


def _python_files() -> set[str]:
  files = set()
  for top in ("xrlflow_jax", "experiments", "tests"):
    files |= {str(p.relative_to(ROOT)) for p in (ROOT / top).rglob("*.py")}
  return files


def test_every_python_file_belongs_to_a_target():
  named = {s for t in _targets() for s in t["srcs"]}
  missing = sorted(_python_files() - named)
  assert not missing, f"Python files in no BUILD target: {missing}"


def test_every_named_file_exists():
  absent = sorted({f for t in _targets() for f in t["srcs"] + t["data"]
                   + ([t["main"]] if t["main"] else []) if not (ROOT / f).exists()})
  assert not absent, f"BUILD names files that do not exist: {absent}"


def test_target_kinds_match_folders():
  targets = _targets()
  names = [t["name"] for t in targets]
  assert len(names) == len(set(names)), "duplicate target names"
  for t in targets:
    if t["kind"] == "py_test":
      assert all(s.startswith("tests/") for s in t["srcs"]), t
    if t["kind"] == "py_binary":
      assert t["main"] in t["srcs"] and t["main"].startswith("experiments/"), t
  library = [t for t in targets if t["kind"] == "py_library" and t["name"] == "xrlflow_jax"]
  assert library and all(s.startswith("xrlflow_jax/") for s in library[0]["srcs"])
  binaries = {t["main"] for t in targets if t["kind"] == "py_binary"}
  mains = {str(p.relative_to(ROOT)) for p in (ROOT / "experiments").glob("*.py")
           if "absl" in p.read_text() and "app.run(main)" in p.read_text()}
  assert mains <= binaries, f"experiment binaries without a py_binary: {sorted(mains - binaries)}"
