"""The application layer: one library function per ``adni-pu`` verb.

- :mod:`~adni_pu.workflows.train` ``train_volumes``: a cohort manifest -> a run folder
- :mod:`~adni_pu.workflows.evaluate` ``evaluate_run``: a run folder -> metrics with CIs
- :mod:`~adni_pu.workflows.predict` ``predict_scans``: a run folder + scans -> probabilities
- :mod:`~adni_pu.workflows.demo` ``run_demo``: synthetic cohort -> preprocess -> cohort ->
  train -> evaluate -> report
- :mod:`~adni_pu.workflows.benchmark` ``run_benchmark``: the paper's MNIST / CIFAR-10 tables

Each is called by a thin CLI wrapper of the same name in :mod:`adni_pu.cli`; a notebook can
call them directly. Nothing heavy is imported here.
"""
