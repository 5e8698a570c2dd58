"""Specifications of `tff_clip.learning.algorithms.build_fedavg`.

FAT-Clipping is checked against NumPy re-implementations of its
Algorithms 1-3 with the server rate eta made explicit, written in the paper's
units (Delta = sum of the K local gradients, x_{t+1} = x_t - eta eta_L
mean(Delta~)); model clipping against Zhang et al. 2022's Claim 2.1 (Appendix A.3.1).
Every learning process here is built once per module.
"""

import collections
import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_clip.aggregation import aggregators
from tff_clip.learning import algorithms
import tiny_model  # pylint: disable=g-bad-import-order
from tff_clip.learning import client
from tff_clip.learning import optimizers

CLIENT_LEARNING_RATE = 0.1  # eta_L
SERVER_LEARNING_RATE = 0.5  # eta
CLIP_NORM = 0.5  # lambda, the per-gradient (PI) / per-Delta (PR) bound.
INFINITE_CLIP_NORM = 1e9
BATCH_SIZE = 2
INITIAL_KERNEL = tiny_model.INITIAL_KERNEL
INITIAL_BIAS = tiny_model.INITIAL_BIAS
INPUT_SPEC = tiny_model.INPUT_SPEC


# ----------------------------------------------------------------------------
# Helpers.


_model_fn = tiny_model.model_fn


def _sgd(learning_rate):
  return tff.learning.optimizers.build_sgdm(learning_rate)


def _examples(seed, num_examples):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=[num_examples, 3]).astype(np.float32)
  kernel = rng.normal(scale=3.0, size=[3, 2])  # Heterogeneous clients.
  y = (x @ kernel + 0.1 * rng.normal(size=[num_examples, 2])).astype(
      np.float32)
  return x, y


# Three clients with 4 examples each: equal weights, so the weighted mean is
# the paper's 1/m sum.
CLIENT_EXAMPLES = [_examples(seed, 4) for seed in (20, 21, 22)]


def _datasets(client_examples, batch_size=BATCH_SIZE):
  return [
      tf.data.Dataset.from_tensor_slices(
          collections.OrderedDict(x=x, y=y)).batch(batch_size)
      for x, y in client_examples
  ]


def _batches(x, y, batch_size=BATCH_SIZE):
  return [(x[i:i + batch_size], y[i:i + batch_size])
          for i in range(0, len(x), batch_size)]


def _mse_gradient(weights, x, y):
  kernel, bias = weights
  residual = x @ kernel + bias - y
  d_prediction = 2.0 * residual / residual.size
  return [x.T @ d_prediction, d_prediction.sum(axis=0)]


def _norm(arrays):
  return math.sqrt(sum(float(np.sum(np.square(a))) for a in arrays))


def _clip(arrays, clip_norm):
  if clip_norm is None:
    return arrays
  scale = min(1.0, clip_norm / _norm(arrays))
  return [scale * a for a in arrays]


def _fat_clipping_round(weights, client_batches, per_round=None,
                        per_iteration=None):
  """One round of Yang et al. 2022's Algorithms 1-3, server rate eta explicit.

  Args:
    weights: x_t, [kernel, bias].
    client_batches: for every client, its K batches.
    per_round: lambda of Algorithm 2 line 10 (clip Delta), or None.
    per_iteration: lambda of Algorithm 3 line 7 (clip each gradient), or None.

  Returns:
    (x_{t+1}, the clients' raw Deltas).
  """
  messages, raw = [], []
  for batches in client_batches:
    local = [w.astype(np.float64) for w in weights]
    total = [np.zeros_like(w) for w in local]
    for x, y in batches:
      gradient = _clip(_mse_gradient(local, x, y), per_iteration)
      local = [w - CLIENT_LEARNING_RATE * g for w, g in zip(local, gradient)]
      total = [s + g for s, g in zip(total, gradient)]
    raw.append(total)
    messages.append(_clip(total, per_round))
  new_weights = [
      w - SERVER_LEARNING_RATE * CLIENT_LEARNING_RATE * np.mean(
          [m[i] for m in messages], axis=0)
      for i, w in enumerate(weights)
  ]
  return new_weights, raw


def _initial_weights():
  return [INITIAL_KERNEL.astype(np.float64), INITIAL_BIAS.astype(np.float64)]


def _run(process, datasets, rounds):
  """The trainable weights after each of `rounds` rounds."""
  state = process.initialize()
  trajectory = []
  for _ in range(rounds):
    state = process.next(state, datasets).state
    trajectory.append(
        [np.asarray(w) for w in process.get_model_weights(state).trainable])
  return trajectory


def _build(**kwargs):
  kwargs.setdefault('client_optimizer', _sgd(CLIENT_LEARNING_RATE))
  kwargs.setdefault('server_optimizer', _sgd(SERVER_LEARNING_RATE))
  return algorithms.build_fedavg(_model_fn, **kwargs)


def _assert_weights_close(actual, expected, rtol=1e-5, atol=1e-6):
  for a, e in zip(actual, expected):
    np.testing.assert_allclose(a, e, rtol=rtol, atol=atol)


# ----------------------------------------------------------------------------
# Processes, built once per module.


@pytest.fixture(scope='module')
def plain():
  return _build()


@pytest.fixture(scope='module')
def per_round():
  # FAT-Clipping-PR: clip the model delta eta_L * Delta to eta_L * lambda.
  return _build(
      model_aggregator=aggregators.clip_factory(CLIENT_LEARNING_RATE *
                                                CLIP_NORM))


@pytest.fixture(scope='module')
def per_iteration():
  # FAT-Clipping-PI: clip every local gradient to lambda.
  return _build(local_clip_norm=CLIP_NORM)


# ----------------------------------------------------------------------------
# Plain FedAvg and the infinite clip (Yang et al. 2022, Algorithm 1).


def test_plain_build_fedavg_is_tff_weighted_fed_avg(plain):
  tff_fed_avg = tff.learning.algorithms.build_weighted_fed_avg(
      _model_fn, _sgd(CLIENT_LEARNING_RATE), _sgd(SERVER_LEARNING_RATE))
  datasets = _datasets(CLIENT_EXAMPLES)
  for ours, theirs in zip(_run(plain, datasets, 2),
                          _run(tff_fed_avg, datasets, 2)):
    _assert_weights_close(ours, theirs, rtol=0, atol=0)


def test_plain_fedavg_is_algorithm_1_with_two_learning_rates(plain):
  [weights] = _run(plain, _datasets(CLIENT_EXAMPLES), 1)
  expected, _ = _fat_clipping_round(
      _initial_weights(), [_batches(x, y) for x, y in CLIENT_EXAMPLES])
  _assert_weights_close(weights, expected)


@pytest.mark.parametrize('clipping', ['per_round', 'per_iteration'])
def test_infinite_clip_norm_is_plain_fedavg(plain, clipping):
  # lambda = inf is `None` (no clipping, the plain process itself); an
  # effectively infinite finite norm must give the same numbers too.
  if clipping == 'per_round':
    process = _build(
        model_aggregator=aggregators.clip_factory(INFINITE_CLIP_NORM))
  else:
    process = _build(local_clip_norm=INFINITE_CLIP_NORM)
  datasets = _datasets(CLIENT_EXAMPLES)
  for ours, theirs in zip(_run(process, datasets, 2), _run(plain, datasets,
                                                           2)):
    _assert_weights_close(ours, theirs, rtol=0, atol=0)


# ----------------------------------------------------------------------------
# FAT-Clipping-PR and -PI (Yang et al. 2022, Algorithms 2 and 3).


def test_per_round_clipping_is_algorithm_2_with_the_server_rate(per_round):
  [weights] = _run(per_round, _datasets(CLIENT_EXAMPLES), 1)
  expected, raw = _fat_clipping_round(
      _initial_weights(), [_batches(x, y) for x, y in CLIENT_EXAMPLES],
      per_round=CLIP_NORM)
  assert max(_norm(delta) for delta in raw) > CLIP_NORM  # Clipping acted.
  _assert_weights_close(weights, expected)


def test_per_iteration_clipping_is_algorithm_3_with_the_server_rate(
    per_iteration):
  [weights] = _run(per_iteration, _datasets(CLIENT_EXAMPLES), 1)
  expected, _ = _fat_clipping_round(
      _initial_weights(), [_batches(x, y) for x, y in CLIENT_EXAMPLES],
      per_iteration=CLIP_NORM)
  plain_expected, _ = _fat_clipping_round(
      _initial_weights(), [_batches(x, y) for x, y in CLIENT_EXAMPLES])
  assert _norm([e - p for e, p in zip(expected, plain_expected)]) > 1e-3
  _assert_weights_close(weights, expected)


def test_with_one_local_step_per_round_equals_per_iteration(
    plain, per_round, per_iteration):
  datasets = _datasets(CLIENT_EXAMPLES, batch_size=4)  # K = 1.
  pr = _run(per_round, datasets, 2)
  pi = _run(per_iteration, datasets, 2)
  for a, b in zip(pr, pi):
    _assert_weights_close(a, b)
  # And the clip did act: neither is plain FedAvg.
  unclipped = _run(plain, datasets, 1)[0]
  assert _norm([a - b for a, b in zip(pr[0], unclipped)]) > 1e-3


def test_every_per_round_message_is_within_the_clip_norm(per_round, plain):
  bound = CLIENT_LEARNING_RATE * CLIP_NORM  # eta_L * lambda, TFF's units.
  initial = _initial_weights()
  unclipped_norms = []
  for dataset in _datasets(CLIENT_EXAMPLES):
    # One client alone: the server step is eta times its message.
    [weights] = _run(per_round, [dataset], 1)
    message = [(w0 - w) / SERVER_LEARNING_RATE
               for w0, w in zip(initial, weights)]
    assert _norm(message) <= bound * (1 + 1e-5)
    [raw] = _run(plain, [dataset], 1)
    unclipped_norms.append(
        _norm([(w0 - w) / SERVER_LEARNING_RATE
               for w0, w in zip(initial, raw)]))
  assert max(unclipped_norms) > bound  # Some message was clipped.


@pytest.fixture(scope='module')
def per_iteration_client_work():
  return client.build_client_work(
      _model_fn,
      optimizers.clipped_optimizer(_sgd(CLIENT_LEARNING_RATE), CLIP_NORM))


def test_every_per_iteration_step_moves_the_model_at_most_eta_l_lambda(
    per_iteration_client_work):
  x, y = _examples(seed=30, num_examples=8)  # K = 4 local steps.
  batches = _batches(x, y)
  # Client k trains on the first k batches: the difference of consecutive
  # updates is the k-th local step.
  prefixes = [
      tf.data.Dataset.from_tensor_slices(
          collections.OrderedDict(x=x[:BATCH_SIZE * k],
                                  y=y[:BATCH_SIZE * k])).batch(BATCH_SIZE)
      for k in range(1, len(batches) + 1)
  ]
  initial = tff.learning.models.ModelWeights(
      trainable=[INITIAL_KERNEL, INITIAL_BIAS], non_trainable=[])
  output = per_iteration_client_work.next(
      per_iteration_client_work.initialize(), [initial] * len(prefixes),
      prefixes)
  updates = [[np.zeros_like(INITIAL_KERNEL), np.zeros_like(INITIAL_BIAS)]]
  updates += [[np.asarray(u) for u in r.update] for r in output.result]
  steps = [
      _norm([b - a for a, b in zip(before, after)])
      for before, after in zip(updates[:-1], updates[1:])
  ]
  bound = CLIENT_LEARNING_RATE * CLIP_NORM
  assert max(steps) <= bound * (1 + 1e-5)
  # The gradients were longer than lambda, so the steps are at the bound.
  assert _norm(_mse_gradient(_initial_weights(), *batches[0])) > CLIP_NORM
  np.testing.assert_allclose(steps[0], bound, rtol=1e-5)


# ----------------------------------------------------------------------------
# Aggregators: weighted and unweighted factories.


def test_unweighted_aggregator_gives_every_client_the_same_weight():
  process = _build(model_aggregator=tff.aggregators.UnweightedMeanFactory())
  client_examples = [_examples(40, 2), _examples(41, 6)]  # Unequal sizes.
  [weights] = _run(process, _datasets(client_examples), 1)
  expected, _ = _fat_clipping_round(
      _initial_weights(), [_batches(x, y) for x, y in client_examples])
  _assert_weights_close(weights, expected)


# ----------------------------------------------------------------------------
# Every client algorithm runs in a learning process.

BLUR_CLIP_NORM = 0.3
ALGORITHMS = {
    'blur': dict(blur_strength=2.0, blur_clip_norm=BLUR_CLIP_NORM,
                 model_aggregator=aggregators.clip_factory(BLUR_CLIP_NORM)),
    'lus': dict(lus_sparsity=0.5,
                model_aggregator=aggregators.per_layer_clip_factory(1.0)),
    'blur_lus_pi_dp_lamb': dict(
        blur_strength=2.0, blur_clip_norm=BLUR_CLIP_NORM, lus_sparsity=0.5,
        local_clip_norm=1.0,
        model_aggregator=(
            tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
                noise_multiplier=0.01, clients_per_round=3.0,
                clip=BLUR_CLIP_NORM)),
        server_optimizer=optimizers.build_lamb(0.05)),
}


@pytest.fixture(scope='module', params=list(ALGORITHMS))
def trained(request):
  process = _build(**ALGORITHMS[request.param])
  state = process.initialize()
  losses = []
  for _ in range(3):
    output = process.next(state, _datasets(CLIENT_EXAMPLES))
    state = output.state
    losses.append(float(output.metrics['client_work']['train']['loss']))
  weights = [np.asarray(w) for w in process.get_model_weights(state).trainable]
  return request.param, process, weights, losses


def test_each_client_algorithm_trains_in_a_learning_process(trained):
  name, process, weights, losses = trained
  assert isinstance(process, tff.learning.templates.LearningProcess)
  assert all(np.all(np.isfinite(w)) for w in weights)
  assert _norm([w - w0 for w, w0 in zip(weights, _initial_weights())]) > 0
  assert losses[-1] < losses[0], name


# ----------------------------------------------------------------------------
# Model clipping: Zhang et al. 2022, Claim 2.1 (Appendix A.3.1), a negative example.
#
# f(x) = sum_i (x - b_i)^2 with b = (-c/2, -c/2, k c), k = 5 > 4, c = 1: the
# optimum is x* = (k - 1) c / 3 = 4/3 > c. With Q local SGD steps of rate
# eta_l on (x - b_i)^2 (gradient 2 (x - b_i)), a client returns
# l x + (1 - l) b_i, l = (1 - 2 eta_l)^Q, and model clipping iterates Eq. (19),
# x+ = mean_i clip(l x + (1 - l) b_i, c), whose fixed point is
# l c / (3 - 2 l) <= c != x*.

QUADRATIC_CLIP = 1.0
QUADRATIC_TARGETS = (-0.5, -0.5, 5.0)
QUADRATIC_STEPS = 3
QUADRATIC_LEARNING_RATE = 0.1
QUADRATIC_ROUNDS = 30
CONTRACTION = (1 - 2 * QUADRATIC_LEARNING_RATE)**QUADRATIC_STEPS  # l


def _scalar_model_fn():
  keras_model = tf.keras.Sequential([
      tf.keras.layers.Dense(1, input_shape=(1,), use_bias=False,
                            kernel_initializer='zeros')
  ])
  return tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.MeanSquaredError(),
      input_spec=collections.OrderedDict(
          x=tf.TensorSpec([None, 1], tf.float32),
          y=tf.TensorSpec([None, 1], tf.float32)))


def _quadratic_datasets():
  return [
      tf.data.Dataset.from_tensor_slices(
          collections.OrderedDict(
              x=np.ones([QUADRATIC_STEPS, 1], np.float32),
              y=np.full([QUADRATIC_STEPS, 1], target, np.float32))).batch(1)
      for target in QUADRATIC_TARGETS
  ]


@pytest.fixture(scope='module')
def quadratic_trajectories():
  trajectories = {}
  for name, kwargs in (('model_clipping',
                        dict(model_clip_norm=QUADRATIC_CLIP)), ('fedavg', {})):
    process = algorithms.build_fedavg(
        _scalar_model_fn,
        client_optimizer=_sgd(QUADRATIC_LEARNING_RATE),
        server_optimizer=_sgd(1.0),  # The server averages the models.
        **kwargs)
    trajectories[name] = [
        float(w[0].squeeze())
        for w in _run(process, _quadratic_datasets(), QUADRATIC_ROUNDS)
    ]
  return trajectories


def test_model_clipping_averages_the_clipped_local_models(
    quadratic_trajectories):
  x, expected = 0.0, []
  for _ in range(5):  # Eq. (19).
    local = [CONTRACTION * x + (1 - CONTRACTION) * b
             for b in QUADRATIC_TARGETS]
    x = float(np.mean([np.clip(v, -QUADRATIC_CLIP, QUADRATIC_CLIP)
                       for v in local]))
    expected.append(x)
  np.testing.assert_allclose(quadratic_trajectories['model_clipping'][:5],
                             expected, rtol=1e-5)


def test_model_clipping_does_not_converge_to_the_optimum(
    quadratic_trajectories):
  optimum = (QUADRATIC_TARGETS[2] / QUADRATIC_CLIP - 1) * QUADRATIC_CLIP / 3
  fixed_point = CONTRACTION * QUADRATIC_CLIP / (3 - 2 * CONTRACTION)
  final = quadratic_trajectories['model_clipping'][-1]
  np.testing.assert_allclose(final, fixed_point, rtol=1e-4)
  assert abs(final - optimum) > 1.0


def test_fedavg_on_the_same_problem_converges_to_the_optimum(
    quadratic_trajectories):
  optimum = float(np.mean(QUADRATIC_TARGETS))  # = (k - 1) c / 3.
  np.testing.assert_allclose(quadratic_trajectories['fedavg'][-1], optimum,
                             rtol=1e-4)


# ----------------------------------------------------------------------------
# Bad input: clear errors at build time, naming the argument.


def _untraceable_model_fn():
  raise AssertionError('model_fn was called: the check came too late.')


@pytest.mark.parametrize('kwargs, error, name', [
    (dict(client_optimizer=tf.keras.optimizers.SGD(0.1)), TypeError,
     'client_optimizer'),
    (dict(client_optimizer=lambda: _sgd(0.1)), TypeError, 'client_optimizer'),
    (dict(server_optimizer='sgd'), TypeError, 'server_optimizer'),
    (dict(local_clip_norm=0.0), ValueError, 'local_clip_norm'),
    (dict(local_clip_norm=-1.0), ValueError, 'local_clip_norm'),
    (dict(local_clip_norm=math.inf), ValueError, 'local_clip_norm'),
    (dict(local_clip_norm='1'), TypeError, 'local_clip_norm'),
    # Subnormal in float32, flushed to 0 by TensorFlow: every step clipped
    # to nothing, the model never trained.
    (dict(local_clip_norm=1e-40), ValueError, 'local_clip_norm'),
    (dict(model_clip_norm=1e-40), ValueError, 'model_clip_norm'),
    (dict(blur_strength=1.0, blur_clip_norm=1e-40), ValueError,
     'blur_clip_norm'),
    (dict(blur_strength=10.0, blur_clip_norm=1.0), ValueError,
     'blur_strength'),  # lambda >= 1 / eta_L = 10.
    (dict(blur_strength=20.0, blur_clip_norm=1.0, local_clip_norm=1.0),
     ValueError, 'blur_strength'),  # Read through the clipped optimizer.
    (dict(blur_strength=1.0), ValueError, 'blur_clip_norm'),
    (dict(lus_sparsity=1.0), ValueError, 'lus_sparsity'),
    (dict(lus_sparsity=-0.1), ValueError, 'lus_sparsity'),
    (dict(model_clip_norm=0.0), ValueError, 'model_clip_norm'),
    (dict(model_clip_norm=1.0, blur_strength=1.0, blur_clip_norm=1.0),
     ValueError, 'model_clip_norm'),
    (dict(model_aggregator='mean'), TypeError, 'model_aggregator'),
    (dict(model_aggregator=tff.aggregators.UnweightedMeanFactory(),
          client_weighting=tff.learning.ClientWeighting.NUM_EXAMPLES),
     ValueError, 'client_weighting'),
    (dict(client_weighting='uniform'), TypeError, 'client_weighting'),
])
def test_bad_input_is_rejected_at_build_time_by_name(kwargs, error, name):
  with pytest.raises(error, match=name):
    _build_untraced(**kwargs)


def _build_untraced(**kwargs):
  kwargs.setdefault('client_optimizer', _sgd(CLIENT_LEARNING_RATE))
  kwargs.setdefault('server_optimizer', _sgd(SERVER_LEARNING_RATE))
  return algorithms.build_fedavg(_untraceable_model_fn, **kwargs)


def test_model_fn_must_be_callable():
  with pytest.raises(TypeError, match='model_fn'):
    algorithms.build_fedavg(
        'a model', client_optimizer=_sgd(0.1), server_optimizer=_sgd(1.0))
