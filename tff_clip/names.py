"""The project's vocabulary: every name list defined once, imported everywhere.

No imports, so the command line can check its flags before TensorFlow loads.
"""

# Boundings and noise mechanisms are named by their classes, listed in
# their registries (`tff_clip.aggregation.mechanisms`): one class and one line there.

# Per-layer budget splits (`tff_clip.aggregation.bounding.layer_budgets`).
SPLITS = ('uniform', 'dim')
# Where DP noise is added, and what the noisy sum is divided by (`tff_clip.aggregation.dp`).
NOISE_PLACEMENTS = ('central', 'client')
DENOMINATORS = ('expected', 'actual')
# Client sampling, as run (`tff_clip.privacy.sampling`) and accounted
# (`tff_clip.privacy.accounting`): Poisson (add/remove-one adjacency) or fixed-size
# without replacement (replace-one adjacency).
POISSON = 'poisson'
FIXED_SIZE = 'fixed_size'
# Participation with minimum separation (`tff_clip.privacy.sampling`): round t takes
# group t mod b of b seeded groups; accounted without amplification.
MIN_SEPARATION = 'min_separation'
SAMPLINGS = (POISSON, FIXED_SIZE, MIN_SEPARATION)
# Privacy accountants.
RDP = 'rdp'
PLD = 'pld'
ACCOUNTANTS = (RDP, PLD)

# A DP run's per-round epsilon column (metrics.csv, TensorBoard's tag,
# releases.jsonl's rows): named by its accountant and delta, and NOT_PRIVATE
# when the noise is seeded (predictable), e.g. 'epsilon_pld_delta_1e-06'. A
# run without DP releases 'epsilon' (infinite).
EPSILON = 'epsilon'


def epsilon_key(accountant: str, delta: float, private: bool = True) -> str:
  label = '' if private else 'NOT_PRIVATE_'
  return f'{EPSILON}_{label}{accountant}_delta_{delta:g}'


def is_epsilon_key(key: str) -> bool:
  return key == EPSILON or (key.startswith(EPSILON + '_') and
                            '_delta_' in key)

# Training choices (`tff_clip.program.config.TrainConfig`'s flags).
CLIENT_OPTIMIZERS = ('sgd', 'sgdm', 'adam')
# Server optimizers, each with its learning rate where --server_learning_rate
# is not given. SGD and LARS: FedAvg's 1.0 (Pelikan et al. 2025 tuned LARS at
# 0.3-3.4, App. G Tables 8-9). Adam and LAMB step each coordinate (layer) by
# about eta whatever the update's scale, and diverge at 1.0: 0.01 (Pelikan et
# al. tuned them at 0.0005-0.009). Measured in docs/training.md.
SERVER_LEARNING_RATES = {'sgd': 1.0, 'sgdm': 1.0, 'adam': 0.01, 'lamb': 0.01,
                         'lars': 1.0}
SERVER_OPTIMIZERS = tuple(SERVER_LEARNING_RATES)
SERVER_STEPS = ('auto', 'damped', 'held', 'fixed')
EXECUTORS = ('inprocess', 'local', 'gpu', 'remote')
# --client_execution: the batched path (`tff_clip.runtime.batched_clients`)
# where the model allows it, or either path forced.
CLIENT_EXECUTIONS = ('auto', 'batched', 'per_client')
DATA_SOURCES = ('offline', 'online', 'synthetic')
EVAL_SPLITS = ('test', 'validation')
