"""The `Task` type and the data plumbing every task module shares.

A `Task` is a `tff.simulation.baselines.BaselineTask` (so `task.model_fn()`
is a `tff.learning.models.VariableModel` and `task.datasets` a
`BaselineTaskDatasets`) that also records its name, where its data came from
and, for the papers' synthetic problems, the exact problem (optimum,
objective) so training can report f(w) - f(w*).

References:
* Zhang et al. 2022: "Understanding Clipping for Federated Learning:
  Convergence and Client-Level Differential Privacy", ICML 2022.
* Yang, Qiu, Liu 2022: "Taming Fat-Tailed Noise in Federated Learning",
  NeurIPS 2022.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any, Optional

import attrs
import numpy as np
import tensorflow as tf
from tensorflow_federated.python.simulation.baselines.emnist import emnist_preprocessing
import tensorflow_federated as tff

from tasks import partitions
from tff_clip.runtime import client_data

__all__ = [
    'ArrayClientData',
    'BuildArgs',
    'DATA_SOURCES',
    'Task',
    'centralized_dataset',
    'check_positive',
    'classification_model_fn',
    'client_data_from_arrays',
    'count_parameters',
    'emnist_preprocess_fn',
    'federate_arrays',
    'hold_out_validation',
    'pool_client_data',
    'refederate',
    'select_clients',
    'stratified_split',
]

# 'online': the real data set (downloaded on first use, then cached).
# 'offline': the default stand-in that needs no network (real data where the
#   project has it: scikit-learn digits, tinyshakespeare.txt).
# 'synthetic': TFF's own `get_synthetic()` sets, where TFF has one.
DATA_SOURCES = ('online', 'offline', 'synthetic')


@attrs.define(frozen=True)
class Task(tff.simulation.baselines.BaselineTask):
  """A `BaselineTask` that says what it is.

  Attributes:
    datasets: the task's `tff.simulation.baselines.BaselineTaskDatasets`.
    model_fn: no-arg callable returning a `tff.learning.models.VariableModel`.
    name: the registry name (`tasks.TASK_NAMES`).
    data_source: one of `DATA_SOURCES`.
    model_description: the model, in words.
    data_description: the data and its partition, in words.
    problem: for the papers' synthetic problems, the exact problem (see
      `tasks.synthetic`): `problem.optimum`, `problem.objective(weights)`,
      `problem.excess_loss(weights)`, `problem.report(weights)`. `None` for
      learning tasks.
    round_train_data: for problems whose samples are drawn afresh every
      round (Yang et al. 2022's fat-tailed noise), `round_train_data(client_id,
      seed)` is that client's raw data for one round, a function of `seed`
      alone; the training loop calls it with its (seed, round, client) seed
      instead of `datasets.train_data.create_tf_dataset_for_client`. `None`:
      the data is fixed.
    evaluates_on_clients_data: True where `datasets.test_data` (or
      `validation_data`) holds data of the training clients: their training
      examples (the synthetic least-squares problems evaluate f(w) on every
      client's examples; TFF's synthetic data sets train and test on one
      set) or their held-out examples (EMNIST's, Shakespeare's and Stack
      Overflow's test splits: the same writers, roles and users). Under
      user-level DP a run's evaluation then depends on private data, and is
      not covered by epsilon.
  """
  name: str = attrs.field(kw_only=True)
  data_source: str = attrs.field(kw_only=True)
  model_description: str = attrs.field(kw_only=True)
  data_description: str = attrs.field(kw_only=True)
  problem: Optional[Any] = attrs.field(default=None, kw_only=True)
  round_train_data: Optional[Any] = attrs.field(default=None, kw_only=True)
  # No default: a task says whose its test data is (forgotten, a DP run
  # would release an evaluation of the clients' data as covered).
  evaluates_on_clients_data: bool = attrs.field(kw_only=True)

  def __attrs_post_init__(self):
    """TFF's check that the model's input spec is the data's element spec.
    TFF builds a model to read the spec; a `model_fn` that declares the spec
    it passes TFF (`classification_model_fn`'s `input_spec`) is checked
    without one (a Keras model's build is most of a task's build)."""
    declared = getattr(self.model_fn, 'input_spec', None)
    if declared is None:
      super().__attrs_post_init__()
    elif declared != self.datasets.element_type_structure:
      raise ValueError(
          'Dataset element spec and model input spec do not match. Found '
          f'dataset element spec {self.datasets.element_type_structure}, but '
          f'model input spec {declared}')

  @property
  def num_clients(self) -> int:
    """Number of training clients."""
    return len(self.datasets.train_data.client_ids)

  def num_parameters(self) -> int:
    """Number of trainable scalars of the model."""
    return count_parameters(self.model_fn)


def count_parameters(model_fn) -> int:
  """Trainable scalars of `model_fn()`'s model (a Keras or TFF model)."""
  with tf.Graph().as_default():
    model = model_fn()
    return int(sum(np.prod(v.shape) for v in model.trainable_variables))


@attrs.frozen
class BuildArgs:
  """The `get_task` arguments every task builder receives, already checked."""
  data_source: str
  num_clients: Optional[int]
  partition: Optional[str]
  partition_alpha: Optional[float]
  classes_per_client: Optional[int]
  shards_per_client: Optional[int]
  seed: int
  train_client_spec: tff.simulation.baselines.ClientSpec
  eval_client_spec: tff.simulation.baselines.ClientSpec
  cache_dir: Optional[str]
  download: bool
  validation_fraction: Optional[float] = None

  def describe_partition(self, partition: str, alpha=None) -> str:
    if partition == 'dirichlet':
      return f'dirichlet(alpha={alpha})'
    if partition == 'classes_per_client':
      return f'{self.classes_per_client or 2} classes per client'
    if partition == 'shards':
      return f'{self.shards_per_client or 5} single-class shards per client'
    if partition == 'small_large':
      return '2 large + 8 small classes per client'
    return partition


def classification_model_fn(keras_model_fn, input_spec):
  """A `model_fn` for softmax classifiers over sparse integer labels."""

  def model_fn() -> tff.learning.models.VariableModel:
    return tff.learning.models.from_keras_model(
        keras_model=keras_model_fn(),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(),
        input_spec=input_spec,
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])

  model_fn.input_spec = input_spec  # Read by `Task`'s check.
  return model_fn


def _emnist_example(element):
  """TFF's EMNIST character-recognition map, on one example."""
  return tf.expand_dims(element['pixels'], axis=-1), element['label']


def emnist_preprocess_fn(spec: tff.simulation.baselines.ClientSpec):
  """TFF's EMNIST preprocessing (shuffle, repeat, take, batch, reshape).

  The same batches as `emnist_preprocessing.create_preprocess_fn(spec)`
  (`tests/test_tasks.py` compares them), with its per-batch reshape done on
  each example first (`tff_clip.runtime.client_data.ExamplewisePreprocess`), so that
  a client's examples are reshaped once per run. TFF maps the batches with
  `deterministic=False`: with several map calls in flight a client's batches
  leave in the order the calls finish; mapped examples stay in order.
  """
  return client_data.ExamplewisePreprocess(
      _emnist_example, spec,
      default_shuffle_buffer=emnist_preprocessing.MAX_CLIENT_DATASET_SIZE)


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int):
  """(train_indices, test_indices): `test_fraction` of each class held out."""
  rng = np.random.default_rng(seed)
  train, test = [], []
  for c in np.unique(labels):
    members = rng.permutation(np.flatnonzero(labels == c))
    num_test = int(round(test_fraction * members.size))
    test.append(members[:num_test])
    train.append(members[num_test:])
  return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def check_positive(value: int, name: str):
  """A count a task option gives: refused, by name, below 1."""
  if value < 1:
    raise ValueError(f'`{name}` must be a positive integer; got {value}.')


def centralized_dataset(arrays: Mapping[str, np.ndarray]) -> tf.data.Dataset:
  return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(arrays))


class ArrayClientData(tff.simulation.datasets.TestClientData):
  """TFF's in-memory `ClientData` that also hands out a client's arrays.

  `client_arrays(client_id)` is the structure of numpy arrays that
  `create_tf_dataset_for_client(client_id)` slices, so a consumer that wants
  all of a client's examples as tensors (`tff_clip.runtime.client_data`) can
  convert them directly instead of running them through `tf.data`.
  """

  def __init__(self, tensor_slices_dict, *, owned: bool = False):
    """`owned`: `tensor_slices_dict` maps each client id to an `OrderedDict`
    of numpy arrays that no one else holds (`client_data_from_arrays` makes
    them), kept as they are, read-only, where TFF would check and deep-copy
    every client's structure (a tenth of a second for 1,000 clients)."""
    if not owned:
      super().__init__(tensor_slices_dict)  # TFF's checks and deep copy.
      return
    for structure in tensor_slices_dict.values():
      for value in structure.values():
        value.flags.writeable = False
    self._tensor_slices_dict = tensor_slices_dict
    self._element_type_structure = self.create_tf_dataset_for_client(
        next(iter(tensor_slices_dict))).element_spec

  def client_arrays(self, client_id):
    """Client `client_id`'s examples: read-only views of its numpy arrays."""
    def read_only(value):
      view = np.asarray(value).view()
      view.flags.writeable = False
      return view
    # TFF keeps its (deep) copy of the dictionary it was given here.
    structure = self._tensor_slices_dict[client_id]
    if isinstance(structure, dict) and all(  # Flat, as the tasks make them.
        isinstance(v, np.ndarray) for v in structure.values()):
      return type(structure)((key, read_only(value))
                             for key, value in structure.items())
    return tf.nest.map_structure(read_only, structure)

  def select(self, client_ids) -> ArrayClientData:
    """The same data restricted to `client_ids` (in the given order)."""
    return ArrayClientData({client_id: self._tensor_slices_dict[client_id]
                            for client_id in client_ids})


def client_data_from_arrays(arrays: Mapping[str, np.ndarray],
                            client_indices) -> ArrayClientData:
  """In-memory `ClientData`: client k holds `arrays[key][client_indices[k]]`.

  Client ids are zero-padded numbers, so their sorted order is client order.
  """
  width = len(str(max(len(client_indices) - 1, 0)))

  def own(value, ix):  # A copy no one else holds (indexing may give a view).
    part = np.asarray(value)[ix]
    return part.copy() if np.may_share_memory(part, value) else part

  return ArrayClientData({
      str(k).zfill(width): collections.OrderedDict(
          (key, own(value, ix)) for key, value in arrays.items())
      for k, ix in enumerate(client_indices)
  }, owned=True)


def pool_client_data(client_data: tff.simulation.datasets.ClientData
                    ) -> collections.OrderedDict:
  """All examples of all clients, as numpy arrays (in client-id order).

  Not `create_tf_dataset_from_all_clients()`: it visits the clients in an
  unseeded random order, and a partition of the pooled examples by index
  would then differ at every build under one seed.
  """
  spec = client_data.element_type_structure
  parts = collections.OrderedDict((key, []) for key in spec)
  pooled = tf.data.Dataset.from_tensor_slices(
      sorted(client_data.client_ids)).flat_map(
          client_data.serializable_dataset_fn)
  for batch in pooled.batch(4096):
    for key in spec:
      parts[key].append(batch[key].numpy())
  if not parts or not next(iter(parts.values())):
    raise ValueError('The client data holds no examples.')
  return collections.OrderedDict(
      (key, np.concatenate(value)) for key, value in parts.items())


def select_clients(client_data: tff.simulation.datasets.ClientData,
                   num_clients: Optional[int],
                   seed: int) -> tff.simulation.datasets.ClientData:
  """A seeded random subset of `num_clients` clients (all when `None`)."""
  ids = list(client_data.client_ids)
  if num_clients is None or num_clients == len(ids):
    return client_data
  if num_clients > len(ids):
    raise ValueError(
        f'`num_clients` ({num_clients}) is larger than the {len(ids)} clients '
        'of this data set.')
  chosen = np.random.default_rng(seed).choice(len(ids), num_clients,
                                              replace=False)
  chosen_ids = sorted(ids[i] for i in chosen)
  if isinstance(client_data, ArrayClientData):  # Keeps `client_arrays`.
    return client_data.select(chosen_ids)
  return tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
      chosen_ids, client_data.serializable_dataset_fn)


def hold_out_validation(arrays: Mapping[str, np.ndarray], label_key: str,
                        args: BuildArgs):
  """(training arrays, validation data): `args.validation_fraction` held out.

  The validation examples are a stratified, seeded share of the training
  examples, taken out before the rest is split into clients: no client ever
  trains on them, and the test set stays untouched for the final report.
  Without a fraction the arrays are returned whole and the validation data
  is `None`.
  """
  if not args.validation_fraction:
    return arrays, None
  train_ix, validation_ix = stratified_split(
      arrays[label_key], args.validation_fraction, args.seed)
  pick = lambda ix: collections.OrderedDict(
      (key, value[ix]) for key, value in arrays.items())
  return pick(train_ix), centralized_dataset(pick(validation_ix))


def federate_arrays(arrays: Mapping[str, np.ndarray],
                    label_key: str,
                    args: BuildArgs,
                    *,
                    default_num_clients: int,
                    default_partition: str,
                    default_alpha: Optional[float] = None):
  """Partitions centralized arrays into clients by their labels.

  Returns:
    (client_data, description): the `ClientData` and the partition in words.
  """
  partition = args.partition or default_partition
  alpha = args.partition_alpha
  if partition == 'dirichlet' and alpha is None and args.partition is None:
    alpha = default_alpha
  num_clients = args.num_clients or default_num_clients
  client_indices = partitions.partition_labels(
      arrays[label_key], num_clients, partition, seed=args.seed,
      partition_alpha=alpha, classes_per_client=args.classes_per_client,
      shards_per_client=args.shards_per_client)
  return (client_data_from_arrays(arrays, client_indices),
          f'{num_clients} clients, {args.describe_partition(partition, alpha)}')


def refederate(client_data: tff.simulation.datasets.ClientData,
               label_key: str,
               args: BuildArgs):
  """Natural clients (optionally a subset), or the pooled data re-partitioned.

  With `args.partition` unset the data keeps its own clients (EMNIST writers,
  CIFAR-100's Pachinko allocation); `args.num_clients` then picks a seeded
  subset. With a partition, all training examples are pooled into memory and
  split by `tasks.partitions` (how Zhang et al. 2022 builds its non-IID EMNIST).

  Returns:
    (client_data, description).
  """
  if args.partition is None:
    stray = [name for name, value in (
        ('partition_alpha', args.partition_alpha),
        ('classes_per_client', args.classes_per_client),
        ('shards_per_client', args.shards_per_client)) if value is not None]
    if stray:
      raise ValueError(
          f'{", ".join("`" + s + "`" for s in stray)} needs an explicit '
          '`partition`: without one this data keeps its natural clients.')
    selected = select_clients(client_data, args.num_clients, args.seed)
    total = len(client_data.client_ids)
    count = len(selected.client_ids)
    return selected, (f'natural clients ({count} of {total})'
                      if count != total else f'natural clients ({total})')
  pooled = pool_client_data(client_data)
  return federate_arrays(
      pooled, label_key, args,
      default_num_clients=len(client_data.client_ids),
      default_partition=args.partition)
