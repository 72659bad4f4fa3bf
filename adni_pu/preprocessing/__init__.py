"""T1 preprocessing: raw scans -> bias-corrected, skull-stripped, MNI-registered,
cerebellum-removed volumes on the model grid, with masks, transforms, QC and sidecars.

Library first: ``run_preprocessing(inputs, output, config)`` returns the summary table;
``preprocess_scan(scan, output, config)`` does one scan. Heavy libraries (torch, ANTs,
SimpleITK) are imported only when a step runs.
"""

from .config import PreprocessConfig, load_config, settings_hash
from .io import Scan, ScanError, discover_scans, load_scan
from .pipeline import output_paths, preprocess_scan
from .qc import contact_sheet
from .runner import run_preprocessing

__all__ = [
    "PreprocessConfig", "Scan", "ScanError", "contact_sheet", "discover_scans", "load_config",
    "load_scan", "output_paths", "preprocess_scan", "run_preprocessing", "settings_hash",
]
