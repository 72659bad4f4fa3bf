"""What a trained 3-branch CNN looks at: attribution maps on the model grid.

- :mod:`adni_pu.interpret.grid_model`: the network as a function of one model-grid volume
  (the data pipeline's crop, normalisation, resize and hippocampus boxes in differentiable
  torch), so every map lives on the grid of the preprocessed volumes.
- :mod:`adni_pu.interpret.maps`: Grad-CAM, occlusion and SmoothGrad maps (``monai.visualize``).
- :mod:`adni_pu.interpret.stats`: region tables, the hippocampal share with its bootstrap CI
  and the model-randomisation rank correlation (numpy only).
- :mod:`adni_pu.interpret.figures`: the overlay picture on the template.

The workflow behind ``adni-pu interpret`` is :mod:`adni_pu.workflows.interpret`.
"""
