"""Evaluation of server-held data (`tff_clip.learning.evaluation`): plain
TensorFlow, with the numbers of TFF's own federated evaluation."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_clip.learning import evaluation

_INPUT_SPEC = collections.OrderedDict(
    x=tf.TensorSpec([None, 4], tf.float32), y=tf.TensorSpec([None], tf.int32))


def _model_fn():
  """4 features -> 3 classes, with loss and accuracy metrics."""
  keras_model = tf.keras.Sequential([
      tf.keras.layers.Dense(5, activation='relu', input_shape=(4,)),
      tf.keras.layers.Dense(3)])
  return tff.learning.models.from_keras_model(
      keras_model,
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=_INPUT_SPEC,
      metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])


def _test_data(examples=23, seed=7):
  """`examples` examples in batches of 5: the last batch is short."""
  rng = np.random.default_rng(seed)
  return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=rng.normal(size=[examples, 4]).astype(np.float32),
      y=rng.integers(0, 3, size=examples).astype(np.int32))).batch(5)


def _weights(seed):
  model = _model_fn()
  weights = tff.learning.models.ModelWeights.from_model(model)
  rng = np.random.default_rng(seed)
  return tff.learning.models.ModelWeights(
      trainable=[rng.normal(size=v.shape).astype(np.float32)
                 for v in weights.trainable],
      non_trainable=[])


@pytest.fixture(scope='module')
def tff_eval():
  """TFF's own federated evaluation: the oracle."""
  return tff.learning.algorithms.build_fed_eval(_model_fn)


def _tff_metrics(tff_eval, weights):
  state = tff_eval.set_model_weights(tff_eval.initialize(), weights)
  metrics = tff_eval.next(state, [_test_data()]).metrics
  current = metrics['client_work']['eval']['current_round_metrics']
  return float(current['loss']), float(current['sparse_categorical_accuracy'])


def test_server_evaluation_gives_tffs_fed_eval_numbers(tff_eval):
  server_eval = evaluation.ServerEvaluation(_model_fn, _test_data())
  for seed in (1, 2, 1):  # Each call counts afresh: none adds to the last.
    weights = _weights(seed)
    loss, accuracy = _tff_metrics(tff_eval, weights)
    metrics = server_eval(weights)
    np.testing.assert_allclose(metrics['eval_loss'], loss, rtol=1e-6)
    np.testing.assert_allclose(metrics['eval_accuracy'], accuracy, rtol=1e-6)


def test_server_evaluation_traces_once():
  server_eval = evaluation.ServerEvaluation(_model_fn, _test_data())
  for seed in (1, 2, 3):
    server_eval(_weights(seed))
  traced = server_eval._unfinalized_metrics  # pylint: disable=protected-access
  assert traced.experimental_get_tracing_count() == 1


def test_a_model_without_accuracy_reports_nan_accuracy():
  def model_fn():
    return tff.learning.models.from_keras_model(
        tf.keras.Sequential([tf.keras.layers.Dense(3, input_shape=(4,))]),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=_INPUT_SPEC)
  metrics = evaluation.ServerEvaluation(model_fn, _test_data())(
      tff.learning.models.ModelWeights.from_model(model_fn()))
  assert np.isfinite(metrics['eval_loss'])
  assert np.isnan(metrics['eval_accuracy'])


def _other_data():
  """Another dataset of the same element spec: 11 examples."""
  return _test_data(11, seed=8)


def test_a_shared_evaluation_gives_tffs_numbers_on_each_runs_data(tff_eval):
  # A process's later runs of one model (their data differs by seed) share
  # one evaluation under their key: each run's own data, each with TFF's
  # numbers, one trace for both.
  shared = evaluation.server_evaluation(_model_fn, key='model-a')
  assert evaluation.server_evaluation(_model_fn, key='model-a') is shared
  assert evaluation.server_evaluation(_model_fn, key='model-b') is not shared
  assert evaluation.server_evaluation(_model_fn) is not shared
  weights = _weights(3)
  for data in (_test_data, _other_data, _test_data):
    state = tff_eval.set_model_weights(tff_eval.initialize(), weights)
    current = tff_eval.next(state, [data()]).metrics['client_work']['eval'][
        'current_round_metrics']
    result = shared(weights, data())
    assert result['eval_loss'] == pytest.approx(float(current['loss']),
                                                rel=1e-5)
    assert result['eval_accuracy'] == pytest.approx(
        float(current['sparse_categorical_accuracy']))
  assert shared._unfinalized_metrics.experimental_get_tracing_count() == 1


def _branching_model_fn():
  """`_model_fn`'s model, its forward pass behind a Python `if` on a tensor
  (never taken): a `tf.function` that traces only under autograph."""
  model = _model_fn()

  class Branching(type(model)):

    @tf.function
    def forward_pass(self, batch_input, training=True):
      if tf.reduce_sum(batch_input['x']) > 1e30:  # A tensor as a bool.
        batch_input = dict(batch_input, x=tf.zeros_like(batch_input['x']))
      return super().forward_pass(batch_input, training=training)

  model.__class__ = Branching
  return model


def test_a_model_that_needs_autograph_is_evaluated_with_it(tff_eval):
  # The evaluation traces the forward pass without autograph (fast); a
  # model whose Python needs it fails that trace and is run converted, with
  # the numbers of TFF's own federated evaluation of the same model.
  server_eval = evaluation.ServerEvaluation(_branching_model_fn,
                                           _test_data())
  for seed in (1, 2):  # Again: the converted trace serves the next call.
    weights = _weights(seed)
    metrics = server_eval(weights)
    loss, accuracy = _tff_metrics(tff_eval, weights)
    np.testing.assert_allclose(metrics['eval_loss'], loss, rtol=1e-6)
    np.testing.assert_allclose(metrics['eval_accuracy'], accuracy, rtol=1e-6)
  assert server_eval._unfinalized_metrics is server_eval._converted  # pylint: disable=protected-access


def test_a_keras_model_is_evaluated_without_autograph():
  server_eval = evaluation.ServerEvaluation(_model_fn, _test_data())
  server_eval(_weights(1))
  assert server_eval._unfinalized_metrics is not server_eval._converted  # pylint: disable=protected-access
