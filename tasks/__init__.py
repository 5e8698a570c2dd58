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

Importing `tasks` imports `tff_clip` (no TensorFlow), so it sets exactly
what importing `tff_clip` sets (tff_clip/__init__.py): `TF_CPP_MIN_LOG_LEVEL`
to 3 unless it is set (TensorFlow's C++ log stays quiet when `tasks` is
imported before TensorFlow; set the variable yourself to see the log), and
the exit hook that closes TFF's default context without TFF's traceback.
"""

import importlib as _importlib

import tff_clip as _tff_clip  # pylint: disable=unused-import

# Exports are loaded on first use (PEP 562), so that `tasks.names` -- what the
# command line validates flags against -- imports without TensorFlow.
_EXPORTS = {
    'DATA_SOURCES': 'tasks.task',
    'DEFAULT_TASK': 'tasks.registry',
    'DataNotAvailableError': 'tasks.sources',
    'PARTITION_NAMES': 'tasks.names',
    'TASK_NAMES': 'tasks.names',
    'Task': 'tasks.task',
    'TaskRow': 'tasks.registry',
    'describe': 'tasks.registry',
    'describe_markdown': 'tasks.registry',
    'get_task': 'tasks.registry',
    'partition_labels': 'tasks.partitions',
    'task_options': 'tasks.registry',
}


def __getattr__(name):
  if name in _EXPORTS:
    return getattr(_importlib.import_module(_EXPORTS[name]), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


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
