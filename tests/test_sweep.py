"""Specification of the sweep runner (`scripts.sweep`)."""

import csv
import json
import re

from absl import app
from absl import flags
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


@pytest.mark.parametrize('entry,message', [
    ('bounding', 'must be name=v1,v2'), ('seed=1,2', 'cannot set --seed'),
    # The sweep runs every cell with --progress=false: a grid of it would
    # change nothing.
    ('progress=true,false', 'cannot set --progress'),
    ('=1', 'must be name=v1,v2'),
    # An unset shell variable would drop a cell without a word ...
    ('noise_multiplier=0.5,,1', "--grid noise_multiplier: an empty value in "
     "'0.5,,1'"),
    ('noise_multiplier=,', 'an empty value'),
    # ... and a value given twice would run its cells twice.
    ('bounding=clip,normalize,clip', "--grid bounding: 'clip' is given twice"),
])
def test_malformed_or_reserved_grid_is_a_usage_error(entry, message):
  with pytest.raises(app.UsageError, match=re.escape(message)):
    sweep.parse_grid([entry])


@pytest.mark.parametrize('arg', ['--seed=3', '--progress', '--noprogress',
                                 '--progress=true'])
def test_a_train_flag_the_sweep_sets_is_a_usage_error(arg):
  name = arg.lstrip('-').split('=')[0]
  with pytest.raises(app.UsageError,
                     match=re.escape(f'--{name} is set by the sweep')):
    sweep.main(['sweep', arg])


def _fake_run(directory, accuracy, epsilon, seconds, clip_norm=0.5):
  """A finished run's records, as `scripts.train` writes them."""
  directory.mkdir(parents=True)
  (directory / 'summary.json').write_text(json.dumps(
      {'final_eval_accuracy': accuracy, 'epsilon': epsilon,
       'accountant': 'pld', 'delta': 1e-5}))
  if seconds is None:  # A DP run: round times are withheld.
    (directory / 'metrics.csv').write_text(
        f'round,clip_norm,epsilon\n1,0.1,1.0\n2,{clip_norm},{epsilon}\n')
  else:
    (directory / 'metrics.csv').write_text(
        'round,clip_norm,seconds\n'
        f'1,0.1,{seconds}\n2,{clip_norm},{seconds}\n')


def test_summary_reports_mean_and_std_over_seeds(tmp_path):
  grid = sweep.parse_grid(['bounding=clip'])
  setting = {'bounding': 'clip'}
  for seed, accuracy, seconds, clip_norm in ((0, 0.8, 1.0, 0.5),
                                             (1, 0.6, 3.0, 0.25)):
    _fake_run(tmp_path / sweep.cell_name('bounding=clip', seed, (), setting),
              accuracy, 2.0, seconds, clip_norm)
  rows = sweep.summarise(str(tmp_path), grid, seeds=2)
  assert rows[0]['accuracy_mean'] == pytest.approx(0.7)
  assert rows[0]['accuracy_std'] == pytest.approx(0.1414, rel=1e-3)
  assert rows[0]['epsilon'] == pytest.approx(2.0)
  assert rows[0]['final_clip_norm'] == pytest.approx(0.375)  # Last rounds'.
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


def test_a_changed_flag_file_makes_a_new_cell(tmp_path):
  """A cell is named by the text of the flag files it reads, not their
  path: an edited file would otherwise find the old cells finished."""
  flag_file = tmp_path / 'setting.cfg'
  flag_file.write_text('--rounds=1\n')
  args, setting = [f'--flagfile={flag_file}'], {'bounding': 'clip'}
  before = sweep.cell_name('b', 0, args, setting)
  assert sweep.cell_name('b', 0, args, setting) == before
  flag_file.write_text('--rounds=2\n')
  assert sweep.cell_name('b', 0, args, setting) != before


def test_a_train_flag_given_twice_is_named_by_the_value_that_counts():
  # absl takes the last: --rounds=5 --rounds=10 is a run of 10 rounds, the
  # cell of --rounds=10 alone, not that of --rounds=10 --rounds=5.
  setting = {'bounding': 'clip'}
  assert (sweep.cell_name('b', 0, ['--rounds=5', '--rounds=10'], setting) ==
          sweep.cell_name('b', 0, ['--rounds=10'], setting))
  assert (sweep.cell_name('b', 0, ['--rounds=5', '--rounds=10'], setting) !=
          sweep.cell_name('b', 0, ['--rounds=10', '--rounds=5'], setting))


def test_failed_cells_are_marked_in_the_table(tmp_path):
  grid = sweep.parse_grid(['bounding=clip'])
  name = sweep.cell_name('bounding=clip', 0, (), {'bounding': 'clip'})
  rows = sweep.summarise(str(tmp_path), grid, seeds=1, failed={name})
  assert rows[0]['seeds_failed'] == 1 and rows[0]['seeds_done'] == 0
  assert '| clip | 0 | 1 | n/a |' in (tmp_path / 'summary.md').read_text()


def test_a_dp_cells_withheld_round_time_is_explained_not_na(tmp_path):
  grid = sweep.parse_grid(['bounding=clip'])
  _fake_run(tmp_path / sweep.cell_name('bounding=clip', 0, (),
                                       {'bounding': 'clip'}),
            0.5, 3.0, seconds=None, clip_norm=0.75)
  sweep.summarise(str(tmp_path), grid, seeds=1)
  table = (tmp_path / 'summary.md').read_text()
  # Epsilon names the run's one accountant and delta.
  assert ('| clip | 1 |  | 0.5000 ± 0.0000 | 3 (PLD, delta 1e-05) | 0.75 | '
          'withheld |') in table
  assert 'withheld: a DP run does not release its round times' in table
  assert 'n/a |' not in table


def _sweep(tmp_path, *args):
  return as_a_user.run(['-m', 'scripts.sweep', f'--root_output_dir={tmp_path}',
                        '--sweep_name=s', *args], timeout=120)


def test_dry_run_lists_the_runs_and_writes_nothing(tmp_path):
  result = _sweep(tmp_path, '--grid=bounding=clip,normalize', '--seeds=2',
                  '--dry_run', '--', '--rounds=2')
  assert result.returncode == 0, result.stderr
  assert result.stdout.count('scripts.train --rounds=2 --bounding=') == 4
  assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize('grid, train_args, message', [
    # z = 0 is no DP at all: TFF's users write `none`.
    ('--grid=noise_multiplier=none,0', ['--rounds=2'],
     r'error: cell noise_multiplier=0_seed0_\w+: --noise_multiplier=0 adds '
     'no noise'),
    ('--grid=bounding=clip', ['--rounds=2', '--bogus=1'],
     "error: cell bounding=clip_seed0_\\w+: Unknown command line flag 'bogus'"),
])
def test_a_cell_train_would_refuse_is_refused_before_any_runs(
    tmp_path, grid, train_args, message):
  result = _sweep(tmp_path, grid, '--', *train_args)
  assert result.returncode == 2
  assert result.stdout == ''
  assert re.fullmatch(message + r'.*\n', result.stderr), result.stderr
  assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize('name', ['', '..', 'a/b', '../x'])
def test_a_sweep_name_that_is_not_one_directory_is_refused(tmp_path, name):
  result = _sweep(tmp_path, f'--sweep_name={name}', '--grid=rounds=1',
                  '--dry_run', '--', '--noise_multiplier=none')
  assert result.returncode != 0
  assert '--sweep_name must be a non-empty name' in result.stderr
  assert list(tmp_path.iterdir()) == []


def test_another_grid_under_the_same_name_is_refused_not_overwritten(
    tmp_path):
  # Another sweep's runs under the name: this one's summary would replace
  # theirs without a word.
  theirs = tmp_path / 's' / 'rounds=1_seed0_0123abcd'
  theirs.mkdir(parents=True)
  (theirs.parent / 'summary.md').write_text('theirs')
  result = _sweep(tmp_path, '--grid=local_epochs=2', '--dry_run', '--',
                  '--noise_multiplier=none', '--rounds=1')
  assert result.returncode != 0
  assert '--sweep_name=s: ' in result.stderr  # The name given, not a cell's.
  assert 'holds runs of another sweep (rounds=1_seed0_0123abcd)' in (
      result.stderr)
  assert (theirs.parent / 'summary.md').read_text() == 'theirs'


def _absl_reads(args, flag_name):
  """What absl makes of `args`: the value of `--flag_name` it parses."""
  values = flags.FlagValues()
  flags.DEFINE_string(flag_name, None, '', flag_values=values)
  values(['prog', *args])
  return values[flag_name].value


def test_cells_whose_flag_and_flag_file_order_differ_are_different_runs(
    tmp_path):
  # absl reads a flag file where it stands: a later flag overrides it, and
  # it overrides an earlier flag (docs/training.md). These two commands are
  # an online and an offline run; one cell's results must not stand for
  # the other's.
  flag_file = tmp_path / 'setting.cfg'
  flag_file.write_text('--data_source=online\n')
  online = ['--data_source=offline', f'--flagfile={flag_file}']
  offline = [f'--flagfile={flag_file}', '--data_source=offline']
  assert _absl_reads(online, 'data_source') == 'online'
  assert _absl_reads(offline, 'data_source') == 'offline'
  setting = {'bounding': 'clip'}
  assert (sweep.cell_name('b', 0, online, setting) !=
          sweep.cell_name('b', 0, offline, setting))


def test_an_edited_flag_file_a_flag_file_names_makes_a_new_cell(tmp_path):
  inner = tmp_path / 'inner.cfg'
  inner.write_text('--rounds=1\n')
  outer = tmp_path / 'outer.cfg'
  outer.write_text(f'--flagfile={inner}\n')
  args, setting = [f'--flagfile={outer}'], {'bounding': 'clip'}
  before = sweep.cell_name('b', 0, args, setting)
  inner.write_text('--rounds=2\n')
  assert _absl_reads(args, 'rounds') == '2'
  assert sweep.cell_name('b', 0, args, setting) != before


def test_an_edited_flag_file_the_grid_names_makes_a_new_cell(tmp_path):
  flag_file = tmp_path / 'setting.cfg'
  flag_file.write_text('--rounds=1\n')
  setting = {'flagfile': str(flag_file)}
  before = sweep.cell_name('flagfile=x', 0, ['--rounds=3'], setting)
  flag_file.write_text('--rounds=2\n')
  assert sweep.cell_name('flagfile=x', 0, ['--rounds=3'], setting) != before


def test_cells_that_differ_in_any_value_of_a_repeatable_flag_differ():
  # absl keeps every --task_option (a multi flag), not the last: these are
  # Shakespeare runs of 40- and 80-character sequences.
  forty = ['--task_option=sequence_length=40', '--task_option=min_speeches=5']
  eighty = ['--task_option=sequence_length=80', '--task_option=min_speeches=5']
  for args, length in ((forty, '40'), (eighty, '80')):
    values = flags.FlagValues()
    flags.DEFINE_multi_string('task_option', [], '', flag_values=values)
    values(['prog', *args])
    assert values.task_option == [f'sequence_length={length}',
                                  'min_speeches=5']
  setting = {'bounding': 'clip'}
  assert (sweep.cell_name('b', 0, forty, setting) !=
          sweep.cell_name('b', 0, eighty, setting))


_TRAINS_REPEATABLE_FLAGS = (
    'from absl import flags\n'
    'from scripts import train\n'
    'print(" ".join(sorted(f.name for f in flags.FLAGS.get_flags_for_module('
    'train) if isinstance(f, flags.MultiFlag))))\n')


def test_the_sweep_knows_every_repeatable_flag_of_train():
  result = as_a_user.run(['-c', _TRAINS_REPEATABLE_FLAGS], timeout=120)
  assert result.returncode == 0, result.stderr
  assert tuple(result.stdout.split()) == sweep.REPEATABLE_FLAGS


def test_a_dp_cells_withheld_evaluation_is_said_not_shown_as_nan(tmp_path):
  # A DP run on EMNIST, Shakespeare or Stack Overflow withholds its
  # evaluation (the training clients' own data): summary.json says so, and
  # its final accuracy is null. The table showed 'nan ± 0.0000'.
  grid = sweep.parse_grid(['bounding=clip'])
  for seed in (0, 1):
    run = tmp_path / sweep.cell_name('bounding=clip', seed, (),
                                     {'bounding': 'clip'})
    _fake_run(run, None, 3.0, seconds=None)
    summary = json.loads((run / 'summary.json').read_text())
    summary['evaluation_withheld'] = True
    (run / 'summary.json').write_text(json.dumps(summary))
  rows = sweep.summarise(str(tmp_path), grid, seeds=2)
  table = (tmp_path / 'summary.md').read_text()
  assert '| clip | 2 |  | withheld | 3 (PLD, delta 1e-05) |' in table
  assert 'nan' not in table.lower()
  assert 'its evaluation on the clients' in table  # The legend says why.
  assert rows[0]['seeds_done'] == 2
  with open(tmp_path / 'summary.csv', newline='') as f:
    row = list(csv.DictReader(f))[0]
  assert row['accuracy_mean'] == row['accuracy_std'] == 'nan'  # None.


def test_a_grid_over_clip_norm_keeps_its_values_beside_the_final_norm(
    tmp_path):
  # The grid's clip_norm column held the measured final norm instead (the
  # row's keys collided): an adaptive cell read '0.75', not 'adaptive'.
  grid = sweep.parse_grid(['clip_norm=adaptive,1.0'])
  for value, final in (('adaptive', 0.75), ('1.0', 1.0)):
    _fake_run(tmp_path / sweep.cell_name(f'clip_norm={value}', 0, (),
                                         {'clip_norm': value}),
              0.5, 3.0, seconds=None, clip_norm=final)
  sweep.summarise(str(tmp_path), grid, seeds=1)
  table = (tmp_path / 'summary.md').read_text()
  assert '| adaptive | 1 |  | 0.5000 ± 0.0000 | 3 (PLD, delta 1e-05) | 0.75 |' in (
      table)
  assert '| 1.0 | 1 |  | 0.5000 ± 0.0000 | 3 (PLD, delta 1e-05) | 1 |' in table
  with open(tmp_path / 'summary.csv', newline='') as f:
    rows = list(csv.DictReader(f))
  assert [(r['clip_norm'], r['final_clip_norm']) for r in rows] == [
      ('adaptive', '0.75'), ('1.0', '1.0')]


@pytest.mark.slow
@pytest.mark.parametrize('damaged', ['summary.json', 'metrics.csv'])
def test_a_finished_cells_damaged_summary_is_rebuilt_from_its_records(
    tmp_path, damaged):
  # summary.json and metrics.csv are reports; the run's records are the
  # truth, and scripts.train rebuilds them. The sweep skipped the cell as
  # finished, then failed reading the report (a cut summary.json, a lost
  # metrics.csv: a traceback), on every rerun.
  command = ['-m', 'scripts.sweep', f'--root_output_dir={tmp_path}',
             '--sweep_name=s', '--grid=bounding=clip', '--seeds=1', '--',
             '--rounds=1', '--clients_per_round=6', '--clip_norm=1.0']
  first = as_a_user.run(command)
  assert first.returncode == 0, first.stdout + first.stderr
  (cell,) = (tmp_path / 's').glob('bounding=clip_seed0_*')
  summary = json.loads((cell / 'summary.json').read_text())
  metrics = (cell / 'metrics.csv').read_bytes()
  table = (tmp_path / 's' / 'summary.md').read_text()
  if damaged == 'summary.json':
    (cell / 'summary.json').write_text('{"epsilon": 0.01')  # Cut short.
  else:
    (cell / 'metrics.csv').unlink()
  again = as_a_user.run(command)
  assert again.returncode == 0, again.stdout + again.stderr
  assert json.loads((cell / 'summary.json').read_text()) == summary
  assert (cell / 'metrics.csv').read_bytes() == metrics
  assert (tmp_path / 's' / 'summary.md').read_text() == table


def test_a_dp_cells_uncovered_figures_are_labelled_not_covered_by_epsilon(
    tmp_path):
  # A DP run with --release_uncovered_metrics on a task that evaluates on its
  # clients' data: summary.json lists its round seconds and evaluation under
  # not_covered_by_epsilon. The table showed them beside epsilon unmarked.
  grid = sweep.parse_grid(['bounding=clip'])
  run = tmp_path / sweep.cell_name('bounding=clip', 0, (), {'bounding': 'clip'})
  _fake_run(run, 0.5, 3.0, seconds=2.0)
  summary = json.loads((run / 'summary.json').read_text())
  summary['not_covered_by_epsilon'] = ['clients', 'train_loss', 'seconds',
                                       'eval_loss', 'eval_accuracy']
  (run / 'summary.json').write_text(json.dumps(summary))
  sweep.summarise(str(tmp_path), grid, seeds=1)
  table = (tmp_path / 'summary.md').read_text()
  assert ('| clip | 1 |  | 0.5000 ± 0.0000 (not covered) | '
          '3 (PLD, delta 1e-05) | 0.5 | 2 (not covered) |') in table
  assert 'not covered: released with --release_uncovered_metrics' in table
  with open(tmp_path / 'summary.csv', newline='') as f:
    row = list(csv.DictReader(f))[0]
  assert row['not_covered_by_epsilon'] == 'eval_accuracy; seconds'
