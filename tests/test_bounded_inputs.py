"""Specification: every input is bounded to where the program answers.

A value that would hang a run, or an accountant, or that Python reads as
another number than the one typed, is refused in one line naming it, with
exit code 2, before TensorFlow loads and before anything is written: delta
above `checks.MAX_DELTA` (PLD's grid follows epsilon, which falls towards 0
as delta grows: at delta = 0.5 a finished run's last step never ended),
rounds above `checks.MAX_ROUNDS`, a noise multiplier outside float32's
normal range (the accountants divide by z^2), sizes that cannot be built
(clients, canaries, a separation beyond the population, a hidden layer
beyond int32), numbers in other scripts' digits or with underscores, and
flags that would be ignored. Within the bounds the accountants answer.
"""

import re
import resource

import pytest

from tff_clip import checks
from tff_clip.privacy import accounting
import as_a_user  # pylint: disable=g-bad-import-order

# 1 - 2^-53, the largest float below 1.
JUST_BELOW_ONE = repr(1 - 2.0**-53)

REFUSED = [
    (['--delta=0.5'], r'--delta must be in \(0, 0\.01\]'),
    (['--delta=0.1'], r'--delta must be in \(0, 0\.01\]'),
    ([f'--delta={JUST_BELOW_ONE}'], r'--delta must be in \(0, 0\.01\]'),
    (['--noise_multiplier=none', '--target_epsilon=3', '--delta=0.5'],
     r'--delta must be in \(0, 0\.01\]'),
    (['--rounds=1000000'], r'--rounds must be at most 100,000'),
    (['--audit_canaries=1000000000'],
     r'--audit_canaries must be an integer in \[0, 10000\]'),
    (['--num_clients=1000000000'],
     r'--num_clients must be an integer in \[1, 1000000\]'),
    (['--sampling=min_separation', '--noise_mechanism=tree',
      '--bands=2147483647'],
     r'--min_separation \(2147483647\) exceeds the 50 clients: some of its '
     r'minimum-separation groups would be empty'),
    (['--task_option=hidden_units=1000000000000'],
     r'--task_option hidden_units must be an integer in \[1, 28633115\]'),
    (['--task_option=hidden_units=-5'],
     r'--task_option hidden_units must be an integer in \[1, 28633115\]'),
    (['--task_option=hidden_units=nan'],
     r'--task_option hidden_units must be an integer; got nan'),
    (['--task_option=hidden_units=٣'],
     r"--task_option hidden_units must be an integer; got '٣'"),
    (['--rounds=٣'], r"--rounds must be an integer; got '٣' \(ASCII digits"),
    (['--noise_multiplier=１'],
     r"--noise_multiplier must be a number or none; got '１' \(ASCII"),
    (['--rounds=1_0'], r"--rounds must be an integer; got '1_0' \(ASCII"),
    (['--clip_norm=1_0'], r"--clip_norm must be a positive float or "
     r"'adaptive'; got '1_0'"),
    (['--client_learning_rate=1e-45'],
     r'--client_learning_rate = 1e-45 is subnormal in float32'),
    (['--server_learning_rate=1e-40'],
     r'--server_learning_rate = 1e-40 is subnormal in float32'),
    (['--workers=127.0.0.1:1'],
     r'--workers needs --executor=remote; got --executor=inprocess'),
]


@pytest.fixture(scope='module')
def refusals(tmp_path_factory):
  """{args: (exit code, stdout, stderr, imported, run root)} of REFUSED,
  refused in turn in one interpreter (`as_a_user.train_each`)."""
  commands = [tuple(args) for args, _ in REFUSED]
  roots = [tmp_path_factory.mktemp('bounded') / 'runs' for _ in commands]
  results = as_a_user.train_each(
      [[f'--root_output_dir={root}', *args]
       for args, root in zip(commands, roots)],
      not_imported=['tensorflow'])
  return {args: (*result, root)
          for args, result, root in zip(commands, results, roots)}


@pytest.mark.parametrize('args, message', REFUSED)
def test_an_unbounded_input_is_one_line_before_tensorflow(
    refusals, args, message):
  code, stdout, stderr, imported, root = refusals[tuple(args)]
  assert not imported, f'imported: {imported}'
  assert code == 2, stderr[-3000:]
  assert stdout == ''
  lines = stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: '), stderr
  assert re.search(message, lines[0]), lines[0]
  assert not root.exists()


_TRAIN = '''
import os, sys
from scripts import cli, train
sys.argv = ['scripts.train', *sys.argv[1:]]
try:
  cli.run(train.main)
finally:
  assert 'tensorflow' not in sys.modules, 'imported: tensorflow'
'''


def test_executor_gpu_without_a_gpu_is_one_line_before_tensorflow(tmp_path):
  runs = tmp_path / 'runs'
  proc = as_a_user.python(_TRAIN, f'--root_output_dir={runs}',
                          '--executor=gpu', timeout=120,
                          CUDA_VISIBLE_DEVICES='-1')
  line = as_a_user.refusal(proc, runs)
  assert line == ("error: --executor=gpu, but CUDA_VISIBLE_DEVICES='-1' "
                  'hides every GPU; use --executor=local or inprocess.')


def test_no_gpu_is_known_from_the_driver_devices(tmp_path):
  from scripts import program  # pylint: disable=g-import-not-at-top
  devices = tmp_path / 'dev'
  devices.mkdir()
  assert 'no NVIDIA GPU device' in program.no_gpu_reason({}, str(devices))
  (devices / 'nvidiactl').touch()  # The driver, but no GPU.
  assert program.no_gpu_reason({}, str(devices)) is not None
  (devices / 'nvidia0').touch()
  assert program.no_gpu_reason({}, str(devices)) is None
  assert program.no_gpu_reason({'CUDA_VISIBLE_DEVICES': ''}, str(devices))
  assert program.no_gpu_reason({'CUDA_VISIBLE_DEVICES': '0'},
                               str(devices)) is None


# ----------------------------------------------------------------------------
# The accountant: one line at the inputs it cannot answer, within a second
# of CPU (it imports dp_accounting, never TensorFlow).

_ACCOUNTANT = ['-m', 'scripts.accountant', '--noise_multiplier=1.0',
               '--clients_per_round=100', '--population_size=10000',
               '--rounds=5000', '--delta=1e-6']

ACCOUNTANT_REFUSED = [
    ('--delta=0.5', r'`delta` must be in \(0, 0\.01\]'),
    ('--delta=0.1', r'`delta` must be in \(0, 0\.01\]'),
    (f'--delta={JUST_BELOW_ONE}', r'`delta` must be in \(0, 0\.01\]'),
    ('--rounds=1000000000000', r'`rounds` must be at most 100,000'),
    ('--noise_multiplier=1e-300',
     r'`noise_multiplier` = 1e-300 underflows to 0 in float32'),
    ('--noise_multiplier=1e-40',
     r'`noise_multiplier` = 1e-40 is subnormal in float32'),
    ('--noise_multiplier=1e300',
     r'`noise_multiplier` = 1e\+300 overflows float32'),
    ('--accountants=', r'`accountants` is empty: name at least one of rdp'),
    # Python's float() and int() would read these as 1 and 10.
    ('--noise_multiplier=\uff11',
     r'--noise_multiplier=\uff11: not an ASCII number without underscores'),
    ('--rounds=1_0', r'--rounds=1_0: not an ASCII number without underscores'),
    ('--population_size=\u0663\u0660\u0660\u0660\u0660',
     r'not an ASCII number without underscores'),
]


@pytest.mark.parametrize('arg, message', ACCOUNTANT_REFUSED)
def test_the_accountant_refuses_what_it_cannot_answer_in_one_line(
    arg, message):
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  proc = as_a_user.run([*_ACCOUNTANT, arg], timeout=60)
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert proc.stdout == ''
  lines = proc.stderr.splitlines()
  assert len(lines) == 1 and re.search(message, lines[0]), proc.stderr
  # Generous for a loaded machine; the hang it replaces never ended.
  cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime +
                                             before.ru_stime)
  assert cpu < 10, cpu


# ----------------------------------------------------------------------------
# Within the bounds, the accountants answer.


@pytest.mark.parametrize('noise_multiplier, delta', [
    (2.0, checks.MAX_DELTA),   # PLD's epsilon 0: its grid no longer refined
    (100.0, checks.MAX_DELTA),  # towards 1e-6 (at delta 0.5: minutes).
    (1e4, checks.MAX_DELTA),   # RDP's epsilon 0.
])
def test_pld_answers_up_to_the_largest_delta(noise_multiplier, delta):
  before = resource.getrusage(resource.RUSAGE_SELF)
  rdp = accounting.compute_training_epsilon(noise_multiplier, 20, 50, 30,
                                            delta)
  pld = accounting.compute_training_epsilon(noise_multiplier, 20, 50, 30,
                                            delta, accountant='pld')
  after = resource.getrusage(resource.RUSAGE_SELF)
  assert 0 <= pld.epsilon <= rdp.epsilon
  assert (after.ru_utime - before.ru_utime) < 20


def test_pld_is_not_computed_where_its_grid_cannot_fit():
  """At the smallest z training adds (float32's least normal) RDP answers
  (a void epsilon of 1e79); PLD would need exabytes: it says so, and the
  run's summary reports RDP's figure."""
  import dp_accounting  # pylint: disable=g-import-not-at-top
  rdp = accounting.compute_training_epsilon(checks.FLOAT32_TINY, 20, 50, 30,
                                            1e-5)
  assert rdp.epsilon > 1e70
  with pytest.raises(dp_accounting.UnsupportedEventError,
                     match='PLD is not computed above epsilon 1e\\+06'):
    accounting.compute_training_epsilon(checks.FLOAT32_TINY, 20, 50, 30,
                                        1e-5, accountant='pld')


def test_the_delta_bound_is_stated_where_flags_are_documented():
  from tff_clip.program import config as config_lib  # pylint: disable=g-import-not-at-top
  fields = {field.name: field for field, _ in config_lib.fields()}
  assert f'(0, {checks.MAX_DELTA:g}]' in fields['delta'].metadata['help']


def test_dp_factory_reads_minus_zero_as_zero_noise_like_zero():
  """z = 0 is the library's noise-free aggregator (documented; the flags
  refuse it for a run): -0.0 is the same number, not a refusal."""
  from tff_clip.aggregation import spec  # pylint: disable=g-import-not-at-top
  for z in (0.0, -0.0, 0):
    made = spec.DPSpec('clip', noise_multiplier=z, clients_per_round=10.0,
                       clip_norm=1.0)
    assert made.noise_multiplier == 0 and str(made.noise_multiplier) == '0.0'
  with pytest.raises(ValueError, match='`noise_multiplier` must be a finite '
                     'float >= 0; got -1e-30'):
    spec.DPSpec('clip', noise_multiplier=-1e-30, clients_per_round=10.0,
                clip_norm=1.0)
