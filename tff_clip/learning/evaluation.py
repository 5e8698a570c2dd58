"""Evaluation of model weights on server-held data, in plain TensorFlow.

The data never leaves the server, so nothing federated is traced: one model
of the task's `model_fn` takes the weights, and one `tf.function` (traced on
the first call) runs `forward_pass(batch, training=False)` over the data.
The metrics are then finalized as TFF finalizes them. `server_evaluation`
keeps one per model for a process's later runs (a sweep's or a frontier
worker's seeds): its traced loop takes each run's dataset as an argument. This is the
computation of TFF's `tff.learning.algorithms.build_fed_eval` for one client
holding the data -- the same loop over the batches in the same order, then
`report_local_unfinalized_metrics` and `metric_finalizers` -- without
building and tracing a federated process.
"""

from __future__ import annotations

import atexit
import collections
import functools
import math

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

__all__ = ['ServerEvaluation', 'server_evaluation']


class ServerEvaluation:
  """Loss and accuracy of model weights on one dataset the server holds."""

  def __init__(self, model_fn, dataset=None):
    """`model_fn`: a no-arg callable returning a
    `tff.learning.models.VariableModel`; `dataset`: its batches (or given
    to each call)."""
    model = model_fn()
    self._model = model
    self._weights = tff.learning.models.ModelWeights.from_model(model)
    self._finalizers = model.metric_finalizers()
    self._dataset = dataset

    def loop(forward_pass):
      def step(count, batch):  # The metrics accumulate in the model.
        forward_pass(batch, training=False)
        return count + 1

      def unfinalized_metrics(data):
        data.reduce(tf.constant(0, tf.int64), step)
        return model.report_local_unfinalized_metrics()
      return unfinalized_metrics

    # Traced without autograph: converting TFF's `forward_pass` (a
    # `tf.function` of its own) was most of a fresh process's first
    # evaluation (1.3 s of 1.5). A model whose Python needs autograph (a
    # tensor in an `if`) fails that trace loudly; it then runs converted.
    self._unfinalized_metrics = tf.function(
        loop(_unconverted(model.forward_pass, model)), autograph=False)
    self._converted = tf.function(loop(model.forward_pass))

  def __call__(self, model_weights, dataset=None) -> collections.OrderedDict:
    """{'eval_loss', 'eval_accuracy'} of `model_weights` (a
    `tff.learning.models.ModelWeights`) on `dataset` (default: the one it
    was made with); NaN for a metric the model lacks."""
    data = self._dataset if dataset is None else dataset
    tf.nest.map_structure(lambda v, t: v.assign(t), self._weights,
                          model_weights)
    self._model.reset_metrics()  # Each call counts afresh, as TFF's does.
    try:
      unfinalized = self._unfinalized_metrics(data)
    except TypeError:  # E.g. OperatorNotAllowedInGraphError.
      if self._unfinalized_metrics is self._converted:
        raise
      self._unfinalized_metrics = self._converted  # Needs autograph.
      self._model.reset_metrics()
      unfinalized = self._unfinalized_metrics(data)
    metrics = {name: _eagerly(self._finalizers[name])(value)
               for name, value in unfinalized.items()}
    return collections.OrderedDict(
        eval_loss=_scalar(metrics.get('loss')),
        eval_accuracy=_scalar(metrics.get('sparse_categorical_accuracy',
                                          metrics.get('accuracy'))))


_KEPT = 4
# key -> ServerEvaluation, the most recently used last; freed before the
# interpreter tears its modules down (a traced function freed after that
# prints a TypeError traceback).
_shared = collections.OrderedDict()
atexit.register(_shared.clear)


def server_evaluation(model_fn, key=None) -> ServerEvaluation:
  """A `ServerEvaluation` of `model_fn`'s model, called with the data.

  `key`: a name of the model (the training program gives its graph
  shape's cache key, which holds the task builder's source and every field
  a model is built from, but none of the server's hyperparameters, so the
  cells of a grid share one); the evaluation made under it earlier in this
  process is reused, its loop traced once for every dataset of one element
  spec. None: a new one.
  """
  if key is None:
    return ServerEvaluation(model_fn)
  found = _shared.pop(key, None) or ServerEvaluation(model_fn)
  _shared[key] = found
  while len(_shared) > _KEPT:
    _shared.popitem(last=False)
  return found


def _unconverted(forward_pass, model):
  """`model.forward_pass` as its Python where its class declares it a
  `tf.function` (as TFF's Keras models do): traced inside the evaluation's
  own function, once, without autograph. Else as it is."""
  declared = getattr(type(model), 'forward_pass', None)
  python_function = getattr(declared, 'python_function', None)
  if python_function is None:
    return forward_pass
  return functools.partial(python_function, model)


def _eagerly(finalizer):
  """A metric finalizer run eagerly, with the operations TFF runs in a graph.

  A Keras metric's finalizer is a `tf.function` that builds a fresh metric
  (new variables) each time it is traced, which a `tf.function` allows on
  its first trace only.
  """
  return getattr(finalizer, 'python_function', finalizer)


def _scalar(value) -> float:
  return math.nan if value is None else float(np.asarray(value))
