"""README and docs/ are a contract: every command and snippet runs as written.

Every page (README.md and each docs/*.md, found by glob, so a new page is
checked without editing this file) is read the same way:
  * `make setup` / `make test`: what CI itself runs (`.ci/run`); not re-run.
  * Python snippets: run in a fresh interpreter, in a user's environment
    (no TF_CPP_MIN_LOG_LEVEL), from a directory outside the checkout that
    sees its `tff_clip` only (as a project that installed it: no `tasks`,
    no `scripts`); they must exit 0, print no TensorFlow log line and no
    traceback (TFF's at exit included), and leave no TFF worker process
    behind (README's in the default suite, docs/' in the slow suite).
  * A block starting with `$ command` followed by output: the command runs
    and must print exactly that output.
  * The task table (docs/tasks.md): `tasks.describe_markdown()` prints it.
  * Every `.venv/bin/python -m scripts.X ...` command: its flags are parsed
    and validated, a sweep's cells by `--dry_run` (default suite); and it
    runs at smoke size (slow suite: `make test-slow`), with the overrides of
    `SMOKE_OVERRIDES` appended -- fewer rounds and clients, offline data --
    never by editing the text.
  * As a reader goes (slow suite): README, then the pages in the order of
    README's documentation table, every command and snippet as written, one
    after the other in ONE fresh copy of the checkout (no scratch directory
    per command, no added flag), so that two commands that collide, or a
    command that needs a step no page gives, fail. What it cannot run is in
    `NOT_RUN_IN_ORDER`, with the reason; a command still running after
    `STOP_AFTER_S` is stopped with Ctrl-C, as a reader stops a benchmark,
    and must end with its one `interrupted:` line.
  * As a reader meets them: README at most 250 lines, a docs page at most
    500; every relative link and #anchor (GitHub's slugs) resolves; a page
    of measurements shows a command or figures in its lead or first section,
    and the figures README quotes are the first section of their page.
"""

import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

import as_a_user  # pylint: disable=g-bad-import-order

REPO = as_a_user.REPO
README = (REPO / 'README.md').read_text()
PAGES = {str(path.relative_to(REPO)): path.read_text() for path in
         [REPO / 'README.md', *sorted((REPO / 'docs').glob('*.md'))]}

# Appended to each command for the smoke run (absl: the last value wins).
SMOKE_OVERRIDES = {
    'scripts.train': ['--rounds=2', '--clients_per_round=2', '--eval_every=1',
                      '--data_source=offline', '--progress=false',
                      '--max_concurrent_clients=2'],
    'scripts.sweep': ['--seeds=1'],
    'scripts.benchmark_aggregators': ['--clients=3', '--params=1000',
                                      '--leaves=2', '--repetitions=1'],
    'scripts.accountant': [],
    'scripts.benchmark_round': ['--tasks=digits', '--rounds=2',
                                '--clients_per_round=2', '--dp=on',
                                '--bookkeeping_rounds=20', '--population=50',
                                '--cohort_sizes=2,5', '--frontier_seeds=2',
                                '--frontier_rounds=2'],
    'scripts.benchmark_utility': ['--quick'],
    'scripts.benchmark_correlated': ['--quick', '--bands=2'],
    'scripts.benchmark_frontier': ['--quick', '--jobs=1'],
    'scripts.benchmark_floor': ['--quick'],
    'scripts.benchmark_calibration': ['--quick', '--jobs=1'],
    'scripts.diagnose_per_layer': ['--setting=digits', '--rounds=2'],
    'scripts.diagnose_bounding': ['--setting=digits1000', '--rounds=2'],
    'scripts.audit_table': ['--noise_multipliers=1'],
    'scripts.reproduce': ['--quick'],
    'scripts.share_run': [],  # --run_dir, --output_dir: a run made here.
    'scripts.benchmark_stackoverflow': [
        '--vocab_size=100', '--num_clients=3420', '--min_separation=10',
        '--clients_per_round=5', '--bands=10', '--e2e_clients_per_round=3',
        '--e2e_rounds=1', '--sentences_per_client=16',
        '--mechanisms=independent', '--doc='],
}
# Extra train flags given to each sweep cell for the smoke run.
SWEEP_TRAIN_OVERRIDES = ['--rounds=1', '--clients_per_round=2',
                         '--data_source=offline']


def _env():
  return as_a_user.env(TF_CPP_MIN_LOG_LEVEL='3')


def _blocks(page=README):
  """Code blocks: fenced (``` ... ```) and indented (4 spaces)."""
  fenced = re.findall(r'```(\w*)\n(.*?)```', page, flags=re.S)
  text = re.sub(r'```.*?```', '', page, flags=re.S)
  indented = [m.group(0) for m in re.finditer(
      r'(?:^(?:    .*)?\n)+', text, flags=re.M) if m.group(0).strip()]
  return fenced, [re.sub(r'^    ', '', b, flags=re.M) for b in indented]


def _commands(page):
  """Every `.venv/bin/python -m scripts.X` command, continuations joined."""
  fenced, indented = _blocks(page)
  texts = indented + [body for lang, body in fenced if lang != 'python']
  commands = []
  for text in texts:
    joined = re.sub(r'\\\n\s*', ' ', text)
    for line in joined.splitlines():
      line = line.strip().lstrip('$ ').split('  #')[0].strip()
      if line.startswith('.venv/bin/python -m scripts.'):
        commands.append(line)
  return commands


COMMANDS = [command for text in PAGES.values() for command in _commands(text)]
# Commands that need machines this test cannot start (remote workers named
# by their addresses): their flags are validated, and the remote path runs
# in tests/test_training.py::test_two_remote_workers_match_the_local_run.
NEEDS_REMOTE_WORKERS = [c for c in COMMANDS if '--executor=remote' in c]


def test_readme_has_the_commands_it_promises():
  modules = {shlex.split(c)[2] for c in COMMANDS}
  assert {'scripts.train', 'scripts.sweep', 'scripts.accountant',
          'scripts.benchmark_aggregators'} <= modules
  assert 'make setup' in README and 'make test' in README


def _train_args(command):
  args = shlex.split(command)[3:]
  module = shlex.split(command)[2]
  if module != 'scripts.train':  # sweep, audit_table: train's after --.
    args = args[args.index('--') + 1:] if '--' in args else []
  return module, args


TRAIN_COMMANDS = [c for c in COMMANDS if shlex.split(c)[2] in (
    'scripts.train', 'scripts.sweep', 'scripts.audit_table')]

# Each command's train flags, parsed from the defaults and validated, all in
# one fresh interpreter (a second is the start-up of each): absl's flags are
# reset to their defaults between commands. Only train's flags are defined
# there (a second script's would collide in absl's global registry).
_VALIDATE_ALL = """
import json, sys
from scripts import train, program
errors = []
for args in json.loads(sys.argv[1]):
  train.FLAGS.unparse_flags()
  try:
    train.FLAGS(['train', *args])
    program.validate(train.config_from_flags())
    errors.append('')
  except Exception as e:  # pylint: disable=broad-except
    errors.append(f'{type(e).__name__}: {e}')
print(json.dumps(errors))
"""


@pytest.fixture(scope='module')
def flag_errors():
  """{command: '' if its train flags parse and validate, else the error}."""
  commands = [c for c in TRAIN_COMMANDS
              if shlex.split(c)[2] != 'scripts.sweep']
  result = as_a_user.python(
      _VALIDATE_ALL, json.dumps([_train_args(c)[1] for c in commands]),
      timeout=300, TF_CPP_MIN_LOG_LEVEL='3')
  assert result.returncode == 0, result.stderr[-2000:]
  return dict(zip(commands, json.loads(result.stdout.splitlines()[-1]),
                  strict=True))


@pytest.mark.parametrize('command', TRAIN_COMMANDS)
def test_every_train_command_in_readme_has_valid_flags(command, flag_errors):
  if shlex.split(command)[2] == 'scripts.sweep':  # Checks every cell.
    words = shlex.split(command)  # --dry_run before the cells' flags.
    result = as_a_user.run([*words[1:3], '--dry_run', *words[3:]],
                           timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return
  assert flag_errors[command] == ''


def _snippets(page):
  fenced, _ = _blocks(page)
  return [body for lang, body in fenced if lang == 'python']


def _elsewhere(directory, checkout=REPO):
  """`directory`, outside the checkout, where Python sees its `tff_clip` only.

  As a project that installed tff_clip sees it (no `tasks`, no `scripts`):
  `directory/site/tff_clip` links to the checkout's package. Returns the
  PYTHONPATH to run with there.
  """
  site = pathlib.Path(directory) / 'site'
  site.mkdir(parents=True)
  (site / 'tff_clip').symlink_to(pathlib.Path(checkout) / 'tff_clip')
  return str(site)


def _run_snippet(snippet, directory, pythonpath):
  # With piped output: a leaked worker holding the pipe would hang this
  # call. The log level is the user's: unset (`as_a_user.env`).
  result = as_a_user.python(snippet, timeout=600, cwd=directory,
                            PYTHONPATH=pythonpath)
  assert result.returncode == 0, result.stderr[-3000:]
  assert not as_a_user.noise(result.stderr), result.stderr[-3000:]


def test_python_snippet_runs_quietly_and_leaves_no_process_behind(tmp_path):
  assert _snippets(README)
  for snippet in _snippets(README):
    _run_snippet(snippet, tmp_path, _elsewhere(tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize('page', [p for p in PAGES if p != 'README.md'])
def test_docs_python_snippets_run(page, tmp_path):
  for snippet in _snippets(PAGES[page]):
    _run_snippet(snippet, tmp_path, _elsewhere(tmp_path))


def test_quoted_command_output_is_what_the_tool_prints():
  quoted = [q for text in PAGES.values() for q in re.findall(
      r'```\n\$ (.*?)\n(.*?)```', text, flags=re.S)]
  assert quoted
  for command, expected in quoted:
    # The quoted command may continue on indented lines.
    lines = expected.splitlines()
    while lines and lines[0].startswith('    '):
      command = command.rstrip('\\ ') + ' ' + lines.pop(0).strip()
    command = command.replace('\\', ' ')
    result = subprocess.run(shlex.split(command), cwd=REPO, env=_env(),
                            capture_output=True, text=True, timeout=300,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == '\n'.join(lines).strip()


def _quoted_commands():
  return {' '.join(q.split()) for text in PAGES.values()
          for q in re.findall(r'```\n\$ (.*?)\n', text)}


@pytest.mark.parametrize('command', sorted({
    ' '.join(c.split()) for c in COMMANDS
    if shlex.split(c)[2] == 'scripts.accountant'} - _quoted_commands()))
def test_every_accountant_command_runs(command):
  # About a second each, no TensorFlow: run as written in the default suite
  # (the quoted ones run in test_quoted_command_output_is_what_the_tool_prints).
  result = as_a_user.run(shlex.split(command)[1:], timeout=120)
  assert result.returncode == 0, result.stderr[-3000:]
  assert not as_a_user.noise(result.stderr), result.stderr[-3000:]


@pytest.mark.slow
def test_task_table_is_what_describe_markdown_prints():
  import tasks  # pylint: disable=g-import-not-at-top
  assert tasks.describe_markdown().strip() in PAGES['docs/tasks.md']


def test_readme_is_for_users_and_short():
  assert len(README.splitlines()) <= 250
  for name, text in PAGES.items():
    if name != 'docs/REPRODUCTION.md':  # Its own paper index, by number.
      assert not re.search(r'\bseeds? 00\d', text), name


def test_every_docs_page_is_linked_from_readme():
  for name in PAGES:
    if name != 'README.md':
      assert f'({name})' in README, name


@pytest.mark.slow
@pytest.mark.parametrize('command', [c for c in COMMANDS
                                     if c not in NEEDS_REMOTE_WORKERS])
def test_every_readme_command_runs_at_smoke_size(command, tmp_path):
  module = shlex.split(command)[2]
  args = shlex.split(command)[1:]  # After .venv/bin/python.
  overrides = list(SMOKE_OVERRIDES.get(module, []))
  if module in ('scripts.train', 'scripts.sweep', 'scripts.audit_table',
                'scripts.benchmark_utility', 'scripts.benchmark_correlated',
                'scripts.benchmark_frontier', 'scripts.benchmark_calibration'):
    overrides.append(f'--root_output_dir={tmp_path}')
  if module in ('scripts.reproduce', 'scripts.diagnose_per_layer',
                'scripts.diagnose_bounding'):
    overrides.append(f'--output_dir={tmp_path}')
  if module == 'scripts.share_run':  # Shares a run trained here first.
    trained = as_a_user.run(
        ['-m', 'scripts.train', f'--root_output_dir={tmp_path}',
         '--experiment_name=run', *SMOKE_OVERRIDES['scripts.train']],
        timeout=1200, TF_CPP_MIN_LOG_LEVEL='3')
    assert trained.returncode == 0, trained.stderr[-3000:]
    overrides += [f'--run_dir={tmp_path}/run', f'--output_dir={tmp_path}/out']
  if '--' in args:  # sweep, audit_table: their flags, then train's.
    split = args.index('--')
    args = (args[:split] + overrides + ['--'] + args[split + 1:] +
            SWEEP_TRAIN_OVERRIDES)
  else:
    args += overrides
  result = as_a_user.run(args, timeout=1200, TF_CPP_MIN_LOG_LEVEL='3')
  assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
  if module == 'scripts.benchmark_floor':  # Its caches are dropped at exit.
    assert 'Exception ignored' not in result.stderr, result.stderr[-3000:]


# What the in-order run cannot run, by a text the command holds: the reason.
NOT_RUN_IN_ORDER = {
    '--executor=remote': 'names TFF workers on other machines, started by '
                         'hand (docs/execution.md); the remote path runs in '
                         'tests/test_training.py::'
                         'test_two_remote_workers_match_the_local_run',
    '--data_source=online': 'downloads its data set (network); each runs on '
                            'offline data at smoke size in '
                            'test_every_readme_command_runs_at_smoke_size',
}
# Benchmarks and full reproductions run for minutes to hours: the in-order
# run stops a command still running after this long with Ctrl-C, as a reader
# would, and its one-line ending is checked. README's commands must finish:
# later pages use their runs (docs/privacy.md shares README's main run).
STOP_AFTER_S = 60
# A command that exits 0 this soon after its Ctrl-C had finished its work
# (one that ignored Ctrl-C would run on for much longer).
FINISHING_S = 10


def _reading_order():
  """README, then the pages in the order README's documentation table has."""
  table = README.split('\n## Documentation\n')[1].split('\n## ')[0]
  linked = [page for page in dict.fromkeys(
      re.findall(r'\((docs/[\w.]+\.md)\)', table)) if page in PAGES]
  return ['README.md', *linked,
          *sorted(set(PAGES) - set(linked) - {'README.md'})]


def _fresh_checkout(directory):
  """The checkout's files (tracked, and new ones git does not ignore) copied
  to `directory`, with no `runs/`, as a clone is laid out: its `.venv` is
  this interpreter's environment, the one `make setup` made (CI runs `make
  setup` itself), and the shared data folder docs/tasks.md names is beside
  it (`../shared`, this checkout's)."""
  if (REPO.parent / 'shared').is_dir():
    directory.parent.mkdir(parents=True, exist_ok=True)
    (directory.parent / 'shared').symlink_to(REPO.parent / 'shared')
  listed = subprocess.run(
      ['git', 'ls-files', '-z', '--cached', '--others', '--exclude-standard'],
      cwd=REPO, capture_output=True, check=True).stdout.decode().split('\0')
  for name in filter(None, listed):
    if (REPO / name).is_file() and not (REPO / name).is_symlink():
      (directory / name).parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(REPO / name, directory / name)
  (directory / '.venv').symlink_to(sys.prefix)
  return directory


def _run_as_written(command, checkout, must_finish):
  """Runs `command` in `checkout` as a user's shell would: what it printed,
  after checking that it finished (exit 0) or, stopped with Ctrl-C after
  `STOP_AFTER_S`, ended with one `interrupted:` line (or, finishing as the
  Ctrl-C came, exited 0 within `FINISHING_S`)."""
  with as_a_user.foreground_job():
    proc = subprocess.Popen(shlex.split(command), cwd=checkout,
                            env=as_a_user.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, process_group=0)
  try:
    try:
      out, err = proc.communicate(
          timeout=1800 if must_finish else STOP_AFTER_S)
    except subprocess.TimeoutExpired:
      assert not must_finish, 'still running after 30 minutes'
      os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, to the whole job.
      stopped = time.monotonic()
      try:
        out, err = proc.communicate(timeout=300)
      except subprocess.TimeoutExpired:
        raise AssertionError('still running 5 minutes after Ctrl-C') from None
      if proc.returncode == 0 and time.monotonic() - stopped < FINISHING_S:
        pass  # It was finishing as Ctrl-C came (e.g. at 60 s on the dot).
      else:
        # 130 from `scripts.cli`; killed by SIGINT if stopped before it.
        assert proc.returncode in (130, -signal.SIGINT), (out + err)[-3000:]
        assert err.splitlines()[-1].startswith('interrupted: '), err[-3000:]
    else:
      assert proc.returncode == 0, (out + err)[-3000:]
  finally:
    if proc.poll() is None:  # Nothing of a failed command outlives it.
      os.killpg(proc.pid, signal.SIGKILL)
      proc.communicate()
  assert not as_a_user.noise(out + err), (out + err)[-3000:]
  return out + err


@pytest.mark.slow
def test_every_command_runs_in_order_in_one_fresh_checkout(tmp_path):
  checkout = _fresh_checkout(tmp_path / 'clone' / 'checkout')
  elsewhere = tmp_path / 'elsewhere'
  pythonpath = _elsewhere(elsewhere, checkout)
  for page in _reading_order():
    for command in _commands(PAGES[page]):
      if any(text in command for text in NOT_RUN_IN_ORDER):
        continue
      print(f'{page}: {command}', flush=True)  # Progress, with -s.
      try:
        _run_as_written(command, checkout, must_finish=page == 'README.md')
      except AssertionError as e:
        raise AssertionError(f'{page}: {command}\n{e}') from None
    for snippet in _snippets(PAGES[page]):
      _run_snippet(snippet, elsewhere, pythonpath)


# Pages as a reader meets them: short, their links whole, figures first.
PAGE_LINES = {'README.md': 250}  # Every docs/ page: at most 500 lines.


def _slug(heading):
  """GitHub's anchor for a heading: lower case, punctuation but `-` and `_`
  dropped, each space a hyphen (so ' - ' gives '--')."""
  return re.sub(r'[^\w\- ]', '', heading.strip().lower()).replace(' ', '-')


def _anchors(page):
  """The #anchors of a page's headings, repeats numbered as GitHub does."""
  text = re.sub(r'```.*?```', '', page, flags=re.S)
  seen, anchors = {}, set()
  for m in re.finditer(r'^#{1,6} +(.*?) *$', text, flags=re.M):
    slug = _slug(m.group(1))
    anchors.add(f'{slug}-{seen[slug]}' if slug in seen else slug)
    seen[slug] = seen.get(slug, 0) + 1
  return anchors


def _links(page):
  """Every relative link target ([text](target), images too)."""
  text = re.sub(r'```.*?```', '', page, flags=re.S)
  return [t for t in re.findall(r'\]\(([^)\s]+)\)', text)
          if not re.match(r'[a-z]+:', t)]


def test_anchor_slugs_are_githubs():
  # Anchors as GitHub renders them for headings of these pages.
  assert _slug("tff_clip's default against TFF's default, 20 seeds") == (
      'tff_clips-default-against-tffs-default-20-seeds')
  assert _slug('Accuracy at equal privacy (`python -m scripts.X`)') == (
      'accuracy-at-equal-privacy-python--m-scriptsx')
  assert _slug('The 0.03 quantile where the noise dominates') == (
      'the-003-quantile-where-the-noise-dominates')
  assert _anchors('# A\n## B\n```\n## C\n```\n## B\n') == {'a', 'b', 'b-1'}


@pytest.mark.parametrize('name', sorted(PAGES))
def test_every_page_is_short_enough_to_read(name):
  assert len(PAGES[name].splitlines()) <= PAGE_LINES.get(name, 500)


@pytest.mark.parametrize('name', sorted(PAGES))
def test_every_relative_link_and_anchor_resolves(name):
  links = _links(PAGES[name])
  for target in links:
    path, _, anchor = target.partition('#')
    resolved = (REPO / name).parent / path if path else REPO / name
    assert resolved.exists(), f'{name}: {target}: no such file'
    if anchor:
      assert resolved.suffix == '.md', f'{name}: {target}'
      assert anchor in _anchors(resolved.read_text()), (
          f'{name}: {target}: no such heading')


def test_the_links_are_read():
  assert sum(len(_links(text)) for text in PAGES.values()) > 100
  assert sum('#' in t for text in PAGES.values() for t in _links(text)) > 50


@pytest.mark.parametrize('name', sorted(
    name for name, text in PAGES.items()
    if name != 'README.md' and re.search(r'\b2026-\d\d-\d\d\b', text)))
def test_every_page_of_measurements_leads_with_a_command_or_figures(name):
  # A page that reports measurements (dated) shows, in its lead or its
  # first section, a command to run (indented or fenced) or a table of
  # figures: what was found, and how, come before how it was found.
  lead = '\n## '.join(PAGES[name].split('\n## ')[:2])
  assert re.search(r'^    \.venv/bin/python -m |^```|^\|---', lead,
                   flags=re.M), name


def test_readmes_measured_accuracy_leads_its_page():
  # The figures README quotes are the first section of the page it cites:
  # current figures first, how they were found after or apart.
  cited = re.search(r'Measured accuracy[^\n]*\]\((docs/[\w.]+\.md)#([\w-]+)\)',
                    README)
  assert cited, 'README: no cited measured accuracy'
  page, anchor = cited.groups()
  first = re.search(r'^## +(.*?) *$', PAGES[page], flags=re.M).group(1)
  assert _slug(first) == anchor, (page, first)


@pytest.mark.slow
def test_the_main_command_learns_at_a_single_digit_epsilon(tmp_path):
  """README's first command, as written: a guarantee worth having, a model
  that has learned (digits: chance is 0.10), in about 12 s of CPU."""
  main = next(c for c in _commands(README) if 'scripts.train' in c)
  args = shlex.split(main)[1:] + [f'--root_output_dir={tmp_path}',
                                  '--progress=false']
  result = as_a_user.run(args, timeout=600, TF_CPP_MIN_LOG_LEVEL='3')
  assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
  summaries = list(tmp_path.glob('*/summary.json'))
  assert len(summaries) == 1, summaries
  summary = json.loads(summaries[0].read_text())
  assert 1.0 <= summary['epsilon'] < 10.0, summary
  assert summary['delta'] <= 1e-5
  # Three times chance: the noise is secret (fresh every run), so the bound
  # leaves room below the 0.70-0.79 measured in four runs.
  assert summary['final_eval_accuracy'] > 0.3, summary
