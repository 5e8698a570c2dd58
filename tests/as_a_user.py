"""Running the project's programs as a user would: a fresh interpreter in the checkout.

The programs define absl flags in one global registry, so each runs in a
process of its own, started from the repository root. The environment is a
user's shell's: TensorFlow sets TF2_BEHAVIOR=1 in this (pytest) process, and
inheriting it would hide import-order bugs of a program; the TensorFlow log
level is the program's own (`tff_clip/__init__.py`, `scripts/__init__.py`);
output is unbuffered, so a test can read a running program's lines as they
are printed.
"""

import contextlib
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading

REPO = pathlib.Path(__file__).resolve().parents[1]

# What a user never asked to see: TensorFlow's C++ log lines
# ("2024-01-31 12:00:00.123456: E tensorflow/..."), absl's and gRPC's
# ("E0131 12:00:00.123456 ..."), TensorFlow's Python logger, and tracebacks
# (TFF's at exit: "Exception ignored in: ...ServiceManager.__del__").
_NOISE = re.compile(r'\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] |'
                    r'[IWEF]\d{4} |WARNING:tensorflow:|Traceback|'
                    r'Exception ignored')


def env(**overrides):
  """The environment of a user's shell, with `overrides` set."""
  result = {k: v for k, v in os.environ.items()
            if k not in ('TF2_BEHAVIOR', 'TF_CPP_MIN_LOG_LEVEL')}
  result['PYTHONUNBUFFERED'] = '1'
  result.update(overrides)
  return result


def noise(output):
  """The lines of `output` a user never asked to see (log lines, tracebacks)."""
  return [line for line in output.splitlines() if _NOISE.match(line)]


def run(args, *, timeout=900, stdin_text=None, cwd=REPO, **overrides):
  """`python *args` run to its end: the CompletedProcess (text, not checked).

  `stdin_text`: what the program reads on its standard input; `cwd`: where
  it runs (default: the checkout).
  """
  return subprocess.run([sys.executable, *map(str, args)], cwd=cwd,
                        env=env(**overrides), capture_output=True, text=True,
                        input=stdin_text, timeout=timeout, check=False)


def refusal(proc, unwritten) -> str:
  """The one line a refused program ended with; checks the refusal's form.

  Exit code 2, nothing on stdout, one `error: ...` line on stderr, and the
  path `unwritten` (where the program would have written) not created.
  """
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert proc.stdout == ''
  lines = proc.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: '), proc.stderr
  assert not os.path.lexists(unwritten)
  return lines[0]


# `scripts.train`'s command line (`cli.run(train.main)`, the entry point's
# own code) for each command line read from stdin, in turn.
_TRAIN_EACH = """
import contextlib, io, json, sys
from scripts import cli, train
not_imported, commands = json.load(sys.stdin)
results = []
for argv in commands:
  train.FLAGS.unparse_flags()
  stdout, stderr = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
    try:
      cli.run(train.main, ['scripts.train', *argv])
      code = 0
    except SystemExit as e:
      code = e.code
  results.append([code, stdout.getvalue(), stderr.getvalue(),
                  [name for name in not_imported if name in sys.modules]])
print(json.dumps(results))
"""


def train_each(commands, not_imported=(), timeout=300):
  """`scripts.train` given each of `commands` in turn, in ONE fresh interpreter.

  For command lines refused before any training: a start-up each would cost
  a second a command. absl's flags are reset to their defaults between
  commands. Returns one (exit code, stdout, stderr, imported) per command,
  `imported` the modules of `not_imported` imported by the time it ended
  (once imported, a module stays: the first command to import it is the
  first to show it).
  """
  proc = run(['-c', _TRAIN_EACH], timeout=timeout,
             stdin_text=json.dumps([list(not_imported),
                                    [list(c) for c in commands]]))
  assert proc.returncode == 0, proc.stderr[-3000:]
  return [tuple(r) for r in json.loads(proc.stdout.splitlines()[-1])]


def python(code, *args, timeout=300, **overrides):
  """`python -c code *args` from the checkout: the CompletedProcess."""
  return run(['-c', code, *args], timeout=timeout, **overrides)


def start(args, **popen_kwargs):
  """`python *args` started: the Popen, stdout and stderr merged, as text.

  `process_group=0` starts it in a process group of its own, as a shell
  starts a job (`interrupt_at` needs it).
  """
  with foreground_job():
    return subprocess.Popen([sys.executable, *map(str, args)], cwd=REPO,
                            env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            **popen_kwargs)


@contextlib.contextmanager
def foreground_job():
  """Programs started inside take Ctrl-C as a terminal's foreground job does.

  A test suite started in the background (`make test &`, nohup, some CI
  runners) ignores SIGINT, and an ignored signal stays ignored across exec:
  the program would never see the test's Ctrl-C. A handled one is reset to
  the default action by exec, so SIGINT is handled here while the program
  starts. Not `preexec_fn`: that makes Python fork rather than spawn, and
  in a process where TFF's gRPC threads run, gRPC's fork handlers then
  write log lines into the program's stderr.
  """
  if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
    yield
    return
  signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def read_until(proc, line_prefix, timeout=None):
  """Reads `proc`'s output up to a line starting with `line_prefix`: the lines.

  Blocks on the program's output, with no timed sleep. A program that ends
  before printing the line fails the test, and so does one that has not
  printed it after `timeout` seconds (default: no limit), which is then
  killed; the failure shows what the program printed.
  """
  lines = []

  def read():
    for line in proc.stdout:
      lines.append(line)
      if line.startswith(line_prefix):
        return

  if timeout is None:
    read()
  else:  # In a thread: a program that never prints the line nor ends fails.
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
  printed = ''.join(lines)
  if timeout is not None and reader.is_alive():
    proc.kill()
    raise AssertionError(f'no line starting with {line_prefix!r} after '
                         f'{timeout} s; the program printed {printed!r} '
                         '(after any lines read before)')
  if not lines or not lines[-1].startswith(line_prefix):
    raise AssertionError(f'the program ended before printing '
                         f'{line_prefix!r}; it printed {printed!r} '
                         '(after any lines read before)')
  return lines


def kill_at(proc, line_prefix):
  """SIGKILLs `proc` once it prints a line starting with `line_prefix`.

  Blocks on the program's output, with no timed sleep; a program that ends
  before printing the line fails the test.
  """
  read_until(proc, line_prefix)
  proc.send_signal(signal.SIGKILL)
  proc.wait(timeout=60)
  assert proc.returncode == -signal.SIGKILL


def interrupt_at(proc, line_prefix):
  """Ctrl-C once `proc` prints a line starting with `line_prefix`.

  As a terminal does: SIGINT to the job's whole process group (the program
  and every process it started in it), so `proc` must lead one
  (`start(args, process_group=0)`). Blocks on the program's output, with no
  timed sleep; returns what the program printed after that line, once it
  ended. A program that ends before printing the line fails the test.
  """
  assert os.getpgid(proc.pid) == proc.pid, 'start(..., process_group=0)'
  read_until(proc, line_prefix)
  os.killpg(proc.pid, signal.SIGINT)
  rest, _ = proc.communicate(timeout=600)
  return rest
