"""LUS, Local Update Sparsification (Cheng et al., "Differentially Private
Federated Learning with Local Regularization and Sparsification", CVPR 2022,
Section 4.2, Eqs. (11)-(13), Algorithm 2): each entry of a client's update is
scored T = |grad f_i(w_local) * delta_w| and only the s_h highest-scoring
entries of every layer are kept, before the update is bounded and noised.

Pure TensorFlow over `tf.nest` structures; `tff_clip.learning.client`'s
`build_client_work(lus_sparsity=...)` applies it after local training. As
there, one layer is one leaf of the trainable weights, in `tf.nest.flatten`
order.
"""

from __future__ import annotations

import fractions
import math

import tensorflow as tf

from tff_clip.aggregation import bounding
from tff_clip.aggregation import spec

__all__ = ['lus_keep_counts', 'lus_mask', 'lus_scores', 'lus_sparsify']

Sparsity = spec.Sparsity



def lus_scores(gradient, delta):
  """Utility cost T = |grad f_i(w) * delta_w| of zeroing each update entry.

  Cheng et al. 2022, Eq. (11): zeroing the update entry of a weight w changes the loss
  by about |df_i/dw (w_0 - w)| (first-order Taylor, Eq. (10)), with the
  gradient at the locally trained weights w. `None` gradient leaves (weights
  the loss does not depend on) score 0. The product is taken in float64,
  whatever the leaves' dtype: in float16 (or float32) it can underflow to 0
  or overflow to inf, and tied scores would pick entries by index.

  Args:
    gradient: a structure of float tensors, grad f_i(w_local).
    delta: the same structure, the update w_0 - w_local.

  Returns:
    The structure of `delta`, float64, >= 0.
  """
  flat_gradient, flat_delta = bounding.flatten_alike(
      gradient, delta, 'gradient', 'delta')
  scores = []
  for g, d in zip(flat_gradient, flat_delta):
    d = tf.cast(d, tf.float64)
    if g is None:
      scores.append(tf.zeros_like(d))
    else:
      scores.append(tf.abs(tf.cast(g, tf.float64) * d))
  return tf.nest.pack_sequence_as(delta, scores)


def lus_keep_counts(structure_or_type_spec, sparsity: Sparsity) -> list[int]:
  """s_h, the number of entries LUS keeps in each layer (static Python ints).

  Cheng et al. 2022 sets the sparsity c = 1 - s/d (Section 6, experiment settings).
  For d_h entries and sparsity c_h the layer keeps s_h = d_h - floor(c_h d_h)
  = ceil((1 - c_h) d_h) entries, and at least one: LUS is never sparser than
  asked, and never silences a layer. (c_h d_h is exact, with c_h the decimal
  a float's repr writes: c = 0.29, d = 100 keeps 71, although 0.29 * 100 is
  28.999999999999996 in floats; and c = 0.29999996, d = 10 keeps 8, where
  rounding the float product to a few decimals would have zeroed 3.)

  Args:
    structure_or_type_spec: a structure of tensors / `tf.TensorSpec`s, or a
      TFF type, with fully defined shapes; its leaves are the layers.
    sparsity: c, a float in [0, 1) for every layer, or one per layer.

  Returns:
    A list with s_h for every leaf.

  Raises:
    ValueError: if a sparsity is outside [0, 1), or the per-layer sparsities
      do not match the number of layers.
  """
  sparsity = spec.check_sparsity(sparsity)
  sizes = bounding.leaf_sizes(structure_or_type_spec)
  if isinstance(sparsity, tuple):
    if len(sparsity) != len(sizes):
      raise ValueError(
          f'`lus_sparsity` gives {len(sparsity)} per-layer sparsities but the '
          f'update has {len(sizes)} layers (trainable leaves); give one per '
          'layer or a single float.')
    per_layer = sparsity
  else:
    per_layer = (sparsity,) * len(sizes)
  counts = []
  for size, c in zip(sizes, per_layer):
    size = int(size)
    zeroed = math.floor(fractions.Fraction(repr(float(c))) * size)
    counts.append(max(size - zeroed, 1) if size > 0 else 0)
  return counts


def lus_mask(scores, sparsity: Sparsity):
  """0/1 masks keeping the s_h highest-scoring entries of every layer.

  Cheng et al. 2022, Eq. (12): M_j = 1 where T >= the s_j-th largest score of layer j.
  Here exactly s_h entries are kept (`lus_keep_counts`) even when scores tie
  (`tf.math.top_k` breaks ties towards the lower index), so the sparsity is
  exact; a NaN score counts as 0. Scores are ranked in float64 (float32
  would tie float64 scores that differ below 1e-7 relative).

  Args:
    scores: a structure of float tensors with fully defined shapes, e.g.
      `lus_scores(gradient, delta)`.
    sparsity: c in [0, 1), one for all layers or one per layer.

  Returns:
    The structure of `scores`, same dtypes, with exactly s_h ones per leaf.
  """
  counts = lus_keep_counts(scores, sparsity)
  masks = []
  for score, keep in zip(tf.nest.flatten(scores), counts):
    score = tf.convert_to_tensor(score)
    size = score.shape.num_elements()
    if keep == size:
      masks.append(tf.ones_like(score))
      continue
    flat = tf.reshape(tf.cast(score, tf.float64), [-1])
    flat = tf.where(tf.math.is_nan(flat), tf.zeros_like(flat), flat)
    _, kept = tf.math.top_k(flat, k=keep, sorted=False)
    mask = tf.scatter_nd(kept[:, tf.newaxis], tf.ones([keep], score.dtype),
                         [size])
    masks.append(tf.reshape(mask, tf.shape(score)))
  return tf.nest.pack_sequence_as(scores, masks)


def lus_sparsify(delta, gradient, sparsity: Sparsity):
  """M(delta, s) o delta: LUS, keeping the top s_h entries of every layer.

  Cheng et al. 2022, Eq. (13) with the mask of Eq. (12) on the scores of Eq. (11)
  (Algorithm 2: mask, then clip, then noise). The result goes on to be
  bounded and noised as configured by the aggregator; the noise covers the
  full vector, the zeroed entries included.

  Args:
    delta: the update w_0 - w_local, a structure of float tensors.
    gradient: grad f_i at w_local, the same structure (leaves may be None).
    sparsity: c in [0, 1), one for all layers or one per layer.

  Returns:
    The structure of `delta`.
  """
  masks = lus_mask(lus_scores(gradient, delta), sparsity)
  return tf.nest.map_structure(
      lambda d, m: d * tf.cast(m, tf.convert_to_tensor(d).dtype), delta,
      masks)
