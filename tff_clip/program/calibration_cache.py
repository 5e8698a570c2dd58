"""Calibrated noise multipliers, kept on disk across runs and checked on use.

Calibrating z to a target epsilon searches z with the accountant: about
twenty RDP evaluations (1-2 s on a 2-core CPU) or fifteen PLD ones (0.5-2 s).
Runs that calibrate the same thing (a sweep's cells, the frontier's tuning
grid, a rerun) need it once. An entry is stored under the SHA-256 of what
the calibration is a function of: the accounting call's name and arguments,
the versions of dp_accounting and Python, and the source of every tff_clip
module (`graph_cache.library_hash`).

An entry is a hint, never trusted: before a run uses a cached z the
accountant computes its epsilon, which must meet the target, and the epsilon
of z (1 - `TIGHTNESS`), which must not (else the cached z is looser than the
calibration's own). Two evaluations instead of twenty; an entry that fails
either check, holds a z the accountant refuses (beyond float32), names
another key, or cannot be read or parsed is recalibrated and rewritten. So
an entry edited to lower the noise cannot lower it, and one edited to raise
it costs a recalibration, not utility.

Where: the `calibration/` folder of the graph cache
(`tff_clip.runtime.graph_cache.directory()`; off where that is off); files
are written atomically, readable by their owner only, and read only where
no one else could have written them (`graph_cache.read_private`). No TensorFlow is
imported.
"""

from __future__ import annotations

import hashlib
import json
import math
import pathlib
import platform
from typing import Any, Callable, Mapping, Optional

from absl import logging

from tff_clip.runtime import graph_cache

__all__ = ['TIGHTNESS', 'calibrated', 'entry_key', 'path_of']

# How much smaller than a cached z must already miss the target.
TIGHTNESS = 1e-3
_FORMAT = 'tff_clip calibration 1'


def entry_key(name: str, arguments: Mapping[str, Any]) -> str:
  """The key of the calibration `name(**arguments)` with this library."""
  import dp_accounting  # pylint: disable=g-import-not-at-top
  return hashlib.sha256(json.dumps({
      'calibration': name,
      'arguments': dict(arguments),
      'dp_accounting': getattr(dp_accounting, '__version__', 'unknown'),
      'library': graph_cache.library_hash(),
      'python': platform.python_version(),
  }, sort_keys=True, default=repr).encode()).hexdigest()


def path_of(key: str) -> Optional[pathlib.Path]:
  """Where the entry of `key` lives, or None where the cache is off."""
  root = graph_cache.directory()
  return None if root is None else root / 'calibration' / f'{key}.json'


def _load(key: str) -> Optional[float]:
  path = path_of(key)
  if path is None:
    return None
  try:
    # Only where no one else could have put it (never through a link, never
    # a FIFO, whose open would wait): the graph cache's own rule.
    data = graph_cache.read_private(path)
    if data is None:
      return None
    entry = json.loads(data)
    if entry.get('format') != _FORMAT or entry.get('key') != key:
      raise ValueError('another key')
    value = float(entry['noise_multiplier'])
  except FileNotFoundError:
    return None
  except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
    logging.warning('Calibration cache: %s is unreadable or stale (%s); '
                    'recalibrating.', path, e)
    return None
  return value


def _store(key: str, noise_multiplier: float) -> None:
  path = path_of(key)
  if path is not None:
    graph_cache.write_private(path, json.dumps({
        'format': _FORMAT, 'key': key,
        'noise_multiplier': noise_multiplier}).encode(), 'Calibration cache')


def _meets(noise_multiplier: float, epsilon_at: Callable[[float], float],
           target_epsilon: float, smallest: float) -> bool:
  """Whether `noise_multiplier` is what calibration would return: its
  epsilon meets the target and that of a `TIGHTNESS` smaller z does not
  (or it is the smallest z calibration returns)."""
  if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
    return False
  try:
    if epsilon_at(noise_multiplier) > target_epsilon:
      return False
    return (noise_multiplier <= smallest * (1 + TIGHTNESS) or
            epsilon_at(noise_multiplier * (1 - TIGHTNESS)) > target_epsilon)
  except ValueError:
    # A z the accountant refuses (beyond float32, subnormal): no
    # calibration's. Recalibrating raises whatever is really wrong.
    return False


def calibrated(name: str, arguments: Mapping[str, Any],
               calibrate: Callable[[], float],
               epsilon_at: Callable[[float], float], target_epsilon: float,
               smallest: float) -> float:
  """`calibrate()`, or the entry of (`name`, `arguments`) where the
  accountant (`epsilon_at`: z -> epsilon, the calibration's own) confirms it.

  `smallest`: the least z `calibrate` returns (where any z meets the target).
  """
  key = entry_key(name, arguments)
  cached = _load(key)
  if cached is not None:
    if _meets(cached, epsilon_at, target_epsilon, smallest):
      return cached
    logging.warning('Calibration cache: the entry for %s does not meet its '
                    'target tightly (z = %r); recalibrating.', name, cached)
  noise_multiplier = float(calibrate())
  _store(key, noise_multiplier)
  return noise_multiplier
