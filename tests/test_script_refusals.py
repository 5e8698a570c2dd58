"""Specification: the scripts beside `scripts.train` refuse as it does.

Bad input is one line on stderr naming the flag, exit code 2, before any
run starts or any file is written (`scripts.audit_table`, whose flags after
-- may not relabel a row). Oracles: the exit code, stderr and the files on
disk, as a user sees them.
"""

import pytest

import as_a_user  # pylint: disable=g-bad-import-order


def _refused(result, flag):
  """Exit 2 and one line naming `flag`, no traceback."""
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
  assert len(lines) == 1 and lines[0].startswith('error: '), result.stderr
  assert flag in lines[0], lines[0]
  return lines[0]


@pytest.mark.parametrize('args,flag', [
    (['--noise_multipliers='], '--noise_multipliers is empty'),
    (['--noise_multipliers=0.5,abc'],
     "--noise_multipliers must list positive numbers; got 'abc'"),
    (['--noise_multipliers=0'], '--noise_multipliers must list positive'),
    # A row labelled z = 1 must have run at z = 1, in the row's directory.
    (['--noise_multipliers=1', '--', '--noise_multiplier=4'],
     '--noise_multiplier is set by audit_table for each row'),
    (['--noise_multipliers=1', '--', '--experiment_name=mine'],
     '--experiment_name is set by audit_table'),
    (['--noise_multipliers=1', '--', '--noprogress'],
     '--noprogress is set by audit_table'),
    # A flag train refuses: refused by the table first, naming the row.
    (['--noise_multipliers=1,2', '--', '--rounds=0'], '--rounds'),
])
def test_audit_table_refuses_before_any_run(tmp_path, args, flag):
  root = tmp_path / 'table'
  result = as_a_user.run(['-m', 'scripts.audit_table',
                          f'--root_output_dir={root}', *args], timeout=300)
  _refused(result, flag)
  assert not root.exists()


_ACCOUNTANT = ['--noise_multiplier=1', '--rounds=20', '--delta=1e-5']
_SEPARATED = _ACCOUNTANT + ['--sampling=min_separation',
                            '--noise_mechanism=banded', '--bands=2']


@pytest.mark.parametrize('args,flag', [
    # 150 clients in 2 groups of 75 cannot give 100 a round.
    (_SEPARATED + ['--clients_per_round=100', '--population_size=150',
                   '--min_separation=2'],
     '--clients_per_round (100) exceeds the smallest minimum-separation '
     'group: the 150 clients fall into 2 groups of 75 to 75'),
    (_SEPARATED + ['--clients_per_round=10', '--population_size=150',
                   '--min_separation=0'], '--min_separation must be a positive number'),
    # No amplification to extrapolate; correlated events on their own grid.
    (_SEPARATED + ['--clients_per_round=10', '--population_size=150',
                   '--extrapolate'], '--extrapolate apply to --sampling='),
    (_SEPARATED + ['--clients_per_round=10', '--population_size=150',
                   '--pld_value_discretization_interval=0.5'],
     '--pld_value_discretization_interval apply to --sampling='),
    (_ACCOUNTANT + ['--clients_per_round=10', '--population_size=150',
                    '--extrapolate_population_scales=1,2'],
     '--extrapolate_population_scales applies with --extrapolate only'),
])
def test_the_accountant_refuses_what_would_change_nothing_or_cannot_run(
    args, flag):
  result = as_a_user.run(['-m', 'scripts.accountant', *args], timeout=120)
  _refused(result, flag)
  assert result.stdout == ''


@pytest.mark.parametrize('script', ['scripts.diagnose_bounding',
                                    'scripts.diagnose_per_layer'])
def test_a_diagnosis_into_a_file_is_refused_and_the_file_kept(tmp_path,
                                                              script):
  taken = tmp_path / 'a_file'
  taken.write_text('mine')
  result = as_a_user.run(['-m', script, '--rounds=1', '--noise_multiplier=1',
                          f'--output_dir={taken}'], timeout=300)
  _refused(result, f"--output_dir: '{taken}' exists and is not a directory")
  assert taken.read_text() == 'mine'


def test_a_diagnosis_refuses_a_target_no_noise_reaches_before_writing(
    tmp_path):
  out = tmp_path / 'out'
  result = as_a_user.run(['-m', 'scripts.diagnose_bounding', '--rounds=1',
                          '--target_epsilon=0.001', f'--output_dir={out}'],
                         timeout=300)
  _refused(result, '--target_epsilon')
  assert not out.exists()


@pytest.mark.parametrize('existing', ['# My notes\n', ''])
def test_audit_table_refuses_an_output_it_did_not_write(tmp_path, existing):
  """--output names a file already there that is not a table audit_table
  wrote: refused before any run, the file left as it was."""
  root, output = tmp_path / 'table', tmp_path / 'notes.md'
  output.write_text(existing)
  result = as_a_user.run(['-m', 'scripts.audit_table',
                          f'--root_output_dir={root}', f'--output={output}',
                          '--noise_multipliers=1'], timeout=300)
  _refused(result, f'--output={output} exists and is not a table')
  assert output.read_text() == existing and not root.exists()


def test_audit_table_refuses_an_output_in_a_missing_directory(tmp_path):
  root = tmp_path / 'table'
  result = as_a_user.run(['-m', 'scripts.audit_table',
                          f'--root_output_dir={root}',
                          f'--output={tmp_path / "no" / "t.md"}',
                          '--noise_multipliers=1'], timeout=300)
  _refused(result, 'not a file in an existing directory')
  assert not root.exists()
