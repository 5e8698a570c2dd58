"""Specification of the batched client work (`tff_clip.runtime.batched_clients`).

The oracles are the per-client path (`simulation.InProcessRunner`, itself
pinned to TFF's C++ runtime by tests/test_simulation.py) and TFF's C++
runtime itself (the conftest's context): the same process, the same
clients' batches (`client_data.ClientDatasets`, the same seeds) and the same
noise seed run rounds on both, and every leaf of the state and of the
metrics must agree to float32 tolerance (the batched path sums the clients
in another order). The noise key lives in the state, so the DP rounds agree
only if the noise is drawn once, on the server, from the same key.
"""

import collections
import copy
import types

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_clip.aggregation import dp
from tff_clip.learning import algorithms
from tff_clip.program import tff_tree
from tff_clip.runtime import batched_clients
from tff_clip.runtime import client_data
from tff_clip.runtime import simulation
from tasks import task as task_lib
import tiny_model  # pylint: disable=g-bad-import-order

RTOL, ATOL = 1e-5, 1e-6
# Clients of unequal sizes (odd ones leave a short last batch), one empty.
SIZES = (5, 3, 7, 0, 11, 2)
_UNIFORM = tff.learning.ClientWeighting.UNIFORM
_BY_EXAMPLES = tff.learning.ClientWeighting.NUM_EXAMPLES


def _sgd(learning_rate):
  return tff.learning.optimizers.build_sgdm(learning_rate)


def _task(x, y, batch_size=2, sizes=SIZES):
  indices, start = [], 0
  for n in sizes:
    indices.append(np.arange(start, start + n))
    start += n
  data = task_lib.client_data_from_arrays(
      collections.OrderedDict(x=x[:start], y=y[:start]), indices)
  spec = tff.simulation.baselines.ClientSpec(
      num_epochs=1, batch_size=batch_size, shuffle_buffer_size=1)
  preprocess = client_data.ExamplewisePreprocess(lambda e: e, spec)
  return types.SimpleNamespace(datasets=types.SimpleNamespace(
      train_data=data, train_preprocess_fn=preprocess))


def _regression_task():
  rng = np.random.default_rng(0)
  x = rng.normal(size=[sum(SIZES), 3]).astype(np.float32)
  y = (x @ rng.normal(scale=2.0, size=[3, 2])).astype(np.float32)
  return _task(x, y)


def _mlp_model_fn():
  """Flatten, Dense-relu, Dense-softmax; cross-entropy and accuracy."""
  def keras_model():
    tf.keras.utils.set_random_seed(1)
    return tf.keras.Sequential([
        tf.keras.layers.Flatten(input_shape=(2, 2)),
        tf.keras.layers.Dense(5, activation='relu'),
        tf.keras.layers.Dense(3, activation='softmax'),
    ])
  spec = collections.OrderedDict(x=tf.TensorSpec([None, 2, 2], tf.float32),
                                 y=tf.TensorSpec([None], tf.int32))
  return task_lib.classification_model_fn(keras_model, spec)


def _classification_task():
  rng = np.random.default_rng(1)
  x = rng.normal(size=[sum(SIZES), 2, 2]).astype(np.float32)
  y = rng.integers(0, 3, size=[sum(SIZES)]).astype(np.int32)
  return _task(x, y, batch_size=3)


def _conv_model_fn():
  """Conv2D (same, relu), max pooling, Conv2D (valid), global average
  pooling, Dense-softmax."""
  def keras_model():
    tf.keras.utils.set_random_seed(2)
    return tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(6, 6, 2)),
        tf.keras.layers.Conv2D(3, 3, padding='same', activation='relu'),
        tf.keras.layers.MaxPooling2D(2),
        tf.keras.layers.Conv2D(4, 2, strides=1, padding='valid'),
        tf.keras.layers.GlobalAveragePooling2D(),
        tf.keras.layers.Dense(3, activation='softmax'),
    ])
  spec = collections.OrderedDict(x=tf.TensorSpec([None, 6, 6, 2], tf.float32),
                                 y=tf.TensorSpec([None], tf.int32))
  return task_lib.classification_model_fn(keras_model, spec)


def _conv_task():
  rng = np.random.default_rng(2)
  x = rng.normal(size=[sum(SIZES), 6, 6, 2]).astype(np.float32)
  y = rng.integers(0, 3, size=[sum(SIZES)]).astype(np.int32)
  return _task(x, y, batch_size=3)


def _embedding_model_fn():
  """Embedding, a Dense layer on every token (rank 4), Conv1D, Flatten,
  Dense-softmax."""
  def keras_model():
    tf.keras.utils.set_random_seed(3)
    return tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(5,), dtype=tf.int32),
        tf.keras.layers.Embedding(7, 4),
        tf.keras.layers.Dense(3, activation='tanh'),
        tf.keras.layers.Conv1D(2, 2, padding='same'),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(3, activation='softmax'),
    ])
  spec = collections.OrderedDict(x=tf.TensorSpec([None, 5], tf.int32),
                                 y=tf.TensorSpec([None], tf.int32))
  return task_lib.classification_model_fn(keras_model, spec)


def _embedding_task():
  rng = np.random.default_rng(3)
  # Ids 0-6; id 6 in no client's data (its row's gradient is zero).
  x = rng.integers(0, 6, size=[sum(SIZES), 5]).astype(np.int32)
  y = rng.integers(0, 3, size=[sum(SIZES)]).astype(np.int32)
  return _task(x, y, batch_size=3)


_LAYER_MODELS = {'conv': (_conv_model_fn, _conv_task),
                 'embedding': (_embedding_model_fn, _embedding_task)}


def _assert_same(actual, expected, what):
  actual_leaves, expected_leaves = (tf.nest.flatten(t)
                                    for t in (actual, expected))
  assert len(actual_leaves) == len(expected_leaves), what
  for i, (a, e) in enumerate(zip(actual_leaves, expected_leaves)):
    a, e = np.asarray(a), np.asarray(e)
    if a.dtype.kind == 'f':
      np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL,
                                 err_msg=f'{what}, leaf {i}')
    else:
      np.testing.assert_array_equal(a, e, err_msg=f'{what}, leaf {i}')


# How the batched path computes the cohort's DP records: as tensor ops over
# the client axis (`dp_queries.summed_records`, the default where the query
# has them), client by client in a loop, or all at once (`vectorized_map`).
_RECORDS = {'batched': {}, 'looped': dict(batched_records=False),
            'vectorized': dict(batched_records=False, vectorized_records=True)}


def _assert_batched_equals_per_client(model_fn, task, aggregator, weighting,
                                      rounds=2, cpp=False, records='batched',
                                      cohorts=None, metrics=True):
  """`cohorts`: each round's cohort (default: every client, `rounds`
  rounds); `metrics`: whether the training metrics are compared too."""
  process = algorithms.build_fedavg(
      model_fn, client_optimizer=_sgd(0.1), server_optimizer=_sgd(1.0),
      model_aggregator=aggregator, client_weighting=weighting)
  runner = simulation.InProcessRunner(process, client_threads=1)
  batched = batched_clients.BatchedRunner(
      runner, model_fn, aggregator,
      client_weighting=weighting or _BY_EXAMPLES, **_RECORDS[records])
  clients = client_data.ClientDatasets(task, seed=3, batched=True)
  assert clients.can_batch
  if cohorts is None:
    cohorts = [list(task.datasets.train_data.client_ids)] * rounds
  state_per_client = state_batched = state_cpp = runner.initialize()
  if cpp:
    state_cpp = process.initialize()
  for round_num, cohort in enumerate(cohorts, 1):
    cohort_data = clients.datasets(cohort, round_num)
    assert hasattr(cohort_data, 'cohort_batches')
    expected = runner.next(state_per_client, list(cohort_data))
    actual = batched.next(state_batched,
                          clients.datasets(cohort, round_num))
    if metrics:
      _assert_same(actual.metrics, expected.metrics, f'round {round_num}')
    _assert_same(actual.state, expected.state, f'round {round_num}')
    if cpp:
      out_cpp = process.next(state_cpp, clients.datasets(cohort, round_num)
                             ._built())  # pylint: disable=protected-access
      _assert_same(actual.metrics, out_cpp.metrics, f'round {round_num} C++')
      _assert_same(actual.state, out_cpp.state, f'round {round_num} C++')
      state_cpp = out_cpp.state
    state_per_client, state_batched = expected.state, actual.state
  return actual


def _dp(method, clip_norm, **kwargs):
  return dp.dp_factory(method, noise_multiplier=0.5, clients_per_round=3.0,
                       clip_norm=clip_norm, noise_seed=7, **kwargs)


# ----------------------------------------------------------------------------
# Equivalence.


def test_a_round_from_the_state_it_returned_equals_one_from_a_copy():
  """The next round takes the returned state's leaves as they were computed
  (not converted back from its arrays): bit for bit the round a copy of
  that state (a new object, converted) gives."""
  aggregator = _dp('clip', 0.3)
  process = algorithms.build_fedavg(
      tiny_model.model_fn, client_optimizer=_sgd(0.1),
      server_optimizer=_sgd(1.0), model_aggregator=aggregator)
  runner = simulation.InProcessRunner(process, client_threads=1)
  batched = batched_clients.BatchedRunner(runner, tiny_model.model_fn,
                                          aggregator)
  task = _regression_task()
  clients = client_data.ClientDatasets(task, seed=3, batched=True)
  cohort = list(task.datasets.train_data.client_ids)
  state = batched.next(runner.initialize(), clients.datasets(cohort, 1)).state
  copied = copy.deepcopy(state)
  returned = batched.next(state, clients.datasets(cohort, 2))
  converted = batched.next(copied, clients.datasets(cohort, 2))
  for a, b in zip(tf.nest.flatten((returned.state, returned.metrics)),
                  tf.nest.flatten((converted.state, converted.metrics))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# The adaptive norm (its state moves too); the fixed one in the slow suite.
@pytest.mark.parametrize('clip_norm', [
    pytest.param(0.3, marks=pytest.mark.slow), 'adaptive'])
def test_the_later_rounds_one_call_equals_the_calls_one_by_one(
    monkeypatch, clip_norm):
  """Rounds after the first run prepare, the cohort call and update as one
  traced call (`fused_rounds`): bit for bit the rounds that the calls make
  one by one (the noise drawn by update from the state's key, once)."""
  aggregator = _dp('clip', clip_norm)
  process = algorithms.build_fedavg(
      tiny_model.model_fn, client_optimizer=_sgd(0.1),
      server_optimizer=_sgd(1.0), model_aggregator=aggregator)
  runner = simulation.InProcessRunner(process, client_threads=1)
  task = _regression_task()
  clients = client_data.ClientDatasets(task, seed=3, batched=True)
  cohort = list(task.datasets.train_data.client_ids)

  def rounds(fuse, trace_key=None):
    batched = batched_clients.BatchedRunner(
        runner, tiny_model.model_fn, aggregator, fuse=fuse,
        trace_key=trace_key)
    state, outputs = runner.initialize(), []
    for round_num in range(1, 4):
      # A cohort of unequal clients, one empty, a step 1 for a few.
      output = batched.next(state, clients.datasets(cohort[round_num - 1:],
                                                    round_num))
      outputs.append(output)
      state = output.state
    return outputs, batched._fused  # pylint: disable=protected-access

  fused, one_call = rounds(True)
  assert one_call
  one_by_one, none = rounds(False)
  assert none is False
  # By default, only where this process traced the cohort call before.
  assert rounds(None)[1] is False
  monkeypatch.setattr(batched_clients, '_traces', collections.OrderedDict())
  assert rounds(None, f'key {clip_norm}')[1] is False
  warm, default = rounds(None, f'key {clip_norm}')
  assert default
  for a, b in zip(warm, fused, strict=True):
    for x, y in zip(tf.nest.flatten((a.state, a.metrics)),
                    tf.nest.flatten((b.state, b.metrics)), strict=True):
      assert np.asarray(x).tobytes() == np.asarray(y).tobytes()
  for a, b in zip(fused, one_by_one, strict=True):
    for x, y in zip(tf.nest.flatten((a.state, a.metrics)),
                    tf.nest.flatten((b.state, b.metrics)), strict=True):
      assert np.asarray(x).tobytes() == np.asarray(y).tobytes()
  assert not np.array_equal(  # The rounds moved the model.
      fused[-1].state.global_model_weights.trainable[0],
      fused[0].state.global_model_weights.trainable[0])


# Each bounding on the default records (tensor ops over the cohort); the
# loop and `vectorized_map` (which run any query's `preprocess_record` client
# by client, as for TFF's queries below) for one of them. The default suite
# runs a global and a per-layer bounding and each way of computing records,
# fixed and adaptive; the rest of the grid runs in the slow suite.
_BOUNDING_RECORDS = [(method, 'batched') for method in (
    'clip', 'normalize', 'per_layer_clip', 'per_layer_normalize')] + [
        ('clip', 'looped'), ('clip', 'vectorized')]


def _some_in_the_slow_suite(grid, default):
  return [params if params in default else
          pytest.param(*params, marks=pytest.mark.slow) for params in grid]


@pytest.mark.parametrize('method,records', _some_in_the_slow_suite(
    _BOUNDING_RECORDS, [('clip', 'batched'), ('per_layer_normalize', 'batched'),
                        ('clip', 'vectorized')]))
def test_dp_bounding_equals_per_client_path(method, records):
  # A clip norm the updates exceed (clipping acts) on the regression model;
  # the records bounded as tensor ops over the cohort, client by client, or
  # all at once (`vectorized_map`).
  _assert_batched_equals_per_client(tiny_model.model_fn, _regression_task(),
                                    _dp(method, 0.3), None, records=records)


@pytest.mark.parametrize('method,records', _some_in_the_slow_suite(
    _BOUNDING_RECORDS, [('per_layer_clip', 'batched'), ('clip', 'looped')]))
def test_dp_adaptive_bounding_equals_per_client_path(method, records):
  # The clipped counts (the quantile's record) go through the same sums.
  _assert_batched_equals_per_client(tiny_model.model_fn, _regression_task(),
                                    _dp(method, 'adaptive'), None, rounds=3,
                                    records=records)


def _tff_dp(kind):
  factory = tff.aggregators.DifferentiallyPrivateFactory
  if kind == 'gaussian_fixed':  # Noise-free: TFF's Gaussian is unseeded.
    return factory.gaussian_fixed(0.0, 3.0, 0.3)
  if kind == 'gaussian_adaptive':
    return factory.gaussian_adaptive(0.0, 3.0, initial_l2_norm_clip=0.3,
                                     clipped_count_stddev=0.0)
  return tff_tree.TreeAdaptiveFactory(  # Seeded tree noise.
      0.5, 3.0, 0.3, 0.5, 0.2, 1.0, restart_every=2, noise_seed=7)


@pytest.mark.parametrize('kind,records', _some_in_the_slow_suite([
    ('gaussian_fixed', 'looped'), ('gaussian_adaptive', 'looped'),
    ('tree_adaptive', 'looped'), ('gaussian_adaptive', 'vectorized'),
    ('tree_adaptive', 'vectorized'), ('gaussian_adaptive', 'batched')], [
        ('gaussian_fixed', 'looped'), ('tree_adaptive', 'looped'),
        ('gaussian_adaptive', 'vectorized')]))
def test_tffs_dp_factories_equal_per_client_path(kind, records):
  # TFF's own DP aggregators (the frontier's baselines): their queries'
  # clipping of each client's record, the sums, and (tree) the noise drawn
  # once on the server from the state's seeds. (Their queries have no
  # tensor-op records: 'batched' sums them client by client.)
  _assert_batched_equals_per_client(tiny_model.model_fn, _regression_task(),
                                    _tff_dp(kind), None, rounds=3,
                                    records=records)


def test_a_non_finite_update_is_zeroed_as_the_per_client_path_zeroes_it():
  # Client 1's labels overflow its squared-error gradient: its whole update
  # is zeroed (TFF's `zero_all_if_any_non_finite`), the others' are not, in
  # the round that has it and in the finite round after it.
  rng = np.random.default_rng(0)
  x = rng.normal(size=[sum(SIZES), 3]).astype(np.float32)
  y = (x @ rng.normal(scale=2.0, size=[3, 2])).astype(np.float32)
  y[SIZES[0]:SIZES[0] + SIZES[1]] = 3e38  # Client 1's examples.
  # TFF's mean (no bounding, which would zero it too): the zeroing alone.
  task = _task(x, y)
  process = algorithms.build_fedavg(
      tiny_model.model_fn, client_optimizer=_sgd(0.1),
      server_optimizer=_sgd(1.0))
  runner = simulation.InProcessRunner(process, client_threads=1)
  batched = batched_clients.BatchedRunner(runner, tiny_model.model_fn)
  clients = client_data.ClientDatasets(task, seed=3, batched=True)
  cohort = list(task.datasets.train_data.client_ids)
  expected = actual = runner.initialize()
  for round_num in (1, 2):
    expected = runner.next(expected,
                           list(clients.datasets(cohort, round_num))).state
    actual = batched.next(actual, clients.datasets(cohort, round_num)).state
    # The state: the training metrics' loss of the overflowing client is
    # not compared.
    _assert_same(actual, expected, f'round {round_num}')
  assert all(np.all(np.isfinite(np.asarray(leaf)))
             for leaf in tf.nest.flatten(actual.global_model_weights))


def test_no_other_clients_example_enters_a_clients_padding():
  # The population's first example (client 0's, the first row the batched
  # path holds) is inf. The other clients, with short last batches, train
  # and are bounded exactly as on the per-client path: in round 1 beside
  # client 0 (whose own update is zeroed), and in round 2 where client 0 is
  # not sampled at all. (Padding slots once held that row: 0 times its
  # non-finite gradient is NaN, which zeroed every padded client's record.)
  rng = np.random.default_rng(0)
  x = rng.normal(size=[sum(SIZES), 3]).astype(np.float32)
  y = (x @ rng.normal(scale=2.0, size=[3, 2])).astype(np.float32)
  x[0] = np.inf
  cohort = [str(c) for c in range(len(SIZES))]
  _assert_batched_equals_per_client(
      tiny_model.model_fn, _task(x, y), _dp('clip', 0.3), None,
      cohorts=[cohort, cohort[1:]], metrics=False)


def test_a_diverged_clients_training_metrics_are_left_out_as_per_client():
  # Client 1's features are inf: its update is not finite, and the client
  # work resets its metrics (TFF's and tff_clip's: loss, accuracy, examples,
  # batches), which the round then leaves out; the other clients' count.
  rng = np.random.default_rng(1)
  x = rng.normal(size=[sum(SIZES), 2, 2]).astype(np.float32)
  y = rng.integers(0, 3, size=[sum(SIZES)]).astype(np.int32)
  x[SIZES[0]:SIZES[0] + SIZES[1]] = np.inf
  output = _assert_batched_equals_per_client(
      _mlp_model_fn(), _task(x, y, batch_size=3), _dp('normalize', 0.2), None,
      rounds=1)
  train = output.metrics['client_work']['train']
  assert train['num_examples'] == sum(SIZES) - SIZES[1]
  assert np.isfinite(train['loss'])


@pytest.mark.parametrize('weighting', [_BY_EXAMPLES, _UNIFORM])
def test_mean_without_dp_equals_per_client_path(weighting):
  # TFF's weighted mean: sum(w u) and sum(w), by examples or uniform.
  _assert_batched_equals_per_client(tiny_model.model_fn, _regression_task(),
                                    None, weighting)


def test_dense_classifier_equals_per_client_path_and_cpp_runtime():
  # Flatten and Dense layers, ReLU and softmax, cross-entropy on logits
  # recovered from the softmax, the accuracy metric; DP normalization, and
  # TFF's C++ runtime as a second oracle.
  output = _assert_batched_equals_per_client(
      _mlp_model_fn(), _classification_task(), _dp('normalize', 0.2), None,
      cpp=True)
  train = output.metrics['client_work']['train']
  assert train['num_examples'] == sum(SIZES)
  assert train['num_batches'] == sum(-(-n // 3) for n in SIZES)


def test_dense_classifier_without_dp_equals_cpp_runtime():
  _assert_batched_equals_per_client(_mlp_model_fn(), _classification_task(),
                                    None, _BY_EXAMPLES, cpp=True)


# Each layer model under one bounding (a per-layer one for the convolutions,
# a global one for the embedding); the rest of the grid in the slow suite
# (7-9 s each).
_LAYER_BOUNDINGS = _some_in_the_slow_suite(
    [(model, method) for model in ('conv', 'embedding') for method in (
        'clip', 'normalize', 'per_layer_clip', 'per_layer_normalize')],
    [('conv', 'per_layer_normalize'), ('embedding', 'normalize')])


@pytest.mark.parametrize('model,method', _LAYER_BOUNDINGS)
def test_conv_and_embedding_models_equal_per_client_path(model, method):
  # Convolutions, pooling, embeddings and Dense on every token, under each
  # bounding (a norm the updates exceed).
  model_fn, task = _LAYER_MODELS[model]
  _assert_batched_equals_per_client(model_fn(), task(), _dp(method, 0.05),
                                    None)


@pytest.mark.slow  # 25 s each; the per-client path is pinned to it above.
@pytest.mark.parametrize('model', sorted(_LAYER_MODELS))
def test_conv_and_embedding_models_equal_cpp_runtime(model):
  # TFF's C++ runtime as the second oracle: DP with an adaptive norm, and
  # TFF's mean without DP, weighted by examples and uniform.
  model_fn, task = _LAYER_MODELS[model]
  _assert_batched_equals_per_client(
      model_fn(), task(), _dp('normalize', 'adaptive'), None, cpp=True)
  for weighting in (_BY_EXAMPLES, _UNIFORM):
    _assert_batched_equals_per_client(model_fn(), task(), None, weighting,
                                      cpp=True)


def test_auto_batches_small_models_and_trains_larger_ones_client_by_client(
    monkeypatch):
  # `auto` batches a model of at most SMALL_MODEL parameters (the MLP has
  # 4 x 5 + 5 + 5 x 3 + 3 = 43); above it the per-client path is faster,
  # and `batched` still batches it when asked.
  from tff_clip.program import client_execution
  model_fn = _mlp_model_fn()
  process = algorithms.build_fedavg(
      model_fn, client_optimizer=_sgd(0.1), server_optimizer=_sgd(1.0))
  runner = simulation.InProcessRunner(process, client_threads=1)
  task = _classification_task()
  task.model_fn = model_fn

  def path(wanted, rounds=1):
    config = types.SimpleNamespace(
        client_execution=wanted, seed=0, local_steps=None,
        executor='inprocess', audit_canaries=0, local_clip_norm=None,
        blur_strength=None, lus_sparsity=None, client_optimizer='sgd',
        rounds=rounds)
    _, chosen_runner, chosen = client_execution.clients(
        config, task, runner, None, lambda *_: (None, None, None))
    assert isinstance(chosen_runner, batched_clients.BatchedRunner) == (
        chosen == 'batched')
    if chosen == 'batched':  # Long runs sum their records at once.
      assert chosen_runner._vectorized == (  # pylint: disable=protected-access
          rounds >= client_execution.VECTORIZED_RECORDS_FROM)
    return chosen

  monkeypatch.setattr(batched_clients, 'SMALL_MODEL', 43)
  assert path('auto') == 'batched'
  monkeypatch.setattr(batched_clients, 'SMALL_MODEL', 42)
  assert path('auto') == 'per_client'
  assert path('batched') == 'batched'
  assert path('batched', rounds=client_execution.VECTORIZED_RECORDS_FROM
             ) == 'batched'
  assert path('per_client') == 'per_client'


def test_a_later_process_imports_the_cohort_call_instead_of_tracing_it(
    tmp_path, monkeypatch, caplog):
  """A runner with a trace key stores its traced cohort call in the graph
  cache; a runner of a later process (this one's traces forgotten) imports
  that graph and runs the same round to the bit. An entry that cannot be
  imported is traced again, with a warning."""
  from tff_clip.runtime import graph_cache
  from tff_clip.runtime import runner_cache
  monkeypatch.setenv(graph_cache.ENV, str(tmp_path))
  task, aggregator = _regression_task(), _dp('clip', 0.3)  # Noise seed 7.
  process = algorithms.build_fedavg(
      tiny_model.model_fn, client_optimizer=_sgd(0.1),
      server_optimizer=_sgd(1.0), model_aggregator=aggregator)
  runner = simulation.InProcessRunner(process, client_threads=1)
  clients = client_data.ClientDatasets(task, seed=3, batched=True)
  cohort = list(task.datasets.train_data.client_ids)
  state = runner.initialize()

  def later_process_round():
    monkeypatch.setattr(batched_clients, '_traces',
                        collections.OrderedDict())
    batched = batched_clients.BatchedRunner(
        runner, tiny_model.model_fn, aggregator, trace_key='shape-key')
    out = batched.next(state, clients.datasets(cohort, 1))
    return out, batched._round  # pylint: disable=protected-access

  traced_out, traced = later_process_round()
  assert isinstance(traced, tf.types.experimental.ConcreteFunction)
  [entry] = tmp_path.glob('*.graphs')
  imported_out, imported = later_process_round()
  assert isinstance(imported, runner_cache._ImportedFunction)  # pylint: disable=protected-access
  for a, b in zip(tf.nest.flatten((traced_out.state, traced_out.metrics)),
                  tf.nest.flatten((imported_out.state, imported_out.metrics)),
                  strict=True):
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
  key = entry.name[:-len('.graphs')]
  graph_cache.store(key, {'traced/graph': b'not a graph',
                          'traced/names': b'{"inputs": [], "outputs": []}'})
  retraced_out, retraced = later_process_round()
  assert isinstance(retraced, tf.types.experimental.ConcreteFunction)
  assert 'unusable' in caplog.text
  np.testing.assert_array_equal(
      tf.nest.flatten(retraced_out.metrics), tf.nest.flatten(traced_out.metrics))


# ----------------------------------------------------------------------------
# The padded batches.


@pytest.mark.parametrize('sizes,cohort', [
    (SIZES, ['4', '0', '3', '2']),
    # A client above tf.data's shuffle buffer: its batches from tf.data.
    ((5, client_data.SHUFFLE_BUFFER + 3, 0), ['1', '0', '2']),
])
def test_cohort_batches_are_the_datasets_batches(sizes, cohort):
  # Client by client, step by step, the real entries of the padded index
  # are the examples the client's dataset yields, in order.
  rng = np.random.default_rng(0)
  x = rng.normal(size=[sum(sizes), 3]).astype(np.float32)
  task = _task(x, x[:, :2], sizes=sizes)
  clients = client_data.ClientDatasets(task, seed=5, batched=True)
  examples, index = clients.cohort_batches(cohort, 9)
  datasets = clients.datasets(cohort, 9)
  assert index.shape[0] == len(cohort)
  for c, dataset in enumerate(datasets):
    batches = list(dataset)
    rows = index[c].numpy()
    assert sum((row >= 0).any() for row in rows) == len(batches)
    for s, batch in enumerate(batches):
      taken = rows[s][rows[s] >= 0]
      np.testing.assert_array_equal(tf.gather(examples['x'], taken),
                                    batch['x'])


def test_a_later_run_of_the_same_task_takes_the_population_it_stored(
    monkeypatch):
  # A sweep's trainings of one task (one process, one after another) map
  # the population's examples once: a later run's cohort gathers from the
  # same stored rows, read-only, and its batches are its own datasets'.
  rng = np.random.default_rng(1)
  x = rng.normal(size=[sum(SIZES), 3]).astype(np.float32)
  task = _task(x, x[:, :2], sizes=SIZES)
  cohort = ['4', '0', '2', '5']
  first = client_data.ClientDatasets(task, seed=5, batched=True)
  first.cohort_batches(cohort, 1)
  later = client_data.ClientDatasets(task, seed=6, batched=True)
  monkeypatch.setattr(later, '_read_many',
                      lambda ids: pytest.fail('the population read again'))
  examples, index = later.cohort_batches(cohort, 3)
  for c, dataset in enumerate(later.datasets(cohort, 3)):
    rows = index[c].numpy()
    batches = list(dataset)
    assert sum((row >= 0).any() for row in rows) == len(batches)
    for s, batch in enumerate(batches):
      np.testing.assert_array_equal(
          tf.gather(examples['x'], rows[s][rows[s] >= 0]), batch['x'])
  with pytest.raises(ValueError):
    later._store[0][0] = 1.0  # pylint: disable=protected-access
  # Other task data: its own population.
  other = client_data.ClientDatasets(_task(x + 1, x[:, :2], sizes=SIZES),
                                     seed=6, batched=True)
  other_examples, _ = other.cohort_batches(cohort, 3)
  assert not np.array_equal(other_examples['x'], examples['x'])


# ----------------------------------------------------------------------------
# What is refused.


@pytest.mark.parametrize('layer,why', [
    (lambda: tf.keras.layers.Dropout(0.5), 'Dropout'),
    (lambda: tf.keras.layers.BatchNormalization(), 'non-trainable'),
    (lambda: tf.keras.layers.Conv2DTranspose(2, 1), 'Conv2DTranspose'),
])
@pytest.mark.filterwarnings('ignore:Batch Normalization')  # TFF's advice.
def test_layers_it_cannot_batch_are_refused(layer, why):
  # Dropout draws its own randomness client by client, batch normalization
  # keeps non-trainable statistics, a transposed convolution is not among
  # the layers it knows: the per-client path runs those models.
  def model_fn():
    keras_model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(2, 2, 1)), layer(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(3, activation='softmax')])
    return tff.learning.models.from_keras_model(
        keras_model, loss=tf.keras.losses.SparseCategoricalCrossentropy(),
        input_spec=collections.OrderedDict(
            x=tf.TensorSpec([None, 2, 2, 1], tf.float32),
            y=tf.TensorSpec([None], tf.int32)))
  process = algorithms.build_fedavg(
      model_fn, client_optimizer=_sgd(0.1), server_optimizer=_sgd(1.0))
  runner = simulation.InProcessRunner(process, client_threads=1)
  with pytest.raises(batched_clients.Unsupported, match=why):
    batched_clients.BatchedRunner(runner, model_fn)


def test_a_model_with_a_prediction_per_token_is_refused():
  # Predictions [B, T, classes] (an Embedding, then a Dense on every token):
  # the loss and metrics have a value per token, which the cohort call's
  # per-example masks do not cover (it failed, or with T == B mixed the
  # masks with the client axis); the per-client path runs such models.
  def model_fn():
    keras_model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(4,), dtype=tf.int32),
        tf.keras.layers.Embedding(7, 3),
        tf.keras.layers.Dense(3, activation='softmax')])
    return tff.learning.models.from_keras_model(
        keras_model, loss=tf.keras.losses.SparseCategoricalCrossentropy(),
        input_spec=collections.OrderedDict(
            x=tf.TensorSpec([None, 4], tf.int32),
            y=tf.TensorSpec([None, 4], tf.int32)))
  process = algorithms.build_fedavg(
      model_fn, client_optimizer=_sgd(0.1), server_optimizer=_sgd(1.0))
  runner = simulation.InProcessRunner(process, client_threads=1)
  with pytest.raises(batched_clients.Unsupported, match='one vector per'):
    batched_clients.BatchedRunner(runner, model_fn)


def test_momentum_and_client_noise_are_unsupported():
  process = algorithms.build_fedavg(
      tiny_model.model_fn, client_optimizer=_sgd(0.1),
      server_optimizer=_sgd(1.0))
  runner = simulation.InProcessRunner(process, client_threads=1)
  with pytest.raises(batched_clients.Unsupported, match='sgdm'):
    batched_clients.BatchedRunner(runner, tiny_model.model_fn,
                                  client_optimizer='sgdm')
  noisy = _dp('clip', 0.3, noise_placement='client')
  process = algorithms.build_fedavg(
      tiny_model.model_fn, client_optimizer=_sgd(0.1),
      server_optimizer=_sgd(1.0), model_aggregator=noisy)
  runner = simulation.InProcessRunner(process, client_threads=1)
  with pytest.raises(batched_clients.Unsupported, match='clients'):
    batched_clients.BatchedRunner(runner, tiny_model.model_fn, noisy)
