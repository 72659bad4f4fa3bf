"""The hostile-user probes, one module per concern; ``benchmarks.hostile_probes`` runs them.

Each module defines ``PROBES``: a list of ``(finding, probe)`` pairs, where ``probe(p)``
takes a :class:`benchmarks.integrity_probes.Probe` bound to one checkout and a fresh, empty
folder, does what a hostile user did, and returns one line saying what happened.
"""
