r"""Normalization against clipping, round by round: update norms, noise, direction.

  .venv/bin/python -m scripts.diagnose_bounding --setting=mnist1000 \
      --target_epsilon=2
  .venv/bin/python -m scripts.diagnose_bounding --setting=digits1000 \
      --noise_multiplier=1.3 --rounds=2

Trains a frontier setting (`scripts.benchmark_settings.FRONTIER`) with the
same seed under each `--configs`: `default` is tff_clip's default
aggregation (adaptive normalization, its target quantile following the
noise; `normalize_q03` fixes the earlier default, 0.3) and `tff_default`
TFF's `gaussian_adaptive` at its own defaults (adaptive clipping, target
quantile 0.5, initial norm 0.1, norm learning rate 0.2), as in
`scripts.benchmark_frontier`. Both run at the noise multiplier z of
`--target_epsilon` (calibrated by the program's accountant) or at
`--noise_multiplier`. Before every DP round a non-private probe -- the same
model weights, the same cohort, no bounding -- returns each client's raw
update u_i. With the round's tracked norm C (read from the aggregator state
the round starts from) and its noise (std sigma = z C per coordinate of the
sum, n = clients_per_round the expected cohort the sum is divided by, d the
model's scalars), each round reports:

  * C against the quartiles of the raw norms ||u_i||;
  * the share of updates scaled down (||u_i|| > C) and, by normalization
    only, scaled up (||u_i|| < C: normalization sets every norm to C);
  * the signal, the norm of the bounded mean (1/n) sum_i s_i u_i (s_i = C /
    ||u_i|| normalizing, min(1, C / ||u_i||) clipping), against the noise on
    it, sigma sqrt(d) / n: their ratio and the noise share noise /
    (signal + noise);
  * the cosine between the bounded and the raw sum (how far bounding turns
    the update's direction);
  * the norm of the model's trainable weights.

Its output is NOT differentially private: the probe reads the clients' raw
updates, which no DP run releases. A diagnostic for data you may inspect.

Prints each configuration's table (medians over the early, middle and late
thirds of the rounds) and final test accuracy, and writes `bounding.csv`
(every round) and `bounding.png` under `--output_dir`.
"""

import collections
import dataclasses
import math
import os

from absl import flags
import numpy as np

from scripts import benchmark_settings
from scripts import cli
from scripts import outputs
from scripts import probes
from scripts import program
from tff_clip.program import config as config_lib

# The compared aggregations, as TrainConfig fields over the setting's.
CONFIGS = collections.OrderedDict([
    ('default', {}),  # TrainConfig's defaults: adaptive normalization.
    ('tff_default', dict(bounding='tff_gaussian', clip_norm='adaptive',
                         initial_clip_norm=0.1, target_quantile=0.5,
                         clip_learning_rate=0.2, clipped_count_stddev=None)),
    ('clip_q05', dict(clip_norm='adaptive', bounding='clip',
                      target_quantile=0.5)),
    ('normalize_q05', dict(clip_norm='adaptive', target_quantile=0.5)),
    # The default before it followed the noise.
    ('normalize_q03', dict(clip_norm='adaptive', target_quantile=0.3)),
    # The cells scripts.benchmark_frontier's tuning chose on mnist1000 for
    # TFF adaptive clipping (`tff_adaptive`) and adaptive normalization.
    ('tff_q01_lr05', dict(bounding='tff_gaussian', clip_norm='adaptive',
                          target_quantile=0.1, server_learning_rate=0.5)),
    ('normalize_q01_lr05', dict(clip_norm='adaptive', target_quantile=0.1,
                                server_learning_rate=0.5)),
])
NORMALIZING = ('normalize',)

_SETTING = flags.DEFINE_enum('setting', 'mnist1000',
                             list(benchmark_settings.FRONTIER),
                             'A setting of benchmark_settings.FRONTIER.')
_CONFIGS = flags.DEFINE_list('configs', ['default', 'tff_default'],
                             f'Compared aggregations: {", ".join(CONFIGS)}.')
_EPSILON = flags.DEFINE_float('target_epsilon', None,
                              'Epsilon that calibrates z (or --noise_multiplier).')
_Z = flags.DEFINE_float('noise_multiplier', None, 'z (or --target_epsilon).')
_ROUNDS = flags.DEFINE_integer('rounds', None, 'Rounds (setting default).')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of every run.')
_OUTPUT = flags.DEFINE_string('output_dir', 'runs/diagnose_bounding',
                              'Where bounding.csv and bounding.png go.')


def round_row(updates, clip_norm, bounding, noise_stddev, cohort):
  """The round's quantities (module docstring) from raw updates [k, d].

  `noise_stddev`: the std of the noise on each coordinate of the sum;
  `cohort`: n, what the sum is divided by.
  """
  updates = np.asarray(updates, np.float64)
  norms = np.linalg.norm(updates, axis=1)
  safe = np.maximum(norms, 1e-30)
  if bounding in NORMALIZING:
    scales = clip_norm / safe
  else:
    scales = np.minimum(1.0, clip_norm / safe)
  bounded = (scales[:, None] * updates).sum(axis=0)
  raw = updates.sum(axis=0)
  signal = float(np.linalg.norm(bounded)) / cohort
  noise = noise_stddev * math.sqrt(updates.shape[1]) / cohort
  cosine = float(bounded @ raw) / max(
      float(np.linalg.norm(bounded) * np.linalg.norm(raw)), 1e-30)
  q25, median, q75 = np.percentile(norms, [25, 50, 75])
  return collections.OrderedDict(
      clients=len(norms), tracked_norm=float(clip_norm),
      norm_q25=q25, norm_median=median, norm_q75=q75,
      norm_to_median=clip_norm / max(median, 1e-30),
      scaled_down=float(np.mean(norms > clip_norm)),
      scaled_up=(float(np.mean(norms < clip_norm))
                 if bounding in NORMALIZING else 0.0),
      signal=signal, noise=noise,
      noise_to_signal=noise / max(signal, 1e-30),
      noise_share=noise / max(signal + noise, 1e-30), cosine=cosine)


def _norm_and_stddev(state, config):
  """(C, noise std on the sum) of the round `state` starts."""
  aggregator = state.aggregator
  if config.bounding == 'tff_gaussian':  # tensorflow-privacy's sum state.
    return (float(probes.find(aggregator, 'l2_norm_clip')),
            float(probes.find(aggregator, 'stddev')))
  norm = float(probes.find(aggregator, 'clip_norm'))
  return norm, float(probes.find(aggregator, 'noise_multiplier')) * norm


def diagnose(base, name):
  """(rows, final test accuracy) of one DP run of `base` under CONFIGS[name]."""
  from tff_clip.program import assembly  # pylint: disable=g-import-not-at-top
  # Client by client: the probe replays each client's own dataset through
  # TFF's client work, which the batched path's cohort tensors are not.
  config = dataclasses.replace(base, **CONFIGS[name],
                               client_execution='per_client')
  program.validate(config)
  session = assembly.Session(config, program.build_task)
  probe = probes.ClientUpdates(config, session.task)
  state = session.initial_state()
  rows = []
  for round_num in range(1, config.rounds + 1):
    cohort = session.sampler.sample(round_num)
    datasets = session.client_datasets.datasets(cohort, round_num)
    weights = session.process.get_model_weights(state)
    clip_norm, stddev = _norm_and_stddev(state, config)
    row = collections.OrderedDict(config=name, round=round_num)
    # How far the model has moved (noise included): large weights saturate
    # the softmax, and the clients it fits send vanishing updates.
    row['weight_norm'] = math.sqrt(sum(
        float(np.sum(np.square(v))) for v in weights.trainable))
    row.update(round_row(probe(weights, datasets), clip_norm,
                         config.bounding, stddev, config.clients_per_round))
    rows.append(row)
    state = session.process.next(state, datasets).state
  return rows, session.evaluate(state)['eval_accuracy']


COLUMNS = (('norm_to_median', 'C / median norm', '.2f'),
           ('scaled_up', 'scaled up', '.0%'),
           ('scaled_down', 'scaled down', '.0%'),
           ('noise_to_signal', 'noise / signal', '.2f'),
           ('cosine', 'cos(bounded, raw)', '.3f'))


def summary_table(rows, accuracies):
  """Each config's columns: medians over its early, middle and late rounds."""
  lines = ['| config | rounds | ' + ' | '.join(c[1] for c in COLUMNS) + ' |',
           '|---|---|' + '---:|' * len(COLUMNS)]
  for name in accuracies:
    mine = [r for r in rows if r['config'] == name]
    for part, chunk in zip(('early', 'middle', 'late'),
                           np.array_split(np.arange(len(mine)), 3)):
      if not len(chunk):
        continue
      span = f'{part} {mine[chunk[0]]["round"]}-{mine[chunk[-1]]["round"]}'
      cells = [format(np.median([mine[i][key] for i in chunk]), spec)
               for key, _, spec in COLUMNS]
      lines.append(f'| {name} | {span} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines) + '\n\nfinal test accuracy: ' + ', '.join(
      f'{n} {a:.4f}' for n, a in accuracies.items())


def plot(rows, path, title):
  names = list(dict.fromkeys(r['config'] for r in rows))
  with outputs.figure(path, 2, 2, figsize=(11, 7), sharex=True,
                      squeeze=False) as (fig, axes):
    for i, name in enumerate(names):
      mine = [r for r in rows if r['config'] == name]
      rounds = [r['round'] for r in mine]
      color = f'C{i}'
      ax = axes[0][0]
      ax.plot(rounds, [r['tracked_norm'] for r in mine], color=color,
              label=f'{name}: C')
      ax.plot(rounds, [r['norm_median'] for r in mine], color=color,
              linestyle=':', label=f'{name}: median ||u||')
      ax.fill_between(rounds, [r['norm_q25'] for r in mine],
                      [r['norm_q75'] for r in mine], color=color, alpha=0.1)
      axes[0][1].plot(rounds, [r['noise_to_signal'] for r in mine],
                      color=color, label=name)
      axes[1][0].plot(rounds, [r['scaled_up'] for r in mine], color=color,
                      label=f'{name}: up')
      axes[1][0].plot(rounds, [r['scaled_down'] for r in mine], color=color,
                      linestyle='--', label=f'{name}: down')
      axes[1][1].plot(rounds, [r['cosine'] for r in mine], color=color,
                      label=name)
    for ax, label in ((axes[0][0], 'norm (quartiles shaded)'),
                      (axes[0][1], 'noise / signal (mean update)'),
                      (axes[1][0], 'share of updates scaled'),
                      (axes[1][1], 'cos(bounded mean, raw mean)')):
      ax.set_ylabel(label)
      ax.grid(True, alpha=0.3)
      ax.legend(fontsize=7)
    axes[0][0].set_yscale('log')
    axes[0][1].set_yscale('log')
    for ax in axes[1]:
      ax.set_xlabel('round')
    fig.suptitle(title)


def main(argv):
  if len(argv) > 1:
    return cli.fail(f'unexpected arguments: {argv[1:]}')
  unknown = [c for c in _CONFIGS.value if c not in CONFIGS]
  if unknown or not _CONFIGS.value:
    return cli.fail(f'--configs: unknown {unknown}; choose from '
                    f'{", ".join(CONFIGS)}.')
  if (_EPSILON.value is None) == (_Z.value is None):
    return cli.fail('--target_epsilon or --noise_multiplier: give exactly '
                    'one (the runs are DP).')
  fields = dict(benchmark_settings.FRONTIER[_SETTING.value],
                seed=_SEED.value, progress=False, eval_split='test',
                target_epsilon=_EPSILON.value, noise_multiplier=_Z.value)
  try:
    base, rows, accuracies = probes.compare(fields, _ROUNDS.value, _CONFIGS.value,
                                            diagnose, _OUTPUT.value)
  except config_lib.ConfigError as e:
    return cli.fail(e)
  from tff_clip.program import preflight  # pylint: disable=g-import-not-at-top
  z = preflight.resolve_noise_multiplier(base, base.num_clients)
  privacy = (f'epsilon {_EPSILON.value:g} (z = {z:.3f})' if _Z.value is None
             else f'z = {z:g}')
  outputs.write_csv(os.path.join(_OUTPUT.value, 'bounding.csv'), rows)
  plot(rows, os.path.join(_OUTPUT.value, 'bounding.png'),
       f'{_SETTING.value}: {privacy}, {base.rounds} rounds, seed '
       f'{base.seed} (NOT DP: raw client norms)')
  print(f'{_SETTING.value}, {privacy}, seed {base.seed}: NOT differentially '
        'private (read from the raw client updates)')
  print(summary_table(rows, accuracies))
  print(f'outputs: {_OUTPUT.value}/bounding.csv, bounding.png')
  return 0


if __name__ == '__main__':
  cli.run(main)
