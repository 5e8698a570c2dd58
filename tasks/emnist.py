"""EMNIST character recognition: Reddi et al.'s CNN, seed 000's MLP, logreg.

Data sources:
  * online: `tff.simulation.datasets.emnist.load_data` (LEAF's writers as
    clients: 3,400 for EMNIST-62, 3,383 for the digits), through
    `sources.load_tff_dataset`. With a `partition`, the training writers are
    pooled and re-split (seed 000, Zhang et al. Sec. 2, re-splits EMNIST
    digits into 500-example clients with 8 small + 2 large classes).
  * offline: scikit-learn's real handwritten digits in EMNIST's format --
    upsampled to a 20x20 box centred in 28x28 as MNIST does, inverted so 1.0
    is background as in federated EMNIST -- split by `tasks.partitions`
    (default 50 IID clients) with 20% of each class held out for testing.
  * synthetic: `tff.simulation.datasets.emnist.get_synthetic()` (2 clients).

Models: 'cnn' (Reddi et al. 2021, TFF's `cnn_dropout`, EMNIST-62 by
default), 'mlp' (784-200-10, seed 000), 'logreg' (784-10).
"""

from __future__ import annotations

import collections
from typing import Optional

import numpy as np
import tensorflow as tf
from tensorflow_federated.python.simulation.baselines.emnist import char_recognition_tasks
from tensorflow_federated.python.simulation.baselines.emnist import emnist_preprocessing
import tensorflow_federated as tff

from tasks import digits
from tasks import models
from tasks import sources
from tasks import task as task_lib

__all__ = [
    'DEFAULT_OFFLINE_NUM_CLIENTS',
    'MODELS',
    'ONLINE_NUM_CLIENTS',
    'build',
    'digits_as_emnist',
]

MODELS = ('cnn', 'mlp', 'logreg')
DEFAULT_OFFLINE_NUM_CLIENTS = 50
# Training writers of `emnist.load_data` (TFF's docstring), by `only_digits`.
ONLINE_NUM_CLIENTS = {False: 3400, True: 3383}
_EVAL_SPEC = tff.simulation.baselines.ClientSpec(num_epochs=1, batch_size=64,
                                                 shuffle_buffer_size=1)
_MODEL_DESCRIPTIONS = {
    'cnn': 'CNN: 2 conv + max-pool + dropout + dense 128 (Reddi et al.)',
    'mlp': 'MLP 784-200-{classes} (seed 000)',
    'logreg': 'multinomial logistic regression 784-{classes}',
}


def digits_as_emnist(images: np.ndarray) -> np.ndarray:
  """8x8 ink-in-[0, 1] digits -> 28x28 federated-EMNIST pixels (1.0 = paper)."""
  images = np.asarray(images, dtype=np.float32)[..., np.newaxis]
  resized = tf.image.resize(images, (20, 20), method='bilinear').numpy()
  padded = np.pad(resized[..., 0], ((0, 0), (4, 4), (4, 4)))
  return (1.0 - np.clip(padded, 0.0, 1.0)).astype(np.float32)


def _offline_data(args: task_lib.BuildArgs):
  train_arrays, test_arrays = digits.load_arrays(args.seed)
  as_emnist = lambda arrays: collections.OrderedDict(
      label=arrays['label'], pixels=digits_as_emnist(arrays['pixels']))
  train_data, partition = task_lib.federate_arrays(
      as_emnist(train_arrays), 'label', args,
      default_num_clients=DEFAULT_OFFLINE_NUM_CLIENTS,
      default_partition='iid')
  return (train_data, task_lib.centralized_dataset(as_emnist(test_arrays)),
          f'scikit-learn digits as 28x28 EMNIST, {partition}')


def _load(args: task_lib.BuildArgs, only_digits: bool):
  """(train ClientData, test data, description) for `args.data_source`."""
  if args.data_source == 'offline':
    return _offline_data(args)
  if args.data_source == 'online':
    train, test = sources.load_tff_dataset(
        'emnist', args.cache_dir, args.download, only_digits=only_digits)
    name = 'EMNIST-10 (digits)' if only_digits else 'EMNIST-62'
  else:
    train = test = tff.simulation.datasets.emnist.get_synthetic()
    name = 'TFF synthetic EMNIST'
  train, partition = task_lib.refederate(train, 'label', args)
  return train, test, f'{name}, {partition}'


def build(args: task_lib.BuildArgs, *, model: str,
          only_digits: Optional[bool] = None) -> task_lib.Task:
  """An EMNIST task with `model` in `MODELS`.

  Args:
    args: the checked `get_task` arguments.
    model: 'cnn', 'mlp' or 'logreg'.
    only_digits: EMNIST-10 (True) or EMNIST-62 (False). Default: EMNIST-62
      for the CNN (Reddi et al.), the digits for the MLP and logistic
      regression (seed 000 trains on "the digit part of the EMNIST dataset").

  Returns:
    The task.
  """
  if model not in MODELS:
    raise ValueError(f'Unknown EMNIST model {model!r}; expected one of '
                     f'{MODELS}.')
  if only_digits is None:
    only_digits = model != 'cnn'
  train, test, description = _load(args, only_digits)
  num_classes = 10 if only_digits else 62
  name = f'emnist_{model}'
  model_description = _MODEL_DESCRIPTIONS[model].format(classes=num_classes)
  if model == 'cnn':
    baseline = (
        char_recognition_tasks.create_character_recognition_task_from_datasets(
            args.train_client_spec, args.eval_client_spec, 'cnn_dropout',
            only_digits, train, test))
    return task_lib.Task(
        baseline.datasets, baseline.model_fn, name=name,
        data_source=args.data_source, model_description=model_description,
        data_description=description)
  datasets = tff.simulation.baselines.BaselineTaskDatasets(
      train_data=train,
      test_data=test,
      train_preprocess_fn=emnist_preprocessing.create_preprocess_fn(
          args.train_client_spec),
      eval_preprocess_fn=emnist_preprocessing.create_preprocess_fn(
          args.eval_client_spec or _EVAL_SPEC))
  if model == 'mlp':
    keras_model_fn = lambda: models.create_mlp((28, 28, 1), 200, num_classes)
  else:
    keras_model_fn = lambda: models.create_logistic_regression(
        (28, 28, 1), num_classes)
  return task_lib.Task(
      datasets,
      task_lib.classification_model_fn(keras_model_fn,
                                       datasets.element_type_structure),
      name=name, data_source=args.data_source,
      model_description=model_description, data_description=description)
