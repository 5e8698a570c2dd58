"""TFF's C++ workers run the clients; the server's half of a round stays here.

TFF's `worker_binary` listens on every interface, without TLS or
authentication (its only flag is `--port`), and its executor and value ids are
small guessable strings: whatever a round sends it can be read back by any
gRPC client that reaches the port. Running `process.next` there sends the whole
server state, and with it the DP aggregator's secret noise key (`dp.
secret_key`), from which every round's noise can be regenerated and
subtracted.

`SplitRunner` therefore cuts each round along its `MapReduceForm` (TFF's
`tff.backends.mapreduce.get_map_reduce_form_for_computation`):

  in this process:   client_input = prepare(state)
  on the workers:    broadcast client_input; work on each client; aggregate
                     (zero, accumulate, merge, report) and the form's secure
                     sums -- `clients_computation(form)`
  in this process:   state, output = update(state, aggregates)

`initialize`, `get_model_weights` and `set_model_weights` run here too (as in
`tff_clip.runtime.simulation.InProcessRunner`, whose graph import it reuses). What a
worker receives is the client input (model weights, clip norms, and a client
noise key that is zero unless client-side noise is seeded) and the clients'
data: never the server state. `next` checks that at run time against the
state's key (`SecretLeakError`).

A worker that stops answering stops the round after `worker_timeout_s`
seconds with a `WorkerLostError` naming it: TFF's remote executor retries an
unavailable worker forever.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable, Sequence

import numpy as np
import tensorflow_federated as tff

from tff_clip.runtime import simulation
from tff_clip.runtime import tf_graphs

__all__ = ['SecretLeakError', 'SplitRunner', 'WorkerLostError',
           'call_watching_workers', 'clients_computation', 'for_workers',
           'secret_paths']

# Fields of an aggregator state that must never leave this process
# (`dp.DPQueryFactory`'s `GlobalState.noise_key`; the tree baseline's noise
# generators' `seeds`, keyed secretly by `tff_tree.secret_tree_seed`).
SECRET_FIELD_NAMES = ('noise_key', 'seeds')


class WorkerLostError(RuntimeError):
  """A TFF worker stopped answering during a round."""


class SecretLeakError(RuntimeError):
  """A value bound for the workers holds the server's secret key."""


def clients_computation(form) -> tff.Computation:
  """The client side of `form` as one federated computation.

  `(client_input@SERVER, data@CLIENTS) -> <aggregate, secure_sum_bitwidth,
  secure_sum, secure_modular_sum>@SERVER` (empty secure sums left out): TFF's
  `get_computation_for_map_reduce_form` without `prepare` and `update`, so
  its parameter is `prepare`'s result, not the server state.
  """
  client_input_type = form.prepare.type_signature.result
  data_type = form.work.type_signature.parameter[0]

  @tff.federated_computation(tff.FederatedType(client_input_type, tff.SERVER),
                             tff.FederatedType(data_type, tff.CLIENTS))
  def clients_round(client_input, client_data):
    broadcast = tff.federated_broadcast(client_input)
    (aggregate_input, bitwidth_input, max_input_input,
     modular_input) = tff.federated_map(
         form.work, tff.federated_zip([client_data, broadcast]))
    aggregates = [tff.federated_aggregate(
        aggregate_input, form.zero(), form.accumulate, form.merge,
        form.report)]
    # TFF's native runtime cannot run a secure sum of an empty struct, which
    # is what most processes have; an empty sum has no leaves to return.
    secure = ((tff.federated_secure_sum_bitwidth, bitwidth_input,
               form.secure_sum_bitwidth),
              (tff.federated_secure_sum, max_input_input,
               form.secure_sum_max_input),
              (tff.backends.mapreduce.federated_secure_modular_sum,
               modular_input, form.secure_modular_sum_modulus))
    for intrinsic, value, bound in secure:
      if tf_graphs.count_leaves(value.type_signature.member):
        aggregates.append(intrinsic(value, bound()))
    return tff.federated_zip(tuple(aggregates))

  return clients_round


def secret_paths(type_spec, path=()) -> list[tuple]:
  """Paths (tuples of element indices) of the secret fields in `type_spec`.

  A placement is looked through: the path of `<x@SERVER, <noise_key=..>@
  CLIENTS>`'s key is (1, 0).
  """
  out = []
  if isinstance(type_spec, tff.FederatedType):
    return secret_paths(type_spec.member, path)
  if isinstance(type_spec, tff.StructType):
    for i, (name, element) in enumerate(tff.structure.to_elements(type_spec)):
      if name in SECRET_FIELD_NAMES:
        out.append(path + (i,))
      else:
        out.extend(secret_paths(element, path + (i,)))
  return out


def _leaf_ranges(type_spec, paths) -> list[tuple[int, int]]:
  """[start, stop) of each path's leaves among `type_spec`'s flat leaves."""
  ranges = []
  for path in paths:
    start, element = 0, type_spec
    for index in path:
      elements = tff.structure.to_elements(element)
      start += sum(tf_graphs.count_leaves(t) for _, t in elements[:index])
      element = elements[index][1]
    ranges.append((start, start + tf_graphs.count_leaves(element)))
  return ranges


def _contains(haystack: np.ndarray, needle: np.ndarray) -> bool:
  """True when `needle`'s bytes occur in `haystack`'s (any alignment)."""
  needle_bytes = np.ascontiguousarray(needle).tobytes()
  return bool(needle_bytes) and needle_bytes in np.ascontiguousarray(
      haystack).tobytes()


def _reachable(target: str) -> bool:
  """Whether a connection to `target` ('host:port' or 'unix:PATH') opens."""
  try:
    if target.startswith('unix:'):  # A local worker (`execution`).
      with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2.0)
        s.connect(target[len('unix:'):])
    else:
      host, _, port = target.rpartition(':')
      socket.create_connection((host, int(port)), timeout=2.0).close()
    return True
  except OSError:
    return False


def call_watching_workers(fn: Callable[[], object],
                          targets: Callable[[], Sequence[str]],
                          timeout_s: float, poll_s: float = 0.25):
  """`fn()`, or `WorkerLostError` once a target is unreachable for timeout_s.

  `fn` runs in a daemon thread (TFF retries an unreachable worker without
  end, so the call itself never returns); this thread polls each of
  `targets()` ('host:port', or 'unix:PATH' for a local worker) with a
  connect every `poll_s` seconds.
  """
  result = {}
  done = threading.Event()

  def run():
    try:
      result['value'] = fn()
    except BaseException as e:  # pylint: disable=broad-except
      result['error'] = e
    finally:
      done.set()

  threading.Thread(target=run, name='tff-clients-round', daemon=True).start()
  down_since = {}
  while not done.wait(poll_s):
    now = time.monotonic()
    for target in targets():
      if _reachable(target):
        down_since.pop(target, None)
      elif now - down_since.setdefault(target, now) >= timeout_s:
        raise WorkerLostError(
            f'TFF worker at {target} stopped answering for {timeout_s:g} s '
            '(--worker_timeout_s) during a round. Restart it and rerun the '
            'same command: training resumes from the last checkpoint.')
  if 'error' in result:
    raise result['error']
  return result['value']


class SplitRunner(simulation.InProcessRunner):
  """A learning process whose client work runs on TFF's C++ workers.

  Same interface as `simulation.InProcessRunner` (`initialize`, `next`,
  `get_model_weights`, `set_model_weights`); `next` sends the client side
  of the round (`clients_computation`) to TFF's current default context,
  which must be a C++ one (`tff_clip.runtime.execution.set_local_cpp_context` or
  TFF's mergeable context over remote workers).

  Args:
    process: the learning process (its `next` must have a MapReduceForm).
    worker_targets: callable giving the gRPC target ('host:port' or
      'unix:PATH') of each worker the context uses now; with it, a worker
      unreachable for `worker_timeout_s` stops the round (`WorkerLostError`).
    worker_timeout_s: seconds a worker may stay unreachable.
  """

  def __init__(self, process,
               worker_targets: Callable[[], Sequence[str]] | None = None,
               worker_timeout_s: float = 30.0):
    super().__init__(process)
    self._form = simulation.map_reduce_form(process)
    self._clients_round = clients_computation(self._form)
    if secret_paths(self._clients_round.type_signature.parameter):
      raise SecretLeakError(
          "This process broadcasts a field of the server's secret state "
          f'({", ".join(SECRET_FIELD_NAMES)}) to its clients; it cannot run '
          'on TFF workers. Use --executor=inprocess.')
    self._client_input_type = self._form.prepare.type_signature.result
    self._clients_result_type = self._clients_round.type_signature.result.member
    self._secret_ranges = _leaf_ranges(self._state_type,
                                       secret_paths(self._state_type))
    self._worker_targets = worker_targets
    self._worker_timeout_s = worker_timeout_s

  def _check_no_secret(self, state_leaves, client_input):
    for start, stop in self._secret_ranges:
      for secret in state_leaves[start:stop]:
        secret = np.asarray(secret)
        if not secret.any():
          continue  # An all-zero key is no secret (and matches any zeros).
        if any(_contains(np.asarray(leaf), secret) for leaf in client_input):
          raise SecretLeakError(
              "The client input of this round holds the server's secret "
              'noise key; refusing to send it to the TFF workers.')

  def next(self, state, client_datasets):
    """One round: the process's `next(state, client_datasets)`."""
    state_leaves = tf_graphs.flatten_value(state, self._state_type, [])
    client_input = [t.numpy() for t in self._prepare(*state_leaves)]
    self._check_no_secret(state_leaves, client_input)
    client_value = tf_graphs.pack_value(self._client_input_type, client_input)

    # TFF's context stack is per thread: the watched call runs in another.
    context = tff.framework.get_context_stack().current

    def clients_round():
      with tff.framework.get_context_stack().install(context):
        return self._clients_round(client_value, list(client_datasets))

    if self._worker_targets is None:
      aggregates = clients_round()
    else:
      aggregates = call_watching_workers(clients_round, self._worker_targets,
                                         self._worker_timeout_s)
    aggregate_leaves = tf_graphs.flatten_value(
        aggregates, self._clients_result_type, [])
    result = self._update(*state_leaves, *aggregate_leaves)
    return tf_graphs.pack_value(self._result_type, result)


def for_workers(process, worker_targets=None, worker_timeout_s: float = 30.0):
  """What runs `process` on TFF's workers without sending them its secrets.

  `SplitRunner(process, ...)`; for a process without a MapReduceForm, which
  cannot be split, the process itself (run whole by TFF) when its state holds
  no secret field, and a `SecretLeakError` when it does.
  """
  try:
    return SplitRunner(process, worker_targets, worker_timeout_s)
  except ValueError as e:
    if secret_paths(process.next.type_signature.parameter[0]):
      raise SecretLeakError(
          'This process has no MapReduceForm, so its server half cannot be '
          "kept out of TFF's workers, and its state holds a secret field "
          f'({", ".join(SECRET_FIELD_NAMES)}): it cannot run on workers.'
      ) from e
    return process
