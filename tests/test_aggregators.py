"""Specification of the non-private bounding factories (`tff_clip.aggregation.aggregators`)."""

import collections
import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_clip.aggregation import aggregators
from tff_clip.aggregation import bounding

VALUE_TYPE = tff.types.to_type(collections.OrderedDict(
    kernel=(np.float32, [2, 2]), bias=(np.float32, [2])))
WEIGHT_TYPE = tff.types.TensorType(np.float32)


def _update(kernel, bias):
  return collections.OrderedDict(kernel=np.asarray(kernel, np.float32),
                                 bias=np.asarray(bias, np.float32))


# Client 0: norm 5 (kernel 4, bias 3); client 1: norm 0.5; client 2: NaN.
CLIENTS = [
    _update([[4.0, 0.0], [0.0, 0.0]], [3.0, 0.0]),
    _update([[0.3, 0.0], [0.0, 0.4]], [0.0, 0.0]),
    _update([[np.nan, 0.0], [0.0, 0.0]], [1.0, 1.0]),
]
FACTORIES = {
    'clip': lambda: aggregators.clip_factory(1.0),
    'normalize': lambda: aggregators.normalize_factory(1.0),
    'per_layer_clip': lambda: aggregators.per_layer_clip_factory(1.0, 'uniform'),
    'per_layer_normalize':
        lambda: aggregators.per_layer_normalize_factory(1.0, 'uniform'),
}


_FLOAT32_UNIT_ROUNDOFF = 2.0**-24
# Every bound aims a hair below its norm so that the rounded result never
# exceeds it (bounding.rounding_margins: 8 u + 2 u + 1e-9 relative in float32),
# so a scaled entry may sit up to that much below its exact value.
_BOUND_MARGIN = 10 * _FLOAT32_UNIT_ROUNDOFF + 1e-9
# The (weighted) mean of non-negative entries over three clients: at most
# three products, two additions and one division, each rounded in float32 (u
# relative each), plus the per-layer budget C / sqrt(2) and the bound's factor
# (two more roundings): 8 u.
_MEAN_RTOL = _BOUND_MARGIN + 8 * _FLOAT32_UNIT_ROUNDOFF

_R = 1 / math.sqrt(2)  # The uniform per-layer budget C_h = C / sqrt(H), C = 1.
# The bounded clients written out by hand (C = 1). Client 0 (kernel norm 4,
# bias norm 3, global norm 5) is scaled by 1/5 globally, or each layer to
# 1/sqrt(2) per layer. Client 1 (kernel norm 0.5 < 1/sqrt(2), bias 0) is left
# alone by clipping; normalizing scales it to norm 1 (global: x2) or its
# kernel to 1/sqrt(2) (its zero bias stays zero). Client 2 (NaN) is zeroed.
_ZERO = _update([[0.0, 0.0], [0.0, 0.0]], [0.0, 0.0])
_EXPECTED_BOUNDED = {
    'clip': [_update([[0.8, 0.0], [0.0, 0.0]], [0.6, 0.0]),
             CLIENTS[1], _ZERO],
    'normalize': [_update([[0.8, 0.0], [0.0, 0.0]], [0.6, 0.0]),
                  _update([[0.6, 0.0], [0.0, 0.8]], [0.0, 0.0]), _ZERO],
    'per_layer_clip': [_update([[_R, 0.0], [0.0, 0.0]], [_R, 0.0]),
                       CLIENTS[1], _ZERO],
    'per_layer_normalize': [
        _update([[_R, 0.0], [0.0, 0.0]], [_R, 0.0]),
        _update([[0.6 * _R, 0.0], [0.0, 0.8 * _R]], [0.0, 0.0]), _ZERO],
}


def _expected_bounded(method):
  return _EXPECTED_BOUNDED[method]


@pytest.fixture(scope='module', params=list(FACTORIES))
def unweighted(request):
  process = FACTORIES[request.param]().create(VALUE_TYPE)
  return request.param, process, process.next(process.initialize(), CLIENTS)


@pytest.fixture(scope='module', params=['clip', 'per_layer_clip'])
def weighted(request):
  factory = FACTORIES[request.param]()
  process = factory.create(VALUE_TYPE, WEIGHT_TYPE)
  weights = [1.0, 3.0, 4.0]
  return (request.param, weights,
          process.next(process.initialize(), CLIENTS, weights))


def test_unweighted_result_is_mean_of_bounded_updates(unweighted):
  method, _, output = unweighted
  expected = _expected_bounded(method)
  for key in ('kernel', 'bias'):
    np.testing.assert_allclose(
        output.result[key], np.mean([e[key] for e in expected], axis=0),
        rtol=_MEAN_RTOL, atol=0)  # Zero entries stay exactly zero.


def test_weighted_result_is_weighted_mean_of_bounded_updates(weighted):
  method, weights, output = weighted
  expected = _expected_bounded(method)
  for key in ('kernel', 'bias'):
    np.testing.assert_allclose(
        output.result[key],
        np.average([e[key] for e in expected], axis=0, weights=weights),
        rtol=_MEAN_RTOL, atol=0)  # Zero entries stay exactly zero.


def test_nonfinite_client_is_zeroed_and_counted(unweighted):
  _, _, output = unweighted
  assert np.all(np.isfinite(output.result['kernel']))
  assert output.measurements['nonfinite_count'] == 1


def test_norm_measurements_describe_finite_clients(unweighted):
  method, _, output = unweighted
  m = output.measurements
  assert m['clip_norm'] == pytest.approx(1.0)
  np.testing.assert_allclose(m['mean_norm'], (5.0 + 0.5) / 2, rtol=1e-6)
  np.testing.assert_allclose(m['max_norm'], 5.0, rtol=1e-6)
  if method.startswith('per_layer'):
    np.testing.assert_allclose(m['layer_budgets'], [1 / math.sqrt(2)] * 2,
                               rtol=1e-6)
    # Layers in `tf.nest.flatten` order: mapping keys sorted (bias, kernel).
    np.testing.assert_allclose(m['mean_layer_norms'], [1.5, (4 + 0.5) / 2],
                               rtol=1e-6)
    np.testing.assert_allclose(m['max_layer_norms'], [3.0, 4.0], rtol=1e-6)
    # Client 0's layers both exceed 0.707; client 1's kernel (0.5) does not.
    assert m['clipped_fraction'] == pytest.approx(0.5)
  else:
    assert 'layer_budgets' not in m
    assert m['clipped_fraction'] == pytest.approx(0.5)


def test_inner_measurements_are_merged(unweighted):
  _, _, output = unweighted
  assert 'inner' in output.measurements


def test_default_factory_is_weighted_and_unweighted():
  factory = aggregators.clip_factory(1.0)
  assert isinstance(factory, tff.aggregators.UnweightedAggregationFactory)
  assert isinstance(factory, tff.aggregators.WeightedAggregationFactory)


def test_create_leaves_the_factory_unchanged():
  factory = aggregators.clip_factory(1.0)
  before = dict(vars(factory))
  factory.create(VALUE_TYPE, WEIGHT_TYPE)
  factory.create(VALUE_TYPE)
  assert vars(factory) == before


def test_inner_factory_sets_weightedness():
  weighted = aggregators.clip_factory(1.0, tff.aggregators.MeanFactory())
  unweighted = aggregators.clip_factory(1.0, tff.aggregators.SumFactory())
  assert isinstance(weighted, tff.aggregators.WeightedAggregationFactory)
  assert not isinstance(weighted, tff.aggregators.UnweightedAggregationFactory)
  assert isinstance(unweighted, tff.aggregators.UnweightedAggregationFactory)
  assert not isinstance(unweighted, tff.aggregators.WeightedAggregationFactory)


def test_sum_inner_factory_sums_clipped_updates():
  process = aggregators.clip_factory(
      1.0, tff.aggregators.SumFactory()).create(VALUE_TYPE)
  output = process.next(process.initialize(), CLIENTS[:2])
  expected = _expected_bounded('clip')[:2]
  np.testing.assert_allclose(output.result['bias'],
                             expected[0]['bias'] + expected[1]['bias'],
                             rtol=_MEAN_RTOL, atol=0)


def test_adaptive_norm_from_estimation_process_moves():
  # TFF's quantile estimator drives the norm: with both finite clients above
  # the initial norm and target quantile 0.5, the norm must grow.
  norm_process = tff.aggregators.PrivateQuantileEstimationProcess.no_noise(
      initial_estimate=0.1, target_quantile=0.5, learning_rate=0.5)
  process = aggregators.clip_factory(norm_process).create(VALUE_TYPE)
  state = process.initialize()
  norms = []
  for _ in range(3):
    output = process.next(state, CLIENTS[:2])
    state = output.state
    norms.append(float(output.measurements['clip_norm']))
  assert norms[0] == pytest.approx(0.1)
  assert norms[2] > norms[1] > norms[0]


def _tff_clipping_factory(clipping_norm):
  return tff.aggregators.clipping_factory(clipping_norm,
                                          tff.aggregators.MeanFactory())


def test_clip_factory_agrees_with_tff_clipping_factory():
  # TFF's own clipping (robust.py: u * min(1, C / ||u||), then the mean) is
  # the oracle on the finite clients.
  ours = aggregators.clip_factory(1.0).create(VALUE_TYPE, WEIGHT_TYPE)
  tffs = _tff_clipping_factory(1.0).create(VALUE_TYPE, WEIGHT_TYPE)
  weights = [1.0, 3.0]
  ours_output = ours.next(ours.initialize(), CLIENTS[:2], weights)
  tff_output = tffs.next(tffs.initialize(), CLIENTS[:2], weights)
  for key in ('kernel', 'bias'):
    np.testing.assert_allclose(ours_output.result[key],
                               tff_output.result[key], rtol=_MEAN_RTOL, atol=0)


def test_adaptive_clip_norm_follows_tff_clipping_factory():
  # The same no-noise quantile process drives TFF's clipping_factory: both
  # must report the same norm every round and the same mean. The norms agree
  # to float32 rounding of the geometric update (a few u per round, 3 rounds).
  def norm_process():
    return tff.aggregators.PrivateQuantileEstimationProcess.no_noise(
        initial_estimate=0.1, target_quantile=0.5, learning_rate=0.5)
  ours = aggregators.clip_factory(norm_process()).create(VALUE_TYPE,
                                                        WEIGHT_TYPE)
  tffs = _tff_clipping_factory(norm_process()).create(VALUE_TYPE, WEIGHT_TYPE)
  ours_state, tff_state = ours.initialize(), tffs.initialize()
  for _ in range(3):
    ours_output = ours.next(ours_state, CLIENTS[:2], [1.0, 3.0])
    tff_output = tffs.next(tff_state, CLIENTS[:2], [1.0, 3.0])
    ours_state, tff_state = ours_output.state, tff_output.state
    np.testing.assert_allclose(ours_output.measurements['clip_norm'],
                               tff_output.measurements['clipping_norm'],
                               rtol=16 * _FLOAT32_UNIT_ROUNDOFF)
    for key in ('kernel', 'bias'):
      np.testing.assert_allclose(ours_output.result[key],
                                 tff_output.result[key],
                                 rtol=_MEAN_RTOL + 16 * _FLOAT32_UNIT_ROUNDOFF,
                                 atol=0)


def test_adaptive_norm_scales_per_layer_budgets():
  norm_process = tff.aggregators.PrivateQuantileEstimationProcess.no_noise(
      initial_estimate=2.0, target_quantile=0.5, learning_rate=0.5)
  process = aggregators.per_layer_clip_factory(
      norm_process, 'dim').create(VALUE_TYPE)
  output = process.next(process.initialize(), CLIENTS[:2])
  budgets = output.measurements['layer_budgets']
  np.testing.assert_allclose(np.sqrt(np.sum(np.square(budgets))), 2.0,
                             rtol=1e-6)
  np.testing.assert_allclose(budgets, 2.0 * np.sqrt([2 / 6, 4 / 6]), rtol=1e-6)


# ----------------------------------------------------------------------------
# Bad input: raised at construction or `create`, naming the argument.


@pytest.mark.parametrize('bad', [0.0, -1.0, float('nan'), float('inf')])
@pytest.mark.parametrize('builder', list(FACTORIES))
def test_bad_clip_norm_rejected_at_construction(builder, bad):
  with pytest.raises(ValueError, match='clip_norm'):
    aggregators.bounding_factory(builder, bad)


def test_clip_norm_of_wrong_type_rejected():
  with pytest.raises(TypeError, match='clip_norm'):
    aggregators.clip_factory('1.0')


def test_unknown_bounding_rejected():
  with pytest.raises(ValueError, match='bounding'):
    aggregators.bounding_factory('squash', 1.0)


def test_unknown_split_rejected_at_construction():
  with pytest.raises(ValueError, match='split'):
    aggregators.per_layer_clip_factory(1.0, split='by_magic')


def test_split_weights_not_covering_every_layer_rejected_at_create():
  factory = aggregators.per_layer_clip_factory(1.0, split=[1.0, 2.0, 3.0])
  with pytest.raises(ValueError, match='split'):
    factory.create(VALUE_TYPE)


def test_nonpositive_split_weights_rejected_at_construction():
  with pytest.raises(ValueError, match='split'):
    aggregators.per_layer_clip_factory(1.0, split=[1.0, 0.0])


def test_explicit_budgets_breaking_sum_rule_rejected():
  with pytest.raises(ValueError, match='sum rule'):
    aggregators.per_layer_clip_factory(
        1.0, split=bounding.ExplicitBudgets([1.0, 1.0]))


def test_explicit_budgets_with_adaptive_norm_rejected():
  norm_process = tff.aggregators.PrivateQuantileEstimationProcess.no_noise(
      initial_estimate=1.0, target_quantile=0.5, learning_rate=0.5)
  with pytest.raises(ValueError, match='split'):
    aggregators.per_layer_clip_factory(
        norm_process, split=bounding.ExplicitBudgets([0.6, 0.8]))


def test_non_float_value_type_rejected_at_create():
  with pytest.raises(TypeError, match='value_type'):
    aggregators.clip_factory(1.0).create(tff.types.TensorType(np.int32, [3]))


def test_bad_inner_factory_rejected():
  with pytest.raises(TypeError, match='inner_agg_factory'):
    aggregators.clip_factory(1.0, inner_agg_factory=object())


# ----------------------------------------------------------------------------
# In a learning process: 3 rounds of weighted FedAvg on synthetic EMNIST.


def _model_fn(element_spec):
  def model_fn():
    keras_model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(28, 28)),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(10, kernel_initializer='zeros'),
    ])
    return tff.learning.models.from_keras_model(
        keras_model, input_spec=element_spec,
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])
  return model_fn


@pytest.fixture(scope='module')
def emnist_client_data():
  client_data = tff.simulation.datasets.emnist.get_synthetic()
  def preprocess(dataset):
    return dataset.map(lambda e: (e['pixels'], e['label'])).batch(8)
  return [preprocess(client_data.create_tf_dataset_for_client(cid)).take(2)
          for cid in client_data.client_ids[:1]] * 3


# clip_factory's and per_layer_clip_factory's runs are slow: in the default
# suite the same kind of run (FedAvg with the factory as model_aggregator) is
# checked exactly against Algorithm 2 by tests/test_algorithms.py::
# test_per_round_clipping_is_algorithm_2_with_the_server_rate (clip), and
# trains in test_algorithms.py's `lus` learning process (per-layer clip).
@pytest.mark.parametrize('method', [
    pytest.param(m, marks=pytest.mark.slow)
    if m in ('clip', 'per_layer_clip') else m
    for m in FACTORIES])
def test_fedavg_trains_three_rounds_with_each_factory(method,
                                                      emnist_client_data):
  process = tff.learning.algorithms.build_weighted_fed_avg(
      _model_fn(emnist_client_data[0].element_spec),
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.01),
      model_aggregator=FACTORIES[method]())
  state = process.initialize()
  for _ in range(3):
    before = process.get_model_weights(state).trainable
    output = process.next(state, emnist_client_data)
    state = output.state
    after = process.get_model_weights(state).trainable
    step = np.sqrt(sum(np.sum(np.square(a - b))
                       for a, b in zip(after, before)))
    m = output.metrics['aggregator']
    assert m['clip_norm'] == pytest.approx(1.0)
    assert 0.0 <= m['clipped_fraction'] <= 1.0
    # The mean of float32 norms is rounded once (relative 2^-24).
    assert m['max_norm'] >= m['mean_norm'] * (1 - 2**-23)
    assert m['mean_norm'] > 0.0
    assert m['nonfinite_count'] == 0
    assert np.isfinite(output.metrics['client_work']['train']['loss'])
    # Server SGD at rate 1 applies the mean of bounded updates: its norm is
    # at most C; the three clients hold the same data, so after
    # normalization it is exactly C.
    assert step <= 1.0 + 1e-5
    if method == 'normalize':
      assert step == pytest.approx(1.0, rel=1e-5)
