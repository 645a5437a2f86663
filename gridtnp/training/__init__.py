"""What a training run needs beside the model: checkpoints, learning-rate schedules, compilation, scale-out report.

* ``checkpointing``: atomic, verified checkpoints; resume resolution; gridtnp's ``Checkpoint`` callback.
* ``locks``: a lock file that keeps two runs out of one checkpoint directory.
* ``schedules``: warm-up and cosine learning-rate schedules over a step or time budget.
* ``compiling``: ``torch.compile`` with an eager fallback.
* ``throughput``: tasks per second, time waiting for data and GPU utilisation of a run (a callback).
* ``run_scale``: ranks, effective batch size and learning rate of a run, reported once at the start of ``fit``.
"""
