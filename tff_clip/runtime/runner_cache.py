"""The in-process runners of cached graphs: loaded once per process.

`runner(key, client_threads)` is the `InProcessRunner` of the graph cache
entry `key` (`tff_clip.runtime.graph_cache`): the one this process already
loaded for that key and thread count, else one loaded from disk, else None.
`store(key, client_threads, runner)` writes a freshly traced runner's graphs
under `key` and keeps it loaded, where an entry may hold them: no graph with
a random op seeded at tracing (`graph_cache.has_baked_seed`). The callers
give no key where nothing may be cached (a fixed noise seed, an audited run,
TFF's workers, the cache switched off).

Runs that differ only in their seed (a sweep's, the frontier's) share one
key, one graph shape: in one worker process every training after the first
takes the loaded runner, with no disk read, no graph import and no new
client threads. A few runners are kept, the least recently used dropped
first, and all of them before the interpreter tears its modules down (a
traced function freed after that prints a TypeError traceback).

The batched path's traced cohort call (`tff_clip.runtime.batched_clients`)
is kept the same way (`traced_function`, `store_traced`): its graph under
its own key, imported instead of traced by a later process (the trace is
most of a fresh process's first batched round).

A runner holds no run's state. The state, the noise key included, is the
run's, passed to every call; the graphs' variables are reset before every
call (`tff_clip.runtime.tf_graphs`, assumption 3); nothing is kept per
client, cohort or seed. The noise key is drawn by `initialize` from a kernel
that seeds itself from OS entropy (`dp_queries.secret_key`): a runner used
again draws a fresh key, never the last run's.
"""

from __future__ import annotations

import atexit
import collections
import json
from typing import Optional

from absl import logging

from tff_clip.runtime import graph_cache
from tff_clip.runtime import simulation
from tff_clip.runtime import tf_graphs

__all__ = ['runner', 'store', 'store_traced', 'traced_function']

# The entry's graphs are named `process/<graph>`. Entries written when the
# evaluation was a traced TFF process also hold `evaluation/<graph>`: their
# keys differ (the key hashes this library's source), and such graphs are
# never read as the process's.
_PROCESS_PART = 'process'
# A traced function's entry: its graph and its inputs' and outputs' names.
_TRACED_GRAPH, _TRACED_NAMES = 'traced/graph', 'traced/names'

_KEPT = 3
# (key, client threads) -> runner, the most recently used last.
_loaded = collections.OrderedDict()
atexit.register(_loaded.clear)


def runner(key: Optional[str], client_threads: Optional[int] = None):
  """The runner of the entry `key` with `client_threads` threads: loaded in
  this process already, else from disk; None where there is none."""
  if key is None:
    return None
  found = _loaded.pop((key, client_threads), None)
  if found is None:
    found = _load(key, client_threads)
  if found is not None:
    _keep((key, client_threads), found)
  return found


def _load(key: str, client_threads: Optional[int]):
  """The runner of the disk entry `key`, or None."""
  entry = graph_cache.load(key)
  if entry is None:
    return None
  graphs = {}
  for name, data in entry.items():
    part, _, graph = name.partition('/')
    if part == _PROCESS_PART:
      graphs[graph] = data
  try:
    return simulation.InProcessRunner.from_graphs(
        graphs, client_threads=client_threads)
  except Exception as e:  # pylint: disable=broad-except
    logging.warning('Graph cache: entry %s unusable (%s); rebuilding.', key, e)
    return None


def store(key: Optional[str], client_threads: Optional[int], traced) -> None:
  """Writes `traced`'s graphs under `key` and keeps it loaded, where an
  entry may hold them (an in-process runner, no seed fixed at tracing)."""
  if key is None or not (isinstance(traced, simulation.InProcessRunner) and
                         traced.cacheable):
    return
  if graph_cache.has_baked_seed(
      simulation.parse_graphs(traced.graphs).values()):
    return
  graph_cache.store(key, {f'{_PROCESS_PART}/{name}': data
                          for name, data in traced.graphs.items()})
  _keep((key, client_threads), traced)


def _keep(loaded_key, loaded) -> None:
  _loaded.pop(loaded_key, None)
  _loaded[loaded_key] = loaded
  while len(_loaded) > _KEPT:
    _loaded.popitem(last=False)


def forget() -> None:
  """Drops every loaded runner: the next `runner` reads the disk."""
  _loaded.clear()


def traced_function(key: Optional[str], specs):
  """The function `store_traced` kept under `key`, taking the flat tensors
  of `specs` (a list of `tf.TensorSpec`) and returning its flat outputs;
  None where there is none (or it cannot be imported)."""
  entry = None if key is None else graph_cache.load(key)
  if entry is None or set(entry) != {_TRACED_GRAPH, _TRACED_NAMES}:
    return None
  try:
    names = json.loads(entry[_TRACED_NAMES])
    return _ImportedFunction(entry[_TRACED_GRAPH], names['inputs'],
                             names['outputs'], specs)
  except Exception as e:  # pylint: disable=broad-except
    logging.warning('Graph cache: entry %s unusable (%s); tracing.', key, e)
    return None


def store_traced(key: Optional[str], concrete_function) -> None:
  """Writes a traced `tf.function`'s graph under `key`, where an entry may
  hold it: nothing captured (a variable, a constant tensor) and no random
  op seeded at tracing."""
  if key is None or concrete_function.captured_inputs:
    return
  graph_def = concrete_function.graph.as_graph_def()
  if graph_cache.graph_def_has_baked_seed(graph_def):
    return
  names = {'inputs': [t.name for t in concrete_function.inputs],
           'outputs': [t.name for t in concrete_function.outputs]}
  graph_cache.store(key, {_TRACED_GRAPH: graph_def.SerializeToString(),
                          _TRACED_NAMES: json.dumps(names).encode()})


class _ImportedFunction:
  """A traced function's serialized graph, callable again: `__call__` takes
  the structure of its arguments (flattened, the tensors of `specs` in
  order) and returns its flat outputs as eager tensors."""

  def __init__(self, graph_def: bytes, input_names, output_names, specs):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    graph_def = tf.compat.v1.GraphDef.FromString(graph_def)
    if len(input_names) != len(specs):
      raise ValueError(f'{len(input_names)} inputs stored, {len(specs)} given')

    def imported(*args):
      return tf.graph_util.import_graph_def(
          graph_def, input_map=dict(zip(input_names, args)),
          return_elements=list(output_names), name='traced')

    # The graph's own nodes only (a traced function's graph holds no
    # initializer to prune away).
    self._function = tf.compat.v1.wrap_function(imported, list(specs))
    self._specs = list(specs)
    self._tf = tf

  def __call__(self, *structure):
    tf = self._tf
    return tf_graphs.call_flat(self._function, [
        leaf if isinstance(leaf, tf.Tensor) else tf.constant(leaf, s.dtype)
        for leaf, s in zip(tf.nest.flatten(structure), self._specs,
                           strict=True)])
