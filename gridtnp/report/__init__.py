"""Reports: a checkpoint evaluated on a split, its figures and the ``gridtnp report`` page.

* ``evaluation``: one evaluation in physical units (``Evaluation``, ``run_split``); ``evaluation_plots`` its figures.
* ``plots``: figures of tasks and maps without pyplot, and the TensorBoard ``PlotCallback``; ``calibration_plots``
  reliability, PIT and standardised errors; ``map_axes`` and ``coastlines`` the map axes and what is drawn on them.
* ``page``: the self-contained HTML page ``gridtnp report`` writes; ``joint_samples`` and ``joint_plots`` its section
  on a joint predictive's samples.

The submodules load matplotlib, so nothing is imported here: import the one you need.
"""
