"""How one client's update is bounded: each bounding one small class.

A bounding says whether it bounds the whole update by one norm C or each
layer (leaf) h by its own budget C_h (`per_layer`), and by what factor an
update of L2 norm ||u|| is scaled towards its target norm (`factor`). The
rest -- norms computed without overflow, the rounding margins that keep
the stored result within its bound, non-finite updates replaced by zeros,
the budgets C_h -- is the same for every bounding and lives in
`tff_clip.aggregation.bounding.bound`, which asks the object. The boundings are
registered by their public names in `tff_clip.aggregation.mechanisms`: a new one is a
subclass and one line there.

No TensorFlow import at module level: the command line checks its flags
with these classes before TensorFlow loads.

References:
* Zhang et al. 2022: "Understanding Clipping for Federated Learning:
  Convergence and Client-Level Differential Privacy", ICML 2022 (clip).
* Das et al. 2022: "On the Convergence of DP FL on Non-Lipschitz
  Objectives, and with Normalized Client Updates" (normalize).
* Pelikan et al. 2025: "Enabling Differentially Private Federated
  Learning for Speech Recognition", NeurIPS 2025 (per-layer budgets).
"""

from __future__ import annotations

from tff_clip.aggregation import noise_following

__all__ = ['Bounding', 'Clip', 'NoiseFollowing', 'Normalize', 'PerLayerClip',
           'PerLayerNormalize']


class Bounding:
  """The base of every bounding.

  A subclass sets `name` (its public name, the registry's key) and
  `per_layer`, and implements `factor`.
  """

  name: str = ''
  # True: every leaf h is bounded by its budget C_h (sqrt(sum_h C_h^2) = C,
  # the sensitivity); False: the whole update by one norm C.
  per_layer: bool = False

  def factor(self, norm, target):
    """The factor that scales an update (or a layer) of L2 norm `norm` for
    the bound `target`: float64 tensors of one shape (a scalar, or [H] for
    per-layer boundings), `norm` >= 0 and possibly 0. The result is <= target
    / norm wherever norm > 0, so the bound holds."""
    raise NotImplementedError

  def resolve(self, noise_multiplier: float, clients_per_round: float,
              dimension: int) -> 'Bounding':
    """The bounding that runs for noise multiplier z, expected cohort n and
    an update of `dimension` numbers: itself, for every bounding but one
    that is chosen from them (`NoiseFollowing`)."""
    del noise_multiplier, clients_per_round, dimension
    return self

  def __repr__(self):
    return f'{type(self).__name__}()'


def _safe(norm):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.where(norm > 0, norm, tf.ones_like(norm))


class Clip(Bounding):
  """u min(1, C / ||u||): L2 clipping (Zhang et al. 2022)."""

  name = 'clip'

  def factor(self, norm, target):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return tf.minimum(tf.ones_like(norm), target / _safe(norm))


class Normalize(Bounding):
  """C u / ||u||: normalization (Das et al. 2022, DP-NormFedAvg); a zero
  update stays zero."""

  name = 'normalize'

  def factor(self, norm, target):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return tf.where(norm > 0, target / _safe(norm), tf.zeros_like(norm))


class PerLayerClip(Clip):
  """u_h min(1, C_h / ||u_h||) for every leaf h (Pelikan et al. 2025)."""

  name = 'per_layer_clip'
  per_layer = True


class PerLayerNormalize(Normalize):
  """C_h u_h / ||u_h|| for every leaf h; a zero leaf stays zero."""

  name = 'per_layer_normalize'
  per_layer = True


class NoiseFollowing(Bounding):
  """tff_clip's default: clipping or normalization, chosen from the noise.

  `resolve(z, n, d)` is `Normalize()` where the noise on the mean update is
  at least 1.6 C (z sqrt(d) / n >= `noise_following.NORMALIZE_FROM`) and
  `Clip()` below (`noise_following.noise_following_bounding`: public
  numbers only, no privacy cost). The aggregators resolve it when they are
  created for an update type (its size is d), before any value is bounded.
  """

  name = 'noise_following'

  def resolve(self, noise_multiplier, clients_per_round, dimension):
    chosen = noise_following.noise_following_bounding(
        noise_multiplier, clients_per_round, dimension)
    return Normalize() if chosen == Normalize.name else Clip()

  def factor(self, norm, target):
    raise ValueError(
        "bounding 'noise_following' is chosen from the noise when its "
        'aggregator is created (`resolve(noise_multiplier, '
        'clients_per_round, dimension)`); resolve it before bounding.')
