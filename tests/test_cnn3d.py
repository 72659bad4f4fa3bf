"""The 3-branch 3D CNN: output shapes per preset, validation, and that it can learn."""

from __future__ import annotations

import pytest
import torch

from adni_pu.models.cnn3d import CNN3D_PRESETS, ThreeBranchCNN3D, build_cnn3d


def _batch(n: int, brain: int, hipp: int) -> dict[str, torch.Tensor]:
    return {"brain": torch.randn(n, 1, brain, brain, brain),
            "hipp_l": torch.randn(n, 1, hipp, hipp, hipp),
            "hipp_r": torch.randn(n, 1, hipp, hipp, hipp)}


def test_paper_preset_matches_the_paper():
    model = build_cnn3d("paper")
    convs = [m for m in model.branches["brain"].modules() if isinstance(m, torch.nn.Conv3d)]
    assert [c.out_channels for c in convs] == [16, 32]
    assert all(c.kernel_size == (3, 3, 3) for c in convs)
    pools = [m for m in model.branches["brain"].modules() if isinstance(m, torch.nn.MaxPool3d)]
    assert [(p.kernel_size, p.stride) for p in pools] == [(3, 2), (3, 2)]
    # separate weights per branch
    w = [model.branches[k].blocks[0].weight for k in ("brain", "hipp_l", "hipp_r")]
    assert w[0].data_ptr() != w[1].data_ptr() != w[2].data_ptr()
    # 50^3 -> 10^3 x 32 and 30^3 -> 5^3 x 32 per hippocampus
    assert model.n_features == 32 * 10**3 + 2 * 32 * 5**3
    linear = [m for m in model.classifier if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linear] == [(40000, 256), (256, 1)]


@pytest.mark.parametrize("preset", sorted(CNN3D_PRESETS))
def test_output_shape_per_preset(preset):
    model = build_cnn3d(preset).eval()
    with torch.no_grad():
        out = model(_batch(2, 50, 30))
    assert out.shape == (2,)
    assert torch.isfinite(out).all()


def test_tuple_input_and_overrides():
    model = build_cnn3d("paper", brain_size=24, hipp_size=16, hidden=32).eval()
    b = _batch(3, 24, 16)
    with torch.no_grad():
        assert torch.equal(model(b), model((b["brain"], b["hipp_l"], b["hipp_r"])))


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="preset"):
        build_cnn3d("huge")
    with pytest.raises(ValueError, match="too small"):
        ThreeBranchCNN3D(brain_size=50, hipp_size=8)
    with pytest.raises(KeyError, match="hipp_r"):
        build_cnn3d(brain_size=24, hipp_size=16)({"brain": torch.zeros(1), "hipp_l": 0})


@pytest.mark.parametrize("global_pool", [False, True])
def test_a_few_steps_lower_the_loss(global_pool):
    """Tiny volumes whose label is the brightness of the left hippocampus box."""
    torch.manual_seed(0)
    model = build_cnn3d("paper", brain_size=16, hipp_size=14, hidden=32,
                        global_pool=global_pool)
    x = _batch(8, 16, 14)
    y = (torch.arange(8) % 2).float()
    x["hipp_l"] = x["hipp_l"] + y.view(-1, 1, 1, 1, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    model.train()
    losses = []
    for _ in range(6):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0]


def test_global_pool_keeps_one_mean_per_channel():
    """``global_pool``: each branch gives its last block's channel means (few FC inputs),
    so the FC layer's size no longer grows with the input size."""
    model = build_cnn3d("paper", channels=(4, 8), hidden=16, global_pool=True).eval()
    assert model.n_features == 3 * 8
    linear = [m for m in model.classifier if isinstance(m, torch.nn.Linear)]
    assert (linear[0].in_features, linear[0].out_features) == (24, 16)
    b = _batch(2, 50, 30)
    with torch.no_grad():
        out = model(b)
        feats = model.branches["hipp_l"](b["hipp_l"])
        blocks = model.branches["hipp_l"].blocks[:-1](b["hipp_l"])
    assert out.shape == (2,)
    assert torch.allclose(feats, blocks.mean(dim=(2, 3, 4)))
    small = build_cnn3d("paper", channels=(4, 8), hidden=16, global_pool=True,
                        brain_size=24, hipp_size=16)
    assert small.n_features == model.n_features


def test_roi_pool_averages_inside_the_label_only():
    """``roi_pool``: a hippocampus branch's features are the means of its feature maps
    inside the label channel, so the image outside the label (where the label, resampled
    to the feature grid, is zero) changes nothing and the image inside it does."""
    torch.manual_seed(0)
    model = build_cnn3d("paper", channels=(4,), hidden=8, brain_size=20, hipp_size=20,
                        global_pool=True, roi_pool=True).eval()
    batch = _batch(2, 20, 20)
    label = torch.zeros(2, 1, 20, 20, 20)
    label[:, :, 2:8, 2:8, 2:8] = 1.0
    for key in ("hipp_l", "hipp_r"):
        batch[key] = torch.cat([batch[key], label], dim=1)
    with torch.no_grad():
        before = model._branch("hipp_l", batch["hipp_l"])
        far = batch["hipp_l"].clone()
        far[:, 0, 12:, 12:, 12:] += 5.0
        assert torch.equal(model._branch("hipp_l", far), before)
        near = batch["hipp_l"].clone()
        near[:, 0, 3:7, 3:7, 3:7] += 5.0
        assert not torch.allclose(model._branch("hipp_l", near), before)
        assert before.shape == (2, 4) and model(batch).shape == (2,)
        with pytest.raises(ValueError, match="hipp_mask"):
            model({**batch, "hipp_r": batch["hipp_r"][:, :1]})
    with pytest.raises(ValueError, match="global_pool"):
        build_cnn3d("paper", roi_pool=True)


def test_brain_roi_adds_the_mean_inside_the_box_to_the_whole_brain_mean():
    torch.manual_seed(0)
    model = build_cnn3d("paper", channels=(4,), hidden=8, brain_size=20, hipp_size=20,
                        global_pool=True, brain_roi=True).eval()
    assert model.n_features == 3 * 4 + 4
    batch = _batch(2, 20, 20)
    box = torch.zeros(2, 1, 20, 20, 20)
    box[:, :, 6:14, 6:14, 6:14] = 1.0
    batch["brain"] = torch.cat([batch["brain"], box], dim=1)
    with torch.no_grad():
        feats = model._branch("brain", batch["brain"])
        maps = model.branches["brain"].blocks(batch["brain"][:, :1])
        assert torch.allclose(feats[:, :4], maps.mean(dim=(2, 3, 4)))
        assert not torch.allclose(feats[:, 4:], feats[:, :4])
        assert model(batch).shape == (2,)
        with pytest.raises(ValueError, match="ventricle_mask"):
            model({**batch, "brain": batch["brain"][:, :1]})
