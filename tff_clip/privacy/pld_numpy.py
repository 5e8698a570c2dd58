"""dp_accounting 0.4.3's PLD arithmetic in NumPy: the same bits, faster.

A run reports its epsilon after every round, from the PLD of every round
it ran (`tff_clip.privacy.accountants`). dp_accounting computes parts of
that in Python loops; here they are computed in NumPy, bit for bit as
dp_accounting computes them (tests/test_accounting.py compares the bytes):

* `gaussian_round`: one Poisson-sampled Gaussian round's PLD
  (`from_gaussian_mechanism`), its connect-the-dots hockey-stick
  divergences computed for all the grid's losses at once: dp_accounting
  inverts the privacy loss one loss at a time in Python (~0.15 s a PMF of a
  fine grid, built once per noise, rate and grid: a run's first epsilons,
  every step of a calibration).
* `SampledRound`: one Poisson-sampled Gaussian round's PLD self-composed T
  times (`PrivacyLossDistribution.self_compose`), the Chernoff bounds'
  moment-generating functions computed once per round's PMF, and the last
  few compositions kept.
* `compose`: two PLDs composed (`PrivacyLossDistribution.compose`), the
  tails' truncation found by cumulative sums instead of a Python loop (a
  ledger of rounds with distinct noise, e.g. TFF's adaptive clipping, whose
  float32 noise multipliers differ in their last bits from round to round,
  composes its distinct rounds after every round).
* `pmf_epsilon`, `pld_epsilon`: epsilon read off a PLD
  (`get_epsilon_for_delta`).

Anything else (sparse PMFs, an overflow) is left to dp_accounting itself.
"""

from __future__ import annotations

import math

from dp_accounting import pld
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_mechanism
import numpy as np
from scipy import fft as scipy_fft
from scipy import signal
from scipy import special

__all__ = ['SampledRound', 'compose', 'gaussian_round', 'pld_epsilon',
           'pmf_epsilon']

# Self-compositions a `SampledRound` keeps.
_COMPOSED_KEPT = 4


class _GaussianLoss(privacy_loss_mechanism.GaussianPrivacyLoss):
  """dp_accounting 0.4.3's `GaussianPrivacyLoss` (0 < q <= 1),
  `get_delta_for_epsilon` of many losses at once: the inverse privacy loss
  (`inverse_privacy_loss`, `common.log_a_times_exp_b_plus_c`) taken with the
  same NumPy functions in the same order on an array, its `math.isclose`
  and range checks as comparisons of the same float64 values."""

  def get_delta_for_epsilon(self, epsilon):
    if isinstance(epsilon, (int, float)) or np.ndim(epsilon) == 0:
      return super().get_delta_for_epsilon(epsilon)
    epsilons = np.asarray(epsilon)
    deltas = np.zeros_like(epsilons, dtype=float)
    q, add = (self.sampling_prob,
              self.adjacency_type == privacy_loss_mechanism.AdjacencyType.ADD)
    if q == 1.0:  # No subsampling: every loss inverted as it is.
      inverse, unsampled = np.full_like(epsilons, True, dtype=bool), epsilons
    else:
      inverse, unsampled = self._subsampled_inverse(epsilons, deltas, q, add)
      if inverse is None:
        return super().get_delta_for_epsilon(epsilon)  # Its ValueError.
    x_cutoffs = ((0.5 if add else -0.5) * self.sensitivity - unsampled *
                 (self._standard_deviation**2) / self.sensitivity)
    deltas[inverse] = (self.mu_upper_cdf(x_cutoffs) - np.exp(
        epsilons[inverse] + self.mu_lower_log_cdf(x_cutoffs)))
    return np.clip(deltas, 0, 1)

  @staticmethod
  def _subsampled_inverse(epsilons, deltas, q, add):
    """(which losses are inverted, each one's privacy loss without
    subsampling), the others' deltas set; (None, None) where dp_accounting
    raises."""
    if add:
      inverse = epsilons < -math.log1p(-q)
      losses, edge = epsilons[inverse], -math.log(1 - q)
    else:
      inverse = epsilons > math.log1p(-q)
      deltas[~inverse] = -np.expm1(epsilons[~inverse])
      losses, edge = epsilons[inverse], math.log(1 - q)
    close = np.abs(losses - edge) <= 1e-9 * np.maximum(np.abs(losses),
                                                       abs(edge))
    # log(a exp(b) + c), a = 1/q, c = 1 - 1/q < 0: b = -loss (ADD), loss.
    b, a, c = (-losses if add else losses), 1 / q, 1 - 1 / q
    with np.errstate(divide='ignore', invalid='ignore', over='ignore'):
      d, log_c = b + np.log(a), np.log(-c)
      beyond = (losses > edge) if add else (losses <= edge)
      if np.any(~close & (beyond | ((b != 0) & (log_c >= d)))):
        return None, None
      unsampled = np.where(b == 0, np.log(a + c),
                           d + np.log1p(-np.exp(log_c - d)))
    # `inverse_privacy_loss_without_subsampling`'s argument (+-inf where
    # close).
    if add:
      return inverse, np.where(close, math.inf, -unsampled)
    return inverse, np.where(close, -math.inf, unsampled)


def gaussian_round(noise_multiplier: float, sampling_probability: float,
                   grid: float):
  """`privacy_loss_distribution.from_gaussian_mechanism(noise_multiplier,
  value_discretization_interval=grid, sampling_prob=sampling_probability)`
  of dp_accounting 0.4.3, the same bits (tests/test_accounting.py compares
  the bytes), for 0 < q <= 1; anything else is dp_accounting's own."""
  distribution = pld.privacy_loss_distribution
  if not 0 < sampling_probability <= 1:
    return distribution.from_gaussian_mechanism(
        standard_deviation=noise_multiplier,
        value_discretization_interval=grid,
        sampling_prob=sampling_probability)

  def pmf(adjacency):
    # pylint: disable=protected-access
    return distribution._create_pld_pmf_from_additive_noise(
        _GaussianLoss(noise_multiplier, sampling_prob=sampling_probability,
                      adjacency_type=adjacency),
        value_discretization_interval=grid, use_connect_dots=True)

  remove = pmf(privacy_loss_mechanism.AdjacencyType.REMOVE)
  if sampling_probability == 1:  # Symmetric: dp_accounting's one PMF.
    return distribution.PrivacyLossDistribution(remove)
  return distribution.PrivacyLossDistribution(
      remove, pmf(privacy_loss_mechanism.AdjacencyType.ADD))


class SampledRound:
  """The PLD of one Poisson-sampled Gaussian round, self-composed as
  dp_accounting 0.4.3's `PrivacyLossDistribution.self_compose` does, bit
  for bit, but for the Chernoff bounds that size the result
  (`common.compute_self_convolve_bounds`): their log moment-generating
  functions are of the one round's PMF, whatever the count, so they are
  computed once here, not at every round (most of a self-composition's
  cost)."""

  def __init__(self, round_pld):
    self.pld = round_pld
    pmfs = [round_pld._pmf_remove]  # pylint: disable=protected-access
    if not round_pld._symmetric:  # pylint: disable=protected-access
      pmfs.append(round_pld._pmf_add)  # pylint: disable=protected-access
    self._dense = all(type(p) is pld_pmf.DensePLDPmf for p in pmfs)  # pylint: disable=unidiomatic-typecheck
    self._pmfs = [(p, self._log_mgfs(p)) for p in pmfs] if self._dense else []
    self._composed = {}  # (count, truncation) -> PLD, the newest last.

  @staticmethod
  def _log_mgfs(pmf):
    probs = pmf._probs  # pylint: disable=protected-access
    orders = (np.concatenate((np.arange(-20, 0), np.arange(1, 21))) /
              len(probs))
    return orders, [special.logsumexp(np.arange(len(probs)) * order, b=probs)
                    for order in orders]

  @staticmethod
  def _self_compose_pmf(pmf, log_mgfs, num_times, tail_mass_truncation):
    # pylint: disable=protected-access
    # `DensePLDPmf.self_compose` and `common.self_convolve`, 0.4.3.
    probs = pmf._probs
    lower, upper = 0, (len(probs) - 1) * num_times
    if tail_mass_truncation != 0:
      for order, log_mgf_value in zip(*log_mgfs):
        bound = (num_times * log_mgf_value +
                 math.log(2 / tail_mass_truncation)) / order
        if order > 0:
          upper = min(upper, math.ceil(bound))
        if order < 0:
          lower = max(lower, math.floor(bound))
    output_len = upper - lower + 1
    fast_len = scipy_fft.next_fast_len(max(output_len, len(probs)))
    convolved = np.real(scipy_fft.ifft(scipy_fft.fft(probs, fast_len)**
                                       num_times))
    output = np.array(np.roll(convolved, -lower)[:output_len])
    inf_prob = (tail_mass_truncation -
                math.expm1(num_times * math.log1p(-pmf._infinity_mass)))
    return pld_pmf.DensePLDPmf(pmf._discretization,
                               pmf._lower_loss * num_times + lower, output,
                               inf_prob, pmf._pessimistic_estimate)

  @property
  def nbytes(self) -> int:
    """The bytes of the PMFs it holds: the round's and the kept
    self-compositions'."""
    pmfs = {id(pmf): pmf for p in (self.pld, *self._composed.values())
            for pmf in (p._pmf_remove, p._pmf_add)}  # pylint: disable=protected-access
    return sum(getattr(pmf, '_probs', np.empty(0)).nbytes
               for pmf in pmfs.values())

  def self_compose(self, num_times: int, tail_mass_truncation: float = 1e-15):
    """`self.pld.self_compose(num_times)`, the same bits. The last few
    answers are kept: a ledger of several distinct rounds asks for the same
    counts of all but one of them after every round."""
    if not self._dense or num_times <= 0:
      return self.pld.self_compose(num_times, tail_mass_truncation)
    key = (num_times, tail_mass_truncation)
    found = self._composed.pop(key, None)
    if found is None:
      found = pld.privacy_loss_distribution.PrivacyLossDistribution(*[
          self._self_compose_pmf(pmf, log_mgfs, num_times,
                                 tail_mass_truncation)
          for pmf, log_mgfs in self._pmfs])
    self._composed[key] = found
    while len(self._composed) > _COMPOSED_KEPT:
      self._composed.pop(next(iter(self._composed)))
    return found


def pmf_epsilon(pmf, delta: float):
  """`pmf.get_epsilon_for_delta(delta)` of a `DensePLDPmf`, the same bits,
  in NumPy: dp_accounting 0.4.3's `_get_epsilon_for_delta` walks the losses
  from the largest down in Python. Its running sums are sequential
  cumulative sums here, its losses `itertools.count`'s repeated additions,
  each exp(-loss) `math.exp`'s; where the stopping test's NumPy logarithm is
  within 1e-9 of the loss, the test is redone with `math.log`. Anything
  else (an overflow, a zero mass) is left to dp_accounting.

  The walk stops soon after the mass above the loss exceeds delta, and
  every sum it reads is of the losses before its stop: they are computed
  for a prefix of the losses (twice what the mass above delta needs),
  longer only where the walk goes on (the same values as over them all)."""
  # pylint: disable=protected-access
  if type(pmf) is not pld_pmf.DensePLDPmf:  # pylint: disable=unidiomatic-typecheck
    return pmf.get_epsilon_for_delta(delta)  # Sparse: no `_probs`.
  probs, infinity_mass = pmf._probs, pmf._infinity_mass
  size = len(probs)
  if (infinity_mass > delta or size == 0 or
      np.asarray(probs).dtype != np.float64):
    return pmf.get_epsilon_for_delta(delta)
  steps = np.full(size, -pmf._discretization, np.float64)
  steps[0] = (pmf._lower_loss + size - 1) * pmf._discretization
  reversed_probs = np.flip(probs)
  # The walk cannot stop before the mass above the loss exceeds delta.
  above = np.flatnonzero(np.cumsum(reversed_probs) > delta - infinity_mass)
  length = size if not above.size else min(size, max(1024, 2 * int(above[0])))
  while True:
    found = _walk(steps[:length], reversed_probs[:length], infinity_mass,
                  delta, length == size)
    if found is not None:
      break
    length = min(size, 2 * length)
  return pmf.get_epsilon_for_delta(delta) if found is _OURS_FAIL else found


_OURS_FAIL = object()  # `_walk`: dp_accounting's own answer is needed.


def _walk(steps, reversed_probs, infinity_mass, delta, complete):
  """`pmf_epsilon`'s walk over the first len(`steps`) losses (largest
  first; `complete`: all of them): its epsilon, `_OURS_FAIL`, or None
  where it goes past them."""
  size = len(steps)
  losses = np.cumsum(steps)
  try:
    exps = np.fromiter(map(math.exp, (-losses).tolist()), np.float64, size)
  except OverflowError:
    return _OURS_FAIL
  # Before the loss at k is taken in: upper[k], lower[k].
  upper = np.cumsum(np.concatenate(([infinity_mass], reversed_probs)))
  lower = np.cumsum(np.concatenate(([0.0], exps * reversed_probs)))
  with np.errstate(all='ignore'):
    valid = (upper[:size] > delta) & (lower[:size] > 0)
    margin = np.log((upper[:size] - delta) / lower[:size]) - losses
  tolerance = 1e-9 * (1 + np.abs(losses))
  sure = np.flatnonzero(valid & (margin > tolerance))
  stop = int(sure[0]) if sure.size else size
  unsure = np.abs(margin[:stop]) <= tolerance[:stop]
  for k in np.flatnonzero(valid[:stop] & unsure):
    if math.log((upper[k] - delta) / lower[k]) >= losses[k]:
      stop = int(k)
      break
  # dp_accounting returns max(0, loss) once the mass above delta has no
  # lower mass (exp(-loss) rounded to 0), before any later stop.
  zero = np.flatnonzero((upper[1:stop + 1] >= delta) & (lower[1:stop + 1] == 0))
  if zero.size:
    return max(0, losses[int(zero[0])])
  if stop == size and not complete:
    return None
  mass_upper, mass_lower = upper[stop], lower[stop]
  if mass_upper <= mass_lower + delta:
    return 0
  if mass_lower == 0:
    return _OURS_FAIL
  return math.log((mass_upper - delta) / mass_lower)


def pld_epsilon(privacy_loss_distribution, delta: float):
  """`PrivacyLossDistribution.get_epsilon_for_delta`, by `pmf_epsilon`."""
  # pylint: disable=protected-access
  epsilon = pmf_epsilon(privacy_loss_distribution._pmf_remove, delta)
  if privacy_loss_distribution._symmetric:
    return epsilon
  return max(epsilon,
             pmf_epsilon(privacy_loss_distribution._pmf_add, delta))


def _prefix_to_truncate(probs: np.ndarray, threshold: float) -> int:
  """dp_accounting 0.4.3's `_find_prefix_to_truncate`: the first index at
  which the running sum exceeds `threshold` (its length if none). NumPy's
  cumulative sum adds in the same order, in the same float64, as its loop."""
  above = np.flatnonzero(np.cumsum(probs) > threshold)
  return int(above[0]) if above.size else len(probs)


def _truncate_tails(probs, tail_mass_truncation: float,
                    pessimistic_estimate: bool):
  """dp_accounting 0.4.3's `pld_pmf._truncate_tails`, by `_prefix_to_truncate`."""
  if tail_mass_truncation == 0:
    return 0, probs, 0
  left = _prefix_to_truncate(probs, tail_mass_truncation / 2)
  right = len(probs) - _prefix_to_truncate(np.flip(probs),
                                           tail_mass_truncation / 2)
  right = max(right, left + 1)
  left_mass, right_mass = np.sum(probs[:left]), np.sum(probs[right:])
  truncated = probs[left:right]
  if pessimistic_estimate:
    truncated[0] += left_mass
    return left, truncated, right_mass
  truncated[-1] += right_mass
  return left, truncated, 0


def _compose_pmfs(first, second, tail_mass_truncation: float):
  """`pld_pmf.compose_pmfs(first, second, tail_mass_truncation)`."""
  # pylint: disable=protected-access
  if (isinstance(first, pld_pmf.SparsePLDPmf) and
      isinstance(second, pld_pmf.SparsePLDPmf) and
      first.size * second.size <= pld_pmf._MAX_PMF_SPARSE_SIZE):
    return first.compose(second, tail_mass_truncation)
  first, second = first.to_dense_pmf(), second.to_dense_pmf()
  first.validate_composable(second)
  probs = signal.fftconvolve(first._probs, second._probs)
  infinity_mass = (first._infinity_mass + second._infinity_mass -
                   first._infinity_mass * second._infinity_mass)
  offset, probs, right_tail = _truncate_tails(
      probs, tail_mass_truncation, first._pessimistic_estimate)
  return pld_pmf.DensePLDPmf(
      first._discretization, first._lower_loss + second._lower_loss + offset,
      probs, infinity_mass + right_tail, first._pessimistic_estimate)


def compose(first, second, tail_mass_truncation: float = 1e-15):
  """`first.compose(second)` of two `PrivacyLossDistribution`s."""
  # pylint: disable=protected-access
  remove = _compose_pmfs(first._pmf_remove, second._pmf_remove,
                         tail_mass_truncation)
  if first._symmetric and second._symmetric:
    return pld.privacy_loss_distribution.PrivacyLossDistribution(remove)
  return pld.privacy_loss_distribution.PrivacyLossDistribution(
      remove, _compose_pmfs(first._pmf_add, second._pmf_add,
                            tail_mass_truncation))
