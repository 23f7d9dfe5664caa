r"""One report of this device: the figures a GPU run of the package must give, in one command.

    python -m experiments.device_report --output=/tmp/device            # ~8 min on one GPU
    python -m experiments.device_report --quick --output=/tmp/device    # a few minutes on a CPU

Writes device_report.json and device_report.md into --output and prints the markdown. See
`xrlflow_jax.harness.device_report` for the parts. Exits 1 when a part failed (its error is in
the report; the other parts still ran).
"""

from __future__ import annotations

import json
from pathlib import Path

from absl import app, flags

from xrlflow_jax.harness import device_report

_QUICK = flags.DEFINE_bool("quick", False, "Tiny models, small batches and budgets (CPU).")
_OUTPUT = flags.DEFINE_string("output", "/tmp/xrlflow_device_report", "Output folder.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  out = Path(_OUTPUT.value)
  out.mkdir(parents=True, exist_ok=True)
  report = device_report.run(quick=_QUICK.value, log=lambda m: print(m, flush=True))
  (out / "device_report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
  text = device_report.markdown(report)
  (out / "device_report.md").write_text(text)
  print("\n" + text)
  print(f"wrote {out / 'device_report.json'} and {out / 'device_report.md'}")
  if report["failed"]:
    raise SystemExit(1)


if __name__ == "__main__":
  app.run(main)
