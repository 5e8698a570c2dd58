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
