"""The QC calibration, one module per concern; ``benchmarks.qc_calibration`` runs it.

- :mod:`.cases`: the good and broken copies made of a real head;
- :mod:`.heads`: the real heads that package wheels ship;
- :mod:`.measure`: the pipeline run on a case, its metrics and its truth;
- :mod:`.records`: every case of a head measured and judged;
- :mod:`.verdicts`: failed checks, margins, labels by displacement;
- :mod:`.synthetic`: the false refusals on the demo's synthetic scans;
- :mod:`.report`: the Markdown tables.
"""
