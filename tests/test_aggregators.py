"""Specification of the non-private bounding factories (`tff_clip.aggregators`)."""

import collections
import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_clip import aggregators
from tff_clip import bounding

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


def _expected_bounded(method):
  budgets = bounding.layer_budgets(VALUE_TYPE, 1.0, 'uniform')
  out = []
  for client in CLIENTS:
    result = bounding.bound(
        {k: tf.constant(v) for k, v in client.items()}, method, clip_norm=1.0,
        budgets=budgets)
    out.append({k: np.asarray(v) for k, v in result.value.items()})
  return out


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
        rtol=1e-6, atol=1e-7)


def test_weighted_result_is_weighted_mean_of_bounded_updates(weighted):
  method, weights, output = weighted
  expected = _expected_bounded(method)
  for key in ('kernel', 'bias'):
    np.testing.assert_allclose(
        output.result[key],
        np.average([e[key] for e in expected], axis=0, weights=weights),
        rtol=1e-6, atol=1e-7)


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
                             rtol=1e-6)


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


@pytest.mark.parametrize('method', list(FACTORIES))
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
