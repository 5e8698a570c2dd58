"""Specification of the empirical privacy audit (`tff_clip.privacy.audit`).

Most tests drive the DP queries directly in TensorFlow (no TFF, no training):
a round is `derive_sample_params` -> `preprocess_record` of a few random
client updates -> `get_noised_result`, exactly what
`tff.aggregators.DifferentiallyPrivateFactory` runs. Oracles: dp_accounting's
analytic Gaussian mechanism, numerical integration, the ledger's epsilon
(`tff_clip.privacy.accounting`), and binomial/randomized-response facts.
"""

import collections
import json
import math

import dp_accounting
import numpy as np
import pytest
from scipy import integrate
from scipy import stats
import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp

from scripts import program
from tff_clip.aggregation import bounding
from tff_clip.aggregation import dp
from tff_clip.privacy import accounting
from tff_clip.privacy import audit
from tff_clip.program import training
import as_a_user  # pylint: disable=g-bad-import-order

DELTA = 1e-5
SPECS = [tf.TensorSpec([1500], tf.float32), tf.TensorSpec([500], tf.float32)]


def _analytic_gaussian_epsilon(noise_multiplier, delta=DELTA):
  pld = dp_accounting.pld.privacy_loss_distribution.from_gaussian_mechanism(
      noise_multiplier, value_discretization_interval=1e-4)
  return pld.get_epsilon_for_delta(delta)


# ----------------------------------------------------------------------------
# The estimator: epsilon of two Gaussians.


@pytest.mark.parametrize('mu', [0.5, 1.0, 2.0])
def test_gaussian_pair_epsilon_equals_the_analytic_gaussian_mechanism(mu):
  # N(0, 1) vs N(mu, 1) is the Gaussian mechanism with z = 1/mu.
  got = audit.gaussian_pair_epsilon(0.0, 1.0, mu, 1.0, DELTA)
  assert got == pytest.approx(_analytic_gaussian_epsilon(1.0 / mu), abs=2e-3)


def test_gaussian_pair_epsilon_with_unequal_variances_meets_delta_exactly():
  p, q = (0.0, 1.0), (0.8, 1.3)
  epsilon = audit.gaussian_pair_epsilon(*p, *q, 1e-3)

  def hockey_stick(a, b):  # int max(a(x) - e^eps b(x), 0) dx, by quadrature.
    f = lambda x: max(stats.norm.pdf(x, *a) - math.exp(epsilon) *
                      stats.norm.pdf(x, *b), 0.0)
    return integrate.quad(f, -40, 40, points=[-5, 0, 5], limit=400)[0]

  assert max(hockey_stick(p, q), hockey_stick(q, p)) == pytest.approx(
      1e-3, rel=1e-3)


def test_identical_gaussians_give_zero_and_bad_delta_is_named():
  assert audit.gaussian_pair_epsilon(0.3, 2.0, 0.3, 2.0, DELTA) == 0.0
  with pytest.raises(ValueError, match='delta'):
    audit.gaussian_pair_epsilon(0.0, 1.0, 1.0, 1.0, 1.5)
  with pytest.raises(ValueError, match='null_std'):
    audit.gaussian_pair_epsilon(0.0, 0.0, 1.0, 1.0, DELTA)


# ----------------------------------------------------------------------------
# The lower bound (Steinke, Nasr, Jagielski 2023).


def test_p_value_without_delta_is_the_binomial_tail_of_randomized_response():
  # Thm. 5.2 with delta = 0 is P[Binomial(r, e^eps / (1 + e^eps)) >= v].
  p = math.exp(1.0) / (1 + math.exp(1.0))
  expected = sum(math.comb(30, k) * p**k * (1 - p)**(30 - k)
                 for k in range(27, 31))
  assert audit.one_run_p_value(100, 30, 27, 1.0, 0.0) == pytest.approx(
      expected, rel=1e-9)
  assert audit.one_run_p_value(100, 30, 27, 1.0, 1e-3) > expected


def test_lower_bound_is_valid_at_its_confidence_on_randomized_response():
  # An exactly eps-DP mechanism on each coin: report the coin, flipped with
  # probability 1 / (1 + e^eps). The 95% lower bound may exceed eps in at
  # most ~5% of runs (Bonferroni makes it rarer).
  epsilon, trials, m = 1.0, 200, 200
  rng = np.random.default_rng(0)
  exceed, bounds = 0, []
  for _ in range(trials):
    coins = rng.random(m) < 0.5
    flip = rng.random(m) < 1 / (1 + math.exp(epsilon))
    scores = (coins ^ flip) + 1e-3 * rng.random(m)  # Random tie-breaking.
    bound = audit.one_run_lower_bound([scores], coins, 0.0)['epsilon']
    exceed += bound > epsilon
    bounds.append(bound)
  assert exceed <= 0.05 * trials
  assert np.median(bounds) > 0.3  # And it has power: it sees the leak.


# ----------------------------------------------------------------------------
# Mechanisms, correct and broken on purpose (the tests' own, not the library's).


class _NoiseReusedAcrossRounds(dp.BoundedGaussianSumQuery):
  """Seeded noise whose round counter never advances: the same draw each round."""

  def get_noised_result(self, sample_state, global_state):
    result, new_state, event = super().get_noised_result(sample_state,
                                                         global_state)
    return result, new_state._replace(round=global_state.round), event


class _ClippingSkipped(dp.BoundedGaussianSumQuery):

  def preprocess_record(self, params, record):
    return record


def _mechanism(kind, noise_multiplier, clients_per_round, noise_seed):
  # Seeded noise, so that every test is deterministic.
  if kind == 'correct':
    query = dp.BoundedGaussianSumQuery('clip', 1.0, noise_multiplier,
                                       noise_seed=noise_seed)
  elif kind == 'noise_off':
    query = dp.BoundedGaussianSumQuery('clip', 1.0, 0.0)
  elif kind == 'noise_reused_across_rounds':
    query = _NoiseReusedAcrossRounds('clip', 1.0, noise_multiplier,
                                     noise_seed=noise_seed)
  elif kind == 'noise_scaled_by_1_over_n_twice':
    # std z C / n on the sum, then the mean divides by n again.
    query = dp.BoundedGaussianSumQuery('clip', 1.0,
                                       noise_multiplier / clients_per_round,
                                       noise_seed=noise_seed)
  elif kind == 'clipping_skipped':
    query = _ClippingSkipped('clip', 1.0, noise_multiplier,
                             noise_seed=noise_seed)
  return tfp.NormalizedQuery(query, float(clients_per_round))


def _simulate(inner, *, rounds, clients_per_round, population, canaries,
              seed, specs=SPECS):
  """Runs the canary query for `rounds` rounds with Poisson-sampled clients.

  Returns the audit report; the final-model delta is the sum of the
  released aggregates (server SGD with learning rate 1).
  """
  q = clients_per_round / population
  query = audit.CanaryQuery(inner, specs, 2 * canaries, q, per_layer=False,
                            seed=seed)
  rng = np.random.default_rng(seed)
  return _run_rounds(query, rounds, specs, rng,
                     lambda: rng.binomial(population, q))


def _run_rounds(query, rounds, specs, rng, cohort_size):
  """`rounds` rounds of `query` with `cohort_size()` random clients each."""
  state = query.initial_global_state()
  noised = tf.function(query.get_noised_result)
  total = [np.zeros(s.shape, np.float32) for s in specs]
  for _ in range(rounds):
    params = query.derive_sample_params(state)
    sample = query.initial_sample_state(specs)
    for _ in range(cohort_size()):
      update = [rng.normal(0.0, 0.1, s.shape).astype(np.float32)
                for s in specs]
      sample = query.accumulate_preprocessed_record(
          sample, query.preprocess_record(params, update))
    result, state, _ = noised(sample, state)
    total = [t + r.numpy() for t, r in zip(total, result)]
  return audit.audit_report(query, state, total, DELTA)


# Three rounds, 5 of 10 clients per round (q = 1/2), z = 3: ledger eps 1.45.
SAMPLED = dict(rounds=3, clients_per_round=5, population=10, canaries=300)
SAMPLED_Z = 3.0


def _ledger_epsilon():
  return accounting.compute_training_epsilon(
      SAMPLED_Z, SAMPLED['clients_per_round'], SAMPLED['population'],
      SAMPLED['rounds'], DELTA).epsilon


@pytest.mark.slow  # An estimate's accuracy; the bounds' validity stays default.
def test_single_gaussian_mechanism_estimate_is_close_to_the_analytic_epsilon():
  # One round, every inserted canary present, no other client: the release
  # is sum of canaries + N(0, z^2 I) in d = 20,000 (Andrew et al. Thm. 3.2).
  z = 1.0
  specs = [tf.TensorSpec([20000], tf.float32)]
  inner = tfp.NormalizedQuery(
      dp.BoundedGaussianSumQuery('clip', 1.0, z, noise_seed=3), 1.0)
  report = _simulate(inner, rounds=1, clients_per_round=1, population=1,
                     canaries=1000, seed=3, specs=specs)
  analytic = _analytic_gaussian_epsilon(z)  # 4.38
  assert report['all_iterates']['estimate'] == pytest.approx(analytic,
                                                             rel=0.15)
  assert report['all_iterates']['lower_bound'] < analytic


def test_correct_mechanism_lower_bound_stays_under_the_ledger_over_seeds():
  ledger = _ledger_epsilon()
  estimates = []
  for seed in range(3):
    report = _simulate(_mechanism('correct', SAMPLED_Z, 5, seed), seed=seed,
                       **SAMPLED)
    for threat in ('final_model', 'all_iterates'):
      assert report[threat]['lower_bound'] < ledger
      estimates.append(report[threat]['estimate'])
  # The estimate is not a bound (one seed's may exceed the ledger), but on
  # average a correct mechanism is no leakier than its accounting.
  assert np.mean(estimates) < ledger


def test_tight_single_round_lower_bound_stays_under_the_ledger_over_seeds():
  # z = 2, one round, q = 1: the ledger is nearly tight (eps 2.3 by RDP).
  ledger = accounting.compute_training_epsilon(2.0, 1, 1, 1, DELTA).epsilon
  inner = lambda seed: tfp.NormalizedQuery(
      dp.BoundedGaussianSumQuery('clip', 1.0, 2.0, noise_seed=seed), 1.0)
  for seed in range(3):
    report = _simulate(inner(seed), rounds=1, clients_per_round=1, population=1,
                       canaries=200, seed=seed)
    assert report['all_iterates']['lower_bound'] < ledger


@pytest.mark.parametrize('kind', [
    'noise_off', 'noise_reused_across_rounds',
    'noise_scaled_by_1_over_n_twice', 'clipping_skipped'])
def test_broken_mechanism_is_detected(kind):
  ledger = _ledger_epsilon()
  report = _simulate(_mechanism(kind, SAMPLED_Z, 5, 11), seed=11, **SAMPLED)
  estimate = max(report['final_model']['estimate'],
                 report['all_iterates']['estimate'])
  bound = max(report['final_model']['lower_bound'],
              report['all_iterates']['lower_bound'])
  assert estimate > ledger
  if kind in ('noise_off', 'clipping_skipped'):
    # Blatant leaks: even the statistically valid bound exceeds the ledger.
    assert bound > ledger


# ----------------------------------------------------------------------------
# Canaries: sensitivity, sampling, secrecy.


VALUE_TYPE = tff.types.to_type([(np.float32, [300]), (np.float32, [30])])


@pytest.mark.parametrize('method', bounding.BOUNDINGS)
@pytest.mark.parametrize('clip_norm', [0.7, 'adaptive'])
def test_canary_arrives_exactly_at_the_sensitivity(method, clip_norm):
  # C = 0.7 split uniformly, or an adaptive norm starting at 0.7 (per-layer
  # quantiles: every layer at 0.7 / sqrt(2) as well).
  given = ({'initial_clip_norm': 0.7} if clip_norm == 'adaptive' else
           {'split': 'uniform'} if method.startswith('per_layer') else {})
  factory = dp.dp_factory(method, noise_multiplier=0.1, clients_per_round=20.0,
                          clip_norm=clip_norm, **given)
  query = audit.CanaryQuery(
      factory.build_query(VALUE_TYPE),
      tff.types.type_to_tf_tensor_specs(VALUE_TYPE), 4, 0.5,
      per_layer=method.startswith('per_layer'), seed=0)
  state = query.initial_global_state()
  params = query.derive_sample_params(state)
  _, value = query.bounded_canary(params, state.seed, 1)
  norms = [float(tf.norm(v)) for v in value]
  if method.startswith('per_layer'):  # Every layer at its budget C / sqrt(2).
    np.testing.assert_allclose(norms, [0.7 / math.sqrt(2)] * 2, rtol=1e-5)
  else:
    assert math.hypot(*norms) == pytest.approx(0.7, rel=1e-5)


def test_only_inserted_canaries_take_part_each_with_probability_q():
  # No noise, no clients, one round: a candidate's cosine with the release is
  # clearly positive iff it took part.
  q, m = 0.3, 2000
  inner = tfp.NormalizedQuery(dp.BoundedGaussianSumQuery('clip', 1.0, 0.0), 1.)
  query = audit.CanaryQuery(inner, [tf.TensorSpec([20000], tf.float32)], m, q,
                            per_layer=False, seed=5)
  state = query.initial_global_state()
  _, state, _ = tf.function(query.get_noised_result)(
      query.initial_sample_state([tf.TensorSpec([20000], tf.float32)]), state)
  inserted = state.inserted.numpy() > 0.5
  # Present: cos ~ 1/sqrt(300) = 0.058; absent: N(0, 0.007^2). Both 4 sd off.
  took_part = state.max_cosine.numpy() > 0.03
  assert not took_part[~inserted].any()
  assert abs(inserted.mean() - 0.5) < 4 * math.sqrt(0.25 / m)
  rate = took_part[inserted].mean()
  assert abs(rate - q) < 4 * math.sqrt(q * (1 - q) / inserted.sum())


@pytest.mark.parametrize('store_bytes', [audit.CANARY_STORE_BYTES, 0],
                         ids=['drawn once', 'drawn twice'])
def test_round_cosines_are_each_candidates_cosine_with_the_release(
    monkeypatch, store_bytes):
  # Oracle: NumPy's cosine of each candidate's bounded direction (as the
  # query bounds it) with the released aggregate, whether the candidates are
  # kept between the two passes (small models) or drawn again (large ones).
  monkeypatch.setattr(audit, 'CANARY_STORE_BYTES', store_bytes)
  inner = tfp.NormalizedQuery(dp.BoundedGaussianSumQuery('clip', 1.0, 0.5),
                              4.)
  query = audit.CanaryQuery(inner, SPECS, 6, 1.0, per_layer=False, seed=3)
  state = query.initial_global_state()
  clients = [tf.random.stateless_normal(s.shape, [9, i])
             for i, s in enumerate(SPECS)]
  result, new_state, _ = tf.function(query.get_noised_result)(clients, state)
  release = np.concatenate([np.ravel(x) for x in tf.nest.flatten(result)])
  params = query.derive_sample_params(state)
  expected = []
  for j in range(6):
    _, value = query.bounded_canary(params, state.seed, j)
    c = np.concatenate([np.ravel(v) for v in value])
    expected.append(c @ release / np.linalg.norm(c) / np.linalg.norm(release))
  assert np.ptp(expected) > 0.01  # Canaries in and out: distinct cosines.
  # First round: the step and the whitened release are the release itself.
  for got in (new_state.max_cosine, new_state.max_step_cosine,
              new_state.max_whitened_cosine):
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)


def test_canaries_come_from_a_secret_seed_unless_fixed():
  inner = tfp.NormalizedQuery(dp.BoundedGaussianSumQuery('clip', 1.0, 1.0), 1.)
  make = lambda seed: audit.CanaryQuery(inner, SPECS, 10, 0.5, False,
                                        seed=seed).initial_global_state()
  assert not np.array_equal(make(None).seed, make(None).seed)
  np.testing.assert_array_equal(make(4).inserted, make(4).inserted)


def test_bad_arguments_are_named():
  inner = tfp.NormalizedQuery(dp.BoundedGaussianSumQuery('clip', 1.0, 1.0), 1.)
  with pytest.raises(ValueError, match='num_candidates'):
    audit.CanaryQuery(inner, SPECS, 1, 0.5, False)
  with pytest.raises(ValueError, match='sampling_probability'):
    audit.CanaryQuery(inner, SPECS, 4, 1.5, False)
  with pytest.raises(TypeError, match='dp_factory'):
    audit.CanaryFactory(object(), 5, 0.5)
  with pytest.raises(ValueError, match='num_canaries'):
    audit.CanaryFactory(dp.dp_factory('clip', noise_multiplier=1.0, clients_per_round=10.0, clip_norm=1.0), 0,
                        0.5)
  with pytest.raises(ValueError, match='confidence'):
    audit.one_run_lower_bound([[0.0, 1.0]], [True, False], DELTA, 1.0)
  with pytest.raises(training.ConfigError, match='audit_canaries'):
    program.validate(training.TrainConfig(audit_canaries=-1))
  with pytest.raises(training.ConfigError, match='audit_canaries'):
    program.validate(training.TrainConfig(audit_canaries=5,
                                           noise_multiplier=None))
  with pytest.raises(training.ConfigError, match='audit_confidence'):
    program.validate(training.TrainConfig(audit_canaries=5,
                                           audit_confidence=1.0))


# ----------------------------------------------------------------------------
# Through TFF: the same process, state and DpEvent, plus the canaries.


def test_audited_tff_process_keeps_the_dp_event_and_reports_both_threats():
  plain = dp.dp_factory('per_layer_clip', noise_multiplier=0.5, clients_per_round=20.0, clip_norm='adaptive')
  audited = audit.CanaryFactory(plain, 10, 0.4)
  factory_before = dict(vars(audited))
  process = audited.create(VALUE_TYPE, tff.TensorType(np.float32))
  assert vars(audited) == factory_before  # `create` has no side effect.
  reference = plain.create(VALUE_TYPE, tff.TensorType(np.float32))
  rng = np.random.default_rng(0)
  data = [[rng.normal(size=300).astype(np.float32),
           rng.normal(size=30).astype(np.float32)] for _ in range(4)]
  state, reference_state = process.initialize(), reference.initialize()
  for _ in range(2):
    state = process.next(state, data, [1.0] * 4).state
    reference_state = reference.next(reference_state, data, [1.0] * 4).state
  assert dp.extract_dp_event(state) == dp.extract_dp_event(reference_state)
  report = audit.audit_report(audited.build_query(VALUE_TYPE), state,
                              [np.ones(300, np.float32),
                               np.ones(30, np.float32)], DELTA)
  assert report['rounds'] == 2 and report['candidates'] == 20
  for threat in ('final_model', 'all_iterates'):
    assert {'estimate', 'lower_bound'} <= set(report[threat])
  assert 'canary' not in str(process.next.type_signature.result.measurements)


@pytest.mark.slow
def test_training_run_reports_both_empirical_epsilons(tmp_path):
  config = training.TrainConfig(
      rounds=3, clients_per_round=10, sampling='poisson', audit_canaries=10,
      root_output_dir=str(tmp_path), experiment_name='audit', progress=False)
  summary = program.run(config)
  empirical = summary['empirical_epsilon']
  assert empirical['confidence'] == 0.95 and empirical['rounds'] == 3
  for threat in ('final_model', 'all_iterates'):
    assert 0.0 <= empirical[threat]['lower_bound'] < summary['epsilon']
    assert math.isfinite(empirical[threat]['estimate'])


def test_estimate_range_brackets_the_estimate_and_narrows_with_more_canaries():
  rng = np.random.default_rng(1)
  widths = []
  for n in (50, 800):
    observed, null = rng.normal(0.7, 1.0, n), rng.normal(0.0, 1.0, n)
    estimate = audit.estimate_epsilon(observed, null, DELTA)
    low, high = audit.estimate_range(observed.mean(), observed.std(ddof=1), n,
                                     null.mean(), null.std(ddof=1), n, DELTA)
    assert low <= estimate <= high
    widths.append(high - low)
  assert widths[1] < widths[0] / 3  # ~ 1/sqrt(n): 4x narrower.


# ----------------------------------------------------------------------------
# Correlated noise under participation with minimum separation.


@pytest.mark.parametrize('mechanism,bands', [('banded', 4), ('tree', 4),
                                             ('tree', 5)])
def test_whitened_correlated_noise_is_independent_across_rounds(mechanism,
                                                                bands):
  # The mechanism's own noise, released with no client: its raw rounds are
  # correlated; the whitened ones have the covariance of i.i.d. N(0, (zC)^2).
  rounds, d, z = 12, 40000, 1.0
  query = dp.BoundedGaussianSumQuery('clip', 1.0, z, noise_seed=0,
                                     noise_mechanism=mechanism, bands=bands)
  specs = [tf.TensorSpec([d], tf.float32)]
  query.set_template(specs)
  state, raw = query.initial_global_state(), []
  noised = tf.function(query.get_noised_result)
  for _ in range(rounds):
    result, state, _ = noised(query.initial_sample_state(specs), state)
    raw.append(result[0].numpy().astype(np.float64))
  raw = np.stack(raw)
  white = np.stack([
      sum(a * raw[t - j] for j, a in enumerate(
          audit.whitening_weights(mechanism, bands, t).numpy()) if t - j >= 0)
      for t in range(rounds)])
  tolerance = 5 / math.sqrt(d)
  np.testing.assert_allclose(white @ white.T / d, np.eye(rounds),
                             atol=tolerance)
  off_diagonal = raw @ raw.T / d - np.diag(np.diag(raw @ raw.T / d))
  assert np.abs(off_diagonal).max() > 10 * tolerance  # Raw: correlated.


def test_canaries_take_part_with_minimum_separation():
  # No noise, no client: in a round, a candidate's cosine with the release is
  # clearly positive iff it took part. Rounds are run one at a time from the
  # initial state so each round's cosines are read alone.
  separation, rounds, m = 3, 7, 90
  specs = [tf.TensorSpec([2000], tf.float32)]
  inner = tfp.NormalizedQuery(dp.BoundedGaussianSumQuery('clip', 1.0, 0.0), 1.)
  query = audit.CanaryQuery(inner, specs, m, 1.0, per_layer=False, seed=2,
                            separation=separation)
  initial = query.initial_global_state()
  noised = tf.function(query.get_noised_result)
  present = np.stack([
      noised(query.initial_sample_state(specs),
             initial._replace(round=tf.constant(t, tf.int64)))[1]
      .max_cosine.numpy() > 0.1 for t in range(rounds)], axis=1)
  inserted = initial.inserted.numpy() > 0.5
  assert not present[~inserted].any()
  first_rounds = set()
  for row in present[inserted]:
    taken = np.flatnonzero(row)
    assert taken.size == len(range(taken[0], rounds, separation))
    np.testing.assert_array_equal(np.diff(taken), separation)
    first_rounds.add(int(taken[0]))
  assert first_rounds == set(range(separation))  # Every group is used.


def _simulate_separated(inner, *, rounds, separation, mechanism, bands,
                        canaries, seed, clients=5, specs=SPECS):
  """Canary rounds with minimum separation: every inserted canary takes part
  in each round of its group; `clients` real clients every round."""
  query = audit.CanaryQuery(inner, specs, 2 * canaries, 1.0, per_layer=False,
                            seed=seed, separation=separation,
                            noise_mechanism=mechanism, bands=bands)
  return _run_rounds(query, rounds, specs, np.random.default_rng(seed),
                     lambda: clients)


# Six rounds with separation 3: each canary takes part k = 2 times.
SEPARATED = dict(rounds=6, separation=3, canaries=300)
SEPARATED_Z = 4.0


def _separated_ledger_epsilon(mechanism, bands, z=SEPARATED_Z):
  """k compositions of one Gaussian per participation: sensitivity of a
  participation sqrt(sum_j c_j^2) for banded C (Choquette-Choo et al. 2023,
  Thm. 2), sqrt(tree levels) for a restarted tree (Kairouz et al. 2021)."""
  if mechanism == 'banded':
    c = [math.comb(2 * j, j) / 4**j for j in range(bands)]
    sensitivity = math.sqrt(sum(x * x for x in c))
  else:
    sensitivity = math.sqrt(math.floor(math.log2(bands)) + 1)
  k = -(-SEPARATED['rounds'] // SEPARATED['separation'])
  accountant = dp_accounting.rdp.RdpAccountant()
  accountant.compose(dp_accounting.GaussianDpEvent(z / sensitivity), k)
  return accountant.get_epsilon(DELTA)


def _separated_mechanism(kind, mechanism, bands, seed):
  query_class = {'correct': dp.BoundedGaussianSumQuery,
                 'clipping_skipped': _ClippingSkipped}[kind]
  query = query_class('clip', 1.0, SEPARATED_Z, noise_seed=seed,
                      noise_mechanism=mechanism, bands=bands)
  query.set_template(SPECS)
  return tfp.NormalizedQuery(query, 5.0)


@pytest.mark.parametrize('mechanism,bands', [('banded', 3), ('tree', 3)])
def test_correlated_mechanism_lower_bound_stays_under_the_ledger(mechanism,
                                                                 bands):
  ledger = _separated_ledger_epsilon(mechanism, bands)
  report = _simulate_separated(
      _separated_mechanism('correct', mechanism, bands, 1), seed=1,
      mechanism=mechanism, bands=bands, **SEPARATED)
  for threat in ('final_model', 'all_iterates'):
    assert report[threat]['lower_bound'] < ledger
  # Three all-iterates statistics (raw, step, whitened) x 4 guess counts.
  assert report['all_iterates']['lower_bound_tests'] == 12


@pytest.mark.parametrize('mechanism', ['banded', 'tree'])
def test_correlated_mechanism_that_skips_clipping_is_detected(mechanism):
  ledger = _separated_ledger_epsilon(mechanism, 3)
  report = _simulate_separated(
      _separated_mechanism('clipping_skipped', mechanism, 3, 2), seed=2,
      mechanism=mechanism, bands=3, **SEPARATED)
  assert report['all_iterates']['lower_bound'] > ledger
  assert report['final_model']['lower_bound'] > ledger


def test_correlated_noise_audit_needs_its_separation():
  inner = tfp.NormalizedQuery(dp.BoundedGaussianSumQuery(
      'clip', 1.0, 1.0, noise_mechanism='banded', bands=3), 1.)
  for separation in (None, 2):
    with pytest.raises(ValueError, match='separation'):
      audit.CanaryQuery(inner, SPECS, 10, 1.0, False, noise_mechanism='banded',
                        bands=3, separation=separation)
  with pytest.raises(ValueError, match='separation'):
    audit.CanaryQuery(inner, SPECS, 10, 1.0, False, separation=0)


@pytest.mark.slow
@pytest.mark.parametrize('mechanism', ['banded', 'tree'])
def test_training_run_with_correlated_noise_reports_its_audit(tmp_path,
                                                              mechanism):
  config = training.TrainConfig(
      rounds=6, clients_per_round=10, sampling='min_separation',
      noise_mechanism=mechanism, bands=3, audit_canaries=10,
      root_output_dir=str(tmp_path), experiment_name='audit', progress=False)
  summary = program.run(config)
  empirical = summary['empirical_epsilon']
  assert empirical['rounds'] == 6
  assert empirical['all_iterates']['lower_bound_tests'] == 12
  for threat in ('final_model', 'all_iterates'):
    assert 0.0 <= empirical[threat]['lower_bound'] < summary['epsilon']


@pytest.mark.slow
def test_killed_audited_correlated_run_resumes_its_canaries(tmp_path):
  # The canaries' seed, statistics and kept aggregates are aggregator state:
  # checkpointed before each release, so a killed run resumes the audit.
  args = ['-m', 'scripts.train', '--rounds=6',
          '--clients_per_round=10', '--sampling=min_separation',
          '--noise_mechanism=banded', '--bands=3', '--audit_canaries=10',
          '--progress=false', f'--root_output_dir={tmp_path}',
          '--experiment_name=run']
  as_a_user.kill_at(as_a_user.start(args), 'round 3/6')
  resumed = as_a_user.run(args, timeout=600)
  assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr
  assert 'Resuming' in resumed.stdout and 'round 1/6' not in resumed.stdout
  summary = json.loads((tmp_path / 'run' / 'summary.json').read_text())
  empirical = summary['empirical_epsilon']
  assert empirical['rounds'] == 6 and empirical['candidates'] == 20
  assert empirical['all_iterates']['lower_bound'] < summary['epsilon']
