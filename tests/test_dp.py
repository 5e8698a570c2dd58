"""Specification of the DP factories and queries (`tff_clip.aggregation.dp`)."""

import collections
import fractions
import math

import dp_accounting
from hypothesis import given, settings, strategies as st
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_clip.aggregation import bounding
from tff_clip.aggregation import dp
from tff_clip.aggregation import dp_queries
import key_search  # pylint: disable=g-bad-import-order

# Two layers of different sizes: 'dim' budgets differ between them.
VALUE_TYPE = tff.types.to_type(collections.OrderedDict(
    a=(np.float32, [3000]), b=(np.float32, [5000])))
SIZES = {'a': 3000, 'b': 5000}


def _zeros(num_clients):
  return [collections.OrderedDict((k, np.zeros(s, np.float32))
                                  for k, s in SIZES.items())] * num_clients


# ----------------------------------------------------------------------------
# Noise: isotropic N(0, (z S)^2 I) on the sum, S = C for every bounding.
#
# Noise sizes are measured at a fixed seed on a million entries: the sample
# std of m Gaussian draws has relative standard error 1/sqrt(2m) (0.07% for
# the whole vector, 0.11% for its 400,000-entry layer), so the tolerances
# below (0.3%, 0.5% per layer) are > 4 standard errors, and a noise 1% too
# small lands 0.7% outside, 10 of them. The seeds are fixed: so is the outcome.

BIG_SIZES = {'a': 400_000, 'b': 600_000}
BIG_TYPE = tff.types.to_type(collections.OrderedDict(
    (k, (np.float32, [s])) for k, s in BIG_SIZES.items()))
NOISE_RTOL = 0.003
LAYER_NOISE_RTOL = 0.005


MARKED = 8  # Leading entries of each layer that tell clients apart.


def _big_clients(num_clients):
  """Zero updates but for entry i of each layer of client i: seeded client
  noise is a function of the bounded record, and identical records (also
  after normalization) would draw identical noise."""
  assert num_clients <= MARKED
  clients = []
  for i in range(num_clients):
    update = collections.OrderedDict()
    for key, size in BIG_SIZES.items():
      update[key] = np.zeros(size, np.float32)
      update[key][i] = 1e-3
    clients.append(update)
  return clients


def _assert_noise_std(result, expected):
  """`result` is N(0, expected^2) in every layer past the marked entries."""
  everything = np.concatenate([np.asarray(result[k][MARKED:], np.float64)
                               for k in BIG_SIZES])
  assert np.std(everything) == pytest.approx(expected, rel=NOISE_RTOL)
  assert abs(np.mean(everything)) < 5 * expected / math.sqrt(everything.size)
  for key in BIG_SIZES:  # The same std in every layer (not z C_h).
    assert np.std(result[key][MARKED:]) == pytest.approx(expected, rel=LAYER_NOISE_RTOL)


@pytest.mark.parametrize('placement', dp.NOISE_PLACEMENTS)
@pytest.mark.parametrize('method', bounding.BOUNDINGS)
def test_noise_std_is_z_c_over_n_in_every_layer(method, placement):
  """The mean's noise is N(0, (z C / n)^2) on every coordinate, whether the
  server adds N(0, (z C)^2) to the sum or each of the n clients adds
  N(0, (z C)^2 / n) (here exactly n = 4 clients take part)."""
  z, clip_norm, n = 1.5, 2.0, 4
  split = {'split': 'dim'} if method.startswith('per_layer') else {}
  factory = dp.dp_factory(method, noise_multiplier=z, clients_per_round=n,
                          clip_norm=clip_norm, noise_placement=placement,
                          noise_seed=1, **split)
  process = factory.create(BIG_TYPE)
  output = process.next(process.initialize(), _big_clients(n))
  _assert_noise_std(output.result, z * clip_norm / n)


# ----------------------------------------------------------------------------
# What a TFF user could pass that would run, silently, as something else.

ACCEPTED = dict(noise_multiplier=1.0, clients_per_round=10, clip_norm=1.0)


@pytest.mark.parametrize('split', ['dim', 'uniform', [1.0, 2.0]])
@pytest.mark.parametrize('method', ['clip', 'normalize'])
def test_split_given_to_a_global_bounding_is_refused(method, split):
  """One norm over the whole update has no layer budgets: the split would
  be ignored without a word."""
  with pytest.raises(ValueError, match=r'^`split` applies only with a '
                     'per_layer_ bounding'):
    dp.dp_factory(method, split=split, **ACCEPTED)
  dp.dp_factory(method, **ACCEPTED)
  dp.dp_factory(f'per_layer_{method}', split=split, **ACCEPTED)


SEPARATED = dict(min_separation=4, rounds=8)


@pytest.mark.parametrize('name,value,where,reads', [
    # The adaptive norm's start, rate, quantile and count noise move an
    # adaptive norm only.
    ('initial_clip_norm', 0.5, 'an adaptive clip_norm',
     dict(clip_norm='adaptive')),
    ('clip_learning_rate', 0.5, 'an adaptive clip_norm',
     dict(clip_norm='adaptive')),
    ('target_quantile', 0.5, 'an adaptive clip_norm',
     dict(clip_norm='adaptive')),
    ('clipped_count_stddev', 2.0, 'an adaptive clip_norm',
     dict(clip_norm='adaptive')),
    # Independent noise has no memory; only BLT has buffers.
    ('bands', 4, r'correlated noise \(noise_mechanism\)',
     dict(noise_mechanism='banded', **SEPARATED)),
    ('blt_buffers', 2, 'noise_mechanism blt',
     dict(noise_mechanism='blt', **SEPARATED)),
])
def test_a_parameter_the_aggregation_would_not_read_is_refused(
    name, value, where, reads):
  with pytest.raises(ValueError, match=f'^`{name}` applies only with {where}'):
    dp.dp_factory('clip', **{name: value}, **ACCEPTED)
  dp.dp_factory('clip', **{name: value, **ACCEPTED, **reads})


@pytest.mark.parametrize('missing', ['noise_multiplier', 'clients_per_round'])
def test_a_missing_parameter_is_named_as_dp_factorys(missing):
  given = {k: v for k, v in ACCEPTED.items() if k != missing}
  with pytest.raises(TypeError, match=f'^dp_factory\\(\\) needs `{missing}`.$'):
    dp.dp_factory('clip', **given)


@pytest.mark.parametrize('mechanism', ['banded', 'tree', 'blt'])
def test_correlated_noise_without_a_separation_is_refused(mechanism):
  """Correlated noise is private only under minimum separation, which the
  caller's sampler enforces: without it the factory would add noise whose
  guarantee no participation pattern of the caller's is known to meet."""
  correlated = dict(ACCEPTED, noise_mechanism=mechanism, bands=4, rounds=8)
  with pytest.raises(ValueError, match=r'^`min_separation`: noise_mechanism='
                     f"'{mechanism}' correlates"):
    dp.dp_factory('clip', **correlated)
  dp.dp_factory('clip', min_separation=4, **correlated)


def test_blt_without_rounds_is_refused():
  """BLT's factorization is optimized for the run's length: without it, it
  failed only when the process was created."""
  with pytest.raises(ValueError, match=r'blt .*needs `rounds`'):
    dp.dp_factory('clip', noise_mechanism='blt', bands=4, min_separation=4,
                  **ACCEPTED)
  dp.dp_factory('clip', noise_mechanism='blt', bands=4, min_separation=4,
                rounds=8, **ACCEPTED)


def test_unseeded_client_noise_std_is_z_c_over_sqrt_n():
  """A client's own noise, from the OS-seeded kernel (no `noise_seed`), is
  N(0, (z C)^2 / n). Not seedable, so sized to be safe by chance: on 4e6
  draws the std's relative standard error is 0.035%, and 0.3% is 8.5 of
  them (a false failure has chance < 1e-16)."""
  z, clip_norm, n, size = 1.5, 2.0, 9.0, 4_000_000
  query = dp.BoundedGaussianSumQuery('clip', clip_norm, z,
                                     noise_placement='client',
                                     expected_clients=n)
  params = query.derive_sample_params(query.initial_global_state())
  noise = query.preprocess_record(params, [tf.zeros([size])])[0]
  assert np.std(noise) == pytest.approx(z * clip_norm / math.sqrt(n),
                                        rel=NOISE_RTOL)


@pytest.mark.parametrize('per_layer', [False, True])
def test_adaptive_value_noise_std_is_the_raised_multiplier_times_c(per_layer):
  """Adaptive clipping's value noise has multiplier
  z_v = (z^-2 - H (2 sigma_b)^-2)^-1/2 (Andrew et al. 2021, Thm. 1: the
  value and the H counts of sensitivity 1/2 together are one Gaussian with
  z), on S = C0 in round 1; H = 1 count, or one per layer."""
  z, n, initial, count_stddev = 1.0, 10.0, 0.5, 2.0
  num_counts = len(BIG_SIZES) if per_layer else 1
  value_z = (z**-2 - num_counts * (2 * count_stddev)**-2)**-0.5
  factory = dp.dp_factory(
      'per_layer_clip' if per_layer else 'clip', noise_multiplier=z,
      clients_per_round=n, clip_norm='adaptive', initial_clip_norm=initial,
      clipped_count_stddev=count_stddev, per_layer_quantiles=per_layer,
      noise_seed=4)
  process = factory.create(BIG_TYPE)
  output = process.next(process.initialize(), _big_clients(2))
  _assert_noise_std(output.result, value_z * initial / n)


def test_adaptive_count_noise_std_is_sigma_b_over_n():
  """The noisy fraction of clients below the norm carries N(0, sigma_b^2)
  on the count, divided by n. Measured on an estimator of 1e6 norms (one
  count each; the noise per count does not depend on their number), with no
  records: the fraction is 1/2 + noise / n, and the linear update with rate
  1 and target 1/2 moves each estimate from 0 by minus that noise."""
  count_stddev, n, size = 0.5, 10.0, 1_000_000
  query = dp.CountQuantileEstimatorQuery(
      np.zeros(size, np.float32), target_quantile=0.5, learning_rate=1.0,
      below_estimate_stddev=count_stddev, expected_num_records=n,
      geometric_update=False, noise_seed=8)
  state = query.initial_global_state()
  estimate, _, _ = query.get_noised_result(query.initial_sample_state(), state)
  assert np.std(estimate) == pytest.approx(count_stddev / n, rel=NOISE_RTOL)
  assert abs(np.mean(estimate)) < 5 * count_stddev / n / math.sqrt(size)


def test_per_layer_noise_is_not_per_layer_budget_scaled():
  # The trap: one Gaussian query per layer would give layer h std z C_h.
  z, clip_norm, n = 1.0, 1.0, 1.0
  process = dp.dp_factory('per_layer_clip', noise_multiplier=z, clients_per_round=n, clip_norm=clip_norm,
                          split='dim', noise_seed=2).create(VALUE_TYPE)
  output = process.next(process.initialize(), _zeros(1))
  budgets = bounding.layer_budgets(VALUE_TYPE, clip_norm, 'dim').numpy()
  stds = [np.std(output.result[key]) for key in sorted(SIZES)]
  assert stds[0] == pytest.approx(stds[1], rel=0.06)
  assert stds[0] > 1.5 * budgets[0]  # z C_a would be 0.61; z C is 1.


def test_seeded_noise_is_reproducible_and_changes_every_round():
  process = dp.dp_factory('clip', noise_multiplier=1.0, clients_per_round=5.0, clip_norm=1.0,
                          noise_seed=7).create(VALUE_TYPE)
  state = process.initialize()
  first = process.next(state, _zeros(2))
  again = process.next(state, _zeros(2))
  second = process.next(first.state, _zeros(2))
  np.testing.assert_array_equal(first.result['a'], again.result['a'])
  assert not np.allclose(first.result['a'], second.result['a'])


def test_zero_noise_multiplier_gives_mean_of_bounded_updates():
  rng = np.random.default_rng(0)
  clients = [collections.OrderedDict(
      (k, rng.normal(size=s).astype(np.float32)) for k, s in SIZES.items())
             for _ in range(3)]
  process = dp.dp_factory('normalize', noise_multiplier=0.0, clients_per_round=3.0,
                          clip_norm=1.0).create(VALUE_TYPE)
  output = process.next(process.initialize(), clients)
  expected = [bounding.normalize(c, 1.0) for c in clients]
  for key in SIZES:
    np.testing.assert_allclose(
        output.result[key], np.mean([e[key] for e in expected], axis=0),
        rtol=1e-5, atol=1e-7)


def test_actual_denominator_divides_by_clients_present():
  clients = [collections.OrderedDict(a=np.full(3000, 0.01, np.float32),
                                     b=np.zeros(5000, np.float32))] * 4
  process = dp.dp_factory('clip', noise_multiplier=0.0, clients_per_round=100.0, clip_norm=10.0,
                          denominator='actual').create(VALUE_TYPE)
  output = process.next(process.initialize(), clients)
  np.testing.assert_allclose(output.result['a'], 0.01, rtol=1e-5)


def test_nonfinite_client_does_not_poison_the_aggregate():
  clients = _zeros(3)
  clients[1] = collections.OrderedDict(
      a=np.full(3000, np.nan, np.float32), b=np.full(5000, np.inf, np.float32))
  process = dp.dp_factory('clip', noise_multiplier=1.0, clients_per_round=3.0, clip_norm=1.0,
                          noise_seed=0).create(VALUE_TYPE)
  output = process.next(process.initialize(), clients)
  assert all(np.all(np.isfinite(output.result[k])) for k in SIZES)


# ----------------------------------------------------------------------------
# Sensitivity: one client added or removed moves the noiseless sum by <= S.


@st.composite
def client_update(draw):
  kind = draw(st.sampled_from(['normal', 'huge', 'nan', 'inf', 'zero',
                               'tiny']))
  seed = draw(st.integers(0, 2**31 - 1))
  rng = np.random.default_rng(seed)
  a, b = rng.normal(size=6), rng.normal(size=[2, 3])
  if kind == 'huge':
    a, b = a * 1e37, b * 1e37
  elif kind == 'nan':
    a[0] = np.nan
  elif kind == 'inf':
    b[0, 0] = -np.inf
  elif kind == 'zero':
    a, b = a * 0, b * 0
  elif kind == 'tiny':
    a, b = a * 1e-30, b * 1e-30
  return collections.OrderedDict(a=tf.constant(a, tf.float32),
                                 b=tf.constant(b, tf.float32))


def _noiseless_sum(query, records):
  params = query.derive_sample_params(query.initial_global_state())
  total = query.initial_sample_state(
      collections.OrderedDict(a=tf.TensorSpec([6]), b=tf.TensorSpec([2, 3])))
  for record in records:
    total = query.accumulate_record(params, total, record)
  return total


def _batched_noiseless_sum(query, records):
  """The same sum, the records stacked on a client axis and summed as the
  batched round sums them (`dp_queries.summed_records`)."""
  params = query.derive_sample_params(query.initial_global_state())
  stacked = (tf.nest.map_structure(lambda *xs: tf.stack(xs), *records)
             if records else collections.OrderedDict(
                 a=tf.zeros([0, 6]), b=tf.zeros([0, 2, 3])))
  return dp_queries.summed_records(query, params, stacked)


@settings(max_examples=40, deadline=None)
@given(st.lists(client_update(), min_size=0, max_size=4), client_update(),
       st.sampled_from(bounding.BOUNDINGS),
       st.sampled_from(['uniform', 'dim']),
       st.floats(0.01, 100.0))
@pytest.mark.parametrize('summed', [_noiseless_sum, _batched_noiseless_sum],
                         ids=['one_by_one', 'batched'])
def test_one_client_moves_the_noiseless_sum_by_at_most_s(summed, cohort, extra,
                                                         method, split,
                                                         clip_norm):
  structure = collections.OrderedDict(a=tf.zeros([6]), b=tf.zeros([2, 3]))
  fractions = bounding.layer_budget_fractions(structure, split)
  query = dp.BoundedGaussianSumQuery(method, clip_norm, 0.0, fractions)
  without = summed(query, cohort)
  with_extra = summed(query, cohort + [extra])
  # Summed either way, the same sum (to float32 rounding).
  for x, y in zip(tf.nest.flatten(with_extra),
                  tf.nest.flatten(_noiseless_sum(query, cohort + [extra]))):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6 * clip_norm)
  moved = math.sqrt(sum(
      float(np.sum(np.square(np.float64(x) - np.float64(y))))
      for x, y in zip(tf.nest.flatten(with_extra), tf.nest.flatten(without))))
  assert moved <= clip_norm * (1 + 1e-5)


# ----------------------------------------------------------------------------
# Adaptive clipping: C tracks the target quantile (Andrew et al. 2021).


def _run_adaptive(query, records, rounds):
  """Runs `rounds` rounds of `query` on fixed records (one traced round)."""
  stacked = tf.nest.map_structure(lambda *xs: tf.stack(xs), *records)
  template = tf.nest.map_structure(lambda x: tf.TensorSpec(x.shape),
                                   records[0])
  state = query.initial_global_state()
  params = query.derive_sample_params(state)
  signature = tf.nest.map_structure(
      lambda t: tf.TensorSpec(t.shape, t.dtype),
      query.preprocess_record(params, records[0]))

  @tf.function
  def one_round(state):
    params = query.derive_sample_params(state)
    preprocessed = tf.map_fn(
        lambda record: query.preprocess_record(params, record), stacked,
        fn_output_signature=signature)
    sample = tf.nest.map_structure(lambda x: tf.reduce_sum(x, axis=0),
                                   preprocessed)
    sample = tf.nest.map_structure(
        tf.add, query.initial_sample_state(template), sample)
    _, new_state, _ = query.get_noised_result(sample, state)
    return new_state

  for _ in range(rounds):
    state = one_round(state)
  return state


def _lognormal_clients(num_clients, medians, seed=0):
  """Clients whose layer norms are log-normal around the given medians."""
  rng = np.random.default_rng(seed)
  clients = []
  for _ in range(num_clients):
    update = collections.OrderedDict()
    for key, median in medians.items():
      direction = rng.normal(size=10)
      direction /= np.linalg.norm(direction)
      norm = median * math.exp(rng.normal(scale=0.5))
      update[key] = tf.constant(direction * norm, tf.float32)
    clients.append(update)
  return clients


def _empirical_quantile(clients, key, quantile):
  if key is None:
    norms = [float(bounding.global_l2_norm(c)) for c in clients]
  else:
    norms = [float(np.linalg.norm(c[key])) for c in clients]
  return float(np.quantile(norms, quantile))


def _adaptive_query(factory, structure):
  return factory.build_query(
      tff.types.tensorflow_to_type(tf.nest.map_structure(
          lambda x: tf.TensorSpec(x.shape, x.dtype), structure)))


def _log_quantile_tolerance(norms, quantile, noise_multiplier,
                            learning_rate=0.2):
  """How far log C may sit from the log empirical quantile after convergence.

  tensorflow-privacy's geometric update (Andrew et al. 2021, Eq. (2)) is
  log C <- log C - eta (b~ - gamma), b~ = b + xi the fraction of norms <= C
  plus count noise xi of standard deviation s = sigma_b / n, sigma_b = n / 20
  (Andrew et al.'s choice, which dp_factory keeps at these settings). Two terms:
  - Without noise C stops where b = gamma, i.e. between the order statistics
    bracketing the quantile, up to one last step eta / n: the log gap between
    x_(k-1) and x_(k+1) plus eta / n.
  - With noise, linearising b = F(log C) around the quantile (slope f, the
    density of log-norms there, measured from the norms) gives an AR(1) chain
    x' = (1 - eta f) x - eta xi with stationary standard deviation
    eta s / sqrt(1 - (1 - eta f)^2); we allow 4 of them (two-sided 6e-5).
  """
  log_norms = np.sort(np.log(norms))
  n = len(log_norms)
  k = int(quantile * n)
  gap = log_norms[min(k + 1, n - 1)] - log_norms[max(k - 2, 0)]
  tolerance = gap + learning_rate / n
  if noise_multiplier > 0:
    log_q = np.log(np.quantile(norms, quantile))
    width = 0.1  # Density of log-norms from the fraction within +-0.1.
    density = np.mean(np.abs(log_norms - log_q) <= width) / (2 * width)
    s = (n / 20) / n
    decay = 1 - learning_rate * density
    tolerance += 4 * learning_rate * s / math.sqrt(1 - decay**2)
  return tolerance


@pytest.mark.parametrize('z', [0.0, 1.0])
def test_adaptive_global_norm_reaches_target_quantile(z):
  clients = _lognormal_clients(100, {'a': 1.0, 'b': 2.0})
  factory = dp.dp_factory('clip', noise_multiplier=z, clients_per_round=100.0, clip_norm='adaptive',
                          target_quantile=0.7, noise_seed=5)
  state = _run_adaptive(_adaptive_query(factory, clients[0]), clients, 100)
  clip_norm = float(state.numerator_state.sum_state.clip_norm)
  norms = [float(np.sqrt(sum(np.sum(np.square(x)) for x in c.values())))
           for c in clients]
  target = float(np.quantile(norms, 0.7))
  assert abs(math.log(clip_norm / target)) <= _log_quantile_tolerance(
      norms, 0.7, z)


@pytest.mark.parametrize('z', [0.0, 0.5])
def test_per_layer_adaptive_norms_reach_each_layers_quantile(z):
  clients = _lognormal_clients(100, {'a': 0.5, 'b': 5.0})
  factory = dp.dp_factory('per_layer_clip', noise_multiplier=z, clients_per_round=100.0, clip_norm='adaptive',
                          target_quantile=0.5, per_layer_quantiles=True,
                          noise_seed=6)
  state = _run_adaptive(_adaptive_query(factory, clients[0]), clients, 100)
  budgets = state.numerator_state.sum_state.clip_norm.numpy()
  for i, key in enumerate(['a', 'b']):
    norms = [float(np.linalg.norm(c[key])) for c in clients]
    target = float(np.quantile(norms, 0.5))
    assert abs(math.log(budgets[i] / target)) <= _log_quantile_tolerance(
        norms, 0.5, z)


@pytest.mark.parametrize('split', ['dim', 'uniform', (1.0, 100.0, 0.01)])
def test_per_layer_quantile_estimates_all_start_at_c0_over_sqrt_h(split):
  # Three layers of 1, 400 and 10,000 scalars. Every layer's estimate starts
  # at C0 / sqrt(3), and the released noise std is z times sqrt(sum C_h^2)
  # = C0: a split would change nothing, and is refused.
  structure = collections.OrderedDict(
      a=np.zeros([1], np.float32), b=np.zeros([20, 20], np.float32),
      c=np.zeros([100, 100], np.float32))
  given = dict(noise_multiplier=1.0, clients_per_round=10.0,
               clip_norm='adaptive', initial_clip_norm=0.6,
               per_layer_quantiles=True)
  with pytest.raises(ValueError, match='^`split` applies only with a '
                     'per_layer_ bounding of one norm'):
    dp.dp_factory('per_layer_clip', split=split, **given)
  factory = dp.dp_factory('per_layer_clip', **given)
  query = _adaptive_query(factory, structure)
  state = query.initial_global_state()
  np.testing.assert_allclose(
      state.numerator_state.sum_state.clip_norm.numpy(),
      np.full([3], 0.6 / math.sqrt(3)), rtol=1e-6)


def test_adaptive_normalize_scale_tracks_the_quantile():
  clients = _lognormal_clients(100, {'a': 3.0, 'b': 3.0})
  factory = dp.dp_factory('normalize', noise_multiplier=0.0, clients_per_round=100.0, clip_norm='adaptive',
                          target_quantile=0.5)
  state = _run_adaptive(_adaptive_query(factory, clients[0]), clients, 100)
  target = _empirical_quantile(clients, None, 0.5)
  assert float(state.numerator_state.sum_state.clip_norm) == pytest.approx(
      target, rel=0.10)


@pytest.mark.parametrize('per_layer', [False, True])
def test_adaptive_round_is_exactly_as_private_as_requested_z(per_layer):
  z = 0.8
  structure = collections.OrderedDict(a=tf.zeros([4]), b=tf.zeros([3]),
                                      c=tf.zeros([2]))
  factory = dp.dp_factory('per_layer_clip' if per_layer else 'clip', noise_multiplier=z, clients_per_round=100.0,
                          clip_norm='adaptive', per_layer_quantiles=per_layer)
  query = _adaptive_query(factory, structure)
  state = query.initial_global_state()
  sample = query.initial_sample_state(tf.nest.map_structure(
      lambda x: tf.TensorSpec(x.shape), structure))
  _, _, event = query.get_noised_result(sample, state)
  assert isinstance(event, dp_accounting.ComposedDpEvent)
  combined = sum(float(e.noise_multiplier)**-2 for e in event.events)**-0.5
  assert combined == pytest.approx(z, rel=1e-5)


def test_too_small_count_noise_for_per_layer_quantiles_is_rejected():
  # sigma_b = 0.6 suffices for one count (z < 2 sigma_b) but not for two
  # per-layer counts (needs sigma_b > sqrt(2) z / 2 = 0.707).
  factory = dp.dp_factory('per_layer_clip', noise_multiplier=1.0, clients_per_round=12.0, clip_norm='adaptive',
                          per_layer_quantiles=True, clipped_count_stddev=0.6)
  with pytest.raises(ValueError, match='clipped_count_stddev'):
    factory.create(VALUE_TYPE)


@pytest.mark.parametrize('z', [0.0, 0.3, 1.0, 5.0, 20.0])
@pytest.mark.parametrize('n', [1.0, 3.0, 20.0, 1000.0])
@pytest.mark.parametrize('num_layers', [1, 6, 50])
def test_default_count_noise_builds_for_every_z_n_and_layer_count(
    z, n, num_layers):
  structure = [tf.zeros([2])] * num_layers
  factory = dp.dp_factory('per_layer_clip', noise_multiplier=z, clients_per_round=n, clip_norm='adaptive',
                          per_layer_quantiles=True)
  query = _adaptive_query(factory, structure)
  sample = query.initial_sample_state(
      [tf.TensorSpec([2])] * num_layers)
  _, _, event = query.get_noised_result(sample, query.initial_global_state())
  if z == 0:
    return
  # Value and count releases compose to one Gaussian mechanism with z
  # (RDP of Gaussians adds as z^-2), and the value noise grows by <= 10%.
  value_z, count_z = (float(e.noise_multiplier) for e in event.events)
  assert (value_z**-2 + count_z**-2)**-0.5 == pytest.approx(z, rel=1e-5)
  assert z <= value_z <= 1.1 * z * (1 + 1e-6)


# ----------------------------------------------------------------------------
# Bad input, at construction.


@pytest.mark.parametrize('kwargs, argument', [
    (dict(noise_multiplier=-1.0), 'noise_multiplier'),
    (dict(noise_multiplier=float('nan')), 'noise_multiplier'),
    (dict(clients_per_round=0.0), 'clients_per_round'),
    (dict(clip_norm=0.0), 'clip_norm'),
    (dict(clip_norm='sometimes'), 'clip_norm'),
    (dict(clip_learning_rate=0.0), 'clip_learning_rate'),
    (dict(clip_learning_rate=-0.1), 'clip_learning_rate'),
    (dict(target_quantile=1.5), 'target_quantile'),
    (dict(initial_clip_norm=-1.0), 'initial_clip_norm'),
    (dict(noise_multiplier=5.0, clients_per_round=10.0,
          clipped_count_stddev=0.5), 'clipped_count_stddev'),
    (dict(clipped_count_stddev=0.0), 'clipped_count_stddev'),
    (dict(clipped_count_stddev=-0.0), 'clipped_count_stddev'),
    (dict(target_quantile='0.5'), 'target_quantile'),
    (dict(noise_seed=1.5), 'noise_seed'),
    (dict(denominator='median'), 'denominator'),
    (dict(noise_placement='server'), 'noise_placement'),
    (dict(bounding_method='squash'), 'bounding'),
])
def test_bad_arguments_are_rejected_naming_them(kwargs, argument):
  valid = dict(bounding_method='clip', noise_multiplier=1.0,
               clients_per_round=100.0)
  with pytest.raises((ValueError, TypeError), match=argument):
    dp.dp_factory(**{**valid, **kwargs})


@pytest.mark.parametrize('missing', ['noise_multiplier', 'clients_per_round'])
def test_privacy_arguments_have_no_default(missing):
  kwargs = dict(noise_multiplier=1.0, clients_per_round=100.0)
  del kwargs[missing]
  with pytest.raises(TypeError, match=missing):
    dp.dp_factory('clip', **kwargs)
  with pytest.raises(TypeError):  # Keyword-only: no silent positional mix-up.
    dp.dp_factory('clip', 1.0, 100.0)


# ----------------------------------------------------------------------------
# In a learning process.


def test_dp_factory_trains_keras_model_in_weighted_fed_avg():
  def model_fn():
    keras_model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(3,)),
        tf.keras.layers.Dense(2, kernel_initializer='zeros'),
    ])
    return tff.learning.models.from_keras_model(
        keras_model, input_spec=(tf.TensorSpec([None, 3]),
                                 tf.TensorSpec([None], tf.int32)),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

  rng = np.random.default_rng(0)
  data = []
  for _ in range(3):
    x = rng.normal(size=(8, 3)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    data.append(tf.data.Dataset.from_tensor_slices((x, y)).batch(4))
  process = tff.learning.algorithms.build_weighted_fed_avg(
      model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
      client_weighting=tff.learning.ClientWeighting.UNIFORM,
      model_aggregator=dp.dp_factory('per_layer_clip', noise_multiplier=0.5, clients_per_round=3.0,
                                     clip_norm='adaptive', noise_seed=0,
                                     clipped_count_stddev=1.0))
  state = process.initialize()
  for _ in range(3):
    output = process.next(state, data)
    state = output.state
    assert np.isfinite(output.metrics['client_work']['train']['loss'])
  event = dp.extract_dp_event(state.aggregator)
  accountant = dp_accounting.rdp.RdpAccountant()
  accountant.compose(event)
  reference = dp_accounting.rdp.RdpAccountant()
  reference.compose(dp_accounting.GaussianDpEvent(0.5))
  assert accountant.get_epsilon(1e-5) == pytest.approx(
      reference.get_epsilon(1e-5), rel=1e-6)


def test_seeded_adaptive_round_is_reproducible_including_count_noise():
  clients = [collections.OrderedDict(a=np.full(3000, 0.01, np.float32),
                                     b=np.zeros(5000, np.float32))] * 3
  process = dp.dp_factory('clip', noise_multiplier=1.0, clients_per_round=100.0, clip_norm='adaptive',
                          noise_seed=11).create(VALUE_TYPE)
  state = process.initialize()
  first, again = (process.next(state, clients) for _ in range(2))
  assert (first.measurements['dp_query_metrics']['clip_norm'] ==
          again.measurements['dp_query_metrics']['clip_norm'])
  np.testing.assert_array_equal(first.result['b'], again.result['b'])


# ----------------------------------------------------------------------------
# Noise secrecy: fresh OS entropy unless a `noise_seed` is given.


def _one_noisy_round(factory, global_seed=None):
  if global_seed is not None:  # What a script does for reproducible init.
    tf.random.set_seed(global_seed)
  process = factory.create(VALUE_TYPE)
  return process.next(process.initialize(), _zeros(2)).result['b']


@pytest.mark.parametrize('placement', dp.NOISE_PLACEMENTS)
@pytest.mark.parametrize('adaptive', [False, True])
def test_unseeded_noise_differs_between_builds_even_under_a_global_seed(
    placement, adaptive):
  def build():
    return dp.dp_factory('clip', noise_multiplier=1.0, clients_per_round=10.0,
                         clip_norm='adaptive' if adaptive else 1.0,
                         noise_placement=placement)
  first = _one_noisy_round(build(), global_seed=0)
  second = _one_noisy_round(build(), global_seed=0)
  assert np.std(first) > 0
  _assert_independent_draws(first, second)


def test_unseeded_noise_differs_between_initializations_of_one_process():
  process = dp.dp_factory('clip', noise_multiplier=1.0, clients_per_round=10.0, clip_norm=1.0).create(VALUE_TYPE)
  first = process.next(process.initialize(), _zeros(1)).result['a']
  second = process.next(process.initialize(), _zeros(1)).result['a']
  _assert_independent_draws(first, second)


def _assert_independent_draws(first, second):
  """`first` and `second` are noise of two independent keys.

  Not "no entry equal": two float32 Gaussians coincide with chance ~1e-8,
  so that fails by chance for some of 1e4 draws. What a shared (or partly
  shared) key breaks and chance does not: at most 1% of the entries equal
  and a correlation below 0.15, 8 of its standard errors 1/sqrt(3000); a
  false failure has chance < 1e-15.
  """
  first, second = (np.ravel(x).astype(np.float64) for x in (first, second))
  assert first.size >= 3000
  assert np.mean(first == second) < 0.01
  assert abs(np.corrcoef(first, second)[0, 1]) < 0.15


@pytest.mark.parametrize('placement', dp.NOISE_PLACEMENTS)
def test_seeded_noise_is_the_same_across_builds_and_global_seeds(placement):
  def build():
    return dp.dp_factory('clip', noise_multiplier=1.0, clients_per_round=10.0, clip_norm='adaptive',
                         noise_placement=placement, noise_seed=123)
  first = _one_noisy_round(build(), global_seed=1)
  second = _one_noisy_round(build(), global_seed=2)
  np.testing.assert_array_equal(first, second)


def test_seeded_client_noise_differs_between_clients():
  # Two clients with different updates must not draw the same noise, or the
  # sum's noise would be 2x one draw (std 2 sigma/sqrt(n), not sqrt(2)...).
  process = dp.dp_factory('clip', noise_multiplier=1.0, clients_per_round=2.0, clip_norm=1.0, noise_seed=5,
                          noise_placement='client',
                          denominator='actual').create(VALUE_TYPE)
  state = process.initialize()
  one = collections.OrderedDict(a=np.zeros(3000, np.float32),
                                b=np.zeros(5000, np.float32))
  two = collections.OrderedDict(a=np.full(3000, 1e-6, np.float32),
                                b=np.zeros(5000, np.float32))
  alone = [process.next(state, [c]).result['b'] for c in (one, two)]
  assert not np.any(alone[0] == alone[1])


def test_noise_keys_are_not_released_in_measurements_or_result():
  """Neither key of the state (value and count noise) is in what a round
  releases, in any dtype or encoding (`key_search`; a false alarm has
  chance < 1e-9 in these 32 KB)."""
  process = dp.dp_factory('per_layer_clip', noise_multiplier=1.0, clients_per_round=10.0,
                          clip_norm='adaptive').create(VALUE_TYPE)
  state = process.initialize()
  keys = [np.asarray(x) for x in tf.nest.flatten(state)
          if np.asarray(x).dtype == np.int64 and np.shape(x) == (2,)]
  assert len(keys) == 2 and all(k.all() for k in keys)
  output = process.next(state, _zeros(1))
  chance = 0.0
  for released in (output.measurements, output.result):
    leaves = [np.asarray(x) for x in tf.nest.flatten(released)]
    data = b''.join(x.tobytes() for x in leaves)
    numbers = [(x.item(), leaf.dtype.name) for leaf in leaves
               for x in np.ravel(leaf)]
    for key in keys:
      assert not key_search.found_bytes(data, key)
      assert not key_search.found_numbers(numbers, key)
      chance += (key_search.byte_chance(len(data), key) +
                 key_search.number_chance(numbers, key))
  assert chance < 1e-9


# ----------------------------------------------------------------------------
# Exact sensitivity in low precision.


@pytest.mark.parametrize('dtype', [tf.float16, tf.bfloat16])
@pytest.mark.parametrize('method', bounding.BOUNDINGS)
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), scale=st.floats(1e-3, 1e3))
def test_bounded_norm_in_low_precision_is_at_most_c(dtype, method, seed,
                                                    scale):
  rng = np.random.default_rng(seed)
  structure = [tf.constant(rng.normal(size=size) * scale, dtype)
               for size in (7, 300)]
  clip_norm = 1.0
  budgets = bounding.layer_budgets(structure, clip_norm, 'dim')
  result = bounding.bound(structure, method, clip_norm=clip_norm,
                          budgets=budgets).value
  assert all(x.dtype == dtype for x in result)
  # The exact norm of the stored values: no rounding slack.
  assert _exact_squared_norm(result) <= fractions.Fraction(clip_norm)**2
  if method.startswith('per_layer'):
    for x, budget in zip(result, np.asarray(budgets)):
      assert _exact_squared_norm([x]) <= fractions.Fraction(float(budget))**2


def _exact_squared_norm(leaves) -> fractions.Fraction:
  """Sum of squares of the stored values, in exact (rational) arithmetic."""
  return sum((fractions.Fraction(float(v))**2 for x in leaves
              for v in np.ravel(np.asarray(tf.cast(x, tf.float64)))),
             fractions.Fraction(0))


@pytest.mark.parametrize('dtype', [tf.float16, tf.bfloat16])
def test_4096_low_precision_records_sum_in_float32(dtype):
  """Noise off: the query's sum of 4096 records at norm C matches the
  float64 sum of the same bounded records to float32 rounding. Summed in
  float16, partial sums above 2048 lose whole units (~10% off here): one
  record would move the sum by more than C, the sensitivity accounted."""
  num_clients, size = 4096, 4
  value_type = tff.types.TensorType(dtype.as_numpy_dtype, [size])
  query = dp.dp_factory('clip', noise_multiplier=0.0, clients_per_round=float(num_clients),
                        clip_norm=1.0).build_query(value_type)
  rng = np.random.default_rng(0)
  records = tf.constant(rng.normal(size=(num_clients, size)) + 3.0, dtype)
  state = query.initial_global_state()
  params = query.derive_sample_params(state)

  @tf.function(autograph=False)
  def total():
    sample = query.initial_sample_state(tf.TensorSpec([size], dtype))
    return tf.while_loop(
        lambda i, _: i < num_clients,
        lambda i, s: (i + 1, query.accumulate_record(params, s, records[i])),
        (tf.constant(0), sample))[1]

  sample = total()
  bounded = np.asarray(tf.cast(tf.function(lambda: tf.map_fn(
      lambda record: bounding.clip(record, 1.0), records))(), tf.float64))
  expected = bounded.sum(axis=0)
  summed = np.asarray(tf.nest.flatten(sample)[0], np.float64)
  # float32 accumulation of 4096 terms of size <= 1: error <= 4096 * 2^-24 *
  # sum|x| (sequential bound), far below the float16 failure.
  np.testing.assert_allclose(summed, expected,
                             atol=num_clients * 2**-24 * np.abs(bounded).sum(0).max())
  mean, _, _ = query.get_noised_result(sample, state)
  assert tf.nest.flatten(mean)[0].dtype == dtype


def test_extract_dp_event_from_a_state_around_the_dp_one_names_where_it_is():
  # A user's two slips: the learning process's whole state, and the state of
  # TFF's zeroing_factory around the DP factory (docs/composition.md). TFF's
  # own extraction of the DP state the message points at is the oracle.
  zeroed = tff.aggregators.zeroing_factory(10.0, dp.dp_factory(
      'clip', noise_multiplier=0.5, clients_per_round=2.0, clip_norm=1.0,
      weighted=False)).create(tff.TensorType(np.float32, [3]))
  state = zeroed.next(zeroed.initialize(),
                      [np.ones(3, np.float32)] * 2).state
  learning_state = tff.learning.templates.LearningAlgorithmState(
      global_model_weights=(), distributor=(), client_work=(),
      aggregator=state, finalizer=())
  expected = tff.aggregators.differential_privacy.extract_dp_event_from_state(
      learning_state.aggregator['inner_agg'])
  assert expected == dp_accounting.GaussianDpEvent(0.5)
  for wrong, path, inside in [
      (state, "['inner_agg']", lambda s: s['inner_agg']),
      (learning_state, ".aggregator['inner_agg']",
       lambda s: s.aggregator['inner_agg'])]:
    with pytest.raises(TypeError) as error:
      dp.extract_dp_event(wrong)
    message = str(error.value)
    assert '\n' not in message and message.startswith('`aggregator_state`')
    assert f'dp.extract_dp_event(state{path})' in message
    assert dp.extract_dp_event(inside(wrong)) == expected
  with pytest.raises(TypeError, match='holds no DP aggregator state'):
    dp.extract_dp_event(collections.OrderedDict(clip_norm=1.0, inner=()))
