"""Epsilon of DP federated training, from dp_accounting DpEvents.

One round of DP federated averaging is

    PoissonSampledDpEvent(q, GaussianDpEvent(z))                # 'poisson'
    SampledWithoutReplacementDpEvent(K, n, GaussianDpEvent(z))  # 'fixed_size'

and training the composition of its rounds (`training_event`, or what a
`tff_clip.privacy.privacy_ledger.PrivacyLedger` recorded): epsilon always comes from
such events, never from a separate formula. z (`noise_multiplier`) is the
noise std over C, the L2 bound of ONE client's update, for noise
N(0, (z C)^2 I) on the SUM of the cohort's updates (as `tff_clip.aggregation.dp` and
TFF; Pelikan et al. 2025's noise on the average is sigma_DP = z / n); n
`clients_per_round`, K `population_size`, q = n / K. User-level DP.

  * 'poisson': add-or-remove-one adjacency. RDP (Mironov, Talwar, Zhang
    2019; Canonne, Kamath, Steinke 2020, Prop. 12) and PLD (Doroshenko et
    al. 2022, pessimistic: an upper bound on every grid).
  * 'fixed_size': replace-one adjacency (Wang, Balle, Kasiviswanathan 2019,
    Thm. 27). Replacing a client moves the clipped sum by 2C, so RDP is
    given z / 2: dp_accounting 0.4.3 leaves this factor out
    (google/differential-privacy#378; tests/test_accounting.py pins it). No
    PLD exists for it (`UnsupportedEventError`), and the two kinds of rounds
    are never composed (ValueError).
  * z = 0: epsilon = inf for every delta.

PLD grid (`value_discretization_interval=None`): 1e-4 x the RDP epsilon, in
[1e-6, 100], refined to 1e-4 x the PLD epsilon when that is much smaller
(dp_accounting's fixed 1e-4 overstates epsilon ~ 0.1 by a few percent and is
slow at epsilon ~ 5; this grid overstates by ~0.1%, measured). No TensorFlow
import: `python -m scripts.accountant` answers in a second.

References:
* Pelikan et al. 2025: "Enabling Differentially Private Federated
  Learning for Speech Recognition", NeurIPS 2025.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Optional, Union

import dp_accounting
import numpy as np

from tff_clip import checks
from tff_clip.privacy import accountants
from tff_clip.privacy import rdp_floor

__all__ = [
    'ACCOUNTANTS', 'DEFAULT_EXTRAPOLATION_SCALES', 'ExtrapolationRow',
    'FIXED_SIZE', 'MIN_SEPARATION', 'PLD', 'POISSON', 'PrivacyGuarantee',
    'MIN_NOISE_MULTIPLIER', 'RDP', 'RDP_ORDERS',
    'SAMPLINGS', 'calibrate_noise_multiplier', 'compute_epsilon',
    'compute_training_epsilon', 'extrapolate_population',
    'gaussian_round_event', 'round_event', 'training_event',
    'min_separation_round_event', 'correlated_training_event',
    'calibrate_correlated_noise_multiplier',
    'calibrate_mechanism_noise_multiplier', 'report_epsilon',
    'reporting_accountant',
]

from tff_clip.aggregation import mechanisms  # pylint: disable=g-bad-import-order,wrong-import-position
from tff_clip.names import ACCOUNTANTS, FIXED_SIZE, MIN_SEPARATION, PLD, POISSON, RDP, SAMPLINGS  # pylint: disable=g-bad-import-order,wrong-import-position

# (cohort scale, population scale): q fixed and n growing, then n fixed and K
# growing, as in Pelikan et al. 2025's Table 1.
# The guarantee and the orders, from `tff_clip.privacy.accountants`.
PrivacyGuarantee = accountants.PrivacyGuarantee
RDP_ORDERS = accountants.RDP_ORDERS
DEFAULT_EXTRAPOLATION_SCALES = ((1, 1), (10, 10), (100, 100), (100, 1000),
                                (100, 10000))

# Calibration searches noise multipliers in about [2**-10, 2**20].
_MIN_NOISE_MULTIPLIER, _MAX_NOISE_MULTIPLIER = 2.0**-10, 2.0**20
# The least z calibration returns (where every z meets the target).
MIN_NOISE_MULTIPLIER = _MIN_NOISE_MULTIPLIER


# ---------------------------------------------------------------------------
# Argument checks: `tff_clip.checks`' rules (TypeError for a value of the
# wrong type, ValueError for one out of range), naming the argument, in the
# float64 the accountants compute in.


def _integer(value, name: str, minimum: int = 1) -> int:
  return checks.integer(value, name, minimum=minimum)


def _positive(value, name: str) -> float:
  return checks.positive_float(value, name, np.float64)


def _delta(value) -> float:
  return checks.delta(value)


def _noise_multiplier(value, name: str = 'noise_multiplier') -> float:
  """z = 0 (no noise), or a z training can add: a normal float32.

  Below float32's smallest normal TensorFlow adds no noise (and the
  accountants divide by z^2: 1e-300 is a ZeroDivisionError); above its
  largest, z^2 overflows the accountants' float64.
  """
  z = checks.nonnegative_float(value, name, np.float32)
  if z > 0:
    checks.normal_float(z, name)
  return z


def _cohort(clients_per_round, population_size,
            sampling: str) -> tuple[Union[int, float], int]:
  """n and K checked (n an int for fixed-size sampling, 100.0 accepted)."""
  population_size = _integer(population_size, 'population_size')
  if sampling == FIXED_SIZE:
    if (isinstance(clients_per_round, numbers.Real) and
        not isinstance(clients_per_round, bool) and
        float(clients_per_round).is_integer()):
      clients_per_round = int(clients_per_round)
    clients_per_round = _integer(clients_per_round, 'clients_per_round')
  else:
    clients_per_round = _positive(clients_per_round, 'clients_per_round')
  if clients_per_round > population_size:
    raise ValueError(
        f'`clients_per_round` ({clients_per_round:g}) must be <= '
        f'`population_size` ({population_size}): the sampling rate '
        'q = clients_per_round / population_size must be in (0, 1].')
  return clients_per_round, population_size


def _check_event(event, name: str = 'event') -> None:
  """Refuses events with parameters no accountant may be given."""
  if not isinstance(event, dp_accounting.DpEvent):
    raise TypeError(
        f'`{name}` must be a dp_accounting.DpEvent; got {type(event)}.')
  if isinstance(event, dp_accounting.GaussianDpEvent):
    _noise_multiplier(event.noise_multiplier)
  elif isinstance(event, dp_accounting.LaplaceDpEvent):
    # RDP read -1 as a Laplace of scale 1 and NaN as epsilon 0.
    checks.positive_float(event.noise_multiplier, 'laplace noise_multiplier',
                          np.float64)
  elif isinstance(event, dp_accounting.PoissonSampledDpEvent):
    checks.probability(event.sampling_probability, 'sampling_probability',
                       high_open=False)
  elif isinstance(event, dp_accounting.SampledWithoutReplacementDpEvent):
    _cohort(event.sample_size, event.source_dataset_size, FIXED_SIZE)
  elif isinstance(event, dp_accounting.SelfComposedDpEvent):
    _integer(event.count, 'count', minimum=0)
  for sub_event in accountants.sub_events(event):
    _check_event(sub_event, name)


# ---------------------------------------------------------------------------
# The events of a training run.


def round_event(noise_event: dp_accounting.DpEvent,
                clients_per_round: Union[int, float],
                population_size: int,
                sampling: str = POISSON) -> dp_accounting.DpEvent:
  """`PoissonSampledDpEvent(n / K, noise_event)` or, for `'fixed_size'`
  sampling, `SampledWithoutReplacementDpEvent(K, n, noise_event)`.

  `noise_event` is what the aggregator released about the cohort, e.g. a DP
  aggregator state's event (`tff_clip.aggregation.dp.extract_dp_event`); n is the
  expected cohort under Poisson sampling (may be fractional).
  """
  _check_event(noise_event, 'noise_event')
  sampling = checks.one_of(sampling, 'sampling', SAMPLINGS)
  if sampling == MIN_SEPARATION:
    raise ValueError("`sampling`: 'min_separation' rounds are recorded with "
                     '`min_separation_round_event` (they depend on the '
                     'round number).')
  clients_per_round, population_size = _cohort(clients_per_round,
                                               population_size, sampling)
  if sampling == POISSON:
    return dp_accounting.PoissonSampledDpEvent(
        clients_per_round / population_size, noise_event)
  return dp_accounting.SampledWithoutReplacementDpEvent(
      population_size, clients_per_round, noise_event)


def gaussian_round_event(noise_multiplier: float,
                         clients_per_round: Union[int, float],
                         population_size: int,
                         sampling: str = POISSON) -> dp_accounting.DpEvent:
  """`round_event(GaussianDpEvent(noise_multiplier), ...)`."""
  return round_event(
      dp_accounting.GaussianDpEvent(_noise_multiplier(noise_multiplier)),
      clients_per_round, population_size, sampling)


def training_event(noise_multiplier: float,
                   clients_per_round: Union[int, float],
                   population_size: int,
                   rounds: int,
                   sampling: str = POISSON) -> dp_accounting.DpEvent:
  """`rounds` identical rounds: `SelfComposedDpEvent(gaussian_round_event)`."""
  rounds = checks.rounds(rounds)
  return dp_accounting.SelfComposedDpEvent(
      gaussian_round_event(noise_multiplier, clients_per_round,
                           population_size, sampling), rounds)


def min_separation_round_event(noise_event: dp_accounting.DpEvent,
                               round_num: int,
                               separation: int) -> dp_accounting.DpEvent:
  """Round `round_num` under participation with minimum separation b;
  `round_num` counts from 0 (the program's round r is r - 1): counted from
  1, rounds 1..T would charge floor(T / b) cycles where a client can take
  part in ceil(T / b).

  A client takes part at most once in each cycle of b rounds
  (`tff_clip.privacy.sampling`), so each cycle is charged `noise_event` -- ONE
  participation (`NoiseMechanism.participation_event`) -- at its
  first round, and its other rounds `NoOpDpEvent`: after T rounds the ledger
  composes k = ceil(T / b) participations, with no amplification.
  """
  _check_event(noise_event, 'noise_event')
  round_num = _integer(round_num, 'round_num', minimum=0)
  separation = _integer(separation, 'separation')
  if round_num % separation == 0:
    return noise_event
  return dp_accounting.NoOpDpEvent()


def correlated_training_event(noise_mechanism: str, noise_multiplier: float,
                              bands: int, rounds: int, separation: int,
                              **options) -> dp_accounting.DpEvent:
  """T rounds with separation b: k = ceil(T / b) participation events.

  The mechanism's own `training_event` (`tff_clip.aggregation.noise_mechanisms`), the
  events its query records: banded, k Gaussians with z / max_j ||C e_j||
  (one Gaussian with z / (sqrt(k) max_j ||C e_j||), Choquette-Choo et al.
  2023); tree, k restarted trees (tensorflow-privacy's
  `compute_rdp_tree_restart`); BLT (at most `blt_buffers` buffers, an
  option), k Gaussians with z sqrt(k) / sens(C), i.e. one with z / sens(C);
  independent, k Gaussians. `options`: the mechanism's own
  (`NoiseMechanism.options`).
  """
  noise_multiplier = _noise_multiplier(noise_multiplier)
  mechanism = mechanisms.noise_mechanism(
      noise_mechanism, bands, rounds=checks.rounds(rounds),
      separation=_integer(separation, 'separation'), **options)
  return mechanism.training_event(noise_multiplier)


# ---------------------------------------------------------------------------
# Epsilon.


def compute_epsilon(
    event: dp_accounting.DpEvent,
    delta: float,
    accountant: str = RDP,
    value_discretization_interval: Optional[float] = None) -> PrivacyGuarantee:
  """The (epsilon, delta) guarantee of everything `event` describes.

  `value_discretization_interval`: the PLD grid (None: the relative grid).
  Raises ValueError for a bad argument or mixed Poisson and fixed-size
  rounds, `dp_accounting.UnsupportedEventError` if the accountant cannot
  account for the event (e.g. PLD with fixed-size sampling).
  """
  _check_event(event)
  delta = _delta(delta)
  accountant = checks.one_of(accountant, 'accountant', ACCOUNTANTS)
  grid = (None if value_discretization_interval is None else
          _positive(value_discretization_interval, 'value_discretization_interval'))
  relation = accountants.neighboring_relation(event)
  return accountants.guarantee(accountants.accounting_view(event, relation), relation, delta,
                    accountant, grid)


def compute_training_epsilon(
    noise_multiplier: float,
    clients_per_round: Union[int, float],
    population_size: int,
    rounds: int,
    delta: float,
    sampling: str = POISSON,
    accountant: str = RDP,
    value_discretization_interval: Optional[float] = None) -> PrivacyGuarantee:
  """`compute_epsilon(training_event(z, n, K, rounds, sampling), delta, ...)`.

  z = 0 gives epsilon = inf; n is the expected cohort for Poisson sampling.
  """
  delta = _delta(delta)
  event = training_event(noise_multiplier, clients_per_round, population_size,
                         rounds, sampling)
  return compute_epsilon(event, delta, accountant,
                         value_discretization_interval)


def reporting_accountant(event: dp_accounting.DpEvent) -> str:
  """The accountant a run reports and calibrates `event` with: PLD wherever
  it can account for it (Poisson sampling, minimum separation with Gaussian
  noise), RDP otherwise (fixed-size sampling, tree restarts)."""
  _check_event(event)
  relation = accountants.neighboring_relation(event)
  return accountants.reporting_accountant(
      accountants.accounting_view(event, relation), relation)


def report_epsilon(event: dp_accounting.DpEvent,
                   delta: float) -> PrivacyGuarantee:
  """`compute_epsilon(event, delta, reporting_accountant(event))`: the one
  figure a run shows everywhere (its `accountant` names it).

  Where PLD refuses the events' grid (an epsilon above
  `accountants.PLD_MAX_EPSILON`, a void guarantee whose grid would not fit
  in memory) RDP's figure is reported, so a round once released always has
  an epsilon; so it is where PLD's is infinite but RDP's is not: PLD counts
  the mass it truncates (1e-15 a composition) as an infinite loss, so below
  a delta of about 1e-15 (more with many distinct rounds) it proves nothing
  of a noisy run that RDP proves private.
  """
  accountant = reporting_accountant(event)
  try:
    found = compute_epsilon(event, delta, accountant)
  except dp_accounting.UnsupportedEventError:
    if accountant == RDP:
      raise
    return compute_epsilon(event, delta, RDP)
  if accountant == PLD and math.isinf(found.epsilon):
    rdp = compute_epsilon(event, delta, RDP)
    if math.isfinite(rdp.epsilon):
      return rdp
  return found


def report_known(event: dp_accounting.DpEvent, delta: float) -> bool:
  """Whether `report_epsilon(event, delta)` is answered from this process's
  cache (asked before: a sweep's later trainings ask their rounds' figures
  again), so that nothing is left to compute ahead."""
  _check_event(event)
  relation = accountants.neighboring_relation(event)
  view = accountants.accounting_view(event, relation)
  return accountants.known(view, relation, _delta(delta),
                           accountants.reporting_accountant(view, relation),
                           None)


# ---------------------------------------------------------------------------
# Calibration.


def _bracket(epsilon_at, target_epsilon: float, start: float, floor: float,
             factor: float = 2.0, rdp_delta: Optional[float] = None,
             stop_at_zero: bool = False) -> tuple[float, float]:
  """(lower, upper) z with epsilon(lower) > target >= epsilon(upper).

  Steps from `start` by `factor`; (z, z) when z ~ `floor` still meets the
  target (the budget does not bind), or, with `stop_at_zero`, at the first
  z whose epsilon is 0. `rdp_delta`: `epsilon_at` is RDP's
  epsilon at this delta, so going up, a target below RDP's floor
  (`rdp_floor`) is refused at once, and the largest z is checked first
  (one cheap evaluation).
  """
  epsilon = epsilon_at(start)
  if epsilon <= target_epsilon:
    upper = start
    while upper > floor and not (stop_at_zero and epsilon == 0):
      lower = upper / factor
      epsilon = epsilon_at(lower)
      if epsilon > target_epsilon:
        return lower, upper
      upper = lower
    return upper, upper
  # Unreachable at the largest z: said after one evaluation, not twenty
  # (none below the floor: the event released something, epsilon(start) >
  # target, so its RDP epsilon is at least the floor at every z).
  epsilon = 0.0
  if rdp_delta is not None:
    rdp_floor.check_reachable(target_epsilon, rdp_delta)
    epsilon = epsilon_at(_MAX_NOISE_MULTIPLIER)
  if epsilon > target_epsilon:
    raise ValueError(
        f'`target_epsilon` = {target_epsilon!r} is unreachable: even '
        f'noise_multiplier = {_MAX_NOISE_MULTIPLIER:g} gives epsilon = '
        f'{epsilon:g}.')
  lower = start
  while True:
    upper = factor * lower
    epsilon = epsilon_at(upper)
    if epsilon <= target_epsilon:
      return lower, upper
    if upper >= _MAX_NOISE_MULTIPLIER:
      raise ValueError(
          f'`target_epsilon` = {target_epsilon!r} is unreachable: even '
          f'noise_multiplier = {upper:g} gives epsilon = {epsilon:g}.')
    lower = upper


def calibrate_noise_multiplier(target_epsilon: float,
                               clients_per_round: Union[int, float],
                               population_size: int,
                               rounds: int,
                               delta: float,
                               sampling: str = POISSON,
                               accountant: str = RDP,
                               tolerance: float = 1e-6,
                               value_discretization_interval: Optional[
                                   float] = None) -> float:
  """The smallest z whose `compute_training_epsilon` is <= `target_epsilon`.

  Brackets z with RDP (for PLD then with PLD on a fixed grid, so epsilon is
  smooth in z), then `dp_accounting.calibrate_dp_mechanism` (Brent's method,
  absolute `tolerance` on z). PLD takes ~15 evaluations (~0.6 s at epsilon
  3, 100 rounds). PLD grid: `value_discretization_interval`, or 1e-4 x target for the
  search and `compute_epsilon`'s for the check. Returns z ~ 2**-10 if that
  meets the target; ValueError if z = 2**20 does not (at once if the target
  is below RDP's floor at `delta`, `tff_clip.privacy.rdp_floor`).
  """
  target_epsilon = _positive(target_epsilon, 'target_epsilon')
  delta = _delta(delta)
  accountant = checks.one_of(accountant, 'accountant', ACCOUNTANTS)
  sampling = checks.one_of(sampling, 'sampling', SAMPLINGS)
  clients_per_round, population_size = _cohort(clients_per_round,
                                               population_size, sampling)
  rounds = checks.rounds(rounds)
  tolerance = _positive(tolerance, 'tolerance')
  grid = (None if value_discretization_interval is None else
          _positive(value_discretization_interval, 'value_discretization_interval'))

  relation = accountants.REPLACE_ONE if sampling == FIXED_SIZE else accountants.ADD_OR_REMOVE

  def view_for(noise_multiplier: float) -> dp_accounting.DpEvent:
    return accountants.accounting_view(training_event(
        noise_multiplier, clients_per_round, population_size, rounds,
        sampling), relation)

  return _calibrate(view_for, relation, accountant, target_epsilon, delta,
                    tolerance, grid)


def _calibrate(view_for, relation, accountant: str, target_epsilon: float,
               delta: float, tolerance: float,
               grid: Optional[float]) -> float:
  """The smallest z (to `tolerance`) whose `view_for(z)` meets the target by
  `accountant`, as `compute_epsilon` reports it (grid None: its own)."""
  if accountant == PLD:
    accountants.check_pld_supports(view_for(1.0), relation)
  lower, upper = _bracket(
      lambda z: accountants.compose(RDP, view_for(z), relation).get_epsilon(delta),
      target_epsilon, 1.0, _MIN_NOISE_MULTIPLIER, rdp_delta=delta)
  if lower == upper:
    return upper
  search_grid = grid or accountants.pld_grid(target_epsilon)

  def make_fresh_accountant():
    return accountants.new_accountant(accountant, relation, search_grid)

  if accountant == PLD:
    # PLD is usually a little below RDP: small steps down from RDP's upper
    # end (PLD gets expensive as z, hence epsilon, grows). Where PLD's epsilon
    # is 0 (e.g. q <= delta: sampling alone meets delta, at every z) that z
    # is kept: the PLDs of smaller z grow as 1/z^2 (minutes, then memory).
    lower, upper = _bracket(
        lambda z: make_fresh_accountant().compose(view_for(z)).get_epsilon(
            delta), target_epsilon, upper, upper / 64, factor=1.25,
        stop_at_zero=True)
  if lower == upper:  # Checked below on the grid reported.
    noise_multiplier = upper
  else:
    noise_multiplier = float(dp_accounting.calibrate_dp_mechanism(
        make_fresh_accountant, view_for, target_epsilon, delta,
        bracket_interval=dp_accounting.ExplicitBracketInterval(lower, upper),
        tol=tolerance))

  def reported(z: float) -> float:
    return accountants.guarantee(view_for(z), relation, delta, accountant,
                                 grid).epsilon

  # compute_epsilon's PLD grid (relative to RDP) can be coarser than the
  # search grid: make the number users will see meet the target too.
  step = tolerance
  while reported(noise_multiplier) > target_epsilon:
    noise_multiplier += step
    step *= 2
  return noise_multiplier


# ---------------------------------------------------------------------------
# Population extrapolation (McMahan et al. 2018; Pelikan et al. 2025, Table 1).


@dataclasses.dataclass(frozen=True)
class ExtrapolationRow:
  """One row: n, K, q = n / K, z = sigma_DP n, the guarantee per accountant."""
  clients_per_round: Union[int, float]
  population_size: int
  sampling_probability: float
  noise_multiplier: float
  guarantees: Mapping[str, PrivacyGuarantee]


def extrapolate_population(
    noise_multiplier: float,
    clients_per_round: Union[int, float],
    population_size: int,
    rounds: int,
    delta: float,
    scales: Iterable[tuple[float, float]] = DEFAULT_EXTRAPOLATION_SCALES,
    sampling: str = POISSON,
    accountants: Sequence[str] = (RDP,)) -> list[ExtrapolationRow]:
  """Epsilon if cohort and population were larger, same noise on the average.

  Model quality depends on C and on sigma_DP = z / n (McMahan et al. 2018,
  Sec. 3; Pelikan et al. 2025, Table 1), so a cohort n' = a n of K' = b K trains the
  same with z' = sigma_DP n'. One row per (a, b) in `scales`, each the
  `compute_training_epsilon` of (z', n', K', rounds) per accountant; K' is
  rounded, and n' too for fixed-size sampling (z' from the rounded n').
  """
  noise_multiplier = _noise_multiplier(noise_multiplier)
  sampling = checks.one_of(sampling, 'sampling', SAMPLINGS)
  clients_per_round, population_size = _cohort(clients_per_round,
                                               population_size, sampling)
  rounds = checks.rounds(rounds)
  delta = _delta(delta)
  accountants = [checks.one_of(a, 'accountant', ACCOUNTANTS) for a in accountants]
  sigma_dp = noise_multiplier / clients_per_round
  rows = []
  for pair in scales:
    if len(pair) != 2:
      raise ValueError('`scales` must be (cohort scale, population scale) '
                       f'pairs; got {pair!r}.')
    cohort_scale, population_scale = (_positive(s, 'scales') for s in pair)
    cohort = clients_per_round * cohort_scale
    if sampling == FIXED_SIZE:
      cohort = max(1, round(cohort))
    cohort, population = _cohort(
        cohort, max(1, round(population_size * population_scale)), sampling)
    guarantees = {
        a: compute_training_epsilon(sigma_dp * cohort, cohort, population,
                                    rounds, delta, sampling, a)
        for a in accountants
    }
    rows.append(ExtrapolationRow(cohort, population, cohort / population,
                                 sigma_dp * cohort, guarantees))
  return rows


def calibrate_correlated_noise_multiplier(target_epsilon: float,
                                          noise_mechanism: str,
                                          bands: int,
                                          rounds: int,
                                          separation: int,
                                          delta: float,
                                          tolerance: float = 1e-6,
                                          accountant: str = RDP,
                                          **options) -> float:
  """The smallest z whose `correlated_training_event` meets the target."""
  return calibrate_mechanism_noise_multiplier(
      target_epsilon, mechanisms.noise_mechanism(
          noise_mechanism, bands, rounds=checks.rounds(rounds),
          separation=_integer(separation, 'separation'), **options),
      delta, tolerance, accountant)


def calibrate_mechanism_noise_multiplier(target_epsilon: float, mechanism,
                                         delta: float,
                                         tolerance: float = 1e-6,
                                         accountant: str = RDP) -> float:
  """The smallest z whose `mechanism.training_event(z)` (a
  `NoiseMechanism` built with its rounds and separation) meets the target
  by `accountant` (`reporting_accountant` gives a run's)."""
  target_epsilon = _positive(target_epsilon, 'target_epsilon')
  delta = _delta(delta)
  accountant = checks.one_of(accountant, 'accountant', ACCOUNTANTS)
  tolerance = _positive(tolerance, 'tolerance')
  mechanism.training_event(1.0)

  def view_for(noise_multiplier: float) -> dp_accounting.DpEvent:
    return accountants.accounting_view(mechanism.training_event(
        _noise_multiplier(noise_multiplier)), accountants.ADD_OR_REMOVE)

  return _calibrate(view_for, accountants.ADD_OR_REMOVE, accountant,
                    target_epsilon, delta, tolerance, None)
