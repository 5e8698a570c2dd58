"""A batched round's three TensorFlow calls made one: prepare, cohort, update.

`batched_clients.BatchedRunner.next` runs the form's `prepare` (the client
input from the server state), the cohort's traced call (the pre-noise
aggregate) and the form's `update` (its initializer, then the DP noise drawn
with the secret key in the server state, the adaptive norms moved, the
server step): four calls of small graphs, each with its dispatch and
conversions (~1.5 ms of the frontier cell's round). `call` runs the very
same functions, in the same order and on the same tensors, inside one traced
function: the noise is still drawn once, by `update`, from the key in the
state, and the aggregate is still the only thing the clients' part hands
the server's; the round's result is the same to the bit
(`tests/test_batched_clients.py`).

The traced function is kept per (prepare, cohort call, update) and input
types for the later runs of a process (a frontier worker's trainings share
the runner's functions and the cohort call, `batched_clients._traces`).
"""

from __future__ import annotations

import atexit
import collections

import tensorflow as tf

from tff_clip.runtime import tf_graphs

__all__ = ['call_cohort', 'fused_round']

_KEPT = 8
_fused = collections.OrderedDict()
# Freed before the interpreter tears its modules down (as `runner_cache`).
atexit.register(_fused.clear)


def call_cohort(cohort, client_input, examples, index) -> list:
  """The cohort call's report leaves: a traced concrete function on its
  flat inputs (`tf_graphs.call_flat`: a structured call's checks cost
  ~0.2 ms), an imported one (`runner_cache`) as it is called."""
  if isinstance(cohort, tf.types.experimental.ConcreteFunction):
    return tf_graphs.call_flat(cohort, tf.nest.flatten(
        (client_input, examples, index)))
  return cohort(client_input, examples, index)


def fused_round(prepare, cohort, update, state_specs, examples):
  """`(state leaves, examples, index) -> update's result leaves`, one call.

  Args:
    prepare, update: the form's `tf_graphs.TensorFlowFunction`s, each
      already called once (their graphs imported).
    cohort: the cohort's traced call (`BatchedRunner._trace`).
    state_specs: `tf.TensorSpec`s of the state's leaves.
    examples: the examples' structure of tensors (any number of rows).
  """
  specs = (list(state_specs), tf.nest.map_structure(
      lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), examples),
           tf.TensorSpec([None, None, None], tf.int64))
  key = (prepare, cohort, update, repr(specs))
  traced = _fused.get(key)
  if traced is not None:
    _fused.move_to_end(key)
  else:
    def one_round(state_leaves, examples, index):
      # Calls ordered as written (a traced function runs stateful calls in
      # program order): update's initializer before its computation.
      client_input = list(prepare(*state_leaves))
      report = call_cohort(cohort, client_input, examples, index)
      return list(update(*state_leaves, *report))

    traced = tf.function(one_round, autograph=False).get_concrete_function(
        *specs)
    _fused[key] = traced
    while len(_fused) > _KEPT:
      _fused.popitem(last=False)
  return lambda state_leaves, examples, index: tf_graphs.call_flat(
      traced, tf.nest.flatten((list(state_leaves), examples, index)))
