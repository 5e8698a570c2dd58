"""Correlated DP noise across rounds: banded matrix factorization and tree
aggregation (DP-FTRL), for participation with a minimum separation.

Both mechanisms privatise the prefix sums A x of the per-round sums x (A the
lower-triangular all-ones matrix) through a factorization A = B C: the server
releases B (C x + z) = A (x + C^{-1} z), i.e. it adds the t-th entry of
C^{-1} z to round t's sum, with z i.i.d. Gaussian (Choquette-Choo, McMahan,
Rush and Thakurta, 2023, "Multi-Epoch Matrix Factorization Mechanisms for
Private Machine Learning", eq. (1) and Sec. 2; Choquette-Choo, Ganesh,
McKenna, McMahan, Rush, Thakurta and Xu, 2023, "(Amplified) Banded Matrix
Factorization: A unified approach to private training", Sec. 2, where the
noisy per-round update is x_t + (C^{-1} z)_t).

* 'banded': C is the lower-triangular banded Toeplitz matrix whose b bands
  are the first b coefficients of (1 - x)^(-1/2), c_j = binom(2j, j) / 4^j
  (Kalinin and Lampert, 2024, "Banded Square Root Matrix Factorization for
  Differentially Private Model Training", Def. 1 and eq. (5): with b = n it is
  the exact square root of A). Since C is banded, (C^{-1} z)_t = w_t solves
  w_t = z_t - sum_{j=1}^{b-1} c_j w_{t-j} (c_0 = 1): the aggregator keeps the
  last b - 1 noise vectors w in its state (checkpointed like the key).
* 'tree': binary-tree aggregation (Kairouz, McMahan, Song, Thakkar,
  Thakurta and Xu, 2021, "Practical and Private (Deep) Learning without
  Sampling or Shuffling", Alg. 1 with the tree of Sec. 3 / App. B), restarted
  every `bands` rounds: the prefix noise of step s of a tree is the sum of
  the node noises of the dyadic decomposition of [0, s), and round s adds
  its residual prefix_s - prefix_{s-1} -- the residual form of
  tensorflow-privacy's `TreeResidualSumQuery`. Node noises are a pure
  function of (key, tree, node), so no state but the key is needed.

Accounting (participation with minimum separation b, at most k = ceil(T/b)
participations, `tff_clip.privacy.sampling`): with separation >= bands the columns a
client touches have disjoint supports, so the sensitivity of C x is
sqrt(k) max_j ||C e_j|| (Choquette-Choo et al. 2023, Thm. 2 for b-banded C),
and T rounds are as private as ONE Gaussian mechanism with noise multiplier
z / (sqrt(k) max_j ||C e_j||), i.e. k compositions of
GaussianDpEvent(z / max_j ||C e_j||): the per-participation event
`participation_event` returns. Each restarted tree is a
Gaussian with z / sqrt(floor(log2 b) + 1) (tensorflow-privacy's
`compute_rdp_tree_restart`), composed k times.

The two mechanisms are the classes `Banded` and `Tree` (registered in
`tff_clip.aggregation.mechanisms`); the functions are their matrices and coefficients.
No TensorFlow or dp_accounting import at module level
(`tff_clip.aggregation.noise_mechanisms`).
"""

from __future__ import annotations

import math

import numpy as np

from tff_clip import checks
from tff_clip.aggregation import noise_mechanisms
from tff_clip.aggregation.noise_mechanisms import participations  # pylint: disable=unused-import

__all__ = ['Banded', 'Tree', 'banded_coefficients', 'banded_matrix',
           'max_column_norm', 'participations', 'running_coefficients',
           'sensitivity', 'tree_levels']


def banded_coefficients(bands: int) -> np.ndarray:
  """c_0..c_{b-1} of (1 - x)^(-1/2): c_j = binom(2j, j) / 4^j, float64.

  Computed by the recurrence c_j = c_{j-1} (2j - 1) / (2j).
  """
  bands = checks.integer(bands, 'bands', minimum=1)
  coeffs = np.ones(bands)
  for j in range(1, bands):
    coeffs[j] = coeffs[j - 1] * (2 * j - 1) / (2 * j)
  return coeffs


def running_coefficients(bands: int) -> np.ndarray:
  """c_0..c_{b-1} as the noise runs them: rounded to float32 (nearest), the
  dtype of the recursion in `Banded.unit_noise`. The accounting takes its
  sensitivity from these, not from the float64 c_j: rounded up, they make
  ||C e_0|| larger (by 1e-9 relative at b = 342)."""
  return banded_coefficients(bands).astype(np.float32)


def banded_matrix(bands: int, rounds: int) -> np.ndarray:
  """The [rounds, rounds] lower-triangular banded Toeplitz C."""
  coeffs = banded_coefficients(bands)
  matrix = np.zeros((rounds, rounds))
  for j, c in enumerate(coeffs[:rounds]):
    matrix += c * np.eye(rounds, k=-j)
  return matrix


def max_column_norm(bands: int) -> float:
  """max_j ||C e_j||: the first column's norm, sqrt(sum_j c_j^2) (C Toeplitz
  with nonnegative coefficients, any number of rounds >= bands), of the C
  whose inverse runs (`running_coefficients`)."""
  return float(np.linalg.norm(running_coefficients(bands).astype(np.float64)))


def sensitivity(bands: int, rounds: int, separation: int) -> float:
  """sqrt(k) max_j ||C e_j|| for unit per-round sensitivity (b <= separation)."""
  bands = checks.integer(bands, 'bands', minimum=1)
  noise_mechanisms.check_bands_within_separation(bands, separation)
  return math.sqrt(participations(rounds, separation)) * max_column_norm(bands)


def tree_levels(bands: int) -> int:
  """Levels of a tree over `bands` leaves that some prefix uses:
  floor(log2(bands)) + 1."""
  return int(bands).bit_length()


def _tree_prefix(structure, key, tree, step, levels):
  """Unit-variance prefix noise of `step` leaves of tree `tree` (step >= 0)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  # float32 like the draws, whatever the records' dtypes.
  total = tf.nest.map_structure(
      lambda leaf: tf.zeros(tf.shape(leaf), tf.float32), structure)
  for level in range(levels):
    bit = tf.cast(tf.bitwise.bitwise_and(
        tf.bitwise.right_shift(step, level), 1), tf.float32)
    node = tf.bitwise.right_shift(step, level + 1)
    draws = noise_mechanisms.standard_normals(
        structure, noise_mechanisms.fold(key, tree, level, node))
    total = tf.nest.map_structure(lambda t, d: t + bit * d, total, draws)
  return total


class Banded(noise_mechanisms.NoiseMechanism):
  """Banded square-root matrix factorization with `bands` bands (Kalinin and
  Lampert 2024; Choquette-Choo et al. 2023); 1 band is independent noise."""

  name = 'banded'
  correlated = True
  uses_bands = True

  @property
  def state_vectors(self) -> int:
    return self.bands - 1

  @property
  def whitening_depth(self) -> int:
    return self.bands - 1

  def initial_state(self, template):
    # w_{t-1} .. w_{t-b+1}: the past noise the recursion needs (secret).
    return noise_mechanisms.noise_history(template, self.state_vectors)

  def unit_noise(self, structure, key, round_num, state):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    draws = noise_mechanisms.standard_normals(
        structure, noise_mechanisms.fold(key, round_num))
    if self.bands == 1:
      return draws, state
    bands = self.bands
    coeffs = tf.constant(running_coefficients(bands)[1:], tf.float32)

    def step_leaf(z, past):
      # w_t = z_t - sum_{j>=1} c_j w_{t-j}; past[0] is w_{t-1}.
      shape = tf.concat([[bands - 1], tf.ones([tf.rank(z)], tf.int32)], 0)
      w = z - tf.reduce_sum(tf.reshape(coeffs, shape) * past, axis=0)
      return w, tf.concat([w[tf.newaxis], past[:-1]], axis=0)

    pairs = [step_leaf(z, p) for z, p in zip(tf.nest.flatten(draws),
                                            tf.nest.flatten(state))]
    noise = tf.nest.pack_sequence_as(draws, [p[0] for p in pairs])
    return noise, tf.nest.pack_sequence_as(state, [p[1] for p in pairs])

  @property
  def participation_sensitivity(self) -> float:
    # One participation touches one column of C: max_j ||C e_j|| when
    # participations are >= `bands` rounds apart (Choquette-Choo et al.
    # 2023, Thm. 2), for the C whose inverse runs: float32 coefficients.
    return max_column_norm(self.bands)

  def whitening_weights(self, round_num):
    # sum_j c_j Delta_{t-j} = (C x)_t + s z_t (a release before round 0
    # counts as 0, as the mechanism's history does).
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    del round_num
    return tf.constant(banded_coefficients(self.bands), tf.float32)

  def noise_covariance(self, rounds: int) -> np.ndarray:
    inverse = np.linalg.inv(banded_matrix(self.bands, rounds))
    return inverse @ inverse.T


class Tree(noise_mechanisms.NoiseMechanism):
  """Binary-tree aggregation (DP-FTRL; Kairouz et al. 2021), restarted every
  `bands` rounds."""

  name = 'tree'
  correlated = True
  uses_bands = True

  @property
  def whitening_depth(self) -> int:
    return self.bands - 1

  def initial_state(self, template):
    # Node noises are a function of (key, tree, node): nothing to keep. An
    # empty history keeps the state's layout that of every correlated run.
    return noise_mechanisms.noise_history(template, 0)

  def unit_noise(self, structure, key, round_num, state):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    levels = tree_levels(self.bands)
    round_num = tf.cast(round_num, tf.int64)
    tree = round_num // self.bands
    step = round_num % self.bands + 1
    tree_key = noise_mechanisms.fold(key, -1)  # Apart from per-round draws.
    now = _tree_prefix(structure, tree_key, tree, step, levels)
    before = _tree_prefix(structure, tree_key, tree, step - 1, levels)
    return tf.nest.map_structure(tf.subtract, now, before), state

  @property
  def participation_sensitivity(self) -> float:
    # A leaf lies in `tree_levels` nodes: sqrt(levels) under add-or-remove-
    # one, the Gaussian of tensorflow-privacy's `compute_rdp_tree_restart`
    # (Kairouz et al. 2021, App. D). dp_accounting's
    # SingleEpochTreeAggregationDpEvent is the same mechanism, but only
    # under its REPLACE_SPECIAL adjacency.
    return math.sqrt(tree_levels(self.bands))

  def whitening_weights(self, round_num):
    # With step k = t mod b + 1 of the restarted tree, the sum of the last
    # lowbit(k) aggregates (lowbit: the largest power of two dividing k) is
    # the tree node that ends at step k, whose noise is that node's own
    # draw (Kairouz et al. 2021, Sec. 3: each node is released once).
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    step = tf.cast(round_num, tf.int64) % self.bands + 1
    lowbit = tf.bitwise.bitwise_and(step, -step)
    return tf.cast(tf.range(self.bands, dtype=tf.int64) < lowbit, tf.float32)

  def noise_covariance(self, rounds: int) -> np.ndarray:
    levels = tree_levels(self.bands)
    nodes = {}
    columns = []
    for t in range(rounds):
      tree, step = divmod(t, self.bands)
      row = {}
      for s, sign in ((step + 1, 1.0), (step, -1.0)):
        for level in range(levels):
          if (s >> level) & 1:
            node = (tree, level, s >> (level + 1))
            row[node] = row.get(node, 0.0) + sign
      columns.append(row)
      for node in row:
        nodes.setdefault(node, len(nodes))
    residual = np.zeros((rounds, len(nodes)))
    for t, row in enumerate(columns):
      for node, value in row.items():
        residual[t, nodes[node]] = value
    return residual @ residual.T
