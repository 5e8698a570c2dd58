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

The batches are those of the naive pipeline for the same seed, element for
element (`tests/test_client_data.py` compares the two on every task). Tasks
whose examples do not have one fixed shape (which `batch` cannot stack) use
the naive pipeline.

References:
* Yang, Qiu, Liu 2022: "Taming Fat-Tailed Noise in Federated Learning",
  NeurIPS 2022.
"""

from __future__ import annotations

import collections
import collections.abc
import zlib
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import random_seed as framework_random_seed  # pylint: disable=g-direct-tensorflow-import

__all__ = ['ClientDatasets', 'CohortDatasets', 'ExamplewisePreprocess',
           'round_seed']

# The shuffle buffer of a client's examples (a full shuffle up to this many).
SHUFFLE_BUFFER = 1000
# The clients' examples kept as tensors at most (2 GiB).
DEFAULT_MAX_CACHED_BYTES = 2**31


def round_seed(seed: int, round_num: int, client_id) -> int:
  """The shuffle seed of `client_id` in round `round_num` of a run."""
  # crc32, not hash(): str hashes are salted per process.
  return int(np.random.default_rng(
      [seed, round_num, zlib.crc32(str(client_id).encode())]
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


def _seed_pair(seed: int) -> tuple[int, int]:
  """The (seed, seed2) of `Dataset.shuffle(seed=seed)` here and now.

  TF's own derivation (with the global seed, as `tf.random.set_seed` says):
  tf.data's `get_seed` is the framework's `get_seed` made tensors (five
  eager ops, a tenth of a millisecond per client); with an op seed given the
  framework's pair is never None, and it already maps (0, 0) to
  (0, 2^31 - 1) as tf.data's does.
  """
  return framework_random_seed.get_seed(seed)


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
    self._index_batches = None
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
      self._map_stacked = tf.function(
          self._map_stacked_examples,
          input_signature=[tf.nest.map_structure(
              lambda s: tf.TensorSpec([None, *s.shape], s.dtype), spec)])
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
    # `Dataset.shuffle(seed=tensor)` fails to trace under a global seed of 0
    # (TF compares the seed pair in Python), so the pair TF would derive from
    # the round's seed is computed eagerly (`_seed_pair`) and passed in.
    dataset = tf.data.Dataset.from_tensor_slices(examples)
    flat = tf.nest.flatten(dataset.element_spec)
    shuffled = tf.raw_ops.ShuffleDatasetV3(
        input_dataset=tf.data.experimental.to_variant(dataset),
        buffer_size=tf.constant(SHUFFLE_BUFFER, tf.int64), seed=seed,
        seed2=seed2, seed_generator=tf.raw_ops.DummySeedGenerator(),
        output_types=[s.dtype for s in flat],
        output_shapes=[s.shape for s in flat], reshuffle_each_iteration=True)
    return self._after_shuffle(tf.data.experimental.from_variant(
        shuffled, dataset.element_spec))

  def _finish(self, dataset, seed: int):
    return self._after_shuffle(dataset.shuffle(
        SHUFFLE_BUFFER, seed=seed, reshuffle_each_iteration=True))

  def _map_stacked_examples(self, examples):
    mapped = self._preprocess.map_examples(
        tf.data.Dataset.from_tensor_slices(examples))
    return tf.data.experimental.get_single_element(
        mapped.batch(2**31 - 1).with_options(_plain_options()))

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
    return self._build(examples, *_seed_pair(seed))

  def _cached_examples(self, client_id):
    if client_id in self._examples:
      self._examples.move_to_end(client_id)
      return self._examples[client_id]
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
    self._examples[client_id] = examples
    self._cached_bytes += _nbytes(examples)
    while self._cached_bytes > self._max_cached_bytes and self._examples:
      _, dropped = self._examples.popitem(last=False)
      self._cached_bytes -= _nbytes(dropped)
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

  def _index_pipeline(self, sizes, seeds, seeds2, bounds):
    """[C, S, B] example indices (-1: padding): each client's batches of
    `dataset` as positions in its examples."""
    batch_size = int(self._preprocess.spec.batch_size)

    def client(i, rows, steps):
      indices = tf.range(sizes[i], dtype=tf.int64)
      batches = self._pipeline(indices, seeds[i], seeds2[i])
      padded = batches.padded_batch(
          bounds[i], padded_shapes=[batch_size],
          padding_values=tf.constant(-1, tf.int64)).concatenate(
              tf.data.Dataset.from_tensors(
                  tf.fill([0, batch_size], tf.constant(-1, tf.int64))))
      matrix = tf.data.experimental.get_single_element(
          padded.take(1).with_options(_plain_options()))
      return (i + 1, rows.write(i, matrix),
              steps.write(i, tf.shape(matrix, out_type=tf.int64)[0]))

    count = tf.shape(sizes)[0]
    _, rows, steps = tf.while_loop(
        lambda i, *_: i < count, client,
        (tf.constant(0),
         tf.TensorArray(tf.int64, size=count, infer_shape=False,
                        element_shape=tf.TensorShape([None, batch_size])),
         tf.TensorArray(tf.int64, size=count)))
    lengths = steps.stack()
    values = rows.concat()
    return tf.RaggedTensor.from_row_lengths(values, lengths).to_tensor(
        default_value=-1, shape=[None, None, batch_size])

  def cohort_batches(self, cohort: Sequence[Any], round_num: int):
    """(examples, index): the cohort's examples concatenated in cohort order
    (a structure of [N, ...] tensors) and [C, S, B] indices into them, -1
    for padding: client c's batch s of round `round_num` is
    `examples[index[c, s][index[c, s] >= 0]]`, the batch its `dataset`
    yields (needs `can_batch`)."""
    if self._index_batches is None:
      self._index_batches = tf.function(self._index_pipeline, input_signature=[
          tf.TensorSpec([None], tf.int64)] * 4)
    parts = [self._cached_examples(client_id) for client_id in cohort]
    sizes = [int(tf.shape(tf.nest.flatten(e)[0])[0]) for e in parts]
    pairs = [_seed_pair(round_seed(self._seed, round_num, client_id))
             for client_id in cohort]
    # At most this many batches a client (each holds an example; padded
    # batches of this size are allocated whole).
    if self._local_steps is not None:
      bounds = [self._local_steps] * len(sizes)
    else:
      bounds = [max(1, n * int(self._preprocess.spec.num_epochs))
                for n in sizes]
    index = self._index_batches(
        tf.constant(sizes, tf.int64),
        tf.constant([p[0] for p in pairs], tf.int64),
        tf.constant([p[1] for p in pairs], tf.int64),
        tf.constant(bounds, tf.int64))
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    index = tf.where(index >= 0, index + offsets[:, np.newaxis, np.newaxis]
                     if sizes else index, index)
    if not parts:  # No examples, in the structure of the cached ones.
      return tf.nest.map_structure(
          lambda s: tf.zeros([0, *s.shape[1:]], s.dtype),
          self._build.input_signature[0]), index
    return tf.nest.map_structure(lambda *t: tf.concat(t, 0), *parts), index


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
