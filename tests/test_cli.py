"""How every script ends on Ctrl-C (`scripts.cli`): one line, exit code 130.

Each test runs a small program built on `cli.run` as a user would, in a
process group of its own, and sends SIGINT to the whole group once the
program says it is ready, as a terminal's Ctrl-C does: deterministic, no
sleeps (the program blocks until the signal).
"""

import signal
import subprocess

import as_a_user  # pylint: disable=g-bad-import-order

# Says 'ready', then blocks until Ctrl-C. Not in a plain `sys.stdin.read()`:
# Python's C handler only notes a signal, and raises KeyboardInterrupt at
# the next bytecode or when a system call it interrupts returns; a Ctrl-C
# landing after 'ready' but before the read(2) starts would leave the read
# blocked for ever. The wakeup fd (written by that handler) wakes `select`
# however close to it the signal lands.
READY_THEN_WAIT = '''
import os, select, signal, sys

def ready_then_wait():
  wakeup, woken = os.pipe()
  os.set_blocking(woken, False)
  signal.set_wakeup_fd(woken)
  print('ready', flush=True)
  while True:  # Woken: KeyboardInterrupt at the loop's next bytecode.
    select.select([wakeup], [], [])
'''

# A script: `main` says 'ready' and waits; `interrupted()` says how to resume.
SCRIPT = READY_THEN_WAIT + '''
from scripts import cli

def main(argv):
  {main}
  ready_then_wait()

def interrupted():
  {interrupted}

cli.run(main, interrupted=interrupted)
'''


def _start(main='pass', interrupted="return 'resume from round 7'"):
  code = SCRIPT.format(main=main, interrupted=interrupted)
  return as_a_user.start(['-c', code], process_group=0, stdin=subprocess.PIPE)


def test_ctrl_c_ends_a_script_in_one_line_saying_how_to_resume():
  proc = _start()
  rest = as_a_user.interrupt_at(proc, 'ready')
  assert rest == 'interrupted: resume from round 7\n'
  assert proc.returncode == 130  # 128 + SIGINT, as shells expect.


def test_ctrl_c_under_a_progress_bar_is_one_line_after_the_bar():
  proc = _start(main='from tqdm import tqdm; tqdm(total=3).update(1)')
  rest = as_a_user.interrupt_at(proc, 'ready')
  assert rest.splitlines()[-1] == 'interrupted: resume from round 7', rest
  assert rest.count('interrupted') == 1 and not as_a_user.noise(rest), rest
  assert proc.returncode == 130


def test_ctrl_c_landing_in_a_weakref_callback_still_ends_the_script():
  # Python discards an exception raised in a weakref callback or finalizer
  # ("Exception ignored in: ..."); garbage collection runs them anywhere.
  proc = _start(main="""
  import signal, weakref
  class Thing: pass
  def collected(ref):
    signal.raise_signal(signal.SIGINT)  # Ctrl-C, while the callback runs.
    for _ in range(100): pass
  thing = Thing(); ref = weakref.ref(thing, collected); del thing
  import time; time.sleep(20)  # What the script does next.""")
  output, _ = proc.communicate(timeout=60)
  assert output.splitlines()[-1] == 'interrupted: resume from round 7'
  assert not as_a_user.noise(output), output  # No 'Exception ignored'.
  assert proc.returncode == 130


def test_a_failing_resume_hint_gives_the_general_advice():
  proc = _start(interrupted='raise RuntimeError("no run directory")')
  rest = as_a_user.interrupt_at(proc, 'ready')
  assert rest == 'interrupted: rerun the same command to run it again\n'
  assert proc.returncode == 130


def test_a_second_ctrl_c_while_exiting_ends_at_once_without_a_traceback():
  # The hint blocks, as a slow clean-up would; the second Ctrl-C ends it.
  proc = _start(interrupted="print('exiting', flush=True); sys.stdin.read()")
  # Each wait is bounded: a Ctrl-C the program never sees (one that inherited
  # SIGINT ignored from a suite run in the background, were it not for
  # `as_a_user.start`) fails the test with what it printed, not hangs it.
  try:
    for prefix in ('ready', 'exiting'):
      as_a_user.read_until(proc, prefix, timeout=60)
      proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=60)
  finally:
    proc.kill()  # A failure leaves no program behind (a no-op once ended).
  assert proc.returncode == -signal.SIGINT
  assert not as_a_user.noise(output), output


# A script that runs the one above as its child, as `scripts.sweep` runs
# `scripts.train`.
PARENT = '''
import subprocess, sys
from scripts import cli

def main(argv):
  return cli.run_child([sys.executable, '-c', {child!r}], {kwargs})

cli.run(main, interrupted='the parent says it')
'''


def _start_parent(kwargs=''):
  child = SCRIPT.format(main='pass', interrupted="return 'the child says it'")
  code = PARENT.format(child=child, kwargs=kwargs)
  return as_a_user.start(['-c', code], process_group=0, stdin=subprocess.PIPE)


def test_ctrl_c_during_a_child_script_is_the_childs_one_line():
  proc = _start_parent()
  rest = as_a_user.interrupt_at(proc, 'ready')  # The child's.
  assert rest == 'interrupted: the child says it\n'
  assert proc.returncode == 130


def test_a_child_whose_stderr_is_hidden_is_reported_by_its_parent():
  proc = _start_parent('stderr=subprocess.DEVNULL')
  rest = as_a_user.interrupt_at(proc, 'ready')
  assert rest == 'interrupted: the parent says it\n'
  assert proc.returncode == 130


def test_ctrl_c_before_cli_run_starts_is_one_line_too():
  # As while a script imports TensorFlow, before it reaches `cli.run`.
  code = READY_THEN_WAIT + 'import scripts; ready_then_wait()'
  proc = as_a_user.start(['-c', code], process_group=0,
                         stdin=subprocess.PIPE)
  rest = as_a_user.interrupt_at(proc, 'ready')
  assert rest == 'interrupted: rerun the same command to run it again\n'
  assert proc.returncode == -signal.SIGINT  # A shell reports 130.
