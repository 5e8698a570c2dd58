"""Noise that TensorFlow would flush to 0 is never what a DP round draws.

TensorFlow flushes float32 subnormals to 0. A noise std z S below the least
normal float32 (or products z S u of it) then adds nothing, while records
bounded by a still-normal C pass: a round released without noise whose
DpEvent says z. Three ways there, each closed: a given norm so small (the
spec refuses it), an adaptive norm driven toward 0 by the clients' norms
(kept at or above `least_clip_norm`), per-layer budgets whose float32
squares underflow in S (summed in float64). And an adaptive norm never
grows past what the records' dtypes hold. Oracles: the closed-form floor
2^24 x float32's least normal number, NumPy's float64 norm, float16's
largest value, and the spec's own refusal at the ceiling.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_clip.aggregation import bounding
from tff_clip.aggregation import dp
from tff_clip.aggregation import spec

FLOOR = 2.0**24 * float(np.finfo(np.float32).tiny)  # 1.97e-31
N = 10


def _round(query, template):
  @tf.function
  def one_round(state, records):
    params = query.derive_sample_params(state)
    sample = query.initial_sample_state(template)
    for i in range(N):
      sample = query.accumulate_record(params, sample, records[i])
    result, new_state, _ = query.get_noised_result(sample, state)
    return result, new_state
  return one_round


def test_the_floor_is_2_to_the_24_least_normal_float32s():
  assert spec.MIN_NOISE_STDDEV == FLOOR


def test_an_adaptive_norm_driven_toward_zero_still_draws_its_noise():
  # Clients whose updates are all 0 are below any C: it shrinks by
  # exp(-eta gamma) a round, toward 0. It stops where z_v C is the floor, and
  # one client's update is then released with noise, not as it is.
  factory = dp.dp_factory('normalize', noise_multiplier=0.5,
                          clients_per_round=float(N), clip_norm='adaptive',
                          initial_clip_norm=1e-29, target_quantile=0.5,
                          clip_learning_rate=0.2)
  value_type = tff.TensorType(np.float64, [4])
  z_v = factory.resolve(value_type).value_noise_multiplier
  query = factory.build_query(value_type)
  one_round = _round(query, tf.TensorSpec([4], tf.float64))
  state = query.initial_global_state()
  zeros = tf.zeros([N, 4], tf.float64)
  for _ in range(60):  # ln(1e-29 z_v / FLOOR) / 0.1 ~ 32 rounds.
    _, state = one_round(state, zeros)
  metrics = query.derive_metrics(state)
  assert float(metrics['clip_norm']) == pytest.approx(FLOOR / z_v, rel=1e-6)
  assert float(metrics['noise_stddev']) >= FLOOR
  records = np.zeros([N, 4])
  records[0] = [1.0, 2.0, 3.0, 4.0]
  released, _ = one_round(state, tf.constant(records))
  noiseless = np.asarray(bounding.normalize(
      tf.constant(records[0]), metrics['clip_norm']), np.float64) / N
  assert np.all(noiseless != 0)
  assert not np.any(np.asarray(released) == noiseless)


def test_tiny_per_layer_budgets_keep_their_noise():
  # Budgets C_h of 1e-19 square to 1e-38 (flushed in float32): S must
  # still be sqrt(sum C_h^2), not 0.
  factory = dp.dp_factory('per_layer_clip', noise_multiplier=1.0,
                          clients_per_round=float(N), clip_norm='adaptive',
                          initial_clip_norm=1e-19, target_quantile=0.5)
  template = collections.OrderedDict(a=tf.TensorSpec([3]),
                                     b=tf.TensorSpec([3]))
  query = factory.build_query(tff.types.tensorflow_to_type(template))
  state = query.initial_global_state()
  metrics = query.derive_metrics(state)
  budgets = np.asarray(metrics['layer_budgets'], np.float64)
  assert np.all(budgets > 0)
  assert float(metrics['noise_stddev']) == pytest.approx(
      np.linalg.norm(budgets), rel=1e-6)
  update = collections.OrderedDict(a=tf.constant([1.0, 2.0, 3.0]),
                                   b=tf.constant([0.0, 5.0, 0.0]))
  params = query.derive_sample_params(state)
  sample = query.accumulate_record(
      params, query.initial_sample_state(template), update)
  released, _, _ = query.get_noised_result(sample, state)
  noiseless = tf.nest.flatten(bounding.clip_per_layer(
      update, metrics['layer_budgets']))
  for got, bounded in zip(tf.nest.flatten(released), noiseless):
    assert not np.any(np.asarray(got) * N == np.asarray(bounded))


@pytest.mark.parametrize('placement, n, clip_norm', [
    ('central', 10.0, 1e-31), ('client', 100.0, 1e-30)])
def test_a_noise_std_below_the_floor_is_refused(placement, n, clip_norm):
  # Above float32's least normal (1.2e-38), below the floor: refused, naming
  # the std.
  with pytest.raises(ValueError, match='noise std .* is below 1.97e-31'):
    dp.dp_factory('clip', noise_multiplier=1.0, clients_per_round=n,
                  clip_norm=clip_norm, noise_placement=placement)


# ----------------------------------------------------------------------------
# And a ceiling: an adaptive norm never grows past what the records' dtypes
# hold. A float16 record bounded to a norm past 65504 is inf before the noise
# (inf + -inf: NaN), and no noise hides an inf: whether such a client took
# part would show.


def _od(**leaves):
  return collections.OrderedDict(**leaves)


def test_an_adaptive_float16_norm_stops_where_float16_holds_its_records():
  z, n = 0.01, 2
  factory = dp.dp_factory(
      'normalize', noise_multiplier=z, clients_per_round=n,
      clip_norm='adaptive', initial_clip_norm=60000.0, target_quantile=1.0,
      noise_seed=1)
  process = factory.create(tff.types.to_type(_od(w=(np.float16, [2]))))
  state = process.initialize()
  big = _od(w=np.array([60000, 60000], np.float16))  # Norm 84,853 > C.
  for _ in range(3):  # Every norm below C: C grows e^{0.2} a round.
    output = process.next(state, [big, big])
    state = output.state
  clip_norm = float(output.measurements['dp_query_metrics']['clip_norm'])
  # Oracle: float16's largest value, less the noise's ten-std tail on the
  # mean (z_v >= z).
  assert clip_norm <= 65504.0 / (1.0 + 10 * z / n)
  assert clip_norm > 60000.0  # It grew, up to the ceiling.
  # Opposite records normalized to C: their mean is 0 plus noise of std
  # z_v C / n ~ 400; never NaN.
  output = process.next(state, [_od(w=np.array([1, 0], np.float16)),
                                _od(w=np.array([-1, 0], np.float16))])
  result = np.asarray(output.result['w'], np.float64)
  assert np.all(np.isfinite(result)) and np.all(np.abs(result) < 1e4)


def test_per_layer_float16_norms_stop_where_float16_holds_the_noisy_mean():
  # Every layer's norm tracks its own quantile up to the ceiling; with each
  # C_h at it, S was sqrt(H) times it (with 64 layers the noise z_v S on one
  # client's mean pushed 3 to 8 of 64 float16 entries to inf a round).
  z, n, layers = 0.1, 1, 4
  factory = dp.dp_factory(
      'per_layer_normalize', noise_multiplier=z, clients_per_round=n,
      clip_norm='adaptive', initial_clip_norm=30000.0, target_quantile=1.0,
      clip_learning_rate=1.0, noise_seed=0)
  process = factory.create(tff.types.to_type(
      [tff.TensorType(np.float16, [1])] * layers))
  state = process.initialize()
  big = [np.array([60000], np.float16)] * layers  # Every layer above C_h.
  for _ in range(4):
    output = process.next(state, [big])
    state = output.state
    # Oracle: float16's largest value, less the ten-std tail of the noise
    # on the mean (z_v >= z); S the L2 norm of the budgets (NumPy).
    budgets = output.measurements['dp_query_metrics']['layer_budgets']
    sensitivity = np.linalg.norm(np.asarray(budgets, np.float64))
    assert sensitivity <= 65504.0 / (1.0 + 10 * z / n)
    assert all(np.all(np.isfinite(np.asarray(x, np.float64)))
               for x in output.result)


@pytest.mark.parametrize('dtype', [np.float16, np.float32])
@pytest.mark.parametrize('z,n', [(0.01, 2), (1.0, 100)])
def test_the_ceiling_is_the_greatest_norm_the_spec_accepts(dtype, z, n):
  ceiling = spec.greatest_norm(z, n, [np.dtype(dtype)])
  accepted = spec.DPSpec('clip', noise_multiplier=z, clients_per_round=n,
                         clip_norm=ceiling * (1 - 1e-6))
  accepted.check_noise_scale(dtypes=[dtype])
  with pytest.raises(ValueError, match='beyond'):
    spec.DPSpec('clip', noise_multiplier=z, clients_per_round=n,
                clip_norm=ceiling * (1 + 1e-6)).check_noise_scale(
                    dtypes=[dtype])
