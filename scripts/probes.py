"""Non-private probes of a training run, shared by the diagnostic scripts.

What they read -- measurements, aggregator state, each client's raw update --
is for diagnosing data you may inspect: a probe's output is NOT
differentially private.
"""

import collections
import os

import numpy as np

from scripts import program
from tff_clip.program import config as config_lib


def find(tree, name):
  """The value under the first key or field `name` in a nested structure.

  Mappings, namedtuples, attrs classes and sequences are searched depth
  first; None if `name` is nowhere.
  """
  if isinstance(tree, collections.abc.Mapping):
    if name in tree:
      return tree[name]
    children = list(tree.values())
  elif hasattr(tree, '_asdict'):  # A namedtuple.
    return find(tree._asdict(), name)
  elif hasattr(tree, '__attrs_attrs__'):
    return find({a.name: getattr(tree, a.name)
                 for a in tree.__attrs_attrs__}, name)
  elif isinstance(tree, (list, tuple)):
    children = list(tree)
  else:
    return None
  for value in children:
    found = find(value, name)
    if found is not None:
      return found
  return None


def compare(fields, rounds, names, diagnose, output_dir):
  """(base, rows, accuracies): `diagnose(base, name)` of each of `names`.

  `base` is the validated TrainConfig of `fields` (`rounds` overrides
  theirs); `diagnose` returns (rows, final accuracy). A bad field raises
  `ConfigError` before `output_dir` is made.
  """
  if rounds is not None:
    fields = dict(fields, rounds=rounds)
  base = config_lib.TrainConfig(**fields)
  program.validate(base)
  _check_output_dir(output_dir)
  rows, accuracies = [], collections.OrderedDict()
  for name in names:
    mine, accuracies[name] = diagnose(base, name)
    rows += mine
  # Made once every diagnosis ran: a refusal on the way writes nothing.
  os.makedirs(output_dir, exist_ok=True)
  return base, rows, accuracies


def _check_output_dir(output_dir):
  """`ConfigError` naming --output_dir where it could not be made."""
  path = os.path.abspath(output_dir)
  if os.path.lexists(path) and not os.path.isdir(path):
    raise config_lib.ConfigError(
        f'--output_dir: {output_dir!r} exists and is not a directory.')
  existing = path
  while not os.path.lexists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing) or not os.access(existing, os.W_OK):
    raise config_lib.ConfigError(
        f'--output_dir: cannot create {output_dir!r} ({existing!r} is not a '
        'writable directory).')


class ClientUpdates:
  """Each client's raw model update (no bounding, no noise), flattened.

  The task's FedAvg client work (`tff_clip.learning.client
  .build_client_work`, the config's client optimizer, no client options),
  mapped over the cohort with the same broadcast weights and the same
  datasets as a training round gets, and returned to the caller client by
  client instead of aggregated.
  """

  def __init__(self, config, task):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    from tff_clip.learning import client  # pylint: disable=g-import-not-at-top
    from tff_clip.program import assembly  # pylint: disable=g-import-not-at-top
    work = client.build_client_work(
        task.model_fn,
        assembly._client_optimizer(config),  # pylint: disable=protected-access
        client_weighting=tff.learning.ClientWeighting.UNIFORM)
    _, weights_type, data_type = work.next.type_signature.parameter

    @tff.federated_computation(
        tff.FederatedType(weights_type.member, tff.SERVER), data_type)
    def updates(weights, data):
      output = work.next(work.initialize(), tff.federated_broadcast(weights),
                         data)
      return output.result

    # Raw updates are evaluated by TFF's C++ runtime: on tff_clip's worker,
    # in a network namespace of its own and stopped with this process
    # (`tff_clip.runtime.execution`), never on TFF's default worker, which
    # listens on a TCP port of every interface and, started by a process
    # that ignores SIGINT (nohup, a background job), blocks its exit.
    from tff_clip.runtime import execution  # pylint: disable=g-import-not-at-top
    execution.set_local_cpp_context()
    self._updates = updates
    self._flatten = lambda s: np.concatenate(
        [np.ravel(np.asarray(v, np.float64)) for v in tf.nest.flatten(s)])

  def __call__(self, weights, datasets) -> np.ndarray:
    """[clients, d]: the update of each client in `datasets`."""
    results = self._updates(weights, datasets)
    return np.stack([self._flatten(r.update) for r in results])
