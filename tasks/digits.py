"""`digits`: federated scikit-learn handwritten digits, the offline demo task.

scikit-learn ships 1,797 real 8x8 handwritten digits (no download); 20% of
each class is held out as a centralized test set and the rest is split into
clients by `tasks.partitions` (default: 50 IID clients, about 29 examples
each). The model is a small MLP, 64-32-10 (2,410 parameters), so a DP
federated-averaging demo runs in about two minutes on two CPU cores.

Elements have EMNIST's layout (`label` int32, `pixels` float32 [8, 8]), so
TFF's EMNIST preprocessing is reused (`task.emnist_preprocess_fn`).
"""

from __future__ import annotations

import collections

import tensorflow_federated as tff

from tasks import models
from tasks import sources
from tasks import task as task_lib

__all__ = ['DEFAULT_NUM_CLIENTS', 'TEST_FRACTION', 'build', 'load_arrays']

DEFAULT_NUM_CLIENTS = 50
TEST_FRACTION = 0.2
HIDDEN_UNITS = 32
_EVAL_SPEC = tff.simulation.baselines.ClientSpec(num_epochs=1, batch_size=64,
                                                 shuffle_buffer_size=1)


def load_arrays(seed: int = 0):
  """((train arrays), (test arrays)) of the digits, each `label`, `pixels`."""
  images, labels = sources.load_digits_arrays()
  train_ix, test_ix = task_lib.stratified_split(labels, TEST_FRACTION, seed)
  split = lambda ix: collections.OrderedDict(label=labels[ix],
                                             pixels=images[ix])
  return split(train_ix), split(test_ix)


def build(args: task_lib.BuildArgs, *,
          hidden_units: int = HIDDEN_UNITS) -> task_lib.Task:
  """The `digits` task; `hidden_units` sizes the MLP's hidden layer."""
  train_arrays, test_arrays = load_arrays(args.seed)
  train_arrays, validation_data = task_lib.hold_out_validation(
      train_arrays, 'label', args)
  train_data, partition = task_lib.federate_arrays(
      train_arrays, 'label', args, default_num_clients=DEFAULT_NUM_CLIENTS,
      default_partition='iid')
  eval_spec = args.eval_client_spec or _EVAL_SPEC
  datasets = tff.simulation.baselines.BaselineTaskDatasets(
      train_data=train_data,
      test_data=task_lib.centralized_dataset(test_arrays),
      validation_data=validation_data,
      train_preprocess_fn=task_lib.emnist_preprocess_fn(
          args.train_client_spec),
      eval_preprocess_fn=task_lib.emnist_preprocess_fn(eval_spec))
  model_fn = task_lib.classification_model_fn(
      lambda: models.create_mlp((8, 8, 1), hidden_units, 10),
      datasets.element_type_structure)
  return task_lib.Task(
      datasets, model_fn, name='digits', data_source=args.data_source,
      model_description=f'MLP 64-{hidden_units}-10',
      data_description=(
          f'scikit-learn digits (1,797 real 8x8 images), {partition}'),
      evaluates_on_clients_data=False)  # A held-out split of its own.
