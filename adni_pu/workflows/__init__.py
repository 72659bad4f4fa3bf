"""The application layer: one library function per ``adni-pu`` verb.

- :mod:`~adni_pu.workflows.train` ``train_volumes``: a cohort manifest -> a run folder
- :mod:`~adni_pu.workflows.evaluate` ``evaluate_run``: a run folder -> metrics with CIs
- :mod:`~adni_pu.workflows.predict` ``predict_scans``: a run folder + scans -> probabilities
- :mod:`~adni_pu.workflows.demo` ``run_demo``: synthetic cohort -> preprocess -> cohort ->
  train -> evaluate -> report
- :mod:`~adni_pu.workflows.benchmark` ``run_benchmark``: the paper's MNIST / CIFAR-10 tables

Each is called by a thin CLI wrapper of the same name in :mod:`adni_pu.cli`; a notebook can
call them directly. Beside them, what several verbs share:

- :mod:`~adni_pu.workflows.volume_settings`: ``VolumeTrainConfig``, the settings of a run on
  volumes, and how they are resolved (``load_volume_config``)
- :mod:`~adni_pu.workflows.run_folder`: a run folder's layout and reading it back
  (``load_run``, ``score_dataset``), used by evaluate, predict and interpret
- :mod:`~adni_pu.workflows.results_format`: the benchmark's results files, written by
  ``benchmark`` and read by :mod:`~adni_pu.workflows.results_table`
  (``adni-pu benchmark table``)
- :mod:`~adni_pu.workflows.compare`: the comparison of methods on a cohort (``adni-pu
  benchmark cohort``): folds, pieces, pooled scores, paired differences, reference lines,
  the report and the fold models' ensemble; the demo runs it
- :mod:`~adni_pu.workflows.demo_policy`: the demo's training budget and what its report
  reads from the comparison

Nothing heavy is imported here.
"""
