"""In-process simulation of TFF learning processes: no C++ worker, no gRPC.

`InProcessRunner(process)` runs a `tff.learning.templates.LearningProcess`
(or any `IterativeProcess` whose `next` is `(state@SERVER, data@CLIENTS) ->
(state@SERVER, output@SERVER)`) through its `MapReduceForm` (TFF's
`tff.backends.mapreduce.get_map_reduce_form_for_computation`), whose pieces
are plain TensorFlow graphs that `tff_clip.runtime.tf_graphs` imports into this
process:

  client_input = prepare(state)
  accumulator  = zero()
  for each client:  update, *secure = work(data_i, client_input)
                    accumulator = accumulate(accumulator, update)
  state, output = update(state, (report(accumulator), sum(secure)...))

which is what TFF's own runtime computes: one accumulator suffices on one
machine (`merge` combines partial accumulators of several workers), the
random ops live only in `update` (fresh noise every round), and the secure
sums of the form are plain sums here, as in TFF's native simulation runtime
(`secure_modular_sum` reduced modulo its modulus). `work` runs on
`client_threads` threads at once, each with its own import of the graph (the
pieces hold variables; each import has its own), and `accumulate` takes the
clients' updates in the order given, on the calling thread: the same sums,
bit for bit, whatever the number of threads. A round with no clients runs
`update` on the empty aggregate (`zero`, `report`), as TFF's definition of
`federated_sum` over no clients would.

Client datasets are iterated as TensorFlow iterates them: a dataset object
that reshuffles on every pass (`shuffle(..., seed=N)`, by default) given to
two calls yields two orders, where TFF's runtime serializes the dataset and
starts it afresh on each call (copying it so here would cost ~1.8 ms a
client). Build each round's datasets anew, as `scripts.train` does.

A computation that cannot be written as a `MapReduceForm` raises a
`ValueError` at construction naming `--executor=local` (TFF's C++ runtime) as
the one to use.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import queue
import weakref
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.proto.v0 import computation_pb2 as pb
from tensorflow_federated.python.core.impl.types import type_serialization

from tff_clip import checks
from tff_clip.runtime import tf_graphs

__all__ = ['InProcessRunner', 'default_client_threads', 'map_reduce_form',
           'process_graphs']


# Threads beyond a few cores gain little: every client's `work` holds
# Python's lock while its arguments are flattened and its results wrapped.
MAX_DEFAULT_CLIENT_THREADS = 4


def default_client_threads() -> int:
  """One client thread per CPU this process may use, at most 4."""
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:  # Not on Linux.
    cores = os.cpu_count() or 1
  return max(1, min(cores, MAX_DEFAULT_CLIENT_THREADS))


# Each process's form, compiled once (the split runner needs it too).
_FORMS = weakref.WeakKeyDictionary()


def map_reduce_form(process) -> Any:
  """`process.next` as a `MapReduceForm`, or a ValueError naming the fix."""
  try:
    return _FORMS[process]
  except (KeyError, TypeError):
    pass
  try:
    form = tff.backends.mapreduce.get_map_reduce_form_for_computation(
        process.next)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(
        'This process does not compile to TFF\'s MapReduceForm, so it cannot '
        'run in-process (`executor=inprocess`); run it with '
        f'`--executor=local` (TFF\'s C++ runtime). TFF said: {e}') from e
  try:
    _FORMS[process] = form
  except TypeError:  # Not weakly referable: compiled again next time.
    pass
  return form


# The parts of a `MapReduceForm` the runner calls.
_FORM_PARTS = ('prepare', 'work', 'zero', 'accumulate', 'report', 'update',
               'secure_modular_sum_modulus')


def process_graphs(process) -> dict[str, bytes]:
  """All the runner needs of `process`, as serialized protos: the parts of
  its `MapReduceForm`, its state's initialization, `get_model_weights` and
  `set_model_weights` (`pb.Computation`s, types included) and the type of
  `next` (`pb.Type`). A pure function of the process's graphs, so it can be
  cached (`tff_clip.runtime.graph_cache`)."""
  form = map_reduce_form(process)
  computations = {name: getattr(form, name) for name in _FORM_PARTS}
  computations['initialize'] = (
      tff.backends.mapreduce.get_state_initialization_computation(
          process.initialize))
  for name in ('get_model_weights', 'set_model_weights'):
    if getattr(process, name, None) is not None:
      computations[name] = getattr(process, name)
  graphs = {name: tff.framework.serialize_computation(c).SerializeToString()
            for name, c in computations.items()}
  graphs['next_type'] = type_serialization.serialize_type(
      process.next.type_signature).SerializeToString()
  containers = _container_types(process)
  trees = {name: tf_graphs.container_tree(t) for name, t in containers.items()}
  try:  # Only where the containers come back as they were.
    restored = _restore_types(graphs, trees)
  except ValueError:
    restored = None
  if restored is not None and all(
      tf_graphs.container_tree(restored[name]) == trees[name] and
      restored[name].is_equivalent_to(containers[name]) for name in trees):
    graphs['containers'] = json.dumps(trees, sort_keys=True).encode()
  return graphs


def _container_types(process) -> dict[str, Any]:
  """The types the runner's results are packed as, Python containers and
  all: `next`'s, the state's initialization's, and the model weights'."""
  types = {'next': process.next.type_signature,
           'initialize': tff.FunctionType(
               None, process.initialize.type_signature.result.member)}
  types.update({name: getattr(process, name).type_signature
                for name in ('get_model_weights', 'set_model_weights')
                if getattr(process, name, None) is not None})
  return types


def _restore_types(graphs, trees) -> dict[str, Any]:
  types = {'next': type_serialization.deserialize_type(
      _parse(pb.Type, graphs['next_type']))}
  for name in trees:
    if name != 'next':
      types[name] = type_serialization.deserialize_type(
          _parse(pb.Computation, graphs[name]).type)
  return {name: tf_graphs.with_containers(t, trees[name])
          for name, t in types.items()}


def _parse(message_class, data: bytes):
  message = message_class()
  message.ParseFromString(data)
  return message


# What `graphs` may hold besides computations: the type of `next`, the
# containers, and notes a caller keeps with the graphs (JSON, e.g. the
# values the process was traced with: `tff_clip.program.hyperparameters`).
_NOT_COMPUTATIONS = ('next_type', 'containers', 'annotations')


def parse_graphs(graphs) -> dict[str, Any]:
  """The `pb.Computation`s of `process_graphs`, by name."""
  return {name: _parse(pb.Computation, data) for name, data in graphs.items()
          if name not in _NOT_COMPUTATIONS}


def _zeros(type_spec) -> list:
  return [np.zeros(t.shape, t.dtype) for t in _tensor_types(type_spec)]


def _tensor_types(type_spec) -> list:
  if isinstance(type_spec, tff.StructType):
    return [leaf for _, t in tff.structure.to_elements(type_spec) for leaf in _tensor_types(t)]
  if isinstance(type_spec, tff.TensorType):
    return [type_spec]
  raise TypeError(f'Expected tensors; got {type_spec}.')


class InProcessRunner:
  """Runs a TFF learning process's computations in this Python process.

  `initialize()`, `next(state, client_datasets)`, `get_model_weights(state)`
  and `set_model_weights(state, weights)` take and return what the process's
  own computations do under TFF's runtime (numpy leaves in TFF's Python
  containers: `LearningProcessOutput`, `LearningAlgorithmState`, ...).

  `client_threads`: how many clients' `work` run at once (default: one per
  CPU core, at most `MAX_DEFAULT_CLIENT_THREADS`). The result does not depend
  on it. The threads run under TensorFlow's default device placement: a
  `tf.device` scope around `next` does not reach them (pass
  `client_threads=1` to run every client on the calling thread).
  """

  def __init__(self, process, client_threads: Optional[int] = None):
    graphs = process_graphs(process)
    # Where the graphs can be cached, they are used as a cache entry would
    # be: a run on a cache hit is the same run.
    types = (_restore_types(graphs, json.loads(graphs['containers']))
             if 'containers' in graphs else _container_types(process))
    self._build(graphs, types, client_threads)

  @classmethod
  def from_graphs(cls, graphs, client_threads: Optional[int] = None):
    """The runner of the process whose `process_graphs` are `graphs`
    (which must hold its containers: `cacheable`)."""
    runner = cls.__new__(cls)
    types = _restore_types(graphs, json.loads(graphs['containers']))
    runner._build(graphs, types, client_threads)  # pylint: disable=protected-access
    return runner

  @property
  def cacheable(self) -> bool:
    """Whether `from_graphs(self.graphs)` rebuilds this runner."""
    return 'containers' in self.graphs

  def _build(self, graphs, types, client_threads):
    client_threads = (default_client_threads() if client_threads is None
                      else checks.integer(client_threads, 'client_threads',
                                          minimum=1))
    self.graphs = graphs
    computations = parse_graphs(graphs)
    self._types = types
    next_type = types['next']
    self._state_type = next_type.parameter[0].member
    self._result_type = next_type.result
    self._work_proto = computations['work']
    self._prepare = tf_graphs.TensorFlowFunction(computations['prepare'])
    self._work = tf_graphs.TensorFlowFunction(computations['work'])
    self._client_threads = client_threads
    self._pool = None  # Built on the first round with more than one client.
    self._free_works = None
    self._zero = tf_graphs.TensorFlowFunction(computations['zero'])
    self._accumulate = tf_graphs.TensorFlowFunction(
        computations['accumulate'])
    self._report = tf_graphs.TensorFlowFunction(computations['report'])
    self._update = tf_graphs.TensorFlowFunction(computations['update'])
    work_result = self._work.type_signature.result
    # work -> <aggregated, secure_sum_bitwidth, secure_sum_max_input,
    #          secure_modular_sum>.
    self._secure_types = [work_result[i] for i in (1, 2, 3)]
    self._num_update_leaves = tf_graphs.count_leaves(work_result[0])
    self._modulus = tf_graphs.TensorFlowFunction(  # Called where needed.
        computations['secure_modular_sum_modulus'])
    self._initialize = tf_graphs.TensorFlowFunction(
        computations['initialize'])
    self._get_weights, self._set_weights = (
        tf_graphs.TensorFlowFunction(computations[name])
        if name in computations else None
        for name in ('get_model_weights', 'set_model_weights'))

  @property
  def state_type(self):
    """The TFF type of the process's state (what `next` takes and returns)."""
    return self._state_type

  def initialize(self):
    return tf_graphs.pack_value(self._types['initialize'].result,
                                self._initialize())

  def next(self, state, client_datasets: Sequence[tf.data.Dataset]):
    """One round: the process's `next(state, client_datasets)`."""
    state_leaves = tf_graphs.flatten_value(state, self._state_type, [])
    client_input = list(self._prepare(*state_leaves))
    accumulator = list(self._zero())
    secure_sums = [list(_zeros(t)) for t in self._secure_types]
    for outputs in self._client_outputs(client_datasets, client_input):
      update = outputs[:self._num_update_leaves]
      accumulator = list(self._accumulate(*accumulator, *update))
      secure = outputs[self._num_update_leaves:]
      for sums in secure_sums:
        for i in range(len(sums)):
          sums[i] = sums[i] + secure.pop(0).numpy()
    if secure_sums[2]:
      secure_sums[2] = [np.mod(s, m.numpy()) for s, m in zip(
          secure_sums[2], self._modulus())]
    report = list(self._report(*accumulator))
    flat_secure = [x for sums in secure_sums for x in sums]
    result = self._update(*state_leaves, *report, *flat_secure)
    return tf_graphs.pack_value(self._result_type, result)

  def _work_on(self, dataset, client_input, work=None):
    """`work` on one client's data, with a free import of the graph."""
    data_type = self._work.type_signature.parameter[0]
    data_leaves = tf_graphs.flatten_value(dataset, data_type, [])
    if work is not None:
      return list(work(*data_leaves, *client_input))
    work = self._free_works.get()
    try:
      return list(work(*data_leaves, *client_input))
    finally:
      self._free_works.put(work)

  def _client_outputs(self, client_datasets, client_input):
    """`work`'s outputs, client by client in the order given.

    With several threads, at most twice as many clients as threads are in
    flight, so a large cohort holds a few updates in memory, not all.
    """
    client_datasets = list(client_datasets)
    if self._client_threads == 1 or len(client_datasets) < 2:
      for dataset in client_datasets:
        yield self._work_on(dataset, client_input, self._work)
      return
    if self._pool is None:
      self._free_works = queue.SimpleQueue()
      self._free_works.put(self._work)
      for _ in range(self._client_threads - 1):
        self._free_works.put(tf_graphs.TensorFlowFunction(self._work_proto))
      self._pool = concurrent.futures.ThreadPoolExecutor(
          self._client_threads, thread_name_prefix='tff_clip_client')
    pending = collections.deque()
    try:
      for dataset in client_datasets:
        pending.append(self._pool.submit(self._work_on, dataset, client_input))
        if len(pending) >= 2 * self._client_threads:
          yield pending.popleft().result()
      while pending:
        yield pending.popleft().result()
    finally:
      for future in pending:  # After an error: run nothing more.
        future.cancel()
      concurrent.futures.wait(pending)

  def get_model_weights(self, state):
    fn = self._get_weights
    return tf_graphs.pack_value(
        self._types['get_model_weights'].result,
        fn(*tf_graphs.flatten_value(state, fn.type_signature.parameter, [])))

  def set_model_weights(self, state, weights):
    fn = self._set_weights
    leaves = tf_graphs.flatten_value(
        tff.structure.Struct([(None, state), (None, weights)]),
        fn.type_signature.parameter, [])
    return tf_graphs.pack_value(self._types['set_model_weights'].result,
                                fn(*leaves))
