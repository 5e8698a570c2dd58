"""Federated tasks: Keras models and client data for EMNIST, CIFAR-10/100,
Shakespeare, Stack Overflow and scikit-learn digits, plus the seed papers'
synthetic problems.

    import tasks
    task = tasks.get_task('digits')          # offline, no network
    task = tasks.get_task('emnist_cnn', data_source='online', cache_dir=...)
    process = tff.learning.algorithms.build_weighted_fed_avg(task.model_fn, ...)

`get_task` returns a `tasks.Task`, which is a
`tff.simulation.baselines.BaselineTask`: `task.model_fn()` is a
`tff.learning.models.VariableModel`, `task.datasets.train_data` a
`ClientData` to preprocess with `task.datasets.train_preprocess_fn`, and
`task.datasets.get_centralized_test_data()` the evaluation set. Synthetic
problems also carry `task.problem` (optimum, objective, excess loss).

Modules:
  registry      -- `get_task`, `TASK_NAMES`, `describe` (the README table).
  task          -- the `Task` type and shared data plumbing.
  partitions    -- IID, Dirichlet, p-classes, shards, 8-small-2-large splits.
  sources       -- real-data caches and clear errors, offline sources.
  models        -- the Keras models (TFF's where it has them).
  digits, emnist, cifar, shakespeare, stackoverflow, synthetic -- the tasks.
"""

from tasks.partitions import PARTITION_NAMES
from tasks.partitions import partition_labels
from tasks.registry import DEFAULT_TASK
from tasks.registry import describe
from tasks.registry import describe_markdown
from tasks.registry import get_task
from tasks.registry import TASK_NAMES
from tasks.registry import task_options
from tasks.registry import TaskRow
from tasks.sources import DataNotAvailableError
from tasks.task import DATA_SOURCES
from tasks.task import Task

__all__ = [
    'DATA_SOURCES',
    'DEFAULT_TASK',
    'DataNotAvailableError',
    'PARTITION_NAMES',
    'TASK_NAMES',
    'Task',
    'TaskRow',
    'describe',
    'describe_markdown',
    'get_task',
    'partition_labels',
    'task_options',
]
