"""Specification: a DP run's TensorBoard view releases no clock.

TensorFlow's summary writer stamps each event with the time it was written
and names its file after the time and the host: per-round differences of
those times track the round's seconds and cohort size, which a DP run
withholds. `release_managers.TensorBoardView` writes each event's
`wall_time` from its step (the round number, by default) and names a file
after the first step it holds. Read back here by TensorBoard's own
readers: the raw events and TensorBoard's event accumulator.
"""

import asyncio
import math
import os
import re
import socket

from tensorboard.backend.event_processing import event_accumulator
import pytest
import tensorflow as tf

from tff_clip.program import release_managers
from tff_clip.program import run_records

_NAME = re.compile(r'events\.out\.tfevents\.(\d{10})\.(\d+)\.tff_clip')


def _row(round_num):
  return dict(round=round_num, epsilon=0.5 * round_num, clip_norm=0.25,
              eval_loss=math.nan, eval_accuracy=1 / round_num)


def _release(run_dir, view, round_num):
  """Round `round_num` released as the round loop does: recorded, shown."""
  run_records.ReleaseLog(str(run_dir)).append(round_num, _row(round_num), None)
  asyncio.run(view.release(_row(round_num), key=round_num))


def _view(run_dir, resuming, **kwargs):
  return release_managers.TensorBoardView(
      str(run_dir / 'tensorboard'), run_records.ReleaseLog(str(run_dir)),
      resuming, **kwargs)


def _events(run_dir):
  """Every event of every file, in TensorBoard's order of the files."""
  directory = run_dir / 'tensorboard'
  return [event for name in sorted(os.listdir(directory))
          for event in tf.compat.v1.train.summary_iterator(
              str(directory / name))]


def test_every_event_of_a_dp_view_has_its_round_as_wall_time(tmp_path):
  run_dir = tmp_path / 'run'
  run_dir.mkdir()
  view = _view(run_dir, resuming=False)
  for round_num in (1, 2, 3):
    _release(run_dir, view, round_num)
  events = _events(run_dir)
  assert events[0].file_version == 'brain.Event:2'
  assert [event.step for event in events] == [1, 1, 2, 3]
  assert [event.wall_time for event in events] == [1.0, 1.0, 2.0, 3.0]


def test_a_dp_views_file_is_named_after_its_first_round_not_a_time_or_host(
    tmp_path):
  run_dir = tmp_path / 'run'
  run_dir.mkdir()
  _release(run_dir, _view(run_dir, resuming=False), 1)
  (name,) = os.listdir(run_dir / 'tensorboard')
  assert _NAME.fullmatch(name).groups() == ('0000000001', '0')
  assert socket.gethostname() not in name


def test_tensorboard_reads_the_scalars_of_a_resumed_view_in_order(tmp_path):
  run_dir = tmp_path / 'run'
  run_dir.mkdir()
  view = _view(run_dir, resuming=False)
  _release(run_dir, view, 1)
  _release(run_dir, view, 2)
  resumed = _view(run_dir, resuming=True)
  _release(run_dir, resumed, 3)
  names = sorted(os.listdir(run_dir / 'tensorboard'))
  assert [_NAME.fullmatch(n).group(1) for n in names] == ['0000000001',
                                                           '0000000003']
  accumulator = event_accumulator.EventAccumulator(
      str(run_dir / 'tensorboard'))
  accumulator.Reload()
  epsilon = accumulator.Tensors('epsilon')
  assert [(e.step, e.wall_time) for e in epsilon] == [(1, 1.0), (2, 2.0),
                                                       (3, 3.0)]
  assert [float(tf.make_ndarray(e.tensor_proto)) for e in epsilon] == [
      0.5, 1.0, 1.5]
  assert 'eval_loss' not in accumulator.Tags()['tensors']  # NaN: left out.


def test_a_view_without_dp_writes_its_clocks_time(tmp_path):
  run_dir = tmp_path / 'run'
  run_dir.mkdir()
  view = _view(run_dir, resuming=False, clock=lambda step: 1e9 + step / 4)
  _release(run_dir, view, 1)
  _release(run_dir, view, 2)
  assert [e.wall_time for e in _events(run_dir)] == [1e9 + 0.25] * 2 + [
      1e9 + 0.5]


def test_a_link_in_the_way_is_refused_and_never_written_through(tmp_path):
  run_dir = tmp_path / 'run'
  (run_dir / 'tensorboard').mkdir(parents=True)
  elsewhere = tmp_path / 'elsewhere'
  elsewhere.write_text('mine')
  taken = run_dir / 'tensorboard' / 'events.out.tfevents.0000000001.0.tff_clip'
  taken.symlink_to(elsewhere)
  with pytest.raises(run_records.RunRecordError, match='symbolic link'):
    _release(run_dir, _view(run_dir, resuming=False), 1)
  assert elsewhere.read_text() == 'mine'
  assert sorted(p.name for p in (run_dir / 'tensorboard').iterdir()) == [
      taken.name]


def test_a_file_in_the_way_is_never_opened_or_written(tmp_path):
  run_dir = tmp_path / 'run'
  (run_dir / 'tensorboard').mkdir(parents=True)
  taken = run_dir / 'tensorboard' / 'events.out.tfevents.0000000001.0.tff_clip'
  taken.write_text('mine')
  _release(run_dir, _view(run_dir, resuming=False), 1)
  assert taken.read_text() == 'mine'
  assert (run_dir / 'tensorboard' /
          'events.out.tfevents.0000000001.1.tff_clip').is_file()
