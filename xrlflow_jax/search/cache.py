"""A bounded cache of compiled helpers keyed by the identity of the objects they were built for.

Rule sets, agents and cost coefficients are unhashable or compare by value (arrays inside), and
an `id()` alone may be reused once an object dies; entries here hold their key objects, so an
id cannot be reused while cached, and the least recently used entry is dropped past `maxsize`
(compiled code is released with it).
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Generic, TypeVar

V = TypeVar("V")


class IdentityCache(Generic[V]):
  """{tuple of objects (by identity): value}, at most `maxsize` entries, least recently used
  evicted first."""

  def __init__(self, maxsize: int = 16):
    if maxsize < 1:
      raise ValueError(f"maxsize must be >= 1, got {maxsize}")
    self.maxsize = maxsize
    self._entries: collections.OrderedDict[tuple[int, ...], tuple[tuple[Any, ...], V]] = \
        collections.OrderedDict()

  def get(self, objects: tuple[Any, ...], make: Callable[[], V]) -> V:
    """The value cached for exactly these objects, or `make()` (then cached)."""
    key = tuple(id(o) for o in objects)
    hit = self._entries.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], objects)):
      self._entries.move_to_end(key)
      return hit[1]
    value = make()
    self._entries[key] = (objects, value)
    self._entries.move_to_end(key)
    while len(self._entries) > self.maxsize:
      self._entries.popitem(last=False)
    return value

  def __len__(self) -> int:
    return len(self._entries)
