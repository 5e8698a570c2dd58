"""Stack Overflow next-word prediction (LSTM) and tag prediction (logreg).

Both are TFF's baselines (`tff.simulation.baselines.stackoverflow`), built
from data loaded here so that the cache is checked first and a missing file
is one clear error:
  * online: `tff.simulation.datasets.stackoverflow.load_data` (342,477
    training users) and the word/tag counts next to it (see
    `sources.load_stackoverflow_vocabularies`).
  * offline / synthetic: TFF's `stackoverflow.get_synthetic()` with its
    synthetic word and tag counts (3 users; the vocabulary is then the
    synthetic one, smaller than `vocab_size`).
"""

from __future__ import annotations

from tensorflow_federated.python.simulation.baselines.stackoverflow import constants
from tensorflow_federated.python.simulation.baselines.stackoverflow import tag_prediction_tasks
from tensorflow_federated.python.simulation.baselines.stackoverflow import word_prediction_preprocessing
from tensorflow_federated.python.simulation.baselines.stackoverflow import word_prediction_tasks
import tensorflow_federated as tff

from tasks import sources
from tasks import task as task_lib

__all__ = [
    'ONLINE_NUM_CLIENTS',
    'build_tag_prediction',
    'build_word_prediction',
    'extended_vocab_size',
]

ONLINE_NUM_CLIENTS = 342477


def extended_vocab_size(vocab_size: int, num_out_of_vocab_buckets: int = 1):
  """Words + out-of-vocabulary buckets + pad, begin and end of sentence."""
  special = word_prediction_preprocessing.get_special_tokens(
      vocab_size, num_out_of_vocab_buckets)
  return vocab_size + special.get_number_of_special_tokens()


def _check_positive(value: int, name: str):
  if value < 1:
    raise ValueError(f'`{name}` must be a positive integer; got {value}.')


def _load(args: task_lib.BuildArgs, word_vocab_size: int):
  """(train, validation, test, word_counts, tag_counts, description)."""
  if args.partition is not None:
    raise ValueError(
        f'Stack Overflow is partitioned by user; partition={args.partition!r} '
        'does not apply (leave it None).')
  datasets = tff.simulation.datasets.stackoverflow
  if args.data_source == 'online':
    train, validation, test = sources.load_tff_dataset(
        'stackoverflow', args.cache_dir, args.download)
    word_counts, tag_counts = sources.load_stackoverflow_vocabularies(
        args.cache_dir, args.download, word_vocab_size)
    source = 'Stack Overflow (TFF, users)'
  else:
    train = validation = test = datasets.get_synthetic()
    word_counts = datasets.get_synthetic_word_counts()
    tag_counts = datasets.get_synthetic_tag_counts()
    source = 'TFF synthetic Stack Overflow'
  train, clients = task_lib.refederate(train, 'tokens', args)
  return (train, validation, test, word_counts, tag_counts,
          f'{source}, {clients}')


def build_word_prediction(
    args: task_lib.BuildArgs, *,
    vocab_size: int = constants.DEFAULT_WORD_VOCAB_SIZE,
    sequence_length: int = constants.DEFAULT_SEQUENCE_LENGTH,
    num_out_of_vocab_buckets: int = 1) -> task_lib.Task:
  """Next-word prediction: embedding 96, LSTM 670, dense 96, logits."""
  _check_positive(vocab_size, 'vocab_size')
  train, validation, test, word_counts, _, description = _load(
      args, vocab_size)
  vocab = list(word_counts)[:vocab_size]
  num_special = extended_vocab_size(len(vocab),
                                    num_out_of_vocab_buckets) - len(vocab)
  baseline = word_prediction_tasks.create_word_prediction_task_from_datasets(
      args.train_client_spec, args.eval_client_spec, sequence_length, vocab,
      num_out_of_vocab_buckets, train, test, validation)
  return task_lib.Task(
      baseline.datasets, baseline.model_fn, name='stackoverflow_next_word',
      data_source=args.data_source,
      model_description=(f'LSTM 670, embedding 96, vocabulary {len(vocab)} + '
                         f'{num_special} special tokens'),
      data_description=description)


def build_tag_prediction(
    args: task_lib.BuildArgs, *,
    word_vocab_size: int = constants.DEFAULT_WORD_VOCAB_SIZE,
    tag_vocab_size: int = constants.DEFAULT_TAG_VOCAB_SIZE) -> task_lib.Task:
  """Tag prediction: bag of words -> sigmoid over the tag vocabulary."""
  _check_positive(word_vocab_size, 'word_vocab_size')
  _check_positive(tag_vocab_size, 'tag_vocab_size')
  train, validation, test, word_counts, tag_counts, description = _load(
      args, word_vocab_size)
  word_vocab = list(word_counts)[:word_vocab_size]
  tag_vocab = list(tag_counts)[:tag_vocab_size]
  baseline = tag_prediction_tasks.create_tag_prediction_task_from_datasets(
      args.train_client_spec, args.eval_client_spec, word_vocab, tag_vocab,
      train, test, validation)
  return task_lib.Task(
      baseline.datasets, baseline.model_fn, name='stackoverflow_tag',
      data_source=args.data_source,
      model_description=(f'logistic regression {len(word_vocab)} words -> '
                         f'{len(tag_vocab)} tags'),
      data_description=description)
