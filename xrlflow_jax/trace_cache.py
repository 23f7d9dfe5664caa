"""Traced functions kept on disk: a warm start skips Python tracing, not only XLA's compile.

JAX's persistent compilation cache (`compilation_cache`) keys an executable by the lowered
module, so every process still traces and lowers each function before it can find the
executable: for the search's matcher and bucket that is 10-15 s of a warm optimise job on a
2-core CPU. `PersistentJit` stores each traced-and-lowered function as a serialized
`jax.export.Exported` beside that cache, keyed by everything that decides what tracing
produces, and a later process loads it (milliseconds) and compiles it through the persistent
compilation cache as before:

    f = PersistentJit(impl, "search.bucket", closure=(ruleset, coeffs), static_argnames=("size",))
    f(graph, ids, match, table, size=64)    # traced and stored once per machine

The key (`fingerprint`) is: this file's format, the Python, jax, jaxlib and numpy versions, the
backend and device kind, a hash of every source file of the package, the function's name, a
deterministic fingerprint of the data its body closes over (`closure`: rule sets, cost
coefficients...), the static arguments, the arguments' tree structure, shapes and dtypes, and
the JAX options that change tracing (x64, default matmul precision, dtype promotion) and the
precision policy, and the module-level constants and functions of the package modules the
function and its closure reach (`module_state`: a setting changed at run time, or a test's
monkeypatch, is a different key). A closure that cannot be fingerprinted deterministically (a
function defined outside this package and the libraries, an object of an unknown type) turns
the disk cache off for that function: it is then an ordinary `jax.jit`. Unreadable or stale entries are traced
again and overwritten. The cache lives in `<compilation cache directory>/xrlflow_traces` and is
off whenever the compilation cache is off.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextvars
import dataclasses
import enum
import functools
import hashlib
import importlib
import os
import pickle
import platform
import sys
import tempfile
import threading
import types
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import numpy as np

from xrlflow_jax import compilation_cache

FORMAT = 1  # bump when the stored layout or the key's meaning changes
SUBDIR = "xrlflow_traces"
MAX_ENTRIES = 256  # stored functions kept (the least recently used go first); ~0.3-2 MB each
# Compiled instances kept alive in this process, every PersistentJit together (the least
# recently used are dropped, and XLA frees their code). The search's matcher and bucket are
# ~1,500 XLA:CPU kernels each; one search of a graph holds 5-10 instances and ~10,000 memory
# mappings (measured on XLA:CPU, 2026-12-03), so a benchmark that searched models of six
# capacities in one process passed Linux's default limit of 65,530 mappings and died in LLVM's
# allocator ("Unable to allocate section memory").
MAX_LIVE_INSTANCES = 24
# Functions and types from these modules are fingerprinted by name (their versions, or this
# package's source hash, are in the key); anything else defined outside them is not trusted.
_TRUSTED_MODULES = ("xrlflow_jax", "jax", "jaxlib", "numpy", "builtins", "operator", "math",
                    "functools", "jraph", "chex")
_PACKAGE = Path(__file__).resolve().parent


class Unfingerprintable(TypeError):
  """A value whose fingerprint would not be the same in another process."""


@functools.lru_cache(maxsize=None)
def source_hash() -> str:
  """sha256 of every .py file of the package (relative path and bytes), computed once."""
  h = hashlib.sha256()
  for path in sorted(_PACKAGE.rglob("*.py")):
    h.update(str(path.relative_to(_PACKAGE)).encode())
    h.update(path.read_bytes())
  return h.hexdigest()


def _trusted(module: str | None) -> bool:
  return bool(module) and module.split(".")[0] in _TRUSTED_MODULES


def fingerprint(value: Any, modules: set[str] | None = None) -> str:
  """A sha256 of `value` that is equal in every process where `value` is built the same way.

  Handles None, bools, numbers, strings, bytes, enums, numpy and jax arrays, tuples, lists,
  dicts (in order), sets (sorted), dataclasses, named tuples, types, partials, and functions
  and objects of trusted modules (a function: its module, name, code, defaults and closure
  cells; an object: what its `__fingerprint__()` returns, else its type and attributes).
  Cycles are named by first-visit order.

  Args:
    value: what to fingerprint.
    modules: if given, the modules of the functions and types met are added to it.
  Raises:
    Unfingerprintable: for anything else (named in the message).
  """
  h = hashlib.sha256()
  memo: dict[int, int] = {}
  keep: list[Any] = []  # keeps visited objects alive so their ids are not reused

  def put(*parts: Any) -> None:
    for p in parts:
      h.update(p if isinstance(p, bytes) else str(p).encode())
      h.update(b"\x00")

  def visit(v: Any) -> None:
    if v is None or isinstance(v, (bool, str, bytes)):
      put(type(v).__name__, repr(v))
      return
    if isinstance(v, enum.Enum):
      put("enum", type(v).__module__, type(v).__qualname__, v.name, repr(v.value))
      return
    if isinstance(v, (int, float, complex, np.generic)):
      put(type(v).__name__, repr(v))
      return
    if isinstance(v, (np.ndarray, jax.Array)):
      a = np.asarray(v)
      put("array", a.dtype.str, a.shape, hashlib.sha256(np.ascontiguousarray(a).tobytes())
          .hexdigest())
      return
    if isinstance(v, type):
      if not _trusted(v.__module__):
        raise Unfingerprintable(f"type {v.__module__}.{v.__qualname__}")
      put("type", v.__module__, v.__qualname__)
      return
    if id(v) in memo:
      put("ref", memo[id(v)])
      return
    memo[id(v)] = len(memo)
    keep.append(v)
    hook = getattr(type(v), "__fingerprint__", None)
    if hook is not None:  # the object names what decides its behaviour
      put("hooked", type(v).__module__, type(v).__qualname__)
      if modules is not None:
        modules.add(type(v).__module__)
      visit(hook(v))
    elif isinstance(v, (tuple, list)):
      put(type(v).__name__, len(v))
      if hasattr(v, "_fields"):  # a named tuple
        put(type(v).__module__, type(v).__qualname__)
      for x in v:
        visit(x)
    elif isinstance(v, dict):
      put("dict", len(v))
      for k, x in v.items():
        visit(k)
        visit(x)
    elif isinstance(v, (set, frozenset)):
      put("set", len(v))
      for x in sorted(fingerprint(x, modules) for x in v):
        put(x)
    elif isinstance(v, functools.partial):
      put("partial")
      visit(v.func)
      visit(v.args)
      visit(v.keywords)
    elif isinstance(v, (types.FunctionType, types.MethodType)):
      if isinstance(v, types.MethodType):
        put("method")
        visit(v.__self__)
        v = v.__func__
      if not _trusted(v.__module__):
        raise Unfingerprintable(f"function {v.__module__}.{v.__qualname__} (defined outside "
                                "this package: its globals are not part of the key)")
      put("function", v.__module__, v.__qualname__)
      if modules is not None:
        modules.add(v.__module__)
      visit_code(v.__code__)
      visit(v.__defaults__)
      visit(v.__kwdefaults__)
      visit(tuple(c.cell_contents if _filled(c) else "<empty cell>"
                  for c in (v.__closure__ or ())))
    elif isinstance(v, types.BuiltinFunctionType):
      put("builtin", getattr(v, "__module__", None), v.__qualname__)
    elif isinstance(v, types.CodeType):
      visit_code(v)
    elif dataclasses.is_dataclass(v) or _trusted(type(v).__module__):
      t = type(v)
      if not _trusted(t.__module__):
        raise Unfingerprintable(f"object of {t.__module__}.{t.__qualname__}")
      put("object", t.__module__, t.__qualname__)
      if modules is not None:
        modules.add(t.__module__)
      if dataclasses.is_dataclass(v):
        fields = [(f.name, getattr(v, f.name)) for f in dataclasses.fields(v)]
      elif hasattr(v, "__dict__"):
        fields = list(vars(v).items())
      else:
        raise Unfingerprintable(f"object of {t.__module__}.{t.__qualname__} without fields")
      for name, x in fields:
        put(name)
        visit(x)
    else:
      t = type(v)
      raise Unfingerprintable(f"{t.__module__}.{t.__qualname__}")

  def visit_code(code: types.CodeType) -> None:
    put("code", code.co_name, code.co_code, code.co_names, code.co_varnames)
    for c in code.co_consts:
      visit(c)

  visit(value)
  return h.hexdigest()


def module_state(modules: set[str]) -> str:
  """sha256 of the module-level state that tracing can read and a process can change: in every
  package module reachable from `modules` (through module globals), its UPPERCASE constants
  of plain types and the module and name of each function and class it holds. A constant or
  function replaced at run time (a setting, a test's monkeypatch) changes it; the source hash
  covers the rest."""
  h = hashlib.sha256()
  todo = sorted(m for m in modules if m.split(".")[0] == _PACKAGE.name)
  done: set[str] = set()
  while todo:
    name = todo.pop()
    module = sys.modules.get(name)
    if name in done or module is None:
      continue
    done.add(name)
    h.update(f"module {name}\x00".encode())
    for key, v in sorted(vars(module).items()):
      if key.startswith("__"):
        continue
      if isinstance(v, types.ModuleType):
        found, entry = v.__name__, v.__name__
      elif isinstance(v, (types.FunctionType, type)):
        found, entry = v.__module__, f"{v.__module__}.{v.__qualname__}"
      elif key.isupper() and _plain(v):
        found, entry = None, repr(v)
      else:
        continue
      h.update(f"{key}={entry}\x00".encode())
      if found and found.split(".")[0] == _PACKAGE.name and found not in done:
        todo.append(found)
  return h.hexdigest()


def _plain(v: Any) -> bool:
  if v is None or isinstance(v, (bool, int, float, str, bytes)):
    return True
  return isinstance(v, (tuple, frozenset)) and all(_plain(x) for x in v)


def _filled(cell: Any) -> bool:
  try:
    cell.cell_contents  # pylint: disable=pointless-statement
    return True
  except ValueError:
    return False


@functools.lru_cache(maxsize=None)
def _environment() -> tuple[str, ...]:
  """What every key shares: versions, backend and the package's source."""
  import jaxlib  # pylint: disable=g-import-not-at-top
  device = jax.devices()[0]
  return (f"format={FORMAT}", sys.version, platform.machine(), jax.__version__,
          jaxlib.__version__, np.__version__, jax.default_backend(),
          getattr(device, "device_kind", ""), source_hash())


def _options() -> tuple[str, ...]:
  """The JAX options and the precision policy in force (they change what tracing makes)."""
  from xrlflow_jax.ops import precision  # pylint: disable=g-import-not-at-top
  return (str(jax.config.jax_enable_x64), str(jax.config.jax_default_matmul_precision),
          str(jax.config.jax_numpy_dtype_promotion), str(precision.current()))


@functools.cache
def serialization_available() -> bool:
  """Whether `jax.export` can serialize here (it needs the flatbuffers package, a declared
  dependency); when it cannot, one note goes to stderr and traced functions are not stored."""
  try:
    importlib.import_module("jax._src.export.serialization")  # what `serialize` imports
  except ImportError as e:
    print(f"note: traced functions are not kept on disk ({e}); each process traces afresh",
          file=sys.stderr)
    return False
  return True


def directory() -> Path | None:
  """Where traced functions are stored (None: the compilation cache, and so this, is off, or
  this environment cannot serialize an export)."""
  base = compilation_cache.directory()
  if base is None or not serialization_available():
    return None
  return base / SUBDIR


def _leaf_key(leaf: Any) -> tuple[Any, ...]:
  """(shape, dtype, weak type) of a leaf, without building its abstract value for arrays (the
  per-call key of `PersistentJit`: 4 us for a graph's 18 leaves instead of 60)."""
  if isinstance(leaf, (np.ndarray, np.generic)):
    return (leaf.shape, leaf.dtype, False)
  if isinstance(leaf, jax.Array):
    return (leaf.shape, leaf.dtype, leaf.weak_type)
  spec = _spec(leaf)
  return (spec.shape, spec.dtype, spec.weak_type)


def _spec(leaf: Any) -> jax.ShapeDtypeStruct:
  if isinstance(leaf, jax.ShapeDtypeStruct):
    return leaf
  aval = jax.typeof(leaf)
  return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)


class _Entry:
  """One instance of a PersistentJit: a callable over flat leaves (`jitted`, or its compiled
  executable once `prepare` compiled it), the output's tree structure and flat shapes."""

  def __init__(self, jitted: Callable[..., Sequence[Any]], out_tree: Any,
               out_leaves: Sequence[jax.ShapeDtypeStruct]):
    self.jitted = jitted
    self.call = jitted
    self.out_tree = out_tree
    self.out_leaves = tuple(out_leaves)
    self.ready: threading.Event | None = None  # set once a claimed compile ended
    self.called = False

  @property
  def compiled(self) -> bool:
    return self.call is not self.jitted


class PersistentJit:
  """`jax.jit(fn, static_argnames=...)` whose traced function is stored on disk (see module).

  Static arguments are given by keyword (`static_argnames`) or at the positions
  `static_argnums`. Every distinct (static arguments, argument structure, shapes, dtypes) is an
  instance: traced in this process (`traces`) or loaded from the disk (`loads`); `instances`
  is their sum.

  Args:
    fn: the function to jit (it must not depend on anything outside its arguments, `closure`
      and this package's source).
    name: a stable name for the key (e.g. "search.bucket").
    closure: the data `fn` closes over, fingerprinted into the key; an unfingerprintable
      closure keeps this function off the disk.
    static_argnames, static_argnums: static arguments (hashable, part of the key).
    compiler_options: XLA options of the compiled function (part of the key).
    persist: False keeps it off the disk (an ordinary jit), e.g. for sharded programs.
  """

  def __init__(self, fn: Callable[..., Any], name: str, closure: Any = None,
               static_argnames: Sequence[str] = (), static_argnums: Sequence[int] = (),
               compiler_options: dict[str, Any] | None = None, persist: bool = True):
    self.fn = fn
    self.name = name
    self.closure = closure
    self.static_argnames = tuple(static_argnames)
    self.static_argnums = tuple(static_argnums)
    self.compiler_options = dict(compiler_options) if compiler_options else None
    self.persist = persist
    self.traces = 0
    self.loads = 0
    self.first_calls = 0  # calls that were an instance's first (its compile, or its wait)
    self._entries: dict[Any, _Entry] = {}
    self._keys_made: set[Any] = set()  # every key an instance was made for, evicted or alive
    self._lock = threading.Lock()
    self._closure_key: str | None | bool = False  # False: not computed yet; None: untrusted
    self._modules: set[str] = set()

  @property
  def instances(self) -> int:
    return self.traces + self.loads

  @property
  def distinct_instances(self) -> int:
    """Distinct keys an instance was made for: `instances` less the remakes of a key whose
    instance the live-instance bound (`MAX_LIVE_INSTANCES`) dropped."""
    return len(self._keys_made)

  def __call__(self, *args: Any, **static: Any) -> Any:
    entry, leaves = self._entry(args, static)
    if not entry.called:  # compiled here, or waited for `prepare`'s compile, or loaded
      entry.called = True
      self.first_calls += 1
    return jax.tree_util.tree_unflatten(entry.out_tree, entry.call(*leaves))

  def prepare(self, *args: Any, **static: Any) -> None:
    """Makes and compiles the instance for these arguments (arrays or `jax.ShapeDtypeStruct`s)
    without running it: what a background thread does while another one traces (XLA compiles
    without holding Python's lock). A call meanwhile waits for the compile instead of starting
    its own."""
    entry, specs = self._claim(args, static)
    if entry is not None:
      self._compile(entry, specs)

  def compile_in(self, executor: concurrent.futures.Executor, *args: Any, **static: Any
                 ) -> concurrent.futures.Future | None:
    """Makes the instance here (traced, or loaded from the disk) and compiles it in `executor`
    (in this thread's context); calls meanwhile wait for that compile. None when it is
    compiled, or being compiled, already."""
    entry, specs = self._claim(args, static)
    if entry is None:
      return None
    return executor.submit(contextvars.copy_context().run, self._compile, entry, specs)

  def _claim(self, args: tuple[Any, ...], static: dict[str, Any]
             ) -> tuple[_Entry | None, tuple[jax.ShapeDtypeStruct, ...]]:
    """The instance, claimed for one compile (None: compiled or claimed already)."""
    entry, leaves = self._entry(args, static)
    with self._lock:
      if entry.compiled or entry.ready is not None:
        return None, ()
      entry.ready = threading.Event()
    return entry, tuple(_spec(x) for x in leaves)

  @staticmethod
  def _compile(entry: _Entry, specs: tuple[jax.ShapeDtypeStruct, ...]) -> None:
    try:
      entry.call = entry.jitted.lower(*specs).compile()
    finally:  # a failed compile leaves the jitted function, whose call raises the error
      entry.ready.set()

  def output_shapes(self, *args: Any, **static: Any) -> Any:
    """The output's tree of `jax.ShapeDtypeStruct`s for these arguments: makes the instance
    (traced, or loaded from the disk) without compiling it, so a thread can trace the next
    function on these outputs while XLA compiles this one."""
    entry, _ = self._entry(args, static)
    return jax.tree_util.tree_unflatten(entry.out_tree, entry.out_leaves)

  def _split(self, args: tuple[Any, ...], static: dict[str, Any]
             ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(traced arguments, static arguments by name or "#position")."""
    unknown = set(static) - set(self.static_argnames)
    if unknown:
      raise TypeError(f"{self.name}: unknown static argument(s) {sorted(unknown)}")
    if self.static_argnums:
      static = {**static, **{f"#{i}": args[i] for i in self.static_argnums}}
      args = tuple(a for i, a in enumerate(args) if i not in self.static_argnums)
    return args, static

  def _local(self, args: tuple[Any, ...], static: dict[str, Any]
             ) -> tuple[Any, list[Any], Any, dict[str, Any]]:
    """(the instance's key in this process, the argument leaves, their tree, the static
    arguments)."""
    args, static = self._split(args, static)
    leaves, in_tree = jax.tree_util.tree_flatten(args)
    local = (tuple(sorted(static.items())), in_tree, tuple(_leaf_key(x) for x in leaves),
             _options())
    return local, leaves, in_tree, static

  def _entry(self, args: tuple[Any, ...], static: dict[str, Any]
             ) -> tuple[_Entry, list[Any]]:
    local, leaves, in_tree, static = self._local(args, static)
    entry = self._entries.get(local)
    if entry is None:
      specs = tuple(_spec(x) for x in leaves)
      with self._lock:  # one thread makes an instance; a caller meanwhile waits for it
        entry = self._entries.get(local)
        if entry is None:
          entry = self._instance(in_tree, specs, static)
          self._entries[local] = entry
          self._keys_made.add(local)
    if entry.ready is not None and not entry.compiled:
      entry.ready.wait()  # another thread is compiling it (`prepare`, `compile_in`)
    _touch(self, local)
    return entry, leaves

  def _flat(self, in_tree: Any, static: dict[str, Any], box: dict[str, Any]):
    named = {k: v for k, v in static.items() if not k.startswith("#")}
    positional = sorted((int(k[1:]), v) for k, v in static.items() if k.startswith("#"))

    def flat(*leaves):
      args = list(jax.tree_util.tree_unflatten(in_tree, leaves))
      for i, v in positional:
        args.insert(i, v)
      out = self.fn(*args, **named)
      out_leaves, box["out_tree"] = jax.tree_util.tree_flatten(out)
      return out_leaves
    flat.__name__ = flat.__qualname__ = self.name.replace(".", "_")  # names it in JAX's logs
    return flat

  def _closure_fingerprint(self) -> str | None:
    """The closure's fingerprint and the state of the modules it and `fn` reach (None: not
    fingerprintable)."""
    if self._closure_key is False:
      self._modules = {_module_of(self.fn)}
      try:
        self._closure_key = fingerprint(self.closure, self._modules)
      except (Unfingerprintable, RecursionError):  # not deterministic, or too deep: no disk
        self._closure_key = None
    if self._closure_key is None:
      return None
    return self._closure_key + module_state(self._modules)

  def available(self, *args: Any, **static: Any) -> bool:
    """Whether the instance for these arguments is cheap to have: made in this process
    (compiled, or being compiled), or traced by an earlier process on this machine (stored on
    disk, and so, as a rule, compiled into the persistent compilation cache). Traces and
    compiles nothing."""
    local, leaves, in_tree, static = self._local(args, static)
    if local in self._entries:
      return True
    path = self._path(in_tree, tuple(_spec(x) for x in leaves), static)
    return path is not None and path.exists()

  def _path(self, in_tree: Any, specs: tuple[jax.ShapeDtypeStruct, ...],
            static: dict[str, Any]) -> Path | None:
    """Where this instance's trace is stored (None: this function stays off the disk)."""
    folder = directory() if self.persist else None
    closure = self._closure_fingerprint() if folder is not None else None
    if folder is None or closure is None:
      return None
    key = hashlib.sha256("\x00".join(
        (*_environment(), *_options(), self.name, closure, repr(sorted(static.items())),
         repr(sorted((self.compiler_options or {}).items())),
         str(in_tree), repr([(s.shape, s.dtype.str, s.weak_type) for s in specs]))).encode()
    ).hexdigest()
    return folder / f"{self.name}-{key}.bin"

  def _instance(self, in_tree: Any, specs: tuple[jax.ShapeDtypeStruct, ...],
                static: dict[str, Any]) -> _Entry:
    box: dict[str, Any] = {}
    path = self._path(in_tree, specs, static)
    jit = functools.partial(jax.jit, compiler_options=self.compiler_options)
    if path is None:  # an ordinary jit
      self.traces += 1
      jitted = jit(self._flat(in_tree, static, box))
      out = jax.eval_shape(jitted, *specs)  # traces once (the output's tree); jit reuses it
      return _Entry(jitted, box["out_tree"], out)
    loaded = _read(path)
    if loaded is not None:
      self.loads += 1
      exported, out_tree = loaded
    else:
      self.traces += 1
      exported = jax.export.export(jit(self._flat(in_tree, static, box)))(*specs)
      out_tree = box["out_tree"]
      _write(path, exported, out_tree)
    call = functools.partial(exported.call)
    call.__name__ = call.__qualname__ = self.name.replace(".", "_")  # type: ignore[attr-defined]
    jitted = jit(call)
    return _Entry(jitted, out_tree, [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type)
                                     for a in exported.out_avals])


_LIVE: collections.OrderedDict[tuple[int, Any], "PersistentJit"] = collections.OrderedDict()
_LIVE_LOCK = threading.Lock()


def _touch(owner: "PersistentJit", local: Any) -> None:
  """Marks an instance as used now; drops the least recently used past MAX_LIVE_INSTANCES."""
  key = (id(owner), local)
  with _LIVE_LOCK:
    _LIVE[key] = owner
    _LIVE.move_to_end(key)
    while len(_LIVE) > MAX_LIVE_INSTANCES:
      (_, old_local), old_owner = _LIVE.popitem(last=False)
      old_owner._entries.pop(old_local, None)  # pylint: disable=protected-access


def live_instances() -> int:
  """Compiled instances of every PersistentJit alive in this process."""
  return len(_LIVE)


def _module_of(fn: Any) -> str:
  while isinstance(fn, functools.partial):
    fn = fn.func
  fn = getattr(fn, "__func__", fn)
  return getattr(fn, "__module__", "") or ""


def _read(path: Path) -> tuple[Any, Any] | None:
  """(Exported, output tree) from `path`, or None when absent or unreadable; a read entry's
  modification time becomes now (the pruning keeps the recently used)."""
  try:
    data = pickle.loads(path.read_bytes())
    found = jax.export.deserialize(bytearray(data["exported"])), data["out_tree"]
  except Exception:  # pylint: disable=broad-except  (absent, truncated or stale: trace again)
    return None
  try:
    os.utime(path)
  except OSError:
    pass
  return found


def _prune(folder: Path, keep: int = MAX_ENTRIES) -> None:
  """Deletes all but the `keep` most recently used entries (an edited package or new shapes
  leave old ones behind)."""
  try:
    entries = sorted(folder.glob("*.bin"), key=lambda p: p.stat().st_mtime, reverse=True)
    for stale in entries[keep:]:
      stale.unlink()
  except OSError:
    pass


def _write(path: Path, exported: Any, out_tree: Any) -> None:
  """Stores atomically; a cache that cannot be written only costs the next process a trace."""
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = pickle.dumps({"exported": bytes(exported.serialize()), "out_tree": out_tree})
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    os.replace(tmp, path)
  except OSError:
    return
  _prune(path.parent)
