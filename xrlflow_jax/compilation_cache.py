"""JAX's persistent compilation cache, on by default for every entry point: compile once per
machine, not once per run.

    from xrlflow_jax import compilation_cache
    compilation_cache.enable()            # the per-user default directory
    compilation_cache.enable("/fast/ssd") # another directory
    compilation_cache.enable("off")       # leave it off

The directory is, in order: the argument, `$XRLFLOW_COMPILATION_CACHE`, then
`$XDG_CACHE_HOME/xrlflow_jax/xla` (default `~/.cache/xrlflow_jax/xla`). "off" (or "none", "0",
"false"), as the argument or the variable, keeps the cache off. A directory the process already
configured (`jax.config.update("jax_compilation_cache_dir", ...)`, as the tests do) is kept.

The cache is bounded: when a process enables it, executables beyond
`$XRLFLOW_COMPILATION_CACHE_MAX_MB` (default DEFAULT_MAX_MB; -1: unbounded) are deleted, the
least recently used first (`prune`). (JAX's own bound, `jax_compilation_cache_max_size`,
evicts while it writes; with the search's compiles in two threads it failed to write entries,
2026-12-05, so it is left off.)
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

from xrlflow_jax.errors import UsageError

ENV = "XRLFLOW_COMPILATION_CACHE"
MAX_MB_ENV = "XRLFLOW_COMPILATION_CACHE_MAX_MB"
# The per-user cache's bound. A cold default job writes ~3 MB; after many development
# sessions without a bound the directory held 132 MB (2026-12-05).
DEFAULT_MAX_MB = 2048.0
OFF = ("off", "none", "0", "false", "no")
# Executables that compile faster than this are not written. Every one is: the default job
# compiles ~60 small ones (eager ops, the model's numerics check and timing helpers) of ~35 ms
# each, and with them cached its warm run fell from 9.6-10.7 to 8.3-8.8 s of wall time
# (alternating runs, 2-core x86_64, XLA:CPU, 2026-12-04; a cold run wrote 67 entries, 2.7 MB,
# instead of 7, 2.3 MB). JAX's own default (1 s) skipped them all.
MIN_COMPILE_SECONDS = 0.0
_OFF = False  # "off" was asked for in this process


def default_dir() -> Path:
  """The per-user cache directory (`$XDG_CACHE_HOME/xrlflow_jax/xla` or `~/.cache/...`)."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return Path(base) / "xrlflow_jax" / "xla"


class CompilationCacheError(UsageError):
  """A bad setting of the compilation cache (names the variable)."""


def max_size_bytes() -> int:
  """The cache's bound in bytes from `$XRLFLOW_COMPILATION_CACHE_MAX_MB` (MB, fractions
  allowed; -1: unbounded), else DEFAULT_MAX_MB."""
  text = os.environ.get(MAX_MB_ENV, "").strip()
  if not text:
    return int(DEFAULT_MAX_MB * 2**20)
  try:
    mb = float(text)
  except ValueError:
    mb = float("nan")
  if mb == -1:
    return -1
  if not mb > 0 or mb == float("inf"):
    raise CompilationCacheError(f"${MAX_MB_ENV} must be a size in MB > 0 (or -1: unbounded), "
                                f"got {text!r}")
  return max(1, int(mb * 2**20))


def enable(directory: str | os.PathLike[str] | None = None) -> Path | None:
  """Turns the persistent compilation cache on; returns its directory, or None when off.

  Args:
    directory: where to keep compiled executables; None or "": `$XRLFLOW_COMPILATION_CACHE`,
      else `default_dir()`; "off": do not enable.
  """
  global _OFF
  current = jax.config.jax_compilation_cache_dir
  if current:  # configured by the caller (or an earlier call): theirs wins
    return Path(current)
  choice = str(directory) if directory not in (None, "") else os.environ.get(ENV, "")
  if choice.strip().lower() in OFF:
    _OFF = True  # later calls with no directory keep it off
    return None
  if _OFF and not directory:
    return None
  path = Path(choice).expanduser() if choice else default_dir()
  try:
    path.mkdir(parents=True, exist_ok=True)
  except OSError:
    return None  # an unwritable cache directory only costs compile time, never the run
  prune(path, max_size_bytes())
  jax.config.update("jax_compilation_cache_dir", str(path))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
  return path


def prune(path: Path, bound: int) -> int:
  """Deletes JAX's executables in `path` (its "*-cache" files), the least recently used first
  (by access or modification time), until they take at most `bound` bytes (-1: none);
  returns how many. A file that cannot be read or deleted is left."""
  if bound < 0:
    return 0
  files = []
  try:
    for entry in os.scandir(path):
      if entry.name.endswith("-cache") and entry.is_file():
        st = entry.stat()
        files.append((max(st.st_atime, st.st_mtime), st.st_size, entry.path))
  except OSError:
    return 0
  total = sum(size for _, size, _ in files)
  removed = 0
  for _, size, file in sorted(files):
    if total <= bound:
      break
    try:
      os.remove(file)
    except OSError:
      continue
    total -= size
    removed += 1
  return removed


def directory() -> Path | None:
  """The directory in use, or None when the cache is off."""
  current = jax.config.jax_compilation_cache_dir
  return Path(current) if current else None
