"""The PU engine: losses, trusted-set selection, self-calibration, teachers and the trainer."""
