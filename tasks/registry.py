"""Every task by name: `get_task(name, ...)`, `TASK_NAMES`, `describe()`.

A task is looked up in `_SPECS`, its arguments are checked here (once, with
messages naming the argument), and its module builds it from a `BuildArgs`.

References:
* Zhang et al. 2022: "Understanding Clipping for Federated Learning:
  Convergence and Client-Level Differential Privacy", ICML 2022.
* Yang, Qiu, Liu 2022: "Taming Fat-Tailed Noise in Federated Learning",
  NeurIPS 2022.
* Das et al. 2022: "On the Convergence of DP FL on Non-Lipschitz
  Objectives, and with Normalized Client Updates".
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
import difflib
import functools
import inspect
import numbers
from typing import Optional

import attrs
import tensorflow_federated as tff

from tasks import cifar
from tasks import digits
from tasks import emnist
from tasks import models
from tasks import names
from tasks import partitions
from tasks import shakespeare
from tasks import stackoverflow
from tasks import synthetic
from tasks import task as task_lib

__all__ = [
    'DEFAULT_TASK',
    'TASK_NAMES',
    'TaskRow',
    'describe',
    'describe_markdown',
    'get_task',
    'task_options',
]

DEFAULT_TASK = 'digits'


@attrs.frozen
class _TaskSpec:
  """How to build one task, and what the README says about it."""
  name: str
  builder: Callable[..., task_lib.Task]
  # data source -> its description in the README table.
  data_sources: dict[str, str]
  default_batch_size: int
  # Images with labels accept `partition`; text and synthetic tasks do not.
  partitionable: bool
  # Clients of the online data with default arguments (None: no online data).
  online_num_clients: Optional[int] = None
  # Keras model with the online defaults, for its parameter count when it
  # differs from the offline model's (Stack Overflow's vocabulary).
  online_keras_model_fn: Optional[Callable[[], object]] = None
  online_model_description: Optional[str] = None


_SPECS = collections.OrderedDict((spec.name, spec) for spec in (
    _TaskSpec(
        'digits', digits.build,
        {'offline': 'scikit-learn digits (1,797 real 8x8), 50 IID clients'},
        default_batch_size=10, partitionable=True),
    _TaskSpec(
        'emnist_cnn',
        functools.partial(emnist.build, model='cnn'),
        {'online': 'TFF EMNIST-62, writers as clients',
         'offline': 'scikit-learn digits as 28x28 EMNIST (offline_data='
                    "'mnist': 5,000 real 28x28 MNIST), 50 IID clients",
         'synthetic': 'TFF emnist.get_synthetic()'},
        default_batch_size=20, partitionable=True,
        online_num_clients=emnist.ONLINE_NUM_CLIENTS[False]),
    _TaskSpec(
        'emnist_mlp',
        functools.partial(emnist.build, model='mlp', dropout=None),
        {'online': 'TFF EMNIST-10 (digits), writers as clients',
         'offline': 'scikit-learn digits as 28x28 EMNIST (offline_data='
                    "'mnist': 5,000 real 28x28 MNIST), 50 IID clients",
         'synthetic': 'TFF emnist.get_synthetic()'},
        default_batch_size=20, partitionable=True,
        online_num_clients=emnist.ONLINE_NUM_CLIENTS[True]),
    _TaskSpec(
        'emnist_logreg',
        functools.partial(emnist.build, model='logreg', dropout=None),
        {'online': 'TFF EMNIST-10 (digits), writers as clients',
         'offline': 'scikit-learn digits as 28x28 EMNIST (offline_data='
                    "'mnist': 5,000 real 28x28 MNIST), 50 IID clients",
         'synthetic': 'TFF emnist.get_synthetic()'},
        default_batch_size=20, partitionable=True,
        online_num_clients=emnist.ONLINE_NUM_CLIENTS[True]),
    _TaskSpec(
        'cifar10_cnn', functools.partial(cifar.build_cifar10, model='cnn'),
        {'online': 'CIFAR-10 (tensorflow-datasets), Dirichlet(1.0) over '
                   '100 clients',
         'offline': 'generated CIFAR-10-format images (not real), '
                    'Dirichlet(1.0) over 100 clients'},
        default_batch_size=20, partitionable=True,
        online_num_clients=cifar.DEFAULT_CIFAR10_NUM_CLIENTS),
    _TaskSpec(
        'cifar10_resnet18',
        functools.partial(cifar.build_cifar10, model='resnet18'),
        {'online': 'CIFAR-10 (tensorflow-datasets), Dirichlet(1.0) over '
                   '100 clients',
         'offline': 'generated CIFAR-10-format images (not real), '
                    'Dirichlet(1.0) over 100 clients'},
        default_batch_size=20, partitionable=True,
        online_num_clients=cifar.DEFAULT_CIFAR10_NUM_CLIENTS),
    _TaskSpec(
        'cifar100_resnet18', cifar.build_cifar100,
        {'online': 'TFF CIFAR-100 (Pachinko allocation)',
         'offline': 'TFF cifar100.get_synthetic()'},
        default_batch_size=20, partitionable=True,
        online_num_clients=cifar.ONLINE_CIFAR100_NUM_CLIENTS),
    _TaskSpec(
        'shakespeare', shakespeare.build,
        {'online': 'TFF Shakespeare (LEAF), play roles as clients',
         'offline': 'tinyshakespeare.txt, one client per role',
         'synthetic': 'TFF shakespeare.get_synthetic()'},
        default_batch_size=4, partitionable=False,
        online_num_clients=shakespeare.ONLINE_NUM_CLIENTS),
    _TaskSpec(
        'stackoverflow_next_word', stackoverflow.build_word_prediction,
        {'online': 'TFF Stack Overflow, users as clients, 10,000 words',
         'offline': 'TFF stackoverflow.get_synthetic()'},
        default_batch_size=16, partitionable=False,
        online_num_clients=stackoverflow.ONLINE_NUM_CLIENTS,
        online_keras_model_fn=lambda: models.create_stackoverflow_lstm(
            stackoverflow.extended_vocab_size(10000)),
        online_model_description=(
            'LSTM 670, embedding 96, vocabulary 10000 + 4 special tokens')),
    _TaskSpec(
        'stackoverflow_tag', stackoverflow.build_tag_prediction,
        {'online': 'TFF Stack Overflow, users as clients, 10,000 words, '
                   '500 tags',
         'offline': 'TFF stackoverflow.get_synthetic()'},
        default_batch_size=16, partitionable=False,
        online_num_clients=stackoverflow.ONLINE_NUM_CLIENTS,
        online_keras_model_fn=lambda: models.create_stackoverflow_tag_model(
            10000, 500),
        online_model_description=(
            'logistic regression 10000 words -> 500 tags')),
    _TaskSpec(
        'heterogeneous_quadratic', synthetic.build_heterogeneous_quadratic,
        {'offline': 'generated: Das et al. Sec. 5.3, n=100, d=200'},
        default_batch_size=20, partitionable=False),
    _TaskSpec(
        'fat_tailed_quadratic', synthetic.build_fat_tailed_quadratic,
        {'offline': 'generated: Yang et al. Sec. 5.1, Cauchy noise, m=5'},
        default_batch_size=10, partitionable=False),
    _TaskSpec(
        'claim21_quadratic', synthetic.build_claim21_quadratic,
        {'offline': 'generated: Zhang et al. Claim 2.1, c=1, k=5'},
        default_batch_size=1, partitionable=False),
    _TaskSpec(
        'eq24_quadratic', synthetic.build_eq24_quadratic,
        {'offline': 'generated: Zhang et al. eq. (24)'},
        default_batch_size=1, partitionable=False),
))

TASK_NAMES = tuple(_SPECS)
# The TensorFlow-free list the command line validates against must agree.
if {n: tuple(s.data_sources) for n, s in _SPECS.items()} != {
    n: tuple(v) for n, v in names.DATA_SOURCES.items()} or tuple(
        n for n, s in _SPECS.items() if s.partitionable) != names.PARTITIONABLE:
  raise ImportError('tasks/names.py disagrees with tasks/registry.py: update '
                    'both when a task or data source is added.')


def _spec(name: str) -> _TaskSpec:
  if not isinstance(name, str):
    raise TypeError(f'`name` must be a str; got {type(name).__name__}.')
  if name not in _SPECS:
    close = difflib.get_close_matches(name, TASK_NAMES, n=1)
    hint = f' Did you mean {close[0]!r}?' if close else ''
    raise ValueError(
        f'Unknown task {name!r}.{hint} Known tasks: {", ".join(TASK_NAMES)}.')
  return _SPECS[name]


def _check_optional_positive_int(value, name: str):
  if value is None:
    return None
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise TypeError(f'`{name}` must be an int or None; got '
                    f'{type(value).__name__}.')
  if value <= 0:
    raise ValueError(f'`{name}` must be positive; got {value}.')
  return int(value)


def task_options(name: str) -> tuple[str, ...]:
  """The options task `name` accepts (`get_task(name, **options)`).

  E.g. ('dimension', 'noise', 'tail_index', 'noise_scale', ...) for
  'fat_tailed_quadratic', ('offline_data',) for the EMNIST tasks. The
  training program takes them as `--task_option=key=value`.
  """
  builder = _spec(name).builder
  bound = builder.keywords if isinstance(builder, functools.partial) else {}
  target = builder.func if isinstance(builder, functools.partial) else builder
  return tuple(
      p.name for p in inspect.signature(target).parameters.values()
      if p.kind == inspect.Parameter.KEYWORD_ONLY and p.name not in bound)


# The TensorFlow-free option lists and client counts must agree too.
if {n: task_options(n) for n in TASK_NAMES} != names.TASK_OPTIONS or any(
    names.DEFAULT_NUM_CLIENTS[key] != count for key, count in (
        (('digits', 'offline'), digits.DEFAULT_NUM_CLIENTS),
        (('emnist_cnn', 'offline'), emnist.DEFAULT_OFFLINE_NUM_CLIENTS),
        (('cifar10_cnn', 'offline'), cifar.DEFAULT_CIFAR10_NUM_CLIENTS))):
  raise ImportError('tasks/names.py disagrees with tasks/registry.py: update '
                    'TASK_OPTIONS and DEFAULT_NUM_CLIENTS with the tasks.')


def _check_options(spec: _TaskSpec, options: dict):
  accepted = list(task_options(spec.name))
  unknown = sorted(set(options) - set(accepted))
  if unknown:
    raise TypeError(
        f'Task {spec.name!r} has no option(s) {unknown}; its options are '
        f'{accepted or "none"}.')


def get_task(name: str = DEFAULT_TASK,
             *,
             data_source: str = 'offline',
             num_clients: Optional[int] = None,
             partition: Optional[str] = None,
             partition_alpha: Optional[float] = None,
             classes_per_client: Optional[int] = None,
             shards_per_client: Optional[int] = None,
             seed: int = 0,
             train_batch_size: Optional[int] = None,
             eval_batch_size: Optional[int] = None,
             local_epochs: int = 1,
             max_elements_per_client: Optional[int] = None,
             shuffle_buffer_size: Optional[int] = None,
             cache_dir: Optional[str] = None,
             download: bool = True,
             validation_fraction: Optional[float] = None,
             **task_options) -> task_lib.Task:
  """Builds the task `name` (one of `TASK_NAMES`).

  Args:
    name: the task; `describe()` lists them.
    data_source: 'online' (the real data, downloaded once into `cache_dir`),
      'offline' (no network: scikit-learn digits, tinyshakespeare.txt, TFF's
      synthetic sets, generated data), or 'synthetic' (TFF's
      `get_synthetic()`). Which ones a task has: `describe()`.
    num_clients: number of training clients. For data with natural clients
      (EMNIST writers, Shakespeare roles, Stack Overflow users, CIFAR-100),
      a seeded random subset; for partitioned data, the number of parts;
      for synthetic problems, n or m. `None`: the
      task's default.
    partition: one of `tasks.PARTITION_NAMES` (image tasks only). With natural
      clients, `None` keeps them and a name pools and re-splits the data.
    partition_alpha: Dirichlet concentration (> 0), for 'dirichlet'.
    classes_per_client: p of 'classes_per_client' (default 2).
    shards_per_client: shards of 'shards' (default 5).
    seed: seeds partitions, client subsets and generated data.
    train_batch_size: client batch size (`None`: the task's default).
    eval_batch_size: centralized evaluation batch size (`None`: TFF's
      default for the task).
    local_epochs: passes over each client's data per round.
    max_elements_per_client: cap on examples per client and round, after
      repetition (TFF's `ClientSpec.max_elements`).
    shuffle_buffer_size: client shuffle buffer (`None`: the task's default;
      1: no shuffling).
    cache_dir: where online data is cached: TFF's folder (default `~/.tff`),
      or tensorflow-datasets' data folder for CIFAR-10 (default
      `~/tensorflow_datasets`).
    download: whether online data missing from the cache is downloaded
      (True) or reported at once as a `DataNotAvailableError` (False).
    validation_fraction: in (0, 1): hold out this stratified share of the
      training examples as `task.datasets.validation_data` before the rest is
      split into clients (tasks whose data is held as arrays: digits, the
      offline EMNIST and CIFAR-10 data). `None`: no holdout; the task keeps
      its own validation data, if it has any.
    **task_options: options of the task (e.g. `sequence_length` for
      Shakespeare, `tail_index` for `fat_tailed_quadratic`); an unknown one
      is a `TypeError` that lists the task's options.

  Returns:
    A `tasks.Task`, a `tff.simulation.baselines.BaselineTask`.

  Raises:
    ValueError: unknown task, data source or partition; a non-positive
      count or `partition_alpha`; more clients than examples.
    TypeError: wrongly typed argument or unknown task option.
    DataNotAvailableError: online data neither cached nor downloadable.
  """
  spec = _spec(name)
  if data_source not in task_lib.DATA_SOURCES:
    raise ValueError(f'Unknown `data_source` {data_source!r}; expected one '
                     f'of {task_lib.DATA_SOURCES}.')
  if data_source not in spec.data_sources:
    raise ValueError(
        f'Task {name!r} has no {data_source!r} data; it has '
        f'{tuple(spec.data_sources)}.')
  if partition is not None:
    if partition not in partitions.PARTITION_NAMES:
      raise ValueError(f'Unknown `partition` {partition!r}; expected one of '
                       f'{partitions.PARTITION_NAMES}.')
    if not spec.partitionable:
      raise ValueError(f'Task {name!r} cannot be re-partitioned (it has '
                       f'natural or generated clients); got partition='
                       f'{partition!r}.')
  if partition_alpha is not None:
    partitions.check_partition_alpha(partition_alpha)
  num_clients = _check_optional_positive_int(num_clients, 'num_clients')
  classes_per_client = _check_optional_positive_int(classes_per_client,
                                                    'classes_per_client')
  shards_per_client = _check_optional_positive_int(shards_per_client,
                                                   'shards_per_client')
  train_batch_size = _check_optional_positive_int(
      train_batch_size, 'train_batch_size') or spec.default_batch_size
  eval_batch_size = _check_optional_positive_int(eval_batch_size,
                                                 'eval_batch_size')
  local_epochs = _check_optional_positive_int(local_epochs, 'local_epochs')
  if local_epochs is None:
    raise ValueError('`local_epochs` must be a positive int; got None.')
  max_elements_per_client = _check_optional_positive_int(
      max_elements_per_client, 'max_elements_per_client')
  shuffle_buffer_size = _check_optional_positive_int(shuffle_buffer_size,
                                                     'shuffle_buffer_size')
  if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
    raise TypeError(f'`seed` must be an int; got {type(seed).__name__}.')
  if validation_fraction is not None:
    if (isinstance(validation_fraction, bool) or
        not isinstance(validation_fraction, numbers.Real) or
        not 0.0 < validation_fraction < 1.0):
      raise ValueError('`validation_fraction` must be in (0, 1); got '
                       f'{validation_fraction!r}.')
  _check_options(spec, task_options)
  args = task_lib.BuildArgs(
      data_source=data_source,
      num_clients=num_clients,
      partition=partition,
      partition_alpha=partition_alpha,
      classes_per_client=classes_per_client,
      shards_per_client=shards_per_client,
      seed=int(seed),
      train_client_spec=tff.simulation.baselines.ClientSpec(
          num_epochs=local_epochs, batch_size=train_batch_size,
          max_elements=max_elements_per_client,
          shuffle_buffer_size=shuffle_buffer_size),
      eval_client_spec=(None if eval_batch_size is None else
                        tff.simulation.baselines.ClientSpec(
                            num_epochs=1, batch_size=eval_batch_size,
                            shuffle_buffer_size=1)),
      cache_dir=cache_dir,
      download=bool(download),
      validation_fraction=validation_fraction)
  task = spec.builder(args, **task_options)
  if validation_fraction is not None and task.datasets.validation_data is None:
    raise ValueError(
        f'`validation_fraction`: task {name!r} with {data_source!r} data '
        'cannot hold out validation examples (only data held as arrays can: '
        'digits, the offline EMNIST and CIFAR-10 data).')
  return task


@attrs.frozen
class TaskRow:
  """One line of the README's task table."""
  name: str
  model: str
  num_parameters: int
  data_source: str
  num_clients: int


def describe(names: Optional[Iterable[str]] = None,
             data_sources: Iterable[str] = task_lib.DATA_SOURCES
            ) -> list[TaskRow]:
  """Rows (name, model, parameters, data source, clients) for the README.

  Offline and synthetic rows are measured by building the task with its
  defaults (no network). Online rows take the client count of the real data
  set (TFF's documented training clients) and count the model built with the
  online defaults.

  Args:
    names: tasks to describe (default: all of `TASK_NAMES`).
    data_sources: which of `DATA_SOURCES` to list.

  Returns:
    A list of `TaskRow`, tasks in `TASK_NAMES` order, data sources in
    'online', 'offline', 'synthetic' order.
  """
  rows = []
  wanted_sources = tuple(data_sources)
  for name in (TASK_NAMES if names is None else tuple(names)):
    spec = _spec(name)
    offline_source = next(s for s in ('offline', 'synthetic')
                          if s in spec.data_sources)
    built = get_task(name, data_source=offline_source)
    for source in task_lib.DATA_SOURCES:
      if source not in spec.data_sources or source not in wanted_sources:
        continue
      model = built.model_description
      if source == 'online':
        model = spec.online_model_description or model
        num_parameters = (
            built.num_parameters() if spec.online_keras_model_fn is None else
            task_lib.count_parameters(spec.online_keras_model_fn))
        num_clients = spec.online_num_clients
      else:
        task = (built if source == offline_source else
                get_task(name, data_source=source))
        num_parameters, num_clients = task.num_parameters(), task.num_clients
      rows.append(TaskRow(name, model, num_parameters,
                          f'{source}: {spec.data_sources[source]}',
                          num_clients))
  return rows


def describe_markdown(rows: Optional[Iterable[TaskRow]] = None) -> str:
  """`describe()` as a markdown table."""
  rows = describe() if rows is None else rows
  cell = lambda text: (text.replace('|', r'\|').replace('<', '&lt;')
                       .replace('>', '&gt;'))
  lines = ['| task | model | parameters | data source | clients |',
           '|---|---|---:|---|---:|']
  lines += [f'| `{r.name}` | {cell(r.model)} | {r.num_parameters:,} | '
            f'{cell(r.data_source)} | {r.num_clients:,} |' for r in rows]
  return '\n'.join(lines)
