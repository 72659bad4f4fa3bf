"""adni-pu: positive-unlabelled (Self-PU) learning of Alzheimer's classifiers from T1 MRI."""

__version__ = "0.1.0"
