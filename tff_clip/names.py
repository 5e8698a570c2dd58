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
