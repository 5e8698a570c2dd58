"""How every script of this repository starts: one-line errors, exit code 2.

absl's `app.run` prints flag errors over several lines with exit code 1, and
(for `scripts.train`) importing TensorFlow first inside it breaks Keras 2.14.
`run(main)` parses the flags itself: `--help` prints the module's docstring
and flags; a bad flag, `app.UsageError` or `ValueError` from `main` prints
`error: ...` on one line of stderr and exits 2.
"""

import sys

from absl import app
from absl import flags

__all__ = ['fail', 'run']

HELP_ARGS = ('-h', '-?', '--help', '--helpshort', '--helpfull')


def fail(message) -> int:
  """Prints `error: message` on one line of stderr; returns exit code 2."""
  print(f'error: {" ".join(str(message).split())}', file=sys.stderr)
  return 2


def run(main, argv=None) -> None:
  """Parses flags, calls `main(argv)` and exits with its code."""
  argv = list(sys.argv if argv is None else argv)
  module = sys.modules['__main__']
  if any(arg in HELP_ARGS for arg in argv[1:]):
    print(module.__doc__ or '')
    print(flags.FLAGS.module_help(module))
    sys.exit(0)
  try:
    rest = flags.FLAGS(argv)
  except flags.Error as e:
    sys.exit(fail(f'{e} (see --help)'))
  try:
    code = main(rest)
  except (app.UsageError, ValueError) as e:
    code = fail(e)
  sys.exit(code or 0)
