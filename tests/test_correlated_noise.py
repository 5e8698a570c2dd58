"""Specification of correlated noise (`tff_clip.aggregation.correlated_noise`), its
accounting (`tff_clip.privacy.accounting`) and participation with minimum separation
(`tff_clip.privacy.sampling`).

Oracles: scipy's matrix square root of the prefix-sum matrix, brute force over
every participation pattern, dp_accounting's Gaussian RDP,
tensorflow-privacy's tree accountant, and TFF's own tree-aggregation factory.
"""

import collections
import itertools
import math

import dp_accounting
from dp_accounting.rdp import rdp_privacy_accountant
import numpy as np
import pytest
import scipy.linalg
import scipy.special
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_privacy.privacy.analysis import tree_aggregation_accountant

from tff_clip.aggregation import correlated_noise
from tff_clip.aggregation import dp
from tff_clip.aggregation import mechanisms
from tff_clip.privacy import accounting
from tff_clip.privacy import sampling

DELTA = 1e-5


def _prefix_sum_root(rounds):
  """The exact square root of the lower-triangular all-ones matrix."""
  root = np.real(scipy.linalg.sqrtm(np.tril(np.ones((rounds, rounds)))))
  np.testing.assert_allclose(root @ root, np.tril(np.ones((rounds, rounds))),
                             atol=1e-9)
  return root


def _banded_root(rounds, bands):
  root = _prefix_sum_root(rounds)
  return np.tril(root) - np.tril(root, -bands)


# ----------------------------------------------------------------------------
# The factorization.


@pytest.mark.parametrize('rounds', [1, 2, 5, 9])
def test_full_band_matrix_is_the_square_root_of_the_prefix_sum_matrix(rounds):
  matrix = correlated_noise.banded_matrix(rounds, rounds)
  np.testing.assert_allclose(matrix, _prefix_sum_root(rounds), atol=1e-9)
  np.testing.assert_allclose(np.linalg.norm(matrix, axis=0),
                             np.linalg.norm(_prefix_sum_root(rounds), axis=0),
                             atol=1e-9)
  assert correlated_noise.max_column_norm(rounds) == pytest.approx(
      np.linalg.norm(_prefix_sum_root(rounds), axis=0).max(), abs=1e-12)


@pytest.mark.parametrize('rounds,bands', [(6, 1), (6, 2), (8, 3), (7, 7)])
def test_banded_matrix_is_the_truncated_square_root(rounds, bands):
  np.testing.assert_allclose(correlated_noise.banded_matrix(bands, rounds),
                             _banded_root(rounds, bands), atol=1e-9)


def _patterns(rounds, separation):
  """Every nonempty set of rounds with pairwise gaps >= separation."""
  for size in range(1, rounds + 1):
    for pattern in itertools.combinations(range(rounds), size):
      if all(b - a >= separation for a, b in zip(pattern, pattern[1:])):
        yield pattern


@pytest.mark.parametrize('bands,separation', [(1, 1), (1, 3), (2, 2), (2, 3),
                                              (3, 3), (3, 4), (4, 4)])
def test_sensitivity_is_the_max_over_every_participation_pattern(
    bands, separation):
  oracle_c = None
  for rounds in range(1, 11):
    oracle_c = _banded_root(rounds, bands)
    worst = max(np.linalg.norm(oracle_c[:, list(p)].sum(axis=1))
                for p in _patterns(rounds, separation))
    bound = correlated_noise.sensitivity(bands, rounds, separation)
    assert worst <= bound * (1 + 1e-12)
    k = correlated_noise.participations(rounds, separation)
    if rounds >= (k - 1) * separation + bands:  # Every column can be full.
      assert worst == pytest.approx(bound, rel=1e-12)


@pytest.mark.parametrize('bands', [5, 20, 342])
def test_banded_accounts_the_float32_coefficients_its_noise_runs(bands):
  # The recursion runs with c_j = binom(2j, j) / 4^j rounded to float32; the
  # C whose inverse it applies has those coefficients, and rounded up they
  # make its column norm larger than the float64 one (b = 342: 1e-9).
  j = np.arange(bands)
  running = (scipy.special.binom(2 * j, j) / 4.0**j).astype(np.float32)
  column_norm = np.linalg.norm(running.astype(np.float64))
  mechanism = mechanisms.noise_mechanism('banded', bands, rounds=2 * bands,
                                         separation=bands)
  assert mechanism.participation_sensitivity >= column_norm
  assert mechanism.participation_sensitivity == pytest.approx(column_norm,
                                                              rel=1e-13)


def test_separation_below_bands_is_refused_because_the_bound_breaks():
  # Adjacent participations overlap in C's bands: the brute-force worst case
  # exceeds sqrt(k) max column norm, so the formula must not be used.
  rounds, bands, separation = 6, 3, 2
  worst = max(np.linalg.norm(_banded_root(rounds, bands)[:, list(p)].sum(1))
              for p in _patterns(rounds, separation))
  naive = math.sqrt(3) * correlated_noise.max_column_norm(bands)
  assert worst > naive
  with pytest.raises(ValueError, match='`bands`'):
    correlated_noise.sensitivity(bands, rounds, separation)
  with pytest.raises(ValueError, match='`bands`'):
    accounting.correlated_training_event('banded', 1.0, bands, rounds,
                                         separation)


# `tff_clip.checks`' rule: a wrong type is a TypeError, a bad value a
# ValueError.
@pytest.mark.parametrize('bad, error', [(0, ValueError), (-1, ValueError),
                                        (1.5, TypeError), (True, TypeError),
                                        (None, TypeError)])
def test_bad_bands_are_refused(bad, error):
  with pytest.raises(error, match='`bands`'):
    mechanisms.noise_mechanism('banded', bad)
  with pytest.raises(error, match='`bands`'):
    dp.dp_factory('clip', noise_multiplier=1.0, clients_per_round=2,
                  clip_norm=1.0, noise_mechanism='banded', bands=bad)


def test_bad_mechanism_and_client_noise_are_refused():
  with pytest.raises(ValueError, match='`noise_mechanism`'):
    dp.dp_factory('clip', noise_multiplier=1.0, clients_per_round=2,
                  clip_norm=1.0, noise_mechanism='fancy')
  with pytest.raises(ValueError, match='`noise_mechanism`'):
    dp.dp_factory('clip', noise_multiplier=1.0, clients_per_round=2,
                  clip_norm=1.0, noise_mechanism='banded', bands=2,
                  noise_placement='client')


# ----------------------------------------------------------------------------
# Noise generation (query level, eager).

SPECS = collections.OrderedDict(a=tf.TensorSpec([4000]),
                                b=tf.TensorSpec([20, 300]))


def _query(mechanism, bands, clip_norm=1.0, z=1.0, seed=7):
  query = dp.BoundedGaussianSumQuery('clip', clip_norm, z, noise_seed=seed,
                                     noise_mechanism=mechanism, bands=bands)
  query.set_template(SPECS)
  return query


def _run(query, rounds, state=None):
  state = query.initial_global_state() if state is None else state
  zeros = query.initial_sample_state(SPECS)
  outputs = []
  for _ in range(rounds):
    result, state, _ = query.get_noised_result(zeros, state)
    outputs.append(np.concatenate([np.ravel(x) for x in
                                   tf.nest.flatten(result)]))
  return np.array(outputs), state


def test_one_band_is_bit_identical_to_independent_noise():
  banded, _ = _run(_query('banded', 1), 4)
  independent, _ = _run(_query('independent', 1), 4)
  np.testing.assert_array_equal(banded, independent)


@pytest.mark.parametrize('mechanism,bands', [('banded', 3), ('tree', 4),
                                             ('tree', 3)])
def test_noise_stream_resumes_bit_exactly_from_a_checkpoint(mechanism, bands):
  query = _query(mechanism, bands)
  straight, _ = _run(query, 7)
  first, state = _run(query, 3)
  saved = tf.nest.map_structure(np.array, state)  # What a checkpoint holds.
  resumed_query = _query(mechanism, bands, seed=None)  # Key from the state.
  restored = tf.nest.map_structure(tf.constant, saved)
  second, _ = _run(resumed_query, 4, restored)
  np.testing.assert_array_equal(np.concatenate([first, second]), straight)
  if mechanism == 'banded':
    # The past noise is part of what must be restored.
    forgotten = restored._replace(noise_history=tf.nest.map_structure(
        tf.zeros_like, restored.noise_history))
    assert not np.array_equal(_run(resumed_query, 1, forgotten)[0],
                              straight[3:4])


@pytest.mark.parametrize('mechanism', ['tree', 'banded'])
def test_float64_records_get_the_float32_noise_of_float32_records(mechanism):
  # Noise is drawn in float32 whatever the records' dtype: a float64 sum
  # receives exactly the float32 noise, cast.
  released = []
  for dtype in (tf.float32, tf.float64):
    specs = [tf.TensorSpec([50], dtype)]
    query = dp.BoundedGaussianSumQuery('clip', 1.0, 1.0, noise_seed=4,
                                       noise_mechanism=mechanism, bands=2)
    query.set_template(specs)
    state = query.initial_global_state()
    for _ in range(3):
      result, state, _ = query.get_noised_result(
          query.initial_sample_state(specs), state)
    released.append(result[0].numpy())
  assert released[1].dtype == np.float64
  np.testing.assert_array_equal(released[1], released[0].astype(np.float64))


def test_banded_noise_covariance_across_rounds_is_c_inverse_c_inverse_t():
  rounds, bands, clip_norm, z = 6, 3, 2.0, 1.5
  noise, _ = _run(_query('banded', bands, clip_norm, z), rounds)
  inverse = np.linalg.inv(_banded_root(rounds, bands))
  expected = (z * clip_norm)**2 * inverse @ inverse.T
  empirical = noise @ noise.T / noise.shape[1]  # 10000 samples per entry.
  np.testing.assert_allclose(empirical, expected,
                             atol=0.05 * (z * clip_norm)**2)
  np.testing.assert_allclose(
      mechanisms.noise_mechanism('banded', bands).noise_covariance(rounds),
      inverse @ inverse.T, atol=1e-9)


def _tff_tree_prefix_variance(rounds, z, clip_norm):
  specs = [tf.TensorSpec([10000], tf.float32)]
  factory = tff.aggregators.DifferentiallyPrivateFactory.tree_aggregation(
      noise_multiplier=z, clients_per_round=1.0, l2_norm_clip=clip_norm,
      record_specs=specs, noise_seed=3, use_efficient=False)
  process = factory.create(tff.types.to_type([(np.float32, [10000])]))
  state = process.initialize()
  outputs = []
  for _ in range(rounds):
    output = process.next(state, [[np.zeros(10000, np.float32)]])
    state = output.state
    outputs.append(np.asarray(output.result[0]))
  return np.var(np.cumsum(outputs, axis=0), axis=1)


def test_tree_prefix_sum_variance_matches_tffs_tree_aggregation():
  rounds, z, clip_norm = 7, 1.3, 0.5
  tff_variance = _tff_tree_prefix_variance(rounds, z, clip_norm)
  noise, _ = _run(_query('tree', 8, clip_norm, z), rounds)
  ours = np.var(np.cumsum(noise, axis=0), axis=1)
  # Std error of a variance from 10000 samples ~1.4%: 8% is > 5 sigma.
  np.testing.assert_allclose(ours, tff_variance, rtol=0.08)
  # Both follow popcount(t) node noises (the binary tree, not the efficient).
  popcount = np.array([bin(t).count('1') for t in range(1, rounds + 1)])
  np.testing.assert_allclose(ours, popcount * (z * clip_norm)**2, rtol=0.08)


def test_tree_restarts_every_bands_rounds():
  noise, _ = _run(_query('tree', 2, 1.0, 1.0), 4)
  prefix = np.cumsum(noise, axis=0)
  # Round 2 starts a new tree whose prefix noise is independent of the old.
  restarted = prefix[3] - prefix[1]
  assert np.var(restarted) == pytest.approx(1.0, rel=0.08)
  assert abs(np.corrcoef(restarted, prefix[1])[0, 1]) < 0.05


# Noise sizes at a fixed seed on a million entries per round: the sample std
# has relative standard error 1/sqrt(2e6) = 0.07%, so 0.3% is > 4 of them
# and a noise 1% too small fails (as in tests/test_dp.py).
BIG_SPECS = [tf.TensorSpec([1_000_000], tf.float32)]
NOISE_RTOL = 0.003


def _big_run(mechanism, bands, rounds, clip_norm, z):
  query = dp.BoundedGaussianSumQuery('clip', clip_norm, z, noise_seed=9,
                                     noise_mechanism=mechanism, bands=bands)
  query.set_template(BIG_SPECS)
  state, zeros = query.initial_global_state(), query.initial_sample_state(
      BIG_SPECS)
  noised = tf.function(query.get_noised_result)
  outputs = []
  for _ in range(rounds):
    result, state, _ = noised(zeros, state)
    outputs.append(np.asarray(result[0], np.float64))
  return np.array(outputs)


def test_banded_noise_std_of_each_round_is_z_c_times_its_row_of_c_inverse():
  """Round t adds z C (C^-1 w)_t: std z C ||row t of C^-1||, C the banded
  square root (the oracle inverts scipy's truncated matrix square root)."""
  rounds, bands, clip_norm, z = 5, 3, 2.0, 1.5
  noise = _big_run('banded', bands, rounds, clip_norm, z)
  inverse = np.linalg.inv(_banded_root(rounds, bands))
  expected = z * clip_norm * np.linalg.norm(inverse, axis=1)
  np.testing.assert_allclose(np.std(noise, axis=1), expected, rtol=NOISE_RTOL)


def test_tree_prefix_noise_std_is_z_c_sqrt_popcount():
  """The prefix sum of t rounds of tree noise is the sum of popcount(t)
  node noises of std z C (Kairouz et al. 2021, Alg. 1)."""
  rounds, clip_norm, z = 7, 0.5, 1.3
  prefix = np.cumsum(_big_run('tree', 8, rounds, clip_norm, z), axis=0)
  popcount = np.array([bin(t).count('1') for t in range(1, rounds + 1)])
  np.testing.assert_allclose(np.std(prefix, axis=1),
                             z * clip_norm * np.sqrt(popcount),
                             rtol=NOISE_RTOL)


# ----------------------------------------------------------------------------
# Accounting.


def _gaussian_epsilon(noise_multiplier, count):
  accountant = rdp_privacy_accountant.RdpAccountant(accounting.RDP_ORDERS)
  accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier), count)
  return accountant.get_epsilon(DELTA)


@pytest.mark.parametrize('rounds', [1, 10, 100])
def test_one_band_epsilon_is_independent_noise_without_amplification(rounds):
  z = 2.0
  ours = accounting.compute_epsilon(accounting.correlated_training_event(
      'banded', z, 1, rounds, 1), DELTA).epsilon
  assert ours == pytest.approx(_gaussian_epsilon(z, rounds), rel=1e-9)
  independent = accounting.compute_epsilon(accounting.correlated_training_event(
      'independent', z, 1, rounds, 1), DELTA).epsilon
  assert ours == independent


@pytest.mark.parametrize('bands,separation,rounds', [(2, 2, 10), (4, 5, 24),
                                                     (8, 8, 64)])
def test_banded_epsilon_is_one_gaussian_with_z_over_the_sensitivity(
    bands, separation, rounds):
  z = 3.0
  ours = accounting.compute_epsilon(accounting.correlated_training_event(
      'banded', z, bands, rounds, separation), DELTA).epsilon
  brute_sensitivity = max(
      np.linalg.norm(_banded_root(rounds, bands)[:, list(p)].sum(1))
      for p in [range(0, rounds, separation)])
  assert brute_sensitivity == pytest.approx(
      correlated_noise.sensitivity(bands, rounds, separation), rel=1e-9)
  assert ours == pytest.approx(_gaussian_epsilon(z / brute_sensitivity, 1),
                               rel=1e-6)


@pytest.mark.parametrize('bands,rounds', [(1, 5), (4, 12), (7, 30), (16, 40)])
def test_tree_epsilon_is_tensorflow_privacys_tree_restart(bands, rounds):
  z = 2.5
  ours = accounting.compute_epsilon(accounting.correlated_training_event(
      'tree', z, bands, rounds, bands), DELTA).epsilon
  trees = correlated_noise.participations(rounds, bands)
  rdp = tree_aggregation_accountant.compute_rdp_tree_restart(
      z, [bands] * trees, accounting.RDP_ORDERS)
  oracle, _ = rdp_privacy_accountant.compute_epsilon(accounting.RDP_ORDERS,
                                                     rdp, DELTA)
  assert ours == pytest.approx(oracle, rel=1e-9)


def test_min_separation_ledger_charges_one_participation_per_cycle():
  event = dp_accounting.GaussianDpEvent(2.0)
  events = [accounting.min_separation_round_event(event, t, 3)
            for t in range(10)]
  charged = [t for t, e in enumerate(events) if e == event]
  assert charged == [0, 3, 6, 9]
  assert all(isinstance(e, dp_accounting.NoOpDpEvent) for t, e in
             enumerate(events) if t not in charged)
  with pytest.raises(ValueError, match='min_separation_round_event'):
    accounting.round_event(event, 2, 10, 'min_separation')


@pytest.mark.parametrize('mechanism,bands', [('banded', 4), ('tree', 4),
                                             ('banded', 1)])
def test_calibration_meets_the_target(mechanism, bands):
  z = accounting.calibrate_correlated_noise_multiplier(
      4.0, mechanism, bands, 40, bands, DELTA)
  epsilon = accounting.compute_epsilon(accounting.correlated_training_event(
      mechanism, z, bands, 40, bands), DELTA).epsilon
  assert 4.0 - 1e-3 <= epsilon <= 4.0
  looser = accounting.compute_epsilon(accounting.correlated_training_event(
      mechanism, z * 0.99, bands, 40, bands), DELTA).epsilon
  assert looser > 4.0


# ----------------------------------------------------------------------------
# Participation with minimum separation.


def _group_of(ids, separation, seed):
  return dict(zip(ids, sampling.separation_groups(ids, separation, seed)))


def test_min_separation_sampler_keeps_clients_apart():
  ids = [f'client_{i}' for i in range(60)]
  separation, rounds = 4, 21
  group_of = _group_of(ids, separation, 3)
  # 60 clients in 4 groups: 15 each, every one of them trained each round.
  sampler = sampling.ClientSampler(ids, 15, 'min_separation', seed=3,
                                   separation=separation)
  seen = collections.defaultdict(list)
  for t in range(rounds):
    cohort = sampler.sample(t)
    assert len(cohort) == 15
    assert all(group_of[c] == t % separation for c in cohort)
    for client in cohort:
      seen[client].append(t)
  assert len(seen) == 60
  k = correlated_noise.participations(rounds, separation)
  for rounds_of_client in seen.values():
    assert len(rounds_of_client) <= k
    assert all(b - a >= separation
               for a, b in zip(rounds_of_client, rounds_of_client[1:]))


def test_min_separation_refuses_a_cohort_larger_than_a_group():
  # 50 clients in 4 groups hold 12 or 13: 13 per round cannot be honoured,
  # and dividing a group of 12's sum by 13 would shrink every update.
  ids = [str(i).zfill(2) for i in range(50)]
  with pytest.raises(ValueError, match=r'`clients_per_round` \(13\) exceeds '
                     r'the smallest minimum-separation group.*groups of 12 '
                     r'to 13.*at most 12'):
    sampling.ClientSampler(ids, 13, 'min_separation', seed=0, separation=4)
  sampling.ClientSampler(ids, 12, 'min_separation', seed=0, separation=4)


@pytest.mark.parametrize('scheme', sampling.SAMPLINGS)
def test_cohort_does_not_depend_on_the_order_of_the_client_ids(scheme):
  ids = [f'client_{i}' for i in range(40)]
  shuffled = list(np.random.default_rng(1).permutation(ids))
  make = lambda client_ids: sampling.ClientSampler(
      client_ids, 5, scheme, seed=7, separation=2)
  for t in range(6):
    assert make(ids).sample(t) == make(shuffled).sample(t)


def test_min_separation_sampler_subsamples_a_group_to_the_cohort_size():
  ids = [str(i) for i in range(100)]
  sampler = sampling.ClientSampler(ids, 5, 'min_separation', seed=0,
                                   separation=2)
  cohort = sampler.sample(1)
  assert len(cohort) == 5
  group_of = _group_of(ids, 2, 0)
  assert all(group_of[c] == 1 for c in cohort)
  with pytest.raises(ValueError, match='`separation`'):
    sampling.ClientSampler(ids, 5, 'min_separation', separation=0)


# ----------------------------------------------------------------------------
# Through TFF, with adaptive clipping.


@pytest.mark.parametrize('method', ['normalize', 'per_layer_clip'])
def test_adaptive_bounding_with_banded_noise_composes_the_count_noise(method):
  value_type = tff.types.to_type(collections.OrderedDict(
      a=(np.float32, [3]), b=(np.float32, [2])))
  factory = dp.dp_factory(method, noise_multiplier=1.0, clients_per_round=2,
                          clip_norm='adaptive', noise_seed=1,
                          noise_mechanism='banded', bands=3, min_separation=3)
  process = factory.create(value_type)
  state = process.initialize()
  client = collections.OrderedDict(a=np.ones(3, np.float32),
                                   b=np.ones(2, np.float32))
  for _ in range(2):
    output = process.next(state, [client, client])
    state = output.state
  assert all(np.all(np.isfinite(x)) for x in output.result.values())
  event = dp.extract_dp_event(state)
  assert isinstance(event, dp_accounting.ComposedDpEvent)
  value_event, count_event = event.events
  assert isinstance(count_event, dp_accounting.GaussianDpEvent)
  # The value noise's participation event: z_v / max column norm.
  assert value_event.noise_multiplier < count_event.noise_multiplier


# ----------------------------------------------------------------------------
# Flags.


def _config(**overrides):
  from tff_clip.program import config as config_lib  # pylint: disable=g-import-not-at-top
  return config_lib.TrainConfig(**overrides)


@pytest.mark.parametrize('overrides,flag', [
    (dict(noise_mechanism='banded', bands=2), '--noise_mechanism'),
    (dict(noise_mechanism='tree', bands=2, sampling='min_separation',
          noise_placement='client'), '--noise_mechanism'),
    (dict(noise_mechanism='banded', bands=2, sampling='min_separation',
          noise_multiplier=None), '--noise_mechanism'),
    (dict(noise_mechanism='banded', bands=4, sampling='min_separation',
          min_separation=3), '--min_separation'),
    (dict(sampling='min_separation', bands=0), '--bands'),
    (dict(sampling='min_separation', min_separation=0), '--min_separation'),
])
def test_bad_correlated_flags_name_the_flag(overrides, flag):
  from tff_clip.program import config as config_lib  # pylint: disable=g-import-not-at-top
  with pytest.raises(config_lib.ConfigError, match=flag):
    config_lib.validate(_config(**overrides))


def test_good_correlated_flags_pass():
  from tff_clip.program import config as config_lib  # pylint: disable=g-import-not-at-top
  config = _config(noise_mechanism='banded', bands=3, min_separation=5,
                   sampling='min_separation')
  config_lib.validate(config)
  assert config.separation == 5
  # Audited: canaries take part under the same separation (tests/test_audit.py).
  config_lib.validate(_config(noise_mechanism='banded', bands=3,
                              sampling='min_separation', audit_canaries=10))
