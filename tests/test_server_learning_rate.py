"""--server_learning_rate's default follows --server_optimizer.

FedAvg's server rate 1.0 suits SGD, whose step is the averaged update. Adam
and LAMB step each coordinate (layer) by about the learning rate whatever
the update's scale, so at 1.0 they diverge; without the flag they run at
their own rate (`tff_clip.names.SERVER_LEARNING_RATES`), and a rate given
explicitly is always the one used.
"""

import csv

import pytest

from scripts import program
from tff_clip.program import config as config_lib
from tff_clip.program import training

ROUNDS = 3


def _train_losses(tmp_path, **changes) -> list:
  """Per-round training losses of a small non-DP digits run in which every
  client takes part in every round (so rounds differ only by the model)."""
  config = training.TrainConfig(
      root_output_dir=str(tmp_path), progress=False, plot=False,
      task='digits', num_clients=20, clients_per_round=20,
      sampling='fixed_size', bounding='none', noise_multiplier=None,
      rounds=ROUNDS, eval_every=ROUNDS, **changes)
  program.run(config)
  with open(f'{config.output_dir}/metrics.csv') as f:
    return [float(row['train_loss']) for row in csv.DictReader(f)]


@pytest.mark.parametrize('optimizer', ['adam', 'lamb'])
def test_an_adaptive_server_optimizer_learns_at_its_default_rate(
    tmp_path, optimizer):
  default = _train_losses(tmp_path / 'default', server_optimizer=optimizer)
  fedavg_rate = _train_losses(tmp_path / 'fedavg', server_optimizer=optimizer,
                              server_learning_rate=1.0)
  assert default[-1] < default[0], default  # It learns,
  assert fedavg_rate[-1] > fedavg_rate[0], fedavg_rate  # where 1.0 diverges.


def test_a_rate_given_explicitly_is_the_one_used_and_names_the_same_run():
  lamb = config_lib.TrainConfig(server_optimizer='lamb')
  assert lamb.server_learning_rate < 1.0
  # The default said explicitly is the same run, as for every other flag.
  explicit = config_lib.TrainConfig(
      server_optimizer='lamb', server_learning_rate=lamb.server_learning_rate)
  assert explicit.experiment_name == lamb.experiment_name
  fedavg_rate = config_lib.TrainConfig(server_optimizer='lamb',
                                       server_learning_rate=1.0)
  assert fedavg_rate.server_learning_rate == 1.0
  assert fedavg_rate.experiment_name != lamb.experiment_name
  # SGD's default is FedAvg's, so the command without flags is unchanged.
  assert config_lib.TrainConfig().server_learning_rate == 1.0
  assert config_lib.TrainConfig(server_learning_rate=1.0).experiment_name == (
      'digits_noise_following_dp_seed0')
