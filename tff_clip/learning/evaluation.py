"""Evaluation of model weights on server-held data, in plain TensorFlow.

The data never leaves the server, so nothing federated is traced: one model
of the task's `model_fn` takes the weights, and one `tf.function` (traced on
the first call) runs `forward_pass(batch, training=False)` over the data.
The metrics are then finalized as TFF finalizes them. This is the
computation of TFF's `tff.learning.algorithms.build_fed_eval` for one client
holding the data -- the same loop over the batches in the same order, then
`report_local_unfinalized_metrics` and `metric_finalizers` -- without
building and tracing a federated process.
"""

from __future__ import annotations

import collections
import math

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

__all__ = ['ServerEvaluation']


class ServerEvaluation:
  """Loss and accuracy of model weights on one dataset the server holds."""

  def __init__(self, model_fn, dataset):
    """`model_fn`: a no-arg callable returning a
    `tff.learning.models.VariableModel`; `dataset`: its batches."""
    model = model_fn()
    self._model = model
    self._weights = tff.learning.models.ModelWeights.from_model(model)
    self._finalizers = model.metric_finalizers()

    @tf.function
    def unfinalized_metrics():
      for batch in dataset:
        model.forward_pass(batch, training=False)
      return model.report_local_unfinalized_metrics()

    self._unfinalized_metrics = unfinalized_metrics

  def __call__(self, model_weights) -> collections.OrderedDict:
    """{'eval_loss', 'eval_accuracy'} of `model_weights` (a
    `tff.learning.models.ModelWeights`); NaN for a metric the model lacks."""
    tf.nest.map_structure(lambda v, t: v.assign(t), self._weights,
                          model_weights)
    self._model.reset_metrics()  # Each call counts afresh, as TFF's does.
    metrics = {name: _eagerly(self._finalizers[name])(value)
               for name, value in self._unfinalized_metrics().items()}
    return collections.OrderedDict(
        eval_loss=_scalar(metrics.get('loss')),
        eval_accuracy=_scalar(metrics.get('sparse_categorical_accuracy',
                                          metrics.get('accuracy'))))


def _eagerly(finalizer):
  """A metric finalizer run eagerly, with the operations TFF runs in a graph.

  A Keras metric's finalizer is a `tf.function` that builds a fresh metric
  (new variables) each time it is traced, which a `tf.function` allows on
  its first trace only.
  """
  return getattr(finalizer, 'python_function', finalizer)


def _scalar(value) -> float:
  return math.nan if value is None else float(np.asarray(value))
