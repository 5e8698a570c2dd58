"""One traced process for every value of the server's hyperparameters.

The fields in `HYPERPARAMETERS` reach a learning process only through its
aggregator (the DP noise multiplier, calibrated from --target_epsilon and
--delta; the clip norm and its quantile tracking) and its server optimizer
(learning rate, momentum). Both keep these values in the state their
`initialize` returns, not in the graphs of their `next`: tensorflow-privacy's
DP queries hold `stddev` or `noise_multiplier`, `l2_norm_clip` and
`target_quantile` in their global state, TFF's optimizers hold
`learning_rate` and `momentum` in theirs. So runs that differ only in these
fields (the cells of a sweep or of the frontier's grid, every epsilon) can
share one traced process: the graph cache keys the process on the other
fields (`shape`), records the values it was traced with (`values`), and a run
with other values takes the traced graphs with a state of its own
(`rebase`):

  state = the traced `initialize`(), its `aggregator` and `finalizer` drawn
          by this run's own aggregator's and server optimizer's `initialize`

The run's aggregator's `initialize` draws its noise key, from OS entropy, on
every call: a rebased run never shares a key with the traced one.

This holds only where the values are indeed not constants of a graph, which
is checked, not assumed: `rebase` builds the aggregator and server optimizer
of both sets of values (well under a second each; tracing the process, whose
cost is the model's client work, takes seconds to minutes) and compares
their `next` graphs (`tff_clip.runtime.graph_defs.canonical_digest`) and their
states' types. Where they differ (a mechanism that bakes its noise
multiplier into its graph, a fixed clip norm without DP), the run traces its
own process. The process's other parts (the model's client work, the
broadcast) are built from fields outside `HYPERPARAMETERS`, all in the key.

A grid's cells share parts: the cells at other learning rates have one
aggregator, those at other clip norms or quantiles one server optimizer. A
part is built (and its graph digested) once per process for parts equal
field by field (`_structure`: the aggregator factory's and the optimizer's
types and fields, all the way down, floats by their bits); a part holding
anything it cannot describe so (an object with slots, a TensorFlow object)
is built for every run, as before.
"""

from __future__ import annotations

import atexit
import dataclasses
import enum
import json
import types
from typing import Any, Callable, Optional
import weakref

import numpy as np

from tff_clip.program import config as config_lib
from tff_clip.program.config import TrainConfig

__all__ = ['HYPERPARAMETERS', 'Rebased', 'annotate', 'rebase', 'shape',
           'traced_with', 'values']

# The fields that reach the process through its aggregator and server
# optimizer only. `clip_norm` also reaches BLUR's client work, whose clip
# norm `shape` keeps resolved.
HYPERPARAMETERS = (
    'target_epsilon', 'delta', 'noise_multiplier',
    'clip_norm', 'target_quantile', 'initial_clip_norm', 'clip_learning_rate',
    'server_learning_rate', 'server_momentum',
)
# The entry's annotation: the values its process was traced with.
_ANNOTATION = 'annotations'
_RESOLVED = 'resolved_noise_multiplier'

# (aggregator factory, server optimizer, client weighting) of a config and
# its resolved noise multiplier (`tff_clip.program.assembly.server_parts`).
ServerParts = Callable[[TrainConfig, Optional[float]], tuple]


def shape(config: TrainConfig, noise_multiplier: Optional[float]) -> tuple:
  """What of `config` the process's graphs may depend on: every field but
  the hyperparameters, whether the run is private
  (which weighs clients uniformly), BLUR's clip norm as resolved, and the
  kinds of two hyperparameters whose kind builds another aggregator: an
  adaptive or a fixed clip norm, a given target quantile or one that
  follows the noise (which may switch: more state). A grid of fixed clip
  norms and one of adaptive norms thus have an entry each; with one entry
  for both, the second grid's every cell failed `rebase` onto the first's
  graphs and traced its own process (3 s a training of the frontier)."""
  # The default experiment name is made from every field: left out too.
  fields = tuple((f.name, getattr(config, f.name))
                 for f in dataclasses.fields(config)
                 if f.name not in HYPERPARAMETERS + ('experiment_name',))
  return (fields, noise_multiplier is not None,
          config_lib.blur_clip_norm(config),
          config.clip_norm == 'adaptive', config.target_quantile is None)


def values(config: TrainConfig,
           noise_multiplier: Optional[float]) -> dict[str, Any]:
  """The hyperparameters of `config`, the noise multiplier as resolved."""
  out = {name: getattr(config, name) for name in HYPERPARAMETERS}
  out[_RESOLVED] = noise_multiplier
  return json.loads(json.dumps(out))  # As an entry reads back.


def annotate(runner, config: TrainConfig,
             noise_multiplier: Optional[float]) -> None:
  """Records in `runner`'s graphs (what a cache entry holds) the values its
  process was traced with."""
  runner.graphs[_ANNOTATION] = json.dumps(
      {'hyperparameters': values(config, noise_multiplier)},
      sort_keys=True).encode()


def _traced_values(runner) -> Optional[dict[str, Any]]:
  data = getattr(runner, 'graphs', {}).get(_ANNOTATION)
  return None if data is None else json.loads(data)['hyperparameters']


def traced_with(runner, config: TrainConfig,
                noise_multiplier: Optional[float]) -> bool:
  """Whether `runner`'s process was traced with `config`'s values."""
  return _traced_values(runner) == values(config, noise_multiplier)


def _element_type(struct_type, name: str):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  return dict(tff.structure.to_elements(struct_type)).get(name)


class _Unkeyable(Exception):
  """A value `_structure` cannot describe field by field."""


# Where an object's fields are all it holds (no hidden state the process
# would read): the parts that build a server's aggregator and optimizer.
_DESCRIBED_MODULES = ('tff_clip.', 'tensorflow_federated.',
                      'tensorflow_privacy.', 'dp_accounting.')


def _structure(value, depth: int = 0):
  """A hashable description of `value`, equal for two values only where
  they are equal field by field, all the way down: numbers (floats by their
  bits), strings, arrays, enums, containers, functions (their code, closure
  and defaults) and the objects of this library, TFF, tensorflow-privacy and
  dp_accounting (their type and `vars`). Anything else (an object with
  slots, a TensorFlow object) raises `_Unkeyable`."""
  if depth > 32:
    raise _Unkeyable('too deep')
  inner = lambda item: _structure(item, depth + 1)
  if value is None or isinstance(value, (bool, str, bytes)):
    return (type(value).__name__, value)
  if isinstance(value, int):
    return ('int', int(value))
  if isinstance(value, float):
    return ('float', float(value).hex())
  if isinstance(value, (np.ndarray, np.generic)):
    array = np.asarray(value)
    if array.dtype.hasobject:
      raise _Unkeyable('an object array')
    return ('array', array.dtype.str, array.shape, array.tobytes())
  if isinstance(value, enum.Enum):
    return ('enum', type(value).__module__, type(value).__qualname__,
            value.name)
  if isinstance(value, (tuple, list)):
    return (type(value).__module__, type(value).__qualname__,
            tuple(inner(item) for item in value))
  if isinstance(value, dict):
    try:
      return ('dict', tuple(sorted((inner(k), inner(v))
                                   for k, v in value.items())))
    except TypeError:  # Keys that do not order.
      raise _Unkeyable('a dict') from None
  if isinstance(value, type):
    return ('type', value.__module__, value.__qualname__)
  if isinstance(value, types.FunctionType):
    cells = tuple(inner(cell.cell_contents) for cell in value.__closure__ or ())
    return ('function', id(value.__code__), cells, inner(value.__defaults__),
            inner(value.__kwdefaults__))
  cls = type(value)
  if not cls.__module__.startswith(_DESCRIBED_MODULES):
    raise _Unkeyable(f'{cls.__module__}.{cls.__qualname__}')
  for base in cls.__mro__:
    if set(base.__dict__.get('__slots__', ())) - {'__dict__', '__weakref__'}:
      raise _Unkeyable(f'{cls.__qualname__} has slots')
  if not hasattr(value, '__dict__'):
    raise _Unkeyable(f'{cls.__qualname__} has no fields')
  return ('object', cls.__module__, cls.__qualname__, inner(vars(value)))


# (component, model weights type, `_structure` of what builds it) -> (the
# digest of its `next`, its state initialization): a grid's cells that share
# an aggregator (another learning rate) or a server optimizer (another clip
# norm or quantile) build it once in a process.
_BUILT = {}
_BUILT_KEPT = 64
atexit.register(_BUILT.clear)  # Before TensorFlow is torn down.


def _component(name, model_weights_type, parts, build):
  """(digest, initializer) of the component `build(*parts)` makes, built
  once per process for parts equal field by field (`_structure`)."""
  from tff_clip.runtime import graph_defs  # pylint: disable=g-import-not-at-top
  from tff_clip.runtime import tf_graphs  # pylint: disable=g-import-not-at-top
  try:
    key = (name, str(model_weights_type), _structure(parts))
  except _Unkeyable:
    key = None
  found = _BUILT.get(key) if key is not None else None
  if found is None:
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    process = build(model_weights_type, *parts)
    found = (graph_defs.canonical_digest(process.next),
             tf_graphs.TensorFlowFunction(
                 tff.backends.mapreduce.get_state_initialization_computation(
                     process.initialize)))
    if key is not None:
      if len(_BUILT) >= _BUILT_KEPT:
        _BUILT.pop(next(iter(_BUILT)))
      _BUILT[key] = found
  return found


class _Components:
  """A config's aggregator and server optimizer, as the process builds
  them: their `next` digests and their state's initialization."""

  def __init__(self, config, noise_multiplier, server_parts: ServerParts,
               model_weights_type):
    from tff_clip.learning import algorithms  # pylint: disable=g-import-not-at-top
    factory, optimizer, weighting = server_parts(config, noise_multiplier)
    built = {
        'aggregator': _component('aggregator', model_weights_type,
                                 (factory, weighting),
                                 algorithms.server_aggregator),
        'finalizer': _component('finalizer', model_weights_type,
                                (optimizer,), algorithms.server_finalizer)}
    self.digests = {name: digest for name, (digest, _) in built.items()}
    self.initializers = {name: initialize
                         for name, (_, initialize) in built.items()}


# The digests of the components an entry's runner was traced with: a worker
# that rebases many runs on one runner builds them once.
_traced_digests = weakref.WeakKeyDictionary()


class Rebased:
  """A runner of traced graphs, with the state of other hyperparameters.

  `initialize()` is the traced process's, with the `aggregator` and
  `finalizer` states drawn by this run's own components (a fresh noise key
  on every call); everything else is the traced runner's.
  """

  def __init__(self, runner, initializers, state_types):
    self._runner = runner
    self._initializers = initializers
    self._state_types = state_types

  @property
  def traced_runner(self):
    """The runner whose traced graphs this one runs."""
    return self._runner

  def initialize(self):
    from tff_clip.runtime import tf_graphs  # pylint: disable=g-import-not-at-top
    state = self._runner.initialize()
    return state._replace(**{
        name: tf_graphs.pack_value(self._state_types[name], initialize())
        for name, initialize in self._initializers.items()})

  def __getattr__(self, name):
    return getattr(self._runner, name)


def rebase(runner, config: TrainConfig, noise_multiplier: Optional[float],
           server_parts: ServerParts):
  """`runner` (the cached process of `config`'s `shape`) for `config`.

  The runner itself where it was traced with `config`'s hyperparameters; a
  `Rebased` one where they differ only in states (the check above); None
  where a graph differs, or the runner records no values: then `config`
  needs a process traced for it.
  """
  traced = _traced_values(runner)
  if traced is None:
    return None
  if traced == values(config, noise_multiplier):
    return runner
  state_type = getattr(runner, 'state_type', None)
  try:  # LearningAlgorithmState: (global_model_weights, ..., finalizer).
    fields = state_type.python_container._fields
  except AttributeError:
    return None
  if not {'global_model_weights', 'aggregator', 'finalizer'} <= set(fields):
    return None
  weights_type = _element_type(state_type, 'global_model_weights')
  traced_config = dataclasses.replace(
      config, **{name: traced[name] for name in HYPERPARAMETERS})
  try:
    theirs = _traced_digests.get(runner)
    if theirs is None:
      theirs = _Components(traced_config, traced[_RESOLVED], server_parts,
                           weights_type).digests
      _traced_digests[runner] = theirs
    ours = _Components(config, noise_multiplier, server_parts, weights_type)
  except (TypeError, ValueError):
    return None
  if theirs != ours.digests:
    return None  # A value is a constant of a graph.
  state_types = {name: _element_type(state_type, name)
                 for name in ours.initializers}
  for name, initialize in ours.initializers.items():
    if not initialize.type_signature.result.is_equivalent_to(
        state_types[name]):
      return None
  return Rebased(runner, ours.initializers, state_types)
