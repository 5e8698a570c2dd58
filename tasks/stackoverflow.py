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

`GeneratedClientData` stands in for the training split at its published
shape (`scripts.benchmark_stackoverflow`): any number of users, each one's
sentences generated on demand from (seed, user id), never all held.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
import math

import tensorflow as tf
from tensorflow_federated.python.simulation.baselines.stackoverflow import constants
from tensorflow_federated.python.simulation.baselines.stackoverflow import tag_prediction_tasks
from tensorflow_federated.python.simulation.baselines.stackoverflow import word_prediction_preprocessing
from tensorflow_federated.python.simulation.baselines.stackoverflow import word_prediction_tasks
import tensorflow_federated as tff

from tasks import sources
from tasks import task as task_lib

__all__ = [
    'GeneratedClientData',
    'GeneratedClientIds',
    'ONLINE_NUM_CLIENTS',
    'ONLINE_NUM_SENTENCES',
    'build_generated_word_prediction',
    'build_tag_prediction',
    'build_word_prediction',
    'extended_vocab_size',
    'generated_vocabulary',
]

# The training split of `tff.simulation.datasets.stackoverflow.load_data`:
# 342,477 users with 135,818,730 sentences, users with fewer than 100
# sentences removed.
ONLINE_NUM_CLIENTS = 342477
ONLINE_NUM_SENTENCES = 135_818_730
MIN_SENTENCES = 100


def extended_vocab_size(vocab_size: int, num_out_of_vocab_buckets: int = 1):
  """Words + out-of-vocabulary buckets + pad, begin and end of sentence."""
  special = word_prediction_preprocessing.get_special_tokens(
      vocab_size, num_out_of_vocab_buckets)
  return vocab_size + special.get_number_of_special_tokens()


def _load(args: task_lib.BuildArgs, word_vocab_size: int):
  """(train, validation, test, word_counts, tag_counts, description)."""
  if args.partition is not None:
    raise ValueError(
        f'Stack Overflow is partitioned by user; partition={args.partition!r} '
        'does not apply (leave it None).')
  datasets = tff.simulation.datasets.stackoverflow
  # The test split: the training users' posts from 2018 on (TFF's split);
  # the validation split: held-out users.
  if args.data_source == 'online':
    train, validation, test = sources.load_tff_dataset(
        'stackoverflow', args.cache_dir, args.download)
    word_counts, tag_counts = sources.load_stackoverflow_vocabularies(
        args.cache_dir, args.download, word_vocab_size)
    source = 'Stack Overflow (TFF, users)'
  else:  # The clients' data is the test data too: evaluates on it.
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
  task_lib.check_positive(vocab_size, 'vocab_size')
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
      data_description=description,
      evaluates_on_clients_data=True)  # `_load`.


def build_tag_prediction(
    args: task_lib.BuildArgs, *,
    word_vocab_size: int = constants.DEFAULT_WORD_VOCAB_SIZE,
    tag_vocab_size: int = constants.DEFAULT_TAG_VOCAB_SIZE) -> task_lib.Task:
  """Tag prediction: bag of words -> sigmoid over the tag vocabulary."""
  task_lib.check_positive(word_vocab_size, 'word_vocab_size')
  task_lib.check_positive(tag_vocab_size, 'tag_vocab_size')
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
      data_description=description,
      evaluates_on_clients_data=True)  # `_load`.


# ----------------------------------------------------------------------------
# Users generated on demand, at the published shape.

# Sentences per user: 100 plus a lognormal excess (spread chosen) whose mean
# makes the published mean 135,818,730 / 342,477 = 396.6, cut at 20,000.
_EXCESS_SIGMA = 1.2
_EXCESS_MU = (math.log(ONLINE_NUM_SENTENCES / ONLINE_NUM_CLIENTS -
                       MIN_SENTENCES) - _EXCESS_SIGMA**2 / 2)
_MAX_SENTENCES = 20_000
# Words per sentence: 1 + Poisson(12) (chosen; the model reads at most
# `sequence_length` of them).
_EXTRA_WORDS = 12.0
# Words are drawn log-uniformly (Zipf-like) from the ranks 0..10 V - 1 of a
# vocabulary of V words: the ranks >= V are out of vocabulary (about 20% at
# V = 10,000).
_WORD_RANKS_PER_VOCAB_WORD = 10


def generated_vocabulary(vocab_size: int) -> list[str]:
  """The words of `GeneratedClientData`, most frequent first: w0, w1, ..."""
  task_lib.check_positive(vocab_size, 'vocab_size')
  return [f'w{rank}' for rank in range(vocab_size)]


class GeneratedClientIds(Sequence):
  """'000000' .. the zero-padded numbers of `num_clients` users, in order.

  A sequence computed on access: `in` and indexing take constant time and
  the ids are not held (TFF's `ClientData.create_tf_dataset_for_client`
  checks membership with `in`, a 3 ms scan of a list of 342,477 ids).
  """

  def __init__(self, num_clients: int):
    task_lib.check_positive(num_clients, 'num_clients')
    self._num_clients = int(num_clients)
    self._width = len(str(self._num_clients - 1))

  def __len__(self) -> int:
    return self._num_clients

  def __getitem__(self, index):
    if isinstance(index, slice):
      return [self[i] for i in range(*index.indices(self._num_clients))]
    if index < 0:
      index += self._num_clients
    if not 0 <= index < self._num_clients:
      raise IndexError(f'user {index} of {self._num_clients}')
    return str(index).zfill(self._width)

  def __contains__(self, client_id) -> bool:
    return (isinstance(client_id, str) and len(client_id) == self._width and
            client_id.isdigit() and int(client_id) < self._num_clients)

  def copy(self) -> list[str]:
    return list(self)


class GeneratedClientData(tff.simulation.datasets.ClientData):
  """Stack Overflow-shaped users, each generated on demand from (seed, id).

  Elements have the keys, dtypes and shapes of
  `tff.simulation.datasets.stackoverflow.load_data` (the text is in
  'tokens'; 'creation_date', 'score', 'tags', 'title' and 'type' are
  placeholders of the same dtypes). A user holds at least 100 sentences, 397
  on average as published (a lognormal excess, at most 20,000), of 1 +
  Poisson(12) words 'w<rank>' drawn Zipf-like over 10 x `vocab_size` ranks
  (`generated_vocabulary(vocab_size)` holds the frequent ones). A user's
  data is a pure function of (seed, user id): nothing is stored, and a
  population of any size costs only what the sampled users' data does.
  """

  def __init__(self, num_clients: int = ONLINE_NUM_CLIENTS, *,
               vocab_size: int = constants.DEFAULT_WORD_VOCAB_SIZE,
               seed: int = 0):
    super().__init__()
    task_lib.check_positive(vocab_size, 'vocab_size')
    self._client_ids = GeneratedClientIds(num_clients)
    self._seed = int(seed)
    self._word_ranks = _WORD_RANKS_PER_VOCAB_WORD * int(vocab_size)
    self._element_type_structure = self._dataset(
        self._client_ids[0]).element_spec

  @property
  def client_ids(self) -> GeneratedClientIds:
    return self._client_ids

  @property
  def serializable_dataset_fn(self):
    return self._dataset

  @property
  def element_type_structure(self):
    return self._element_type_structure

  def _dataset(self, client_id) -> tf.data.Dataset:
    key = tf.stack([tf.constant(self._seed, tf.int64),
                    tf.strings.to_number(client_id, tf.int64)])
    keys = tf.random.experimental.stateless_split(key, 3)
    excess = tf.exp(_EXCESS_MU + _EXCESS_SIGMA * tf.random.stateless_normal(
        [], keys[0], dtype=tf.float64))
    sentences = MIN_SENTENCES + tf.cast(
        tf.minimum(excess, _MAX_SENTENCES - MIN_SENTENCES), tf.int64)
    lengths = 1 + tf.random.stateless_poisson(
        [sentences], keys[1], _EXTRA_WORDS, dtype=tf.int64)
    uniform = tf.random.stateless_uniform(
        [sentences, tf.reduce_max(lengths)], keys[2], dtype=tf.float64)
    ranks = tf.cast(tf.exp(uniform * math.log(self._word_ranks)),
                    tf.int64) - 1
    words = tf.RaggedTensor.from_tensor(
        tf.strings.join(['w', tf.strings.as_string(ranks)]), lengths=lengths)
    tokens = tf.strings.reduce_join(words, axis=1, separator=' ')
    placeholder = tf.fill([sentences], '')
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
        creation_date=placeholder, score=tf.zeros([sentences], tf.int64),
        tags=placeholder, title=placeholder, tokens=tokens,
        type=tf.fill([sentences], 'answer')))


def build_generated_word_prediction(
    num_clients: int = ONLINE_NUM_CLIENTS, *,
    train_client_spec: tff.simulation.baselines.ClientSpec,
    vocab_size: int = constants.DEFAULT_WORD_VOCAB_SIZE,
    sequence_length: int = constants.DEFAULT_SEQUENCE_LENGTH,
    test_clients: int = 1, seed: int = 0) -> task_lib.Task:
  """Next-word prediction (TFF's LSTM) on `GeneratedClientData` users.

  The training users are `GeneratedClientData(num_clients, seed=seed)`; the
  test data are `test_clients` other users (seed + 1).
  """
  task_lib.check_positive(test_clients, 'test_clients')
  train = GeneratedClientData(num_clients, vocab_size=vocab_size, seed=seed)
  test = GeneratedClientData(test_clients, vocab_size=vocab_size,
                             seed=seed + 1)
  vocab = generated_vocabulary(vocab_size)
  baseline = word_prediction_tasks.create_word_prediction_task_from_datasets(
      train_client_spec, None, sequence_length, vocab, 1, train,
      test.create_tf_dataset_from_all_clients(), None)
  return task_lib.Task(
      baseline.datasets, baseline.model_fn, name='stackoverflow_next_word',
      data_source='synthetic',
      model_description=(f'LSTM 670, embedding 96, vocabulary {vocab_size} + '
                         f'{extended_vocab_size(vocab_size) - vocab_size} '
                         'special tokens'),
      data_description=(f'{num_clients:,} generated Stack Overflow users '
                        f'(seed {seed})'),
      evaluates_on_clients_data=False)  # Other users (seed + 1).
