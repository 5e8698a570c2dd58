"""The round loop: train, account, checkpoint, release, round after round.

The program logic of TFF's federated programs (TFF's
`examples/program/program_logic.py`): `train_model` is handed the parts a
configuration assembled (`tff_clip.program.assembly`) -- the learning process, the
cohort sampler and the clients' data, the evaluation, the run's state
manager and its release managers -- and reads no configuration. What a
round does depends on (seed, round number) and the state it is handed.

Every round's row goes, filtered by the run's `released` filter (under DP:
only what epsilon covers, `RELEASED`), first to the run's record (the state
manager's `record`: `releases.jsonl` with the round's DP event, which a
rerun trusts), then to each release manager, each wrapped in the same
filter (`tff.program.FilteringReleaseManager`). A new release destination
is one `tff.program.ReleaseManager` added to that list.

A DP round is released only once a checkpoint holds it, with its row: the
rounds since the last checkpoint are held, and every `checkpoint_every`-th
round (and the last) is checkpointed with the rows held, then they are
released. No released round is ever computed again (that would release a
second aggregate under the same noise); rounds killed before their
checkpoint were never released and are computed again, and rounds killed
between the checkpoint and their release are released from it on resume
(`restored`'s pending rounds). Without DP a round is released first and
checkpointed when due: a kill in between runs the rounds after the
checkpoint again.

Importing this module imports no TensorFlow.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import math
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from tff_clip import names

__all__ = ['Accounting', 'EVALUATION', 'NOT_COVERED', 'RELEASED', 'Schedule',
           'flatten_metrics', 'not_covered', 'released_metric', 'train_model']

# Per-round columns a DP run releases: covered by epsilon (or public).
# The damped server step's learning-rate scale (`server_step`) and the
# adaptive norm's target quantile (moved, if at all, by the released norms:
# `noise_following.QuantileSwitch`) are computed from released aggregates
# only: post-processing, covered too.
RELEASED = ('round', names.EPSILON, 'clip_norm', 'target_quantile',
            'server_step_scale', 'eval_loss', 'eval_accuracy')
# Data-dependent columns epsilon does not cover: the realised cohort size
# (Poisson), client-side training metrics, a synthetic task's objective
# (computed on the clients' data) and round timings (which grow with the
# cohort). Released under DP only with `release_uncovered_metrics`.
NOT_COVERED = ('clients', 'train_loss', 'train_accuracy', 'objective',
               'seconds')
# And the evaluation of a task whose test data are its training clients' data
# (`tasks.Task.evaluates_on_clients_data`: the synthetic problems, TFF's
# synthetic data sets, EMNIST, Shakespeare and Stack Overflow), or of a task
# that does not say (TFF's own baseline tasks: EMNIST, Shakespeare and Stack
# Overflow test on their training writers', roles' and users' data).
EVALUATION = ('eval_loss', 'eval_accuracy')


def not_covered(task) -> tuple:
  """The columns epsilon does not cover in a DP run of `task`; its
  evaluation too unless it says its test data is no client's
  (`evaluates_on_clients_data` False)."""
  return NOT_COVERED + (
      EVALUATION if getattr(task, 'evaluates_on_clients_data', True) else ())

# Where the learning process reports the round's clip norm: tff_clip's DP
# query, TFF's DP query, tff_clip's bounding without noise.
_CLIP_NORM_METRICS = ('aggregator/dp_query_metrics/clip_norm',
                      'aggregator/dp_query_metrics/clip',
                      'aggregator/clip_norm')
# The quantile tff_clip's adaptive norm tracks next, where it can move.
_TARGET_QUANTILE_METRIC = 'aggregator/dp_query_metrics/target_quantile'


def released_metric(private: bool, release_uncovered_metrics: bool = False,
                    uncovered: tuple = NOT_COVERED):
  """The release filter: under DP, only what epsilon covers (by default).

  A `filter_fn` of `tff.program.FilteringReleaseManager` (True: release the
  metric at `path`); the record and every release manager of a run are
  filtered by it. `uncovered`: the columns withheld (`not_covered`).
  """
  if not private or release_uncovered_metrics:
    return lambda path: True
  return lambda path: path[-1] not in uncovered


@dataclasses.dataclass(frozen=True)
class Schedule:
  """How many rounds, and when to evaluate and checkpoint.

  A DP run checkpoints every `checkpoint_every`-th round and the last
  (then releases the rounds since the last checkpoint); a run without DP
  after every `checkpoint_every`-th round once `checkpoint_interval_s`
  passed since the last, and after the last round.
  """
  rounds: int
  eval_every: int = 1
  checkpoint_every: int = 1
  checkpoint_interval_s: float = 0.0


@dataclasses.dataclass
class Accounting:
  """What a DP run accounts: each round's event, into `ledger`.

  `round_event(state, round_num)` is the DP event the round ran (its
  sampling included); each released row carries the run's one epsilon at
  `delta` (`ledger.report`: PLD where it applies, RDP otherwise) under the
  column `names.epsilon_key` (its accountant and delta, and NOT_PRIVATE
  when `private` is False: seeded, predictable noise). `last`: the
  guarantee of the last row made (its round's epsilon).
  """
  round_event: Callable[[Any, int], Any]
  ledger: Any  # privacy_ledger.PrivacyLedger
  delta: float
  private: bool = True
  last: Any = None

  def epsilon_column(self):
    """(column name, epsilon) of the ledger's rounds so far; the next
    round's figure is then computed ahead, while that round trains
    (`PrivacyLedger.report_ahead`)."""
    self.last = self.ledger.report(self.delta)
    self.ledger.report_ahead(self.delta)
    return (names.epsilon_key(self.last.accountant, self.last.delta,
                              self.private), self.last.epsilon)


def flatten_metrics(value, prefix: str = '', out=None) -> dict[str, float]:
  """{'a/b/c': float}: the scalar leaves of nested metrics."""
  out = {} if out is None else out
  if isinstance(value, (dict, collections.OrderedDict)):
    for key, item in value.items():
      flatten_metrics(item, f'{prefix}/{key}' if prefix else str(key), out)
  elif isinstance(value, (list, tuple)) and not hasattr(value, '_fields'):
    for i, item in enumerate(value):
      flatten_metrics(item, f'{prefix}/{i}', out)
  else:
    array = np.asarray(value)
    if array.size == 1 and array.dtype.kind in 'fiub':
      out[prefix] = float(array)
  return out


def _train_row(round_num, cohort, metrics, accounting):
  row = collections.OrderedDict(round=round_num, clients=len(cohort))
  row['train_loss'] = metrics.get('client_work/train/loss', math.nan)
  row['train_accuracy'] = metrics.get(
      'client_work/train/sparse_categorical_accuracy',
      metrics.get('client_work/train/accuracy', math.nan))
  row['clip_norm'] = next((metrics[k] for k in _CLIP_NORM_METRICS
                           if k in metrics), math.nan)
  if _TARGET_QUANTILE_METRIC in metrics:
    row['target_quantile'] = metrics[_TARGET_QUANTILE_METRIC]
  if accounting is None:
    row[names.EPSILON] = math.inf
  else:
    key, epsilon = accounting.epsilon_column()
    row[key] = epsilon
  return row


def _server_step_scale(state):
  """The server step's learning-rate scale in `state` (the damped and held
  steps'), or None (another server optimizer)."""
  from tff_clip.learning import server_step  # pylint: disable=g-import-not-at-top
  return server_step.step_scale(getattr(state, 'finalizer', None))


class _Releases:
  """Releases a round: to the record, then to each filtered manager."""

  def __init__(self, state_manager, release_managers, released):
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    self._state_manager = state_manager
    self._released = released
    self._managers = [tff.program.FilteringReleaseManager(manager, released)
                      for manager in release_managers]
    # Managers whose files are made durable once a release (`sync`).
    self._syncing = [m for m in release_managers if hasattr(m, 'sync')]
    # One event loop for the run's releases (not one a round: `close`).
    self._runner = asyncio.Runner()

  def filtered(self, row):
    return {k: v for k, v in row.items() if self._released((k,))}

  def release(self, rows):
    """Releases `rows` [(round, row, event), ...] in order, each to the
    record and then to every manager (one pass of the event loop for all:
    a pass a row was a millisecond of every round), then makes the record
    and the managers' files durable, once for all (an fsync a row was half
    a millisecond)."""

    async def release_all():
      for round_num, row, event in rows:
        self._state_manager.record(round_num, self.filtered(row), event)
        for manager in self._managers:
          await manager.release(row, key=round_num)

    self._runner.run(release_all())
    if rows:
      self._state_manager.sync()
      for manager in self._syncing:
        manager.sync()

  def close(self):
    self._runner.close()


def train_model(*, process, sampler, client_data, evaluate: Callable,
                state_manager, release_managers: Sequence[Any],
                schedule: Schedule, restored,
                accounting: Optional[Accounting] = None,
                objective: Optional[Callable] = None,
                released: Callable = released_metric(False),
                progress=None, last_eval=None):
  """Trains rounds up to `schedule.rounds` from `restored`; the final state.

  Args:
    process: runs a round: `next(state, client_datasets)` with `.state` and
      `.metrics`, and `get_model_weights(state)` (a runner of
      `tff_clip.program.assembly.runners`, or a TFF learning process).
    sampler: `sample(round_num)`, the round's cohort of client ids.
    client_data: `datasets(cohort, round_num)`, the cohort's datasets.
    evaluate: `evaluate(state)`, an ordered dict (eval_loss, eval_accuracy).
    state_manager: the run's program state (`run_directory.RunState`):
      `checkpoint(round_num, state, pending=())`,
      `record(round_num, row, event)` and `sync()` (the rounds recorded
      durable).
    release_managers: `tff.program.ReleaseManager`s, each handed every
      released row with the round number as key, filtered by `released`.
    schedule: the rounds, evaluation and checkpoint schedule.
    restored: (state, first round to train, pending [(round, row, event),
      ...]), as `state_manager.restore` returns them.
    accounting: a DP run's ledger (None without DP).
    objective: `objective(trainable weights)`, a synthetic problem's
      measure of progress released as the row's 'objective', or None.
    released: the run's release filter (`released_metric`).
    progress: `update(round_num, row, last_eval, guarantee)` after each
      round's release (`guarantee`: the row's epsilon, as `accounting.last`
      was when the row was made; None without DP).
    last_eval: the last released evaluation (of a resumed run).
  """
  releases = _Releases(state_manager, release_managers, released)
  try:
    state, start_round, pending = restored
    # Killed between a checkpoint and its releases: release the saved rows
    # (those rounds are never computed again).
    for round_num, _, event in pending or ():
      accounting.ledger.record(round_num, event)
    releases.release(pending or ())
    held = []  # A DP run's rounds since its last checkpoint, unreleased.
    last_eval = last_eval or collections.OrderedDict(eval_loss=math.nan,
                                                     eval_accuracy=math.nan)
    last_checkpoint = -math.inf
    for round_num in range(start_round, schedule.rounds + 1):
      started = time.perf_counter()
      cohort = sampler.sample(round_num)
      # An empty Poisson cohort still runs: the aggregator adds its noise to
      # an empty sum, so the released model does not reveal that it was empty.
      output = process.next(state, client_data.datasets(cohort, round_num))
      state = output.state
      event = None
      if accounting is not None:  # The event the aggregator actually ran.
        event = accounting.round_event(state, round_num)
        accounting.ledger.record(round_num, event)
      row = _train_row(round_num, cohort, flatten_metrics(output.metrics),
                       accounting)
      scale = _server_step_scale(state)
      if scale is not None:
        row['server_step_scale'] = scale
      if objective is not None:
        row['objective'] = float(objective(
            process.get_model_weights(state).trainable))
      row['seconds'] = time.perf_counter() - started
      row.update(eval_loss=math.nan, eval_accuracy=math.nan)
      if round_num % schedule.eval_every == 0 or round_num == schedule.rounds:
        last_eval = evaluate(state)
        row.update(last_eval)
      if accounting is not None:
        held.append((round_num, row, event, last_eval, accounting.last))
        if (round_num % schedule.checkpoint_every == 0 or
            round_num == schedule.rounds):
          # Checkpoint (with the rows, as their releases will show them),
          # then release.
          state_manager.checkpoint(round_num, state, pending=[
              (r, releases.filtered(r_row), r_event)
              for r, r_row, r_event, _, _ in held])
          releases.release([(r, r_row, r_event)
                            for r, r_row, r_event, _, _ in held])
          if progress is not None:
            for r, r_row, _, r_eval, r_guarantee in held:
              progress.update(r, r_row, r_eval, r_guarantee)
          held = []
        continue
      releases.release([(round_num, row, event)])
      if (round_num % schedule.checkpoint_every == 0 and
          time.monotonic() - last_checkpoint >= schedule.checkpoint_interval_s
         ) or round_num == schedule.rounds:
        last_checkpoint = time.monotonic()
        state_manager.checkpoint(round_num, state)
      if progress is not None:
        progress.update(round_num, row, last_eval, None)
  finally:
    releases.close()
  return state
