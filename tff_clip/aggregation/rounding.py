"""What rounding can add to a bounded norm, and the aim that absorbs it.

`tff_clip.aggregation.bounding` scales each update to a norm C in floating
point: the factor, the product and the cast back to the leaf's dtype each
round. A bound is private only if the norm of what is STORED is at most C,
so it aims below C by what rounding can add: a relative margin for
rounding among normal numbers (`rounding_margins`) and an absolute one for
the subnormals, whose spacing does not shrink with the value
(`absolute_slack`). Per-layer budgets are rounded toward zero
(`round_down_to_float32`), so their root sum of squares never exceeds C.

Reference: Higham 2002, "Accuracy and Stability of Numerical Algorithms",
section 2.1 (unit roundoff; the gradual underflow of subnormals, whose
absolute error is at most half their spacing).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

__all__ = ['absolute_slack', 'round_down_to_float32', 'rounding_margins']


def round_down_to_float32(values: tf.Tensor) -> tf.Tensor:
  """float64 -> float32, rounding toward zero, never up.

  Budgets rounded up would let sqrt(sum C_h^2) exceed C by a float32 ulp: the
  sensitivity must not depend on rounding luck.
  """
  nearest = tf.cast(values, tf.float32)
  too_big = tf.abs(tf.cast(nearest, tf.float64)) > tf.abs(values)
  return tf.where(too_big, tf.math.nextafter(nearest, tf.zeros_like(nearest)),
                  nearest)


def _unit_roundoff(dtype) -> float:
  return float(np.finfo(tf.as_dtype(dtype).as_numpy_dtype).eps) / 2.0 if (
      tf.as_dtype(dtype) != tf.bfloat16) else 2.0**-8


def rounding_margins(leaves, compute_dtype) -> np.ndarray:
  """Per-leaf factors 1 - m_h < 1 that make every bound exact after rounding.

  A bound computed in exact arithmetic lands on C, but the norm it divides by
  is a float64 sum of squares (relative error far below 1e-9), the factor and
  the product are rounded in the compute dtype (u_c each), and the result is
  rounded to the leaf's dtype (u_h per entry: 2^-11 for float16, 2^-8 for
  bfloat16). Aiming at C (1 - m_h), m_h = 8 u_c + 2 u_h + 1e-9, keeps the
  exact norm of the stored tensor <= C: the sensitivity the accounting
  assumes. The shrink is 6e-7 relative for float32, 1e-3 for float16 and
  8e-3 for bfloat16.
  """
  u_c = _unit_roundoff(compute_dtype)
  return np.asarray([1.0 - 8.0 * u_c - 2.0 * _unit_roundoff(x.dtype) - 1e-9
                     for x in leaves], np.float64)


def _smallest_subnormal(dtype) -> float:
  """The spacing of `dtype`'s subnormal numbers (its least positive one)."""
  dtype = tf.as_dtype(dtype)
  if dtype == tf.bfloat16:
    return 2.0**-133
  return float(np.finfo(dtype.as_numpy_dtype).smallest_subnormal)


def absolute_slack(leaves, compute_dtype, clients: int = 0) -> tf.Tensor:
  """Per-leaf A_h [H] (float64) that rounding near zero can add to a norm.

  `rounding_margins` bounds the RELATIVE rounding of the scaled entries; a
  product that lands among the subnormals of the compute dtype (spacing
  s_c) or of the leaf's dtype (s_h: 2^-24 for float16) is rounded by up
  to half that spacing instead, whatever its size (a float16 entry scaled
  to 0.51 2^-24 is stored as 2^-24, twice its value). Entry by entry that
  adds at most (s_c + s_h) / 2 (1 + u_h) <= s_c + s_h, so a leaf of d_h
  entries at most A_h = sqrt(d_h) (s_c + s_h) to its norm (the triangle
  inequality). `bounding` aims that much lower. Far below a float32 ulp of
  any usable C for float32 and float64 leaves (about 3e-45 sqrt(d));
  6e-8 sqrt(d) for float16. `clients`: the leading client axis of
  `bound_batch`'s leaves (0: none).
  """
  s_c = _smallest_subnormal(compute_dtype)
  out = []
  for x in leaves:
    entries = tf.cast(tf.size(x, out_type=tf.int64), tf.float64)
    if clients:
      entries /= tf.cast(tf.maximum(tf.shape(x, out_type=tf.int64)[0], 1),
                         tf.float64)
    out.append(tf.sqrt(entries) * (s_c + _smallest_subnormal(x.dtype)))
  return tf.stack(out) if out else tf.zeros([0], tf.float64)
