"""What a run directory's files prove was released, and spent.

A DP run whose log of released rounds (`releases.jsonl`) was deleted,
emptied or cut short must never train those rounds again. Every other file
a run writes after releasing a round is evidence that it did: a checkpoint
of round r (written before r's release), the rows of `metrics.csv`,
TensorBoard's steps, `summary.json`, `ledger.json` and `plot.png`.
`release_evidence` reads them all, however damaged, and gives the most they
prove (`tff_clip.program.run_directory.check_released` refuses on it), and
whether any proves a DP round (`check_no_dp_lost`). TensorBoard's
files are read with its protocol buffers alone: no TensorFlow. Every file
is read with `run_records.open_file` (never through a symbolic link:
`RunRecordError`).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
from typing import Any, Mapping, Optional

from tff_clip import checks
from tff_clip import names
from tff_clip.program import checkpoints
from tff_clip.program import run_records

__all__ = ['ReleaseEvidence', 'release_evidence']


@dataclasses.dataclass(frozen=True)
class ReleaseEvidence:
  """The most any surviving file proves a run released.

  Attributes:
    rounds: the highest round number that some file proves was released
      (0: nothing proves a release).
    proof: the file that proves it ('' when `rounds` is 0).
    epsilon: the largest epsilon any file recorded as spent (None: none did).
    event: a round's DP event as a checkpoint or the ledger recorded it
      (`privacy_ledger.event_to_dict`), for rounds no log line describes.
    dp_proof: a file that proves a DP round was released (an epsilon or a
      DP event recorded), '' when none does.
  """
  rounds: int = 0
  proof: str = ''
  epsilon: Optional[float] = None
  event: Optional[Mapping[str, Any]] = None
  dp_proof: str = ''


def _number(value) -> Optional[float]:
  try:
    value = float(value)
  except (TypeError, ValueError):
    return None
  return value if math.isfinite(value) else None


def _round(value) -> Optional[int]:
  """`value` as a round some run could have released, else None: a whole
  number in [0, `checks.MAX_ROUNDS`] (no run's --rounds exceeds it: a
  larger one is damage, and charging it would account that many rounds)."""
  value = _number(value)
  if value is None or value != int(value) or not (
      0 <= value <= checks.MAX_ROUNDS):
    return None
  return int(value)


def _event(data) -> bool:
  """Whether `data` is a round's DP event the accountant can read
  (`privacy_ledger.event_from_dict`): a damaged one is no template."""
  from tff_clip.privacy import privacy_ledger  # pylint: disable=g-import-not-at-top
  try:
    privacy_ledger.event_from_dict(data)
  except (ValueError, TypeError, KeyError):
    return False
  return True


def _csv_evidence(path):
  """(last round, largest epsilon) of a metrics.csv, however damaged."""
  rounds, epsilon = 0, None
  try:
    with run_records.open_file(path, 'r', newline='', errors='replace') as f:
      for row in csv.DictReader(f):
        r = _round(row.get('round'))
        if r is not None:
          rounds = max(rounds, r)
        for key, value in row.items():
          e = (_number(value) if isinstance(key, str) and
               names.is_epsilon_key(key) else None)
          if e is not None:
            epsilon = e if epsilon is None else max(epsilon, e)
  except (OSError, csv.Error, ValueError):
    pass
  return rounds, epsilon


def _json_or_none(path):
  try:
    return json.loads(run_records.read_bytes(path))
  except (OSError, ValueError):
    return None


def _tfrecords(path):
  try:
    yield from run_records.tfrecords(path)
  except OSError:
    return


def _tensorboard_evidence(directory):
  """(last step, largest 'epsilon' scalar) of TensorBoard event files."""
  # TensorBoard's protocol buffers only: no TensorFlow.
  from tensorboard.compat.proto import event_pb2  # pylint: disable=g-import-not-at-top
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top
  rounds, epsilon = 0, None
  run_records.check_tree(directory)
  for root, _, files in os.walk(directory):
    for name in files:
      if 'tfevents' not in name:
        continue
      for record in _tfrecords(os.path.join(root, name)):
        try:
          event = event_pb2.Event.FromString(record)
        except Exception:  # pylint: disable=broad-except
          continue
        if not event.summary.value:
          continue
        rounds = max(rounds, _round(event.step) or 0)
        for value in event.summary.value:
          if not names.is_epsilon_key(value.tag.split('/')[-1]):
            continue
          if value.HasField('tensor'):
            try:
              found = _number(tensor_util.make_ndarray(value.tensor).item())
            except Exception:  # pylint: disable=broad-except
              found = None
          else:
            found = _number(value.simple_value)
          if found is not None:
            epsilon = found if epsilon is None else max(epsilon, found)
  return rounds, epsilon


def release_evidence(run_dir: str) -> ReleaseEvidence:
  """What the files of a DP run directory prove was released (read only).

  Every file a run writes after releasing a round is evidence that it did:
  a checkpoint of round r (written before the release of the rounds it
  holds pending, so those before them were released; r - 1 by its name
  alone when it cannot be read), the rows of
  `metrics.csv`, TensorBoard's steps, `summary.json`'s rounds, the rounds
  of `ledger.json` and, for at least one round, `plot.png`. The epsilon is
  the largest any of them records (`metrics.csv`'s and TensorBoard's
  per-round epsilon, `summary.json`, `ledger.json`). `releases.jsonl`
  itself is not read here (the caller holds it).
  """
  found = [(0, '', None)]  # (rounds, file, epsilon)
  event = None
  event_proof = ''
  store = checkpoints.Checkpoints(os.path.join(run_dir, 'checkpoints'))
  versions = [v for v in store.versions() if _round(v) is not None]
  if versions:
    # Rounds before the newest checkpoint's were released: those before its
    # pending rounds where it can be read (a DP run checkpoints up to
    # --checkpoint_every rounds before releasing them), else all of them.
    rounds = versions[-1] - 1
    for version in reversed(versions):
      try:
        _, header = store.load(version)
      except run_records.RunRecordError:
        continue
      pending = checkpoints.pending_rounds(header, version)
      if pending and version == versions[-1]:
        rounds = pending[0][0] - 1
      if pending and pending[-1][2] and _event(pending[-1][2]):
        event = pending[-1][2]
        event_proof = store.path(version)
        break
    found.append((rounds, store.path(versions[-1]), None))
  path = os.path.join(run_dir, 'metrics.csv')
  if os.path.lexists(path):
    rounds, epsilon = _csv_evidence(path)
    found.append((rounds, path, epsilon))
  path = os.path.join(run_dir, 'summary.json')
  summary = _json_or_none(path)
  if isinstance(summary, Mapping):
    rounds = summary.get('rounds')
    if isinstance(rounds, str):
      rounds = rounds.split(' ')[0]
    found.append((_round(rounds) or 0, path,
                  _number(summary.get('epsilon'))))
  elif os.path.lexists(path):
    found.append((1, path, None))
  path = os.path.join(run_dir, 'ledger.json')
  ledger = _json_or_none(path)
  if isinstance(ledger, Mapping):
    history = ledger.get('epsilon_per_round') or []
    rounds, epsilon = 0, None
    for entry in history if isinstance(history, list) else []:
      if isinstance(entry, list) and len(entry) == 2:
        r, e = _round(entry[0]), _number(entry[1])
        rounds = max(rounds, r or 0)
        if e is not None:
          epsilon = e if epsilon is None else max(epsilon, e)
    groups = ledger.get('ledger')
    groups = groups.get('groups') if isinstance(groups, Mapping) else None
    for group in groups if isinstance(groups, list) else []:
      if isinstance(group, Mapping):
        numbers = group.get('round_nums')
        rounds = max([rounds, *(_round(n) or 0 for n in (
            numbers if isinstance(numbers, list) else ()))])
        if event is None and _event(group.get('event')) and group[
            'event']['type'] != 'NoOpDpEvent':
          event = group['event']
          event_proof = path
    found.append((max(rounds, 1), path, epsilon))
  elif os.path.lexists(path):
    found.append((1, path, None))
  path = os.path.join(run_dir, 'plot.png')
  if os.path.lexists(path):
    found.append((1, path, None))
  path = os.path.join(run_dir, 'tensorboard')
  if os.path.lexists(path):
    rounds, epsilon = _tensorboard_evidence(path)
    found.append((rounds, path, epsilon))
  rounds, proof, _ = max(found, key=lambda f: f[0])
  epsilons = [e for _, _, e in found if e is not None]
  dp_proof = next((f for _, f, e in found if e is not None), event_proof)
  return ReleaseEvidence(rounds=rounds, proof=proof if rounds else '',
                         epsilon=max(epsilons) if epsilons else None,
                         event=event, dp_proof=dp_proof)
