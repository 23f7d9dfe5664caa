"""The `xrlflow` console script: `xrlflow <command> [absl flags]`.

Each command is a module of this package with absl flags and a `main(argv)`; only the chosen
command's module is imported, so commands may define flags of the same name. The experiment
binaries in a checkout (`python -m experiments.optimize`) run the same `main`.

    xrlflow optimize --onnx=model.onnx --method=taso
    xrlflow optimize --helpfull
"""

from __future__ import annotations

import importlib
import sys
from typing import Sequence

# command -> (module, one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "optimize": ("xrlflow_jax.cli.optimize",
                 "optimise a zoo model or an ONNX file; write the result with measured "
                 "evidence"),
}


def usage() -> str:
  lines = ["usage: xrlflow <command> [flags]   (xrlflow <command> --help for its flags)", "",
           "commands:"]
  lines += [f"  {name:<10} {summary}" for name, (_, summary) in COMMANDS.items()]
  return "\n".join(lines)


def run(argv: Sequence[str] | None = None) -> None:
  """Entry point of the console script: dispatches to a command's absl main."""
  argv = list(sys.argv if argv is None else argv)
  if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
    print(usage())
    raise SystemExit(0 if len(argv) >= 2 else 2)
  name = argv[1]
  if name not in COMMANDS:
    print(f"error: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
    raise SystemExit(2)
  from absl import app  # pylint: disable=g-import-not-at-top
  module = importlib.import_module(COMMANDS[name][0])
  main_module = sys.modules.get("__main__")
  if main_module is not None:  # absl's --help prints the main module's docstring
    main_module.__doc__ = module.__doc__
  app.run(module.main, argv=[f"xrlflow {name}"] + argv[2:])
