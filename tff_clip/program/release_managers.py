"""A run's views of its records: `metrics.csv` and TensorBoard.

Each is a `tff.program.ReleaseManager` that the round loop
(`tff_clip.program.program_logic.train_model`) hands every released row, keyed by
its round, after the round was appended to `releases.jsonl` (the record a
rerun trusts). Both are views of that log: on resume `metrics.csv` is
rebuilt from it, and TensorBoard is given the released rounds it lacks (a
kill between the record and the view). A write that fails is one
`run_records.RunRecordError` line, never a TensorFlow traceback.

TensorBoard's event files are written here (tensorboard's record format,
no TensorFlow writer) so that a DP run releases no clock: TensorFlow's
writer stamps every event with the time it was written (per-round
differences that track the withheld round seconds and cohort size) and
names the file after the time and the host. Here each event's `wall_time`
is what the view's `clock` says of its step -- the round number under DP
-- and a file is named after the first step it holds.

`metrics.csv` is written by `run_records` (atomic files, appends opened
with `O_NOFOLLOW`). `tensorboard/` is made here (writable by its owner
only) and checked before a file is created in it (`run_records.check_tree`:
a real directory of this user's, no symbolic link and nothing of another
user's in it); event files are created with `O_EXCL | O_NOFOLLOW` and read
back with `run_records.tfrecords`.
"""

from __future__ import annotations

import asyncio
import math
import os
from typing import Callable, Optional

import numpy as np
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.summary.writer import record_writer
from tensorboard.util import tensor_util
import tensorflow as tf
import tensorflow_federated as tff

from tff_clip.program import run_records

__all__ = ['MetricsCsvView', 'TensorBoardView', 'round_clock',
           'tensorboard_steps']

_FLOAT32_MAX = float(np.finfo(np.float32).max)


class MetricsCsvView(tff.program.ReleaseManager):
  """`metrics.csv`: the released rows as `releases.jsonl` holds them.

  Rebuilt from the log when the run resumes or the file exists (a damaged
  or truncated file is repaired); then one line appended per release.
  """

  def __init__(self, log: run_records.ReleaseLog, csv_path: str,
               resuming: bool):
    self._log = log
    self._path = csv_path
    self._rows = log.rows()
    if resuming or os.path.lexists(csv_path):
      run_records.write_metrics_csv(csv_path, self._rows)

  async def release(self, value, key):
    del value  # The row as the log holds it (key: its round).
    self._rows.append(self._log.row(key))
    run_records.append_metrics_csv(self._path, self._rows, sync=False)

  def sync(self) -> None:
    """Makes the rows released so far durable (a release of many rounds
    syncs once, after the last)."""
    run_records.sync_file(self._path)


class _EventFile:
  """A TensorBoard event file of scalars, each event flushed as written.

  Named `events.out.tfevents.<first step, 10 digits>.<n>.tff_clip` (n: the
  first free number): the files of a resumed run sort after the earlier
  ones, as TensorBoard reads them. Never opened through a symlink, never
  over an existing file. `wall_time` of every event: `clock(step)`.
  """

  def __init__(self, directory: str, first_step: int,
               clock: Callable[[int], float]):
    self._clock = clock
    n = 0
    while True:
      path = os.path.join(
          directory, f'events.out.tfevents.{first_step:010d}.{n}.tff_clip')
      try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL |
                     getattr(os, 'O_NOFOLLOW', 0), run_records.FILE_MODE)
        break
      except FileExistsError:
        n += 1
    self._records = record_writer.RecordWriter(os.fdopen(fd, 'wb'))
    self._write(event_pb2.Event(wall_time=clock(first_step), step=first_step,
                                file_version='brain.Event:2'))

  def _write(self, event):
    self._records.write(event.SerializeToString())
    self._records.flush()

  def write_scalars(self, values, step: int) -> None:
    """One event at `step` with a float32 scalar per name, as
    `tf.summary.scalar` writes it (the scalars plugin's tensor form)."""
    summary = summary_pb2.Summary(value=[
        summary_pb2.Summary.Value(
            tag=name, metadata=scalar_metadata.create_summary_metadata('', ''),
            tensor=tensor_util.make_tensor_proto(np.float32(value)))
        for name, value in values.items()])
    self._write(event_pb2.Event(wall_time=self._clock(step), step=step,
                                summary=summary))


def round_clock(step: int) -> float:
  """A DP run's TensorBoard `wall_time`: the round number, not a time."""
  return float(step)


class TensorBoardView(tff.program.ReleaseManager):
  """`tensorboard/`: the released rows as scalars, once a step.

  Steps it already holds are skipped; on resume the rounds of `log` it
  lacks are written first. Values are float32 scalars: one beyond float32
  (the epsilon of a tiny z) is left out like a non-finite one. `clock`:
  each event's `wall_time` from its step (default `round_clock`, what a DP
  run writes; a run without DP may pass `lambda step: time.time()`).
  """

  def __init__(self, tb_dir: str, log: run_records.ReleaseLog,
               resuming: bool,
               clock: Optional[Callable[[int], float]] = None):
    self._dir = tb_dir
    self._clock = clock or round_clock
    self._file = None  # Opened at the first step written.
    try:
      if not os.path.lexists(tb_dir):
        os.mkdir(tb_dir, run_records.DIR_MODE)
    except OSError as e:
      raise run_records.write_error(tb_dir, e) from None
    run_records.check_tree(tb_dir)  # Before a file is created in it.
    self._steps = tensorboard_steps(tb_dir) if resuming else set()
    for row in log.rows():
      asyncio.run(self.release(row, key=row['round']))

  def _error(self, e) -> run_records.RunRecordError:
    """A full disk or a bad directory, as one line."""
    reason = getattr(e, 'message', None) or str(e)
    if isinstance(e, tf.errors.ResourceExhaustedError) or (
        'No space left on device' in reason):
      reason = 'no space left on the device'
    # TensorFlow's messages open with {{function_node ...}}: not news.
    reason = ' '.join(reason.split('}}')[-1].split()) or type(e).__name__
    return run_records.RunRecordError(
        f'cannot write {self._dir}: {reason}. The released rounds are '
        f'recorded in {run_records.RELEASES}; a rerun writes them to '
        'TensorBoard.')

  async def release(self, value, key):
    if key in self._steps:
      return
    values = {k: v for k, v in value.items()
              if k != 'round' and math.isfinite(v) and abs(v) <= _FLOAT32_MAX}
    try:
      if self._file is None:
        self._file = _EventFile(self._dir, key, self._clock)
      self._file.write_scalars(values, key)
    except OSError as e:
      raise self._error(e) from None
    self._steps.add(key)


def tensorboard_steps(tb_dir: str) -> set[int]:
  """The steps with values in the event files under `tb_dir`.

  No link is followed (`run_records.check_tree`, `run_records.tfrecords`);
  a record torn by a kill mid-write is skipped.
  """
  steps = set()
  run_records.check_tree(tb_dir)
  for root, _, files in os.walk(tb_dir):
    for name in files:
      if not name.startswith('events.out.tfevents.'):
        continue
      for record in run_records.tfrecords(os.path.join(root, name)):
        try:
          event = tf.compat.v1.Event.FromString(record)
        except Exception:  # pylint: disable=broad-except
          continue  # Damaged: not a released step.
        if event.summary.value:
          steps.add(int(event.step))
  return steps
