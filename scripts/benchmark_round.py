r"""Seconds per federated round: in-process executor, TFF's C++ runtime, plain TF.

For each task and DP setting, the runners train the same model on the same
cohorts:

  inprocess  `tff_clip.runtime.simulation.InProcessRunner` (the default executor;
             clients on one thread per core, at most 4), client by client
  batched    `inprocess` with the cohort in one call
             (`tff_clip.runtime.batched_clients.BatchedRunner`, what
             `--client_execution=batched` runs)
  sequential `inprocess` with one client thread (clients one after another)
  local      TFF's C++ worker (`--executor=local`)
  plain_tf   the same local SGD steps in a `tf.function` per client over the
             client's `tf.data` pipeline, a Python loop over clients, then
             the mean of the updates; no federation, bounding or noise.
  audited    `inprocess` with 100 audit canaries in the DP query
             (`tff_clip.privacy.audit`, what `--audit_canaries=100` runs; DP on only)
  floor      the plain-TF floor: each client's batches built into tensors
             once for the whole benchmark, one `tf.function` per client's
             local training (no `tf.data`), a Python loop over clients, the
             update normalized, summed, noised, and applied with server
             momentum.

The first three build each round's client datasets as `scripts.train` does
(`tff_clip.runtime.client_data.ClientDatasets`), inside the timed round. Rounds are
interleaved (one round of each runner in turn) so that the load of a shared
machine hits all runners alike; the figure is the median over the rounds
after the first. The first build (TFF tracing, MapReduceForm
compilation, graph import, first round) is reported separately.
`--train` adds `scripts.train` end to end (checkpoints, metrics files,
evaluation included): the wall-time difference of a long and a short run
divided by the extra rounds, the default command's first round (seconds
from the command to its `round 1/` line), and trainings of one
`scripts.benchmark_frontier` cell run one after another in one fresh
process, as one of its workers runs them (the first, which traces, and the
later ones); each beside the plain-TF floor of the same rounds.

  .venv/bin/python -m scripts.benchmark_round --tasks=digits,emnist_cnn \
      --rounds=8 --train
"""

import collections
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from absl import flags
from absl import logging

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# pylint: disable=g-import-not-at-top
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from scripts import cli
from scripts import program
from tasks import synthetic
# pylint: enable=g-import-not-at-top

_TASKS = flags.DEFINE_list('tasks', ['digits', 'emnist_cnn', 'shakespeare'],
                           'Tasks (tasks.TASK_NAMES), offline data; options '
                           'after slashes, e.g. emnist_cnn/dropout=false.')
RUNNERS = ('inprocess', 'batched', 'sequential', 'local', 'plain_tf',
           'audited', 'floor')
_RUNNERS = flags.DEFINE_list('runners',
                             ['inprocess', 'local', 'plain_tf', 'floor'],
                             f'Which runners to time, of {", ".join(RUNNERS)}.')
flags.register_validator(
    'runners', lambda names: set(names) <= set(RUNNERS),
    message=f'--runners: choose from {", ".join(RUNNERS)}.')
_DP = flags.DEFINE_list('dp', ['on', 'off'], 'DP settings: on (adaptive '
                        'clipping, z=0.5 as scripts.train), off (no bounding).')
_ROUNDS = flags.DEFINE_integer('rounds', 6, 'Rounds per runner (first one '
                               'excluded from the median).')
_CLIENTS = flags.DEFINE_integer('clients_per_round', 20, 'Cohort size.')
_MECHANISMS = flags.DEFINE_list(
    'noise_mechanisms', ['independent'], 'Noise mechanisms timed for DP on '
    '(independent, banded, tree; correlated ones with --bands and '
    'participation with minimum separation).')
_BANDS = flags.DEFINE_integer('bands', 5, 'Bands / tree restart period.')
_BOOKKEEPING = flags.DEFINE_integer(
    'bookkeeping_rounds', 0, 'Also time the per-round records of a DP run '
    '(ledger and epsilon, releases.jsonl, metrics.csv, checkpoint) over this '
    'many rounds, and compare the first and the last 100 (0: skip).')
_COHORTS = flags.DEFINE_list(
    'cohort_sizes', [], 'Also time in-process DP rounds of these cohort sizes '
    'drawn from a population of --population clients of the heterogeneous '
    'quadratic, each generated when sampled (`GeneratedQuadraticClients`: '
    'the population is never held), (seconds per round and per client, '
    'resident memory after the second and the last round, peak); e.g. '
    '20,100,1000.')
_POPULATION = flags.DEFINE_integer('population', 10_000, 'Population of '
                                   '--cohort_sizes.')
_TRAIN = flags.DEFINE_bool('train', False, 'Also time scripts.train end to '
                           'end (digits, DP on) for inprocess and local, and '
                           'trainings of one frontier cell in one process.')
# The trainings of a frontier setting the speed target is stated for (its
# tuning at one epsilon and five final seeds).
FRONTIER_TRAININGS = 440
# The frontier cell --train times (scripts.benchmark_frontier.make_config):
# setting, method, epsilon.
FRONTIER_CELL = ('mnist1000', 'default', 4.0)
# The tuning trainings --train also times: one method's grid cells, each at
# another epsilon (so another noise multiplier), learning rate and quantile,
# one after another in one process, as a frontier worker tunes.
FRONTIER_TUNING_METHOD = 'normalize_adaptive'
FRONTIER_TUNING_CELLS = (
    (4.0, dict(server_learning_rate=0.5, target_quantile=0.3)),
    (2.0, dict(server_learning_rate=2.0, target_quantile=0.1)),
    (8.0, dict(server_learning_rate=0.25, target_quantile=0.7)),
)
_FRONTIER_SEEDS = flags.DEFINE_integer(
    'frontier_seeds', 3, 'With --train: trainings of one frontier cell '
    '(setting {}, method {}, epsilon {:g}; seeds 0 to N-1) run one after '
    'another in one fresh process with an empty graph cache, as one of '
    'scripts.benchmark_frontier\'s workers runs them; then N trainings of '
    '{}\'s grid cells in turn, each at another epsilon (0: skip).'.format(
        *FRONTIER_CELL, FRONTIER_TUNING_METHOD))
_FRONTIER_ROUNDS = flags.DEFINE_integer(
    'frontier_rounds', None, 'Rounds of each frontier training (default: '
    "the setting's).")


def _correlated(mechanism: str) -> bool:
  from tff_clip.aggregation import mechanisms  # pylint: disable=g-import-not-at-top
  return mechanisms.NOISE_MECHANISMS.get(mechanism).correlated


def _config(task, dp_on, mechanism='independent'):
  from tff_clip.program import training  # pylint: disable=g-import-not-at-top
  from tff_clip.program import flag_text  # pylint: disable=g-import-not-at-top
  task, *given = task.split('/')
  # The EMNIST tasks on the 5,000 real 28x28 MNIST digits (offline).
  options = (('offline_data', 'mnist'),) if task.startswith('emnist') else ()
  options += flag_text.parse_task_options(given)
  correlated = _correlated(mechanism)
  return training.TrainConfig(
      task=task, task_options=options, clients_per_round=_CLIENTS.value,
      sampling='min_separation' if correlated else 'fixed_size',
      noise_mechanism=mechanism,
      bands=_BANDS.value if correlated else 1,
      bounding='clip' if dp_on else 'none',
      noise_multiplier=0.5 if dp_on else None, progress=False)


class _PlainTF:
  """FedAvg's local SGD on a plain `tf.function`, clients in a Python loop."""

  def __init__(self, task, learning_rate):
    self._model = task.model_fn()
    variables = self._model.trainable_variables
    self._global = [tf.Variable(v) for v in variables]
    self._sum = [tf.Variable(tf.zeros_like(v)) for v in variables]

    @tf.function
    def client_update(dataset):
      for var, start in zip(self._model.trainable_variables, self._global):
        var.assign(start)
      for batch in iter(dataset):
        with tf.GradientTape() as tape:
          loss = self._model.forward_pass(batch, training=True).loss
        grads = tape.gradient(loss, self._model.trainable_variables)
        for var, grad in zip(self._model.trainable_variables, grads):
          var.assign_sub(learning_rate * tf.convert_to_tensor(grad))
      for total, var, start in zip(self._sum, self._model.trainable_variables,
                                   self._global):
        total.assign_add(var - start)

    @tf.function
    def apply(num_clients):
      for start, total in zip(self._global, self._sum):
        start.assign_add(total / tf.maximum(num_clients, 1.0))
        total.assign(tf.zeros_like(total))

    self._client_update, self._apply = client_update, apply

  def next(self, datasets):
    for dataset in datasets:
      self._client_update(dataset)
    self._apply(tf.constant(float(len(datasets))))


class _Floor:
  """The plain-TF floor: tensors built once, one `tf.function` per client.

  Each client's preprocessed batches are concatenated into tensors once; a
  client's local training slices them batch by batch inside one traced
  function; the server normalizes each update to `clip_norm`, sums, adds
  Gaussian noise and applies server momentum.
  """

  def __init__(self, task, learning_rate, clip_norm=1.0, noise=0.5):
    self._model = task.model_fn()
    variables = self._model.trainable_variables
    self._global = [tf.Variable(v) for v in variables]
    self._sum = [tf.Variable(tf.zeros_like(v)) for v in variables]
    self._momentum = [tf.Variable(tf.zeros_like(v)) for v in variables]
    self._tensors = {}
    self._spec = None

    def client_update(examples, ends):
      model_vars = self._model.trainable_variables
      for var, start in zip(model_vars, self._global):
        var.assign(start)
      begin = tf.constant(0, tf.int64)
      for end in ends:
        batch = tf.nest.map_structure(lambda t: t[begin:end], examples)  # pylint: disable=cell-var-from-loop
        with tf.GradientTape() as tape:
          loss = self._model.forward_pass(batch, training=True).loss
        grads = tape.gradient(loss, model_vars)
        for var, grad in zip(model_vars, grads):
          var.assign_sub(learning_rate * tf.convert_to_tensor(grad))
        begin = end
      update = [var - start for var, start in zip(model_vars, self._global)]
      scale = clip_norm / tf.maximum(tf.linalg.global_norm(update), 1e-12)
      for total, u in zip(self._sum, update):
        total.assign_add(u * scale)

    self._client_update_fn = client_update

    @tf.function
    def apply(num_clients):
      for start, total, velocity in zip(self._global, self._sum,
                                        self._momentum):
        noisy = total + tf.random.normal(total.shape, stddev=noise * clip_norm)
        velocity.assign(0.9 * velocity + noisy / num_clients)
        start.assign_add(velocity)
        total.assign(tf.zeros_like(total))

    self._apply = apply

  def _client_tensors(self, client_id, dataset):
    if client_id not in self._tensors:
      batches = list(dataset)
      if self._spec is None:
        self._spec = tf.nest.map_structure(
            lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), batches[0])
        self._client_update = tf.function(
            self._client_update_fn, input_signature=[
                self._spec, tf.TensorSpec([None], tf.int64)])
      examples = tf.nest.map_structure(lambda *t: tf.concat(t, 0), *batches)
      ends = np.cumsum([int(tf.nest.flatten(b)[0].shape[0]) for b in batches])
      self._tensors[client_id] = (examples, tf.constant(ends, tf.int64))
    return self._tensors[client_id]

  def prepare(self, cohort, datasets):
    """Builds the tensors of clients not seen before (outside the timing)."""
    for client_id, dataset in zip(cohort, datasets):
      self._client_tensors(client_id, dataset)

  def next(self, cohort):
    for client_id in cohort:
      self._client_update(*self._tensors[client_id])
    self._apply(tf.constant(float(len(cohort))))


def _bench_task(task_name, dp_on, mechanism='independent'):
  """{runner: (first build s, [seconds per round])} for one configuration."""
  from tff_clip.privacy import audit
  from tff_clip.program import assembly, training
  from tff_clip.runtime import client_data, execution, simulation  # pylint: disable=g-import-not-at-top
  config = _config(task_name, dp_on, mechanism)
  task = program.build_task(config)
  clients = client_data.ClientDatasets(task, config.seed, config.local_steps)
  batches = (client_data.ClientDatasets(task, config.seed, config.local_steps,
                                        batched=True)
             if 'batched' in _RUNNERS.value else None)
  client_ids = list(task.datasets.train_data.client_ids)
  noise = config.noise_multiplier
  rng = np.random.default_rng(0)
  cohorts = [rng.choice(client_ids, min(_CLIENTS.value, len(client_ids)),
                        replace=False) for _ in range(_ROUNDS.value)]
  # Every client's examples read into tensors before any timing (what
  # scripts.train does the first round a client is sampled in), so the
  # runner that goes first in a round does not pay for the others.
  for cohort in cohorts:
    clients.datasets(cohort, 0)
    if 'batched' in _RUNNERS.value:
      batches.datasets(cohort, 0).cohort_batches()
  runners, states, first, times = {}, {}, {}, {}
  for name in _RUNNERS.value:
    started = time.perf_counter()
    if name == 'plain_tf':
      runners[name] = _PlainTF(task, config.client_learning_rate)
    elif name == 'floor':
      runners[name] = _Floor(task, config.client_learning_rate)
    else:
      auditor = None
      if name == 'audited':  # 100 canaries in the DP query (tff_clip.privacy.audit).
        auditor = audit.CanaryFactory(
            assembly.build_aggregator(config, noise), 100,
            config.clients_per_round / len(client_ids))
      process = assembly.build_process(config, task, noise, auditor)
      if name in ('inprocess', 'audited', 'sequential', 'batched'):
        runners[name] = simulation.InProcessRunner(
            process, client_threads=1 if name == 'sequential' else None)
        if name == 'batched':
          from tff_clip.runtime import batched_clients  # pylint: disable=g-import-not-at-top
          aggregator, _, weighting = assembly.server_parts(config, noise)
          runners[name] = batched_clients.BatchedRunner(
              runners[name], task.model_fn, aggregator,
              client_weighting=weighting or
              tff.learning.ClientWeighting.NUM_EXAMPLES)
      else:
        execution.set_local_cpp_context()
        runners[name] = process
      states[name] = runners[name].initialize()
    first[name] = time.perf_counter() - started
    times[name] = []
  for round_num, cohort in enumerate(cohorts):
    for name in _RUNNERS.value:
      if name == 'floor':  # Its tensors are built once, outside the timing.
        runners[name].prepare(cohort, clients.datasets(cohort, 1))
      started = time.perf_counter()
      if name == 'floor':
        runners[name].next(cohort)
      else:
        data = (batches if name == 'batched' else clients).datasets(
            cohort, round_num + 1)
        if name == 'plain_tf':
          runners[name].next(data)
        else:
          states[name] = runners[name].next(states[name], data).state
      elapsed = time.perf_counter() - started
      if round_num == 0:
        first[name] += elapsed
      else:
        times[name].append(elapsed)
  return {name: (first[name], times[name]) for name in _RUNNERS.value}


def _bookkeeping_ms(rounds, parameters=20_000):
  """ms per round of a DP run's records: [first 100 rounds, last 100].

  The same calls the training loop makes after each round: the ledger
  records the round's event and gives epsilon, the checkpoint (a state of
  `parameters` float32 values with its pending row) is written, then the
  round is released to `releases.jsonl` and `metrics.csv`.
  """
  from tff_clip.privacy import accounting, privacy_ledger
  from tff_clip.program import checkpoints  # pylint: disable=g-import-not-at-top
  from tff_clip.program import run_records  # pylint: disable=g-import-not-at-top
  event = accounting.gaussian_round_event(0.5, 20, 1000)
  event_dict = privacy_ledger.event_to_dict(event)
  leaves = [np.zeros(parameters, np.float32)]
  ledger = privacy_ledger.PrivacyLedger()
  times = []
  with tempfile.TemporaryDirectory() as out:
    log = run_records.ReleaseLog(out)
    store = checkpoints.Checkpoints(os.path.join(out, 'checkpoints'))
    csv_path = os.path.join(out, 'metrics.csv')
    rows = []
    for round_num in range(1, rounds + 1):
      started = time.perf_counter()
      ledger.record(round_num, event)
      row = dict(round=round_num, clip_norm=0.1,
                 epsilon=ledger.guarantee(1e-5).epsilon)
      store.save(round_num, leaves, dict(
          pending=[dict(round=round_num, row=row, event=event_dict)],
          log_hash=log.hash_at(round_num - 1)))
      log.append(round_num, row, event_dict)
      rows.append(log.row(round_num))
      run_records.append_metrics_csv(csv_path, rows)
      times.append(time.perf_counter() - started)
  window = min(100, rounds)
  return [1e3 * statistics.median(times[1:window]),
          1e3 * statistics.median(times[-window:])]


def _memory_mib(field):
  """`VmRSS` (resident now) or `VmHWM` (peak) of this process, in MiB."""
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith(field + ':'):
        return int(line.split()[1]) / 1024
  return float('nan')


def _generated_quadratic_task(config):
  """The heterogeneous quadratic with `config.num_clients` generated clients
  (`GeneratedQuadraticClients`): its model, preprocessing and evaluation
  data are the task's own, built for 100 clients."""
  from tasks import task as task_lib  # pylint: disable=g-import-not-at-top
  small = program.build_task(dataclasses.replace(config, num_clients=100))
  datasets = tff.simulation.baselines.BaselineTaskDatasets(
      train_data=synthetic.GeneratedQuadraticClients(config.num_clients,
                                           seed=config.seed),
      test_data=small.datasets.test_data,
      train_preprocess_fn=small.datasets.train_preprocess_fn,
      eval_preprocess_fn=small.datasets.eval_preprocess_fn)
  return task_lib.Task(
      datasets, small.model_fn, name=small.name,
      data_source=small.data_source,
      model_description=small.model_description,
      data_description=f'{config.num_clients:,} generated clients',
      evaluates_on_clients_data=small.evaluates_on_clients_data)


def _cohort_rows(sizes, population, rounds):
  """[(clients, s/round, ms/client, RSS round 2, RSS last, peak)] per size."""
  from tff_clip.program import assembly, training
  from tff_clip.runtime import client_data, simulation  # pylint: disable=g-import-not-at-top
  rows = []
  for size in sizes:
    config = training.TrainConfig(
        task='heterogeneous_quadratic', num_clients=population,
        clients_per_round=size, sampling='fixed_size', bounding='clip',
        noise_multiplier=0.5, progress=False)
    task = _generated_quadratic_task(config)
    clients = client_data.ClientDatasets(task, config.seed)
    runner = simulation.InProcessRunner(
        assembly.build_process(config, task, config.noise_multiplier))
    state = runner.initialize()
    client_ids = task.datasets.train_data.client_ids
    rng = np.random.default_rng(0)
    times, memory = [], []
    for round_num in range(1, rounds + 1):
      cohort = [client_ids[i]
                for i in rng.choice(population, size, replace=False)]
      started = time.perf_counter()
      state = runner.next(state, clients.datasets(cohort, round_num)).state
      times.append(time.perf_counter() - started)
      memory.append(_memory_mib('VmRSS'))
    seconds = statistics.median(times[1:])
    rows.append((size, seconds, 1e3 * seconds / size, memory[1], memory[-1],
                 _memory_mib('VmHWM')))
  return rows


def _wall(args) -> float:
  """Seconds of `python args...` run in the repository, output discarded."""
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  started = time.perf_counter()
  command = [sys.executable] + list(args)
  code = cli.run_child(command, cwd=repo, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
  if code != 0:
    raise subprocess.CalledProcessError(code, command)
  return time.perf_counter() - started


def _first_round(args, env=None) -> tuple[float, float]:
  """(wall s, s to its first `round 1/` line) of `python args...` run in the
  repository, its stderr discarded; `env`: variables set for it."""
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  first = None
  started = time.perf_counter()
  with subprocess.Popen([sys.executable] + list(args), cwd=repo,
                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                        env=dict(os.environ, **(env or {})),
                        text=True) as proc:
    for line in proc.stdout:
      if first is None and line.startswith('round 1/'):
        first = time.perf_counter() - started
  if proc.returncode != 0 or first is None:
    raise subprocess.CalledProcessError(proc.returncode, args)
  return time.perf_counter() - started, first


def frontier_trainings(seeds: int, rounds, root: str,
                       tuning: bool = False) -> list[float]:
  """Wall seconds of each training of the frontier cell (`FRONTIER_CELL`,
  seeds 0 to `seeds` - 1, `rounds` each or the setting's), one after
  another in this process, as a `scripts.benchmark_frontier` worker runs
  them (`scripts.trainings.train`). `tuning`: training i is instead grid cell i (cycling
  through `FRONTIER_TUNING_CELLS`) of `FRONTIER_TUNING_METHOD`, seed i."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from scripts import benchmark_frontier  # pylint: disable=g-import-not-at-top
  from scripts import trainings  # pylint: disable=g-import-not-at-top
  setting, method, epsilon = FRONTIER_CELL
  walls = []
  for seed in range(seeds):
    cell = {}
    if tuning:
      method = FRONTIER_TUNING_METHOD
      epsilon, cell = FRONTIER_TUNING_CELLS[seed % len(FRONTIER_TUNING_CELLS)]
    config = benchmark_frontier.make_config(setting, method, cell, epsilon,
                                            seed, 'final', root, False)
    if rounds is not None:
      config = dataclasses.replace(config, rounds=rounds)
    started = time.perf_counter()
    trainings.train(config)
    walls.append(time.perf_counter() - started)
  return walls


def _frontier_walls(seeds, rounds, tuning=False) -> list[float]:
  """`frontier_trainings` in a fresh process with an empty graph cache."""
  from tff_clip.runtime import graph_cache  # pylint: disable=g-import-not-at-top
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with tempfile.TemporaryDirectory() as out:
    code = ('import json; from scripts import benchmark_round; '
            'print(json.dumps(benchmark_round.frontier_trainings('
            f'{seeds}, {rounds!r}, {os.path.join(out, "runs")!r}, '
            f'{tuning!r})))')
    result = subprocess.run(
        [sys.executable, '-c', code], cwd=repo, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True, check=True,
        env=dict(os.environ, **{graph_cache.ENV: os.path.join(out, 'graphs')}))
  return json.loads(result.stdout.strip().splitlines()[-1])


def _floor_round_seconds(config, rounds) -> float:
  """Median seconds of a plain-TF floor round (`_Floor`) of `config`'s task
  and cohort size, over `rounds` rounds after the first."""
  from tff_clip.runtime import client_data  # pylint: disable=g-import-not-at-top
  task = program.build_task(config)
  clients = client_data.ClientDatasets(task, config.seed, config.local_steps)
  client_ids = list(task.datasets.train_data.client_ids)
  rng = np.random.default_rng(0)
  floor = _Floor(task, config.client_learning_rate)
  times = []
  for round_num in range(1, rounds + 2):
    cohort = list(rng.choice(client_ids, min(config.clients_per_round,
                                             len(client_ids)), replace=False))
    floor.prepare(cohort, clients.datasets(cohort, round_num))
    started = time.perf_counter()
    floor.next(cohort)
    times.append(time.perf_counter() - started)
  return statistics.median(times[1:])


def _train_wall(rounds=None, executor='inprocess') -> float:
  with tempfile.TemporaryDirectory() as out:
    args = ['-m', 'scripts.train', f'--executor={executor}',
            '--progress=false', f'--root_output_dir={out}']
    return _wall(args + ([f'--rounds={rounds}'] if rounds else []))


def _train_seconds(executor, short=4, long=44):
  """(s/round, fixed seconds) of scripts.train: the slope and intercept of
  the wall time of a `short` and a `long` run, after an untimed `short` run
  (which fills the graph cache: both timed runs find it warm)."""
  _train_wall(short, executor)
  walls = [_train_wall(rounds, executor) for rounds in (short, long)]
  per_round = (walls[1] - walls[0]) / (long - short)
  return per_round, walls[0] - short * per_round


def _print_runner_table(rows):
  """The runners' table: seconds per round, ratios, first build."""
  names = _RUNNERS.value
  columns = ['task', 'DP'] + [f'{n} s/round' for n in names]
  columns += [f'{n} / floor' for n in names
              if n != 'floor' and 'floor' in names]
  if {'inprocess', 'local'} <= set(names):
    columns.append('inprocess / local')
  columns.append('first build (s)')
  header = '| ' + ' | '.join(columns) + ' |'
  print()
  print(header)
  print('|' + '---|' * (header.count('|') - 1))
  for task_name, dp_setting, result, medians in rows:
    cells = [f'{medians[n]:.4f}' for n in names]
    if 'floor' in names:
      cells += [f'{medians[n] / medians["floor"]:.2f}x' for n in names
                if n != 'floor']
    if {'inprocess', 'local'} <= set(names):
      cells.append(f'{medians["inprocess"] / medians["local"]:.3f}x')
    cells.append(', '.join(f'{n} {result[n][0]:.1f}' for n in names))
    print(f'| {task_name} | {dp_setting} | ' + ' | '.join(cells) + ' |')


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  rows = []
  for task_name in _TASKS.value:
    settings = [(d, m) for d in _DP.value
                for m in (_MECHANISMS.value if d == 'on' else ['independent'])]
    for dp_on, mechanism in settings:
      dp_setting = (f'{dp_on} ({mechanism}, b={_BANDS.value})'
                    if _correlated(mechanism) else dp_on)
      result = _bench_task(task_name, dp_on == 'on', mechanism)
      medians = {k: statistics.median(v) if v else float('nan')
                 for k, (_, v) in result.items()}
      rows.append((task_name, dp_setting, result, medians))
      print(f'{task_name} dp={dp_setting}: ' + ', '.join(
          f'{k} {m:.4f} s (first {result[k][0]:.1f} s)'
          for k, m in medians.items()), flush=True)
  if rows:
    _print_runner_table(rows)
  if _COHORTS.value:
    print()
    print(f'| clients per round (of {_POPULATION.value:,}) | s/round | '
          'ms/client | RSS after round 2 (MiB) | RSS after last (MiB) | '
          'peak RSS (MiB) |')
    print('|---|---|---|---|---|---|')
    for row in _cohort_rows([int(n) for n in _COHORTS.value],
                            _POPULATION.value, _ROUNDS.value):
      print('| {} | {:.3f} | {:.2f} | {:.0f} | {:.0f} | {:.0f} |'.format(*row),
            flush=True)
  if _BOOKKEEPING.value:
    first, last = _bookkeeping_ms(_BOOKKEEPING.value)
    print()
    print(f'| records of a DP round | rounds 2-100 ms | last 100 of '
          f'{_BOOKKEEPING.value} ms |')
    print('|---|---|---|')
    print(f'| ledger + epsilon, checkpoint, releases.jsonl, metrics.csv | '
          f'{first:.2f} | {last:.2f} |', flush=True)
  if _TRAIN.value:
    _print_train_tables()


def _print_train_tables():
  """scripts.train end to end, and the frontier's trainings, each beside
  the plain-TF floor of the same rounds."""
  from scripts import benchmark_frontier  # pylint: disable=g-import-not-at-top
  from tff_clip.program import training  # pylint: disable=g-import-not-at-top
  default = training.TrainConfig()
  floor = _floor_round_seconds(default, 5)
  print()
  print('| scripts.train, digits, DP on | s/round, all included | floor '
        's/round | / floor | fixed s (start-up and end) | default command '
        f'({default.rounds} rounds) s | its first round after s | floor: '
        f'{default.rounds} rounds s | import TF + TFF s |')
  print('|---|---|---|---|---|---|---|---|---|')
  imports = _wall(['-c', 'import tensorflow_federated'])
  from tff_clip.runtime import graph_cache  # pylint: disable=g-import-not-at-top
  cold = None
  for executor in ('inprocess', 'local'):
    per_round, fixed = _train_seconds(executor)
    command = ['-m', 'scripts.train', f'--executor={executor}',
               '--progress=false']
    with tempfile.TemporaryDirectory() as out:
      wall, first = _first_round(command + [f'--root_output_dir={out}'])
    if executor == 'inprocess':  # Its graphs are cached; again, cache empty.
      with tempfile.TemporaryDirectory() as out:
        cold = _first_round(
            command + [f'--root_output_dir={out}/runs'],
            env={graph_cache.ENV: os.path.join(out, 'graphs')})
    print(f'| --executor={executor} | {per_round:.3f} | {floor:.3f} | '
          f'{per_round / floor:.1f}x | {fixed:.1f} | {wall:.1f} | '
          f'{first:.1f} | {default.rounds * floor:.1f} | {imports:.1f} |',
          flush=True)
  print(f'\nThe default command with an empty graph cache (cold): '
        f'{cold[0]:.1f} s, its first round after {cold[1]:.1f} s (the '
        'table: a warm cache).', flush=True)
  seeds = _FRONTIER_SEEDS.value
  if seeds < 1:
    return
  setting, method, epsilon = FRONTIER_CELL
  with tempfile.TemporaryDirectory() as out:
    cell = benchmark_frontier.make_config(setting, method, {}, epsilon, 0,
                                          'final', out, False)
  rounds = _FRONTIER_ROUNDS.value or cell.rounds
  cell_floor = _floor_round_seconds(cell, 5)
  print()
  print(f'| frontier trainings ({setting}, {rounds} rounds of '
        f'{cell.clients_per_round} clients), one process, empty graph cache '
        f'| first s | later s (median of {seeds - 1}) | floor: {rounds} '
        'rounds s | later / floor |')
  print('|---|---|---|---|---|')
  tunings = ', '.join(f'eps {e:g} {benchmark_frontier.cell_name(c)}'
                      for e, c in FRONTIER_TUNING_CELLS)
  rows = ((f'{method}, eps {epsilon:g}, seeds 0-{seeds - 1}', False),
          (f'{FRONTIER_TUNING_METHOD}, grid cells in turn ({tunings}), '
           f'seeds 0-{seeds - 1}', True))
  later = {}
  for label, tuning in rows:
    walls = _frontier_walls(seeds, _FRONTIER_ROUNDS.value, tuning)
    later[tuning] = (statistics.median(walls[1:]) if len(walls) > 1
                     else float('nan'))
    print(f'| {label} | {walls[0]:.1f} | {later[tuning]:.1f} | '
          f'{rounds * cell_floor:.1f} | '
          f'{later[tuning] / (rounds * cell_floor):.1f}x |', flush=True)
  from scripts import trainings  # pylint: disable=g-import-not-at-top
  jobs = trainings.cores()
  typical = max(later.values())
  print(f'\n{FRONTIER_TRAININGS} such trainings on {jobs} jobs (one per '
        f'core), each at the slower later figure: about '
        f'{FRONTIER_TRAININGS * typical / jobs / 60:.0f} min (the floor\'s '
        f'rounds: {FRONTIER_TRAININGS * rounds * cell_floor / jobs / 60:.1f} '
        'min).', flush=True)


if __name__ == '__main__':
  cli.run(main)
