"""Each client's dataset for a round, built from tensors held once per run.

A round of `scripts.train` feeds every sampled client's `tf.data` pipeline
to the process: the client's examples shuffled with a seed that is a function
of (run seed, round, client) only, so a resumed run sees the same batches,
then the task's `train_preprocess_fn`, then `local_steps` if set.

Built naively (`ClientData.create_tf_dataset_for_client`, `shuffle`, the
task's preprocessing), each client costs its data set's construction and a
fresh trace of the preprocessing's `map` functions, every round, and running
the pipeline pays tf.data's static graph rewrites once per iterator. Here:

* a client's examples become tensors once per run (the first round it is
  sampled in; at most `max_cached_bytes` of them are kept, the least
  recently sampled dropped first), unless the task draws them afresh every
  round (`task.round_train_data`, Yang et al. 2022's fat-tailed noise);
  where the training data holds them as numpy arrays (a `client_arrays(
  client_id)` method, as `tasks.task.client_data_from_arrays` gives) they
  are converted directly, without a `tf.data` pipeline per client;
* the pipeline (slices, shuffle, preprocessing, local steps) is one
  `tf.function` with the tensors and the seed as arguments, traced once for
  the run, so building a client's dataset runs a graph and traces nothing;
* tf.data's default static optimizations are off for these small pipelines
  (they change how fast a pipeline runs, never what it yields);
* a task whose preprocessing maps each example on its own
  (`ExamplewisePreprocess`: TFF's EMNIST reshape, the synthetic tasks'
  feature selection) has its examples mapped once, when they become tensors,
  and each round's pipeline has no `map` (tf.data instantiates a map's
  function for every iterator, which was most of a small client's cost).

For the batched client path (`batched=True`, `cohort_batches`), no
`tf.data` runs in a round: the population's examples are held once as host
arrays with per-client offsets (mapped in one call), each round's shuffles
are drawn for the whole cohort as tf.data's seeded shuffle draws them
(`shuffle_draws.shuffled_batches`), and the cohort's batches are one gather.

The batches are those of the naive pipeline for the same seed, element for
element (`tests/test_client_data.py` compares the two on every task). Tasks
whose examples do not have one fixed shape (which `batch` cannot stack) use
the naive pipeline.

References:
* Yang, Qiu, Liu 2022: "Taming Fat-Tailed Noise in Federated Learning",
  NeurIPS 2022.
"""

from __future__ import annotations

import atexit
import collections
import collections.abc
import weakref
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_clip.runtime import shuffle_draws

__all__ = ['ClientDatasets', 'CohortDatasets', 'ExamplewisePreprocess',
           'round_seed']

# The shuffle buffer of a client's examples (a full shuffle up to this many).
SHUFFLE_BUFFER = 1000
_MAXINT32 = 2**31 - 1  # TF's bound on a seed (`random_seed._MAXINT32`).
# The clients' examples kept as tensors at most (2 GiB).
DEFAULT_MAX_CACHED_BYTES = 2**31
# A whole population's examples up to this size are also held as tensors,
# once (the batched round's call gathers each cohort's rows from them).
_WHOLE_STORE_TENSOR_BYTES = 2**28
# Task data -> (preprocessing, store arrays, structure, offsets, length,
# tensors): the whole population as one run of it stored it, taken by a
# later run of the same task data and preprocessing in this process (a
# sweep's or the frontier's trainings). Read-only once stored.
_WHOLE_POPULATIONS = weakref.WeakKeyDictionary()
# (example_fn, element spec) -> the examplewise map on stacked examples,
# traced once in this process: a new seed's task (new data, the same map)
# takes the first session's trace. The least recently used go first.
_STACKED_MAPS = collections.OrderedDict()
_STACKED_MAPS_KEPT = 8
atexit.register(_STACKED_MAPS.clear)  # Before TensorFlow is torn down.


def round_seed(seed: int, round_num: int, client_id) -> int:
  """The shuffle seed of `client_id` in round `round_num` of a run:
  `default_rng([seed, round_num, crc32(str(client_id))]).integers(2**31)`
  (crc32, not hash(): str hashes are salted per process). A cohort's are
  drawn at once by `shuffle_draws.round_seeds`, the same numbers."""
  return int(np.random.default_rng(
      [seed, round_num, shuffle_draws.client_word(client_id)]
  ).integers(2**31))


def _nbytes(examples) -> int:
  return sum(t.dtype.size * int(tf.size(t)) for t in tf.nest.flatten(examples))


def _fully_defined(spec) -> bool:
  return all(isinstance(s, tf.TensorSpec) and s.shape.is_fully_defined()
             for s in tf.nest.flatten(spec))


def _plain_options() -> tf.data.Options:
  options = tf.data.Options()
  options.experimental_optimization.apply_default_optimizations = False
  options.autotune.enabled = False
  return options


def _seed_pair(run_seed: int, seed: int) -> tuple[int, int]:
  """The (seed, seed2) of `Dataset.shuffle(seed=seed)` under
  `tf.random.set_seed(run_seed)`, whatever TensorFlow's global seed is now.

  TF's own derivation (`random_seed.get_seed` with an op seed: the global
  and the op seed each modulo 2^31 - 1, the pair (0, 0) made (0, 2^31 - 1)),
  with the run's seed in place of the global one: the batches are a function
  of (run seed, round, client) only, never of what the process set before
  (a sweep's earlier training at another seed).
  """
  pair = (run_seed % _MAXINT32, seed % _MAXINT32)
  return (0, _MAXINT32) if pair == (0, 0) else pair


def _seed_pairs(run_seed: int, seeds) -> np.ndarray:
  """[C, 2] int64: `_seed_pair(run_seed, seed)` of every seed of `seeds`."""
  pairs = np.stack(np.broadcast_arrays(
      np.int64(run_seed % _MAXINT32), np.asarray(seeds, np.int64) % _MAXINT32),
                   axis=-1).reshape(-1, 2)
  pairs[(pairs == 0).all(axis=1), 1] = _MAXINT32
  return pairs


def _shuffled(dataset, seed, seed2):
  """`dataset.shuffle(SHUFFLE_BUFFER, reshuffle_each_iteration=True)` with
  the seed pair given (`_seed_pair`), not derived from the global seed."""
  flat = tf.nest.flatten(dataset.element_spec)
  shuffled = tf.raw_ops.ShuffleDatasetV3(
      input_dataset=tf.data.experimental.to_variant(dataset),
      buffer_size=tf.constant(SHUFFLE_BUFFER, tf.int64), seed=seed,
      seed2=seed2, seed_generator=tf.raw_ops.DummySeedGenerator(),
      output_types=[s.dtype for s in flat],
      output_shapes=[s.shape for s in flat], reshuffle_each_iteration=True)
  return tf.data.experimental.from_variant(shuffled, dataset.element_spec)


class ExamplewisePreprocess:
  """A client preprocessing in TFF's order whose map acts on each example.

  TFF's baseline preprocessing (e.g. `emnist_preprocessing.
  create_preprocess_fn`) shuffles, repeats, takes and batches a client's
  dataset, then maps each batch. When the map acts on every example alone (a
  reshape, a choice of features), mapping first yields the same batches, and
  `ClientDatasets` then maps a client's examples once per run instead of once
  per batch per round.

  Called on a dataset it is an ordinary `preprocess_fn`: `example_fn` on each
  example, then (as `tff.simulation.baselines.ClientSpec` says) a shuffle if
  its buffer is above 1, `num_epochs` repeats, at most `max_elements`
  examples, batches of `batch_size`.

  Args:
    example_fn: one element of the client's dataset -> one model input.
    spec: a `tff.simulation.baselines.ClientSpec`.
    default_shuffle_buffer: the shuffle buffer when `spec` gives none
      (TFF's EMNIST preprocessing shuffles the whole client then).
  """

  def __init__(self, example_fn, spec, default_shuffle_buffer: Optional[int] = None):
    if not callable(example_fn):
      raise TypeError(f'`example_fn` must be callable; got {example_fn!r}.')
    self.example_fn = example_fn
    self.spec = spec
    buffer = spec.shuffle_buffer_size
    self._shuffle_buffer = default_shuffle_buffer if buffer is None else buffer

  def map_examples(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
    return dataset.map(self.example_fn)

  def batch(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
    """The spec's steps on already mapped examples."""
    if self._shuffle_buffer is not None and self._shuffle_buffer > 1:
      dataset = dataset.shuffle(self._shuffle_buffer)
    if self.spec.num_epochs > 1:
      dataset = dataset.repeat(self.spec.num_epochs)
    if self.spec.max_elements is not None:
      dataset = dataset.take(self.spec.max_elements)
    return dataset.batch(self.spec.batch_size)

  def __call__(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
    return self.batch(self.map_examples(dataset))


def _stacked_map(preprocess: ExamplewisePreprocess, spec):
  """`preprocess`'s map on every one of a client's stacked examples, as one
  `tf.function` (`Dataset.map` called eagerly traces its function anew on
  every call). Shared by the tasks of one `example_fn` and element `spec`
  where the map is `ExamplewisePreprocess`'s own (a function of `example_fn`
  alone)."""
  signature = [tf.nest.map_structure(
      lambda s: tf.TensorSpec([None, *s.shape], s.dtype), spec)]

  def map_stacked(examples):
    mapped = preprocess.map_examples(
        tf.data.Dataset.from_tensor_slices(examples))
    return tf.data.experimental.get_single_element(
        mapped.batch(2**31 - 1).with_options(_plain_options()))

  key = (preprocess.example_fn, repr(signature))
  try:
    hash(key)
  except TypeError:  # An unhashable `example_fn`: traced for this task.
    key = None
  if (key is None or type(preprocess).map_examples is not
      ExamplewisePreprocess.map_examples):
    return tf.function(map_stacked, input_signature=signature)
  traced = _STACKED_MAPS.pop(key, None) or tf.function(
      map_stacked, input_signature=signature)
  _STACKED_MAPS[key] = traced
  while len(_STACKED_MAPS) > _STACKED_MAPS_KEPT:
    _STACKED_MAPS.popitem(last=False)
  return traced


class ClientDatasets:
  """`datasets(cohort, round_num)`: the cohort's datasets for one round.

  Args:
    task: a TFF `BaselineTask` (optionally with `round_train_data`).
    seed: the run's seed.
    local_steps: if set, each client's pipeline is repeated and cut to this
      many batches.
    max_cached_bytes: the clients' tensors kept at most (the least recently
      sampled are dropped first and read again when next sampled).
  """

  def __init__(self, task, seed: int, local_steps: Optional[int] = None,
               max_cached_bytes: int = DEFAULT_MAX_CACHED_BYTES,
               batched: bool = False):
    self._seed = seed
    self._batched = batched
    self._index_build = None
    # The population store (`_stored`): host arrays, offsets per client.
    self._store = None
    self._store_structure = None
    self._offsets = {}
    self._store_len = 0
    # The whole population's rows as tensors (`_tensors_of_store`), or None.
    self._store_tensors = None
    self._local_steps = local_steps
    self._max_cached_bytes = max_cached_bytes
    self._cached_bytes = 0
    self._fresh = getattr(task, 'round_train_data', None)
    self._train_data = task.datasets.train_data
    self._preprocess = task.datasets.train_preprocess_fn
    # Examplewise: the examples are kept mapped, each round only batches.
    self._examplewise = isinstance(self._preprocess, ExamplewisePreprocess)
    self._examples = collections.OrderedDict()  # Least recently used first.
    spec = self._train_data.element_type_structure
    if self._examplewise and _fully_defined(spec):
      # The map on a client's stacked examples, traced once (`Dataset.map`
      # called eagerly traces its function anew on every call).
      self._map_stacked = _stacked_map(self._preprocess, spec)
      spec = self._preprocess.map_examples(tf.data.Dataset.from_tensors(
          tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype),
                                spec))).element_spec
    self._cached = _fully_defined(spec)
    if self._cached:
      stacked = tf.nest.map_structure(
          lambda s: tf.TensorSpec([None, *s.shape], s.dtype), spec)
      self._build = tf.function(
          self._pipeline,
          input_signature=[stacked, tf.TensorSpec([], tf.int64),
                           tf.TensorSpec([], tf.int64)])

  def _pipeline(self, examples, seed, seed2):
    # The seed pair is computed eagerly (`_seed_pair`) and passed in:
    # `Dataset.shuffle(seed=tensor)` fails to trace under a global seed of 0
    # (TF compares the seed pair in Python).
    return self._after_shuffle(_shuffled(
        tf.data.Dataset.from_tensor_slices(examples), seed, seed2))

  def _finish(self, dataset, seed: int):
    return self._after_shuffle(_shuffled(dataset,
                                         *_seed_pair(self._seed, seed)))

  def _stack_mapped(self, dataset) -> Any:
    """`_stack`, then the examplewise map (if any) on every example."""
    return self._map_examples(self._stack(dataset))

  def _map_examples(self, examples) -> Any:
    """The examplewise map (if any) on every one of the stacked `examples`."""
    if not self._examplewise:
      return examples
    if int(tf.shape(tf.nest.flatten(examples)[0])[0]) == 0:
      return tf.nest.map_structure(  # No examples.
          lambda s: tf.zeros([0, *s.shape[1:]], s.dtype),
          self._map_stacked.get_concrete_function().structured_outputs)
    return self._map_stacked(examples)

  def _after_shuffle(self, dataset):
    if self._examplewise and self._cached:  # Mapped when stacked.
      dataset = self._preprocess.batch(dataset)
    elif self._preprocess is not None:
      dataset = self._preprocess(dataset)
    if self._local_steps is not None:
      dataset = dataset.repeat().take(self._local_steps)
    return dataset.with_options(_plain_options())

  def _stack(self, dataset) -> Any:
    """All examples of `dataset` as tensors with a leading example axis."""
    # No static optimizations: a fused map-and-batch would allocate the whole
    # (2^31 - 1)-example batch up front.
    for batch in dataset.batch(2**31 - 1).with_options(_plain_options()):
      return batch
    return tf.nest.map_structure(  # No examples.
        lambda s: tf.zeros([0, *s.shape], s.dtype), dataset.element_spec)

  def dataset(self, client_id, round_num: int) -> tf.data.Dataset:
    """Client `client_id`'s batches for round `round_num`."""
    seed = round_seed(self._seed, round_num, client_id)
    if not self._cached:  # Examples of varying shape: the naive pipeline.
      raw = (self._fresh(client_id, seed) if self._fresh is not None else
             self._train_data.create_tf_dataset_for_client(client_id))
      return self._finish(raw, seed)
    if self._fresh is not None:
      examples = self._stack_mapped(self._fresh(client_id, seed))
    else:
      examples = self._cached_examples(client_id)
    return self._build(examples, *_seed_pair(self._seed, seed))

  def _cached_examples(self, client_id):
    if client_id in self._examples:
      self._examples.move_to_end(client_id)
      return self._examples[client_id]
    examples = self._read_examples(client_id)
    self._examples[client_id] = examples
    self._cached_bytes += _nbytes(examples)
    while self._cached_bytes > self._max_cached_bytes and self._examples:
      _, dropped = self._examples.popitem(last=False)
      self._cached_bytes -= _nbytes(dropped)
    return examples

  def _read_examples(self, client_id):
    """Client `client_id`'s examples, mapped, as tensors (not kept)."""
    client_arrays = getattr(self._train_data, 'client_arrays', None)
    if client_arrays is not None:  # In memory: no `tf.data` to stack them.
      # In the structure `tf.data` gives (it makes lists tuples).
      examples = self._map_examples(tf.nest.pack_sequence_as(
          self._train_data.element_type_structure,
          [tf.convert_to_tensor(a)
           for a in tf.nest.flatten(client_arrays(client_id))]))
    else:
      examples = self._stack_mapped(
          self._train_data.create_tf_dataset_for_client(client_id))
    return examples

  def datasets(self, cohort: Sequence[Any],
               round_num: int) -> Sequence[tf.data.Dataset]:
    """The datasets of `cohort` in round `round_num`, in cohort order.

    With `batched` (and examples this class can batch: `can_batch`), a
    `CohortDatasets`: the same datasets, built only when iterated, and the
    cohort's batches as padded tensors (`cohort_batches`).
    """
    if self._batched and self.can_batch:
      return CohortDatasets(self, list(cohort), round_num)
    return [self.dataset(client_id, round_num) for client_id in cohort]

  @property
  def can_batch(self) -> bool:
    """Whether `cohort_batches` gives the datasets' batches: examples held
    as tensors, mapped examplewise, batched with no unseeded shuffle."""
    if not (self._cached and self._examplewise and self._fresh is None):
      return False
    buffer = self._preprocess._shuffle_buffer  # pylint: disable=protected-access
    return buffer is None or buffer <= 1

  def _stored(self, cohort):
    """(offsets, sizes) of `cohort`'s examples in the population store: every
    client's mapped examples as rows of host arrays, appended the first
    time it is sampled (kept within `max_cached_bytes`, emptied when full)."""
    missing = [c for c in dict.fromkeys(cohort) if c not in self._offsets]
    whole = False
    if missing and self._store is None:
      # The first round: the whole population if it fits (one map call), or
      # the one another run of the same task data and preprocessing stored.
      try:
        shared = _WHOLE_POPULATIONS.get(self._train_data)
      except TypeError:
        shared = None
      if shared is not None and shared[0] is self._preprocess:
        (_, self._store, self._store_structure, offsets, self._store_len,
         self._store_tensors) = shared
        self._offsets = dict(offsets)
        return self._stored(cohort)
      population = self._population_ids()
      if population is not None:
        missing = list(dict.fromkeys(missing + population))
        whole = True
    if missing:
      read, parts = self._read_many(missing)
      new_bytes = sum(a.nbytes for part in parts for a in part)
      if self._store is not None and (
          sum(a[:self._store_len].nbytes for a in self._store) + new_bytes >
          self._max_cached_bytes):
        self._store, self._offsets, self._store_len = None, {}, 0  # Full.
        self._store_tensors = None
        return self._stored(cohort)
      if self._store_structure is None:
        self._store_structure = tf.nest.map_structure(lambda _: None, read)
      start = self._store_len
      count = sum(len(part[0]) for part in parts)
      if self._store is None or start + count > len(self._store[0]):
        # Room doubles: each example is copied O(1) times on average.
        room = max(2 * (start + count), 1024)
        grown = [np.empty((room, *a.shape[1:]), a.dtype) for a in parts[0]]
        if self._store is not None:
          for new, old in zip(grown, self._store):
            new[:start] = old[:start]
        self._store = grown
      for client_id, part in zip(missing, parts):
        size = len(part[0])
        for leaf, a in zip(self._store, part):
          leaf[start:start + size] = a
        self._offsets[client_id] = (start, size)
        start += size
      self._store_len = start
      if whole:  # Read-only from now on: no client is ever missing.
        for leaf in self._store:
          leaf.flags.writeable = False
        self._store_tensors = self._tensors_of_store()
        try:
          _WHOLE_POPULATIONS[self._train_data] = (
              self._preprocess, self._store, self._store_structure,
              dict(self._offsets), self._store_len, self._store_tensors)
        except TypeError:  # Task data that cannot be weakly referenced.
          pass
    spans = np.array([self._offsets[c] for c in cohort],
                     np.int64).reshape(-1, 2)
    return spans[:, 0], spans[:, 1]

  def _population_ids(self):
    """Every client's id, if their examples are numpy arrays that fit in
    `max_cached_bytes` (else None)."""
    client_arrays = getattr(self._train_data, 'client_arrays', None)
    if client_arrays is None:
      return None
    ids = list(self._train_data.client_ids)
    total = sum(np.asarray(a).nbytes for c in ids
                for a in tf.nest.flatten(client_arrays(c)))
    return ids if total <= self._max_cached_bytes // 2 else None

  def _read_many(self, client_ids):
    """(first client's examples, [per client: its mapped leaves as numpy]):
    clients held as numpy arrays are mapped in one call (the map acts on
    each example alone, so mapping them together maps each)."""
    client_arrays = getattr(self._train_data, 'client_arrays', None)
    if client_arrays is None or len(client_ids) < 2:
      read = [self._read_examples(c) for c in client_ids]
      return read[0], [[np.asarray(t) for t in tf.nest.flatten(e)]
                       for e in read]
    raw = [tf.nest.flatten(client_arrays(c)) for c in client_ids]
    sizes = [len(leaves[0]) for leaves in raw]
    joined = tf.nest.pack_sequence_as(
        self._train_data.element_type_structure,
        [tf.convert_to_tensor(np.concatenate(leaf)) for leaf in zip(*raw)])
    mapped = self._map_examples(joined)
    cuts = np.cumsum(sizes)[:-1]
    leaves = [np.split(np.asarray(t), cuts) for t in tf.nest.flatten(mapped)]
    return mapped, [list(part) for part in zip(*leaves)]

  def cohort_batches(self, cohort: Sequence[Any], round_num: int):
    """(examples, index): a structure of [N, ...] example tensors and [C, S,
    B] indices into them, -1 for padding: client c's batch s of round
    `round_num` is `examples[index[c, s][index[c, s] >= 0]]`, the batch its
    `dataset` yields (needs `can_batch`).

    No `tf.data`: the clients' shuffles are drawn as tf.data's shuffle draws
    them (`shuffle_draws.shuffled_batches`) for all clients at once; the
    examples are the whole population's rows, held as tensors once (the
    index points into them), else the cohort's rows in one host gather per
    leaf.
    """
    cohort = list(cohort)
    offsets, sizes = self._stored(cohort)
    spec = self._preprocess.spec
    seeds = shuffle_draws.round_seeds(self._seed, round_num, cohort)
    pairs = _seed_pairs(self._seed, seeds)
    if len(cohort) and sizes.max() > SHUFFLE_BUFFER:
      local = self._index_with_tf_data(sizes, pairs)
    else:
      local = shuffle_draws.shuffled_batches(
          pairs, sizes, int(spec.batch_size), int(spec.num_epochs),
          spec.max_elements, self._local_steps)
    mask = local >= 0
    if not self._store_len:
      examples = tf.nest.map_structure(
          lambda s: tf.zeros([0, *s.shape[1:]], s.dtype),
          self._build.input_signature[0])
      return examples, tf.constant(local)
    if self._store_tensors is not None:
      # The whole population's rows, as tensors once: the index points into
      # them (the cohort's call gathers its batches from any rows).
      index = np.where(mask, local + offsets[:, None, None], -1)
      return self._store_tensors, tf.constant(index)
    rows = np.where(mask, local + offsets[:, None, None], 0).reshape(-1)
    examples = tf.nest.pack_sequence_as(
        self._store_structure,
        [tf.constant(leaf[rows]) for leaf in self._store])
    index = np.where(mask, np.arange(rows.size).reshape(local.shape), -1)
    return examples, tf.constant(index)

  def _tensors_of_store(self):
    """The store's rows as tensors, where they are at most
    `_WHOLE_STORE_TENSOR_BYTES` (else None: each round gathers its rows)."""
    if sum(leaf[:self._store_len].nbytes
           for leaf in self._store) > _WHOLE_STORE_TENSOR_BYTES:
      return None
    return tf.nest.pack_sequence_as(
        self._store_structure,
        [tf.constant(leaf[:self._store_len]) for leaf in self._store])

  def _index_with_tf_data(self, sizes, pairs):
    """`shuffle_draws.shuffled_batches` by running each client's `tf.data`
    pipeline on its positions (clients above the shuffle buffer)."""
    batch_size = int(self._preprocess.spec.batch_size)
    rows = []
    for n, (seed, seed2) in zip(sizes, pairs):
      rows.append([b.numpy() for b in self._index_dataset(n, seed, seed2)])
    steps = max([len(b) for b in rows] + [0])
    index = np.full([len(rows), steps, batch_size], -1, np.int64)
    for c, batches in enumerate(rows):
      for s, b in enumerate(batches):
        index[c, s, :len(b)] = b
    return index

  def _index_dataset(self, n, seed, seed2):
    if self._index_build is None:
      self._index_build = tf.function(self._pipeline, input_signature=[
          tf.TensorSpec([None], tf.int64), tf.TensorSpec([], tf.int64),
          tf.TensorSpec([], tf.int64)])
    return self._index_build(tf.range(n, dtype=tf.int64), seed, seed2)


class CohortDatasets(collections.abc.Sequence):
  """`ClientDatasets.datasets` of a cohort, built when first iterated, with
  the same batches as padded tensors (`cohort_batches()`)."""

  def __init__(self, source: ClientDatasets, cohort: list, round_num: int):
    self._source = source
    self.cohort = cohort
    self.round_num = round_num
    self._datasets = None

  def _built(self) -> list:
    if self._datasets is None:
      self._datasets = [self._source.dataset(client_id, self.round_num)
                        for client_id in self.cohort]
    return self._datasets

  def __len__(self):
    return len(self.cohort)

  def __getitem__(self, i):
    return self._built()[i]

  def __iter__(self):
    return iter(self._built())

  def cohort_batches(self):
    """`ClientDatasets.cohort_batches` of this cohort and round."""
    return self._source.cohort_batches(self.cohort, self.round_num)
