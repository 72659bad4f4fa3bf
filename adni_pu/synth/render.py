"""Render one raw T1 scan (and optionally its brain mask and an amyloid PET volume).

Per scan, in template space: disease and ageing effects change the tissue maps (GM lost to
CSF in the hippocampi and the temporo-parietal cortex, ventricles grown), tissue contrasts
are drawn, and skull, scalp and neck layers are painted around the brain. The template
image is then pulled into a scanner grid through the subject's head size, a smooth
non-linear deformation (the subject's own anatomy, stable across visits) and a head pose
(per visit), stored in one of several voxel orientations; a smooth bias field and Rician
noise finish it.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np

from adni_pu import atlas
from adni_pu.synth.anatomy import Anatomy
from adni_pu.synth.config import SynthConfig
from adni_pu.synth.subjects import Subject, Visit

_AXIS = {"R": (0, 1.0), "L": (0, -1.0), "A": (1, 1.0), "P": (1, -1.0), "S": (2, 1.0),
         "I": (2, -1.0)}


@dataclass
class Rendered:
    """A rendered scan: arrays with their voxel-to-world affines, and what was drawn."""

    t1: np.ndarray
    affine: np.ndarray
    brain_mask: np.ndarray | None
    pet: np.ndarray | None
    pet_affine: np.ndarray | None
    orientation: str
    pose: dict[str, float]


def _gauss_basis(coords: np.ndarray, spacing: float, lo: float, hi: float) -> np.ndarray:
    """Gaussian bumps every ``spacing`` over [lo, hi] evaluated at ``coords`` (N x M).

    Rows are scaled so that a field with N(0, 1) coefficients has unit variance.
    """
    centres = np.arange(lo - spacing, hi + 2 * spacing, spacing, dtype=np.float32)
    basis = np.exp(-0.5 * ((coords[:, None] - centres[None, :]) / (0.6 * spacing)) ** 2)
    basis /= np.sqrt((basis**2).sum(axis=1, keepdims=True)) + 1e-12
    return basis.astype(np.float32)


def separable_field(coef: np.ndarray, bases: list[np.ndarray]) -> np.ndarray:
    """Tensor-product field sum_abc coef[a,b,c] B0[i,a] B1[j,b] B2[k,c] on an (i, j, k) grid."""
    out = np.tensordot(bases[0], coef, axes=(1, 0))  # i, b, c
    out = np.tensordot(out, bases[1], axes=(1, 1))  # i, c, j
    out = np.tensordot(out, bases[2], axes=(1, 1))  # i, j, k
    return out.astype(np.float32)


def smooth_field(rng: np.random.Generator, shape: tuple[int, ...], spacing_vox: float,
                 sd: float) -> np.ndarray:
    """Random smooth field on a grid of ``shape``, correlation length ~``spacing_vox``."""
    bases = [_gauss_basis(np.arange(n, dtype=np.float32), spacing_vox, 0.0, n - 1.0)
             for n in shape]
    coef = rng.standard_normal(tuple(b.shape[1] for b in bases)).astype(np.float32) * sd
    return separable_field(coef, bases)


def _linear_matrix(knots: np.ndarray, n: int) -> np.ndarray:
    """Matrix (n x len(knots)) of linear interpolation from ``knots`` to 0..n-1."""
    x = np.arange(n, dtype=np.float64)
    eye = np.eye(len(knots))
    return np.stack([np.interp(x, knots, eye[j]) for j in range(len(knots))], axis=1
                    ).astype(np.float32)


def orientation_affine(code: str, voxel: float, fov: tuple[float, float, float]
                       ) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Scanner grid stored with voxel axes ``code`` (e.g. PIR), centred on the isocentre."""
    direction = np.zeros((3, 3))
    shape = []
    for col, letter in enumerate(code):
        axis, sign = _AXIS[letter]
        direction[axis, col] = sign
        shape.append(int(round(fov[axis] / voxel)))
    affine = np.eye(4)
    affine[:3, :3] = direction * voxel
    half = (np.asarray(shape) - 1) / 2.0
    affine[:3, 3] = -affine[:3, :3] @ half
    return affine, tuple(shape)  # type: ignore[return-value]


def _rotation(rng: np.random.Generator, max_deg: float) -> tuple[np.ndarray, np.ndarray]:
    angles = np.deg2rad(rng.uniform(-max_deg, max_deg, size=3))
    cx, cy, cz = np.cos(angles)
    sx, sy, sz = np.sin(angles)
    rx = np.array([[1, 0, 0], [0, cx, -sx], [0, sx, cx]])
    ry = np.array([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]])
    rz = np.array([[cz, -sz, 0], [sz, cz, 0], [0, 0, 1]])
    return rz @ ry @ rx, np.rad2deg(angles)


class SubjectAnatomy:
    """What stays fixed for a subject across visits: deformation and skull thickness."""

    def __init__(self, anatomy: Anatomy, subject: Subject, cfg: SynthConfig) -> None:
        rng = np.random.default_rng(subject.seed)
        self.anatomy = anatomy
        aff = anatomy.affine
        lo = aff[:3, 3]
        hi = lo + aff[0, 0] * (np.asarray(anatomy.shape) - 1)
        self.lo, self.hi = lo, hi
        self.spacing = cfg.deformation_spacing_mm
        ncoef = [len(np.arange(lo[a] - self.spacing, hi[a] + 2 * self.spacing, self.spacing))
                 for a in range(3)]
        self.coef = rng.standard_normal((3, *ncoef)).astype(np.float32) * cfg.deformation_mm
        self.thickness = smooth_field(rng, anatomy.shape, 30.0 / anatomy.spacing, 1.2)
        self.gap = float(rng.uniform(1.0, 2.5))
        self.diploe = float(rng.uniform(2.0, 4.0))
        self.fat = float(rng.uniform(3.0, 6.0))
        self.contrast_seed = int(rng.integers(2**31 - 1))

    def displacement(self, points: np.ndarray) -> np.ndarray:
        """Displacement (mm, 3 x N) of template-space points (3 x N, mm)."""
        bases = [_gauss_basis(points[a].astype(np.float32), self.spacing, self.lo[a],
                              self.hi[a]) for a in range(3)]
        out = np.empty_like(points, dtype=np.float32)
        for comp in range(3):
            t = np.einsum("pc,abc->pab", bases[2], self.coef[comp], optimize=True)
            t = np.einsum("pb,pab->pa", bases[1], t, optimize=True)
            out[comp] = np.einsum("pa,pa->p", bases[0], t, optimize=True)
        return out


def template_t1(sub: SubjectAnatomy, visit: Visit, rng: np.random.Generator,
                cfg: SynthConfig) -> np.ndarray:
    """Template-space T1 of ``visit``: atrophied tissues, contrasts, head layers (float32)."""
    a = sub.anatomy
    gm = a.gm.copy()
    wm = a.wm.copy()
    # Hippocampal and cortical grey matter loss (to CSF).
    keep = 1.0 - visit.hippocampal_loss * a.hippocampus
    keep *= 1.0 - visit.cortical_loss * a.ad_cortex * (a.depth < 12.0)
    gm *= keep
    # Ventricles grow by ``ventricle_mm``: tissue within that distance turns to CSF.
    if visit.ventricle_mm > 0:
        grow = np.clip((visit.ventricle_mm - a.ventricle_distance) / a.spacing + 0.5, 0, 1)
        grow *= a.depth > 6.0
        gm *= 1.0 - grow
        wm *= 1.0 - grow
    csf = np.clip(a.brain - gm - wm, 0, 1)

    i_wm = 1.0
    i_gm = rng.uniform(0.55, 0.68)
    i_csf = rng.uniform(0.12, 0.25)
    image = gm * i_gm + wm * i_wm + csf * i_csf
    if not cfg.skull:
        return image.astype(np.float32)

    # Head layers outside the brain hull, thickness varying smoothly over the head.
    d = a.hull_distance - sub.thickness
    edges = np.cumsum([sub.gap, 1.5, sub.diploe, 1.5, 1.5, sub.fat, 1.5])
    values = np.array([i_csf, 0.06, rng.uniform(0.35, 0.6), 0.06, rng.uniform(0.3, 0.45),
                       rng.uniform(0.85, 1.1), rng.uniform(0.35, 0.5), 0.0], dtype=np.float32)
    layers = values[np.searchsorted(edges, d)]
    layers = np.where(a.neck & (layers == 0.0), np.float32(rng.uniform(0.3, 0.45)), layers)
    return (image + (1.0 - a.brain) * layers).astype(np.float32)


def template_coords(sub: SubjectAnatomy, m_lin: np.ndarray, m_off: np.ndarray,
                    shape: tuple[int, int, int], voxel: float) -> np.ndarray:
    """Head-grid voxel coordinates (3 x shape) of each voxel of a target grid.

    ``m_lin``, ``m_off``: the target voxel -> template mm map before the subject's smooth
    deformation, which is evaluated on a coarse sub-grid (every ~16 mm) and upsampled
    linearly (separably), far cheaper than evaluating it at every voxel.
    """
    a = sub.anatomy
    step = max(2, int(round(16.0 / voxel)))
    coarse_axes = [np.linspace(0, n - 1, int(np.ceil((n - 1) / step)) + 1) for n in shape]
    cg = np.stack(np.meshgrid(*coarse_axes, indexing="ij")).reshape(3, -1)
    pts = m_lin @ cg + m_off[:, None]
    disp = sub.displacement(pts).reshape(3, *[len(c) for c in coarse_axes])
    interp = [_linear_matrix(ax, n) for ax, n in zip(coarse_axes, shape)]
    tpl_lo = a.affine[:3, 3]
    idx = [np.arange(n, dtype=np.float32) for n in shape]
    coords = np.empty((3, *shape), dtype=np.float32)
    for c in range(3):
        coords[c] = (m_lin[c, 0] * idx[0][:, None, None] + m_lin[c, 1] * idx[1][None, :, None]
                     + m_lin[c, 2] * idx[2][None, None, :] + (m_off[c] - tpl_lo[c]))
        coords[c] += separable_field(disp[c], interp)
        coords[c] /= a.spacing
    return coords


def render_scan(sub: SubjectAnatomy, subject: Subject, visit: Visit,
                rng: np.random.Generator, cfg: SynthConfig) -> Rendered:
    """Render the raw T1 of one visit (and its brain mask / PET when configured)."""
    from scipy.ndimage import gaussian_filter, map_coordinates

    a = sub.anatomy
    image = template_t1(sub, visit, rng, cfg)

    code = cfg.orientations[int(rng.integers(len(cfg.orientations)))]
    out_affine, shape = orientation_affine(code, cfg.voxel_size, cfg.field_of_view)
    rot, angles = _rotation(rng, cfg.max_rotation_deg)
    shift = rng.uniform(-cfg.max_translation_mm, cfg.max_translation_mm, size=3)
    # scanner = R @ (S @ mni - centre) + shift  =>  mni = S^-1 (R^T (scanner - shift) + centre)
    centre = np.array([0.0, -18.0, 8.0])
    s_inv = np.diag(1.0 / np.asarray(subject.head_scale))
    lin = s_inv @ rot.T
    off = s_inv @ (centre - rot.T @ shift)
    # template mm of each native voxel = M v + m
    m_lin = lin @ out_affine[:3, :3]
    m_off = lin @ out_affine[:3, 3] + off

    coords = template_coords(sub, m_lin, m_off, shape, cfg.voxel_size)

    t1 = map_coordinates(image, coords, order=1, mode="constant", cval=0.0, prefilter=False)
    if cfg.bias_strength > 0:
        bias = smooth_field(rng, shape, 80.0 / cfg.voxel_size, cfg.bias_strength)
        t1 *= np.exp(bias - bias.mean())
    if cfg.noise_level > 0:
        sigma = np.float32(cfg.noise_level)
        n1 = rng.standard_normal(shape, dtype=np.float32) * sigma
        n2 = rng.standard_normal(shape, dtype=np.float32) * sigma
        t1 = np.sqrt((t1 + n1) ** 2 + n2**2)
    gain = rng.uniform(400.0, 1500.0)
    t1 = np.clip(np.round(t1 * gain), 0, 32767).astype(np.int16)

    brain_mask = None
    if cfg.write_brain_masks:
        brain_mask = (map_coordinates(a.brain, coords, order=1, prefilter=False) > 0.5
                      ).astype(np.uint8)

    pet = pet_affine = None
    if cfg.pet and visit.suvr is not None:
        uptake = pet_uptake(a, visit.suvr, cfg)
        uptake *= 1.0 + 0.03 * rng.standard_normal(uptake.shape).astype(np.float32)
        uptake = gaussian_filter(uptake, 1.0)
        if cfg.pet_space == "native":
            pet = map_coordinates(uptake, coords, order=1, prefilter=False).astype(np.float32)
            pet_affine = out_affine
        else:
            pet, pet_affine = uptake.astype(np.float32), a.affine

    pose = {"rot_x": float(angles[0]), "rot_y": float(angles[1]), "rot_z": float(angles[2]),
            "shift_x": float(shift[0]), "shift_y": float(shift[1]), "shift_z": float(shift[2])}
    return Rendered(t1=t1, affine=out_affine, brain_mask=brain_mask, pet=pet,
                    pet_affine=pet_affine, orientation=code, pose=pose)


def pet_uptake(a: Anatomy, suvr: float, cfg: SynthConfig) -> np.ndarray:
    """Template-space uptake-ratio map (cerebellar grey matter = 1) for a cortical SUVR."""
    from scipy.ndimage import gaussian_filter

    cortex = 1.0 + (suvr - 1.0) * a.amyloid_pattern
    gm_value = np.where(a.cerebellum, 1.0, cortex)
    uptake = a.gm * gm_value + a.wm * 1.4 + a.csf * 0.3 + (1.0 - a.brain) * 0.05
    sigma = cfg.pet_fwhm_mm / 2.3548 / a.spacing
    return gaussian_filter(uptake.astype(np.float32), sigma)


@functools.lru_cache(maxsize=1)
def _model_grid_cerebellum() -> np.ndarray:
    """AAL cerebellum (Cerebelum_*, Vermis_*) on the model grid."""
    return atlas.region_mask(atlas.CEREBELLUM_REGIONS)


def render_ideal_preprocessed(sub: SubjectAnatomy, visit: Visit, rng: np.random.Generator,
                              cfg: SynthConfig) -> tuple[np.ndarray, np.ndarray]:
    """What a perfect preprocessing would give: the model grid, skull and cerebellum off.

    Head size and pose are undone (an affine registration's job); the subject's smooth
    non-linear deformation stays, as after an affine registration. White matter is ~1.
    Returns (float32 volume on ``atlas.model_grid_affine()``, its affine).
    """
    from scipy.ndimage import map_coordinates

    affine = atlas.model_grid_affine()
    shape = atlas.MODEL_GRID_SHAPE
    image = template_t1(sub, visit, rng, dataclasses.replace(cfg, skull=False))
    coords = template_coords(sub, affine[:3, :3], affine[:3, 3], shape,
                             atlas.MODEL_GRID_SPACING)
    out = map_coordinates(image, coords, order=1, mode="constant", cval=0.0, prefilter=False)
    out[_model_grid_cerebellum()] = 0.0
    if cfg.noise_level > 0:
        noise = rng.standard_normal(shape, dtype=np.float32) * np.float32(cfg.noise_level / 2)
        out = np.where(out > 0.02, out + noise, 0.0)
    return np.clip(out, 0.0, None).astype(np.float32), affine
