"""What a training run needs beside the model: checkpoints, learning-rate schedules, compilation, scale-out report.

* ``checkpointing``: atomic, verified checkpoints; resume resolution; gridtnp's ``Checkpoint`` callback.
* ``locks``: a lock file that keeps two runs out of one checkpoint directory.
* ``schedules``: warm-up and cosine learning-rate schedules over a step or time budget.
* ``lr_scaling``: the learning rate scaled with the effective batch (linear or square root).
* ``compiling``: ``torch.compile`` with an eager fallback.
* ``throughput``: tasks per second, time waiting for data and GPU utilisation of a run (a callback).
* ``run_scale``: ranks, effective batch, learning rate and epoch length of a run, reported at the start of ``fit``.
"""
