"""Specifications of `tff_clip.learning.client`: BLUR, LUS and model clipping.

The pure functions are checked on hand-made structures; the client work
processes against NumPy re-implementations of local SGD on a linear model
(Dense(2) on 3 features, mean squared error), written from the papers
(Cheng et al. 2022 Eqs. (5), (7), (11)-(13); Zhang et al. 2022 Section 2.1), not from the code
under test.
"""

import collections
import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import tiny_model  # pylint: disable=g-bad-import-order
from tff_clip.learning import client

CLIENT_LEARNING_RATE = 0.1
BATCH_SIZE = 2
INITIAL_KERNEL = tiny_model.INITIAL_KERNEL
INITIAL_BIAS = tiny_model.INITIAL_BIAS
TRUE_KERNEL = np.array([[2.0, -1.0], [1.0, 3.0], [-2.0, 1.5]], np.float32)
INPUT_SPEC = tiny_model.INPUT_SPEC


# ----------------------------------------------------------------------------
# Helpers.


_model_fn = tiny_model.model_fn


def _examples(seed, num_examples, kernel=TRUE_KERNEL, noise=0.1):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=[num_examples, 3]).astype(np.float32)
  y = (x @ kernel + noise * rng.normal(size=[num_examples, 2])).astype(
      np.float32)
  return x, y


def _dataset(x, y):
  return tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(x=x, y=y)).batch(BATCH_SIZE)


def _batches(x, y):
  return [(x[i:i + BATCH_SIZE], y[i:i + BATCH_SIZE])
          for i in range(0, len(x), BATCH_SIZE)]


def _initial_weights():
  return tff.learning.models.ModelWeights(
      trainable=[INITIAL_KERNEL, INITIAL_BIAS], non_trainable=[])


def _mse_gradient(kernel, bias, x, y):
  """Gradient of Keras's MSE, mean over the batch and the 2 outputs."""
  residual = x @ kernel + bias - y
  d_prediction = 2.0 * residual / residual.size
  return x.T @ d_prediction, d_prediction.sum(axis=0)


def _local_sgd(x, y, blur=None):
  """Local SGD, one step per batch; blur = (strength, S): Cheng et al. 2022 Eq. (7)."""
  kernel = INITIAL_KERNEL.astype(np.float64)
  bias = INITIAL_BIAS.astype(np.float64)
  penalty_was_active = False
  for bx, by in _batches(x, y):
    g_kernel, g_bias = _mse_gradient(kernel, bias, bx, by)
    if blur is not None:
      strength, clip_norm = blur
      squared = (np.sum((kernel - INITIAL_KERNEL)**2) +
                 np.sum((bias - INITIAL_BIAS)**2))
      if squared > clip_norm**2:
        penalty_was_active = True
        g_kernel = g_kernel + strength * (kernel - INITIAL_KERNEL)
        g_bias = g_bias + strength * (bias - INITIAL_BIAS)
    kernel = kernel - CLIENT_LEARNING_RATE * g_kernel
    bias = bias - CLIENT_LEARNING_RATE * g_bias
  return kernel, bias, penalty_was_active


def _norm(arrays):
  return math.sqrt(sum(float(np.sum(np.square(a))) for a in arrays))


def _run_client_work(process, client_examples):
  output = process.next(
      process.initialize(), [_initial_weights()] * len(client_examples),
      [_dataset(x, y) for x, y in client_examples])
  return output


# ----------------------------------------------------------------------------
# BLUR: the penalty (Cheng et al. 2022, Eq. (5)).

REFERENCE = collections.OrderedDict(
    kernel=tf.constant([[1.0, 2.0], [0.0, -1.0]]), bias=tf.constant([0.5]))


def _shifted(offset_kernel, offset_bias):
  return collections.OrderedDict(
      kernel=REFERENCE['kernel'] + tf.constant(offset_kernel, tf.float32),
      bias=REFERENCE['bias'] + tf.constant(offset_bias, tf.float32))


@pytest.mark.parametrize('offset', [
    ([[0.0, 0.0], [0.0, 0.0]], [0.0]),  # ||w - w_t|| = 0
    ([[0.3, 0.0], [0.0, 0.0]], [-0.4]),  # ||w - w_t|| = 0.5 < S
    ([[0.6, 0.0], [0.0, 0.0]], [0.8]),  # ||w - w_t|| = 1 = S (boundary)
])
def test_blur_penalty_is_zero_within_the_clip_norm(offset):
  weights = _shifted(*offset)
  assert float(client.blur_penalty(weights, REFERENCE, 1.0, 0.5)) == 0.0


def test_blur_penalty_is_half_strength_times_the_excess_squared_distance():
  weights = _shifted([[3.0, 0.0], [0.0, 0.0]], [4.0])  # ||w - w_t|| = 5
  penalty = client.blur_penalty(weights, REFERENCE, clip_norm=2.0,
                                strength=0.3)
  np.testing.assert_allclose(float(penalty), 0.5 * 0.3 * (25.0 - 4.0),
                             rtol=1e-6)


def _penalty_gradient(weights, clip_norm, strength):
  variables = tf.nest.map_structure(tf.Variable, weights)
  with tf.GradientTape() as tape:
    penalty = client.blur_penalty(variables, REFERENCE, clip_norm, strength)
  return tape.gradient(penalty, variables)


def test_blur_gradient_is_zero_within_the_clip_norm():
  # On the boundary too: there the objective is still the plain loss.
  for offset in (([[0.3, 0.0], [0.0, 0.0]], [-0.4]),
                 ([[0.6, 0.0], [0.0, 0.0]], [0.8])):
    gradient = _penalty_gradient(_shifted(*offset), 1.0, 0.5)
    for leaf in tf.nest.flatten(gradient):
      np.testing.assert_array_equal(leaf, np.zeros_like(leaf))


def test_blur_gradient_pulls_towards_the_received_model_outside_the_ball():
  strength, learning_rate = 0.5, 0.4
  weights = _shifted([[3.0, -1.0], [0.0, 2.0]], [1.0])
  gradient = _penalty_gradient(weights, 1.0, strength)
  for w, r, g in zip(tf.nest.flatten(weights), tf.nest.flatten(REFERENCE),
                     tf.nest.flatten(gradient)):
    # grad = lambda (w - w_t) (Cheng et al. 2022, Eq. (7)) ...
    np.testing.assert_allclose(g, strength * (w - r), rtol=1e-6)
    # ... so a step scales w - w_t by (1 - lambda eta) (Lemma 2).
    np.testing.assert_allclose((w - learning_rate * g) - r,
                               (1 - strength * learning_rate) * (w - r),
                               rtol=1e-6)


def test_blur_penalty_rejects_structures_of_different_sizes():
  with pytest.raises(ValueError, match='leaves'):
    client.blur_penalty([tf.zeros([2])], [tf.zeros([2]), tf.zeros([1])], 1.0,
                        1.0)


# ----------------------------------------------------------------------------
# LUS: scores, masks, sparsification (Cheng et al. 2022, Eqs. (11)-(13)).


@pytest.mark.parametrize('sparsity, sizes, expected', [
    (0.7, [10, 6, 2], [3, 2, 1]),  # ceil(0.3 d), never 0 entries.
    (0.0, [10, 6, 2], [10, 6, 2]),
    (0.29, [100], [71]),  # 0.29 * 100 = 28.999999999999996 in floats.
    # floor(2.9999996) = 2 zeroed: not 3, which is sparser than asked.
    (0.29999996, [10], [8]),
    ([0.5, 0.9, 0.0], [10, 10, 4], [5, 1, 4]),  # One sparsity per layer.
])
def test_lus_keeps_ceil_of_one_minus_sparsity_times_size_per_layer(
    sparsity, sizes, expected):
  specs = [tf.TensorSpec([size], tf.float32) for size in sizes]
  assert client.lus_keep_counts(specs, sparsity) == expected


def _random_scores(seed):
  rng = np.random.default_rng(seed)
  return collections.OrderedDict(
      kernel=tf.constant(rng.exponential(size=[4, 5]), tf.float32),
      bias=tf.constant(rng.exponential(size=[5]), tf.float32),
      scale=tf.constant([[2.0, 2.0, 2.0], [1.0, 1.0, 1.0]]),  # Ties.
  )


@pytest.mark.parametrize('sparsity', [0.0, 0.3, 0.5, 0.75, 0.95])
def test_lus_mask_keeps_exactly_s_h_entries_per_layer(sparsity):
  scores = _random_scores(seed=1)
  masks = client.lus_mask(scores, sparsity)
  expected = client.lus_keep_counts(scores, sparsity)
  kept = [int(np.sum(np.asarray(m) != 0)) for m in tf.nest.flatten(masks)]
  assert kept == expected
  for m in tf.nest.flatten(masks):
    assert set(np.unique(np.asarray(m))) <= {0.0, 1.0}


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_lus_mask_keeps_the_highest_scoring_entries(seed):
  scores = _random_scores(seed)
  masks = client.lus_mask(scores, 0.6)
  for score, mask in zip(tf.nest.flatten(scores), tf.nest.flatten(masks)):
    score, mask = np.asarray(score).ravel(), np.asarray(mask).ravel() > 0
    if mask.all():
      continue
    assert score[mask].min() >= score[~mask].max()


def test_lus_mask_accepts_one_sparsity_per_layer():
  scores = _random_scores(seed=3)
  masks = client.lus_mask(scores, [0.5, 0.8, 0.0])
  kept = [int(np.sum(np.asarray(m))) for m in tf.nest.flatten(masks)]
  # tf.nest order: bias (5), kernel (20), scale (6).
  assert kept == [3, 4, 6]


def test_lus_scores_are_gradient_times_update_in_absolute_value():
  delta = [tf.constant([1.0, -2.0, 3.0]), tf.constant([4.0])]
  gradient = [tf.constant([-0.5, 0.5, 0.0]), None]
  scores = client.lus_scores(gradient, delta)
  np.testing.assert_allclose(scores[0], [0.5, 1.0, 0.0])
  np.testing.assert_allclose(scores[1], [0.0])  # No gradient, no utility.


@pytest.mark.parametrize('dtype, delta, gradient', [
    # Scores 1, 1 + 2e-9, 1 - 2e-9, 0.5: equal once rounded to float32.
    (np.float64, [1.0, 1.0 + 2e-9, 1.0 - 2e-9, 0.5], [1.0] * 4),
    # Scores 1e-8 ... 2.5e-8: below float16's smallest subnormal (6e-8) / 2.
    (np.float16, [1e-4, 2.5e-4, 1.5e-4, 0.5e-4], [1e-4] * 4),
], ids=['float64', 'float16'])
def test_lus_sparsify_keeps_the_highest_scoring_entry_in_any_float_dtype(
    dtype, delta, gradient):
  delta = np.asarray(delta, dtype)
  gradient = np.asarray(gradient, dtype)
  # The oracle: the scores |g * d| of the stored values, in float64 NumPy.
  best = int(np.argmax(np.abs(gradient.astype(np.float64) *
                              delta.astype(np.float64))))
  sparse = client.lus_sparsify([tf.constant(delta)], [tf.constant(gradient)],
                               0.75)  # Keeps 1 of 4.
  assert sparse[0].dtype == dtype
  expected = np.zeros_like(delta)
  expected[best] = delta[best]
  np.testing.assert_array_equal(sparse[0], expected)


def test_lus_sparsify_drops_large_updates_the_loss_does_not_depend_on():
  delta = [tf.constant([10.0, 0.1, 0.2, 5.0])]
  gradient = [tf.constant([0.0, 1.0, 1.0, 0.0])]
  sparse = client.lus_sparsify(delta, gradient, 0.5)
  np.testing.assert_allclose(sparse[0], [0.0, 0.1, 0.2, 0.0])


@pytest.mark.parametrize('sparsity, error', [
    (-0.1, ValueError), (1.0, ValueError), (1.5, ValueError),
    (float('nan'), ValueError), ('0.5', TypeError), (None, TypeError),
    ([0.5, 1.0], ValueError), ([], ValueError),
])
def test_lus_rejects_sparsity_outside_zero_one(sparsity, error):
  with pytest.raises(error, match='lus_sparsity'):
    client.lus_keep_counts([tf.TensorSpec([4]), tf.TensorSpec([2])],
                           sparsity)


def test_lus_rejects_per_layer_sparsities_that_do_not_match_the_layers():
  with pytest.raises(ValueError, match='one per layer'):
    client.lus_keep_counts([tf.TensorSpec([4]), tf.TensorSpec([2])],
                           [0.5, 0.5, 0.5])


# ----------------------------------------------------------------------------
# Model clipping (Zhang et al. 2022, Section 2.1): the update w_t - clip(w_local).


def test_clipped_model_update_is_received_model_minus_clipped_local_model():
  initial = [tf.constant([1.0, 1.0]), tf.constant([0.5])]
  local = [tf.constant([3.0, 0.0]), tf.constant([4.0])]  # ||w_local|| = 5.
  update = client.clipped_model_update(initial, local, clip_norm=2.5)
  # Clipping aims 6e-7 (relative) below C (`bounding.rounding_margins`):
  # entries of size <= 2.5 may move by 2e-6 absolute.
  np.testing.assert_allclose(update[0], [1.0 - 1.5, 1.0 - 0.0], atol=2e-6)
  np.testing.assert_allclose(update[1], [0.5 - 2.0], atol=2e-6)


def test_clipped_model_update_of_a_small_model_is_the_plain_delta():
  initial = [tf.constant([1.0, 1.0])]
  local = [tf.constant([0.3, 0.4])]
  update = client.clipped_model_update(initial, local, clip_norm=1.0)
  np.testing.assert_allclose(update[0], [0.7, 0.6], rtol=1e-6)


# ----------------------------------------------------------------------------
# The client work processes, against NumPy local SGD.

BLUR_STRENGTH = 2.0
BLUR_CLIP_NORM = 0.3
LUS_SPARSITY = 0.5
MODEL_CLIP_NORM = 1.0

# Client 0 fits its data far from the initial model (it leaves the BLUR ball,
# and its LUS mask by |gradient * update| differs from the mask by |update|);
# client 1's data is almost fitted already (it stays inside the BLUR ball).
CLIENT_EXAMPLES = [
    _examples(seed=13, num_examples=8),
    _examples(seed=11, num_examples=6, kernel=INITIAL_KERNEL, noise=0.01),
]


@pytest.fixture(scope='module')
def blur_output():
  process = client.build_client_work(
      _model_fn, tff.learning.optimizers.build_sgdm(CLIENT_LEARNING_RATE),
      blur_strength=BLUR_STRENGTH, blur_clip_norm=BLUR_CLIP_NORM)
  return _run_client_work(process, CLIENT_EXAMPLES)


@pytest.fixture(scope='module')
def lus_output():
  process = client.build_client_work(
      _model_fn, tff.learning.optimizers.build_sgdm(CLIENT_LEARNING_RATE),
      lus_sparsity=LUS_SPARSITY)
  return _run_client_work(process, CLIENT_EXAMPLES)


@pytest.fixture(scope='module')
def model_clipping_process():
  return client.build_client_work(
      _model_fn, tff.learning.optimizers.build_sgdm(CLIENT_LEARNING_RATE),
      model_clip_norm=MODEL_CLIP_NORM)


@pytest.fixture(scope='module')
def model_clipping_output(model_clipping_process):
  return _run_client_work(model_clipping_process, CLIENT_EXAMPLES)


def _assert_update(result, kernel, bias):
  np.testing.assert_allclose(result.update[0], kernel, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(result.update[1], bias, rtol=1e-5, atol=1e-6)


def test_blur_client_minimises_the_penalised_objective(blur_output):
  x, y = CLIENT_EXAMPLES[0]
  kernel, bias, active = _local_sgd(x, y, (BLUR_STRENGTH, BLUR_CLIP_NORM))
  assert active  # The penalty did act on this client.
  _assert_update(blur_output.result[0], INITIAL_KERNEL - kernel,
                 INITIAL_BIAS - bias)


def test_blur_client_within_the_clip_norm_trains_on_the_plain_loss(
    blur_output):
  x, y = CLIENT_EXAMPLES[1]
  kernel, bias, active = _local_sgd(x, y)
  assert not _local_sgd(x, y, (BLUR_STRENGTH, BLUR_CLIP_NORM))[2]
  assert not active
  _assert_update(blur_output.result[1], INITIAL_KERNEL - kernel,
                 INITIAL_BIAS - bias)


def test_blur_client_update_is_shorter_than_the_plain_update(blur_output):
  x, y = CLIENT_EXAMPLES[0]
  kernel, bias, _ = _local_sgd(x, y)
  plain_norm = _norm([INITIAL_KERNEL - kernel, INITIAL_BIAS - bias])
  assert _norm(blur_output.result[0].update) < plain_norm


def _top_entries(delta, scores):
  expected = []
  for d, score in zip(delta, scores):
    score = score.ravel()
    keep = math.ceil((1 - LUS_SPARSITY) * score.size)
    mask = np.zeros(score.size)
    mask[np.argsort(-score)[:keep]] = 1
    expected.append(d * mask.reshape(d.shape))
  return expected


def _expected_lus_update(x, y):
  kernel, bias, _ = _local_sgd(x, y)
  delta = [INITIAL_KERNEL - kernel, INITIAL_BIAS - bias]
  # Gradient at the locally trained weights, on all the client's data.
  gradient = _mse_gradient(kernel, bias, x, y)
  return _top_entries(delta, [np.abs(g * d) for g, d in zip(gradient, delta)])


def test_lus_client_keeps_exactly_s_h_nonzeros_per_layer(lus_output):
  for result in lus_output.result:
    kept = [int(np.count_nonzero(leaf)) for leaf in result.update]
    assert kept == [3, 1]  # ceil(0.5 * 6), ceil(0.5 * 2).


@pytest.mark.parametrize('index', [0, 1])
def test_lus_client_keeps_the_entries_with_the_highest_gradient_times_update(
    lus_output, index):
  expected = _expected_lus_update(*CLIENT_EXAMPLES[index])
  _assert_update(lus_output.result[index], *expected)


def test_lus_client_ranks_by_utility_cost_not_by_update_size(lus_output):
  x, y = CLIENT_EXAMPLES[0]
  kernel, bias, _ = _local_sgd(x, y)
  delta = [INITIAL_KERNEL - kernel, INITIAL_BIAS - bias]
  by_size = _top_entries(delta, [np.abs(d) for d in delta])
  assert not all(
      np.array_equal(np.asarray(u) != 0, b != 0)
      for u, b in zip(lus_output.result[0].update, by_size))


def test_lus_gradient_pass_does_not_count_the_data_twice(lus_output):
  train = lus_output.measurements['train']
  assert train['num_examples'] == sum(len(x) for x, _ in CLIENT_EXAMPLES)
  assert train['num_batches'] == sum(
      len(_batches(x, y)) for x, y in CLIENT_EXAMPLES)


def test_lus_client_weight_is_its_number_of_examples(lus_output):
  assert [r.update_weight for r in lus_output.result] == [8.0, 6.0]


def test_tffs_reduce_loop_trains_the_same_steps_as_the_default_iterator():
  # LUS runs both loops (training, then the gradient pass); the default is
  # DATASET_ITERATOR, TFF's own default DATASET_REDUCE.
  assert client.DEFAULT_LOOP == tff.learning.LoopImplementation.DATASET_ITERATOR
  process = client.build_client_work(
      _model_fn, tff.learning.optimizers.build_sgdm(CLIENT_LEARNING_RATE),
      lus_sparsity=LUS_SPARSITY,
      loop_implementation=tff.learning.LoopImplementation.DATASET_REDUCE)
  output = _run_client_work(process, CLIENT_EXAMPLES)
  for index, result in enumerate(output.result):
    _assert_update(result, *_expected_lus_update(*CLIENT_EXAMPLES[index]))


@pytest.mark.parametrize('index', [0, 1])
def test_model_clipping_client_reports_received_minus_clipped_local_model(
    model_clipping_output, index):
  kernel, bias, _ = _local_sgd(*CLIENT_EXAMPLES[index])
  scale = min(1.0, MODEL_CLIP_NORM / _norm([kernel, bias]))
  _assert_update(model_clipping_output.result[index],
                 INITIAL_KERNEL - scale * kernel, INITIAL_BIAS - scale * bias)


def test_model_clipping_clips_the_model_not_the_update(model_clipping_output):
  # Client 0's trained model is longer than the clip norm, so the model the
  # server receives, w_t - update, has exactly the clip norm.
  kernel, bias, _ = _local_sgd(*CLIENT_EXAMPLES[0])
  assert _norm([kernel, bias]) > MODEL_CLIP_NORM
  local = [w - u for w, u in zip(_initial_weights().trainable,
                                 model_clipping_output.result[0].update)]
  np.testing.assert_allclose(_norm(local), MODEL_CLIP_NORM, rtol=1e-5)


def test_a_diverged_client_reports_zeros_with_weight_zero(
    model_clipping_process):
  # Its local model overflows to Inf; clip(Inf) alone would be zeros, and the
  # report w_t - 0 would drag the average towards w_t.
  huge = np.full([2, 3], 1e30, np.float32)
  output = _run_client_work(model_clipping_process,
                            [(huge, np.full([2, 2], 1e30, np.float32))])
  [result] = output.result
  assert result.update_weight == 0.0
  for leaf in result.update:
    np.testing.assert_array_equal(leaf, np.zeros_like(leaf))


# ----------------------------------------------------------------------------
# Bad input, at build time.


def _sgd(learning_rate=CLIENT_LEARNING_RATE):
  return tff.learning.optimizers.build_sgdm(learning_rate)


@pytest.mark.parametrize('kwargs, error, name', [
    (dict(blur_strength=10.0, blur_clip_norm=1.0), ValueError,
     'blur_strength'),  # lambda = 1 / eta_l.
    (dict(blur_strength=11.0, blur_clip_norm=1.0), ValueError,
     'blur_strength'),
    (dict(blur_strength=0.0, blur_clip_norm=1.0), ValueError,
     'blur_strength'),
    (dict(blur_strength=1.0), ValueError, 'blur_clip_norm'),
    (dict(blur_strength=1.0, blur_clip_norm=0.0), ValueError,
     'blur_clip_norm'),
    (dict(blur_clip_norm=1.0), ValueError, 'blur_strength'),
    (dict(lus_sparsity=1.0), ValueError, 'lus_sparsity'),
    (dict(lus_sparsity=-0.5), ValueError, 'lus_sparsity'),
    (dict(model_clip_norm=-1.0), ValueError, 'model_clip_norm'),
    (dict(model_clip_norm=math.inf), ValueError, 'model_clip_norm'),
    (dict(model_clip_norm=1.0, lus_sparsity=0.5), ValueError,
     'model_clip_norm'),
    (dict(model_clip_norm='1'), TypeError, 'model_clip_norm'),
])
def test_build_client_work_rejects_bad_arguments_by_name(kwargs, error, name):
  with pytest.raises(error, match=name):
    client.build_client_work(_model_fn, _sgd(), **kwargs)


def test_build_client_work_rejects_a_loop_that_is_not_tffs_enum():
  with pytest.raises(TypeError, match='loop_implementation'):
    client.build_client_work(_model_fn, _sgd(), lus_sparsity=0.5,
                             loop_implementation='iterator')


def test_build_client_work_rejects_an_optimizer_that_is_not_tff():
  with pytest.raises(TypeError, match='client_optimizer'):
    client.build_client_work(_model_fn, tf.keras.optimizers.SGD(0.1),
                             lus_sparsity=0.5)


@pytest.mark.parametrize('sparsity', [0.0, 0.1, [0.0, 0.1]])
def test_build_client_work_refuses_lus_that_keeps_every_entry(sparsity):
  # The layers have 6 and 2 entries: s_h = d_h - floor(c d_h) = d_h for
  # c < 1/6, so the mask is all ones and the update unchanged; LUS would only
  # cost a pass over the data.
  with pytest.raises(ValueError, match='`lus_sparsity`'):
    client.build_client_work(_model_fn, _sgd(), lus_sparsity=sparsity)


def test_build_client_work_rejects_per_layer_sparsities_of_the_wrong_length():
  with pytest.raises(ValueError, match='lus_sparsity'):
    client.build_client_work(_model_fn, _sgd(), lus_sparsity=[0.5, 0.5, 0.5])
