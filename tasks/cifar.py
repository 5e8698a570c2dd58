"""CIFAR-10 (CNN-2-Layers, ResNet-18) and CIFAR-100 (ResNet-18) tasks.

CIFAR-10 (Zhang et al. 2022, Yang et al. 2022, Cheng et al. 2022) is not federated: it is read through
tensorflow-datasets and split into clients by `tasks.partitions` (default
100 clients with Dirichlet(alpha=1.0) label skew, Cheng et al. 2022's setting). No real
CIFAR-10 ships offline, so the offline/synthetic source generates images in
CIFAR-10's format: each class is a random 4x4 colour pattern upsampled to
32x32 plus Gaussian pixel noise -- learnable, partitionable, but synthetic.

CIFAR-100 is TFF's federated version (500 training clients, Pachinko
allocation), trained with ResNet-18 + GroupNorm as in Reddi et al. 2021; its
offline source is TFF's `cifar100.get_synthetic()`.

All images go through TFF's CIFAR preprocessing (`image_classification_
preprocessing`: crop to `crop_size` x `crop_size`, default 24 as TFF's
baseline, per-image standardization, optional random crop/flip).

References:
* Cheng et al. 2022: "Differentially Private Federated Learning with
  Local Regularization and Sparsification", CVPR 2022.
"""

from __future__ import annotations

import collections

import numpy as np
from tensorflow_federated.python.simulation.baselines.cifar100 import image_classification_preprocessing
from tensorflow_federated.python.simulation.baselines.cifar100 import image_classification_tasks
import tensorflow_federated as tff

from tasks import models
from tasks import sources
from tasks import task as task_lib

__all__ = [
    'CIFAR10_MODELS',
    'DEFAULT_CIFAR10_NUM_CLIENTS',
    'ONLINE_CIFAR100_NUM_CLIENTS',
    'build_cifar10',
    'build_cifar100',
    'synthetic_cifar10_arrays',
]

CIFAR10_MODELS = ('cnn', 'resnet18')
DEFAULT_CIFAR10_NUM_CLIENTS = 100
DEFAULT_CIFAR10_ALPHA = 1.0
ONLINE_CIFAR100_NUM_CLIENTS = 500
DEFAULT_CROP_SIZE = image_classification_tasks.DEFAULT_CROP_HEIGHT
_EVAL_SPEC = tff.simulation.baselines.ClientSpec(num_epochs=1, batch_size=64,
                                                 shuffle_buffer_size=1)
_SYNTHETIC_PIXEL_NOISE_STD = 48.0


def synthetic_cifar10_arrays(num_examples: int, seed: int = 0,
                             num_classes: int = 10):
  """`num_examples` generated CIFAR-10-format uint8 images, int64 labels."""
  if num_examples < num_classes:
    raise ValueError(f'`num_examples` ({num_examples}) must be at least the '
                     f'number of classes ({num_classes}).')
  rng = np.random.default_rng(seed)
  patterns = rng.uniform(0.0, 255.0, size=(num_classes, 4, 4, 3))
  patterns = np.repeat(np.repeat(patterns, 8, axis=1), 8, axis=2)
  labels = rng.permutation(np.arange(num_examples) % num_classes)
  noise = rng.standard_normal((num_examples, 32, 32, 3), dtype=np.float32)
  images = patterns[labels].astype(np.float32)
  images += _SYNTHETIC_PIXEL_NOISE_STD * noise
  return (np.clip(images, 0.0, 255.0).astype(np.uint8),
          labels.astype(np.int64))


def _check_crop(crop_size: int) -> tuple[int, int, int]:
  if not 1 <= crop_size <= 32:
    raise ValueError(f'`crop_size` must be in [1, 32]; got {crop_size}.')
  return (crop_size, crop_size, 3)


def build_cifar10(args: task_lib.BuildArgs, *,
                  model: str,
                  crop_size: int = DEFAULT_CROP_SIZE,
                  distort_train_images: bool = False,
                  offline_train_examples: int = 5000,
                  offline_test_examples: int = 1000) -> task_lib.Task:
  """A CIFAR-10 task with `model` in `CIFAR10_MODELS`."""
  if model not in CIFAR10_MODELS:
    raise ValueError(f'Unknown CIFAR-10 model {model!r}; expected one of '
                     f'{CIFAR10_MODELS}.')
  crop_shape = _check_crop(crop_size)
  # numpy splits a negative count from the end: -5 would be 995 - 5 images.
  task_lib.check_positive(offline_train_examples, 'offline_train_examples')
  task_lib.check_positive(offline_test_examples, 'offline_test_examples')
  if args.data_source == 'online':
    (train_x, train_y), (test_x, test_y) = sources.load_cifar10_arrays(
        args.cache_dir, args.download)
    source = 'CIFAR-10 (tensorflow-datasets)'
  else:
    images, labels = synthetic_cifar10_arrays(
        offline_train_examples + offline_test_examples, args.seed)
    train_x, test_x = np.split(images, [offline_train_examples])
    train_y, test_y = np.split(labels, [offline_train_examples])
    source = 'generated CIFAR-10-format images (not real CIFAR)'
  train_arrays, validation_data = task_lib.hold_out_validation(
      collections.OrderedDict(image=train_x, label=train_y), 'label', args)
  train_data, partition = task_lib.federate_arrays(
      train_arrays, 'label', args,
      default_num_clients=DEFAULT_CIFAR10_NUM_CLIENTS,
      default_partition='dirichlet', default_alpha=DEFAULT_CIFAR10_ALPHA)
  preprocessing = image_classification_preprocessing
  datasets = tff.simulation.baselines.BaselineTaskDatasets(
      train_data=train_data,
      test_data=task_lib.centralized_dataset(
          collections.OrderedDict(image=test_x, label=test_y)),
      validation_data=validation_data,
      train_preprocess_fn=preprocessing.create_preprocess_fn(
          args.train_client_spec, crop_shape=crop_shape,
          distort_image=distort_train_images),
      eval_preprocess_fn=preprocessing.create_preprocess_fn(
          args.eval_client_spec or _EVAL_SPEC, crop_shape=crop_shape))
  if model == 'cnn':
    keras_model_fn = lambda: models.create_cifar_cnn(crop_shape, 10)
    description = ('CNN-2-Layers: 2 x conv 5x5x64 + dense 384-192 '
                   '(McMahan et al.)')
  else:
    keras_model_fn = lambda: models.create_resnet18(crop_shape, 10)
    description = 'ResNet-18 with GroupNorm'
  return task_lib.Task(
      datasets,
      task_lib.classification_model_fn(keras_model_fn,
                                       datasets.element_type_structure),
      name=f'cifar10_{model}', data_source=args.data_source,
      model_description=description,
      data_description=f'{source}, {partition}',
      evaluates_on_clients_data=False)  # The test split: no client's.


def build_cifar100(args: task_lib.BuildArgs, *,
                   crop_size: int = DEFAULT_CROP_SIZE,
                   distort_train_images: bool = False) -> task_lib.Task:
  """CIFAR-100 with ResNet-18 + GroupNorm (Reddi et al. 2021)."""
  crop_shape = _check_crop(crop_size)
  if args.data_source == 'online':
    train, test = sources.load_tff_dataset('cifar100', args.cache_dir,
                                           args.download)
    source = 'CIFAR-100 (TFF, Pachinko allocation)'
  else:
    train = test = tff.simulation.datasets.cifar100.get_synthetic()
    source = 'TFF synthetic CIFAR-100'
  train, partition = task_lib.refederate(train, 'label', args)
  baseline = (
      image_classification_tasks.create_image_classification_task_with_datasets(
          args.train_client_spec, args.eval_client_spec, 'resnet18',
          crop_shape[0], crop_shape[1], distort_train_images, train, test))
  return task_lib.Task(
      baseline.datasets, baseline.model_fn, name='cifar100_resnet18',
      data_source=args.data_source,
      model_description='ResNet-18 with GroupNorm',
      data_description=f'{source}, {partition}',
      # TFF's synthetic CIFAR-100 is both the training and the test data.
      evaluates_on_clients_data=args.data_source != 'online')
