"""Argument checks shared by the library: errors that name the argument.

Raised at construction time, long before any TFF tracing (the habit of TFF's
own aggregators, `_check_float_positive(value, label)`). No TF import.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ['is_real', 'nonnegative_float', 'positive_float']


def is_real(value) -> bool:
  """A Python or numpy real number (bools are not numbers here)."""
  return not isinstance(value, (bool, np.bool_)) and isinstance(
      value, (int, float, np.integer, np.floating))


def positive_float(value, label: str) -> float:
  """`value` as a float; TypeError if not a number, ValueError unless > 0 and finite."""
  if not is_real(value):
    raise TypeError(f'`{label}` must be a float; got {value!r}.')
  if not math.isfinite(value) or value <= 0:
    raise ValueError(
        f'`{label}` must be a positive finite float; got {value!r}.')
  return float(value)


def nonnegative_float(value, label: str) -> float:
  """`value` as a float; TypeError if not a number, ValueError unless >= 0 and finite."""
  if not is_real(value):
    raise TypeError(f'`{label}` must be a float; got {value!r}.')
  # -0.0 is refused too: a sign bit in a norm or a std is a bug upstream.
  if not math.isfinite(value) or value < 0 or math.copysign(1.0, value) < 0:
    raise ValueError(f'`{label}` must be a finite float >= 0; got {value!r}.')
  return float(value)
