"""A run's views of its records: `metrics.csv` and TensorBoard.

Each is a `tff.program.ReleaseManager` that the round loop
(`tff_clip.program.program_logic.train_model`) hands every released row, keyed by
its round, after the round was appended to `releases.jsonl` (the record a
rerun trusts). Both are views of that log: on resume `metrics.csv` is
rebuilt from it, and TensorBoard is given the released rounds it lacks (a
kill between the record and the view). A write that fails is one
`run_records.RunRecordError` line, never a TensorFlow traceback.

`metrics.csv` is written by `run_records` (atomic files, appends opened
with `O_NOFOLLOW`). TensorBoard's files are written by TensorFlow's
summary writer, which opens them by name: `tensorboard/` is made here
(writable by its owner only) and checked before the writer is created
(`run_records.check_tree`: a real directory of this user's, no symbolic
link and nothing of another user's in it), and its event files are read
back with `run_records.open_file`. The writer keeps its file open, so the
rounds after that check write to what it checked.
"""

from __future__ import annotations

import asyncio
import math
import os

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_clip.program import run_records

__all__ = ['MetricsCsvView', 'TensorBoardView', 'tensorboard_steps']

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
    run_records.append_metrics_csv(self._path, self._rows)


class TensorBoardView(tff.program.ReleaseManager):
  """`tensorboard/`: `tff.program.TensorBoardReleaseManager`, once a step.

  Steps it already holds are skipped; on resume the rounds of `log` it
  lacks are written first. Values are float32 scalars: one beyond float32
  (the epsilon of a tiny z) is left out like a non-finite one.
  """

  def __init__(self, tb_dir: str, log: run_records.ReleaseLog,
               resuming: bool):
    self._dir = tb_dir
    try:
      if not os.path.lexists(tb_dir):
        os.mkdir(tb_dir, run_records.DIR_MODE)
    except OSError as e:
      raise run_records.write_error(tb_dir, e) from None
    run_records.check_tree(tb_dir)  # Before TensorFlow opens a file in it.
    self._steps = tensorboard_steps(tb_dir) if resuming else set()
    try:
      self._writer = tff.program.TensorBoardReleaseManager(tb_dir)
    except (OSError, tf.errors.OpError) as e:
      raise self._error(e) from None
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
      await self._writer.release(values, key=key)
    except (OSError, tf.errors.OpError) as e:
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
