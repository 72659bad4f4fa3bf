"""``adni-pu benchmark cohort``: every method on the same subject-level folds and seeds.

A comparison folder ``OUT`` holds:

- ``comparison.json``: the manifest's content hash and the settings (:mod:`.pieces`); a
  rerun with another manifest or other settings into the same folder is refused;
- ``folds/fold-<k>/manifest.csv``: fold k's manifest (``train``, ``val`` drawn from the
  training part, ``test`` = the held-out fold); ``folds/independent_test.csv`` with a fixed
  test set (:mod:`.folds`);
- ``pieces/<method>/fold-<k>/seed-<s>/``: one piece, an ordinary run folder of
  ``adni-pu train`` (so ``evaluate``, ``interpret`` and ``predict`` work on it) with its
  results file ``piece.json`` (:mod:`.pieces`);
- ``report.md``, ``report.json``, ``roc.png``, ``calibration.png`` and ``records/`` (one
  results file per method, read by ``adni-pu benchmark table``; :mod:`.report`).

The fold models of one method predict together (:mod:`.ensemble`).
"""
