"""absl flags that several binaries share, defined in one place.

`define_timing_flags` defines the timing flags of a binary that measures graphs side by side
(`measure.compare`: interleaved rounds, runs per round, the least time of a round, sets of
rounds); the flags are attributed to the calling binary's module, so its `--helpshort` lists
them. absl flags are global per process: call it once per binary, at import.

    _TIMING = cli_flags.define_timing_flags(looks_default=2)
    ...
    measure.compare(reference, candidates, params, **_TIMING.options())
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from absl import flags

# Flags defined below belong to the module that calls `define_timing_flags`.
flags.disclaim_key_flags()


@dataclasses.dataclass(frozen=True)
class TimingFlags:
  """A binary's timing flags (`define_timing_flags`).

  Attributes:
    rounds: interleaved timing rounds (`--rounds` or `--latency_rounds`).
    repeats: timed runs per graph per round, at least (`--repeats_per_round` or `--repeats`).
    min_round_ms: the least time of one graph's round (`--min_round_ms`); None where the binary
      has no such flag.
    looks: sets of rounds timed at most (`--looks` or `--latency_looks`); None where the binary
      has no such flag.
  """
  rounds: flags.FlagHolder
  repeats: flags.FlagHolder
  min_round_ms: flags.FlagHolder | None = None
  looks: flags.FlagHolder | None = None

  def options(self, read: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """The settings as `measure.compare`'s keyword options: rounds, repeats_per_round, and
    min_round_ms and looks where the binary defines them (`measure.check_settings` and
    `harness.benchmark.measure_outcomes` take the same names).

    Args:
      read: a flag's value from its name (e.g. a binary's reader that applies its presets);
        default: the parsed value.
    """
    holders = {"rounds": self.rounds, "repeats_per_round": self.repeats,
               "min_round_ms": self.min_round_ms, "looks": self.looks}
    return {key: read(h.name) if read is not None else h.value
            for key, h in holders.items() if h is not None}


def define_timing_flags(*, looks_default: int | None = None, rounds_name: str = "rounds",
                        looks_name: str = "looks", repeats_name: str = "repeats_per_round",
                        rounds_default: int = 10, repeats_default: int = 3,
                        min_round_ms_default: float | None = 30.0, looks_note: str = "",
                        flag_values: flags.FlagValues = flags.FLAGS) -> TimingFlags:
  """Defines the calling binary's timing flags and returns their holders.

  Args:
    looks_default: the default of `--<looks_name>`; None: no looks flag.
    rounds_name, looks_name, repeats_name: the flags' names (the optimise job's are
      latency_rounds and latency_looks).
    rounds_default, repeats_default: their defaults.
    min_round_ms_default: the default of `--min_round_ms`; None: no such flag (the binary's
      rounds then last what its measuring function's default says).
    looks_note: a remark in the looks flag's help, in parentheses (e.g. how it relates to the
      optimise job's --latency_looks).
    flag_values: where to define them (default absl's global FLAGS).
  """
  rounds = flags.DEFINE_integer(rounds_name, rounds_default, "Interleaved timing rounds.",
                                flag_values=flag_values)
  least = ("see --min_round_ms" if min_round_ms_default is not None else
           "more for a fast graph")
  repeats = flags.DEFINE_integer(repeats_name, repeats_default,
                                 f"Timed runs per graph per round (at least; {least}).",
                                 flag_values=flag_values)
  min_round = None
  if min_round_ms_default is not None:
    min_round = flags.DEFINE_float(
        "min_round_ms", min_round_ms_default, "More runs per round for a fast graph, so that "
        f"one graph's round lasts about this long (0: exactly --{repeats_name}).",
        flag_values=flag_values)
  looks = None
  if looks_default is not None:
    note = f" ({looks_note})" if looks_note else ""
    looks = flags.DEFINE_integer(
        looks_name, looks_default, f"Sets of --{rounds_name} rounds timed at most{note}: "
        "another only while a verdict is 'no change' (each verdict at a level shared over the "
        "sets).", flag_values=flag_values)
  return TimingFlags(rounds, repeats, min_round, looks)
