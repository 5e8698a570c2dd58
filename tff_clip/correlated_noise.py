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
participations, `tff_clip.sampling`): with separation >= bands the columns a
client touches have disjoint supports, so the sensitivity of C x is
sqrt(k) max_j ||C e_j|| (Choquette-Choo et al. 2023, Thm. 2 for b-banded C),
and T rounds are as private as ONE Gaussian mechanism with noise multiplier
z / (sqrt(k) max_j ||C e_j||), i.e. k compositions of
GaussianDpEvent(z / max_j ||C e_j||): the per-participation event
`participation_event` returns. Each restarted tree is a
Gaussian with z / sqrt(floor(log2 b) + 1) (tensorflow-privacy's
`compute_rdp_tree_restart`), composed k times.

No TensorFlow import at module level: `tff_clip.accounting` uses the
accounting half, and the command-line accountant must start fast.
"""

from __future__ import annotations

import math
from typing import Optional

import dp_accounting
import numpy as np

from tff_clip import spec
from tff_clip.names import BANDED, INDEPENDENT, NOISE_MECHANISMS, TREE  # pylint: disable=g-bad-import-order

__all__ = ['BANDED', 'INDEPENDENT', 'NOISE_MECHANISMS', 'TREE',
           'banded_coefficients', 'banded_matrix', 'max_column_norm',
           'sensitivity', 'participation_event', 'tree_levels',
           'check_mechanism', 'initial_history', 'correlated_noise']


check_mechanism = spec.check_mechanism


def banded_coefficients(bands: int) -> np.ndarray:
  """c_0..c_{b-1} of (1 - x)^(-1/2): c_j = binom(2j, j) / 4^j, float64.

  Computed by the recurrence c_j = c_{j-1} (2j - 1) / (2j).
  """
  bands = check_mechanism(BANDED, bands)
  coeffs = np.ones(bands)
  for j in range(1, bands):
    coeffs[j] = coeffs[j - 1] * (2 * j - 1) / (2 * j)
  return coeffs


def banded_matrix(bands: int, rounds: int) -> np.ndarray:
  """The [rounds, rounds] lower-triangular banded Toeplitz C."""
  coeffs = banded_coefficients(bands)
  matrix = np.zeros((rounds, rounds))
  for j, c in enumerate(coeffs[:rounds]):
    matrix += c * np.eye(rounds, k=-j)
  return matrix


def max_column_norm(bands: int) -> float:
  """max_j ||C e_j||: the first column's norm, sqrt(sum_j c_j^2) (C Toeplitz
  with nonnegative coefficients, any number of rounds >= bands)."""
  return float(np.sqrt(np.sum(banded_coefficients(bands)**2)))


def participations(rounds: int, separation: int) -> int:
  """k = ceil(T / b): the most rounds a client can take part in."""
  return -(-int(rounds) // int(separation))


def sensitivity(bands: int, rounds: int, separation: int) -> float:
  """sqrt(k) max_j ||C e_j|| for unit per-round sensitivity (b <= separation)."""
  bands = check_mechanism(BANDED, bands)
  if separation < bands:
    raise ValueError(f'`bands` ({bands}) must be at most the participation '
                     f'separation ({separation}).')
  return math.sqrt(participations(rounds, separation)) * max_column_norm(bands)


def participation_event(noise_mechanism: str, noise_multiplier: float,
                        bands: int) -> dp_accounting.DpEvent:
  """The DpEvent of one participation (one cycle of `bands` rounds)."""
  bands = check_mechanism(noise_mechanism, bands)
  if isinstance(noise_multiplier, (int, float, np.number)):
    noise_multiplier = float(noise_multiplier)  # Else a tensor (graph mode).
  if noise_mechanism == TREE:
    # A leaf lies in `tree_levels` nodes: sensitivity sqrt(levels) under
    # add-or-remove-one, the Gaussian of tensorflow-privacy's
    # `compute_rdp_tree_restart` (Kairouz et al. 2021, App. D).
    # dp_accounting's SingleEpochTreeAggregationDpEvent is the same
    # mechanism, but only under its REPLACE_SPECIAL adjacency.
    return dp_accounting.GaussianDpEvent(
        noise_multiplier / math.sqrt(tree_levels(bands)))
  if noise_mechanism == BANDED and bands > 1:
    return dp_accounting.GaussianDpEvent(
        noise_multiplier / max_column_norm(bands))
  return dp_accounting.GaussianDpEvent(noise_multiplier)


def tree_levels(bands: int) -> int:
  """Levels of a tree over `bands` leaves that some prefix uses:
  floor(log2(bands)) + 1."""
  return int(bands).bit_length()


def initial_history(noise_mechanism: str, bands: int, template):
  """The state of the noise: b - 1 past noise vectors per leaf (banded), else
  an empty [0, ...] tensor per leaf."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  depth = bands - 1 if noise_mechanism == BANDED else 0
  return tf.nest.map_structure(
      lambda spec: tf.zeros([depth] + list(spec.shape), tf.float32), template)


def _standard_normals(structure, key):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.nest.pack_sequence_as(structure, [
      tf.random.stateless_normal(tf.shape(leaf), tf.random.experimental
                                 .stateless_fold_in(key, tf.constant(i, tf.int64)),
                                 dtype=tf.float32)
      for i, leaf in enumerate(tf.nest.flatten(structure))])


def _fold(key, *data):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  for d in data:
    key = tf.random.experimental.stateless_fold_in(key, tf.cast(d, tf.int64))
  return key


def _tree_prefix(structure, key, tree, step, levels):
  """Unit-variance prefix noise of `step` leaves of tree `tree` (step >= 0)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  total = tf.nest.map_structure(tf.zeros_like, structure)
  for level in range(levels):
    bit = tf.cast(tf.bitwise.bitwise_and(
        tf.bitwise.right_shift(step, level), 1), tf.float32)
    node = tf.bitwise.right_shift(step, level + 1)
    draws = _standard_normals(structure, _fold(key, tree, level, node))
    total = tf.nest.map_structure(lambda t, d: t + bit * d, total, draws)
  return total


def correlated_noise(noise_mechanism: str, bands: int, structure, key,
                     round_num, history, round_key=None):
  """(unit-variance noise of round `round_num`, new history).

  `structure`: float32 tensors giving the shapes; `key`: the run's [2] secret
  key; `round_key`: the round's key fold_in(key, round) (derived if None);
  `history`: `initial_history`'s structure. The caller scales by z S_t.
  'independent' and 'banded' with b = 1 draw exactly the independent noise.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if round_key is None:
    round_key = _fold(key, round_num)
  if noise_mechanism == TREE:
    levels = tree_levels(bands)
    round_num = tf.cast(round_num, tf.int64)
    tree = round_num // bands
    step = round_num % bands + 1
    tree_key = _fold(key, -1)  # A stream apart from the per-round draws.
    now = _tree_prefix(structure, tree_key, tree, step, levels)
    before = _tree_prefix(structure, tree_key, tree, step - 1, levels)
    return tf.nest.map_structure(tf.subtract, now, before), history
  draws = _standard_normals(structure, round_key)
  if noise_mechanism == INDEPENDENT or bands == 1:
    return draws, history
  coeffs = tf.constant(banded_coefficients(bands)[1:], tf.float32)

  def step_leaf(z, past):
    # w_t = z_t - sum_{j>=1} c_j w_{t-j}; past[0] is w_{t-1}.
    shape = tf.concat([[bands - 1], tf.ones([tf.rank(z)], tf.int32)], 0)
    w = z - tf.reduce_sum(tf.reshape(coeffs, shape) * past, axis=0)
    return w, tf.concat([w[tf.newaxis], past[:-1]], axis=0)

  pairs = [step_leaf(z, p) for z, p in zip(tf.nest.flatten(draws),
                                          tf.nest.flatten(history))]
  noise = tf.nest.pack_sequence_as(draws, [p[0] for p in pairs])
  new_history = tf.nest.pack_sequence_as(history, [p[1] for p in pairs])
  return noise, new_history


def noise_covariance(noise_mechanism: str, bands: int,
                     rounds: int) -> np.ndarray:
  """[rounds, rounds] covariance of the unit noise across rounds (numpy)."""
  if noise_mechanism == BANDED:
    inverse = np.linalg.inv(banded_matrix(bands, rounds))
    return inverse @ inverse.T
  if noise_mechanism == TREE:
    levels = tree_levels(bands)
    nodes = {}
    columns = []
    for t in range(rounds):
      tree, step = divmod(t, bands)
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
  return np.eye(rounds)


def effective_noise_multiplier(noise_mechanism: str, noise_multiplier: float,
                               bands: int, rounds: int,
                               separation: Optional[int] = None) -> float:
  """Banded / independent: z / (sqrt(k) max column norm), one Gaussian."""
  separation = bands if separation is None else separation
  if noise_mechanism == TREE:
    raise ValueError('Tree aggregation is not one Gaussian mechanism; use '
                     '`participation_event`.')
  b = bands if noise_mechanism == BANDED else 1
  return float(noise_multiplier) / sensitivity(b, rounds, separation)
