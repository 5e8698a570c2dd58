"""The privacy ledger: (epsilon, delta) of federated training from its DpEvents.

What happened is described declaratively with `dp_accounting.DpEvent`s and
accountants interpret it (the dp_accounting model). One round of DP federated
averaging is

    PoissonSampledDpEvent(q, GaussianDpEvent(z))      # sampling='poisson'
    SampledWithoutReplacementDpEvent(K, n, GaussianDpEvent(z))
                                                      # sampling='fixed_size'

and training is the composition of its rounds (`SelfComposedDpEvent` for
identical rounds, `ComposedDpEvent` otherwise). Epsilon is ALWAYS computed by
an accountant from such events -- the events a `PrivacyLedger` recorded, or
the events that `training_event` says a training run with fixed parameters
would record -- never from a separate formula.

Notation (units in the names, as everywhere in tff_clip):
  * `noise_multiplier` z: noise std / C, where C is the L2 bound of ONE
    client's (clipped) update, and the Gaussian noise N(0, (z C)^2 I) is added
    to the SUM of the cohort's updates. This is the convention of
    `dp_accounting.GaussianDpEvent`,
    `tff.aggregators.DifferentiallyPrivateFactory` and `tff_clip.dp`. Seed 002 (Pelikan et al., NeurIPS 2025, Theorem 1 after
    McMahan et al. 2018) writes the noise on the average as sigma_DP, so
    z = sigma_DP * n.
  * `clients_per_round` n and `population_size` K, q = n / K.

What each number means (user-level DP: adjacent datasets differ in ALL the
data of one client):
  * sampling='poisson': every one of the K clients joins each round
    independently with probability q (n is the EXPECTED cohort size and may be
    fractional). Adjacency: add-or-remove one client. Both accountants apply:
      - RDP: Renyi DP of the sampled Gaussian mechanism (Mironov, Talwar, Zhang
        2019, arXiv:1908.10530; the moments accountant of Abadi et al. 2016),
        converted to (epsilon, delta) with Canonne, Kamath, Steinke 2020
        (Prop. 12 of arXiv:2004.00010) and minimised over the RDP orders; the
        minimising order is reported as `rdp_order`. RDP values below
        2 delta^2 are raised to it, so that floating-point rounding can never
        trigger dp_accounting's epsilon = 0 shortcut (`_epsilon_from_rdp`).
      - PLD: privacy loss distributions (Koskela et al. 2020; Doroshenko et
        al., "Connect the Dots", PETS 2022) with pessimistic discretisation,
        so epsilon is an upper bound for every grid; usually the tighter one.
  * sampling='fixed_size': exactly n distinct clients drawn uniformly without
    replacement from exactly K (K is public). Adjacency: REPLACE one client
    (substitution), the only relation for which amplification by sampling
    without replacement is analysed (Wang, Balle, Kasiviswanathan, AISTATS
    2019, Theorem 27). Under replace-one the L2 sensitivity of the clipped
    sum is 2C, not C, so the RDP accountant is given noise multiplier z / 2:
    dp_accounting 0.4.3 passes `GaussianDpEvent.noise_multiplier` (defined
    as s / C) straight into a formula normalised by the sensitivity, which
    would understate RDP by a factor of 4 (google/differential-privacy#378).
    A replace-one epsilon is NOT comparable to an add-or-remove one: an
    add-or-remove (eps, delta) guarantee implies only a replace-one
    (2 eps, (1 + e^eps) delta) one.
      - RDP: supported as above. (If a later dp-accounting fixes #378
        upstream, this halving must go, or it would be applied twice --
        conservative, but loose; tests/test_accounting.py pins the behaviour.)
      - PLD: dp_accounting has no PLD for sampling without replacement;
        `dp_accounting.UnsupportedEventError` is raised (never a silent
        fallback to a smaller number).
    TFF's `tff.simulation.build_uniform_sampling_fn(replace=False)` and any
    loop drawing `clients_per_round` distinct ids per round do fixed-size
    sampling; McMahan et al. 2018 and seed 002 analyse Poisson sampling.
    Rounds of the two kinds cannot be composed in one ledger (ValueError).
  * noise_multiplier = 0 (no noise): epsilon = inf for every delta. (With
    q < 1 a (0, q)-DP statement would hold, but no finite epsilon holds for
    delta < q, and inf is the conservative report.)

PLD discretisation: `value_discretization_interval=None` (the default) uses
a grid relative to the size of epsilon: 1e-4 times the RDP epsilon of the
same events, clamped to [1e-6, 100], and once more 1e-4 times the PLD
epsilon when that is much smaller (RDP is loose for small epsilons).
dp_accounting's fixed default of 1e-4 overstates epsilon ~ 0.1 by a few
percent and takes ~1 s for epsilon ~ 5 over thousands of rounds; the
relative grid keeps the overstatement around 0.1% (measured) and 5000 rounds
well under a second. The discretisation is pessimistic: a coarser grid can
only overstate epsilon, never understate it.

Population extrapolation (McMahan et al. 2018, Section 3; seed 002, Table 1):
the utility of training depends on the noise on the average, sigma_DP = z / n,
and on the clip norm C; holding both fixed while scaling the cohort n and the
population K gives z' = sigma_DP * n', q' = n' / K', and a smaller epsilon
for the same model quality (assuming, as those papers do, that the training
dynamics are unchanged). See `extrapolate_population`.

This module imports no TensorFlow: it is used by the fast CLI
`python -m scripts.accountant`.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Callable, Optional, Union

import attr
import dp_accounting
from dp_accounting import dp_event as dp_event_lib
from dp_accounting import pld
from dp_accounting import rdp
from dp_accounting.rdp import rdp_privacy_accountant
import numpy as np

__all__ = [
    'ACCOUNTANTS',
    'DEFAULT_EXTRAPOLATION_SCALES',
    'ExtrapolationRow',
    'FIXED_SIZE',
    'PLD',
    'POISSON',
    'PrivacyGuarantee',
    'PrivacyLedger',
    'RDP',
    'RDP_ORDERS',
    'SAMPLINGS',
    'calibrate_noise_multiplier',
    'compute_epsilon',
    'compute_training_epsilon',
    'event_from_dict',
    'event_to_dict',
    'extrapolate_population',
    'format_extrapolation_table',
    'gaussian_round_event',
    'round_event',
    'training_event',
]

from tff_clip.names import ACCOUNTANTS, FIXED_SIZE, PLD, POISSON, RDP, SAMPLINGS  # pylint: disable=g-bad-import-order,wrong-import-position

# The Renyi orders the RDP accountant minimises over: dp_accounting's
# defaults (1.1 ... 10.9, 11 ... 63, 128, 256, 512, 1024).
RDP_ORDERS = tuple(rdp_privacy_accountant.DEFAULT_RDP_ORDERS)

# (cohort scale, population scale) pairs: first q fixed and n growing (z
# grows with n), then n fixed and K growing (q shrinks), as in seed 002's
# Table 1.
DEFAULT_EXTRAPOLATION_SCALES = ((1, 1), (10, 10), (100, 100), (100, 1000),
                                (100, 10000))

_ADD_OR_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
_REPLACE_ONE = dp_accounting.NeighboringRelation.REPLACE_ONE

_ADJACENCY_NAMES = {
    _ADD_OR_REMOVE: 'add-or-remove-one client',
    _REPLACE_ONE: 'replace-one client',
}

# Relative PLD grid: value_discretization_interval = factor * RDP epsilon.
_PLD_RELATIVE_GRID = 1e-4
_PLD_MIN_GRID = 1e-6
# Beyond ~700, dp_accounting's connect-the-dots construction overflows
# (expm1 of the interval); epsilon is then in the millions anyway.
_PLD_MAX_GRID = 100.0

# Calibration searches noise multipliers in about [2**-10, 2**20].
_MIN_NOISE_MULTIPLIER = 2.0**-10
_MAX_NOISE_MULTIPLIER = 2.0**20

_LEDGER_FORMAT = 'tff_clip.accounting.PrivacyLedger'
_LEDGER_VERSION = 1


# ---------------------------------------------------------------------------
# Argument checks: every message names the argument.


def _check_positive_int(value, name: str) -> int:
  if (isinstance(value, bool) or not isinstance(value, numbers.Integral) or
      value <= 0):
    raise ValueError(f'`{name}` must be a positive integer; got {value!r}.')
  return int(value)


def _check_non_negative_int(value, name: str) -> int:
  if (isinstance(value, bool) or not isinstance(value, numbers.Integral) or
      value < 0):
    raise ValueError(
        f'`{name}` must be a non-negative integer; got {value!r}.')
  return int(value)


def _check_real(value, name: str) -> float:
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise ValueError(f'`{name}` must be a real number; got {value!r}.')
  return float(value)


def _check_noise_multiplier(value, name: str = 'noise_multiplier') -> float:
  value = _check_real(value, name)
  if not (math.isfinite(value) and value >= 0):
    raise ValueError(f'`{name}` must be finite and >= 0; got {value!r}.')
  return value


def _check_delta(value, name: str = 'delta') -> float:
  value = _check_real(value, name)
  if not 0 < value < 1:
    raise ValueError(f'`{name}` must be in (0, 1); got {value!r}.')
  return value


def _check_sampling(sampling) -> str:
  if sampling not in SAMPLINGS:
    raise ValueError(
        f'`sampling` must be one of {SAMPLINGS}; got {sampling!r}.')
  return sampling


def _check_accountant(accountant) -> str:
  if accountant not in ACCOUNTANTS:
    raise ValueError(
        f'`accountant` must be one of {ACCOUNTANTS}; got {accountant!r}.')
  return accountant


def _check_value_discretization_interval(value) -> Optional[float]:
  if value is None:
    return None
  value = _check_real(value, 'value_discretization_interval')
  if not (math.isfinite(value) and value > 0):
    raise ValueError('`value_discretization_interval` must be finite and > 0; '
                     f'got {value!r}.')
  return value


def _check_cohort(clients_per_round, population_size,
                  sampling: str) -> tuple[Union[int, float], int]:
  """Checks n and K; returns them (n an int for fixed-size sampling)."""
  population_size = _check_positive_int(population_size, 'population_size')
  if sampling == FIXED_SIZE:
    # A fixed-size cohort is a whole number of clients; 100.0 is accepted.
    if (isinstance(clients_per_round, numbers.Real) and
        not isinstance(clients_per_round, bool) and
        float(clients_per_round).is_integer()):
      clients_per_round = int(clients_per_round)
    clients_per_round = _check_positive_int(clients_per_round,
                                            'clients_per_round')
  else:
    clients_per_round = _check_real(clients_per_round, 'clients_per_round')
    if not (math.isfinite(clients_per_round) and clients_per_round > 0):
      raise ValueError(
          '`clients_per_round` must be > 0 (the expected cohort size under '
          f'Poisson sampling); got {clients_per_round!r}.')
  if clients_per_round > population_size:
    raise ValueError(
        f'`clients_per_round` ({clients_per_round:g}) must be <= '
        f'`population_size` ({population_size}): the sampling rate '
        'q = clients_per_round / population_size must be in (0, 1].')
  return clients_per_round, population_size


def _check_event(event, name: str = 'event') -> None:
  """Checks the parameters of the events this module builds or reads."""
  if not isinstance(event, dp_accounting.DpEvent):
    raise TypeError(
        f'`{name}` must be a dp_accounting.DpEvent; got {type(event)}.')
  if isinstance(event, dp_accounting.GaussianDpEvent):
    _check_noise_multiplier(event.noise_multiplier, 'noise_multiplier')
  elif isinstance(event, dp_accounting.PoissonSampledDpEvent):
    q = _check_real(event.sampling_probability, 'sampling_probability')
    if not 0 < q <= 1:
      raise ValueError(
          f'`sampling_probability` must be in (0, 1]; got {q!r}.')
    _check_event(event.event, name)
  elif isinstance(event, dp_accounting.SampledWithoutReplacementDpEvent):
    _check_cohort(event.sample_size, event.source_dataset_size, FIXED_SIZE)
    _check_event(event.event, name)
  elif isinstance(event, dp_accounting.SelfComposedDpEvent):
    _check_non_negative_int(event.count, 'count')
    _check_event(event.event, name)
  elif isinstance(event, dp_accounting.ComposedDpEvent):
    for sub_event in event.events:
      _check_event(sub_event, name)


# ---------------------------------------------------------------------------
# Building the events of a training run.


def round_event(noise_event: dp_accounting.DpEvent,
                clients_per_round: Union[int, float],
                population_size: int,
                sampling: str = POISSON) -> dp_accounting.DpEvent:
  """The `DpEvent` of one round: the cohort's sampling around `noise_event`.

  Args:
    noise_event: What the aggregator released about the sampled cohort, e.g.
      `GaussianDpEvent(z)`, or the event of a DP aggregator's state
      (`tff.aggregators.differential_privacy.extract_dp_event_from_state`,
      `tff_clip.dp.extract_dp_event`), which may be a `ComposedDpEvent` of
      Gaussians (adaptive clipping).
    clients_per_round: n; the expected cohort size for Poisson sampling (may
      be fractional), the exact one for fixed-size sampling.
    population_size: K, the number of clients sampled from.
    sampling: `'poisson'` or `'fixed_size'` -- the sampling the training loop
      actually uses (see the module docstring for what each one means).

  Returns:
    `PoissonSampledDpEvent(n / K, noise_event)` or
    `SampledWithoutReplacementDpEvent(K, n, noise_event)`.
  """
  _check_event(noise_event, 'noise_event')
  sampling = _check_sampling(sampling)
  clients_per_round, population_size = _check_cohort(clients_per_round,
                                                     population_size, sampling)
  if sampling == POISSON:
    return dp_accounting.PoissonSampledDpEvent(
        sampling_probability=clients_per_round / population_size,
        event=noise_event)
  return dp_accounting.SampledWithoutReplacementDpEvent(
      source_dataset_size=population_size,
      sample_size=clients_per_round,
      event=noise_event)


def gaussian_round_event(noise_multiplier: float,
                         clients_per_round: Union[int, float],
                         population_size: int,
                         sampling: str = POISSON) -> dp_accounting.DpEvent:
  """One round of sampled Gaussian noise: `round_event(GaussianDpEvent(z))`."""
  noise_multiplier = _check_noise_multiplier(noise_multiplier)
  return round_event(
      dp_accounting.GaussianDpEvent(noise_multiplier), clients_per_round,
      population_size, sampling)


def training_event(noise_multiplier: float,
                   clients_per_round: Union[int, float],
                   population_size: int,
                   rounds: int,
                   sampling: str = POISSON) -> dp_accounting.DpEvent:
  """`rounds` identical rounds: `SelfComposedDpEvent(gaussian_round_event)`."""
  rounds = _check_positive_int(rounds, 'rounds')
  return dp_accounting.SelfComposedDpEvent(
      gaussian_round_event(noise_multiplier, clients_per_round,
                           population_size, sampling), rounds)


# ---------------------------------------------------------------------------
# Interpreting events: from what happened to what dp_accounting computes.


def _sampling_kinds(event: dp_accounting.DpEvent) -> set[type]:
  if isinstance(event, (dp_accounting.PoissonSampledDpEvent,
                        dp_accounting.SampledWithoutReplacementDpEvent,
                        dp_accounting.SampledWithReplacementDpEvent)):
    return {type(event)} | _sampling_kinds(event.event)
  if isinstance(event, dp_accounting.SelfComposedDpEvent):
    return _sampling_kinds(event.event)
  if isinstance(event, dp_accounting.ComposedDpEvent):
    kinds = set()
    for sub_event in event.events:
      kinds |= _sampling_kinds(sub_event)
    return kinds
  return set()


def _neighboring_relation(
    event: dp_accounting.DpEvent) -> dp_accounting.NeighboringRelation:
  """The adjacency under which `event` can be accounted."""
  kinds = _sampling_kinds(event)
  if dp_accounting.SampledWithoutReplacementDpEvent in kinds:
    if len(kinds) > 1:
      raise ValueError(
          'Cannot compose fixed-size (without replacement) sampled rounds with '
          'other sampling: fixed-size sampling is analysed under replace-one '
          'adjacency, Poisson sampling under add-or-remove-one, and no '
          f'accountant composes the two. Sampling found: '
          f'{sorted(k.__name__ for k in kinds)}.')
    return _REPLACE_ONE
  return _ADD_OR_REMOVE


def _effective_noise_multiplier(
    event: dp_accounting.DpEvent) -> Optional[float]:
  """z of the single Gaussian equivalent to a composition of Gaussians.

  Gaussians with multipliers z_i on the same cohort release together exactly
  what one Gaussian with z = (sum_i z_i^-2)^-1/2 releases (whitening puts the
  worst-case shift along one direction); dp_accounting's RDP accountant does
  the same. Returns None when `event` is not made of Gaussians only.

  Args:
    event: The event to reduce.
  """
  if isinstance(event, dp_accounting.GaussianDpEvent):
    return float(event.noise_multiplier)
  if isinstance(event, dp_accounting.SelfComposedDpEvent):
    inner = _effective_noise_multiplier(event.event)
    if inner is None:
      return None
    # count copies of z: z / sqrt(count); no copy releases nothing (z = inf).
    return inner / math.sqrt(event.count) if event.count else math.inf
  if isinstance(event, dp_accounting.ComposedDpEvent):
    precision = 0.0
    for sub_event in event.events:
      inner = _effective_noise_multiplier(sub_event)
      if inner is None:
        return None
      if inner == 0:
        return 0.0
      precision += inner**-2
    return math.inf if precision == 0 else precision**-0.5
  return None


def _gaussian_for(noise_multiplier: float,
                  relation: dp_accounting.NeighboringRelation):
  """The Gaussian dp_accounting must see; z/2 under replace-one (see top)."""
  if noise_multiplier == 0:
    return dp_accounting.NonPrivateDpEvent()
  if math.isinf(noise_multiplier):
    return dp_accounting.NoOpDpEvent()
  if relation == _REPLACE_ONE:
    # Replace-one moves a clipped sum by up to 2C: sensitivity-normalised
    # multiplier is s / (2C) = z / 2 (google/differential-privacy#378).
    noise_multiplier /= 2
  return dp_accounting.GaussianDpEvent(noise_multiplier)


def _accounting_view(
    event: dp_accounting.DpEvent, relation: dp_accounting.NeighboringRelation
) -> dp_accounting.DpEvent:
  """Rewrites `event` into the conventions dp_accounting 0.4.3 computes with.

  Only re-expresses the same mechanism: compositions of Gaussians on one
  cohort become their single equivalent Gaussian (so the PLD accountant, which
  accepts only a bare Gaussian under sampling, handles adaptive clipping);
  zero noise becomes `NonPrivateDpEvent` (epsilon = inf); under replace-one
  adjacency the Gaussian multiplier is halved (sensitivity 2C). Events this
  module does not know are passed on unchanged under add-or-remove (the
  accountant decides) and refused under replace-one, where their sensitivity
  convention is unknown.

  Args:
    event: The recorded event.
    relation: The adjacency, from `_neighboring_relation`.

  Returns:
    The equivalent event to give to a dp_accounting accountant.

  Raises:
    dp_accounting.UnsupportedEventError: For an event of unknown sensitivity
      under replace-one adjacency.
  """
  if isinstance(event, (dp_accounting.NoOpDpEvent,
                        dp_accounting.NonPrivateDpEvent)):
    return event
  if isinstance(event, (dp_accounting.PoissonSampledDpEvent,
                        dp_accounting.SampledWithoutReplacementDpEvent)):
    noise_multiplier = _effective_noise_multiplier(event.event)
    if noise_multiplier is None:
      inner = _accounting_view(event.event, relation)
    else:
      inner = _gaussian_for(noise_multiplier, relation)
    if isinstance(inner, (dp_accounting.NonPrivateDpEvent,
                          dp_accounting.NoOpDpEvent)):
      return inner
    if isinstance(event, dp_accounting.PoissonSampledDpEvent):
      return dp_accounting.PoissonSampledDpEvent(
          float(event.sampling_probability), inner)
    return dp_accounting.SampledWithoutReplacementDpEvent(
        int(event.source_dataset_size), int(event.sample_size), inner)
  if isinstance(event, dp_accounting.GaussianDpEvent):
    return _gaussian_for(float(event.noise_multiplier), relation)
  if isinstance(event, dp_accounting.SelfComposedDpEvent):
    return dp_accounting.SelfComposedDpEvent(
        _accounting_view(event.event, relation), int(event.count))
  if isinstance(event, dp_accounting.ComposedDpEvent):
    return dp_accounting.ComposedDpEvent(
        [_accounting_view(e, relation) for e in event.events])
  if relation == _REPLACE_ONE:
    raise dp_accounting.UnsupportedEventError(
        f'{type(event).__name__} cannot be accounted under replace-one '
        '(fixed-size sampling) adjacency by tff_clip: its sensitivity under '
        'replacement is not known. Use Gaussian noise events.')
  return event


def _epsilon_from_rdp(orders, rdp_values, delta: float) -> tuple[float, float]:
  """`rdp.compute_epsilon`, made safe for RDP at the rounding-error level.

  `compute_epsilon` returns epsilon = 0 as soon as the RDP at some order is
  below about delta**2 (its KL-divergence shortcut, delta <= sqrt(1 - e^-KL)).
  For very large noise, dp_accounting's sampled-Gaussian RDP is that small
  and decided by floating-point rounding (absolute error ~1e-15 / (order - 1)
  per round; e.g. exactly 0 at order 1.1 for z = 1000, q = 1e-4, true value
  5e-15), so the shortcut can claim epsilon = 0 where it does not hold, or
  raise on a value rounded below zero. Raising every RDP value to at least
  2 delta**2 keeps it an upper bound (RDP may always be overstated) and turns
  the shortcut off; RDP values that large are unaffected.

  Args:
    orders: The RDP orders.
    rdp_values: The RDP at each order.
    delta: The target delta.
  """
  rdp_values = np.maximum(np.asarray(rdp_values, dtype=np.float64),
                          2 * delta**2)
  epsilon, order = rdp.compute_epsilon(orders, rdp_values, delta)
  return float(epsilon), float(order)


class _RdpAccountant(rdp.RdpAccountant):
  """dp_accounting's RDP accountant, with `_epsilon_from_rdp`."""

  def get_epsilon_and_optimal_order(self,
                                    target_delta: float) -> tuple[float, float]:
    return _epsilon_from_rdp(self.orders, self.rdp, target_delta)

  def get_epsilon(self, target_delta: float) -> float:
    return self.get_epsilon_and_optimal_order(target_delta)[0]


def _make_accountant(
    accountant: str, relation: dp_accounting.NeighboringRelation,
    value_discretization_interval: Optional[float]
) -> dp_accounting.PrivacyAccountant:
  if accountant == RDP:
    return _RdpAccountant(neighboring_relation=relation)
  return pld.PLDAccountant(
      neighboring_relation=relation,
      value_discretization_interval=value_discretization_interval)


def _unsupported(accountant: str, event, relation, error) -> Exception:
  if accountant == PLD and relation == _REPLACE_ONE:
    message = (
        'The PLD accountant cannot account for fixed-size sampling without '
        'replacement (SampledWithoutReplacementDpEvent): dp_accounting has no '
        'PLD for it. Use accountant="rdp" (replace-one adjacency), or Poisson '
        'sampling.')
  else:
    message = (f'The {accountant.upper()} accountant cannot account for '
               f'{event}.')
  return dp_accounting.UnsupportedEventError(f'{message} ({error})')


def _compose(accountant: str, view: dp_accounting.DpEvent,
             relation: dp_accounting.NeighboringRelation,
             value_discretization_interval: Optional[float],
             original: dp_accounting.DpEvent):
  acct = _make_accountant(accountant, relation, value_discretization_interval)
  try:
    acct.compose(view)
  except dp_accounting.UnsupportedEventError as error:
    raise _unsupported(accountant, original, relation, error) from error
  return acct


@dataclasses.dataclass(frozen=True)
class PrivacyGuarantee:
  """An (epsilon, delta)-DP guarantee and how it was obtained.

  Attributes:
    epsilon: The epsilon; `math.inf` when no finite epsilon was shown (e.g.
      zero noise).
    delta: The delta it holds for.
    accountant: `'rdp'` or `'pld'`.
    adjacency: The neighbouring relation the guarantee is for:
      `'add-or-remove-one client'` (Poisson sampling) or
      `'replace-one client'` (fixed-size sampling).
    rdp_order: For the RDP accountant, the Renyi order attaining the minimum;
      None for PLD. At `max(RDP_ORDERS)` the RDP epsilon is limited by the
      order grid (small epsilons): PLD is then much tighter.
    value_discretization_interval: For PLD, the grid used; None for RDP.
  """
  epsilon: float
  delta: float
  accountant: str
  adjacency: str
  rdp_order: Optional[float] = None
  value_discretization_interval: Optional[float] = None


def _pld_grid(rdp_epsilon: float) -> float:
  if not math.isfinite(rdp_epsilon):
    return 1.0  # Unused: a non-private event gives inf regardless of grid.
  return min(_PLD_MAX_GRID,
             max(_PLD_MIN_GRID, _PLD_RELATIVE_GRID * rdp_epsilon))


def _releases_nothing(event: dp_accounting.DpEvent) -> bool:
  if isinstance(event, dp_accounting.NoOpDpEvent):
    return True
  if isinstance(event, dp_accounting.SelfComposedDpEvent):
    return event.count == 0 or _releases_nothing(event.event)
  if isinstance(event, dp_accounting.ComposedDpEvent):
    return all(_releases_nothing(e) for e in event.events)
  return False


def _guarantee_from_view(view, relation, delta, accountant,
                         value_discretization_interval, original,
                         rdp_guarantee: Optional[PrivacyGuarantee] = None
                        ) -> PrivacyGuarantee:
  """Runs one accountant on an already interpreted event."""
  adjacency = _ADJACENCY_NAMES[relation]
  if _releases_nothing(view):
    # E.g. an empty ledger. (RDP would give the small epsilon of its
    # 2 delta^2 floor, see `_epsilon_from_rdp`.)
    return PrivacyGuarantee(0.0, delta, accountant, adjacency)
  if accountant == RDP:
    acct = _compose(RDP, view, relation, None, original)
    epsilon, order = acct.get_epsilon_and_optimal_order(delta)
    return PrivacyGuarantee(float(epsilon), delta, RDP, adjacency,
                            rdp_order=float(order))
  # Fail before the (possibly slow) RDP pass that only sizes the grid.
  if not _make_accountant(PLD, relation, 1.0).supports(view):
    raise _unsupported(PLD, original, relation,
                       'unsupported by dp_accounting.pld.PLDAccountant')

  def pld_epsilon(grid: float) -> float:
    return _compose(PLD, view, relation, grid, original).get_epsilon(delta)

  if value_discretization_interval is not None:
    return PrivacyGuarantee(
        float(pld_epsilon(value_discretization_interval)), delta, PLD,
        adjacency, value_discretization_interval=value_discretization_interval)
  if rdp_guarantee is None:
    try:
      rdp_guarantee = _guarantee_from_view(view, relation, delta, RDP, None,
                                           original)
    except dp_accounting.UnsupportedEventError:
      pass
  grid = 1e-4 if rdp_guarantee is None else _pld_grid(rdp_guarantee.epsilon)
  epsilon = pld_epsilon(grid)
  finer = _pld_grid(epsilon)
  if finer < grid / 3:
    # RDP was far above PLD (small epsilons, where RDP is limited by its
    # largest order): size the grid by PLD's own answer. Both passes are
    # upper bounds, so the smaller one is too.
    epsilon, grid = min((epsilon, grid), (pld_epsilon(finer), finer))
  return PrivacyGuarantee(float(epsilon), delta, PLD, adjacency,
                          value_discretization_interval=grid)


def compute_epsilon(
    event: dp_accounting.DpEvent,
    delta: float,
    accountant: str = RDP,
    value_discretization_interval: Optional[float] = None) -> PrivacyGuarantee:
  """The (epsilon, delta) guarantee of everything `event` describes.

  Args:
    event: What happened, e.g. `training_event(...)` or
      `PrivacyLedger.composed_event()`.
    delta: In (0, 1).
    accountant: `'rdp'` or `'pld'` (see the module docstring for what each
      computes and under which adjacency).
    value_discretization_interval: PLD grid; None for the relative grid
      described in the module docstring. Ignored for RDP.

  Returns:
    A `PrivacyGuarantee`.

  Raises:
    ValueError: For a bad argument, or for an event that mixes Poisson and
      fixed-size sampling.
    dp_accounting.UnsupportedEventError: If the accountant cannot account for
      the event (e.g. PLD with fixed-size sampling).
  """
  _check_event(event)
  delta = _check_delta(delta)
  accountant = _check_accountant(accountant)
  value_discretization_interval = _check_value_discretization_interval(
      value_discretization_interval)
  relation = _neighboring_relation(event)
  view = _accounting_view(event, relation)
  return _guarantee_from_view(view, relation, delta, accountant,
                              value_discretization_interval, event)


def compute_training_epsilon(
    noise_multiplier: float,
    clients_per_round: Union[int, float],
    population_size: int,
    rounds: int,
    delta: float,
    sampling: str = POISSON,
    accountant: str = RDP,
    value_discretization_interval: Optional[float] = None) -> PrivacyGuarantee:
  """The guarantee of `rounds` rounds with fixed parameters.

  Equivalent to `compute_epsilon(training_event(...), delta, accountant)`.

  Args:
    noise_multiplier: z >= 0 (z = 0 gives epsilon = inf).
    clients_per_round: n (expected for Poisson sampling).
    population_size: K >= n.
    rounds: A positive integer.
    delta: In (0, 1).
    sampling: `'poisson'` or `'fixed_size'`.
    accountant: `'rdp'` or `'pld'`.
    value_discretization_interval: PLD grid; None for the relative grid.

  Returns:
    A `PrivacyGuarantee`.
  """
  delta = _check_delta(delta)
  event = training_event(noise_multiplier, clients_per_round, population_size,
                         rounds, sampling)
  return compute_epsilon(event, delta, accountant,
                         value_discretization_interval)


# ---------------------------------------------------------------------------
# Calibration.


def _bracket(epsilon_at: Callable[[float], float], target_epsilon: float,
             start: float, floor: float,
             factor: float = 2.0) -> tuple[float, float]:
  """(lower, upper) with epsilon(lower) > target >= epsilon(upper).

  Multiplies or divides `start` by `factor` (epsilon decreases as z grows).
  When dividing reaches `floor` with epsilon still <= target (the budget does
  not bind), returns (z, z) for that last z, which meets the target.

  Args:
    epsilon_at: Epsilon as a function of the noise multiplier.
    target_epsilon: The target.
    start: The first noise multiplier tried.
    floor: The smallest noise multiplier tried (about).
    factor: The step, > 1.

  Raises:
    ValueError: If even `_MAX_NOISE_MULTIPLIER` does not reach the target.
  """
  if epsilon_at(start) <= target_epsilon:
    upper = start
    while upper > floor:
      lower = upper / factor
      if epsilon_at(lower) > target_epsilon:
        return lower, upper
      upper = lower
    return upper, upper
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
  """The smallest noise multiplier whose training has epsilon <= target.

  Searches with `dp_accounting.calibrate_dp_mechanism` (Brent's method) over
  `training_event(z, ...)`, interpreted exactly as `compute_epsilon` does.
  Guarantee: `compute_training_epsilon(z, ...)` with the same accountant and
  `value_discretization_interval` is <= `target_epsilon`, and close to it.

  Args:
    target_epsilon: > 0.
    clients_per_round: n (expected for Poisson sampling).
    population_size: K >= n.
    rounds: A positive integer.
    delta: In (0, 1).
    sampling: `'poisson'` or `'fixed_size'`.
    accountant: `'rdp'` or `'pld'`. PLD calibration first brackets the answer
      with RDP, then searches on a fixed grid (so that epsilon is a smooth
      function of z during the search), then checks the result as
      `compute_training_epsilon` computes it. It costs about fifteen PLD
      evaluations: ~10 s at the default grid for epsilon ~ 3 (building the
      one-round PLD costs ~ 1 / grid). Fixed-size RDP calibration costs
      about as much (~0.5 s per RDP evaluation, whatever the rounds).
    tolerance: Absolute tolerance on the noise multiplier.
    value_discretization_interval: PLD grid, for the search and the check;
      None for 1e-4 * target_epsilon during the search and
      `compute_epsilon`'s relative grid for the check. Ignored for RDP.

  Returns:
    The noise multiplier z. If even z ~ 2**-10 meets the target (the budget
    does not bind), that z is returned.

  Raises:
    ValueError: For a bad argument, naming it; for a target that no
      noise_multiplier <= 2**20 reaches (`target_epsilon` unreachable).
    dp_accounting.UnsupportedEventError: PLD with fixed-size sampling.
  """
  target_epsilon = _check_real(target_epsilon, 'target_epsilon')
  if not (math.isfinite(target_epsilon) and target_epsilon > 0):
    raise ValueError(
        '`target_epsilon` must be finite and > 0 (epsilon = 0 is unreachable '
        f'with Gaussian noise); got {target_epsilon!r}.')
  delta = _check_delta(delta)
  accountant = _check_accountant(accountant)
  sampling = _check_sampling(sampling)
  clients_per_round, population_size = _check_cohort(clients_per_round,
                                                     population_size, sampling)
  rounds = _check_positive_int(rounds, 'rounds')
  tolerance = _check_real(tolerance, 'tolerance')
  if not (math.isfinite(tolerance) and tolerance > 0):
    raise ValueError(f'`tolerance` must be finite and > 0; got {tolerance!r}.')
  value_discretization_interval = _check_value_discretization_interval(
      value_discretization_interval)

  def event_for(noise_multiplier: float) -> dp_accounting.DpEvent:
    return training_event(noise_multiplier, clients_per_round,
                          population_size, rounds, sampling)

  relation = _neighboring_relation(event_for(1.0))

  def view_for(noise_multiplier: float) -> dp_accounting.DpEvent:
    return _accounting_view(event_for(noise_multiplier), relation)

  if accountant == PLD and not _make_accountant(PLD, relation, 1.0).supports(
      view_for(1.0)):
    raise _unsupported(PLD, event_for(1.0), relation,
                       'unsupported by dp_accounting.pld.PLDAccountant')

  def rdp_epsilon(noise_multiplier: float) -> float:
    return _compose(RDP, view_for(noise_multiplier), relation, None,
                    event_for(noise_multiplier)).get_epsilon(delta)

  lower, upper = _bracket(rdp_epsilon, target_epsilon, 1.0,
                          _MIN_NOISE_MULTIPLIER)
  if lower == upper:
    return upper
  if accountant == RDP:

    def make_fresh_accountant():
      return _make_accountant(RDP, relation, None)
  else:
    grid = value_discretization_interval or _pld_grid(target_epsilon)

    def make_fresh_accountant():
      return _make_accountant(PLD, relation, grid)

    def pld_epsilon(noise_multiplier: float) -> float:
      return make_fresh_accountant().compose(
          view_for(noise_multiplier)).get_epsilon(delta)

    # The PLD answer is usually a little below RDP's (PLD is tighter). Small
    # steps from there: PLD gets expensive as z, hence epsilon, grows.
    lower, upper = _bracket(pld_epsilon, target_epsilon, upper, upper / 64,
                            factor=1.25)
    if lower == upper:
      return upper
  noise_multiplier = float(
      dp_accounting.calibrate_dp_mechanism(
          make_fresh_accountant,
          view_for,
          target_epsilon,
          delta,
          bracket_interval=dp_accounting.ExplicitBracketInterval(lower, upper),
          tol=tolerance))
  if accountant == PLD:
    # compute_epsilon's grid (relative to the RDP epsilon) can be coarser than
    # the search grid, hence overstate epsilon a little more: make the
    # number users will see meet the target too.
    step = tolerance
    while compute_training_epsilon(
        noise_multiplier, clients_per_round, population_size, rounds, delta,
        sampling, PLD, value_discretization_interval).epsilon > target_epsilon:
      noise_multiplier += step
      step *= 2
  return noise_multiplier


# ---------------------------------------------------------------------------
# Population extrapolation (McMahan et al. 2018; seed 002, Table 1).


@dataclasses.dataclass(frozen=True)
class ExtrapolationRow:
  """One row of a population extrapolation table.

  Attributes:
    clients_per_round: n (expected for Poisson sampling).
    population_size: K.
    sampling_probability: q = n / K.
    noise_multiplier: z = sigma_DP * n.
    guarantees: The guarantee per accountant name (`'rdp'`, `'pld'`).
  """
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

  After McMahan et al. 2018 ("Learning Differentially Private Recurrent
  Language Models", Section 3) and seed 002 (Table 1): model quality depends
  on the clip norm C and on the noise std on the averaged update,
  sigma_DP * C with sigma_DP = z / n, so for a cohort n' = a n drawn from a
  population K' = b K the same training is obtained with z' = sigma_DP * n'
  and q' = n' / K'. Each row's epsilon is computed from that row's
  `training_event` (same `rounds`, same `delta`).

  Args:
    noise_multiplier: z of the run actually trained (> 0).
    clients_per_round: Its n.
    population_size: Its K.
    rounds: Its number of rounds.
    delta: In (0, 1).
    scales: (cohort scale a, population scale b) pairs, one row each. For
      fixed-size sampling n' is rounded to a whole number of clients (z' is
      computed from the rounded n', so z'/n' is still sigma_DP); K' is always
      rounded.
    sampling: `'poisson'` or `'fixed_size'`.
    accountants: Accountants to run for every row.

  Returns:
    One `ExtrapolationRow` per scale pair, in order.
  """
  noise_multiplier = _check_noise_multiplier(noise_multiplier)
  sampling = _check_sampling(sampling)
  clients_per_round, population_size = _check_cohort(clients_per_round,
                                                     population_size, sampling)
  rounds = _check_positive_int(rounds, 'rounds')
  delta = _check_delta(delta)
  accountants = tuple(_check_accountant(a) for a in accountants)
  sigma_dp = noise_multiplier / clients_per_round
  rows = []
  for pair in scales:
    if len(pair) != 2:
      raise ValueError('`scales` must be (cohort scale, population scale) '
                       f'pairs; got {pair!r}.')
    cohort_scale = _check_real(pair[0], 'scales')
    population_scale = _check_real(pair[1], 'scales')
    if not (cohort_scale > 0 and population_scale > 0 and
            math.isfinite(cohort_scale) and math.isfinite(population_scale)):
      raise ValueError(f'`scales` must be positive and finite; got {pair!r}.')
    new_cohort = clients_per_round * cohort_scale
    if sampling == FIXED_SIZE:
      new_cohort = max(1, round(new_cohort))
    new_population = max(1, round(population_size * population_scale))
    new_cohort, new_population = _check_cohort(new_cohort, new_population,
                                               sampling)
    new_noise_multiplier = sigma_dp * new_cohort
    event = training_event(new_noise_multiplier, new_cohort, new_population,
                           rounds, sampling)
    relation = _neighboring_relation(event)
    view = _accounting_view(event, relation)
    guarantees = {}
    for accountant in accountants:
      guarantees[accountant] = _guarantee_from_view(
          view, relation, delta, accountant, None, event,
          rdp_guarantee=guarantees.get(RDP))
    rows.append(
        ExtrapolationRow(new_cohort, new_population,
                         new_cohort / new_population, new_noise_multiplier,
                         guarantees))
  return rows


def _format_number(value: float) -> str:
  if isinstance(value, numbers.Integral):
    return f'{value:,}'
  if float(value).is_integer() and abs(value) < 1e15:
    return f'{int(value):,}'
  return f'{value:.4g}'


def format_extrapolation_table(rows: Sequence[ExtrapolationRow]) -> str:
  """A plain-text table: n, K, q, z, then epsilon (and order) per accountant."""
  if not rows:
    return '(no rows)'
  accountants = list(rows[0].guarantees)
  header = ['n (clients/round)', 'K (population)', 'q', 'z']
  for accountant in accountants:
    header.append(f'{accountant.upper()} epsilon')
    if accountant == RDP:
      header.append('RDP order')
  table = [header]
  for row in rows:
    line = [
        _format_number(row.clients_per_round),
        _format_number(row.population_size),
        f'{row.sampling_probability:.4g}',
        f'{row.noise_multiplier:.4g}',
    ]
    for accountant in accountants:
      guarantee = row.guarantees[accountant]
      line.append(f'{guarantee.epsilon:.4g}')
      if accountant == RDP:
        line.append(f'{guarantee.rdp_order:g}')
    table.append(line)
  widths = [max(len(line[i]) for line in table) for i in range(len(header))]
  return '\n'.join(
      '  '.join(cell.rjust(width) for cell, width in zip(line, widths))
      for line in table)


# ---------------------------------------------------------------------------
# Serialisation of events (JSON-able dicts).


def _event_classes() -> dict[str, type]:
  return {
      name: cls for name, cls in vars(dp_event_lib).items()
      if isinstance(cls, type) and issubclass(cls, dp_accounting.DpEvent)
  }


def _to_plain(value):
  if isinstance(value, dp_accounting.DpEvent):
    return event_to_dict(value)
  if isinstance(value, (list, tuple)):
    return [_to_plain(v) for v in value]
  if isinstance(value, bool) or value is None or isinstance(value, str):
    return value
  if isinstance(value, numbers.Integral):
    return int(value)
  if isinstance(value, numbers.Real):
    return float(value)
  raise TypeError(f'Cannot serialise DpEvent field value {value!r}.')


def event_to_dict(event: dp_accounting.DpEvent) -> dict[str, Any]:
  """A JSON-able dict for a `dp_accounting` event: {'type': name, **fields}.

  Unlike `DpEvent.to_named_tuple`, only the name of the class is stored, and
  `event_from_dict` only builds classes of `dp_accounting.dp_event`: reading a
  checkpoint never imports a module it names. NumPy scalars (e.g. from TFF
  state) become Python numbers.

  Args:
    event: A `dp_accounting.DpEvent`.
  """
  if type(event).__name__ not in _event_classes():
    raise TypeError(f'Cannot serialise {type(event)}: only the event classes '
                    'of dp_accounting.dp_event are supported.')
  result = {'type': type(event).__name__}
  for field in attr.fields(type(event)):
    result[field.name] = _to_plain(getattr(event, field.name))
  return result


def _from_plain(value):
  if isinstance(value, Mapping):
    return event_from_dict(value)
  if isinstance(value, list):
    return [_from_plain(v) for v in value]
  return value


def event_from_dict(data: Mapping[str, Any]) -> dp_accounting.DpEvent:
  """The inverse of `event_to_dict`."""
  classes = _event_classes()
  if not isinstance(data, Mapping) or data.get('type') not in classes:
    raise ValueError(f'Not a serialised dp_accounting event: {data!r}.')
  cls = classes[data['type']]
  fields = {f.name for f in attr.fields(cls)}
  given = set(data) - {'type'}
  if given != fields:
    raise ValueError(f'Fields of serialised {data["type"]} must be '
                     f'{sorted(fields)}; got {sorted(given)}.')
  return cls(**{name: _from_plain(data[name]) for name in fields})


def _canonical(event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
  # Python numbers and lists, so equal events compare equal (TFF gives NumPy
  # scalars and tuples) and survive a serialisation round trip unchanged.
  return event_from_dict(event_to_dict(event))


# ---------------------------------------------------------------------------
# The ledger.


class PrivacyLedger:
  """The DpEvents a training run actually ran, one per round.

  Record each round's event after the round ran, e.g. with TFF:

    noise_event = (tff.aggregators.differential_privacy
                   .extract_dp_event_from_state(aggregator_state))
    ledger.record(round_num, accounting.round_event(
        noise_event, clients_per_round, population_size, sampling='fixed_size'))

  or `ledger.record_gaussian_round(round_num, z, n, K, sampling)`. Epsilon is
  then computed by composing exactly the recorded events
  (`composed_event()`): see `epsilon`, `guarantee` and `epsilon_history`.
  Recording a round number twice raises, so a run resumed from a checkpoint
  (`to_dict` / `from_dict`) never counts a round twice.

  The RDP of every distinct round event is computed once (by dp_accounting's
  `RdpAccountant`) and cached, so `epsilon(delta)` with RDP after every round
  costs O(distinct events x RDP orders), about a millisecond.
  """

  def __init__(self):
    self._round_nums: list[int] = []
    self._event_index: dict[int, int] = {}  # round_num -> index in _distinct.
    self._distinct: list[dp_accounting.DpEvent] = []
    self._rdp_cache: dict[tuple[int, Any], Any] = {}

  def __len__(self) -> int:
    return len(self._round_nums)

  def __repr__(self) -> str:
    return (f'PrivacyLedger({len(self)} rounds, {len(self._distinct)} '
            'distinct events)')

  @property
  def rounds(self) -> tuple[int, ...]:
    """The recorded round numbers, ascending."""
    return tuple(sorted(self._round_nums))

  @property
  def events(self) -> tuple[dp_accounting.DpEvent, ...]:
    """The recorded events, in ascending round order."""
    return tuple(
        self._distinct[self._event_index[r]] for r in self.rounds)

  def record(self, round_num: int, event: dp_accounting.DpEvent) -> None:
    """Records that round `round_num` ran `event` (sampling included).

    Args:
      round_num: A non-negative integer, not recorded before.
      event: The round's full event, e.g. from `round_event` or
        `gaussian_round_event`.

    Raises:
      ValueError: If `round_num` was already recorded, if an argument is bad,
        or if `event` mixes Poisson and fixed-size sampling with the events
        already recorded.
      TypeError: If `event` is not a `dp_accounting.DpEvent`.
    """
    round_num = _check_non_negative_int(round_num, 'round_num')
    _check_event(event)
    if round_num in self._event_index:
      raise ValueError(f'`round_num` {round_num} is already recorded; a round '
                       'must never be counted twice.')
    event = _canonical(event)
    # Fail now, not at the first epsilon, on an uncomposable mixture or on an
    # event the accountant cannot interpret: a ledger never holds a release
    # it cannot account.
    relation = _neighboring_relation(
        dp_accounting.ComposedDpEvent(self._distinct + [event]))
    try:
      index = self._distinct.index(event)
    except ValueError:
      try:
        rdp_values = _compose(RDP, _accounting_view(event, relation),
                              relation, None, event).rdp
      except dp_accounting.UnsupportedEventError as error:
        raise ValueError(f'`event` cannot be accounted: {error}') from error
      index = len(self._distinct)
      self._distinct.append(event)
      self._rdp_cache[(index, relation)] = rdp_values
    self._event_index[round_num] = index
    self._round_nums.append(round_num)

  def record_gaussian_round(self,
                            round_num: int,
                            noise_multiplier: float,
                            clients_per_round: Union[int, float],
                            population_size: int,
                            sampling: str = POISSON) -> None:
    """`record(round_num, gaussian_round_event(z, n, K, sampling))`."""
    self.record(
        round_num,
        gaussian_round_event(noise_multiplier, clients_per_round,
                             population_size, sampling))

  def _counts(self, round_nums: Iterable[int]) -> list[int]:
    counts = [0] * len(self._distinct)
    for r in round_nums:
      counts[self._event_index[r]] += 1
    return counts

  def composed_event(self) -> dp_accounting.DpEvent:
    """All recorded rounds as one event.

    `ComposedDpEvent([SelfComposedDpEvent(e, count of e), ...])` over the
    distinct round events (composition does not depend on order), so PLD
    self-composes each distinct event once instead of convolving per round.
    `NoOpDpEvent()` for an empty ledger.
    """
    if not self._round_nums:
      return dp_accounting.NoOpDpEvent()
    counts = self._counts(self._round_nums)
    return dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(event, count)
        for event, count in zip(self._distinct, counts) if count
    ])

  def _rdp_vector(self, index: int, relation):
    key = (index, relation)
    if key not in self._rdp_cache:
      event = self._distinct[index]
      self._rdp_cache[key] = _compose(RDP, _accounting_view(event, relation),
                                      relation, None, event).rdp
    return self._rdp_cache[key]

  def _rdp_guarantee(self, delta: float) -> PrivacyGuarantee:
    composed = self.composed_event()
    relation = _neighboring_relation(composed)
    if _releases_nothing(_accounting_view(composed, relation)):
      return PrivacyGuarantee(0.0, delta, RDP, _ADJACENCY_NAMES[relation])
    orders = np.asarray(RDP_ORDERS)
    total = 0 * orders
    for index, count in enumerate(self._counts(self._round_nums)):
      if count:
        total = total + count * self._rdp_vector(index, relation)
    epsilon, order = _epsilon_from_rdp(orders, total, delta)
    return PrivacyGuarantee(epsilon, delta, RDP, _ADJACENCY_NAMES[relation],
                            rdp_order=order)

  def guarantee(
      self,
      delta: float,
      accountant: str = RDP,
      value_discretization_interval: Optional[float] = None
  ) -> PrivacyGuarantee:
    """The guarantee of all recorded rounds (see `compute_epsilon`).

    The RDP result equals `compute_epsilon(self.composed_event(), delta)`;
    it is computed from cached per-event RDP vectors.

    Args:
      delta: In (0, 1).
      accountant: `'rdp'` or `'pld'`.
      value_discretization_interval: PLD grid; None for the relative grid.
    """
    delta = _check_delta(delta)
    accountant = _check_accountant(accountant)
    if accountant == RDP:
      return self._rdp_guarantee(delta)
    return compute_epsilon(self.composed_event(), delta, PLD,
                           value_discretization_interval)

  def epsilon(self,
              delta: float,
              accountant: str = RDP,
              value_discretization_interval: Optional[float] = None) -> float:
    """Epsilon of all recorded rounds: `guarantee(...).epsilon`."""
    return self.guarantee(delta, accountant,
                          value_discretization_interval).epsilon

  def epsilon_history(self, delta: float) -> list[tuple[int, float]]:
    """(round_num, RDP epsilon of all rounds up to and including it), ascending.

    Incremental: each distinct event's RDP is computed once and prefix sums
    are converted to epsilon, O(rounds x RDP orders) in all.

    Args:
      delta: In (0, 1).
    """
    delta = _check_delta(delta)
    if not self._round_nums:
      return []
    relation = _neighboring_relation(self.composed_event())
    orders = np.asarray(RDP_ORDERS)
    total = 0 * orders
    history = []
    for round_num in self.rounds:
      total = total + self._rdp_vector(self._event_index[round_num], relation)
      history.append((round_num, _epsilon_from_rdp(orders, total, delta)[0]))
    return history

  def to_dict(self) -> dict[str, Any]:
    """A JSON-able dict (for checkpoints): distinct events with their rounds."""
    groups = [{'event': event_to_dict(event), 'round_nums': []}
              for event in self._distinct]
    for round_num in self.rounds:
      groups[self._event_index[round_num]]['round_nums'].append(round_num)
    return {
        'format': _LEDGER_FORMAT,
        'version': _LEDGER_VERSION,
        'groups': [g for g in groups if g['round_nums']],
    }

  @classmethod
  def from_dict(cls, data: Mapping[str, Any]) -> 'PrivacyLedger':
    """The inverse of `to_dict`; raises ValueError on a malformed dict."""
    if (not isinstance(data, Mapping) or
        data.get('format') != _LEDGER_FORMAT or
        data.get('version') != _LEDGER_VERSION):
      raise ValueError(f'`data` is not a version {_LEDGER_VERSION} '
                       f'{_LEDGER_FORMAT} dict.')
    ledger = cls()
    entries = []
    for group in data['groups']:
      event = event_from_dict(group['event'])
      entries.extend((r, event) for r in group['round_nums'])
    for round_num, event in sorted(entries, key=lambda entry: entry[0]):
      ledger.record(round_num, event)
    return ledger
