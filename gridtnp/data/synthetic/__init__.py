"""Synthetic meta-learning tasks, drawn on the fly; importing this package registers them (``task`` kind).

* ``gp``: GP tasks ``gp1d``, ``gp2d``, ``gp2d_multimodal``; ``gp_kernels``: their kernels, exact GP predictives and
  SKI sampling.
* ``gp1d_multimodal``: the thesis's 1-D two-modality GP (on- and off-grid outputs, correlation c).
* ``sawtooth``: sawtooth tasks in 1-D and 2-D.

``gridtnp.data.tasks`` says what a task is; ``gridtnp.data.SyntheticDataModule`` serves any of them.
"""

from gridtnp.data.synthetic import gp, gp1d_multimodal, sawtooth  # noqa: F401  (importing registers the tasks)
