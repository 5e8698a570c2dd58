"""The bounding core: norms, clipping, normalization and per-layer budgets.

Pure TensorFlow over `tf.nest` structures, usable inside any `tf.function` or
`tff.tensorflow.computation`. The TFF aggregation factories in
`tff_clip.aggregation.aggregators` are thin wrappers around these functions.

One "layer" is one leaf tensor of the structure (the unit the per-layer
clipping code of Pelikan et al., NeurIPS 2025, uses), in
`tf.nest.flatten` order (mapping keys sorted; for TFF model weights, the
order of the Keras model's variables). Every [H] vector here uses that order.

Guarantees, for every function here and every split:
  * the exact L2 norm of the bounded structure, as stored in its own dtype,
    is <= the clip norm (per-layer: each leaf <= its budget), for any finite
    input of any float dtype (float16, bfloat16, float32, float64), zero
    tensors, empty tensors and scalars: bounds aim a hair below C to absorb
    every rounding on the way (`rounding_margins`);
  * an update with a NaN or an Inf anywhere is replaced by zeros (and reported
    through `BoundedUpdate.nonfinite`), never propagated;
  * a non-finite or negative clip norm (possible only for a norm computed in
    the graph, e.g. by an adaptive process) bounds to zeros: a broken norm
    never lets an update through unbounded.

Norms are computed in float32 (float64 when any leaf is float64) with a
one-pass sum of squares; only when that sum overflows or underflows is a
rescaled (max-abs normalised) two-pass computation used, so huge but finite
updates are clipped correctly instead of being zeroed, and tiny ones are
normalised instead of being divided by zero.

References:
* Zhang et al. 2022: "Understanding Clipping for Federated Learning:
  Convergence and Client-Level Differential Privacy", ICML 2022.
* Pelikan et al. 2025: "Enabling Differentially Private Federated
  Learning for Speech Recognition", NeurIPS 2025.
* Das et al. 2022: "On the Convergence of DP FL on Non-Lipschitz
  Objectives, and with Normalized Client Updates".
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from typing import Any, NamedTuple, Union

import numpy as np
import tensorflow as tf

from tff_clip import checks
from tff_clip.aggregation.rounding import absolute_slack, round_down_to_float32, rounding_margins  # pylint: disable=unused-import

__all__ = [
    'BoundedUpdate',
    'ExplicitBudgets',
    'SPLITS',
    'bound',
    'bound_batch',
    'budgets_from_fractions',
    'check_split',
    'check_sum_rule',
    'clip',
    'clip_per_layer',
    'flatten_alike',
    'global_l2_norm',
    'layer_budget_fractions',
    'layer_budgets',
    'layer_l2_norms',
    'leaf_sizes',
    'normalize',
    'normalize_per_layer',
    'round_down_to_float32',
    'rounding_margins',
]

from tff_clip.aggregation import mechanisms  # pylint: disable=g-bad-import-order,wrong-import-position
from tff_clip.names import SPLITS  # pylint: disable=g-bad-import-order,wrong-import-position
# The split's rules live in the TensorFlow-free spec; re-exported here.
from tff_clip.aggregation.spec import ExplicitBudgets, Split, check_split  # pylint: disable=g-bad-import-order,wrong-import-position

# The registered boundings' names (`tff_clip.aggregation.mechanisms.BOUNDINGS`).
BOUNDINGS = mechanisms.BOUNDINGS.names

_FLOAT_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


class BoundedUpdate(NamedTuple):
  """The result of `bound`: the bounded value and what happened to it.

  Attributes:
    value: the bounded structure, same structure and dtypes as the input.
    global_norm: float32 scalar, L2 norm of the input (NaN/Inf if the input
      had non-finite entries).
    layer_norms: float32 [H], L2 norm of each input leaf.
    was_bounded: bool scalar, True when the bounding changed the update's
      scale: global norm above the clip norm (global clip), any layer above its
      budget (per-layer clip); for normalization, a norm above the clip norm
      (the update was scaled down), so the fraction reads the same as for
      clipping.
    nonfinite: bool scalar, True when the input had a NaN or Inf and was
      replaced by zeros.
  """
  value: Any
  global_norm: tf.Tensor
  layer_norms: tf.Tensor
  was_bounded: tf.Tensor
  nonfinite: tf.Tensor


# ----------------------------------------------------------------------------
# Structure helpers.


def _check_float_leaves(leaves, label='structure'):
  for leaf in leaves:
    dtype = tf.as_dtype(leaf.dtype)
    if dtype not in _FLOAT_DTYPES:
      raise TypeError(
          f'`{label}` must contain only float tensors (float16, bfloat16, '
          f'float32, float64); found a leaf of dtype {dtype.name}.')


def _leaves(structure):
  leaves = [tf.convert_to_tensor(x) for x in tf.nest.flatten(structure)]
  _check_float_leaves(leaves)
  return leaves


def _compute_dtype(leaves):
  return tf.float64 if any(
      tf.as_dtype(x.dtype) == tf.float64 for x in leaves) else tf.float32


def _leaf_specs(structure_or_type_spec):
  """Returns [(shape, dtype)] for the leaves of a structure, specs or TFF type."""
  obj = structure_or_type_spec
  try:
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    if isinstance(obj, tff.types.FederatedType):
      obj = obj.member
    if isinstance(obj, tff.Type):
      obj = tff.types.type_to_tf_tensor_specs(obj)
  except ImportError:  # pragma: no cover - TFF is a hard dependency.
    pass
  specs = []
  for leaf in tf.nest.flatten(obj):
    if isinstance(leaf, tf.TensorSpec):
      specs.append((leaf.shape, leaf.dtype))
    else:
      leaf = tf.convert_to_tensor(leaf)
      specs.append((leaf.shape, leaf.dtype))
  return specs


def leaf_sizes(structure_or_type_spec) -> np.ndarray:
  """Number of entries d_h of every leaf (layer); shapes must be fully known."""
  sizes = []
  for shape, _ in _leaf_specs(structure_or_type_spec):
    shape = tf.TensorShape(shape)
    if not shape.is_fully_defined():
      raise ValueError(
          'Per-layer budgets need fully defined leaf shapes; found a leaf of '
          f'shape {shape}.')
    sizes.append(int(shape.num_elements()))
  return np.asarray(sizes, dtype=np.int64)


def flatten_alike(first, second, first_label: str, second_label: str):
  """The leaves of two structures that must have as many leaves as each
  other (ValueError naming both arguments otherwise)."""
  flat_first = tf.nest.flatten(first)
  flat_second = tf.nest.flatten(second)
  if len(flat_first) != len(flat_second):
    raise ValueError(
        f'`{first_label}` has {len(flat_first)} leaves but `{second_label}` '
        f'has {len(flat_second)}.')
  return flat_first, flat_second


# ----------------------------------------------------------------------------
# Norms.


def _sum_of_squares(leaves, dtype):
  return tf.stack([tf.reduce_sum(tf.square(tf.cast(x, dtype))) for x in leaves])


def _max_abs(leaf, dtype):
  # reduce_max of an empty tensor is -inf; maximum(., 0) makes it 0.
  return tf.maximum(tf.reduce_max(tf.abs(tf.cast(leaf, dtype))),
                    tf.constant(0, dtype))


def _rescaled_layer_norms(leaves, dtype):
  """Per-leaf norms robust to overflow/underflow: m * ||x / m||, m = max|x|."""
  norms = []
  for leaf in leaves:
    x = tf.cast(leaf, dtype)
    m = _max_abs(x, dtype)
    safe_m = tf.where(tf.math.is_finite(m) & (m > 0), m, tf.ones_like(m))
    norms.append(m * tf.sqrt(tf.reduce_sum(tf.square(x / safe_m))))
  return tf.stack(norms)


def _all_finite(leaves):
  return tf.reduce_all(
      tf.stack([tf.reduce_all(tf.math.is_finite(x)) for x in leaves]))


def _norms(leaves, compute_dtype):
  """Returns (layer_norms [H], global_norm, all_finite, fast) in float64.

  One pass over the data, summing squares in float64 (so the norm a bound
  divides by is exact to ~1e-13, whatever the leaf dtype); `fast` is True
  when every layer's sum of squares is also within `compute_dtype`'s range,
  so that scaling in `compute_dtype` cannot overflow or underflow. Otherwise
  (huge, tiny, zero or non-finite input) a rescaled float64 computation.
  """
  wide = tf.float64
  if not leaves:
    zero = tf.constant(0, wide)
    return tf.zeros([0], wide), zero, tf.constant(True), tf.constant(True)
  info = np.finfo(compute_dtype.as_numpy_dtype)
  sumsq = _sum_of_squares(leaves, wide)
  fast_ok = tf.reduce_all(tf.math.is_finite(sumsq) &
                          (sumsq >= float(info.tiny)) &
                          (sumsq <= float(info.max)))

  def fast():
    return (tf.sqrt(sumsq), tf.sqrt(tf.reduce_sum(sumsq)), tf.constant(True))

  def robust():
    layer = _rescaled_layer_norms(leaves, wide)
    top = tf.reduce_max(layer)
    safe_top = tf.where(tf.math.is_finite(top) & (top > 0), top,
                        tf.ones_like(top))
    total = top * tf.sqrt(tf.reduce_sum(tf.square(layer / safe_top)))
    return layer, total, _all_finite(leaves)

  layer, total, finite = tf.cond(fast_ok, fast, robust)
  return layer, total, finite, fast_ok


def global_l2_norm(structure) -> tf.Tensor:
  """The L2 norm of all entries of `structure` together, as a float32 scalar."""
  leaves = _leaves(structure)
  _, total, _, _ = _norms(leaves, _compute_dtype(leaves))
  return tf.cast(total, tf.float32)


def layer_l2_norms(structure, dtype=tf.float32) -> tf.Tensor:
  """The L2 norm of each leaf of `structure`, as a vector [H] of `dtype`."""
  leaves = _leaves(structure)
  layer, _, _, _ = _norms(leaves, _compute_dtype(leaves))
  return tf.cast(layer, dtype)


# ----------------------------------------------------------------------------
# Per-layer budgets.


def layer_budget_fractions(structure_or_type_spec, split: Split,
                           clip_norm: float | None = None) -> np.ndarray:
  """Static per-layer fractions f_h >= 0 with sum(f**2) == 1 (float64 [H]).

  The budgets are `clip_norm * f`. Splits (Pelikan et al. 2025):
    * 'uniform': f_h = 1/sqrt(H)                    (C_h = C/sqrt(H))
    * 'dim':     f_h = sqrt(d_h / sum_k d_k)        (C_h = C sqrt(d_h/sum d))
    * weights alpha_h > 0 (a plain sequence, one per layer):
                 f_h = sqrt(alpha_h d_h / sum_k alpha_k d_k)
    * `ExplicitBudgets(b)`: f_h = b_h / C; when `clip_norm` is given, the sum
      rule sum(b**2) == C**2 is checked (relative tolerance 1e-5).

  Args:
    structure_or_type_spec: a structure of tensors / `tf.TensorSpec`s, or a
      TFF type, whose leaves are the layers.
    split: see above.
    clip_norm: the total clip norm C, used to check explicit budgets.

  Returns:
    The fractions, a float64 numpy vector with one entry per leaf.
  """
  sizes = leaf_sizes(structure_or_type_spec).astype(np.float64)
  num_layers = sizes.size
  check_split(split, num_layers)
  if num_layers == 0:
    return np.zeros([0], np.float64)
  if isinstance(split, str) and split == 'uniform':
    return np.full([num_layers], 1.0 / math.sqrt(num_layers))
  if isinstance(split, ExplicitBudgets):
    budgets = split.values
    total = math.sqrt(float(np.sum(budgets**2)))
    if clip_norm is not None:
      checks.positive_float(clip_norm, 'clip_norm')
      check_sum_rule(split, clip_norm)
    if total == 0:
      raise ValueError('`split` budgets are all zero.')
    return budgets / total
  weights = (np.ones([num_layers]) if isinstance(split, str)  # 'dim'
             else np.asarray(split, np.float64).reshape(-1))
  mass = weights * sizes
  if mass.sum() == 0:  # Every leaf is empty: nothing to bound.
    return np.zeros([num_layers], np.float64)
  return np.sqrt(mass / mass.sum())


def layer_budgets(structure_or_type_spec, clip_norm, split: Split) -> tf.Tensor:
  """Per-layer clip norms C_h, float32 [H], with sum(C_h**2) == clip_norm**2.

  `clip_norm` may be a Python float or a scalar tensor (e.g. the report of an
  adaptive `EstimationProcess`); see `layer_budget_fractions` for `split`.
  """
  static = not tf.is_tensor(clip_norm)
  if static:
    checks.positive_float(clip_norm, 'clip_norm')
  fractions = layer_budget_fractions(
      structure_or_type_spec, split, clip_norm if static else None)
  return budgets_from_fractions(clip_norm, fractions)


def budgets_from_fractions(clip_norm, fractions: np.ndarray) -> tf.Tensor:
  """C * f_h as float32 [H], computed in float64 and rounded down."""
  norm = (tf.cast(clip_norm, tf.float64) if tf.is_tensor(clip_norm) else
          tf.constant(clip_norm, tf.float64))
  return round_down_to_float32(norm * tf.constant(fractions, tf.float64))


def check_sum_rule(budgets: ExplicitBudgets, clip_norm: float) -> float:
  """Raises unless sqrt(sum(b**2)) == clip_norm (rel. 1e-5); returns the root."""
  total = math.sqrt(float(np.sum(budgets.values**2)))
  if not math.isclose(total, clip_norm, rel_tol=1e-5):
    raise ValueError(
        '`split` budgets break the sum rule: sqrt(sum(b**2)) = '
        f'{total:.6g} but clip_norm = {clip_norm:.6g}.')
  return total


# ----------------------------------------------------------------------------
# Bounding.


def _sanitize_norm(norm, dtype):
  """A broken (NaN, Inf, negative) in-graph norm bounds to zero."""
  # A Python float goes straight to `dtype` (tf.cast would round it through
  # float32 first, and could round it up).
  norm = tf.cast(norm, dtype) if tf.is_tensor(norm) else tf.constant(
      norm, dtype)
  return tf.where(tf.math.is_finite(norm) & (norm >= 0), norm,
                  tf.zeros_like(norm))


def _scale_leaves(leaves, factors, compute_dtype):
  # Multiply in the compute dtype and cast back: a float16 leaf times a large
  # normalisation factor must not overflow in float16 before the product.
  out = []
  for i, leaf in enumerate(leaves):
    dtype = tf.as_dtype(leaf.dtype)
    if dtype == compute_dtype:
      out.append(leaf * factors[i])
    else:
      out.append(tf.cast(tf.cast(leaf, compute_dtype) * factors[i], dtype))
  return out


def _bounder(method, clip_norm, budgets):
  """The bounding `method` names, its norm arguments checked."""
  # 'noise_following' bounds one update as it does without noise (its DP
  # aggregators resolve it from the noise before they bound anything).
  bounder = mechanisms.bounding(method, 'method').resolve(0.0, 1.0, 1)
  if bounder.per_layer and budgets is None:
    raise ValueError(f'`budgets` is required for method {bounder.name!r}.')
  if not bounder.per_layer and clip_norm is None:
    raise ValueError(f'`clip_norm` is required for method {bounder.name!r}.')
  if not bounder.per_layer and not tf.is_tensor(clip_norm):
    checks.positive_float(clip_norm, 'clip_norm')
  return bounder


def _factors(bounder, leaves, dtype, layer, total, clip_norm, budgets,
             clients: int = 0):
  """(factors [..., H] in float64, was_bounded [...]) for updates of layer
  norms `layer` [..., H] and global norms `total` [...]: the leading axes
  are one update's (none) or one per client's (`bound_batch`, `clients`
  1). Each aims at C (1 - m_h) (`rounding_margins`) less the absolute
  slack A (`absolute_slack`), never below 0."""
  wide = tf.float64
  margins = rounding_margins(leaves, dtype)
  slack = absolute_slack(leaves, dtype, clients)
  if bounder.per_layer:
    budgets = tf.reshape(_sanitize_norm(budgets, wide), [-1])
    if budgets.shape[0] is not None and budgets.shape[0] != len(leaves):
      raise ValueError(
          f'`budgets` has {budgets.shape[0]} entries but the structure has '
          f'{len(leaves)} leaves.')
    targets = tf.maximum(budgets * tf.constant(margins, wide) - slack,
                         0.0) if leaves else budgets
    factors = bounder.factor(layer, targets)
    # A layer whose norm overflowed even float64 gets factor 0.
    factors = tf.where(tf.math.is_finite(factors), factors,
                       tf.zeros_like(factors))
    was_bounded = (tf.reduce_any(layer > budgets, axis=-1) if leaves
                   else tf.constant(False))
    return factors, was_bounded
  norm = _sanitize_norm(clip_norm, wide)
  target = (tf.maximum(norm * float(margins.min()) -
                       tf.norm(slack), 0.0) if leaves else norm)
  factor = bounder.factor(total, target)
  factor = tf.where(tf.math.is_finite(factor), factor, tf.zeros_like(factor))
  factors = (tf.stack([factor] * len(leaves), axis=-1) if leaves
             else tf.zeros([0], wide))
  return factors, total > norm


def bound(structure, method, clip_norm=None, budgets=None) -> BoundedUpdate:
  """Bounds `structure` and reports what it did.

  Args:
    structure: a (nested) structure of float tensors: one client's update.
    method: a bounding (`tff_clip.aggregation.boundings`) or its registered name:
      'clip' (u * min(1, C/||u||)), 'normalize' (C u / ||u||, Das et al.
      2022 DP-NormFedAvg), 'per_layer_clip' (u_h * min(1, C_h/||u_h||),
      Pelikan et al. 2025) or 'per_layer_normalize' (C_h u_h / ||u_h||).
    clip_norm: C, a float or scalar tensor (global methods).
    budgets: [H] per-layer norms C_h (per-layer methods), e.g. from
      `layer_budgets`.

  Returns:
    A `BoundedUpdate`.
  """
  bounder = _bounder(method, clip_norm, budgets)
  leaves = _leaves(structure)
  dtype = _compute_dtype(leaves)
  # Norms and factors in float64: a finite float32 update whose norm exceeds
  # float32's range is still clipped to the right direction, not zeroed.
  wide = tf.float64
  layer, total, finite, fast = _norms(leaves, dtype)
  factors, was_bounded = _factors(bounder, leaves, dtype, layer, total,
                                  clip_norm, budgets)

  def scale_in(compute):
    return lambda: _scale_leaves(
        leaves, tf.unstack(tf.cast(factors, compute), num=len(leaves)),
        compute)

  def zeros():
    return [tf.zeros_like(x) for x in leaves]

  # The fast path scales in the leaves' compute dtype (its factors are in
  # range); tiny or huge updates are scaled in float64. A non-finite update is
  # replaced by zeros, never propagated (NaN * 0 is NaN, so the zeros are
  # produced explicitly rather than by a zero factor).
  if leaves:
    scaled = tf.cond(
        fast, scale_in(dtype),
        lambda: tf.cond(finite, scale_in(wide), zeros))
  else:
    scaled = []
  value = tf.nest.pack_sequence_as(structure, scaled)
  return BoundedUpdate(
      value=value,
      global_norm=tf.cast(tf.where(finite, total, tf.constant(np.nan, wide)),
                          tf.float32),
      layer_norms=tf.cast(layer, tf.float32),
      was_bounded=tf.logical_and(finite, was_bounded),
      nonfinite=tf.logical_not(finite),
  )


def bound_batch(structure, method, clip_norm=None,
                budgets=None) -> BoundedUpdate:
  """`bound` of many clients' updates at once, as tensor ops over a client
  axis (no loop, no `vectorized_map`).

  Every leaf of `structure` holds K clients' leaves, stacked on a leading
  axis [K, ...]; `clip_norm` and `budgets` are as for `bound`, shared by
  the K clients. The result's value keeps the client axis; its
  `global_norm`, `was_bounded` and `nonfinite` are [K] and its
  `layer_norms` [K, H]. Client k's entries are `bound`'s for its update:
  the same float64 sums of squares (in another order: ~1e-16 relative, far
  inside the rounding margins), margins and factors, and the same choice of
  scaling in the compute dtype, in float64 (a huge or tiny update) or zeros
  (a non-finite one): each client's bound has `bound`'s guarantee.
  """
  bounder = _bounder(method, clip_norm, budgets)
  leaves = _leaves(structure)
  if not leaves or any(x.shape.rank == 0 for x in leaves):
    raise ValueError('`structure` must have leaves with a leading client '
                     'axis; found none or a scalar.')
  dtype = _compute_dtype(leaves)
  wide = tf.float64
  info = np.finfo(dtype.as_numpy_dtype)
  wide_leaves = [tf.cast(x, wide) for x in leaves]

  def per_client(reduce, x):  # [K, ...] -> [K]
    return reduce(x, axis=list(range(1, x.shape.rank)))

  def by_client(column, x):  # [K] -> broadcastable against leaf x.
    return tf.reshape(column, [-1] + [1] * (x.shape.rank - 1))

  sumsq = tf.stack([per_client(tf.reduce_sum, tf.square(x))
                    for x in wide_leaves], axis=1)  # [K, H]
  fast = tf.reduce_all(tf.math.is_finite(sumsq) & (sumsq >= float(info.tiny))
                       & (sumsq <= float(info.max)), axis=1)  # [K]
  fast_layer = tf.sqrt(sumsq)
  fast_total = tf.sqrt(tf.reduce_sum(sumsq, axis=1))

  def robust():  # `_norms`'s rescaled norms, a client each, where not fast.
    layer = []
    for x in wide_leaves:
      m = tf.maximum(per_client(tf.reduce_max, tf.abs(x)),
                     tf.constant(0, wide))
      safe_m = tf.where(tf.math.is_finite(m) & (m > 0), m, tf.ones_like(m))
      layer.append(m * tf.sqrt(per_client(
          tf.reduce_sum, tf.square(x / by_client(safe_m, x)))))
    layer = tf.stack(layer, axis=1)
    top = tf.reduce_max(layer, axis=1)
    safe_top = tf.where(tf.math.is_finite(top) & (top > 0), top,
                        tf.ones_like(top))
    total = top * tf.sqrt(tf.reduce_sum(
        tf.square(layer / safe_top[:, tf.newaxis]), axis=1))
    finite = tf.reduce_all(tf.stack(
        [per_client(tf.reduce_all, tf.math.is_finite(x)) for x in leaves],
        axis=1), axis=1)
    return (tf.where(fast[:, tf.newaxis], fast_layer, layer),
            tf.where(fast, fast_total, total), fast | finite)

  all_fast = tf.reduce_all(fast)
  layer, total, finite = tf.cond(
      all_fast, lambda: (fast_layer, fast_total, tf.ones_like(fast)), robust)
  factors, was_bounded = _factors(bounder, leaves, dtype, layer, total,
                                  clip_norm, budgets, clients=1)

  def scale_in(compute):
    return [by_client(tf.cast(factors[:, i], compute), x) * (
        x if x.dtype == compute else tf.cast(x, compute))
            for i, x in enumerate(leaves)]

  def mixed():  # A client each: compute dtype, float64 or zeros.
    narrow, wide_scaled = scale_in(dtype), scale_in(wide)
    return [tf.where(by_client(fast, x), tf.cast(n, x.dtype), tf.where(
        by_client(finite, x), tf.cast(w, x.dtype), tf.zeros_like(x)))
            for x, n, w in zip(leaves, narrow, wide_scaled)]

  scaled = tf.cond(
      all_fast, lambda: [tf.cast(s, x.dtype)
                         for x, s in zip(leaves, scale_in(dtype))], mixed)
  return BoundedUpdate(
      value=tf.nest.pack_sequence_as(structure, scaled),
      global_norm=tf.cast(tf.where(finite, total, tf.constant(np.nan, wide)),
                          tf.float32),
      layer_norms=tf.cast(layer, tf.float32),
      was_bounded=tf.logical_and(finite, was_bounded),
      nonfinite=tf.logical_not(finite),
  )


def clip(structure, clip_norm):
  """u * min(1, C / ||u||): global L2 clipping (Zhang et al. 2022 difference clipping)."""
  return bound(structure, 'clip', clip_norm=clip_norm).value


def normalize(structure, clip_norm):
  """C u / ||u||: normalization (Das et al. 2022, DP-NormFedAvg). Zero stays zero."""
  return bound(structure, 'normalize', clip_norm=clip_norm).value


def clip_per_layer(structure, budgets):
  """u_h * min(1, C_h / ||u_h||) for every leaf h."""
  return bound(structure, 'per_layer_clip', budgets=budgets).value


def normalize_per_layer(structure, budgets):
  """C_h u_h / ||u_h|| for every leaf h; a zero leaf stays zero."""
  return bound(structure, 'per_layer_normalize', budgets=budgets).value
