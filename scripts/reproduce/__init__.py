"""Reproduce the five seed papers' checkable claims: `python -m scripts.reproduce`.

One module per paper (`paper000` ... `paper004`), each with
`run(quick, output_dir) -> common.Report`: it runs the claims at the scale
this machine allows through the project's own API (`tasks.get_task`,
`tff_clip.learning.algorithms.build_fedavg`, `tff_clip.aggregation.dp`, `tff_clip.privacy.accounting`,
`tff_clip.program.training.run`), prints tables beside the paper's numbers, saves a
plot where the paper has a figure, and ends with one verdict per claim
(reproduced / partly / not) from a criterion stated in the code.
"""
