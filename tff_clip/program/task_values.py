"""What a session computes from its built task alone, once per task.

The model's initial weights at a seed (`initial_model_weights`) and its
size (`model_size`, read from them), kept by the task object while this process
keeps them: a tuning grid's cells at one seed train one task
(`scripts.program.build_task` keeps it), each cell in a session of its own.
Setting TensorFlow's global seed clears its kernel caches: every traced
function of the process is then instantiated again on its next call
(0.25-0.45 s of each later training of the frontier cell, measured). So the
weights are drawn without it wherever the model's construction does not
read it (`_keras_seeded`), and a drawn value is kept. Each value is held
with its task, so an id is never another task's. No TensorFlow import until
a value is computed.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import random
import sys

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


@contextlib.contextmanager
def _keras_seeded(seed: int):
  """`tf.keras.utils.set_random_seed(seed)` but TensorFlow's global seed:
  Python's, NumPy's and Keras's own seed generator (from which Keras 2.14's
  initializers seed their stateless ops). Yields a list that holds True once
  anything asked TensorFlow for an op seed (`random_seed.get_seed`, which
  every stateful random op calls and which reads the global seed): then the
  draw depended on the global seed, and must be made under it.

  On exit the three generators are as they were: a draw leaves no trace in
  what follows (TFF's tracing of the process draws its variables' throwaway
  initial values from Keras's generator, so a seeded state left behind would
  make the traced graphs depend on the run's seed)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow.python.framework import random_seed  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  # What `set_random_seed` sets in Keras's backend (where its initializers
  # take their seeds), found by a function the backend defines.
  keras_backend = sys.modules[tf.keras.backend.clear_session.__module__]
  generator = keras_backend._SEED_GENERATOR  # pylint: disable=protected-access
  saved = (random.getstate(), np.random.get_state(),
           getattr(generator, 'generator', None))
  random.seed(seed)
  np.random.seed(seed)
  generator.generator = random.Random(seed)
  stateful = [False]
  get_seed = random_seed.get_seed

  def watched(op_seed):
    stateful[0] = True
    return get_seed(op_seed)

  random_seed.get_seed = watched
  try:
    yield stateful
  finally:
    random_seed.get_seed = get_seed
    random.setstate(saved[0])
    np.random.set_state(saved[1])
    generator.generator = saved[2]


def initial_model_weights(task, seed: int):
  """The model's initial weights as read-only numpy, a function of the task
  and the seed alone: the model built right after
  `tf.keras.utils.set_random_seed(seed)`.

  TFF traces `initialize` into its own graph, where Keras initializers ignore
  the global seed: two processes would start from different weights. So the
  model is built once eagerly under the seed and its weights set explicitly.
  TensorFlow's global seed is set (clearing its caches) only where the
  model's construction reads it (a stateful random op); Keras's stateless
  initializers draw the same values without it.
  """

  def draw():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
    with _keras_seeded(seed) as stateful:
      weights = tff.learning.models.ModelWeights.from_model(task.model_fn())
    if stateful[0]:
      global_seed = context.global_seed()
      try:
        with _keras_seeded(seed):  # Python's, NumPy's, Keras's: restored.
          tf.keras.utils.set_random_seed(seed)
          weights = tff.learning.models.ModelWeights.from_model(
              task.model_fn())
      finally:
        tf.random.set_seed(global_seed)  # TensorFlow's as it was.
    return tf.nest.map_structure(_read_only, weights)
  return _of_task(task, ('initial weights', seed), draw)


def model_size(task, seed: int) -> tuple[int, int]:
  """(d, layers): the model's trainable values (one noise vector's size,
  which the default bounding and quantile read with z and n) and tensors.
  Read from the initial weights at `seed` (drawn once, and needed by the
  run anyway): their shapes, and so d, are the same at every seed, so the
  traced graphs do not depend on the run's seed."""
  trainable = initial_model_weights(task, seed).trainable
  return (sum(int(np.prod(np.shape(v))) for v in trainable),
          max(len(trainable), 1))
