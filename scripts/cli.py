"""How every script of this repository starts and ends: one line, never a traceback.

absl's `app.run` prints flag errors over several lines with exit code 1, and
(for `scripts.train`) importing TensorFlow first inside it breaks Keras 2.14.
`run(main)` parses the flags itself: `--help` prints the module's docstring
and flags; a bad flag, `app.UsageError` or `ValueError` from `main` prints
`error: ...` on one line of stderr and exits 2.

Ctrl-C (SIGINT) wherever it lands once `run` has started -- in TensorFlow,
the progress bar, a checkpoint write -- ends the script with one line on
stderr, `interrupted: ...` (what the script's `interrupted()` says: for
`scripts.train` the round a rerun of the same command resumes from), and
exit code 130, as shells expect. What a script leaves on disk is safe to
interrupt: a run directory's records are written atomically
(`tff_clip.program.run_records`). A second Ctrl-C while the script exits ends it at
once, silently. A script that runs another one (`run_child`) leaves a Ctrl-C
to it, as a shell does with its foreground job, and the child's line is the
only one. A Ctrl-C that lands in a finalizer or a weakref callback (garbage
collection runs them anywhere, TensorFlow's often), where Python prints
"Exception ignored in: ..." and carries on, is delivered again, so that it
still ends the script.
"""

import atexit
import gc
import json
import os
import signal
import subprocess
import sys
import threading

from absl import app
from absl import flags

__all__ = ['Interrupted', 'fail', 'run', 'run_child']

HELP_ARGS = ('-h', '-?', '--help', '--helpshort', '--helpfull')
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT: what a shell reports for Ctrl-C.
# What an interrupted script that trains run directories says.
RESUMES_ITS_RUNS = ('rerun the same command to resume (finished runs are '
                    'reused, interrupted runs resume)')


class Interrupted(KeyboardInterrupt):
  """A child run by `run_child` was interrupted and said so itself."""


def fail(message) -> int:
  """Prints `error: message` on one line of stderr; returns exit code 2."""
  print(f'error: {" ".join(str(message).split())}', file=sys.stderr)
  return 2


def _close_progress_bars():
  """Ends tqdm's bars on their own lines, so that ours starts a fresh one."""
  tqdm = sys.modules.get('tqdm')
  if tqdm is not None:
    for bar in list(getattr(tqdm.tqdm, '_instances', ())):
      bar.close()


def _interrupted(error, interrupted) -> int:
  # First: a second Ctrl-C now ends the process at once, with no traceback.
  signal.signal(signal.SIGINT, signal.SIG_DFL)
  if isinstance(error, Interrupted):
    return INTERRUPTED_EXIT_CODE  # The child said it.
  message = 'rerun the same command to run it again'
  if isinstance(interrupted, str):
    message = interrupted
  elif interrupted is not None:
    try:
      message = interrupted()
    except Exception:  # pylint: disable=broad-except
      pass  # The flags were not all parsed yet: the general advice.
  _close_progress_bars()
  print(f'interrupted: {message}', file=sys.stderr, flush=True)
  return INTERRUPTED_EXIT_CODE


def _deliver_again(unraisable_hook):
  """`sys.unraisablehook` that re-raises SIGINT for a swallowed Ctrl-C.

  Python discards an exception raised in a finalizer or weakref callback
  (an "unraisable" one): a KeyboardInterrupt raised there would be lost
  and the script would run on. The signal is sent again a moment later,
  from a thread: raised here, it would be lost in this hook too.
  """
  def hook(unraisable):
    if issubclass(unraisable.exc_type, KeyboardInterrupt) and _ctrl_c_raises():
      timer = threading.Timer(0.01, _send_ctrl_c)
      timer.daemon = True
      timer.start()
    else:
      unraisable_hook(unraisable)
  return hook


def _ctrl_c_raises() -> bool:
  return signal.getsignal(signal.SIGINT) is signal.default_int_handler


def _send_ctrl_c():
  if _ctrl_c_raises():  # Not once the script is ending (`_interrupted`).
    os.kill(os.getpid(), signal.SIGINT)


def _exit_now(code: int) -> None:
  """Exits with `code` without the interpreter's teardown.

  What an ordinary exit does that writes anything is done first: garbage
  in reference cycles is collected (a writer caught in one, such as
  TensorBoard's, flushes as it is freed), the `atexit` hooks run
  (TensorFlow's and TFF's, the TFF context and workers closed by
  `tff_clip`, tqdm's, multiprocessing's joining of children), and the
  streams are flushed. What is skipped is freeing every module and object
  one by one: for a process that imported TensorFlow, seconds of work
  that write nothing.
  """
  try:
    gc.collect()
    atexit._run_exitfuncs()  # pylint: disable=protected-access
  finally:
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except (OSError, ValueError):  # Closed, or a reader that went away.
        pass
    os._exit(code)  # pylint: disable=protected-access


def _ascii_numbers(flag_values) -> None:
  """Numeric absl flags read ASCII digits only, no underscores.

  Python's int() and float() read other scripts' digits ('٣' is 3, a
  fullwidth '１' is 1) and underscores ('1_0' is 10): on a command line
  these are typos or look-alikes, refused as `tff_clip.checks.ascii_number`
  refuses them for the training program's flags.
  """
  for flag in flag_values._flags().values():  # pylint: disable=protected-access
    parser = flag.parser
    if (isinstance(parser, (flags.FloatParser, flags.IntegerParser)) and
        not getattr(parser, 'ascii_only', False)):
      def convert(argument, convert=parser.convert):
        if isinstance(argument, str) and (not argument.isascii() or
                                          '_' in argument):
          raise ValueError(
              f'not an ASCII number without underscores: {argument!r}')
        return convert(argument)
      parser.convert = convert
      parser.ascii_only = True


def run(main, argv=None, interrupted=None, fast_exit=False) -> None:
  """Parses flags, calls `main(argv)` and exits with its code.

  Args:
    main: the script's `main(argv)`, returning its exit code (or None).
    argv: the command line (default `sys.argv`).
    interrupted: what a Ctrl-C prints after 'interrupted: ' (how to
      resume), or a function returning it, called once `main` was
      interrupted. Default: 'rerun the same command to run it again'.
    fast_exit: once `main` returned (its files closed) or was interrupted,
      exit without the interpreter's teardown (`_exit_now`); for scripts
      whose `main` closes what it writes. A traceback exits as usual.
  """
  argv = list(sys.argv if argv is None else argv)
  module = sys.modules['__main__']
  sys.unraisablehook = _deliver_again(sys.unraisablehook)
  try:
    if any(arg in HELP_ARGS for arg in argv[1:]):
      print(module.__doc__ or '')
      print(flags.FLAGS.module_help(module))
      code = 0
    else:
      try:
        _ascii_numbers(flags.FLAGS)
        rest = flags.FLAGS(argv)
      except flags.CantOpenFlagFileError as e:  # absl: 'ERROR:: Unable...'.
        code = fail(f'--flagfile: {str(e).replace("ERROR::", "").strip()}')
      except flags.Error as e:
        code = fail(f'{e} (see --help)')
      else:
        try:
          code = main(rest)
        except (app.UsageError, ValueError) as e:
          code = fail(e)
  except KeyboardInterrupt as e:
    code = _interrupted(e, interrupted)
  if fast_exit:
    _exit_now(code or 0)
  sys.exit(code or 0)


_FIRST_REFUSAL = ('import json, sys\n'
                  'from scripts import train\n'
                  'print(train.first_refusal(json.load(sys.stdin)), end="")\n')


def first_refusal(runs) -> tuple:
  """(index, why) of the first of `runs` (each a `scripts.train` argv) that
  it would refuse before training, else None; judged in a child process
  (`train.first_refusal`), whose flags are not the caller's."""
  if not runs:
    return None
  result = subprocess.run(
      [sys.executable, '-c', _FIRST_REFUSAL], input=json.dumps(list(runs)),
      capture_output=True, text=True, check=False)
  if result.returncode != 0:
    return 0, f'checking the runs failed: {result.stderr.strip()[-500:]}'
  if not result.stdout:
    return None
  index, _, message = result.stdout.partition(' ')
  return int(index), message


def run_child(command, **popen_kwargs) -> int:
  """Runs `command` as a shell runs a foreground job; returns its exit code.

  A Ctrl-C at the terminal reaches the child and this process alike: while
  the child runs, this process leaves it to the child (a tff_clip script
  ends with its own `interrupted: ...` line). When the child ends
  interrupted, this raises `Interrupted`, which `run` ends with exit code
  130 and no second line -- or, when the child's stderr is not ours (so its
  line was not seen), `KeyboardInterrupt`, which `run` reports itself.
  """
  # A Python handler, not SIG_IGN: the child must not inherit an ignored
  # SIGINT (exec resets handlers to the default, but keeps SIG_IGN).
  previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
  try:
    with subprocess.Popen(command, **popen_kwargs) as proc:
      code = proc.wait()
  finally:
    signal.signal(signal.SIGINT, previous)
  if code in (INTERRUPTED_EXIT_CODE, -signal.SIGINT):
    raise Interrupted() if popen_kwargs.get('stderr') is None else (
        KeyboardInterrupt())
  return code
