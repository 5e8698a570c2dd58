"""Shakespeare next-character prediction with the char-LSTM of Reddi et al.

Data sources (all in TFF's format, one `snippets` string per example, so
TFF's preprocessing and model are reused unchanged):
  * online: `tff.simulation.datasets.shakespeare.load_data` (LEAF: 715
    play/role clients).
  * offline: the shared `tinyshakespeare.txt`, split by speaking role the way
    LEAF splits the plays: one client per role, one snippet per speech. The
    file has no play titles, so a role name that recurs across plays (e.g.
    'First Citizen') is one client. Roles with fewer than `min_speeches`
    speeches are dropped (TFF drops roles with fewer than 2, so each has a
    train and a test snippet); `test_fraction` of each role's speeches
    (at least one) form its test set.
  * synthetic: `tff.simulation.datasets.shakespeare.get_synthetic()`.

Vocabulary: TFF's 86 characters + pad, out-of-vocabulary, begin and end of
sequence tokens = 90 (`VOCAB_SIZE`).
"""

from __future__ import annotations

import collections
import os
import re
from typing import Optional

import numpy as np
from tensorflow_federated.python.simulation.baselines.shakespeare import char_prediction_tasks
import tensorflow_federated as tff

from tasks import sources
from tasks import task as task_lib

__all__ = [
    'ONLINE_NUM_CLIENTS',
    'SHARED_FILE_NAME',
    'VOCAB_SIZE',
    'build',
    'load_offline',
    'parse_speeches',
]

SHARED_FILE_NAME = 'tinyshakespeare.txt'
VOCAB_SIZE = char_prediction_tasks.VOCAB_LENGTH
DEFAULT_SEQUENCE_LENGTH = char_prediction_tasks.DEFAULT_SEQUENCE_LENGTH
ONLINE_NUM_CLIENTS = 715
# A speech is a block after a blank line whose first line is `ROLE NAME:`.
_ROLE_LINE = re.compile(r"^([A-Z][A-Za-z' .,&-]{0,40}):$")


def parse_speeches(text: str, source: str = '<text>'
                  ) -> collections.OrderedDict:
  """Speeches of each role, in order: {role: [speech, ...]}.

  Args:
    text: a play text where every speech starts, after a blank line, with a
      line `ROLE NAME:`.
    source: name of the text for error messages (e.g. its path).

  Returns:
    An `OrderedDict` from role name to its list of speeches (lines joined by
    newlines), roles in order of first appearance. Role lines without text
    (stage directions removed from the source) are skipped.

  Raises:
    ValueError: no role line was found.
  """
  speeches = collections.OrderedDict()
  for block in re.split(r'\n[ \t]*\n', text.replace('\r\n', '\n')):
    first, _, rest = block.strip('\n').partition('\n')
    match = _ROLE_LINE.match(first.strip())
    if match and rest.strip():
      speeches.setdefault(match.group(1), []).append(rest.strip())
  if not speeches:
    raise ValueError(
        f'{source} has no speeches: expected blocks separated by blank lines, '
        "each starting with a role line such as 'First Citizen:'.")
  return speeches


def load_offline(path: Optional[str] = None,
                 min_speeches: int = 2,
                 test_fraction: float = 0.2,
                 seed: int = 0):
  """(train, test) `ClientData` of the shared text, one client per role.

  Args:
    path: the text file; default `shared_data_dir()/tinyshakespeare.txt`.
    min_speeches: roles with fewer speeches are dropped (at least 2, so each
      role has a train and a test speech).
    test_fraction: share of each role's speeches (at least 1) held out.
    seed: seed of the per-role train/test split.

  Returns:
    (train, test) `tff.simulation.datasets.ClientData` with the same role
    client ids and `snippets` string elements, as `shakespeare.load_data`.
  """
  if min_speeches < 2:
    raise ValueError(f'`min_speeches` must be at least 2 (one train and one '
                     f'test speech per role); got {min_speeches}.')
  if not 0.0 < test_fraction < 1.0:
    raise ValueError(f'`test_fraction` must be in (0, 1); got {test_fraction}.')
  path = path or os.path.join(sources.shared_data_dir(), SHARED_FILE_NAME)
  if not os.path.isfile(path):
    raise sources.DataNotAvailableError(
        f'Shakespeare text {path} does not exist; see shared/data/README.md '
        f'or set {sources.SHARED_DATA_ENV}.')
  with open(path, encoding='utf-8') as f:
    speeches = parse_speeches(f.read(), source=path)
  rng = np.random.default_rng(seed)
  train, test = {}, {}
  for role, texts in speeches.items():
    if len(texts) < min_speeches:
      continue
    order = rng.permutation(len(texts))
    num_test = max(1, int(round(test_fraction * len(texts))))
    pick = lambda ix: collections.OrderedDict(
        snippets=np.array([texts[i].encode('utf-8') for i in sorted(ix)],
                          dtype=object))
    test[role] = pick(order[:num_test])
    train[role] = pick(order[num_test:])
  if not train:
    raise ValueError(
        f'No role in {path} has {min_speeches} or more speeches.')
  return (task_lib.ArrayClientData(train),
          tff.simulation.datasets.TestClientData(test))


def build(args: task_lib.BuildArgs, *,
          sequence_length: int = DEFAULT_SEQUENCE_LENGTH,
          min_speeches: int = 2,
          text_path: Optional[str] = None) -> task_lib.Task:
  """Shakespeare char-LSTM task (TFF's preprocessing and model)."""
  if args.partition is not None:
    raise ValueError(
        f'Shakespeare is partitioned by speaking role; partition='
        f'{args.partition!r} does not apply (leave it None).')
  if args.data_source == 'online':
    train, test = sources.load_tff_dataset('shakespeare', args.cache_dir,
                                           args.download)
    source = 'Shakespeare (TFF/LEAF, play roles)'
  elif args.data_source == 'offline':
    train, test = load_offline(text_path, min_speeches, seed=args.seed)
    source = 'tinyshakespeare.txt by speaking role'
  else:
    train = test = tff.simulation.datasets.shakespeare.get_synthetic()
    source = 'TFF synthetic Shakespeare'
  train, clients = task_lib.refederate(train, 'snippets', args)
  baseline = (
      char_prediction_tasks.create_character_prediction_task_from_datasets(
          args.train_client_spec, args.eval_client_spec, sequence_length,
          train, test))
  return task_lib.Task(
      baseline.datasets, baseline.model_fn, name='shakespeare',
      data_source=args.data_source,
      model_description='char-LSTM: embedding 8, 2 x LSTM 256 (Reddi et al.)',
      data_description=f'{source}, {clients}',
      # Every source tests on the training roles' speeches: held out (online,
      # offline) or the training data itself (TFF's synthetic set).
      evaluates_on_clients_data=True)
