"""Which traced process a session takes: the graph cache's keys.

A session's process is traced once per graph shape and kept on disk
(`tff_clip.runtime.graph_cache`) and in memory (`tff_clip.runtime.
runner_cache`). `graph_cache_key` names the entry: every configuration field
that shapes a graph, none that only chooses where a run writes
(`NOT_BUILT_FROM`), its data (`DATA_ONLY`) or its server's hyperparameters
(`tff_clip.program.hyperparameters`). `cached_runner` finds a session's
runner: the entry traced with its very hyperparameters, else the graph
shape's entry with the session's own state (`hyperparameters.rebase`), else
none (the session traces its process). No TensorFlow import.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import os
import sys
from typing import Optional

from tff_clip.program import hyperparameters
from tff_clip.program.config import TrainConfig

__all__ = ['DATA_ONLY', 'NOT_BUILT_FROM', 'cached_runner', 'claimed_runner',
           'graph_cache_key', 'not_built_from', 'trace_key']

# What a session is not built from: a later run in this process that differs
# from an earlier one only in these reuses its session (`session`).
NOT_BUILT_FROM = ('root_output_dir', 'experiment_name', 'rounds', 'eval_every',
                   'progress', 'checkpoint_every', 'checkpoint_interval_s',
                   'release_uncovered_metrics')


def not_built_from(config: TrainConfig) -> tuple[str, ...]:
  """`NOT_BUILT_FROM` for `config`: less `rounds` where its DP noise is
  correlated (BLT's factorization is computed for the run's rounds, a
  constant of its graphs and its state; banded and tree noise are kept with
  it, whose run lengths are rarely varied)."""
  if config.private and config.noise.correlated:
    return tuple(name for name in NOT_BUILT_FROM if name != 'rounds')
  return NOT_BUILT_FROM


# What the traced graphs are not built from either, though a session is:
# which data, cohorts and initial weights a run trains from. Out of the disk
# key (`graph_cache_key`), so runs that differ only in these share one entry.
# Each reaches the session outside the traced process (read in `Session`):
DATA_ONLY = (
    # The task's data split, client subset and partition, the cohorts
    # (`ClientSampler`), each client's data order (`ClientDatasets`) and the
    # initial weights (`task_values.initial_model_weights`, numpy set over
    # `initialize`'s by `Session.initial_state`: so are a synthetic
    # problem's, which its model's initializer holds). The DP noise key is
    # drawn from OS entropy in the graph (a fixed --noise_seed is never
    # cached).
    'seed',
    # The population: the sampler's, and the accountant's (the noise
    # multiplier it calibrates is in the key as resolved).
    'num_clients',
    # How the examples are dealt to the clients (the task's ClientData).
    'partition', 'partition_alpha',
    # Examples held out of training (the task's validation data).
    'validation_fraction',
    # What the server-side evaluation (plain TensorFlow, not cached) reads.
    'eval_split',
    # Where online data is read from.
    'cache_dir',
    # The in-process runner's threads, given to it when it is loaded.
    'max_concurrent_clients',
)




def _project_packages(module: str, source: str) -> list:
  """The imported top-level packages and modules beside the builder's own
  (this project: scripts/, tasks/, tff_clip/): an edited model in any of
  them is another graph."""
  top = sys.modules.get(module.split('.')[0])
  top_file = os.path.realpath(getattr(top, '__file__', None) or source)
  package = os.path.basename(top_file) == '__init__.py'
  root = os.path.dirname(os.path.dirname(top_file) if package else top_file)
  found = {top_file if not package else os.path.dirname(top_file)}
  for name, imported in list(sys.modules.items()):
    path = getattr(imported, '__file__', None)
    if '.' in name or not path:
      continue
    path = os.path.realpath(path)
    if os.path.basename(path) == '__init__.py':
      if os.path.dirname(os.path.dirname(path)) == root:
        found.add(os.path.dirname(path))
    elif os.path.dirname(path) == root and path.endswith('.py'):
      found.add(path)
  return sorted(found)


def graph_cache_key(config: TrainConfig, task_builder, noise_multiplier,
                     task=None, exact: bool = False) -> Optional[str]:
  """The cache key of the session's graphs, or None where they are not
  cached: runs on TFF's workers, audited runs, a fixed `--noise_seed` (a
  constant of the graph: it must never reach a file), a task builder without
  a stable name (a lambda, a local function). `task`: the built task, whose
  clients' element spec the key also holds (the data-only fields choose
  data, never its shape).

  The key covers the builder's source and every imported top-level package
  or module beside it (`_project_packages`: an edited model is another
  graph). It leaves out the hyperparameters (`hyperparameters.shape`): runs
  that differ only in them share one entry, each with its own state
  (`hyperparameters.rebase`). `exact`: the key with them, for the runs whose
  hyperparameters turn out to be constants of a graph."""
  import inspect  # pylint: disable=g-import-not-at-top
  from tff_clip.runtime import graph_cache  # pylint: disable=g-import-not-at-top
  name = (f'{getattr(task_builder, "__module__", "")}.'
          f'{getattr(task_builder, "__qualname__", "<unnamed>")}')
  if (config.executor != 'inprocess' or config.audit_canaries or
      config.noise_seed is not None or '<' in name or
      graph_cache.directory() is None):
    return None
  try:  # The builder's code, and the models it imports, shape the graphs.
    builder_source = graph_cache.sources_hash(_project_packages(
        task_builder.__module__, inspect.getsourcefile(task_builder)))
  except (TypeError, OSError):
    return None
  # Every field but those that shape no graph (where and how long a run
  # writes, which data and initial weights it trains from) and the
  # hyperparameters. One entry per graph shape: a sweep's seeds and cells
  # share it.
  defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)
              if f.name in not_built_from(config) + DATA_ONLY}
  element_spec = (None if task is None else
                  task.datasets.element_type_structure)
  config = dataclasses.replace(config, **defaults)
  description = (hyperparameters.shape(config, noise_multiplier), name,
                 builder_source, element_spec)
  if exact:
    description += (hyperparameters.values(config, noise_multiplier),)
  return graph_cache.entry_key(repr(description))


def cached_runner(config: TrainConfig, task_builder, noise_multiplier, task,
                  server_parts: hyperparameters.ServerParts):
  """(runner or None, the key a traced one is stored under).

  The graph shape's entry where it was traced with these very
  hyperparameters, else their own entry, else the shape's entry with this
  run's state (`hyperparameters.rebase`), else None: the session
  traces its process, to be stored under the shape's key, or under the exact
  key where the shape's entry holds other graphs.
  """
  from tff_clip.runtime import runner_cache  # pylint: disable=g-import-not-at-top
  threads = config.max_concurrent_clients
  keys = [graph_cache_key(config, task_builder, noise_multiplier, task,
                           exact) for exact in (True, False)]
  exact_key, shape_key = keys
  shared = runner_cache.runner(shape_key, threads)
  if shared is not None and hyperparameters.traced_with(
      shared, config, noise_multiplier):
    return shared, None
  found = runner_cache.runner(exact_key, threads)
  if found is not None:
    return found, None
  if shared is None:
    return None, shape_key
  memo = (exact_key, threads)
  rebased = _rebased.pop(memo, None)
  if rebased is None or rebased.traced_runner is not shared:
    rebased = hyperparameters.rebase(shared, config, noise_multiplier,
                                     server_parts)
  if isinstance(rebased, hyperparameters.Rebased):
    _rebased[memo] = rebased
    while len(_rebased) > _REBASED_KEPT:
      _rebased.popitem(last=False)
  return rebased, exact_key


@contextlib.contextmanager
def claimed_runner(config: TrainConfig, task_builder, noise_multiplier, task,
                   server_parts: hyperparameters.ServerParts):
  """`cached_runner`, with the entry to trace locked for the block
  (`graph_cache.entry_lock`): where none is cached, the caller traces and
  stores it inside the block while another process that needs the same
  entry waits, and that one then finds it (asked again once the lock is
  held) instead of tracing it a second time."""
  from tff_clip.runtime import graph_cache  # pylint: disable=g-import-not-at-top
  found = cached_runner(config, task_builder, noise_multiplier, task,
                        server_parts)
  if found[0] is not None or found[1] is None:
    yield found
    return
  with graph_cache.entry_lock(found[1]):
    yield cached_runner(config, task_builder, noise_multiplier, task,
                        server_parts)


def trace_key(config: TrainConfig, task_builder, noise_multiplier, task,
              runner) -> Optional[str]:
  """The key a session's batched cohort call is traced under (None: not
  kept). The graph shape's key where `runner` runs the shape's entry (its
  own trace, or `hyperparameters.rebase`d onto it): the entry's aggregator
  graphs were compared with this run's (`rebase`), so the query the cohort's
  call holds is the same graph for every value of the hyperparameters, read
  from the state. Else the exact key (the values a graph may hold)."""
  from tff_clip.runtime import runner_cache  # pylint: disable=g-import-not-at-top
  shape = graph_cache_key(config, task_builder, noise_multiplier, task)
  if shape is not None:
    entry = runner_cache.runner(shape, config.max_concurrent_clients)
    if entry is not None and getattr(runner, 'traced_runner',
                                     runner) is entry:
      return shape
  return graph_cache_key(config, task_builder, noise_multiplier, task,
                         exact=True)


# The runners `rebase` made in this process, by exact key (every field the
# graphs are built from, and the hyperparameters' values) and threads: the
# later seeds of a grid's cell take their cell's, without building and
# comparing its aggregator and server optimizer again (seconds a cell). A
# `Rebased` holds no run's state; its `initialize` draws a fresh noise key
# on every call. The least recently used dropped first.
_REBASED_KEPT = 8
_rebased = collections.OrderedDict()
atexit.register(_rebased.clear)  # As `runner_cache`'s runners.
