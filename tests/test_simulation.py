"""Specification of the in-process executor (`tff_clip.runtime.simulation`).

The oracle is TFF's own C++ runtime (`tff_clip.runtime.execution.
set_local_cpp_context`, set for the session by conftest): the same process,
the same client data and the same noise seeds (`dp.dp_factory(...,
noise_seed=N)`) run a few rounds on both, and every leaf of the state and of
the metrics must agree to float32 tolerance (the two runtimes add the
clients' updates in different orders). One process per family the project
builds; the expensive ones are marked slow.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_clip.aggregation import aggregators
from tff_clip.aggregation import dp
from tff_clip.learning import algorithms
from tff_clip.learning import optimizers
from tff_clip.privacy import audit
from tff_clip.runtime import simulation
import tasks  # pylint: disable=g-bad-import-order
import tiny_model  # pylint: disable=g-bad-import-order

ROUNDS = 3
RTOL, ATOL = 1e-5, 1e-6


def _sgd(learning_rate):
  return tff.learning.optimizers.build_sgdm(learning_rate)


def _fedavg(**kwargs):
  kwargs.setdefault('client_optimizer', _sgd(0.1))
  kwargs.setdefault('server_optimizer', _sgd(1.0))
  return algorithms.build_fedavg(tiny_model.model_fn, **kwargs)


def _assert_same(actual, expected, what):
  actual_leaves = tf.nest.flatten(actual)
  expected_leaves = tf.nest.flatten(expected)
  assert len(actual_leaves) == len(expected_leaves), what
  for i, (a, e) in enumerate(zip(actual_leaves, expected_leaves)):
    a, e = np.asarray(a), np.asarray(e)
    if a.dtype.kind == 'f':
      np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL,
                                 err_msg=f'{what}, leaf {i}')
    else:
      np.testing.assert_array_equal(a, e, err_msg=f'{what}, leaf {i}')


def _assert_equivalent(process, rounds=ROUNDS, sizes=(5, 3, 7)):
  runner = simulation.InProcessRunner(process)
  state_cpp = process.initialize()
  state_inp = runner.initialize()
  assert type(state_inp) is type(state_cpp)  # pylint: disable=unidiomatic-typecheck
  _assert_same(state_inp, state_cpp, 'initial state')
  for round_num in range(1, rounds + 1):
    data = tiny_model.client_datasets(round_num, sizes)
    out_cpp = process.next(state_cpp, data)
    out_inp = runner.next(state_inp, data)
    assert type(out_inp) is type(out_cpp)  # pylint: disable=unidiomatic-typecheck
    _assert_same(out_inp.metrics, out_cpp.metrics, f'round {round_num} metrics')
    _assert_same(out_inp.state, out_cpp.state, f'round {round_num} state')
    state_cpp, state_inp = out_cpp.state, out_inp.state
  _assert_same(runner.get_model_weights(state_inp),
               process.get_model_weights(state_cpp), 'model weights')
  return runner, state_inp


# ----------------------------------------------------------------------------
# Equivalence with TFF's C++ runtime, one process per family.


@pytest.fixture(scope='module')
def dp_adaptive_process():
  # Per-layer clipping, adaptive per-layer quantiles, seeded noise: the
  # heaviest aggregator the project builds.
  return _fedavg(model_aggregator=dp.dp_factory(
        'per_layer_clip', noise_multiplier=0.05, clients_per_round=3.0, clip_norm='adaptive', noise_seed=7))


def test_dp_per_layer_adaptive_matches_cpp_runtime(dp_adaptive_process):
  _assert_equivalent(dp_adaptive_process)


def test_audited_process_matches_cpp_runtime():
  # The canary query draws and compares 2K candidates in while loops inside
  # `update`; the in-process importer runs them as TFF's runtime does.
  factory = audit.CanaryFactory(
      dp.dp_factory('clip', noise_multiplier=0.5, clients_per_round=3.0,
                    clip_norm=0.5, noise_seed=3), num_canaries=3,
      sampling_probability=0.5, seed=4)
  _assert_equivalent(_fedavg(model_aggregator=factory), rounds=2)


def test_round_with_no_clients_matches_cpp_runtime(dp_adaptive_process):
  # An empty Poisson cohort: the aggregate of nobody, then the server update
  # with its noise. TFF's C++ runtime accepts an empty client list too.
  _assert_equivalent(dp_adaptive_process, rounds=2, sizes=())


def test_client_threads_give_the_same_round_bit_for_bit(dp_adaptive_process):
  # Clients of very different sizes finish out of order on 3 threads, more
  # than twice as many clients as threads are in flight, one is empty: the
  # updates are still summed in the order given, so the state and metrics
  # equal those of one thread (itself checked against TFF's C++ runtime).
  sizes = (9, 1, 0, 7, 2, 12, 3, 1, 5, 8)
  one, three = (simulation.InProcessRunner(dp_adaptive_process,
                                           client_threads=n) for n in (1, 3))
  state = one.initialize()
  for round_num in (1, 2):
    data = tiny_model.client_datasets(round_num, sizes)
    expected = one.next(state, data)
    actual = three.next(state, data)
    for what in ('state', 'metrics'):
      for i, (a, e) in enumerate(zip(tf.nest.flatten(getattr(actual, what)),
                                     tf.nest.flatten(getattr(expected, what)))):
        np.testing.assert_array_equal(a, e, err_msg=f'{what} leaf {i}')
    state = expected.state


def test_a_failing_client_fails_the_round_and_the_next_round_runs(
    dp_adaptive_process):
  runner = simulation.InProcessRunner(dp_adaptive_process, client_threads=2)
  state = runner.initialize()
  data = tiny_model.client_datasets(1, (3, 4, 5, 6))
  wrong = tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(x=np.zeros([4, 5], np.float32),
                              y=np.zeros([4, 2], np.float32))).batch(2)
  with pytest.raises(Exception):
    runner.next(state, data[:2] + [wrong] + data[2:])
  expected = simulation.InProcessRunner(dp_adaptive_process,
                                        client_threads=1).next(state, data)
  _assert_same(runner.next(state, data).state, expected.state, 'after error')


@pytest.mark.parametrize('value', [0, -1, 1.5, True, '2'])
def test_client_threads_must_be_a_positive_int(dp_adaptive_process, value):
  with pytest.raises((TypeError, ValueError), match='client_threads'):
    simulation.InProcessRunner(dp_adaptive_process, client_threads=value)


def test_unseeded_noise_is_fresh_per_initialization_and_round():
  # The noise is a function of the secret key in the state and the round
  # (so a resumed run continues it): a new initialization draws a new key,
  # and each round a new draw.
  process = _fedavg(model_aggregator=dp.dp_factory(
      'clip', noise_multiplier=1.0, clients_per_round=3.0, clip_norm=1.0))
  runner = simulation.InProcessRunner(process)
  data = tiny_model.client_datasets(1)
  state = runner.initialize()
  first = runner.next(state, data).state
  other_key = runner.next(runner.initialize(), data).state
  second = runner.next(first, data).state
  weights = lambda s: runner.get_model_weights(s).trainable[0]
  assert not np.allclose(weights(first), weights(other_key))
  step_1 = weights(first) - runner.get_model_weights(state).trainable[0]
  step_2 = weights(second) - weights(first)
  assert not np.allclose(step_1, step_2)


def test_set_model_weights_matches_cpp_runtime(dp_adaptive_process):
  runner = simulation.InProcessRunner(dp_adaptive_process)
  weights = tff.learning.models.ModelWeights(
      trainable=[np.full([3, 2], 0.25, np.float32),
                 np.array([1.0, -1.0], np.float32)],
      non_trainable=[])
  expected = dp_adaptive_process.set_model_weights(
      dp_adaptive_process.initialize(), weights)
  actual = runner.set_model_weights(runner.initialize(), weights)
  _assert_same(actual, expected, 'state')
  _assert_same(runner.get_model_weights(actual), weights, 'weights')


def test_evaluation_process_matches_cpp_runtime():
  evaluation = tff.learning.algorithms.build_fed_eval(tiny_model.model_fn)
  runner = simulation.InProcessRunner(evaluation)
  data = tiny_model.client_datasets(1)
  expected = evaluation.next(evaluation.initialize(), data).metrics
  actual = runner.next(runner.initialize(), data).metrics
  _assert_same(actual, expected, 'evaluation metrics')


@pytest.mark.slow
@pytest.mark.parametrize('name, kwargs', [
    ('fedavg', {}),
    ('PR clipping', dict(model_aggregator=aggregators.clip_factory(0.3))),
    ('PI clipping', dict(local_clip_norm=0.5)),
    ('BLUR + LUS', dict(blur_strength=1.0, blur_clip_norm=0.5,
                        lus_sparsity=0.5,
                        model_aggregator=aggregators.clip_factory(0.5))),
    ('LAMB server', dict(server_optimizer=optimizers.build_lamb(0.1))),
    ('LARS server', dict(server_optimizer=optimizers.build_lars(0.1))),
    ('normalize, adaptive, no DP', dict(
        model_aggregator=aggregators.normalize_factory(
            tff.aggregators.PrivateQuantileEstimationProcess.no_noise(
                initial_estimate=0.1, target_quantile=0.5,
                learning_rate=0.2, multiplier=1.0, increment=0.0,
                secure_estimation=False)))),
    # Client-placed noise is never seeded (`dp._gaussian_like`): z = 0 here;
    # its freshness per call is `test_tf_graphs`' random-ops test.
    ('DP clip fixed, client placement', dict(model_aggregator=dp.dp_factory(
        'clip', noise_multiplier=0.0, clients_per_round=3.0, clip_norm=0.5, noise_placement='client',
        noise_seed=2))),
    ('DP per-layer normalize, actual count', dict(
        model_aggregator=dp.dp_factory(
        'per_layer_normalize', noise_multiplier=0.5, clients_per_round=3.0, clip_norm=0.5,
            denominator='actual', noise_seed=5))),
])
def test_family_matches_cpp_runtime(name, kwargs):
  del name
  _assert_equivalent(_fedavg(**kwargs))


# ----------------------------------------------------------------------------
# Reproducibility: `next` is a function of the state, the data and the seeds.

REPEATS = 20


@pytest.fixture(scope='module')
def digits_clients():
  # A real task's client pipeline (the digits task: TFF's EMNIST
  # preprocessing, whose batches pass through a parallel map), two examples
  # a batch so that each client has a dozen batches whose order matters; a
  # 64-2-10 MLP keeps it fast. No client shuffle: the same dataset objects
  # are iterated on every call.
  task = tasks.get_task('digits', seed=1, train_batch_size=2,
                        shuffle_buffer_size=1, hidden_units=2)
  data = task.datasets.train_data
  clients = [task.datasets.train_preprocess_fn(
      data.create_tf_dataset_for_client(c)) for c in data.client_ids[:4]]
  return task, clients


# Without noise in the slow suite: the seeded-noise case runs the same client
# work and fails too if the client work is not reproducible.
@pytest.mark.parametrize('noise_seed', [
    pytest.param(None, marks=pytest.mark.slow), 3],
                         ids=['no noise', 'seeded noise'])
def test_next_from_the_same_state_gives_bitwise_identical_results(
    digits_clients, noise_seed):
  task, clients = digits_clients
  model_aggregator = None if noise_seed is None else dp.dp_factory(
      'clip', noise_multiplier=0.5, clients_per_round=len(clients),
      clip_norm='adaptive', noise_seed=noise_seed)
  runner = simulation.InProcessRunner(algorithms.build_fedavg(
      task.model_fn, client_optimizer=_sgd(0.5), server_optimizer=_sgd(1.0),
      model_aggregator=model_aggregator))
  state = runner.initialize()
  first = runner.next(state, clients)
  assert not np.array_equal(runner.get_model_weights(first.state).trainable[0],
                            runner.get_model_weights(state).trainable[0])
  for repeat in range(REPEATS):
    again = runner.next(state, clients)
    for what in ('state', 'metrics'):
      for i, (a, b) in enumerate(zip(
          tf.nest.flatten(getattr(again, what)),
          tf.nest.flatten(getattr(first, what)))):
        np.testing.assert_array_equal(
            a, b, err_msg=f'repeat {repeat}, {what} leaf {i}')


# ----------------------------------------------------------------------------
# Every factory and builder compiles to a MapReduceForm.


def _compiles(factory):
  simulation.map_reduce_form(_fedavg(model_aggregator=factory))


@pytest.mark.slow
@pytest.mark.parametrize('bounding_method', aggregators.BOUNDINGS)
@pytest.mark.parametrize('adaptive', [False, True])
def test_every_bounding_factory_compiles_to_map_reduce_form(
    bounding_method, adaptive):
  clip_norm = (tff.aggregators.PrivateQuantileEstimationProcess.no_noise(
      initial_estimate=0.1, target_quantile=0.5, learning_rate=0.2,
      multiplier=1.0, increment=0.0, secure_estimation=False)
               if adaptive else 0.5)
  _compiles(aggregators.bounding_factory(bounding_method, clip_norm))


@pytest.mark.slow
@pytest.mark.parametrize('bounding_method', aggregators.BOUNDINGS)
@pytest.mark.parametrize('clip_norm', [0.5, 'adaptive'])
@pytest.mark.parametrize('noise_placement', dp.NOISE_PLACEMENTS)
def test_every_dp_factory_compiles_to_map_reduce_form(
    bounding_method, clip_norm, noise_placement):
  _compiles(dp.dp_factory(
        bounding_method, noise_multiplier=0.05, clients_per_round=3.0, clip_norm=clip_norm,
                          noise_placement=noise_placement))


def test_a_process_without_map_reduce_form_names_the_executor_to_use():
  process = tiny_model.two_rounds_process(np.float32(0.0), np.float32)
  with pytest.raises(ValueError, match='--executor=local'):
    simulation.InProcessRunner(process)
