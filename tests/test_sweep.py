"""Specification of the sweep runner (`scripts.sweep`)."""

import csv
import json
import re

from absl import app
import pytest

from scripts import sweep
import as_a_user  # pylint: disable=g-bad-import-order


def test_grid_expands_to_every_combination():
  grid = sweep.parse_grid(['bounding=clip,normalize', 'noise_multiplier=0,1'])
  labels = [label for label, _ in sweep.cells(grid)]
  assert labels == ['bounding=clip_noise_multiplier=0',
                    'bounding=clip_noise_multiplier=1',
                    'bounding=normalize_noise_multiplier=0',
                    'bounding=normalize_noise_multiplier=1']


@pytest.mark.parametrize('entry', ['bounding', 'seed=1,2', '=1'])
def test_malformed_or_reserved_grid_is_a_usage_error(entry):
  with pytest.raises(app.UsageError):
    sweep.parse_grid([entry])


def _fake_run(directory, accuracy, epsilon, seconds):
  directory.mkdir(parents=True)
  (directory / 'summary.json').write_text(json.dumps(
      {'final_eval_accuracy': accuracy, 'epsilon': epsilon}))
  (directory / 'metrics.csv').write_text(
      'round,clipped_fraction,seconds\n'
      f'1,0.5,{seconds}\n2,0.25,{seconds}\n')


def test_summary_reports_mean_and_std_over_seeds(tmp_path):
  grid = sweep.parse_grid(['bounding=clip'])
  setting = {'bounding': 'clip'}
  for seed, accuracy, seconds in ((0, 0.8, 1.0), (1, 0.6, 3.0)):
    _fake_run(tmp_path / sweep.cell_name('bounding=clip', seed, (), setting),
              accuracy, 2.0, seconds)
  rows = sweep.summarise(str(tmp_path), grid, seeds=2)
  assert rows[0]['accuracy_mean'] == pytest.approx(0.7)
  assert rows[0]['accuracy_std'] == pytest.approx(0.1414, rel=1e-3)
  assert rows[0]['epsilon'] == pytest.approx(2.0)
  assert rows[0]['clipped_fraction'] == pytest.approx(0.375)
  assert rows[0]['seconds_per_round'] == pytest.approx(2.0)
  assert '0.7000 ± 0.1414' in (tmp_path / 'summary.md').read_text()
  with open(tmp_path / 'summary.csv', newline='') as f:
    assert list(csv.DictReader(f))[0]['seeds_done'] == '2'


def test_finished_cells_are_skipped_and_summarised(tmp_path):
  train_args = ['--rounds=2', '--clip_norm=1.0']
  for bounding, accuracy in (('clip', 0.5), ('normalize', 0.75)):
    name = sweep.cell_name(f'bounding={bounding}', 0, train_args,
                           {'bounding': bounding})
    _fake_run(tmp_path / 's' / name, accuracy, 2.0, 1.0)
  result = as_a_user.run(
      ['-m', 'scripts.sweep', f'--root_output_dir={tmp_path}',
       '--sweep_name=s', '--grid=bounding=clip,normalize', '--seeds=1', '--',
       *train_args], timeout=300)
  assert result.returncode == 0, result.stdout + result.stderr
  assert result.stdout.count('done, skipped') == 2
  summary = (tmp_path / 's' / 'summary.md').read_text()
  assert '0.5000' in summary and '0.7500' in summary


@pytest.mark.slow
def test_sweep_runs_cells_then_skips_them_when_rerun(tmp_path):
  command = ['-m', 'scripts.sweep',
             f'--root_output_dir={tmp_path}', '--sweep_name=s',
             '--grid=bounding=clip,normalize', '--seeds=1', '--',
             '--rounds=2', '--clients_per_round=6', '--eval_every=2',
             '--clip_norm=1.0']
  first = as_a_user.run(command)
  assert first.returncode == 0, first.stdout + first.stderr
  summary = (tmp_path / 's' / 'summary.md').read_text()
  assert 'clip' in summary and 'normalize' in summary
  second = as_a_user.run(command, timeout=300)
  assert second.returncode == 0
  assert second.stdout.count('done, skipped') == 2


@pytest.mark.slow
def test_ctrl_c_is_the_cells_one_line_and_the_rerun_resumes_it(tmp_path):
  command = ['-m', 'scripts.sweep', f'--root_output_dir={tmp_path}',
             '--sweep_name=s', '--grid=bounding=clip', '--seeds=1', '--',
             '--rounds=3', '--clients_per_round=6', '--clip_norm=1.0']
  proc = as_a_user.start(command, process_group=0)
  rest = as_a_user.interrupt_at(proc, 'round 1/3')  # The cell's first round.
  assert re.fullmatch(r'(round 2/3 .*\n)?interrupted: rerun the same '
                      r'command to resume from round [23]\n', rest), rest
  assert proc.returncode == 130
  again = as_a_user.run(command)
  assert again.returncode == 0, again.stdout + again.stderr
  assert 'Resuming' in again.stdout and 'round 1/3' not in again.stdout


def test_a_changed_train_flag_makes_a_new_cell():
  setting = {'bounding': 'clip'}
  assert (sweep.cell_name('b', 0, ['--rounds=2'], setting) !=
          sweep.cell_name('b', 0, ['--rounds=3'], setting))
  assert (sweep.cell_name('b', 0, ['--rounds=2', '--seed=1'], setting) ==
          sweep.cell_name('b', 0, ['--seed=1', '--rounds=2'], setting))


def test_failed_cells_are_marked_in_the_table(tmp_path):
  grid = sweep.parse_grid(['bounding=clip'])
  name = sweep.cell_name('bounding=clip', 0, (), {'bounding': 'clip'})
  rows = sweep.summarise(str(tmp_path), grid, seeds=1, failed={name})
  assert rows[0]['seeds_failed'] == 1 and rows[0]['seeds_done'] == 0
  assert '| clip | 0 | 1 | n/a |' in (tmp_path / 'summary.md').read_text()
