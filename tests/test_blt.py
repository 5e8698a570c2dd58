"""Specification of buffered linear Toeplitz (BLT) noise (`tff_clip.aggregation.blt`).

Oracles: dense numpy matrices built from the BLT's definition (Dvijotham et
al. 2024) and inverted by `np.linalg.inv`, dp_accounting's Gaussian RDP, brute force over every
participation pattern, the truncated matrix square root of the prefix-sum
matrix (banded noise) and binary-tree counts (tree noise), and figures of
jax_privacy's own BLT optimizer (`REFERENCE`, with the command that produced
them).
"""

import functools
import itertools
import math

import dp_accounting
from dp_accounting.rdp import rdp_privacy_accountant
import numpy as np
import pytest
import scipy.linalg
import tensorflow as tf

from tff_clip.aggregation import blt
from tff_clip.aggregation import dp
from tff_clip.aggregation import mechanisms
from tff_clip.aggregation import noise_mechanisms
from tff_clip.aggregation import spec
from tff_clip.privacy import accounting
from tff_clip.program import config as config_lib


def _dense(buffer_decays, output_scales, rounds):
  """C[t, s] = 1 if t == s, sum_i omega_i theta_i^(t - s - 1) if t > s."""
  matrix = np.eye(rounds)
  for t in range(rounds):
    for s in range(t):
      matrix[t, s] = sum(w * th**(t - s - 1)
                         for th, w in zip(buffer_decays, output_scales))
  return matrix


def _interlaced(rng, buffers):
  """Decays 1 > theta_1 > theta_hat_1 > ... > theta_hat_d > 0, well apart."""
  while True:
    points = np.sort(rng.uniform(0.02, 0.98, 2 * buffers))[::-1]
    if np.min(-np.diff(points)) > 0.02:
      return points[0::2], points[1::2]


def _patterns(rounds, separation, participations):
  """Every nonempty set of at most k rounds with pairwise gaps >= b."""
  for size in range(1, participations + 1):
    for pattern in itertools.combinations(range(rounds), size):
      if all(b - a >= separation for a, b in zip(pattern, pattern[1:])):
        yield pattern


def _brute_sensitivity(matrix, separation, participations):
  return max(np.linalg.norm(matrix[:, list(p)].sum(axis=1))
             for p in _patterns(matrix.shape[0], separation, participations))


def _optimized(rounds, separation, participations=None, error='mean',
               buffers=blt.DEFAULT_BUFFERS):
  """`blt.optimize`, once per schema for the whole file."""
  participations = min(participations or rounds, -(-rounds // separation))
  return _cached_optimize(rounds, separation, participations, error, buffers)


@functools.lru_cache(maxsize=None)
def _cached_optimize(rounds, separation, participations, error, buffers):
  return blt.optimize(rounds, separation, participations, buffers=buffers,
                      error=error)


def _prefix_loss(matrix, sensitivity, error):
  """sens^2 x the mean or max squared row norm of A C^{-1}."""
  rounds = matrix.shape[0]
  prefix = np.tril(np.ones((rounds, rounds))) @ np.linalg.inv(matrix)
  rows = np.sum(prefix**2, axis=1)
  return sensitivity**2 * (rows.mean() if error == 'mean' else rows.max())


# ----------------------------------------------------------------------------
# The parameterization and its inverse.


@pytest.mark.parametrize('buffers', [1, 2, 4])
def test_coefficients_are_the_first_column_of_the_defined_matrix(buffers):
  strategy, _ = blt.from_decays(*_interlaced(np.random.default_rng(buffers),
                                             buffers))
  matrix = _dense(strategy.buffer_decays, strategy.output_scales, 9)
  np.testing.assert_allclose(strategy.coefficients(9), matrix[:, 0],
                             rtol=1e-13)


@pytest.mark.parametrize('buffer_decays,output_scales', [
    ([0.9], [0.3]),
    ([0.95, 0.6, 0.1], [0.05, 0.2, 0.4]),
    ([0.9, 0.5], [-0.2, 0.1]),  # Negative scales: still a real inverse.
])
def test_inverse_is_the_inverse_of_the_dense_matrix(buffer_decays,
                                                    output_scales):
  strategy = blt.BufferedToeplitz(buffer_decays, output_scales)
  inverse = strategy.inverse()
  assert inverse.buffers == strategy.buffers
  dense_inverse = np.linalg.inv(_dense(buffer_decays, output_scales, 12))
  np.testing.assert_allclose(
      _dense(inverse.buffer_decays, inverse.output_scales, 12), dense_inverse,
      atol=1e-12)
  np.testing.assert_allclose(inverse.inverse().coefficients(12),
                             strategy.coefficients(12), atol=1e-12)


def test_closed_form_pair_is_a_matrix_and_its_inverse():
  theta, theta_hat = _interlaced(np.random.default_rng(0), 3)
  strategy, noise = blt.from_decays(theta, theta_hat)
  np.testing.assert_array_equal(noise.buffer_decays, theta_hat)
  product = _dense(strategy.buffer_decays, strategy.output_scales, 15) @ (
      _dense(noise.buffer_decays, noise.output_scales, 15))
  np.testing.assert_allclose(product, np.eye(15), atol=1e-12)
  # Interlaced decays: positive scales for C, negative for C^{-1}, and C's
  # coefficients positive and decreasing (c_1 = sum omega < 1).
  assert np.all(strategy.output_scales > 0)
  assert np.all(noise.output_scales < 0)
  assert np.all(np.diff(strategy.coefficients(50)) < 0)


def test_bad_blts_are_refused():
  with pytest.raises(ValueError, match='`output_scales`'):
    blt.BufferedToeplitz([0.9, 0.5], [0.1])
  with pytest.raises(ValueError, match='`buffer_decays`'):
    blt.BufferedToeplitz([0.9, math.nan], [0.1, 0.1])
  with pytest.raises(ValueError, match='`buffer_decays` must be distinct'):
    blt.BufferedToeplitz([0.5, 0.5], [0.1, 0.2]).inverse()
  with pytest.raises(ValueError, match='no real inverse'):
    # diag(theta) - 1 omega^T = [[0.4, 0.5], [-0.5, 0.6]]: eigenvalues
    # 0.5 +- 0.48i, an oscillating inverse.
    blt.BufferedToeplitz([0.9, 0.1], [0.5, -0.5]).inverse()


# ----------------------------------------------------------------------------
# Streaming.


def test_stream_multiplies_by_the_dense_matrix():
  strategy, noise = blt.from_decays(*_interlaced(np.random.default_rng(1), 3))
  values = np.random.default_rng(2).normal(size=(20, 4, 3))
  dense = _dense(strategy.buffer_decays, strategy.output_scales, 20)
  np.testing.assert_allclose(blt.stream(strategy, values),
                             np.einsum('ts,sij->tij', dense, values),
                             atol=1e-12)
  np.testing.assert_allclose(blt.stream(noise, values),
                             np.einsum('ts,sij->tij', np.linalg.inv(dense),
                                       values), atol=1e-12)


def test_noise_of_each_round_is_c_inverse_z_from_d_model_sized_buffers():
  factorization = _optimized(60, 12, error='max', buffers=3)
  noise = factorization.noise
  rng = np.random.default_rng(3)
  draws = rng.normal(size=(60, 5, 2)).astype(np.float32)  # z_t per round.
  buffers = blt.initial_buffers(noise, (5, 2), np.float32)
  assert buffers.shape == (noise.buffers, 5, 2)
  rows = []
  for z in draws:
    out, buffers = blt.stream_step(noise, z, buffers)
    assert out.dtype == np.float32 and buffers.dtype == np.float32
    rows.append(out)
  strategy = _dense(factorization.strategy.buffer_decays,
                    factorization.strategy.output_scales, 60)
  expected = np.einsum('ts,sij->tij', np.linalg.inv(strategy),
                       draws.astype(np.float64))
  np.testing.assert_allclose(np.array(rows), expected, atol=1e-5)


# ----------------------------------------------------------------------------
# Sensitivity under minimum separation.


@pytest.mark.parametrize('separation', [2, 3, 4])
@pytest.mark.parametrize('buffers', [1, 3])
def test_sensitivity_is_the_max_over_every_participation_pattern(
    separation, buffers):
  rng = np.random.default_rng(10 * separation + buffers)
  for rounds in (separation, 7, 12):
    strategy, _ = blt.from_decays(*_interlaced(rng, buffers))
    matrix = _dense(strategy.buffer_decays, strategy.output_scales, rounds)
    most = -(-rounds // separation)
    for participations in sorted({1, 2, most}):
      if participations > most:
        continue
      assert blt.min_separation_sensitivity(
          strategy.coefficients(rounds), separation,
          participations) == pytest.approx(
              _brute_sensitivity(matrix, separation, participations),
              rel=1e-12)


def test_increasing_coefficients_are_searched_over_every_pattern():
  # Nonnegative but not monotone: the pattern 0, b, 2b, ... is not the worst.
  coefficients = np.array([1.0, 0.1, 0.9, 0.0, 0.8, 0.0, 0.1, 0.0, 0.0])
  matrix = scipy.linalg.toeplitz(coefficients, np.zeros(9))
  regular = np.linalg.norm(matrix[:, [0, 3, 6]].sum(axis=1))
  worst = _brute_sensitivity(matrix, 3, 3)
  assert worst > regular * 1.01
  assert blt.min_separation_sensitivity(coefficients, 3) == pytest.approx(
      worst, rel=1e-12)


def test_sensitivity_refuses_what_it_cannot_compute_exactly():
  with pytest.raises(ValueError, match='nonnegative'):
    blt.min_separation_sensitivity([1.0, -0.1, 0.05], 1)
  growing = np.linspace(0.1, 1.0, 400)
  growing[0] = 1.0
  with pytest.raises(ValueError, match='too large; use non-increasing'):
    blt.min_separation_sensitivity(growing, 3)
  # Decays that do not interlace give C a negative scale, and eventually a
  # negative coefficient.
  strategy, _ = blt.from_decays([0.9, 0.5], [0.95, 0.2])
  assert strategy.output_scales.min() < 0
  with pytest.raises(ValueError, match='nonnegative'):
    blt.min_separation_sensitivity(strategy.coefficients(200), 10)


# ----------------------------------------------------------------------------
# Optimization.


@pytest.mark.parametrize('rounds,separation,participations,error', [
    (12, 3, None, 'mean'), (12, 2, 3, 'max'), (10, 4, None, 'max')])
def test_optimized_loss_and_sensitivity_are_those_of_the_dense_matrices(
    rounds, separation, participations, error):
  factorization = _optimized(rounds, separation, participations, error, 3)
  k = participations or -(-rounds // separation)
  assert factorization.participations == k
  strategy = _dense(factorization.strategy.buffer_decays,
                    factorization.strategy.output_scales, rounds)
  # The noise that runs (float32 parameters) is the strategy's inverse.
  np.testing.assert_array_equal(
      factorization.noise.buffer_decays,
      factorization.noise.buffer_decays.astype(np.float32))
  np.testing.assert_allclose(
      _dense(factorization.noise.buffer_decays,
             factorization.noise.output_scales, rounds),
      np.linalg.inv(strategy), atol=1e-12)
  sensitivity = _brute_sensitivity(strategy, separation, k)
  assert factorization.sensitivity == pytest.approx(sensitivity, rel=1e-12)
  assert factorization.loss == pytest.approx(
      _prefix_loss(strategy, sensitivity, error), rel=1e-10)


def _banded_sqrt(rounds, bands):
  """The square root of the prefix-sum matrix, truncated to `bands` bands:
  the strategy of tff_clip's banded noise."""
  root = np.real(scipy.linalg.sqrtm(np.tril(np.ones((rounds, rounds)))))
  return np.tril(root) - np.tril(root, -bands)


def _tree_loss(rounds, separation, participations, error):
  """Binary-tree noise restarted every b rounds: round t's prefix sum holds
  popcount(b) node noises per finished tree and popcount(t mod b + 1) of its
  own; each participation is a Gaussian of sensitivity sqrt(levels)."""
  t = np.arange(rounds)
  popcount = np.vectorize(lambda v: bin(v).count('1'))
  variances = (t // separation) * popcount(separation) + popcount(
      t % separation + 1)
  levels = int(separation).bit_length()
  return participations * levels * (variances.mean() if error == 'mean'
                                    else variances.max())


# The frontier (100 rounds, b = 20) and digits (40 rounds, b = 5) schemas.
# Mean error: the banded square root (b bands, columns orthogonal under
# separation b) is 8% lower, a BLT's positive coefficients overlap across
# participations; max error: the BLT is lower.
@pytest.mark.parametrize('rounds,separation', [(100, 20), (40, 5)])
@pytest.mark.parametrize('error,banded_ratio', [('mean', 1.10),
                                                ('max', 1.0)])
def test_optimized_blt_beats_independent_and_tree_noise_and_nears_banded(
    rounds, separation, error, banded_ratio):
  factorization = _optimized(rounds, separation, error=error)
  k = factorization.participations
  strategy = _dense(factorization.strategy.buffer_decays,
                    factorization.strategy.output_scales, rounds)
  ours = _prefix_loss(strategy, np.linalg.norm(
      strategy[:, ::separation].sum(axis=1)), error)
  assert factorization.loss == pytest.approx(ours, rel=1e-9)
  independent = _prefix_loss(np.eye(rounds), math.sqrt(k), error)
  banded = _banded_sqrt(rounds, separation)
  banded_loss = _prefix_loss(banded, math.sqrt(k) * np.linalg.norm(
      banded[:, 0]), error)
  assert ours < independent / 2.5
  assert ours < _tree_loss(rounds, separation, k, error) / 2.5
  assert ours < banded_ratio * banded_loss
  assert factorization.buffers <= blt.DEFAULT_BUFFERS


# jax_privacy 2.0.0's `buffered_toeplitz.optimize`, run once outside the test
# environment (Python 3.11, jax 0.10.2, CPU, 2026-11-26) with:
#   import jax; jax.config.update('jax_enable_x64', True)
#   from jax_privacy.matrix_factorization import buffered_toeplitz as bt
#   blt = bt.optimize(n=n, min_sep=b, max_participations=k, error=error,
#                     min_buffers=1, max_buffers=5)
#   loss = bt.LossFn.build_min_sep(n=n, error=error, min_sep=b,
#                                  max_participations=k).loss(blt)
# (n, b, k, error): (loss, blt.buf_decay, blt.output_scale). jax_privacy adds
# a buffer only while it gains 1%, tff_clip while it gains 0.1%.
REFERENCE = {
    (2052, 342, 6, 'mean'): (
        84.32293231899665,
        [0.9937254054103182, 0.7889499354163444],
        [0.14108643174153848, 0.3259030106533481]),
    (2052, 342, 6, 'max'): (
        115.59220947366143,
        [0.9999999998220588, 0.9934320313643792, 0.8086577282134354],
        [0.006943066763025847, 0.12019367919346965, 0.33014330353605964]),
    (100, 20, 5, 'mean'): (
        36.3310051523055,
        [0.8938245877444027],
        [0.49930689534205164]),
    (100, 20, 5, 'max'): (
        53.31978055493306,
        [0.9999999958428327, 0.8868091374245589],
        [0.03317004539222963, 0.42899595793103984]),
    (40, 5, 8, 'mean'): (
        57.30906351108122,
        [0.6666529059617612],
        [0.6666516862140811]),
    (40, 5, 8, 'max'): (
        92.98735850657314,
        [0.9999999940485406, 0.6724306023447516],
        [0.04290793472753072, 0.5681175235194271]),
    (1000, 5, 2, 'mean'): (
        29.217478014132215,
        [0.9971853849325473, 0.9693553972012545, 0.5822549372834948],
        [0.05590048753884228, 0.08982684604448579, 0.3909960943310432]),
    (2052, 1, 1, 'mean'): (
        10.771135299033078,
        [0.9984985464046224, 0.9747076888220271, 0.7241607655529455],
        [0.05200018505283849, 0.1252135872113071, 0.30395668448771584]),
    (500, 10, 50, 'mean'): (
        1729.978959142286,
        [0.8849866877733227],
        [0.6583427335306649]),
}
# The default suite optimizes the small schemas (shared with the tests
# above); the others take a few seconds each.
_SLOW_REFERENCE = {(2052, 342, 6, 'mean'), (2052, 342, 6, 'max'),
                   (1000, 5, 2, 'mean'), (2052, 1, 1, 'mean')}


@pytest.mark.parametrize('key', [
    pytest.param(key, marks=[pytest.mark.slow] if key in _SLOW_REFERENCE
                 else []) for key in sorted(REFERENCE)])
def test_loss_agrees_with_jax_privacy_and_optimum_is_as_low(key):
  rounds, separation, participations, error = key
  reference_loss, decays, scales = REFERENCE[key]
  # The same loss of the same BLT: the two definitions agree.
  assert blt.loss(blt.BufferedToeplitz(decays, scales), rounds, separation,
                  participations, error) == pytest.approx(reference_loss,
                                                          rel=1e-9)
  ours = _optimized(rounds, separation, participations, error)
  assert ours.participations == participations
  assert ours.loss <= reference_loss * (1 + 1e-6)


@pytest.mark.slow
def test_two_buffer_optimum_is_jax_privacys_golden_for_a_long_horizon():
  # jax_privacy's buffered_toeplitz_test.py,
  # test_optimize_single_participation_golden: n = 100,000, one
  # participation, max error, 2 buffers.
  factorization = blt.optimize(100_000, 1, 1, buffers=2, error='max')
  np.testing.assert_allclose(factorization.strategy.buffer_decays,
                             [0.9999528892, 0.9857068667], rtol=1e-5)
  np.testing.assert_allclose(factorization.strategy.output_scales,
                             [0.0122853238, 0.1878393665], rtol=1e-4)


@pytest.mark.slow
def test_stack_overflow_schema_blt_against_banded_and_independent():
  """n = 2,052 rounds, separation 342, k = 6 (Choquette-Choo et al. 2023's
  Stack Overflow schema), dense 2,052 x 2,052 oracles."""
  rounds, separation = 2052, 342
  factorization = blt.optimize(rounds, separation, buffers=5)
  assert factorization.buffers <= 5
  strategy = scipy.linalg.toeplitz(
      factorization.strategy.coefficients(rounds), np.zeros(rounds))
  ours = _prefix_loss(strategy, np.linalg.norm(
      strategy[:, ::separation].sum(axis=1)), 'mean')
  assert factorization.loss == pytest.approx(ours, rel=1e-8)
  coefficients = np.ones(separation)
  for j in range(1, separation):
    coefficients[j] = coefficients[j - 1] * (2 * j - 1) / (2 * j)
  banded = scipy.linalg.toeplitz(np.pad(coefficients, (0, rounds - separation)),
                                 np.zeros(rounds))
  banded_loss = _prefix_loss(banded, math.sqrt(6) * np.linalg.norm(
      coefficients), 'mean')
  assert ours < (rounds + 1) / 2 * 6 / 50  # Independent: 6,159.
  assert ours < 1.06 * banded_loss  # 84.1 against 80.6.


def test_optimization_is_deterministic():
  first = blt.optimize(40, 5, error='max')
  second = _optimized(40, 5, error='max')
  np.testing.assert_array_equal(first.noise.buffer_decays,
                                second.noise.buffer_decays)
  np.testing.assert_array_equal(first.noise.output_scales,
                                second.noise.output_scales)


@pytest.mark.parametrize('kwargs,label', [
    (dict(rounds=0), '`rounds`'), (dict(separation=0), '`separation`'),
    (dict(participations=0), '`participations`'), (dict(buffers=0),
                                                   '`buffers`'),
    (dict(buffers=blt.MAX_BUFFERS + 1), '`buffers`'),
    (dict(error='median'), '`error`')])
def test_bad_arguments_name_the_argument(kwargs, label):
  arguments = dict(rounds=10, separation=2)
  arguments.update(kwargs)
  with pytest.raises(ValueError, match=label):
    blt.optimize(**arguments)
  with pytest.raises(TypeError, match='`buffers`'):
    blt.optimize(10, 2, buffers=2.0)


# ----------------------------------------------------------------------------
# The 'blt' noise mechanism (eager queries: no TFF process is built).

SPECS = [tf.TensorSpec([300]), tf.TensorSpec([4, 5])]
DELTA = 1e-5


def test_unit_noise_streams_the_keys_draws_through_the_noise_blt():
  mechanism = mechanisms.noise_mechanism('blt', rounds=12, separation=3,
                                         blt_buffers=2)
  state = mechanism.initial_state(SPECS)
  assert [tuple(x.shape) for x in state] == [(mechanism.state_vectors, 300),
                                             (mechanism.state_vectors, 4, 5)]
  key = tf.constant([3, 4], tf.int64)
  structure = [tf.zeros(s.shape) for s in SPECS]
  draws, noise = [], []
  for t in range(12):
    unit, state = mechanism.unit_noise(structure, key, t, state)
    noise.append(np.concatenate([np.ravel(x) for x in unit]))
    fresh = noise_mechanisms.standard_normals(
        structure, noise_mechanisms.fold(key, t))  # Independent noise's.
    draws.append(np.concatenate([np.ravel(x) for x in fresh]))
  inverse = np.linalg.inv(_dense(
      mechanism.factorization.strategy.buffer_decays,
      mechanism.factorization.strategy.output_scales, 12))
  np.testing.assert_allclose(np.array(noise), inverse @ np.array(draws),
                             atol=2e-5)
  np.testing.assert_allclose(mechanism.noise_covariance(12),
                             inverse @ inverse.T, atol=1e-9)


def _releases(rounds, state=None, seed=7):
  """`rounds` noised zero sums of a BLT query from `state` (None: its
  initial state, keyed by `seed`): (their values, the state after)."""
  query = dp.BoundedGaussianSumQuery(
      'clip', 1.0, 1.5, noise_seed=seed, noise_mechanism='blt', rounds=10,
      separation=3, blt_buffers=3)
  query.set_template(SPECS)
  if state is None:
    state = query.initial_global_state()
  values = []
  for _ in range(rounds):
    result, state, _ = query.get_noised_result(
        query.initial_sample_state(SPECS), state)
    values.append(np.concatenate([np.ravel(x) for x in result]))
  return np.array(values), state


def test_blt_noise_resumes_bit_exactly_from_a_checkpoint():
  straight, _ = _releases(7)
  first, state = _releases(3)
  saved = tf.nest.map_structure(np.array, state)  # What a checkpoint holds.
  restored = tf.nest.map_structure(tf.constant, saved)
  second, _ = _releases(4, restored, seed=None)  # The key from the state.
  np.testing.assert_array_equal(np.concatenate([first, second]), straight)
  # The buffers are part of what must be restored.
  forgotten = restored._replace(noise_history=tf.nest.map_structure(
      tf.zeros_like, restored.noise_history))
  assert not np.array_equal(_releases(1, forgotten, seed=None)[0],
                            straight[3:4])


def test_blt_noise_past_its_rounds_is_refused():
  """The factorization is optimized, and each participation accounted, for
  T = 10 rounds; its noise run longer would be worth less than the event
  says: the same stream over 2T rounds has the greater sensitivity (brute
  force over the participation patterns). Round T + 1 is refused."""
  mechanism = mechanisms.noise_mechanism('blt', rounds=10, separation=3,
                                         blt_buffers=3)
  strategy = mechanism.factorization.strategy
  longer = _brute_sensitivity(
      _dense(strategy.buffer_decays, strategy.output_scales, 20), 3, 7)
  assert longer > mechanism.factorization.sensitivity * 1.01
  values, state = _releases(10)  # Every round it was built for.
  assert values.shape[0] == 10
  query = dp.BoundedGaussianSumQuery(
      'clip', 1.0, 1.5, noise_seed=7, noise_mechanism='blt', rounds=10,
      separation=3, blt_buffers=3)
  query.set_template(SPECS)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match='BLT noise was optimized for rounds=10'):
    query.get_noised_result(query.initial_sample_state(SPECS), state)


@pytest.mark.parametrize('rounds,separation', [(12, 3), (10, 4)])
def test_blt_epsilon_is_one_gaussian_with_z_over_the_brute_force_sensitivity(
    rounds, separation):
  z = 3.0
  event = accounting.correlated_training_event('blt', z, 1, rounds,
                                               separation, blt_buffers=3)
  mechanism = mechanisms.noise_mechanism('blt', rounds=rounds,
                                         separation=separation, blt_buffers=3)
  strategy = _dense(mechanism.factorization.strategy.buffer_decays,
                    mechanism.factorization.strategy.output_scales, rounds)
  sensitivity = _brute_sensitivity(strategy, separation,
                                   -(-rounds // separation))
  oracle = rdp_privacy_accountant.RdpAccountant(accounting.RDP_ORDERS)
  oracle.compose(dp_accounting.GaussianDpEvent(z / sensitivity))
  assert accounting.compute_epsilon(event, DELTA).epsilon == pytest.approx(
      oracle.get_epsilon(DELTA), rel=1e-6)


@pytest.mark.parametrize('rounds,separation', [(9, 4), (30, 7)])
def test_blt_epsilon_recorded_by_any_round_covers_the_rounds_released(
    rounds, separation):
  # A run stopped at round t has recorded ceil(t / b) participations (one
  # per cycle): their epsilon must be at least that of the Gaussian with z
  # over the brute-force sensitivity of the t released rounds. The last
  # cycle being short, t = T is not where that sensitivity per
  # participation is largest.
  z = 3.0
  mechanism = mechanisms.noise_mechanism('blt', rounds=rounds,
                                         separation=separation)
  strategy = _dense(mechanism.factorization.strategy.buffer_decays,
                    mechanism.factorization.strategy.output_scales, rounds)
  for released in range(1, rounds + 1):
    cycles = -(-released // separation)
    recorded = rdp_privacy_accountant.RdpAccountant(accounting.RDP_ORDERS)
    recorded.compose(mechanism.participation_event(z), cycles)
    oracle = rdp_privacy_accountant.RdpAccountant(accounting.RDP_ORDERS)
    oracle.compose(dp_accounting.GaussianDpEvent(z / _brute_sensitivity(
        strategy[:released, :released], separation, cycles)))
    assert recorded.get_epsilon(DELTA) >= oracle.get_epsilon(DELTA) * (
        1 - 1e-9), released


def test_blt_calibration_meets_the_target():
  z = accounting.calibrate_correlated_noise_multiplier(
      4.0, 'blt', 1, 40, 5, DELTA, blt_buffers=2)
  epsilon = accounting.compute_epsilon(accounting.correlated_training_event(
      'blt', z, 1, 40, 5, blt_buffers=2), DELTA).epsilon
  assert 4.0 - 1e-3 <= epsilon <= 4.0


def test_blt_whitening_undoes_the_first_cycle_of_c():
  mechanism = mechanisms.noise_mechanism('blt', rounds=30, separation=6)
  weights = np.asarray(mechanism.whitening_weights(0))
  assert weights.size == mechanism.whitening_depth + 1 == 6
  np.testing.assert_allclose(
      weights, mechanism.factorization.strategy.coefficients(6), rtol=1e-6)


def test_blt_flags_name_the_flag():
  good = dict(noise_mechanism='blt', sampling='min_separation',
              min_separation=5, rounds=20)
  config_lib.validate(config_lib.TrainConfig(**good))
  with pytest.raises(config_lib.ConfigError, match='--noise_mechanism'):
    config_lib.validate(config_lib.TrainConfig(
        noise_mechanism='blt', rounds=20))
  with pytest.raises(ValueError, match='`blt_buffers`'):
    config_lib.TrainConfig(**good, blt_buffers=0).dp_spec(1.0)
  with pytest.raises(ValueError, match='`blt_buffers`'):
    spec.DPSpec(bounding_method='clip', noise_multiplier=1.0,
                clients_per_round=5, clip_norm=1.0,
                blt_buffers=blt.MAX_BUFFERS + 1)


def test_the_audit_runs_on_blt_noise_keeping_one_cycle_of_releases():
  config_lib.validate(config_lib.TrainConfig(
      noise_mechanism='blt', sampling='min_separation', min_separation=4,
      rounds=12, audit_canaries=10))
  from tff_clip.privacy import audit  # pylint: disable=g-import-not-at-top
  inner = dp.BoundedGaussianSumQuery(
      'clip', 1.0, 0.5, noise_seed=1, noise_mechanism='blt', rounds=12,
      separation=4, blt_buffers=2)
  inner.set_template(SPECS)
  query = audit.CanaryQuery(inner, SPECS, 6, 1.0, per_layer=False, seed=3,
                            separation=4, noise_mechanism='blt', rounds=12,
                            blt_buffers=2)
  state = query.initial_global_state()
  for _ in range(5):
    _, state, event = query.get_noised_result(
        query.initial_sample_state(SPECS), state)
  assert [tuple(x.shape) for x in state.past_results] == [(3, 300),
                                                          (3, 4, 5)]
  assert np.all(np.isfinite(state.max_whitened_cosine.numpy()))
  mechanism = mechanisms.noise_mechanism('blt', rounds=12, separation=4,
                                         blt_buffers=2)
  assert event == mechanism.participation_event(0.5)
