"""Client datasets built from tensors held once per run (`tff_clip.runtime.client_data`).

The oracle is the pipeline written plainly with TF's own ops, as a TFF user
would: the client's `tf.data` set from its `ClientData`, shuffled with the
round's seed, the task's preprocessing, the local-step cut.
"""

import collections
import types
import zlib

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import tasks
from tasks import task as task_lib
from tff_clip.runtime import client_data
from tff_clip.runtime import shuffle_draws

# Tasks whose data pipeline repeats another's (the same preprocessing of
# images of one shape; another model or another source) run in the slow
# suite.
_SAME_PIPELINE = ('emnist_mlp', 'emnist_logreg', 'cifar10_resnet18',
                  'cifar100_resnet18')
_ALL_TASKS = [pytest.param(name, marks=pytest.mark.slow)
              if name in _SAME_PIPELINE else name for name in tasks.TASK_NAMES]
_TINY = {'shakespeare': {'sequence_length': 8},
         'stackoverflow_next_word': {'sequence_length': 8}}
# Tasks whose offline clients are numpy arrays in memory
# (`tasks.task.ArrayClientData`): their examples become tensors
# without a `tf.data` pipeline.
_IN_MEMORY = ('digits', 'emnist_cnn', 'emnist_mlp', 'emnist_logreg',
              'cifar10_cnn', 'cifar10_resnet18', 'shakespeare',
              'heterogeneous_quadratic', 'claim21_quadratic',
              'eq24_quadratic')


def _plain(task, client_id, run_seed, round_num, local_steps=None):
  """The oracle: TF's own pipeline for the client's round, under the run's
  seed as TensorFlow's global seed (as `tf.random.set_seed(--seed)`)."""
  seed = client_data.round_seed(run_seed, round_num, client_id)
  tf.random.set_seed(run_seed)
  if getattr(task, 'round_train_data', None) is not None:
    dataset = task.round_train_data(client_id, seed)
  else:
    dataset = task.datasets.train_data.create_tf_dataset_for_client(client_id)
  dataset = task.datasets.train_preprocess_fn(
      dataset.shuffle(1000, seed=seed, reshuffle_each_iteration=True))
  if local_steps is not None:
    dataset = dataset.repeat().take(local_steps)
  tf.random.set_seed(None)  # The pipeline holds its seeds; none is left set.
  return dataset


def _elements(dataset):
  return [tf.nest.map_structure(lambda t: t.numpy(), e) for e in dataset]


def _assert_same(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    tf.nest.map_structure(np.testing.assert_array_equal, x, y)


@pytest.mark.parametrize('name', _ALL_TASKS)
def test_batches_equal_the_plain_pipeline_for_every_task(name, monkeypatch):
  # As scripts.program builds tasks: the run's seeded shuffle is the only one.
  task = tasks.get_task(name, train_batch_size=3, max_elements_per_client=7,
                        shuffle_buffer_size=1,
                        **_TINY.get(name, {}))
  clients = client_data.ClientDatasets(task, seed=5)
  train = task.datasets.train_data
  reads = []
  original = train.create_tf_dataset_for_client
  for client_id in train.client_ids[:2]:
    for round_num in (1, 2):
      monkeypatch.setattr(train, 'create_tf_dataset_for_client',
                          lambda cid: reads.append(cid) or original(cid))
      got = _elements(clients.dataset(client_id, round_num))
      monkeypatch.undo()
      _assert_same(got, _elements(_plain(task, client_id, 5, round_num)))
  if name in _IN_MEMORY:  # Read from the arrays, never through tf.data.
    assert not reads


@pytest.fixture(scope='module')
def digits():
  return tasks.get_task('digits', num_clients=20, shuffle_buffer_size=1)


@pytest.mark.parametrize('global_seed', [None, 0, 3])
@pytest.mark.parametrize('batched', [False, True])
def test_batches_are_the_run_seeds_whatever_the_global_seed_is(
    digits, global_seed, batched):
  # A sweep's process sets TensorFlow's global seed for one training (or
  # never): a later training's batches must not change with it.
  client_id = digits.datasets.train_data.client_ids[1]
  tf.random.set_seed(global_seed)
  clients = client_data.ClientDatasets(digits, seed=2, batched=batched)
  if batched:
    examples, index = clients.cohort_batches([client_id], 3)
    x = tf.nest.flatten(examples)[0].numpy()
    got = [x[row[row >= 0]] for row in index.numpy()[0] if (row >= 0).any()]
  else:
    got = [tf.nest.flatten(b)[0] for b in _elements(
        clients.dataset(client_id, 3))]
  tf.random.set_seed(None)
  want = [tf.nest.flatten(b)[0] for b in _elements(
      _plain(digits, client_id, 2, 3))]
  _assert_same(got, want)


def test_local_steps_repeat_and_cut_the_pipeline(digits):
  clients = client_data.ClientDatasets(digits, seed=1, local_steps=11)
  client_id = digits.datasets.train_data.client_ids[3]
  batches = _elements(clients.dataset(client_id, 4))
  assert len(batches) == 11
  _assert_same(batches, _elements(_plain(digits, client_id, 1, 4, 11)))


def test_examples_are_read_once_and_the_pipeline_traced_once(digits):
  reads = collections.Counter()
  train = digits.datasets.train_data
  original = train.create_tf_dataset_for_client

  class Counting:
    element_type_structure = train.element_type_structure

    def create_tf_dataset_for_client(self, client_id):
      reads[client_id] += 1
      return original(client_id)

  clients = client_data.ClientDatasets(digits, seed=0)
  clients._train_data = Counting()  # pylint: disable=protected-access
  cohorts = [train.client_ids[:5], train.client_ids[3:9], train.client_ids[:2]]
  for round_num, cohort in enumerate(cohorts, 1):
    for dataset in clients.datasets(cohort, round_num):
      _elements(dataset)
  assert set(reads.values()) == {1}
  assert len(reads) == 9
  assert clients._build.experimental_get_tracing_count() == 1  # pylint: disable=protected-access


def test_a_full_cache_drops_the_least_recently_sampled_client(digits):
  train = digits.datasets.train_data

  def nbytes(client_id):
    probe = client_data.ClientDatasets(digits, seed=0)
    probe.dataset(client_id, 1)
    return probe._cached_bytes  # pylint: disable=protected-access

  a, b = train.client_ids[:2]
  c = next(c for c in train.client_ids[2:] if nbytes(c) <= nbytes(b))
  # Room for a and b, or for a and c, never for all three.
  clients = client_data.ClientDatasets(
      digits, seed=0, max_cached_bytes=nbytes(a) + nbytes(b))
  reads = collections.Counter()
  original = train.create_tf_dataset_for_client

  class Counting:
    def create_tf_dataset_for_client(self, client_id):
      reads[client_id] += 1
      return original(client_id)

  clients._train_data = Counting()  # pylint: disable=protected-access
  for round_num, client_id in enumerate([a, b, a, c, a, b], 1):
    got = _elements(clients.dataset(client_id, round_num))
    _assert_same(got, _elements(_plain(digits, client_id, 0, round_num)))
  # c pushed out b (a was sampled more recently); b is read again.
  assert reads == {a: 1, b: 2, c: 1}


def test_rounds_and_clients_get_their_own_order_and_a_rerun_the_same(digits):
  client_id = digits.datasets.train_data.client_ids[0]
  first = client_data.ClientDatasets(digits, seed=0)
  again = client_data.ClientDatasets(digits, seed=0)
  labels = lambda clients, r: np.concatenate(
      [y for _, y in _elements(clients.dataset(client_id, r))])
  np.testing.assert_array_equal(labels(first, 1), labels(again, 1))
  assert not np.array_equal(labels(first, 1), labels(first, 2))
  assert sorted(labels(first, 1)) == sorted(labels(first, 2))


# TFF's in-memory ClientData read through tf.data, and the one whose arrays
# become tensors directly.
_IN_MEMORY_CLIENT_DATA = pytest.mark.parametrize(
    'client_data_type',
    [tff.simulation.datasets.TestClientData, task_lib.ArrayClientData])


@_IN_MEMORY_CLIENT_DATA
def test_a_client_with_no_examples_has_no_batches(client_data_type):
  arrays = collections.OrderedDict(x=np.ones((4, 2), np.float32))
  train = client_data_type({
      'full': arrays,
      'empty': collections.OrderedDict(x=np.zeros((0, 2), np.float32))})
  # What ClientDatasets reads of a BaselineTask.
  task = types.SimpleNamespace(datasets=types.SimpleNamespace(
      train_data=train, train_preprocess_fn=lambda d: d.batch(2)))
  clients = client_data.ClientDatasets(task, seed=0)
  assert [len(_elements(d)) for d in clients.datasets(['empty', 'full'], 1)
         ] == [0, 2]


@_IN_MEMORY_CLIENT_DATA
def test_examplewise_preprocessing_maps_each_client_once_and_keeps_empty_ones(
    client_data_type):
  arrays = collections.OrderedDict(x=np.arange(10, dtype=np.float32).reshape(
      5, 2))
  train = client_data_type({
      'full': arrays,
      'empty': collections.OrderedDict(x=np.zeros((0, 2), np.float32))})
  calls = []

  def example_fn(element):
    calls.append(1)  # Runs when traced: once per trace, not per client.
    return element['x'] * 2.0, tf.reduce_sum(element['x'], keepdims=True)

  preprocess = client_data.ExamplewisePreprocess(
      example_fn, tff.simulation.baselines.ClientSpec(
          num_epochs=1, batch_size=2, shuffle_buffer_size=1))
  task = types.SimpleNamespace(datasets=types.SimpleNamespace(
      train_data=train, train_preprocess_fn=preprocess))
  clients = client_data.ClientDatasets(task, seed=0)
  traces = len(calls)
  batches = [_elements(d) for d in clients.datasets(['empty', 'full'], 1)]
  for round_num in (2, 3):
    clients.datasets(['empty', 'full'], round_num)
  assert len(calls) - traces <= 1  # The stacked map, traced once.
  assert [len(b) for b in batches] == [0, 3]
  x = np.concatenate([b[0] for b in batches[1]])
  y = np.concatenate([b[1] for b in batches[1]])
  # Oracle: the map written out on the arrays, in the shuffled order.
  order = np.argsort(x[:, 0])
  np.testing.assert_array_equal(x[order], 2.0 * arrays['x'])
  np.testing.assert_array_equal(y[order], arrays['x'].sum(1, keepdims=True))


def test_tasks_of_one_example_fn_share_one_trace_of_the_stacked_map():
  # A new seed's task: other data, the same map. Its session takes the
  # first's trace, and maps its own examples (oracle: the map written out).
  calls = []

  def example_fn(element):
    calls.append(1)  # Runs when traced.
    return element['x'] + 1.0, element['x'][:1]

  spec = tff.simulation.baselines.ClientSpec(num_epochs=1, batch_size=9,
                                             shuffle_buffer_size=1)
  mapped = []
  for offset in (0.0, 100.0):  # Two tasks' data.
    arrays = collections.OrderedDict(
        x=np.arange(6, dtype=np.float32).reshape(3, 2) + offset)
    task = types.SimpleNamespace(datasets=types.SimpleNamespace(
        train_data=task_lib.ArrayClientData({'a': arrays}),
        train_preprocess_fn=client_data.ExamplewisePreprocess(example_fn,
                                                              spec)))
    clients = client_data.ClientDatasets(task, seed=0)
    (batch,) = _elements(clients.dataset('a', 1))
    order = np.argsort(batch[0][:, 0])
    np.testing.assert_array_equal(batch[0][order], arrays['x'] + 1.0)
    np.testing.assert_array_equal(batch[1][order], arrays['x'][:, :1])
    mapped.append(clients._map_stacked)  # pylint: disable=protected-access
  assert mapped[0] is mapped[1]
  assert mapped[0].experimental_get_tracing_count() == 1


@pytest.mark.parametrize('sizes,batch_size,num_epochs,max_elements,steps', [
    ((5, 3, 7, 0, 11, 2), 2, 1, None, None),
    ((5, 3, 7, 0, 11, 2), 3, 2, None, None),
    ((5, 3, 7, 0, 11, 2), 2, 3, 8, None),
    ((5, 3, 7, 0, 11, 2), 2, 1, None, 5),
    ((60, 1, 1000), 8, 1, None, 1),
    ((4, 9), 4, 2, 7, 6),
])
def test_cohort_shuffles_are_tf_datas(sizes, batch_size, num_epochs,
                                      max_elements, steps):
  # The oracle: tf.data's own shuffle, repeats, take and batches on each
  # client's positions, seed pair by seed pair (the pairs of seeds 0..).
  pairs = np.array([client_data._seed_pair(7, s) for s in range(len(sizes))])
  tf.random.set_seed(7)  # The run's seed: the pairs' derivation in TF.
  got = shuffle_draws.shuffled_batches(pairs, sizes, batch_size, num_epochs,
                                      max_elements, steps)
  for c, n in enumerate(sizes):
    dataset = tf.data.Dataset.range(n).shuffle(
        client_data.SHUFFLE_BUFFER, seed=c, reshuffle_each_iteration=True)
    dataset = dataset.repeat(num_epochs)
    if max_elements is not None:
      dataset = dataset.take(max_elements)
    dataset = dataset.batch(batch_size)
    if steps is not None:
      dataset = dataset.repeat().take(steps)
    want = [b.numpy() for b in dataset]
    rows = [row[row >= 0] for row in got[c] if (row >= 0).any()]
    assert len(rows) == len(want), c
    for row, batch in zip(rows, want):
      np.testing.assert_array_equal(row, batch)
  tf.random.set_seed(None)


def test_a_cohorts_shuffle_seeds_are_numpys_draws_for_each_client():
  # The oracle is NumPy itself: `default_rng([seed, round, crc32(id)])
  # .integers(2**31)` per client, against the cohort's computed at once.
  rng = np.random.default_rng(0)
  seeds = [0, 1, 1000, 2**31 - 1, 2**32 - 1, 2**32, 2**40 + 7, 2**63 - 1]
  for seed in seeds + [int(s) for s in rng.integers(2**62, size=12)]:
    for round_num in (0, 1, 2, 100, 2**32 + 3):
      ids = ([f'client_{i}' for i in rng.integers(10**6, size=30)] +
             [0, 1, 12345, 'f0001_07', ''])
      expected = [int(np.random.default_rng(
          [seed, round_num, zlib.crc32(str(c).encode())]).integers(2**31))
                  for c in ids]
      np.testing.assert_array_equal(
          shuffle_draws.round_seeds(seed, round_num, ids), expected)
      assert [client_data.round_seed(seed, round_num, c)
              for c in ids] == expected
  assert shuffle_draws.round_seeds(3, 4, []).shape == (0,)


@pytest.mark.parametrize('run_seed', [0, 1, 2**31 - 1, 2**31 + 5, 12345678901])
def test_a_cohorts_seed_pairs_are_each_clients_seed_pair(run_seed):
  # TF's derivation, pair by pair (`_seed_pair`), is the oracle; (0, 0)
  # becomes (0, 2^31 - 1) as TF makes it.
  seeds = np.array([0, 1, 2**31 - 1, 2**31 - 2, 977, 0], np.int64)
  pairs = client_data._seed_pairs(run_seed, seeds)  # pylint: disable=protected-access
  assert pairs.dtype == np.int64 and pairs.shape == (len(seeds), 2)
  assert pairs.tolist() == [list(client_data._seed_pair(run_seed, s))  # pylint: disable=protected-access
                            for s in seeds.tolist()]
  assert client_data._seed_pairs(run_seed, seeds[:0]).shape == (0, 2)  # pylint: disable=protected-access
