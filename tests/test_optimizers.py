"""Specifications of `tff_clip.learning.optimizers`.

LAMB and LARS are checked against optax's `lamb` and `lars` (an independent
implementation; a test dependency pinned in requirements.txt), run on the same
weights and gradients, not against the code under test.
"""

import collections
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import enable_x64
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_clip.learning import optimizers

_NUM_STEPS = 5


# ----------------------------------------------------------------------------
# Helpers.


def _weights():
  """A small multi-leaf, nested structure with a zero-norm leaf (the bias)."""
  return collections.OrderedDict(
      dense=[
          tf.constant([[0.5, -1.0], [1.5, 0.25], [-0.75, 2.0]], tf.float32),
          tf.zeros([2], tf.float32),  # ||w_h|| = 0: trust ratio must be 1.
      ],
      scale=tf.constant(1.5, tf.float32),
      frozen=tf.constant([0.3, -0.4], tf.float32),  # Its gradient is zero.
  )


def _gradient_sequence(num_steps=_NUM_STEPS, seed=0):
  rng = np.random.default_rng(seed)
  sequence = []
  for _ in range(num_steps):
    sequence.append(
        collections.OrderedDict(
            dense=[
                tf.constant(rng.normal(size=[3, 2]), tf.float32),
                tf.constant(rng.normal(size=[2]), tf.float32),
            ],
            scale=tf.constant(rng.normal(), tf.float32),
            frozen=tf.zeros([2], tf.float32),  # ||u_h|| = 0 when no decay.
        ))
  return sequence


def _specs(structure):
  return tf.nest.map_structure(
      lambda x: tf.TensorSpec(x.shape, x.dtype), structure)


def _numpy(structure):
  return [np.asarray(x, np.float64) for x in tf.nest.flatten(structure)]


def _run(optimizer, weights, gradient_sequence):
  """Runs the optimizer; returns the state and the weights after each step."""
  state = optimizer.initialize(_specs(weights))
  trajectory = []
  for gradients in gradient_sequence:
    state, weights = optimizer.next(state, weights, gradients)
    trajectory.append(weights)
  return state, trajectory


def _global_norm(arrays):
  return math.sqrt(sum(float(np.sum(np.square(a))) for a in arrays))


def _optax_trajectory(transformation, weights, gradient_sequence):
  """Runs an optax transformation (the oracle) from the same start, in float32.

  optax (DeepMind; `optax.lamb`, `optax.lars`) is an independent
  implementation of both rules, used here as the reference.
  """
  to_jax = lambda x: jnp.asarray(np.asarray(x))
  params = tf.nest.map_structure(to_jax, weights)
  state = transformation.init(params)
  trajectory = []
  for gradients in gradient_sequence:
    updates, state = transformation.update(
        tf.nest.map_structure(to_jax, gradients), state, params)
    params = optax.apply_updates(params, updates)
    # jax keeps the container types, so tf.nest flattens both the same way.
    trajectory.append(_numpy(jax.tree_util.tree_map(np.asarray, params)))
  return trajectory


def _optax_lamb(learning_rate, beta_1=0.9, beta_2=0.999, epsilon=1e-6,
                weight_decay=0.0):
  return optax.lamb(learning_rate, b1=beta_1, b2=beta_2, eps=epsilon,
                    weight_decay=weight_decay)


def _optax_lars(learning_rate, momentum=0.9, weight_decay=0.0,
                trust_coefficient=0.001, epsilon=0.0, nesterov=False):
  return optax.lars(learning_rate, weight_decay=weight_decay,
                    trust_coefficient=trust_coefficient, eps=epsilon,
                    momentum=momentum, nesterov=nesterov)


def _tolerance(trajectories):
  """Float32 agreement bound for two implementations of the same rule.

  Both sides round each of the ~10 operations of a step (moments, sqrt, two
  norms over at most 6 elements, a division, a product, the subtraction) to
  float32, each with relative error <= eps32 = 2^-23 ~ 1.2e-7, in different
  orders. An element's error per step is therefore at most ~16 eps32 times the
  largest magnitude M it goes through (a weight or a step); errors from earlier
  steps reach later ones through the trust ratio and momentum with gain ~1
  (lr * trust ratio <= 1 here), so after T steps the two differ by at most
  T * 16 * eps32 * M. The last factor 2 covers that gain.
  """
  largest = max(float(np.max(np.abs(leaf)))
                for weights in trajectories for leaf in weights)
  return 2 * len(trajectories) * 16 * np.finfo(np.float32).eps * max(
      largest, 1.0)


def _assert_trajectories_close(actual, expected, atol=None):
  assert len(actual) == len(expected)
  atol = _tolerance(expected) if atol is None else atol
  for step, (got, want) in enumerate(zip(actual, expected)):
    for leaf, (a, b) in enumerate(zip(_numpy(got), want)):
      np.testing.assert_allclose(
          a, b, rtol=0, atol=atol, err_msg=f'step {step}, leaf {leaf}')


# ----------------------------------------------------------------------------
# LAMB and LARS follow their update rules.


@pytest.mark.parametrize('hparams', [
    {},
    dict(beta_1=0.8, beta_2=0.99, epsilon=1e-3, weight_decay=0.05),
], ids=['optax_defaults', 'weight_decay'])
def test_lamb_matches_optax_lamb(hparams):
  learning_rate = 0.05
  gradients = _gradient_sequence()
  _, trajectory = _run(
      optimizers.build_lamb(learning_rate, **hparams), _weights(), gradients)
  expected = _optax_trajectory(_optax_lamb(learning_rate, **hparams),
                               _weights(), gradients)
  _assert_trajectories_close(trajectory, expected)


@pytest.mark.parametrize('hparams', [
    {},
    dict(momentum=0.5, weight_decay=0.01, trust_coefficient=0.02,
         epsilon=1e-3, nesterov=True),
], ids=['optax_defaults', 'weight_decay_nesterov'])
def test_lars_matches_optax_lars(hparams):
  learning_rate = 0.5
  gradients = _gradient_sequence()
  _, trajectory = _run(
      optimizers.build_lars(learning_rate, **hparams), _weights(), gradients)
  expected = _optax_trajectory(_optax_lars(learning_rate, **hparams),
                               _weights(), gradients)
  _assert_trajectories_close(trajectory, expected)


def test_lamb_moves_a_zero_initialised_layer_with_trust_ratio_one():
  weights = [tf.zeros([4])]
  gradients = [tf.constant([1.0, -2.0, 3.0, -4.0])]
  _, (new_weights,) = _run(optimizers.build_lamb(0.1), weights, [gradients])
  # Step 1 of bias-corrected Adam is g / (|g| + eps) ~ sign(g).
  np.testing.assert_allclose(new_weights[0], [-0.1, 0.1, -0.1, 0.1],
                             atol=1e-6)


def _float64_weights():
  """An ordinary layer and one at the 1e-50 scale, below float32's range."""
  return [tf.constant([[0.3, -0.7], [1.1, 0.2]], tf.float64),
          tf.constant([3e-50, -4e-50], tf.float64)]


def _float64_gradient_sequence(num_steps=3, seed=4):
  rng = np.random.default_rng(seed)
  return [[tf.constant(rng.normal(size=[2, 2]), tf.float64),
           tf.constant(rng.normal(size=[2]) * 1e-50, tf.float64)]
          for _ in range(num_steps)]


@pytest.mark.parametrize('builder, reference', [
    (lambda: optimizers.build_lamb(0.05, weight_decay=0.01),
     lambda: _optax_lamb(0.05, weight_decay=0.01)),
    (lambda: optimizers.build_lars(0.3, weight_decay=0.01),
     lambda: _optax_lars(0.3, weight_decay=0.01)),
], ids=['lamb', 'lars'])
def test_layerwise_optimizers_step_float64_weights_in_float64(builder,
                                                              reference):
  # optax with jax's x64 mode computes every step in float64; a trust ratio
  # or a hyperparameter rounded to float32 is off by ~1e-8 relative, and a
  # layer norm of 5e-50 rounded to float32 is 0 (trust ratio 1, not 1e-50).
  gradients = _float64_gradient_sequence()
  _, trajectory = _run(builder(), _float64_weights(), gradients)
  with enable_x64():
    expected = _optax_trajectory(reference(), _float64_weights(), gradients)
  for step, (got, want) in enumerate(zip(trajectory, expected)):
    for leaf, (a, b) in enumerate(zip(got, want)):
      assert a.dtype == tf.float64
      np.testing.assert_allclose(a, b, rtol=1e-12, atol=0,
                                 err_msg=f'step {step}, leaf {leaf}')


def test_lamb_steps_float16_weights_with_beta_2_near_one_like_optax():
  # 0.9999 is 1.0 in float16: (1 - beta_2) and the bias correction
  # 1 - beta_2^t must be formed before any rounding to float16, as optax does
  # (its decays stay Python floats), or v_hat is 0 / 0.
  half = lambda structure: tf.nest.map_structure(
      lambda x: tf.cast(x, tf.float16), structure)
  weights, gradients = half(_weights()), half(_gradient_sequence(3))
  _, trajectory = _run(optimizers.build_lamb(0.05, beta_2=0.9999), weights,
                       gradients)
  expected = _optax_trajectory(_optax_lamb(0.05, beta_2=0.9999), weights,
                               gradients)
  assert all(np.all(np.isfinite(leaf)) for leaf in expected[-1])
  for got in trajectory:
    assert all(leaf.dtype == tf.float16 for leaf in tf.nest.flatten(got))
  # A few float16 ulps (2^-10 relative) of weights up to 2 in size: both
  # sides store the moments and the weights in float16.
  _assert_trajectories_close(trajectory, expected, atol=4 * 2.0**-10 * 2)


@pytest.mark.parametrize('builder', [
    lambda: optimizers.build_lamb(0.1),
    lambda: optimizers.build_lars(0.1),
], ids=['lamb', 'lars'])
def test_layerwise_optimizers_leave_layers_without_gradient_untouched(builder):
  weights = [tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0])]
  optimizer = builder()
  state = optimizer.initialize(_specs(weights))
  state, new_weights = optimizer.next(state, weights,
                                      [None, tf.constant([0.5, -0.5])])
  np.testing.assert_array_equal(new_weights[0], [1.0, 2.0])
  assert not np.allclose(new_weights[1], [3.0, 4.0])
  np.testing.assert_array_equal(state['accumulator'][0], [0.0, 0.0])


# ----------------------------------------------------------------------------
# State and hyperparameters.


@pytest.mark.parametrize('builder, expected', [
    (lambda: optimizers.build_lamb(0.01),
     collections.OrderedDict(learning_rate=0.01, beta_1=0.9, beta_2=0.999,
                             epsilon=1e-6, weight_decay=0.0)),
    (lambda: optimizers.build_lars(0.01),
     collections.OrderedDict(learning_rate=0.01, momentum=0.9,
                             weight_decay=0.0, trust_coefficient=0.001,
                             epsilon=0.0)),
], ids=['lamb', 'lars'])
def test_hparams_round_trip_through_state(builder, expected):
  optimizer = builder()
  state = optimizer.initialize(_specs(_weights()))
  assert optimizer.get_hparams(state) == expected

  changed = collections.OrderedDict(
      (key, value * 0.5 + 0.01) for key, value in expected.items())
  new_state = optimizer.set_hparams(state, changed)

  assert optimizer.get_hparams(new_state) == changed
  assert optimizer.get_hparams(state) == expected  # Not mutated.
  for key in set(state) - set(expected):  # Moments and step are kept.
    tf.nest.map_structure(np.testing.assert_array_equal, new_state[key],
                          state[key])


def test_lamb_state_holds_step_count_and_moments():
  weights = _weights()
  state, _ = _run(optimizers.build_lamb(0.1), weights, _gradient_sequence(3))
  assert int(state['step']) == 3
  tf.nest.assert_same_structure(state['accumulator'], weights)
  tf.nest.assert_same_structure(state['preconditioner'], weights)


def test_set_hparams_rejects_unknown_names():
  optimizer = optimizers.build_lamb(0.1)
  state = optimizer.initialize(_specs(_weights()))
  with pytest.raises(KeyError, match='momentum'):
    optimizer.set_hparams(state, {'momentum': 0.9})


@pytest.mark.parametrize('builder, name, value', [
    (lambda: optimizers.build_lamb(0.1), 'beta_1', 1.0),
    (lambda: optimizers.build_lamb(0.1), 'beta_2', -0.5),
    (lambda: optimizers.build_lamb(0.1), 'epsilon', 0.0),
    (lambda: optimizers.build_lamb(0.1), 'learning_rate', float('nan')),
    (lambda: optimizers.build_lars(0.1), 'momentum', 1.0),
    (lambda: optimizers.build_lars(0.1), 'trust_coefficient', -1.0),
    (lambda: optimizers.build_lars(0.1), 'weight_decay', float('inf')),
    (lambda: optimizers.clipped_optimizer(optimizers.build_lamb(0.1), 1.0),
     'beta_1', 1.5),
], ids=['lamb_beta_1', 'lamb_beta_2', 'lamb_epsilon', 'lamb_learning_rate',
        'lars_momentum', 'lars_trust_coefficient', 'lars_weight_decay',
        'clipped_lamb_beta_1'])
def test_set_hparams_refuses_values_the_builder_refuses(builder, name, value):
  # beta_1 = 1 makes the bias correction 1 - beta_1^t zero: NaN weights.
  optimizer = builder()
  state = optimizer.initialize(_specs(_weights()))
  with pytest.raises(ValueError, match=f'`{name}`'):
    optimizer.set_hparams(state, {name: value})
  with pytest.raises(ValueError, match=f'`{name}`'):
    optimizer.set_hparams(state, {name: tf.constant(value, tf.float32)})


@pytest.mark.parametrize('builder, reference', [
    (optimizers.build_lamb, _optax_lamb),
    (optimizers.build_lars, _optax_lars),
], ids=['lamb', 'lars'])
def test_schedule_learning_rate_drives_layerwise_optimizers(builder,
                                                            reference):
  schedule = optimizers.exponential_decay(0.1, 0.5)
  scheduled = tff.learning.optimizers.schedule_learning_rate(
      builder(123.0), schedule)  # The schedule overrides the 123.
  gradients = _gradient_sequence()
  state, trajectory = _run(scheduled, _weights(), gradients)

  # optax calls the schedule with the step count 0, 1, ... as TFF does.
  expected = _optax_trajectory(reference(lambda count: 0.1 * 0.5**count),
                               _weights(), gradients)
  _assert_trajectories_close(trajectory, expected)
  assert float(state['optimizer']['learning_rate']) == pytest.approx(
      0.1 * 0.5**_NUM_STEPS)


def test_exponential_decay_is_initial_times_rate_to_the_k():
  schedule = optimizers.exponential_decay(0.2)
  for k in range(4):
    assert float(schedule(k)) == pytest.approx(0.2 * 0.99**k, rel=1e-6)
    assert float(schedule(tf.constant(k, tf.int32))) == pytest.approx(
        0.2 * 0.99**k, rel=1e-6)


def test_server_sgdm_is_tff_sgdm_and_decays_with_schedule():
  weights = _weights()
  gradients = _gradient_sequence(3)
  _, ours = _run(optimizers.build_server_sgdm(0.5, 0.8), weights, gradients)
  _, tffs = _run(tff.learning.optimizers.build_sgdm(0.5, momentum=0.8),
                 weights, gradients)
  for a, b in zip(ours, tffs):
    tf.nest.map_structure(np.testing.assert_array_equal, a, b)

  decayed = tff.learning.optimizers.schedule_learning_rate(
      optimizers.build_server_sgdm(1.0, 0.8), optimizers.exponential_decay(1.0))
  state, _ = _run(decayed, weights, gradients)
  assert float(state['optimizer']['learning_rate']) == pytest.approx(0.99**3)
  assert float(state['optimizer']['momentum']) == pytest.approx(0.8)


# ----------------------------------------------------------------------------
# Per-step clipping.


def _sgd(learning_rate=0.1):
  return tff.learning.optimizers.build_sgdm(learning_rate)


def _sgdm(learning_rate=0.1):
  return tff.learning.optimizers.build_sgdm(learning_rate, momentum=0.9)


def _adam(learning_rate=0.1):
  return tff.learning.optimizers.build_adam(learning_rate)


def _scaled_gradient_sequence(scales):
  """Gradients whose global norms span tiny to huge."""
  return [
      tf.nest.map_structure(lambda x, s=scale: x * s, gradients)
      for scale, gradients in zip(scales, _gradient_sequence(len(scales)))
  ]


def test_clipped_sgd_step_moves_weights_at_most_learning_rate_times_clip_norm():
  learning_rate, clip_norm = 0.1, 0.5
  scales = [1e-3, 0.1, 1.0, 10.0, 1e6, 1e30]
  optimizer = optimizers.clipped_optimizer(_sgd(learning_rate), clip_norm)
  previous = _weights()
  _, trajectory = _run(optimizer, previous,
                       _scaled_gradient_sequence(scales))
  for scale, weights in zip(scales, trajectory):
    step = [a - b for a, b in zip(_numpy(weights), _numpy(previous))]
    step_norm = _global_norm(step)
    assert step_norm <= learning_rate * clip_norm * (1 + 1e-5)
    if scale >= 10.0:  # Clipped: the step is exactly lr * clip_norm long.
      assert step_norm == pytest.approx(learning_rate * clip_norm, rel=1e-4)
    previous = weights


def test_clipped_optimizer_equals_inner_when_clip_norm_is_huge():
  gradients = _gradient_sequence()
  _, clipped = _run(optimizers.clipped_optimizer(_adam(), 1e30), _weights(),
                    gradients)
  _, plain = _run(_adam(), _weights(), gradients)
  for a, b in zip(clipped, plain):
    tf.nest.map_structure(np.testing.assert_array_equal, a, b)


@pytest.mark.parametrize('inner', [_sgd, _sgdm, _adam],
                         ids=['sgd', 'sgdm', 'adam'])
def test_clipped_optimizer_keeps_weights_finite_on_nan_gradient(inner):
  gradients = _gradient_sequence(3)
  gradients[1]['dense'][0] = tf.fill([3, 2], np.nan)
  gradients[2]['scale'] = tf.constant(np.inf, tf.float32)
  _, trajectory = _run(
      optimizers.clipped_optimizer(inner(), 1.0), _weights(), gradients)
  for weights in trajectory:
    assert all(np.all(np.isfinite(a)) for a in _numpy(weights))


def test_clipped_sgd_skips_the_step_of_a_nan_gradient():
  gradients = _gradient_sequence(2)
  gradients[1]['scale'] = tf.constant(np.nan, tf.float32)
  _, (after_first, after_nan) = _run(
      optimizers.clipped_optimizer(_sgd(), 1.0), _weights(), gradients)
  tf.nest.map_structure(np.testing.assert_array_equal, after_nan, after_first)


@pytest.mark.parametrize('inner', [_sgdm, _adam], ids=['sgdm', 'adam'])
def test_clipped_optimizer_is_inner_optimizer_on_clipped_gradients(inner):
  clip_norm = 0.7
  gradients = _scaled_gradient_sequence([0.1, 3.0, 1.0, 20.0])

  def clip_in_numpy(structure):
    norm = _global_norm(_numpy(structure))
    factor = min(1.0, clip_norm / norm)
    return tf.nest.map_structure(
        lambda x: tf.constant(np.asarray(x, np.float64) * factor, tf.float32),
        structure)

  _, ours = _run(optimizers.clipped_optimizer(inner(), clip_norm), _weights(),
                 gradients)
  _, reference = _run(inner(), _weights(),
                      [clip_in_numpy(g) for g in gradients])
  _assert_trajectories_close(ours, [_numpy(w) for w in reference],
                             atol=_tolerance([_numpy(w) for w in reference]))


def test_clipped_optimizer_state_and_hparams_are_the_inner_ones():
  inner = _adam(0.3)
  clipped = optimizers.clipped_optimizer(inner, 1.0)
  specs = _specs(_weights())
  state = clipped.initialize(specs)
  tf.nest.map_structure(np.testing.assert_array_equal, state,
                        inner.initialize(specs))
  assert clipped.get_hparams(state) == inner.get_hparams(state)

  state = clipped.set_hparams(state, {'learning_rate': 0.0})
  _, new_weights = clipped.next(state, _weights(), _gradient_sequence(1)[0])
  tf.nest.map_structure(np.testing.assert_array_equal, new_weights,
                        _weights())


def test_schedule_learning_rate_works_on_clipped_optimizer():
  scheduled = tff.learning.optimizers.schedule_learning_rate(
      optimizers.clipped_optimizer(_sgd(), 1.0),
      optimizers.exponential_decay(0.1))
  state, _ = _run(scheduled, _weights(), _gradient_sequence(2))
  assert float(state['optimizer']['learning_rate']) == pytest.approx(
      0.1 * 0.99**2)


def test_clipped_optimizer_passes_none_gradients_through():
  weights = [tf.constant([1.0, 1.0]), tf.constant([2.0])]
  optimizer = optimizers.clipped_optimizer(_sgd(1.0), 1.0)
  state = optimizer.initialize(_specs(weights))
  _, new_weights = optimizer.next(state, weights,
                                  [None, tf.constant([10.0])])
  np.testing.assert_array_equal(new_weights[0], [1.0, 1.0])
  # The gradient 10 is clipped to C = 1 and the step is 2 - 1 = 1, except that
  # the clip aims a hair below C so the rounded result never exceeds it
  # (bounding.rounding_margins: 8 u + 2 u + 1e-9 relative, u = 2^-24 for
  # float32), and the float32 result is rounded once more (half an ulp of 1,
  # 2^-24). So 1 <= w <= 1 + 11 * 2^-24 + 1e-9.
  assert 1.0 <= float(new_weights[1][0]) <= 1.0 + 11 * 2.0**-24 + 1e-9


# ----------------------------------------------------------------------------
# Bad arguments fail at build time, naming the argument.


@pytest.mark.parametrize('build, error, name', [
    (lambda: optimizers.clipped_optimizer(_sgd(), 0.0), ValueError,
     'clip_norm'),
    (lambda: optimizers.clipped_optimizer(_sgd(), -1.0), ValueError,
     'clip_norm'),
    (lambda: optimizers.clipped_optimizer(_sgd(), float('nan')), ValueError,
     'clip_norm'),
    (lambda: optimizers.clipped_optimizer(_sgd(), float('inf')), ValueError,
     'clip_norm'),
    (lambda: optimizers.clipped_optimizer(_sgd(), 'big'), TypeError,
     'clip_norm'),
    # Subnormal in float32: TensorFlow flushes it to 0, so a clipped SGD step
    # (lr * 1e-40 long) came out 0 and the weights never moved.
    (lambda: optimizers.clipped_optimizer(_sgd(), 1e-40), ValueError,
     'clip_norm'),
    (lambda: optimizers.clipped_optimizer(tf.keras.optimizers.SGD(), 1.0),
     TypeError, 'inner_optimizer'),
    (lambda: optimizers.clipped_optimizer(None, 1.0), TypeError,
     'inner_optimizer'),
    (lambda: optimizers.build_lamb(-0.1), ValueError, 'learning_rate'),
    (lambda: optimizers.build_lamb(0.1, beta_1=1.0), ValueError, 'beta_1'),
    (lambda: optimizers.build_lamb(0.1, beta_2=-0.1), ValueError, 'beta_2'),
    (lambda: optimizers.build_lamb(0.1, epsilon=0.0), ValueError, 'epsilon'),
    (lambda: optimizers.build_lamb(0.1, weight_decay=-1.0), ValueError,
     'weight_decay'),
    (lambda: optimizers.build_lars(float('nan')), ValueError, 'learning_rate'),
    (lambda: optimizers.build_lars(0.1, momentum=1.0), ValueError,
     'momentum'),
    (lambda: optimizers.build_lars(0.1, weight_decay=-0.1), ValueError,
     'weight_decay'),
    (lambda: optimizers.build_lars(0.1, trust_coefficient=0.0), ValueError,
     'trust_coefficient'),
    (lambda: optimizers.build_lars(0.1, epsilon=-1e-9), ValueError,
     'epsilon'),
    (lambda: optimizers.build_lars(0.1, nesterov='yes'), TypeError,
     'nesterov'),
    (lambda: optimizers.build_server_sgdm(0.1, momentum=1.5), ValueError,
     'momentum'),
    (lambda: optimizers.exponential_decay(-1.0), ValueError,
     'initial_learning_rate'),
    (lambda: optimizers.exponential_decay(0.1, 0.0), ValueError,
     'decay_rate'),
])
def test_bad_arguments_raise_naming_the_argument(build, error, name):
  with pytest.raises(error, match=f'`{name}`'):
    build()


# ----------------------------------------------------------------------------
# End to end: FedAvg with clipped local SGD and a LAMB server.

_NUM_ROUNDS = 2


def _model_fn():
  keras_model = tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(3,)),
      tf.keras.layers.Dense(2),
  ])
  return tff.learning.models.from_keras_model(
      keras_model,
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=(tf.TensorSpec([None, 3], tf.float32),
                  tf.TensorSpec([None], tf.int32)))


def _client_datasets(num_clients=3, num_examples=8):
  rng = np.random.default_rng(1)
  datasets = []
  for client in range(num_clients):
    features = rng.normal(size=[num_examples, 3]).astype(np.float32)
    # One client has wild features: per-step clipping must tame its steps.
    features *= 1e3 if client == 0 else 1.0
    labels = (features[:, 0] > 0).astype(np.int32)
    datasets.append(
        tf.data.Dataset.from_tensor_slices((features, labels)).batch(4))
  return datasets


@pytest.fixture(scope='module')
def fed_avg_run():
  """Builds the TFF process once (tracing is slow) and runs two rounds."""
  process = tff.learning.algorithms.build_weighted_fed_avg(
      _model_fn,
      client_optimizer_fn=optimizers.clipped_optimizer(
          tff.learning.optimizers.build_sgdm(0.1), 1.0),
      server_optimizer_fn=optimizers.build_lamb(0.01))
  state = process.initialize()
  initial_weights = process.get_model_weights(state)
  data = _client_datasets()
  losses = []
  for _ in range(_NUM_ROUNDS):
    output = process.next(state, data)
    state = output.state
    losses.append(output.metrics['client_work']['train']['loss'])
  return state, process.get_model_weights(state), initial_weights, losses


def test_fed_avg_with_clipped_clients_and_lamb_server_trains_finitely(
    fed_avg_run):
  _, weights, initial_weights, losses = fed_avg_run
  assert len(losses) == _NUM_ROUNDS
  assert all(math.isfinite(loss) for loss in losses)
  trainable = [np.asarray(x) for x in weights.trainable]
  assert all(np.all(np.isfinite(x)) for x in trainable)
  assert any(not np.array_equal(a, np.asarray(b))
             for a, b in zip(trainable, initial_weights.trainable))


def test_fed_avg_lamb_server_state_counts_rounds(fed_avg_run):
  state, _, _, _ = fed_avg_run
  assert int(state.finalizer['step']) == _NUM_ROUNDS
  assert float(state.finalizer['learning_rate']) == pytest.approx(0.01)
