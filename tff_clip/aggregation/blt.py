"""Buffered linear Toeplitz (BLT) correlated noise: the optimization of the
BLT's parameters for a run, and the 'blt' noise mechanism (numpy/scipy only).

Like banded and tree noise (`tff_clip.aggregation.correlated_noise`), a BLT privatises
the prefix sums A x of the per-round sums through a factorization A = B C:
round t adds (C^{-1} z)_t to its sum, z i.i.d. Gaussian, and the run is one
Gaussian mechanism on C x (Choquette-Choo, McMahan, Rush and Thakurta, 2023,
"Multi-Epoch Matrix Factorization Mechanisms for Private Machine Learning",
eq. (1)). Here C is a BLT (Dvijotham, McMahan, Pillutla, Steinke and
Thakurta, 2024, "Efficient and Near-Optimal Noise Generation for Streaming
Differential Privacy", arXiv:2404.16706; McMahan, Xu and Zhang,
2024, "A Hassle-free Algorithm for Private Learning in Practice: Don't Use
Tree Aggregation, Use BLTs", arXiv:2408.08868, Alg. 2-3).
The matrices themselves (parameterization, inverse, streaming, the exact
minimum-separation sensitivity) are `tff_clip.aggregation.blt_matrix`, whose
public names this module re-exports.

* `optimize` picks the decays for the run's rounds n, separation b and
  participations k, minimizing sens(C)^2 times the prefix-sum error of
  C^{-1}: the mean ||A C^{-1}||_F^2 / n (default) or the max (last-row)
  squared error. The decays are parameterized interlaced,
  1 > theta_1 > theta_hat_1 > theta_2 > ... > theta_d > theta_hat_d > 0,
  which makes every omega_i > 0 and c_1 = sum_i omega_i < 1: the
  coefficients are positive and decreasing for every parameter value, so the
  exact sensitivity of `blt_matrix.min_separation_sensitivity` holds
  throughout the search.

`Blt` is the 'blt' noise mechanism of `tff_clip.aggregation.mechanisms`: the
factorization optimized for the run's rounds and separation with at most
`blt_buffers` buffers, noise from the run's secret key, state of (buffers x
model) float32, and each cycle of b rounds accounted as one Gaussian whose
composition covers every prefix of the run. No TensorFlow or dp_accounting
import at module level: the command line checks its flags with these
classes before either loads.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional

import numpy as np
import scipy.optimize

from tff_clip import checks
from tff_clip.aggregation import blt_matrix
from tff_clip.aggregation import noise_mechanisms
from tff_clip.aggregation.blt_matrix import (
    ERRORS, MAX, MAX_PATTERNS, MEAN, BufferedToeplitz, from_decays,
    initial_buffers, loss, min_separation_sensitivity, prefix_error, stream,
    stream_step)

__all__ = ['Blt', 'DEFAULT_BUFFERS', 'ERRORS', 'MAX_BUFFERS', 'BufferedToeplitz',
           'Factorization', 'from_decays', 'initial_buffers', 'loss',
           'min_separation_sensitivity', 'optimize', 'prefix_error',
           'stream', 'stream_step']

# The optimum uses 1 to 4 buffers on every schema of tests/test_blt.py (up
# to 2,052 rounds; jax_privacy's optimizer settles on 1 to 3 there): a fifth
# rarely lowers the loss by `MIN_GAIN`, and more make the partial fractions
# ill-conditioned.
DEFAULT_BUFFERS = 4
MAX_BUFFERS = 10
# `optimize` adds a buffer only while it lowers the loss by this fraction: a
# buffer that does not pays for a model-sized state and, as its decay
# merges with a neighbour's, makes the output scales cancel.
MIN_GAIN = 1e-3
# Bounds of the optimizer's logits (the log-gaps between interlaced decays):
# keeps every gap above ~1e-12 so no two decays merge in float64.
_LOGIT_BOUND = 12.0
# Every decay stays below 1 - 2^-20, so that it stays below 1 in float32
# (spacing 2^-24 there): a decay of 1 never forgets, and the inverse of a
# rounded noise BLT would then grow.
_DECAY_MARGIN = 2.0**-20


@dataclasses.dataclass(frozen=True, eq=False)
class Factorization:
  """An optimized BLT factorization for one schema.

  `noise` (C^{-1}) is what runs: its parameters are float32 numbers, the
  dtype TensorFlow generates noise in. `strategy` (C) is its exact inverse,
  whose `sensitivity` (per unit of per-round sensitivity) the loss weighs;
  each cycle of b rounds is charged `participation_sensitivity`
  (`blt_matrix.participation_sensitivity`: at least sens / sqrt(k), so that
  every prefix of the run is covered, not only all T rounds).
  """
  strategy: BufferedToeplitz
  noise: BufferedToeplitz
  rounds: int
  separation: int
  participations: int
  error: str
  loss: float
  sensitivity: float
  participation_sensitivity: float

  @property
  def buffers(self) -> int:
    return self.noise.buffers


def _decays_from_logits(logits: np.ndarray):
  """Interlaced decays from 2d logits: a softmax of (logits, 0) gives 2d + 1
  positive gaps summing to 1, s_m = 1 - (the first m gaps) decrease from 1 to
  0; the decays are (1 - `_DECAY_MARGIN`) s: theta = s_1, s_3, ...,
  theta_hat = s_2, s_4, ..."""
  padded = np.append(logits, 0.0)
  exps = np.exp(padded - padded.max())
  gaps = exps / exps.sum()
  points = (1.0 - _DECAY_MARGIN) * (1.0 - np.cumsum(gaps)[:-1])
  return points, gaps


def _logits_from_decays(points: np.ndarray) -> np.ndarray:
  gaps = -np.diff(np.concatenate([[1.0], points / (1 - _DECAY_MARGIN), [0.0]]))
  logs = np.log(np.maximum(gaps, 1e-300))
  return np.clip(logs[:-1] - logs[-1], -_LOGIT_BOUND, _LOGIT_BOUND)


def _log_loss_and_gradient(logits, rounds, separation, participations,
                           weights):
  """log(sens^2 x error) of the interlaced decays and its gradient in the
  logits, by hand: forward through decays -> scales (partial fractions) ->
  coefficients of C and C^{-1} -> sensitivity and error, then back. Both
  matrices' powers go through one [rounds - 1, 2d] array (columns 0::2:
  theta, 1::2: theta_hat), so a step is three small matrix products."""
  points, gaps = _decays_from_logits(logits)
  theta, theta_hat = points[0::2], points[1::2]
  omega, omega_d_theta, omega_d_theta_hat = blt_matrix.partial_fractions(
      theta, theta_hat)
  (omega_hat, omega_hat_d_theta_hat,
   omega_hat_d_theta) = blt_matrix.partial_fractions(theta_hat, theta)
  powers = blt_matrix.decay_powers(points, rounds - 1)
  scales = np.zeros((points.size, 2))
  scales[0::2, 0], scales[1::2, 1] = omega, omega_hat
  tails = powers @ scales  # c_j and c'_j for j >= 1.
  strategy = np.concatenate([[1.0], tails[:, 0]])
  prefix = np.cumsum(np.concatenate([[1.0], tails[:, 1]]))
  error = weights @ prefix**2
  total = blt_matrix.pattern_sum(strategy, separation, participations)
  sensitivity_squared = total @ total
  value = sensitivity_squared * error
  # d value / d c_j and d value / d c'_j for j >= 1.
  grad_tails = np.empty((rounds - 1, 2))
  grad_tails[:, 0] = (2 * error * blt_matrix.pattern_sum_adjoint(
      total, separation, participations))[1:]
  grad_tails[:, 1] = sensitivity_squared * np.cumsum(
      (2 * weights * prefix)[::-1])[::-1][1:]
  # c_j = sum_i omega_i theta_i^(j-1): d/d theta_i = omega_i (j-1) theta_i^(j-2).
  grad_scales = powers.T @ grad_tails
  exponents = np.arange(rounds - 1)[:, np.newaxis]
  grad_decays = (exponents * powers / points).T @ grad_tails
  grad_omega, grad_omega_hat = grad_scales[0::2, 0], grad_scales[1::2, 1]
  grad_theta = (omega * grad_decays[0::2, 0] + omega_d_theta.T @ grad_omega
                + omega_hat_d_theta.T @ grad_omega_hat)
  grad_theta_hat = (omega_hat * grad_decays[1::2, 1]
                    + omega_d_theta_hat.T @ grad_omega
                    + omega_hat_d_theta_hat.T @ grad_omega_hat)
  grad_points = np.empty(points.size)
  grad_points[0::2], grad_points[1::2] = grad_theta, grad_theta_hat
  # s_m = (1 - margin) (1 - sum_{l <= m} gap_l), then the softmax.
  grad_gaps = np.append(-np.cumsum(grad_points[::-1])[::-1], 0.0) * (
      1 - _DECAY_MARGIN)
  grad_logits = gaps * (grad_gaps - gaps @ grad_gaps)
  return math.log(value), grad_logits[:-1] / value


def _geometric_start(rounds: int, count: int) -> np.ndarray:
  """2d interlaced decays whose memories 1 / (1 - s) are geometrically
  spaced from ~rounds down to 2."""
  steps = np.arange(2 * count) / max(2 * count - 1, 1)
  memories = np.exp(math.log(max(rounds, 2)) * (1 - steps) + math.log(2) * steps)
  return 1 - 1 / memories


def _widened(points: np.ndarray, longest: bool) -> np.ndarray:
  """`points` with a new (theta, theta_hat) pair of longer memory than all
  (`longest`) or shorter than all."""
  if longest:
    top = 1 - _DECAY_MARGIN
    gap = top - points[0]
    return np.concatenate([[top - gap / 4, top - gap / 2], points])
  return np.concatenate([points, [points[-1] / 2, points[-1] / 4]])


def _minimize(start_points, rounds, separation, participations, weights):
  result = scipy.optimize.minimize(
      _log_loss_and_gradient, _logits_from_decays(start_points),
      args=(rounds, separation, participations, weights), jac=True,
      method='L-BFGS-B',
      bounds=[(-_LOGIT_BOUND, _LOGIT_BOUND)] * start_points.size,
      options=dict(maxiter=200, ftol=1e-10, gtol=1e-6))
  return result.fun, _decays_from_logits(result.x)[0]


def optimize(rounds: int, separation: int,
             participations: Optional[int] = None,
             buffers: int = DEFAULT_BUFFERS,
             error: str = MEAN) -> Factorization:
  """The BLT with at most `buffers` buffers that minimizes
  sens(C)^2 x error(C^{-1}) for `rounds` rounds, participations at least
  `separation` apart, at most `participations` of them (default
  ceil(rounds / separation)). Deterministic (fixed starting points).

  One buffer count at a time, from 1: L-BFGS on the interlaced decays from a
  geometric start and from the previous count's optimum widened by a pair at
  either end; a buffer is kept only while it lowers the loss by `MIN_GAIN`.
  The returned noise BLT's parameters are rounded to float32 and the
  strategy recomputed as its exact inverse, so the sensitivity and loss are
  those of the noise that runs.
  """
  rounds = checks.integer(rounds, 'rounds', 1)
  separation = checks.integer(separation, 'separation', 1)
  participations = blt_matrix.max_participations(rounds, separation,
                                                 participations)
  buffers = checks.integer(buffers, 'buffers', 1, MAX_BUFFERS)
  error = blt_matrix.check_error(error)
  weights = blt_matrix.error_weights(rounds, error)
  optima = []  # The decays of each buffer count kept, fewest first.
  best_value = math.inf
  for count in range(1, buffers + 1):
    starts = [_geometric_start(rounds, count)]
    if optima:
      starts += [_widened(optima[-1], True), _widened(optima[-1], False)]
    value, points = min(
        (_minimize(start, rounds, separation, participations, weights)
         for start in starts), key=lambda pair: pair[0])
    if optima and value > best_value + math.log1p(-MIN_GAIN):
      break
    best_value = value
    optima.append(points)
  for points in optima[:0:-1]:
    try:
      return _rounded_factorization(points, rounds, separation,
                                    participations, error)
    except ValueError:
      # Two decays within float32's spacing merged when rounded: fewer
      # buffers, whose decays lie further apart, serve instead.
      continue
  return _rounded_factorization(optima[0], rounds, separation,
                                participations, error)


def _rounded_factorization(points, rounds, separation, participations, error):
  _, noise = from_decays(points[0::2], points[1::2])
  noise = BufferedToeplitz(noise.buffer_decays.astype(np.float32),
                           noise.output_scales.astype(np.float32))
  strategy = noise.inverse()
  sensitivity = min_separation_sensitivity(strategy.coefficients(rounds),
                                           separation, participations)
  return Factorization(
      strategy=strategy, noise=noise, rounds=rounds, separation=separation,
      participations=participations, error=error,
      loss=sensitivity**2 * prefix_error(noise, rounds, error),
      sensitivity=sensitivity,
      participation_sensitivity=blt_matrix.participation_sensitivity(
          strategy.coefficients(rounds), separation))


# ----------------------------------------------------------------------------
# The noise mechanism.


@functools.lru_cache(maxsize=32)
def _run_factorization(rounds: int, separation: int,
                       buffers: int) -> Factorization:
  # A spec, a query, the ledger and the audit each build the mechanism of
  # one run: optimized once.
  return optimize(rounds, separation, buffers=buffers)


class Blt(noise_mechanisms.NoiseMechanism):
  """Buffered linear Toeplitz noise (Dvijotham et al. 2024; McMahan, Xu and
  Zhang 2024), optimized for the run's rounds and separation, with at most
  `blt_buffers` model-sized buffers.

  Round t adds (C^{-1} z)_t, z_t drawn from the run's key like independent
  noise and C^{-1} the optimized noise BLT (`optimize`, mean error),
  streamed through its buffers (`stream_step`); the buffers are the state.
  `bands` plays no part (the separation is `separation`). The run is one
  Gaussian mechanism with noise multiplier z / sens(C) (the exact
  `min_separation_sensitivity`), recorded as k = ceil(T / b) participations
  of z / s each, s = max_t sens(C_t) / sqrt(ceil(t / b)) over the prefixes
  (`blt_matrix.participation_sensitivity`): the same Gaussian, composed,
  where T is a multiple of b, and a little more otherwise, so that a run
  stopped at any round is covered by the participations it recorded.
  """

  name = 'blt'
  correlated = True
  smaller_state_flags = '--blt_buffers'
  options = ('blt_buffers',)

  def __init__(self, bands: int = 1, *, rounds: Optional[int] = None,
               separation: Optional[int] = None,
               blt_buffers: int = DEFAULT_BUFFERS):
    super().__init__(bands, rounds=rounds, separation=separation)
    self.blt_buffers = checks.integer(blt_buffers, 'blt_buffers', 1,
                                      MAX_BUFFERS)

  def __repr__(self):
    return (f'Blt(rounds={self.rounds}, separation={self.separation}, '
            f'blt_buffers={self.blt_buffers})')

  def check_participation(self) -> None:
    super().check_participation()
    if self.rounds is None:
      raise ValueError(
          '`noise_mechanism`=blt is optimized for the run\'s length: it '
          'needs `rounds`.')

  @property
  def factorization(self) -> Factorization:
    """The run's optimized BLT factorization."""
    self.check_participation()
    return _run_factorization(self.rounds, self.separation, self.blt_buffers)

  @property
  def state_vectors(self) -> int:
    return self.factorization.buffers

  def record(self) -> dict:
    # Optimized by scipy: another version of it may settle elsewhere, and
    # the checkpointed buffers would run on under other parameters.
    factorization = self.factorization
    return dict(
        buffer_decays=[float(x) for x in factorization.noise.buffer_decays],
        output_scales=[float(x) for x in factorization.noise.output_scales],
        participation_sensitivity=factorization.participation_sensitivity)

  @property
  def whitening_depth(self) -> int:
    # C has no finite band: the audit undoes its first `separation`
    # coefficients (one participation cycle), an approximate whitening,
    # which can only weaken the attack (`tff_clip.privacy.audit`).
    return min(self.separation, self.rounds) - 1

  def initial_state(self, template):
    return noise_mechanisms.noise_history(template, self.state_vectors)

  def unit_noise(self, structure, key, round_num, state):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    noise = self.factorization.noise
    # The factorization, and the event each participation records, hold for
    # the `rounds` it was optimized for: past them its sensitivity grows.
    within = tf.debugging.assert_less(
        tf.cast(round_num, tf.int64), tf.constant(self.rounds, tf.int64),
        message=f'BLT noise was optimized for rounds={self.rounds}: a later '
        'round would be accounted below its sensitivity. Build the '
        'aggregator for the rounds the run trains.')
    with tf.control_dependencies([within]):
      draws = noise_mechanisms.standard_normals(
          structure, noise_mechanisms.fold(key, round_num))
    decays = tf.constant(noise.buffer_decays, tf.float32)
    scales = tf.constant(noise.output_scales, tf.float32)

    def step_leaf(z, buffers):
      # `stream_step`: out = z + sum_i omega_i buf_i; buf_i <- theta_i buf_i
      # + z.
      shape = tf.concat([[noise.buffers], tf.ones([tf.rank(z)], tf.int32)], 0)
      out = z + tf.tensordot(scales, buffers, axes=1)
      return out, tf.reshape(decays, shape) * buffers + z[tf.newaxis]

    pairs = [step_leaf(z, b) for z, b in zip(tf.nest.flatten(draws),
                                            tf.nest.flatten(state))]
    return (tf.nest.pack_sequence_as(draws, [p[0] for p in pairs]),
            tf.nest.pack_sequence_as(state, [p[1] for p in pairs]))

  @property
  def participation_sensitivity(self) -> float:
    # k Gaussians of noise multiplier z sqrt(k) / sens would compose to the
    # one Gaussian z / sens the whole run is, but the first k_t of them
    # would understate a prefix of t rounds when the last cycle is short:
    # the largest sens(C_t) / sqrt(k_t) over prefixes covers each.
    return self.factorization.participation_sensitivity

  def whitening_weights(self, round_num):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    del round_num
    return tf.constant(self.factorization.strategy.coefficients(
        self.whitening_depth + 1), tf.float32)

  def noise_covariance(self, rounds: int) -> np.ndarray:
    coefficients = self.factorization.noise.coefficients(rounds)
    inverse = np.zeros((rounds, rounds))
    for j, c in enumerate(coefficients):
      inverse += c * np.eye(rounds, k=-j)
    return inverse @ inverse.T
