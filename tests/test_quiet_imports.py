"""What importing `tff_clip` (or `tasks`) sets: TensorFlow's C++ log level,
unless the user set it, and the exit hook that closes TFF's default context
-- so a program using the library prints nothing of TensorFlow's or TFF's
own (tff_clip/__init__.py, docs/packaging.md). TensorFlow reads the level
once, at its first line: a program that imported TensorFlow first gets one
warning saying what to set, and none once it set it.

Each program runs as a user would run it (`as_a_user`: a fresh interpreter,
no TF_CPP_MIN_LOG_LEVEL in the environment).
"""

import subprocess
import sys

import pytest

import as_a_user  # pylint: disable=g-bad-import-order
from tff_clip import LATE_IMPORT_NOTICE  # pylint: disable=g-bad-import-order

SHOW_LEVEL = ('import os, sys, tff_clip; '
              'print(os.environ["TF_CPP_MIN_LOG_LEVEL"], '
              '"tensorflow" in sys.modules)')


def test_importing_tff_clip_quiets_tensorflow_and_imports_none_of_it():
  result = as_a_user.python(SHOW_LEVEL)
  assert result.returncode == 0, result.stderr
  assert result.stdout.split() == ['3', 'False']


def test_a_log_level_the_user_set_is_kept():
  result = as_a_user.python(SHOW_LEVEL, TF_CPP_MIN_LOG_LEVEL='0')
  assert result.stdout.split() == ['0', 'False'], result.stderr


def _notices(stderr):
  return [line for line in stderr.splitlines()
          if 'UserWarning: ' + LATE_IMPORT_NOTICE in line]


def test_tensorflow_first_gets_one_line_saying_what_to_set():
  result = as_a_user.python('import tensorflow, tff_clip')
  assert result.returncode == 0, result.stderr[-3000:]
  assert len(_notices(result.stderr)) == 1, result.stderr[-3000:]
  assert 'TF_CPP_MIN_LOG_LEVEL=3 before TensorFlow loads' in LATE_IMPORT_NOTICE


def test_tensorflow_first_with_the_level_set_prints_nothing():
  # What the notice and README tell a user to do: then not a line.
  result = as_a_user.python('import tensorflow, tff_clip',
                            TF_CPP_MIN_LOG_LEVEL='3')
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stderr == ''


@pytest.mark.slow  # Runs a TFF computation three times (about 20 s).
def test_tensorflow_first_is_quiet_over_runs_only_with_the_level_set():
  """The limit, as stated: with TensorFlow imported first, TensorFlow's C++
  log prints at every TFF computation run unless the user set the level
  before it loaded (then nothing at all)."""
  program = ('import tensorflow as tf, tensorflow_federated as tff, tff_clip\n'
             '@tff.tensorflow.computation(tf.int32)\n'
             'def add_one(x):\n'
             '  return x + 1\n'
             'print([int(add_one(i)) for i in range(3)])\n')
  unset = as_a_user.python(program)
  assert unset.returncode == 0, unset.stderr[-3000:]
  assert len(_notices(unset.stderr)) == 1
  assert len(as_a_user.noise(unset.stderr)) >= 6  # 2 a run, at least.
  level_set = as_a_user.python(program, TF_CPP_MIN_LOG_LEVEL='3')
  assert level_set.returncode == 0, level_set.stderr[-3000:]
  assert level_set.stdout.strip() == '[1, 2, 3]'
  assert level_set.stderr == '', level_set.stderr[-3000:]


@pytest.mark.parametrize('imports', [
    pytest.param('import tff_clip.aggregation.dp, tensorflow_federated',  # After ours;
                 marks=pytest.mark.slow),  # the README snippet's case too.
    'import tensorflow_federated, tff_clip',  # TFF's hooks before ours.
])
def test_a_program_importing_tff_ends_without_its_exit_traceback(imports):
  result = as_a_user.python(imports)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'Exception ignored' not in result.stderr, result.stderr[-3000:]
  assert 'Traceback' not in result.stderr, result.stderr[-3000:]


@pytest.mark.slow  # Builds every task (about 25 s); the README snippet
# test covers a library user's exit in the default suite.
def test_tasks_table_prints_without_a_log_line_or_traceback():
  result = as_a_user.python('import tasks; print(tasks.describe_markdown())')
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.startswith('| task |'), result.stdout[:200]
  assert not as_a_user.noise(result.stderr), result.stderr[-3000:]


# A TFF computation run on TFF's default context (its own worker).
_ADD_ONE = ('import tensorflow as tf, tensorflow_federated as tff, tff_clip\n'
            '@tff.tensorflow.computation(tf.int32)\n'
            'def add_one(x):\n'
            '  return x + 1\n')


def _run_ignoring_ctrl_c(program: str) -> subprocess.CompletedProcess:
  """`program` run as nohup or a background job starts it: SIGINT ignored."""
  return subprocess.run(
      ['sh', '-c', 'trap "" INT; exec "$@"', 'sh', sys.executable, '-c',
       program], cwd=as_a_user.REPO, env=as_a_user.env(),
      capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow  # TFF's own worker, then tff_clip's (about 15 s).
def test_leaving_tffs_default_worker_for_tff_clips_ends_when_ctrl_c_is_ignored():
  # Replacing TFF's default context drops it, and its `__del__` stops its
  # worker with SIGINT and waits; with SIGINT ignored (nohup, a background
  # job) the worker ignored it too and the wait never ended: the program
  # hung in `set_local_cpp_context` (a test suite run in the background hung
  # there). tff_clip terminates that worker before it replaces the context.
  result = _run_ignoring_ctrl_c(
      _ADD_ONE + 'print(add_one(1), flush=True)\n'
      'from tff_clip.runtime import execution\n'
      'execution.set_local_cpp_context()\n'
      'print(add_one(2), flush=True)\n')
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.split() == ['2', '3']


@pytest.mark.slow  # A TFF computation on TFF's own worker (about 8 s).
def test_a_program_on_tffs_default_worker_ends_when_it_ignores_ctrl_c():
  # nohup and background jobs start a program with SIGINT ignored, and its
  # children inherit that. TFF stops its default worker with SIGINT and waits
  # for it; tff_clip's exit hook, which drops that context, terminates the
  # worker first, so the wait ends (before, the program never exited).
  result = _run_ignoring_ctrl_c(_ADD_ONE + 'print(add_one(1))\n')
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.split() == ['2']
