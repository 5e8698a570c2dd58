"""Buffered linear Toeplitz (BLT) matrices: the parameterization, its
inverse, streaming multiplication, the exact minimum-separation sensitivity
and the loss that `tff_clip.aggregation.blt.optimize` minimizes (numpy only).

A BLT C is the strategy matrix of a correlated-noise factorization A = B C
(`tff_clip.aggregation.blt` for the noise mechanism; Dvijotham, McMahan,
Pillutla, Steinke and Thakurta, 2024, arXiv:2404.16706; McMahan, Xu and
Zhang, 2024, arXiv:2408.08868, Alg. 2-3):

* C is lower-triangular Toeplitz with coefficients c_0 = 1 and
  c_j = sum_i omega_i theta_i^(j - 1) (j >= 1): d buffer decays theta_i and
  output scales omega_i. Its generating function is a ratio of degree-d
  polynomials, c(x) = prod_i (1 - theta_hat_i x) / prod_i (1 - theta_i x),
  so C^{-1} (generating function 1 / c(x)) is a BLT with d buffers too,
  decays theta_hat_i; `from_decays` gives both scales in closed form (partial
  fractions), `BufferedToeplitz.inverse` finds theta_hat as the eigenvalues
  of diag(theta) - 1 omega^T (the roots of 1 + sum_i omega_i / (x - theta_i)).
* Multiplying a stream by a BLT needs d buffers, each of the stream's shape:
  out_t = v_t + sum_i omega_i buf_i, then buf_i <- theta_i buf_i + v_t
  (`stream_step`; Alg. 2 of McMahan et al.). The noise of round t is the
  noise BLT (C^{-1}) applied to the fresh z_t: state of d buffers x model.
* The sensitivity of C x when a client takes part at most k times, any two
  at least b rounds apart (`tff_clip.privacy.sampling`'s minimum separation), is
  max over those patterns of ||C u|| (u the pattern's indicator). When C's
  coefficients are nonnegative and non-increasing the worst pattern is
  rounds 0, b, ..., (k - 1) b (Kalinin and Lampert, 2024, "Banded Square
  Root Matrix Factorization for Differentially Private Model Training",
  arXiv:2405.13763, Thm. 2; the bound McMahan et al. use for BLTs). Other
  nonnegative coefficients are searched exactly over every pattern; negative
  ones are refused (`min_separation_sensitivity`). The banded formula
  sqrt(k) max_j ||C e_j|| does NOT apply: a BLT's columns overlap.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Tuple

import numpy as np

from tff_clip import checks

__all__ = ['ERRORS', 'MAX', 'MAX_PATTERNS', 'MEAN', 'BufferedToeplitz',
           'check_error', 'decay_powers', 'error_weights', 'from_decays',
           'initial_buffers', 'loss', 'max_participations',
           'min_separation_sensitivity', 'partial_fractions',
           'participation_sensitivity', 'pattern_sum',
           'pattern_sum_adjoint', 'prefix_error', 'stream', 'stream_step']

MEAN = 'mean'
MAX = 'max'
ERRORS = (MEAN, MAX)
# The exact search over participation patterns (coefficients that are not
# non-increasing) stops beyond this many patterns.
MAX_PATTERNS = 200_000


def _vector(values, label: str) -> np.ndarray:
  array = np.asarray(values, dtype=np.float64)
  if array.ndim != 1 or not np.all(np.isfinite(array)):
    raise ValueError(f'`{label}` must be a 1-D sequence of finite floats; '
                     f'got {values!r}.')
  return array


@dataclasses.dataclass(frozen=True, eq=False)
class BufferedToeplitz:
  """The lower-triangular Toeplitz matrix with c_0 = 1 and
  c_j = sum_i output_scales[i] * buffer_decays[i]**(j - 1) for j >= 1.

  `buffer_decays` (theta) and `output_scales` (omega): float64 arrays of the
  same length, the number of buffers.
  """
  buffer_decays: np.ndarray
  output_scales: np.ndarray

  def __post_init__(self):
    decays = _vector(self.buffer_decays, 'buffer_decays')
    scales = _vector(self.output_scales, 'output_scales')
    if decays.shape != scales.shape:
      raise ValueError(f'`buffer_decays` ({decays.size}) and `output_scales` '
                       f'({scales.size}) must have the same length.')
    object.__setattr__(self, 'buffer_decays', decays)
    object.__setattr__(self, 'output_scales', scales)

  @property
  def buffers(self) -> int:
    return self.buffer_decays.size

  def coefficients(self, rounds: int) -> np.ndarray:
    """c_0 .. c_{rounds - 1}, float64."""
    rounds = checks.integer(rounds, 'rounds', 1)
    return np.concatenate(
        [[1.0],
         decay_powers(self.buffer_decays, rounds - 1) @ self.output_scales])

  def inverse(self) -> 'BufferedToeplitz':
    """The BLT of C^{-1}, in closed form (module docstring)."""
    if self.buffers == 0:
      return self
    _check_distinct(self.buffer_decays, 'buffer_decays')
    # theta_hat: the eigenvalues of diag(theta) - 1 omega^T, the transition
    # matrix of the buffers when the stream is divided by C (Alg. 3 of
    # McMahan et al. 2024); its characteristic polynomial is
    # prod(x - theta_i) (1 + sum_i omega_i / (x - theta_i)).
    transition = np.diag(self.buffer_decays) - self.output_scales[np.newaxis]
    eigenvalues = np.linalg.eigvals(transition)
    if np.any(np.abs(eigenvalues.imag) > 1e-12 * np.abs(eigenvalues)):
      raise ValueError('This BLT has no real inverse BLT (complex decays '
                       f'{eigenvalues}): not a correlated-noise strategy.')
    return from_decays(self.buffer_decays, np.sort(eigenvalues.real)[::-1])[1]


def _check_distinct(decays: np.ndarray, label: str):
  ordered = np.sort(decays)
  if decays.size > 1 and np.min(np.diff(ordered)) <= 0:
    raise ValueError(f'`{label}` must be distinct (two equal decays are one '
                     f'buffer); got {decays}.')


def decay_powers(decays: np.ndarray, count: int) -> np.ndarray:
  """[count, d]: decays**j for j < count, by cumulative products, so that a
  decay in [0, 1) gives exactly non-increasing float powers."""
  if count <= 0:
    return np.zeros((0, decays.size))
  factors = np.broadcast_to(decays, (count, decays.size)).copy()
  factors[0] = 1.0
  return np.cumprod(factors, axis=0)


def partial_fractions(poles: np.ndarray, zeros: np.ndarray):
  """omega_i = prod_j (p_i - z_j) / prod_{j != i} (p_i - p_j): the scales of
  prod_j (1 - z_j x) / prod_j (1 - p_j x) = 1 + sum_i omega_i x / (1 - p_i x),
  and their derivatives in p ([i, l]: d omega_i / d p_l) and z."""
  to_zeros = poles[:, np.newaxis] - zeros[np.newaxis]
  to_poles = poles[:, np.newaxis] - poles[np.newaxis]
  np.fill_diagonal(to_poles, 1.0)
  scales = np.prod(to_zeros, axis=1) / np.prod(to_poles, axis=1)
  inverse_poles = 1.0 / to_poles
  np.fill_diagonal(inverse_poles, 0.0)
  inverse_zeros = 1.0 / to_zeros
  d_poles = scales[:, np.newaxis] * inverse_poles
  d_poles[np.diag_indices(poles.size)] = scales * (
      inverse_zeros.sum(axis=1) - inverse_poles.sum(axis=1))
  d_zeros = -scales[:, np.newaxis] * inverse_zeros
  return scales, d_poles, d_zeros


def from_decays(strategy_decays, noise_decays
                ) -> Tuple[BufferedToeplitz, BufferedToeplitz]:
  """(C, C^{-1}) from their buffer decays (theta, theta_hat), in closed form.

  C's generating function is prod(1 - theta_hat_i x) / prod(1 - theta_i x);
  its partial fractions give omega_i = prod_j (theta_i - theta_hat_j) /
  prod_{j != i} (theta_i - theta_j), and C^{-1}'s the same with the roles
  swapped (Dvijotham et al. 2024, Lemma 5.2). Decays must be distinct.
  """
  theta = _vector(strategy_decays, 'strategy_decays')
  theta_hat = _vector(noise_decays, 'noise_decays')
  if theta.size != theta_hat.size:
    raise ValueError(f'`strategy_decays` ({theta.size}) and `noise_decays` '
                     f'({theta_hat.size}) must have the same length.')
  _check_distinct(theta, 'strategy_decays')
  _check_distinct(theta_hat, 'noise_decays')
  return (BufferedToeplitz(theta, partial_fractions(theta, theta_hat)[0]),
          BufferedToeplitz(theta_hat, partial_fractions(theta_hat, theta)[0]))


# ----------------------------------------------------------------------------
# Streaming multiplication (what TensorFlow mirrors, one round at a time).


def initial_buffers(blt: BufferedToeplitz, shape, dtype=np.float64):
  """Zeros of shape [buffers, *shape]: the state before round 0."""
  return np.zeros((blt.buffers,) + tuple(shape), dtype)


def stream_step(blt: BufferedToeplitz, value, buffers):
  """(row t of the BLT times the stream, new buffers) for the stream's
  entry t, `value`: out = value + sum_i omega_i buf_i, then
  buf_i <- theta_i buf_i + value. Computed in `buffers`' dtype.

  The correlated noise of a round is `stream_step(noise, z, buffers)`, z
  the round's i.i.d. standard normal draw and `noise` the factorization's
  C^{-1}.
  """
  dtype = buffers.dtype
  value = np.asarray(value, dtype)
  expand = (slice(None),) + (np.newaxis,) * value.ndim
  decays = blt.buffer_decays.astype(dtype)[expand]
  scales = blt.output_scales.astype(dtype)[expand]
  out = value + np.sum(scales * buffers, axis=0, dtype=dtype)
  return out, decays * buffers + value


def stream(blt: BufferedToeplitz, values) -> np.ndarray:
  """The BLT's matrix times `values` ([rounds, ...]), round by round."""
  values = np.asarray(values, np.float64)
  buffers = initial_buffers(blt, values.shape[1:])
  rows = []
  for value in values:
    out, buffers = stream_step(blt, value, buffers)
    rows.append(out)
  return np.array(rows)


# ----------------------------------------------------------------------------
# Sensitivity under participation with minimum separation.


def max_participations(rounds: int, separation: int,
                    participations: Optional[int]) -> int:
  """k: at most ceil(rounds / separation), `participations` if smaller."""
  most = -(-rounds // separation)
  if participations is None:
    return most
  return min(checks.integer(participations, 'participations', 1), most)


def pattern_sum(coefficients: np.ndarray, separation: int,
                 participations: int) -> np.ndarray:
  """C u for u the indicator of rounds 0, b, ..., (k - 1) b: entry t sums
  c_{t - m b} over the participations m <= t / b."""
  rounds = coefficients.size
  rows = -(-rounds // separation)
  padded = np.zeros(rows * separation)
  padded[:rounds] = coefficients
  # Entry t of the cumulative sum down columns of b is sum_{m b <= t} c_{t-mb}.
  every = np.cumsum(padded.reshape(rows, separation), axis=0).reshape(-1)
  every = every[:rounds]
  total = every.copy()
  cut = participations * separation
  if cut < rounds:  # Drop participations k, k + 1, ...
    total[cut:] -= every[:rounds - cut]
  return total


def pattern_sum_adjoint(weights: np.ndarray, separation: int,
                         participations: int) -> np.ndarray:
  """The transpose of `pattern_sum` applied to `weights`."""
  return pattern_sum(weights[::-1], separation, participations)[::-1]


def _count_patterns(rounds: int, separation: int, participations: int) -> int:
  """Nonempty sets of at most k rounds with gaps >= b, by dynamic programming."""
  # ways[m][t]: patterns of m rounds whose last round is t.
  ways = np.zeros(rounds, dtype=object)
  ways[:] = 1
  total = rounds
  for _ in range(1, participations):
    prefix = np.concatenate([[0], np.cumsum(ways)])
    ways = np.array([prefix[max(t - separation + 1, 0)] for t in range(rounds)],
                    dtype=object)
    total += int(ways.sum())
    if total > MAX_PATTERNS:
      break
  return total


def _searched_sensitivity(coefficients: np.ndarray, separation: int,
                          participations: int) -> float:
  """max ||C u|| over every pattern, by depth-first search (small cases)."""
  rounds = coefficients.size
  count = _count_patterns(rounds, separation, participations)
  if count > MAX_PATTERNS:
    raise ValueError(
        f'The coefficients increase somewhere, so the worst participation '
        f'pattern is not known in closed form, and an exact search over '
        f'more than {MAX_PATTERNS} patterns ({rounds} rounds, separation '
        f'{separation}, {participations} participations) is too large; use '
        'non-increasing coefficients.')
  matrix = np.zeros((rounds, rounds))
  for j, c in enumerate(coefficients):
    matrix += c * np.eye(rounds, k=-j)
  gram = matrix.T @ matrix
  best = 0.0
  stack = [((t,), gram[t, t]) for t in range(rounds)]
  while stack:
    pattern, value = stack.pop()
    best = max(best, value)
    if len(pattern) < participations:
      for t in range(pattern[-1] + separation, rounds):
        stack.append((pattern + (t,), value + gram[t, t]
                      + 2 * gram[t, list(pattern)].sum()))
  return math.sqrt(best)


def min_separation_sensitivity(coefficients, separation: int,
                               participations: Optional[int] = None) -> float:
  """max ||C u|| over participation patterns u: at most `participations`
  rounds (default and cap: ceil(rounds / separation)), any two at least
  `separation` apart; C the lower-triangular Toeplitz matrix of
  `coefficients` (c_0 .. c_{rounds - 1}), per unit of per-round sensitivity.

  Nonnegative, non-increasing coefficients: the pattern 0, b, 2b, ...
  (Kalinin and Lampert 2024, Thm. 2). Otherwise nonnegative: an exact search
  over every pattern (C^T C >= 0 entrywise, so aligned contributions are the
  worst case and a pattern's indicator gives it), refused beyond
  `MAX_PATTERNS`. A negative coefficient is refused: the worst case of a
  vector-valued sum is then not a pattern of equal contributions.
  """
  coefficients = _vector(coefficients, 'coefficients')
  if coefficients.size == 0:
    raise ValueError('`coefficients` must not be empty.')
  separation = checks.integer(separation, 'separation', 1)
  participations = max_participations(coefficients.size, separation,
                                   participations)
  if np.any(coefficients < 0):
    raise ValueError('`coefficients` must be nonnegative: with a negative '
                     'one the worst case of a vector-valued sum is not a '
                     'participation pattern of equal contributions.')
  if np.all(np.diff(coefficients) <= 0):
    total = pattern_sum(coefficients, separation, participations)
    return float(np.sqrt(total @ total))
  return _searched_sensitivity(coefficients, separation, participations)


def participation_sensitivity(coefficients, separation: int) -> float:
  """max over the run's prefixes of sens(C_t) / sqrt(k_t): C_t the first t
  rounds of C (`min_separation_sensitivity` of `coefficients[:t]`), k_t =
  ceil(t / b) the participations a ledger charging one per cycle of b
  rounds has recorded by round t. A Gaussian of z over it, composed k_t
  times, covers every prefix of the run, not only the whole: with
  overlapping columns sens(C_t)^2 / k_t is not largest at t = T when the
  last cycle is short (T = 9, b = 4: 8% above sens(C)^2 / k at t = 8), so
  charging each cycle sens(C) / sqrt(k) understated the epsilon of a run
  stopped early and of every round's report. The maximum lies at a
  cycle's last round (within a cycle k_t is fixed and sens(C_t) grows)."""
  coefficients = _vector(coefficients, 'coefficients')
  separation = checks.integer(separation, 'separation', 1)
  rounds = coefficients.size
  return max(
      min_separation_sensitivity(coefficients[:min(m * separation, rounds)],
                                 separation) / math.sqrt(m)
      for m in range(1, -(-rounds // separation) + 1))


# ----------------------------------------------------------------------------
# The loss.


def check_error(error: str) -> str:
  if error not in ERRORS:
    raise ValueError(f'`error` must be one of {ERRORS}; got {error!r}.')
  return error


def error_weights(rounds: int, error: str) -> np.ndarray:
  """Weights w_j of ||A C^{-1}||^2 = sum_j w_j b_j^2, b_j = sum_{m<=j} c'_m:
  A C^{-1} is Toeplitz with coefficients b_j, which appear in n - j rows
  (mean: divided by n) and once each in the last, largest row (max)."""
  if error == MEAN:
    return (rounds - np.arange(rounds)) / rounds
  return np.ones(rounds)


def prefix_error(noise: BufferedToeplitz, rounds: int,
                 error: str = MEAN) -> float:
  """Per unit noise: the mean over rounds ('mean', ||A C^{-1}||_F^2 / n) or
  the max ('max') of the squared error of the prefix sums, A lower-triangular
  ones and C^{-1} the `noise` BLT."""
  error = check_error(error)
  prefix = np.cumsum(noise.coefficients(rounds))
  return float(error_weights(rounds, error) @ prefix**2)


def loss(strategy: BufferedToeplitz, rounds: int, separation: int,
         participations: Optional[int] = None, error: str = MEAN) -> float:
  """sens(C)^2 x the prefix-sum error of C^{-1}: the error at unit noise
  multiplier once the noise is scaled by the sensitivity."""
  sensitivity = min_separation_sensitivity(strategy.coefficients(rounds),
                                           separation, participations)
  return sensitivity**2 * prefix_error(strategy.inverse(), rounds, error)
