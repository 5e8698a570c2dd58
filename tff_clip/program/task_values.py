"""What a session computes from its built task alone, once per task.

The model's size (`model_size`) and its initial weights at a seed
(`initial_model_weights`), kept by the task object while this process
keeps them: a tuning grid's cells at one seed train one task
(`scripts.program.build_task` keeps it), each cell in a session of its own.
Drawing initial weights sets TensorFlow's global seed, which clears its
kernel caches: every traced function of the process is then instantiated
again on its next call (0.25-0.45 s of each later training of the frontier
cell, measured). Each value is held with its task, so an id is never
another task's. No TensorFlow import until a value is computed.
"""

from __future__ import annotations

import atexit
import collections

import numpy as np

__all__ = ['initial_model_weights', 'model_size']

_KEPT = 8
_values = collections.OrderedDict()
atexit.register(_values.clear)  # Before the interpreter tears TF down.


def _of_task(task, what, compute):
  """`compute()`, computed once per (`task`, `what`) while kept (the least
  recently used dropped first)."""
  key = (id(task), what)
  found = _values.pop(key, None)
  if found is None or found[0] is not task:
    found = (task, compute())
  _values[key] = found
  while len(_values) > _KEPT:
    _values.popitem(last=False)
  return found[1]


def _read_only(variable) -> np.ndarray:
  array = variable.numpy()
  array.flags.writeable = False  # Shared by every session of the seed.
  return array


def initial_model_weights(task, seed: int):
  """The model's initial weights as read-only numpy, a function of the task
  and the seed alone.

  TFF traces `initialize` into its own graph, where Keras initializers ignore
  the global seed: two processes would start from different weights. So the
  model is built once eagerly under the seed and its weights set explicitly.
  """

  def draw():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    tf.keras.utils.set_random_seed(seed)
    weights = tff.learning.models.ModelWeights.from_model(task.model_fn())
    return tf.nest.map_structure(_read_only, weights)
  return _of_task(task, ('initial weights', seed), draw)


def model_size(task) -> tuple[int, int]:
  """(d, layers): the model's trainable values (one noise vector's size,
  which the default bounding and quantile read with z and n) and tensors.
  Unseeded: the traced graphs must not depend on the run's seed."""

  def size():
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    weights = tff.learning.models.ModelWeights.from_model(task.model_fn())
    return (sum(int(np.prod(v.shape)) for v in weights.trainable),
            max(len(weights.trainable), 1))
  return _of_task(task, 'model size', size)
