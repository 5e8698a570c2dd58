r"""What the exact budget buys: noise calibrated by PLD against RDP, same seeds.

  .venv/bin/python -m scripts.benchmark_calibration --setting=mnist1000 --jobs=2
  .venv/bin/python -m scripts.benchmark_calibration --setting=digits1000 --jobs=2
  .venv/bin/python -m scripts.benchmark_calibration --quick      # CI-sized

A run asked for `--target_epsilon` draws the noise multiplier z that the
accountant it reports calibrates (PLD wherever it applies: the reported
epsilon within 0.5% of the target). Calibrating with RDP's looser bound
instead draws a larger z: the same runs carry the noise of the target under
RDP and report less under PLD. This script runs both, side by side, for
the frontier's untuned methods (`--methods`, default tff_clip's `default`
and TFF's `tff_default`, `scripts.benchmark_frontier`'s `make_config` on
its `--setting`), at every `--epsilons` value, on `--final_seeds` seeds:

  reported  z calibrated by the run's own (reporting) accountant;
  rdp       z calibrated by RDP (`preflight.calibrate_with`), given to the
            run as `--noise_multiplier` (so it reports its own, smaller,
            epsilon).

Each training is an ordinary run directory under
`--root_output_dir/<setting>_calibration/<reported|rdp>/` (a rerun skips
finished runs). Prints, per method and epsilon, both noise multipliers, the
epsilon each reports, the test accuracy of each (mean ± std over seeds) and
the paired difference reported − rdp with its 95% Student-t interval and
verdict (`scripts.verdicts`); writes `calibration.csv` and
`calibration.md` next to the runs.
"""

import collections
import dataclasses
import os

from absl import flags

from scripts import benchmark_frontier as frontier
from scripts import cli
from scripts import outputs
from scripts import program
from scripts import trainings
from scripts import verdicts

CALIBRATIONS = ('reported', 'rdp')
UNTUNED = (frontier.DEFAULT, frontier.TFF_DEFAULT)


def configs(setting, method, epsilon, seeds, root, quick, population=None):
  """{calibration: [TrainConfig per seed]} of one cell, and the two z."""
  out, z = {}, {}
  for calibration in CALIBRATIONS:
    base = os.path.join(root, calibration)
    cell = [frontier.make_config(setting, method, {}, epsilon, seed, 'final',
                                 base, quick) for seed in seeds]
    if population is None:
      population = len(program.build_task(cell[0]).datasets.train_data
                       .client_ids)
    from tff_clip.program import preflight  # pylint: disable=g-import-not-at-top
    if calibration == 'rdp':
      z[calibration] = preflight.calibrate_with(cell[0], population, 'rdp')
      cell = [dataclasses.replace(c, target_epsilon=None,
                                  noise_multiplier=z[calibration])
              for c in cell]
    else:
      z[calibration] = preflight.resolve_noise_multiplier(cell[0], population)
    out[calibration] = cell
  return out, z, population


def main(argv):
  if len(argv) > 1:
    return cli.fail(f'unexpected arguments: {argv[1:]}')
  methods = list(frontier._METHODS.value) or list(UNTUNED)  # pylint: disable=protected-access
  wrong = [m for m in methods if m not in UNTUNED]
  if wrong:
    return cli.fail(f'--methods: {wrong} are tuned methods; this benchmark '
                    f'compares the untuned {list(UNTUNED)}.')
  quick = frontier._QUICK.value  # pylint: disable=protected-access
  try:
    epsilons = frontier._floats(frontier._EPSILONS.value, 'epsilons')  # pylint: disable=protected-access
  except ValueError as e:
    return cli.fail(str(e))
  seeds = list(range(1 if quick else frontier._FINAL_SEEDS.value))  # pylint: disable=protected-access
  if quick:
    epsilons = epsilons[:1]
  setting = frontier._SETTING.value  # pylint: disable=protected-access
  jobs = frontier._JOBS.value or trainings.cores()  # pylint: disable=protected-access
  root = os.path.join(frontier._ROOT.value, f'{setting}_calibration')  # pylint: disable=protected-access
  cells, population = [], None
  for method in methods:
    for epsilon in epsilons:
      by_calibration, z, population = configs(setting, method, epsilon, seeds,
                                              root, quick, population)
      cells.append((method, epsilon, by_calibration, z))
  plan = [(i, calibration, config)
          for i, (_, _, by_calibration, _) in enumerate(cells)
          for calibration in CALIBRATIONS
          for config in by_calibration[calibration]]
  results = trainings.run_all([config for _, _, config in plan], jobs,
                             'calibration')
  runs = collections.defaultdict(dict)
  spent = collections.defaultdict(list)
  for (i, calibration, config), (accuracy, epsilon) in zip(plan, results):
    runs[i, calibration][config.seed] = verdicts.Run(
        accuracy, verdicts.fresh_noise_key(config.output_dir))
    spent[i, calibration].append(epsilon)
  rows, differences = [], []
  for i, (method, epsilon, _, z) in enumerate(cells):
    row = collections.OrderedDict(method=method, target_epsilon=epsilon)
    for calibration in CALIBRATIONS:
      accuracies = [run.accuracy for run in runs[i, calibration].values()]
      mean, std = frontier._mean_std(accuracies)  # pylint: disable=protected-access
      row[f'z_{calibration}'] = z[calibration]
      row[f'epsilon_{calibration}'] = max(spent[i, calibration])
      row[f'accuracy_{calibration}'] = mean
      row[f'std_{calibration}'] = std
    differences.append(verdicts.compare(runs[i, 'reported'], runs[i, 'rdp']))
    row.update(verdicts.csv_fields(differences[-1]))
    rows.append(row)
  outputs.write_csv(os.path.join(root, 'calibration.csv'), rows)
  lines = [
      f'{setting}: noise calibrated by the reported accountant against RDP, '
      f'{len(seeds)} seed' + 's' * (len(seeds) > 1) + ' each (test accuracy, '
      'mean ± std; difference reported − rdp in points, 95% interval).', '',
      '| method | target ε | z reported | ε reported | accuracy | z RDP | '
      'ε of the RDP run | accuracy | difference | verdict |',
      '|---|---:|---:|---:|---:|---:|---:|---:|---|---|']
  for row, d in zip(rows, differences):
    interval = ('n/a' if d.low is None else
                f'{d.difference:+.1f} [{d.low:+.1f}, {d.high:+.1f}]')
    lines.append(
        f'| {row["method"]} | {row["target_epsilon"]:g} | '
        f'{row["z_reported"]:.4f} | {row["epsilon_reported"]:.4f} | '
        f'{row["accuracy_reported"]:.4f} ± {row["std_reported"]:.4f} | '
        f'{row["z_rdp"]:.4f} | {row["epsilon_rdp"]:.4f} | '
        f'{row["accuracy_rdp"]:.4f} ± {row["std_rdp"]:.4f} | {interval} | '
        f'{d.verdict} |')
  text = '\n'.join(lines)
  with open(os.path.join(root, 'calibration.md'), 'w') as f:
    f.write(text + '\n')
  print(text)
  print(f'outputs: {root}/calibration.csv, calibration.md')
  return 0


if __name__ == '__main__':
  cli.run(main, interrupted=cli.RESUMES_ITS_RUNS)
