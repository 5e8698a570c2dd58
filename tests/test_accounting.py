"""Specification of the accountant (`tff_clip.privacy.accounting`).

Parameters are chosen so that the file runs in well under a minute: PLD
compositions use few rounds or the relative grid, and the (slow, ~0.5 s per
evaluation) fixed-size RDP is exercised only a few times.
"""

import collections
import json
import math

import dp_accounting
from dp_accounting import pld
from dp_accounting.pld import pld_pmf
from dp_accounting import rdp
from dp_accounting.rdp import rdp_privacy_accountant
import numpy as np
import pytest

from tff_clip.privacy import accounting
from tff_clip.privacy import accountants
from tff_clip.privacy import pld_numpy
from tff_clip.privacy import rdp_floor

DELTA = 1e-6
# A typical cross-device setting: z = 1, n = 100 of K = 10,000, 300 rounds.
Z, N, K, ROUNDS = 1.0, 100, 10_000, 300
NR = dp_accounting.NeighboringRelation


def _poisson_rounds(noise_multiplier, q, rounds):
  return dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(
          q, dp_accounting.GaussianDpEvent(noise_multiplier)), rounds)


# ----------------------------------------------------------------------------
# Agreement with a direct dp_accounting composition.


def test_poisson_rdp_epsilon_agrees_with_direct_dp_accounting_composition():
  direct = rdp.RdpAccountant()
  direct.compose(_poisson_rounds(Z, N / K, ROUNDS))
  epsilon, order = direct.get_epsilon_and_optimal_order(DELTA)

  guarantee = accounting.compute_training_epsilon(Z, N, K, ROUNDS, DELTA)

  assert guarantee.epsilon == pytest.approx(epsilon, rel=1e-12)
  assert guarantee.rdp_order == order
  assert guarantee.accountant == 'rdp'
  assert guarantee.adjacency == 'add-or-remove-one client'


def test_poisson_pld_epsilon_agrees_with_direct_dp_accounting_composition():
  direct = pld.PLDAccountant(value_discretization_interval=1e-3)
  direct.compose(_poisson_rounds(Z, N / K, ROUNDS))

  guarantee = accounting.compute_training_epsilon(
      Z, N, K, ROUNDS, DELTA, accountant='pld',
      value_discretization_interval=1e-3)

  assert guarantee.epsilon == pytest.approx(direct.get_epsilon(DELTA),
                                            rel=1e-12)
  assert guarantee.value_discretization_interval == 1e-3


def test_training_event_is_self_composed_sampled_gaussian():
  assert accounting.training_event(Z, N, K, ROUNDS) == _poisson_rounds(
      Z, N / K, ROUNDS)
  assert accounting.training_event(
      Z, N, K, ROUNDS, sampling='fixed_size') == (
          dp_accounting.SelfComposedDpEvent(
              dp_accounting.SampledWithoutReplacementDpEvent(
                  K, N, dp_accounting.GaussianDpEvent(Z)), ROUNDS))


def test_fixed_size_rdp_is_replace_one_with_sensitivity_two_clip_norms():
  # google/differential-privacy#378: under replace-one a clipped sum moves by
  # 2C, so dp_accounting must see noise multiplier z / 2.
  direct = rdp.RdpAccountant(neighboring_relation=NR.REPLACE_ONE)
  direct.compose(
      dp_accounting.SelfComposedDpEvent(
          dp_accounting.SampledWithoutReplacementDpEvent(
              K, N, dp_accounting.GaussianDpEvent(Z / 2)), ROUNDS))

  guarantee = accounting.compute_training_epsilon(
      Z, N, K, ROUNDS, DELTA, sampling='fixed_size')

  assert guarantee.epsilon == pytest.approx(direct.get_epsilon(DELTA),
                                            rel=1e-12)
  assert guarantee.adjacency == 'replace-one client'


def test_fixed_size_full_participation_is_gaussian_of_sensitivity_two():
  # n = K: no sampling; replacing one client's update (norm <= C) by another
  # moves the sum by up to 2C, i.e. a Gaussian with multiplier z / 2.
  gaussian = rdp.RdpAccountant()
  gaussian.compose(
      dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(Z / 2),
                                        ROUNDS))

  guarantee = accounting.compute_training_epsilon(
      Z, K, K, ROUNDS, DELTA, sampling='fixed_size')

  assert guarantee.epsilon == pytest.approx(gaussian.get_epsilon(DELTA),
                                            rel=1e-12)


def test_pld_refuses_fixed_size_sampling_instead_of_guessing():
  with pytest.raises(dp_accounting.UnsupportedEventError,
                     match='fixed-size sampling'):
    accounting.compute_training_epsilon(
        Z, N, K, ROUNDS, DELTA, sampling='fixed_size', accountant='pld')


@pytest.mark.parametrize('noise_multiplier, clients_per_round, rounds', [
    (1.0, 100, 300),
    (0.8, 1000, 200),
    (3.0, 300, 2000),
    (10.0, 100, 10),
])
def test_pld_epsilon_is_at_most_rdp_epsilon(noise_multiplier,
                                             clients_per_round, rounds):
  rdp_epsilon = accounting.compute_training_epsilon(
      noise_multiplier, clients_per_round, K, rounds, DELTA).epsilon
  pld_epsilon = accounting.compute_training_epsilon(
      noise_multiplier, clients_per_round, K, rounds, DELTA,
      accountant='pld').epsilon

  assert 0 < pld_epsilon <= rdp_epsilon


def test_relative_pld_grid_is_as_tight_as_a_fine_fixed_grid():
  fine = accounting.compute_training_epsilon(
      5.0, N, K, 100, DELTA, accountant='pld',
      value_discretization_interval=1e-6).epsilon
  relative = accounting.compute_training_epsilon(
      5.0, N, K, 100, DELTA, accountant='pld').epsilon

  assert fine <= relative <= fine * 1.003


def test_composed_gaussians_on_one_cohort_are_their_equivalent_gaussian():
  # Adaptive clipping releases a noisy sum and a noisy count on the same
  # cohort (tff_clip.aggregation.dp); PLD accepts only one Gaussian under sampling.
  noise = dp_accounting.ComposedDpEvent([
      dp_accounting.GaussianDpEvent(1.2),
      dp_accounting.GaussianDpEvent(2.0),
  ])
  equivalent_noise_multiplier = (1.2**-2 + 2.0**-2)**-0.5
  event = dp_accounting.SelfComposedDpEvent(
      accounting.round_event(noise, N, K), 50)

  for accountant in ('rdp', 'pld'):
    composed = accounting.compute_epsilon(event, DELTA, accountant,
                                          value_discretization_interval=1e-3)
    single = accounting.compute_training_epsilon(
        equivalent_noise_multiplier, N, K, 50, DELTA, accountant=accountant,
        value_discretization_interval=1e-3)
    assert composed.epsilon == pytest.approx(single.epsilon, rel=1e-9)


@pytest.mark.parametrize('sampling, accountant', [('poisson', 'rdp'),
                                                  ('poisson', 'pld'),
                                                  ('fixed_size', 'rdp')])
def test_zero_noise_gives_infinite_epsilon(sampling, accountant):
  guarantee = accounting.compute_training_epsilon(
      0.0, N, K, 10, DELTA, sampling=sampling, accountant=accountant)

  assert guarantee.epsilon == math.inf


def test_events_that_print_alike_are_never_confused():
  # float32(1.1) prints as 1.1 but is 1.1000000238...: RDP is computed once
  # per distinct event, and each gets dp_accounting's own value, in any order.
  epsilons = []
  for scale in (1.1, np.float32(1.1), 1.1, np.float32(1.1)):
    event = dp_accounting.LaplaceDpEvent(scale)
    direct = rdp.RdpAccountant().compose(event).get_epsilon(DELTA)
    epsilons.append(accounting.compute_epsilon(event, DELTA).epsilon)
    assert epsilons[-1] == direct
  assert epsilons[0] != epsilons[1]


def test_huge_noise_never_rounds_to_zero_epsilon():
  # dp_accounting's RDP at order 1.1 is exactly 0.0 here (true value 5e-15
  # per round), which would make compute_epsilon claim epsilon = 0.
  guarantee = accounting.compute_training_epsilon(1000.0, 100, 1_000_000,
                                                  5000, DELTA)

  assert guarantee.epsilon > 0


def test_epsilon_grows_with_rounds_and_shrinks_with_noise():
  def epsilon(noise_multiplier, rounds):
    return accounting.compute_training_epsilon(noise_multiplier, N, K, rounds,
                                               DELTA).epsilon

  assert epsilon(1.0, 100) < epsilon(1.0, 200)
  assert epsilon(2.0, 100) < epsilon(1.0, 100)


# ----------------------------------------------------------------------------
# Calibration.


@pytest.mark.parametrize('sampling, accountant, rounds', [
    ('poisson', 'rdp', 1000),
    ('poisson', 'pld', 1000),
    pytest.param('fixed_size', 'rdp', 1000, marks=pytest.mark.slow),
])
def test_calibration_round_trips(sampling, accountant, rounds):
  """The calibrated z meets the target, and z (1 - 1e-3) does not, both by
  dp_accounting composed here (the project's accountant agrees)."""
  target = 3.0
  # A coarse PLD grid keeps this fast; the round trip holds on any grid.
  grid = 1e-3 if accountant == 'pld' else None
  noise_multiplier = accounting.calibrate_noise_multiplier(
      target, N, K, rounds, DELTA, sampling=sampling, accountant=accountant,
      tolerance=1e-4, value_discretization_interval=grid)

  epsilon = accounting.compute_training_epsilon(
      noise_multiplier, N, K, rounds, DELTA, sampling=sampling,
      accountant=accountant, value_discretization_interval=grid).epsilon

  assert epsilon <= target
  assert epsilon == pytest.approx(target, rel=1e-3)
  oracle = _direct_epsilon(noise_multiplier, sampling, accountant, rounds,
                           grid)
  assert oracle <= target
  assert _direct_epsilon(noise_multiplier * (1 - 1e-3), sampling, accountant,
                         rounds, grid) > target


def _direct_epsilon(noise_multiplier, sampling, accountant, rounds, grid):
  """dp_accounting's epsilon of `rounds` rounds, composed here. Fixed-size
  sampling is replace-one adjacency, where one client moves the sum by up
  to 2 C: the Gaussian's z halves (google/differential-privacy#378)."""
  if sampling == 'poisson':
    event = _poisson_rounds(noise_multiplier, N / K, rounds)
    direct = (rdp.RdpAccountant() if accountant == 'rdp' else
              pld.PLDAccountant(value_discretization_interval=grid))
  else:
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.SampledWithoutReplacementDpEvent(
            K, N, dp_accounting.GaussianDpEvent(noise_multiplier / 2)), rounds)
    direct = rdp.RdpAccountant(neighboring_relation=NR.REPLACE_ONE)
  return direct.compose(event).get_epsilon(DELTA)


@pytest.mark.slow  # PLD on dp_accounting's default grid: seconds per call.
def test_pld_calibration_on_default_grid_meets_the_target_it_reports():
  # The search grid (1e-4 x target) differs from compute_epsilon's default
  # (1e-4 x RDP epsilon); the result must still meet the reported epsilon.
  noise_multiplier = accounting.calibrate_noise_multiplier(
      8.0, N, K, 100, DELTA, accountant='pld', tolerance=1e-3)

  epsilon = accounting.compute_training_epsilon(
      noise_multiplier, N, K, 100, DELTA, accountant='pld').epsilon

  assert 8.0 * 0.99 < epsilon <= 8.0
  assert noise_multiplier < accounting.calibrate_noise_multiplier(
      8.0, N, K, 100, DELTA)  # PLD is tighter than RDP.


def test_pld_calibration_where_sampling_alone_meets_delta_finishes(
    monkeypatch):
  # q = 1e-4 <= delta = 1e-3: the hockey stick at epsilon 0 is at most
  # q (2 Phi(1 / 2z) - 1) < delta at every z, so PLD's epsilon is 0 and
  # its search went on down to ever smaller z, whose PLDs grow as 1/z^2
  # (this calibration did not finish in minutes).
  built = []
  real = pld_numpy.gaussian_round

  def counted(noise_multiplier, sampling_probability, grid):
    built.append(noise_multiplier)
    assert len(built) <= 4, 'a PLD search past epsilon 0'
    return real(noise_multiplier, sampling_probability, grid)

  monkeypatch.setattr(pld_numpy, 'gaussian_round', counted)
  monkeypatch.setattr(accountants, '_PLD_CACHE', collections.OrderedDict())
  monkeypatch.setattr(accountants, '_GUARANTEE_CACHE',
                      collections.OrderedDict())
  noise_multiplier = accounting.calibrate_noise_multiplier(
      1.0, 1, 10_000, 1, 1e-3, accountant='pld')

  direct = pld.PLDAccountant(value_discretization_interval=1e-4).compose(
      _poisson_rounds(noise_multiplier, 1e-4, 1))
  assert direct.get_epsilon(1e-3) <= 1.0


def test_calibration_refuses_pld_with_fixed_size_sampling():
  with pytest.raises(dp_accounting.UnsupportedEventError):
    accounting.calibrate_noise_multiplier(
        3.0, N, K, 100, DELTA, sampling='fixed_size', accountant='pld')


# ----------------------------------------------------------------------------
# Bad input: ValueError naming the argument.


@pytest.mark.parametrize('kwargs, name', [
    (dict(noise_multiplier=-0.1), 'noise_multiplier'),
    (dict(noise_multiplier=math.nan), 'noise_multiplier'),
    (dict(delta=0.0), 'delta'),
    (dict(delta=1.0), 'delta'),
    (dict(delta=1.5), 'delta'),
    (dict(clients_per_round=0), 'clients_per_round'),
    (dict(clients_per_round=-5), 'clients_per_round'),
    (dict(clients_per_round=K + 1), 'clients_per_round'),
    (dict(population_size=0), 'population_size'),
    (dict(rounds=0), 'rounds'),
    (dict(sampling='stratified'), 'sampling'),
    (dict(accountant='moments'), 'accountant'),
])
def test_bad_input_raises_value_error_naming_the_argument(kwargs, name):
  arguments = dict(noise_multiplier=Z, clients_per_round=N, population_size=K,
                   rounds=10, delta=DELTA)
  arguments.update(kwargs)

  with pytest.raises(ValueError, match=f'`{name}`'):
    accounting.compute_training_epsilon(**arguments)


# `tff_clip.checks`' rule: a value of the wrong type is a TypeError.
@pytest.mark.parametrize('kwargs, name', [
    (dict(population_size=10.5), 'population_size'),
    (dict(rounds=2.5), 'rounds'),
    (dict(rounds=True), 'rounds'),
    (dict(rounds='10'), 'rounds'),
    (dict(delta='1e-5'), 'delta'),
    (dict(noise_multiplier=None), 'noise_multiplier'),
    (dict(sampling='fixed_size', clients_per_round=10.5), 'clients_per_round'),
])
def test_wrong_type_raises_type_error_naming_the_argument(kwargs, name):
  arguments = dict(noise_multiplier=Z, clients_per_round=N, population_size=K,
                   rounds=10, delta=DELTA)
  arguments.update(kwargs)

  with pytest.raises(TypeError, match=f'`{name}`'):
    accounting.compute_training_epsilon(**arguments)


def test_delta_message_states_the_range_and_the_value():
  with pytest.raises(ValueError,
                     match=r'`delta` must be in \(0, 1\); got 1\.5'):
    accounting.compute_training_epsilon(Z, N, K, 10, 1.5)


def test_sampling_probability_outside_unit_interval_is_refused():
  event = dp_accounting.PoissonSampledDpEvent(
      1.5, dp_accounting.GaussianDpEvent(Z))

  with pytest.raises(ValueError, match='`sampling_probability`'):
    accounting.compute_epsilon(event, DELTA)


@pytest.mark.parametrize('target_epsilon', [0.0, -1.0, math.inf])
def test_calibration_refuses_impossible_target_epsilon(target_epsilon):
  with pytest.raises(ValueError, match='`target_epsilon`'):
    accounting.calibrate_noise_multiplier(target_epsilon, N, K, 100, DELTA)


# ----------------------------------------------------------------------------
# RDP's floor: the least epsilon RDP accounting proves at a delta.


def test_rdp_orders_are_dp_accountings_default_orders():
  assert rdp_floor.RDP_ORDERS == tuple(
      rdp_privacy_accountant.DEFAULT_RDP_ORDERS)


@pytest.mark.parametrize('delta', [1e-5, 1e-7, 1e-9, 1e-12])
def test_rdp_floor_is_dp_accountings_epsilon_under_huge_noise(delta):
  # z = 1 / (2 delta): RDP a / (2 z^2) = 2 a delta^2 is negligible, yet
  # above delta^2 even at order 1.1 (dp_accounting's KL shortcut stays off).
  accountant = rdp.RdpAccountant().compose(
      dp_accounting.GaussianDpEvent(0.5 / delta))
  epsilon = accountant.get_epsilon(delta)

  floor = rdp_floor.epsilon_floor(delta)

  assert 0 < floor <= epsilon <= 1.01 * floor


def test_rdp_floor_is_zero_where_delta_is_large():
  # At order 1024 the bound is log(1 - 1/1024) - log(1024 delta) / 1023 < 0.
  assert rdp_floor.epsilon_floor(1e-3) == 0


@pytest.mark.parametrize('calibrate', [
    lambda target: accounting.calibrate_noise_multiplier(
        target, N, K, 10, DELTA),
    lambda target: accounting.calibrate_noise_multiplier(
        target, N, K, 10, DELTA, sampling=accounting.FIXED_SIZE),
    lambda target: accounting.calibrate_noise_multiplier(
        target, N, K, 10, DELTA, accountant=accounting.PLD),
    lambda target: accounting.calibrate_correlated_noise_multiplier(
        target, 'banded', 2, rounds=10, separation=5, delta=DELTA),
], ids=['poisson-rdp', 'fixed_size-rdp', 'poisson-pld', 'banded'])
def test_calibration_refuses_a_target_below_rdps_floor_naming_it(calibrate):
  floor = rdp.RdpAccountant().compose(
      dp_accounting.GaussianDpEvent(0.5 / DELTA)).get_epsilon(DELTA)

  with pytest.raises(ValueError, match=(
      r'^`target_epsilon` = 9e-07 is unreachable at delta = 1e-06: RDP '
      r'accounting cannot prove less than epsilon = ' f'{floor:.3g}')):
    calibrate(0.9e-6)


def test_a_target_just_above_rdps_floor_is_still_calibrated():
  # One round of q = 0.01 at z = 2**19: epsilon a hair above the floor,
  # which some z <= 2**20 reaches.
  target = accounting.compute_training_epsilon(2.0**19, N, K, 1,
                                               DELTA).epsilon
  assert target < 1.0001 * rdp_floor.epsilon_floor(DELTA)

  noise_multiplier = accounting.calibrate_noise_multiplier(target, N, K, 1,
                                                           DELTA)

  assert noise_multiplier <= 2.0**19 + 1e-3
  assert accounting.compute_training_epsilon(
      noise_multiplier, N, K, 1, DELTA).epsilon <= target


def test_calibration_reports_an_unreachable_target_epsilon():
  # With delta = 1e-12 the RDP accountant's orders (<= 1024) cannot go below
  # epsilon ~ 0.02 for any noise_multiplier <= 2**20.
  with pytest.raises(ValueError, match='`target_epsilon`.*unreachable'):
    accounting.calibrate_noise_multiplier(0.01, N, K, 100, 1e-12)


# ----------------------------------------------------------------------------
# Population extrapolation (McMahan et al. 2018; Pelikan et al. 2025, Table 1).


def test_extrapolation_keeps_noise_per_client_fixed():
  rows = accounting.extrapolate_population(
      0.5, 100, 10_000, 1000, DELTA, scales=[(1, 1), (10, 10), (10, 100)])

  assert [(r.clients_per_round, r.population_size) for r in rows] == [
      (100, 10_000), (1000, 100_000), (1000, 1_000_000)]
  for row in rows:
    assert row.noise_multiplier / row.clients_per_round == pytest.approx(
        0.5 / 100, rel=1e-12)
    assert row.sampling_probability == pytest.approx(
        row.clients_per_round / row.population_size)


@pytest.mark.parametrize('sampling', ['poisson', 'fixed_size'])
def test_extrapolated_epsilon_decreases_as_population_grows(sampling):
  rows = accounting.extrapolate_population(
      0.5, 100, 10_000, 1000, DELTA, scales=[(1, 1), (1, 10), (1, 100)],
      sampling=sampling)

  epsilons = [row.guarantees['rdp'].epsilon for row in rows]
  assert all(a > b for a, b in zip(epsilons, epsilons[1:]))


def test_extrapolation_rows_are_training_epsilons():
  row, = accounting.extrapolate_population(
      0.5, 100, 10_000, 1000, DELTA, scales=[(4, 40)],
      accountants=('rdp', 'pld'))

  for accountant in ('rdp', 'pld'):
    assert row.guarantees[accountant] == accounting.compute_training_epsilon(
        2.0, 400, 400_000, 1000, DELTA, accountant=accountant)


# ----------------------------------------------------------------------------
# A run's epsilon every round, cheaper: the same bits as dp_accounting's.


def _round_pld(noise_multiplier, sampling_probability, grid):
  return pld.privacy_loss_distribution.from_gaussian_mechanism(
      standard_deviation=noise_multiplier, value_discretization_interval=grid,
      sampling_prob=sampling_probability)


def _pmfs(privacy_loss_distribution):
  # pylint: disable=protected-access
  return [privacy_loss_distribution._pmf_remove,
          privacy_loss_distribution._pmf_add]


@pytest.mark.parametrize('noise_multiplier,sampling_probability',
                         [(0.64, 0.05), (1.3, 0.01)])
def test_a_cached_rounds_self_composition_and_epsilon_are_dp_accountings_bits(
    noise_multiplier, sampling_probability):
  """The round's PLD self-composed T times with the Chernoff bounds' moment
  generating functions computed once, and epsilon read off in NumPy, are
  dp_accounting 0.4.3's own `self_compose(T)` and `get_epsilon_for_delta`,
  bit for bit, for every T of a run and deltas from 1e-9 to 0.5."""
  round_pld = _round_pld(noise_multiplier, sampling_probability, 2**-9)
  cached = pld_numpy.SampledRound(round_pld)
  for count in (1, 2, 3, 7, 20, 64, 100):
    want, got = round_pld.self_compose(count), cached.self_compose(count)
    for a, b in zip(_pmfs(want), _pmfs(got), strict=True):
      # pylint: disable=protected-access
      assert (a._lower_loss, a._infinity_mass) == (b._lower_loss,
                                                    b._infinity_mass)
      assert a._probs.tobytes() == b._probs.tobytes()
    composed = pld.privacy_loss_distribution.identity(2**-9).compose(got)
    for delta in (1e-9, 1e-5, 1e-4, 0.01, 0.5):
      assert pld_numpy.pld_epsilon(composed, delta) == (
          composed.get_epsilon_for_delta(delta)), (count, delta)


def _assert_same_bits(want, got):
  for a, b in zip(_pmfs(want), _pmfs(got), strict=True):
    # pylint: disable=protected-access
    assert type(a) is type(b)  # pylint: disable=unidiomatic-typecheck
    assert a._infinity_mass == b._infinity_mass
    if isinstance(a, pld_pmf.SparsePLDPmf):
      assert a._loss_probs == b._loss_probs
    else:
      assert a._lower_loss == b._lower_loss
      assert a._probs.tobytes() == b._probs.tobytes()


@pytest.mark.parametrize('noise_multiplier,sampling_probability,grid', [
    (0.7, 0.04, 2**-12),  # The README command's first grid.
    (0.64, 0.05, 2**-9),
    (float(np.float32(1.2398609)), 0.05, 2**-10),  # A float32 z.
    (5.0, 0.001, 2**-14),
    (0.3, 0.5, 2**-8),
    (20.0, 0.9, 1e-4),  # Most losses past the ADD edge -log(1 - q).
    (0.5, 1e-6, 1e-4),
    (1.0, 1.0, 2**-9),  # Unsampled (a banded or BLT round's event).
    (3.0 / np.sqrt(7), 1.0, 2**-12),
])
def test_a_rounds_pld_built_in_numpy_is_dp_accountings_bits(
    noise_multiplier, sampling_probability, grid):
  """One Poisson-sampled Gaussian round's PLD, its hockey-stick divergences
  taken for the whole grid at once, is dp_accounting 0.4.3's own
  `from_gaussian_mechanism`, byte for byte, both adjacencies (a mutation of
  the inverse privacy loss, even in its last bit, moves a probability)."""
  _assert_same_bits(
      _round_pld(noise_multiplier, sampling_probability, grid),
      pld_numpy.gaussian_round(noise_multiplier, sampling_probability, grid))


def test_unsampled_gaussian_rounds_are_accounted_as_dp_accounting_does():
  """Unsampled Gaussian events (a correlated-noise run's rounds), alone,
  self-composed and beside Poisson rounds: the PLD accountant's epsilon is
  dp_accounting's own `PLDAccountant`'s, to the bit."""
  poisson = dp_accounting.PoissonSampledDpEvent(
      0.05, dp_accounting.GaussianDpEvent(1.1))
  for event in (dp_accounting.GaussianDpEvent(2.5),
                dp_accounting.SelfComposedDpEvent(
                    dp_accounting.GaussianDpEvent(7.0), 12),
                dp_accounting.ComposedDpEvent([
                    dp_accounting.SelfComposedDpEvent(poisson, 30),
                    dp_accounting.GaussianDpEvent(4.0),
                    dp_accounting.GaussianDpEvent(5.5)])):
    for grid in (2**-10, 1e-4):
      want = dp_accounting.pld.PLDAccountant(
          value_discretization_interval=grid).compose(event)
      got = accountants.compose(accountants.PLD, event,
                                accountants.ADD_OR_REMOVE, grid)
      for delta in (1e-6, 1e-3):
        assert got.get_epsilon(delta) == want.get_epsilon(delta), (
            event, grid, delta)


@pytest.mark.parametrize('truncation', [1e-15, 1e-10, 0.0])
def test_two_plds_composed_in_numpy_are_dp_accountings_bits(truncation):
  """Rounds of distinct noise (float32 multipliers a bit apart, sampling
  rates apart, an unsampled Gaussian), each self-composed, then composed
  in turn: `pld_numpy.compose` is dp_accounting 0.4.3's `compose`, byte for
  byte, PMF by PMF (dense and sparse alike)."""
  grid = 2**-9
  parts = [_round_pld(z, q, grid).self_compose(count) for z, q, count in (
      (float(np.float32(1.2398609)), 0.05, 96),
      (float(np.float32(1.2398608)), 0.05, 2),
      (0.9, 0.01, 30))]
  parts.append(pld.privacy_loss_distribution.from_gaussian_mechanism(
      standard_deviation=3.0, value_discretization_interval=grid))
  want = got = pld.privacy_loss_distribution.identity(grid)
  for part in parts:
    want = want.compose(part, tail_mass_truncation=truncation)
    got = pld_numpy.compose(got, part, tail_mass_truncation=truncation)
    _assert_same_bits(want, got)
  sparse = pld.privacy_loss_distribution.identity(grid)
  _assert_same_bits(sparse.compose(sparse), pld_numpy.compose(sparse, sparse))


def _tff_round(z_value):
  # A round of TFF's adaptive Gaussian: the value's z as float32, the
  # clipped count's 5.0, on a 5% Poisson-sampled cohort.
  return dp_accounting.PoissonSampledDpEvent(
      0.05, dp_accounting.ComposedDpEvent([
          dp_accounting.GaussianDpEvent(float(np.float32(z_value))),
          dp_accounting.GaussianDpEvent(5.0)]))


def _direct_pld_epsilon(events, grid, delta=1e-4):
  accountant = pld.PLDAccountant(value_discretization_interval=grid)
  for event in events:
    accountant.compose(event)
  return accountant.get_epsilon(delta)


def test_rounds_of_float32_neighbouring_noise_are_accounted_at_the_least(
    dp_accounting_builds_each_round_once):
  """TFF's adaptive clipping recomputes its value's noise multiplier in
  float32 every round, a few ulps apart: from the first such neighbour on,
  the rounds are accounted together at the least effective z so far (dp_accounting's own PLD
  accountant on that one Gaussian, to the bit), an upper bound on composing
  them one by one that differs from it in the 7th digit."""
  z_values = [1.2398609] * 5 + [1.2398608] + [1.2398610] * 3
  assert len({float(np.float32(z)) for z in z_values}) == 3
  rounds = [_tff_round(z) for z in z_values]
  for t in (6, len(rounds)):  # The first neighbour; the last round.
    ours = accounting.compute_epsilon(
        dp_accounting.ComposedDpEvent(rounds[:t]), 1e-4, 'pld')
    least = min(float(np.float32(z)) for z in z_values[:t])
    effective = (least**-2 + 5.0**-2)**-0.5  # One cohort, two Gaussians.
    merged = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(
            0.05, dp_accounting.GaussianDpEvent(effective)), t)
    grid = ours.value_discretization_interval
    assert ours.epsilon == _direct_pld_epsilon([merged], grid), t
  exact = _direct_pld_epsilon(
      [dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(
          (float(np.float32(z))**-2 + 5.0**-2)**-0.5)) for z in z_values],
      grid)
  assert exact <= ours.epsilon <= exact * (1 + 1e-6)


def test_rounds_of_distinct_noise_are_composed_as_dp_accounting_does(
    dp_accounting_builds_each_round_once):
  """Rounds whose noise multipliers are more than float32 rounding apart
  are composed one by one: dp_accounting's own PLD accountant on the same
  events, to the bit, after every round."""
  rounds = [_tff_round(z) for z in [1.24] * 3 + [1.25] + [1.3] * 2]
  oracle, grid = None, None
  for t in range(1, len(rounds) + 1):
    event = dp_accounting.ComposedDpEvent(rounds[:t])
    ours = accounting.compute_epsilon(event, 1e-4, 'pld')
    view = accountants.accounting_view(event, accountants.ADD_OR_REMOVE)
    # dp_accounting composes a composed event's rounds one after another:
    # its accountant at the same grid takes round t after rounds 1..t-1.
    if ours.value_discretization_interval != grid:
      grid = ours.value_discretization_interval
      oracle = pld.PLDAccountant(value_discretization_interval=grid)
      oracle.compose(dp_accounting.ComposedDpEvent(view.events[:-1]))
    oracle.compose(view.events[-1])
    assert ours.epsilon == oracle.get_epsilon(1e-4), t


def test_the_numpy_epsilon_is_dp_accountings_at_its_edges():
  """An infinite loss's mass above delta (inf), all mass within delta (0),
  and a PMF whose losses all lie below zero: dp_accounting's answers."""
  rng = np.random.default_rng(0)
  probs = rng.random(500)
  probs /= probs.sum() * 1.001
  for lower_loss, infinity_mass in ((-200, 1e-3), (-600, 1e-7), (-1000, 0.0),
                                    (-20, 0.0), (5, 1e-6)):
    pmf = pld_pmf.DensePLDPmf(0.01, lower_loss, probs, infinity_mass, True)
    for delta in (1e-8, 1e-6, 1e-4, 1e-3, 0.1, 0.9):
      assert pld_numpy.pmf_epsilon(pmf, delta) == (
          pmf.get_epsilon_for_delta(delta)), (lower_loss, infinity_mass, delta)


def test_a_sparse_pmfs_epsilon_is_dp_accountings():
  # A PLD whose losses are few (z large against the grid, or composed
  # events) is a `SparsePLDPmf`, with no dense array: dp_accounting answers.
  sparse = pld_pmf.SparsePLDPmf({-3: 0.2, 0: 0.5, 4: 0.299}, 0.01, 1e-3,
                                True)
  for delta in (1e-6, 1e-3, 0.01, 0.1):
    assert pld_numpy.pmf_epsilon(sparse, delta) == (
        sparse.get_epsilon_for_delta(delta)), delta


def test_an_epsilon_asked_again_is_the_one_computed_and_types_are_kept():
  """A guarantee asked twice is answered from the process's cache with the
  figure computed afresh; an event differing only in a value's type
  (float32(0.6) is not 0.6) is a different question."""
  event = dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
      0.02, dp_accounting.GaussianDpEvent(0.9)), 30)
  first = accounting.compute_epsilon(event, 1e-5, 'pld')
  accountants._GUARANTEE_CACHE.clear()  # pylint: disable=protected-access
  fresh = accountants._guarantee(  # pylint: disable=protected-access
      accountants.accounting_view(event, accountants.ADD_OR_REMOVE),
      accountants.ADD_OR_REMOVE, 1e-5, 'pld', None)
  assert first == fresh == accounting.compute_epsilon(event, 1e-5, 'pld')
  key = accountants.event_key
  assert key(dp_accounting.GaussianDpEvent(np.float32(0.6))) != key(
      dp_accounting.GaussianDpEvent(0.6))
  assert key(event) == key(dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(
          0.02, dp_accounting.GaussianDpEvent(0.9)), 30))


def test_the_kept_round_plds_go_least_recently_used_first_within_a_budget(
    monkeypatch):
  # A sweep's trainings take turns at a few noise multipliers: the round
  # asked for again stays, the one unused longest goes, and the PMFs kept
  # stay within the byte budget; what is asked is built again, the same.
  from tff_clip.privacy import accountants
  monkeypatch.setattr(accountants, '_PLD_CACHE', collections.OrderedDict())
  monkeypatch.setattr(accountants, '_PLD_CACHE_SIZE', 3)
  keys = [(z, 0.05, 1e-3) for z in (1.0, 1.5, 2.0, 3.0)]
  first = accountants._sampled_round(keys[0])
  for key in keys[1:3]:
    accountants._sampled_round(key)
  assert accountants._sampled_round(keys[0]) is first  # Used again: kept.
  accountants._sampled_round(keys[3])
  assert list(accountants._PLD_CACHE) == [keys[2], keys[0], keys[3]]
  budget = sum(r.nbytes for r in accountants._PLD_CACHE.values()) - 1
  monkeypatch.setattr(accountants, '_PLD_CACHE_BYTES', budget)
  again = accountants._sampled_round(keys[1])
  assert keys[1] in accountants._PLD_CACHE and keys[2] not in (
      accountants._PLD_CACHE)
  assert sum(r.nbytes for r in accountants._PLD_CACHE.values()) <= budget
  _assert_same_bits(_round_pld(1.5, 0.05, 1e-3), again.pld)


@pytest.mark.parametrize('accountant', ['pld', 'rdp'])
def test_an_event_composed_no_times_adds_nothing(accountant):
  # `SelfComposedDpEvent(e, 0)` is accepted (a run of 0 rounds) and spends
  # nothing; PLD divided by sqrt(0) on it. Oracle: dp_accounting's own
  # accountant on the events without it (dp_accounting refuses count 0).
  gaussian = dp_accounting.GaussianDpEvent(1.0)
  sampled = dp_accounting.PoissonSampledDpEvent(0.1, gaussian)
  none = dp_accounting.SelfComposedDpEvent
  assert accounting.compute_epsilon(
      none(sampled, 0), 1e-5, accountant=accountant).epsilon == 0.0
  oracle = (dp_accounting.pld.PLDAccountant if accountant == 'pld' else
            dp_accounting.rdp.RdpAccountant)
  for rest in (gaussian, none(sampled, 3)):
    event = dp_accounting.ComposedDpEvent(
        [rest, none(gaussian, 0), none(sampled, 0)])
    assert accounting.compute_epsilon(
        event, 1e-5, accountant=accountant).epsilon == pytest.approx(
            oracle().compose(rest).get_epsilon(1e-5), rel=1e-6)


@pytest.mark.parametrize('parameter', [-1.0, 0.0, math.nan, math.inf])
@pytest.mark.parametrize('accountant', ['pld', 'rdp'])
def test_a_laplace_event_without_a_positive_scale_is_refused_naming_it(
    parameter, accountant):
  # RDP gave epsilon 0.0035 for a scale of -1 and 0 for NaN; PLD and RDP
  # divided by 0 for 0 (a Laplace mechanism's epsilon is 1 / scale > 0).
  with pytest.raises(ValueError, match='laplace noise_multiplier'):
    accounting.compute_epsilon(dp_accounting.LaplaceDpEvent(parameter), 1e-5,
                               accountant=accountant)
  # A positive scale b: about its closed form 1 / b (RDP a little above).
  assert 0.499 <= accounting.compute_epsilon(
      dp_accounting.LaplaceDpEvent(2.0), 1e-5,
      accountant=accountant).epsilon <= 0.51
