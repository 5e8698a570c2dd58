"""The private APIs of other libraries that the project relies on, pinned down.

Each test fails loudly, naming the private API, when an upgrade of
tensorflow-privacy or TFF renames or reshapes it. The list (found with
`grep -rnE '\\._[a-z]' tff_clip tasks scripts` for accesses into other
libraries) is:

- tensorflow-privacy `QuantileEstimatorQuery._construct_below_estimate_query`
  (overridden by `tff_clip.aggregation.dp.CountQuantileEstimatorQuery` to seed and bound
  the count noise; tensorflow-privacy's own subclasses use the same hook, and
  there is no public way to choose the below-estimate query), together with
  the attribute `_below_estimate_query` that stores its result and the fields
  of `_SampleParams` (`current_estimate`, `below_estimate_params`) that
  `CountQuantileEstimatorQuery.preprocess_record` reads.
- TFF `simulation.baselines.stackoverflow.tag_prediction_tasks
  ._build_logistic_regression_model` (used by `tasks.models`).
- The location of TFF's C++ `worker_binary` inside its wheel
  (`tff_clip.runtime.execution.local_worker_binary`).
- TensorFlow `python.data.util.random_seed.get_seed`, the seed pair of
  `Dataset.shuffle(seed=...)` (`tff_clip.runtime.client_data`, which cannot call
  `shuffle` with a tensor seed under a global seed of 0).
"""

import inspect

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_privacy as tfp
from tensorflow.python.data.util import random_seed as data_random_seed  # pylint: disable=g-direct-tensorflow-import
from tensorflow_federated.python.simulation.baselines.stackoverflow import tag_prediction_tasks

from tff_clip.aggregation import dp
from tff_clip.runtime import execution


class _SpyQuantileEstimatorQuery(tfp.QuantileEstimatorQuery):
  """Records how tensorflow-privacy calls the hook."""

  calls = []

  def _construct_below_estimate_query(self, below_estimate_stddev,
                                      expected_num_records):
    query = tfp.NoPrivacyAverageQuery()
    self.calls.append((below_estimate_stddev, expected_num_records, query))
    return query


def test_tfp_quantile_estimator_hook_keeps_its_name_and_parameters():
  hook = getattr(tfp.QuantileEstimatorQuery,
                 '_construct_below_estimate_query', None)
  assert hook is not None, (
      'tensorflow-privacy renamed QuantileEstimatorQuery.'
      '_construct_below_estimate_query; update '
      'tff_clip.aggregation.dp.CountQuantileEstimatorQuery.')
  assert list(inspect.signature(hook).parameters) == [
      'self', 'below_estimate_stddev', 'expected_num_records']


def test_tfp_quantile_estimator_builds_its_count_query_through_the_hook():
  _SpyQuantileEstimatorQuery.calls.clear()
  query = _SpyQuantileEstimatorQuery(
      initial_estimate=1.0, target_quantile=0.5, learning_rate=0.2,
      below_estimate_stddev=3.0, expected_num_records=10.0,
      geometric_update=True)
  ((stddev, num_records, built),) = _SpyQuantileEstimatorQuery.calls
  assert (stddev, num_records) == (3.0, 10.0)
  # The hook's result is stored where CountQuantileEstimatorQuery reads it.
  assert query._below_estimate_query is built  # pylint: disable=protected-access
  params = query.derive_sample_params(query.initial_global_state())
  assert set(params._fields) >= {'current_estimate', 'below_estimate_params'}


def test_count_quantile_estimator_override_is_the_query_in_use():
  query = dp.CountQuantileEstimatorQuery(
      initial_estimate=[1.0, 2.0], target_quantile=0.5, learning_rate=0.2,
      below_estimate_stddev=3.0, expected_num_records=10.0, noise_seed=1)
  below = query._below_estimate_query  # pylint: disable=protected-access
  assert isinstance(below, tfp.NormalizedQuery)
  # One count per layer: (norm <= C) - 1/2 for each of the two entries. The
  # record goes through the override's bounded sum (L2 sensitivity
  # sqrt(2)/2, which this record meets), so it is aimed a hair below the
  # bound (bounding.rounding_margins: 10 u + 1e-9, u = 2^-24 in float32).
  params = query.derive_sample_params(query.initial_global_state())
  record = query.preprocess_record(params, tf.constant([0.5, 3.0]))
  np.testing.assert_allclose(record, [0.5, -0.5],
                             rtol=11 * 2.0**-24 + 1e-9, atol=0)


def test_tff_logistic_regression_builder_keeps_its_name_and_parameters():
  builder = getattr(tag_prediction_tasks, '_build_logistic_regression_model',
                    None)
  assert builder is not None, (
      'TFF removed tag_prediction_tasks._build_logistic_regression_model; '
      'update tasks.models.')
  assert list(inspect.signature(builder).parameters) == [
      'input_size', 'output_size']
  model = builder(input_size=5, output_size=3)
  assert model.output_shape == (None, 3)


def test_tff_wheel_ships_the_worker_binary_where_execution_looks():
  try:
    path = execution.local_worker_binary()
  except RuntimeError as e:
    pytest.fail(f'TFF moved its worker binary: {e}')
  assert path.endswith('worker_binary')


def test_tf_data_seed_pair_is_what_shuffle_uses():
  get_seed = data_random_seed.get_seed
  for global_seed in (None, 0, 11):
    tf.random.set_seed(global_seed)
    seed, seed2 = get_seed(42)
    # The pair drives ShuffleDatasetV3 exactly as Dataset.shuffle(seed=42).
    flat = [tf.TensorSpec([], tf.int64)]
    base = tf.data.Dataset.range(50)
    shuffled = tf.data.experimental.from_variant(tf.raw_ops.ShuffleDatasetV3(
        input_dataset=tf.data.experimental.to_variant(base),
        buffer_size=tf.constant(10, tf.int64), seed=seed, seed2=seed2,
        seed_generator=tf.raw_ops.DummySeedGenerator(),
        output_types=[s.dtype for s in flat],
        output_shapes=[s.shape for s in flat],
        reshuffle_each_iteration=True), base.element_spec)
    expected = base.shuffle(10, seed=42, reshuffle_each_iteration=True)
    assert list(shuffled.as_numpy_iterator()) == list(
        expected.as_numpy_iterator())
  tf.random.set_seed(None)


def test_the_clients_seed_pair_is_tf_datas_own_under_the_run_seed():
  # tf.data's pair under `tf.random.set_seed(run seed)`; then the global
  # seed is set to another (or none): the client's pair does not follow it.
  from tff_clip.runtime import client_data
  for run_seed in (0, 11, 2**31 - 1, 2**40 + 3):
    for seed in (0, 1, 42, 2**31 - 1):
      tf.random.set_seed(run_seed)
      expected = [int(t) for t in data_random_seed.get_seed(seed)]
      for global_seed in (None, 5):
        tf.random.set_seed(global_seed)
        assert list(client_data._seed_pair(run_seed, seed)) == expected
  tf.random.set_seed(None)
