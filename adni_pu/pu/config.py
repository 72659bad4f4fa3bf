"""Settings of the one PU trainer, and the named presets of the paper's ablation table.

Every method (naive PN, uPU, nnPU, Self-PU and each ablation row) is a configuration of
:class:`TrainConfig`; :data:`TRAINING_PRESETS` maps a row name to the settings that make it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from adni_pu import config as cfgmod
from adni_pu.config import bounded
from adni_pu.errors import ConfigError

Method = Literal["naive", "upu", "nnpu", "selfpu", "vpu"]
Criterion = Literal["pu_risk", "pu_zero_one", "pu_auc", "variational", "pn_accuracy"]
Selection = Literal["best_epoch", "final"]


@dataclass
class SelfPUConfig:
    """Self-PU: self-paced trusted sets, self-calibration, students and teachers.

    Epochs ``[0, warmup_epochs)`` are phase 1 (nnPU warm-up), ``[warmup_epochs,
    self_paced_end)`` phase 2 (self-paced learning with self-calibrated reweighting), and
    from ``self_paced_end`` on phase 3 (self-distillation with students and teachers).
    """

    warmup_epochs: int = bounded(10, ge=0)
    self_paced_end: int = bounded(50, ge=0)
    select_every: int = bounded(10, ge=1)
    # One student per rate; the paper uses two students with paces 20% and 30%.
    rates: tuple[float, ...] = (0.2, 0.3)
    # "linear": the trusted set grows linearly to rate*|U| by the end of phase 2;
    # "fixed": rate*|U| from the first selection (ablation "L_SP fixed size").
    schedule: Literal["linear", "fixed"] = "linear"
    # In-and-out: each selection rebuilds the trusted set from scratch. False keeps earlier
    # members and only adds (ablation "L_SP without replacement").
    replacement: bool = True
    # Target of a trusted example: "hard" 0/1, "soft" the selecting model's probability
    # stored at selection time (the paper), "entropy" the current prediction (published code).
    labels: Literal["hard", "soft", "entropy"] = "soft"
    # Use the positive fraction left in D_U minus the trusted set as the nnPU prior.
    correct_prior: bool = True
    # The nnPU risk on D_U minus the trusted set. "prior": only the prior is corrected
    # (correct_prior). "band": the positives left there are those whose selection-time score
    # lies strictly inside the band between the trusted pseudo-negatives and
    # pseudo-positives; the correction term pi_rest E_P[l(g,-1)] uses only the labelled
    # positives inside the band and pi_rest = pi_u n_u f_band / |U'| (f_band: the fraction of
    # labelled positives inside the band).
    rest_risk: Literal["prior", "band"] = "prior"
    # pi_rest of the band risk. "count": (pi_u |D_U| - #pseudo-positives) / |U'|, the prior
    # correction's estimate (accurate while the trusted set's pseudo-labels are). "validation"
    # / "training": pi_u |D_U| f_band / |U'| with f_band measured on that split's labelled
    # positives (both estimate f_band too small: docs/selfpu.md, "Which pi_rest").
    band_prior: Literal["count", "validation", "training"] = "count"
    # Self-calibrated loss reweighting (learning to reweight with one virtual step).
    reweight: bool = True
    reweight_in_phase3: bool = False
    meta_step_size: float = bounded(1e-3, gt=0)
    meta_ce_cap: float = bounded(1.0 / 16, gt=0)
    # How the meta step's weights enter the nnPU risk. "shrink": per-example weights that
    # sum to one (the nnPU weight shrinks where the entropy weight grows). "mean-one": tiny
    # hypergradients fall back to pure nnPU, the nnPU weights are rescaled to mean one over
    # the batch's rest-U rows, and Kiryo's non-negativity test reads the unweighted R_n.
    reweight_risk: Literal["shrink", "mean-one"] = "shrink"
    # Validation objective of the meta step: the PU risk on the PU validation split, or
    # cross entropy on labelled validation examples (needs TrainConfig.pn_validation).
    meta_objective: Literal["pu_risk", "pn_ce"] = "pu_risk"
    # BatchNorm in the meta step's forward pass on the validation batch (half labelled
    # positives, so about 3/4 positive on MNIST). "batch": training mode, normalised by that
    # batch's own statistics, unlike any training batch; "running": evaluation mode, the
    # student's running statistics, as the model is scored at selection.
    meta_bn: Literal["batch", "running"] = "batch"
    # The published code flips the sign of the entropy term between the virtual and the
    # real loss; True reproduces that defect (for comparison only).
    meta_sign_flip: bool = False
    # How the meta step's hypergradient is computed. At w = 0 the virtual step does not move
    # the parameters, so u_i = (step / n) * grad(validation objective) . grad(term_i): one
    # backward pass of the validation objective and one forward-mode pass (a JVP) of the
    # training batch's terms ("jvp") give the same numbers as differentiating through the
    # virtual step ("double-backward", a second-order backward pass).
    hypergradient: Literal["double-backward", "jvp"] = "double-backward"
    # Student consistency in phase 3.
    student_consistency: Literal["none", "per_example", "per_batch"] = "per_example"
    alpha: float = bounded(10.0, ge=0)
    batch_gate: float = bounded(0.1, ge=0)
    student_weight: float = bounded(1.0, ge=0)
    # Mean teachers in phase 3.
    teachers: bool = True
    teacher_average: Literal["ema", "uniform"] = "ema"
    ema_decay: float = bounded(0.999, ge=0, lt=1)
    # A teacher's BatchNorm running statistics: "average" them like the weights, or
    # "recompute" them from the training inputs after every epoch (as stochastic weight
    # averaging does); the averaged weights alone do not match the averaged statistics.
    teacher_bn: Literal["average", "recompute"] = "average"
    teacher_weight: float = bounded(0.3, ge=0)
    teacher_rampup_epochs: int = bounded(30, ge=0)
    # The models that compete for selection once teachers exist: the better teacher (or
    # student, without teachers) by the validation criterion, or only the average of the two
    # teachers' probabilities.
    final_model: Literal["best", "average"] = "best"

    def __post_init__(self) -> None:
        cfgmod.check_ranges(self)
        if not 0 <= self.warmup_epochs <= self.self_paced_end:
            raise ConfigError(
                f"warmup_epochs={self.warmup_epochs} and self_paced_end={self.self_paced_end}: "
                "expected 0 <= warmup_epochs <= self_paced_end"
            )
        if not self.rates or any(not 0.0 <= r <= 1.0 for r in self.rates):
            raise ConfigError(f"rates={self.rates}: expected one or more numbers in [0, 1]")
        if len(self.rates) > 2:
            raise ConfigError(f"rates={self.rates}: at most two students")
        if self.rest_risk == "band" and not self.replacement:
            # kept members are scored by the current model: the band no longer brackets D_U
            raise ConfigError("rest_risk='band' with replacement=false: the band between the "
                              "trusted pseudo-negatives and pseudo-positives needs every member "
                              "chosen by the same scores; expected replacement=true")


@dataclass
class VPUConfig:
    """VPU (Chen et al., NeurIPS 2020): the variational PU loss, which needs no class prior,
    and its MixUp regulariser; defaults are the paper's (alpha 0.3, weight 0.03)."""

    # MixUp of every example of the training distribution with a labelled positive of the
    # same batch, lambda ~ Beta(mix_alpha, mix_alpha), one lambda per batch.
    mixup: bool = True
    mix_alpha: float = bounded(0.3, gt=0)
    # Weight of the MixUp regulariser (the paper's lambda).
    mix_weight: float = bounded(0.03, ge=0)
    # Decide positive where phi(x) / max phi over the training distribution > 1/2 (the
    # paper's normalisation), folded into the selected model's output bias after training;
    # False: phi(x) > 1/2.
    normalise: bool = True

    def __post_init__(self) -> None:
        cfgmod.check_ranges(self)


@dataclass
class TrainConfig:
    """Everything one training run needs besides the data."""

    method: Method = "nnpu"
    model: str = "mlp6"
    model_args: dict[str, Any] = field(default_factory=dict)
    epochs: int = bounded(200, ge=1)
    batch_size: int = bounded(256, ge=2)
    lr: float = bounded(1e-3, gt=0)
    weight_decay: float = bounded(0.0, ge=0)
    # Adam's (beta1, beta2); VPU's paper uses (0.5, 0.99).
    adam_betas: tuple[float, float] = (0.9, 0.999)
    # The learning rate over epochs: "cosine" annealing to 0 at the last epoch, or "step":
    # multiplied by lr_step_factor every lr_step_epochs epochs (VPU's paper: halved every 20).
    lr_schedule: Literal["cosine", "step"] = "cosine"
    lr_step_epochs: int = bounded(20, ge=1)
    lr_step_factor: float = bounded(0.5, gt=0, le=1)
    # Class prior used by the risks; None: the data's (PUData.prior).
    prior: float | None = bounded(None, gt=0, lt=1)
    # nnPU step rule (Kiryo et al. 2017: 0 <= beta, 0 <= gamma <= 1).
    beta: float = bounded(0.0, ge=0)
    gamma: float = bounded(1.0, ge=0, le=1)
    # Model selection on the validation split (never on test).
    val_criterion: Criterion = "pu_risk"
    # Labelled-positive oversampling: with s in (0, 1) every batch holds round(s*batch_size)
    # labelled positives (drawn from successive random permutations of D_P) and the rest
    # unlabelled; an epoch is one pass over D_U. 0: P and U spread evenly over the batches
    # in the data's ratio. The risks are unchanged (means over the P rows and the U rows).
    positive_share: float = bounded(0.0, ge=0, lt=1)
    # Which model the run keeps: "best_epoch" the best validation score over every epoch and
    # candidate; "final" the best of the finalists after the last epoch only (the teachers and
    # their average, or the students and their average, or the one model). docs/selfpu.md.
    selection: Selection = "best_epoch"
    # Use true labels of the validation split (a labelled PN validation set, as the paper's
    # meta step assumes). Results made with it must say so.
    pn_validation: bool = False
    seed: int = bounded(0, ge=0)
    deterministic: bool = True
    device: str = "auto"
    num_workers: int = bounded(0, ge=0)
    threads: int = bounded(0, ge=0)
    eval_batch_size: int = bounded(1024, ge=1)
    # Evaluate the test split every epoch for the "test-selected" diagnostic only.
    track_test: bool = False
    # Write every epoch's validation logits of every model to ``val_logits/`` in the run
    # folder, for studies of the selection rule (benchmarks/selection_rules.py, in git at
    # d825906).
    record_val_logits: bool = False
    # Random augmentation of tensor images (CIFAR-10) on the training device, per batch:
    # "crop-flip" pads by crop_padding (with zeros, the channel mean after standardising),
    # crops back at a random offset and mirrors left-right with probability 1/2.
    augment: Literal["none", "crop-flip"] = "none"
    crop_padding: int = bounded(4, ge=0)
    # Speed: bfloat16 autocast for every forward pass (losses stay float32), channels-last
    # memory layout for convolutional models, torch.compile of the training forward.
    amp: bool = False
    channels_last: bool = False
    compile: bool = False
    # Checkpoint size: "float32" resumes exactly; "bfloat16" stores weights, teachers and
    # optimiser moments at half size (for runs carried between machines in pieces; a resume
    # then continues from rounded values, so it is not bit-identical to an uninterrupted run).
    checkpoint_precision: Literal["float32", "bfloat16"] = "float32"
    # Write checkpoints/last.pt after every N-th epoch, after the last one and when a time
    # limit stops the fit between epochs (per-epoch cost on fast devices). A run killed
    # in between resumes from the last checkpoint and repeats at most N - 1 epochs (with
    # the same result: each epoch's random streams come from the seed and its number).
    checkpoint_every: int = bounded(1, ge=1)
    progress: bool = True
    selfpu: SelfPUConfig = field(default_factory=SelfPUConfig)
    vpu: VPUConfig = field(default_factory=VPUConfig)

    def __post_init__(self) -> None:
        cfgmod.check_ranges(self)
        if len(self.adam_betas) != 2 or not all(0 <= b < 1 for b in self.adam_betas):
            raise ConfigError(f"adam_betas={self.adam_betas}: expected two numbers in [0, 1)")
        if self.val_criterion == "pn_accuracy" and not self.pn_validation:
            raise ConfigError("val_criterion='pn_accuracy' needs pn_validation=true")
        n_pos = round(self.positive_share * self.batch_size)
        if self.positive_share > 0.0 and not 1 <= n_pos < self.batch_size:
            raise ConfigError(
                f"positive_share={self.positive_share} with batch_size={self.batch_size}: "
                "expected at least one labelled positive and one unlabelled example per batch")
        if self.selfpu.meta_objective == "pn_ce" and not self.pn_validation:
            raise ConfigError("selfpu.meta_objective='pn_ce' needs pn_validation=true")


def _sp(**kw: Any) -> dict[str, Any]:
    return {"method": "selfpu", "selfpu": kw}


_NO_DISTILL = {"student_consistency": "none", "teachers": False}
_ONE = {"rates": [0.3], **_NO_DISTILL}

# The rows of Table 1 of the paper, plus the baselines and the published-code variant.
TRAINING_PRESETS: dict[str, dict[str, Any]] = {
    "naive": {"method": "naive"},
    "upu": {"method": "upu"},
    "nnpu": {"method": "nnpu"},
    # prior-free: chosen by the validation variational loss, as in the paper
    "vpu": {"method": "vpu", "val_criterion": "variational"},
    # and with the paper's optimiser (Adam at 3e-5, betas (0.5, 0.99), halved every 20 epochs)
    "vpu-paper-optimiser": {"method": "vpu", "val_criterion": "variational", "lr": 3e-5,
                            "adam_betas": [0.5, 0.99], "lr_schedule": "step",
                            "lr_step_epochs": 20, "lr_step_factor": 0.5},
    "sp-fixed": _sp(labels="hard", schedule="fixed", reweight=False, **_ONE),
    "sp-no-replacement": _sp(labels="hard", replacement=False, reweight=False, **_ONE),
    "sp": _sp(labels="hard", reweight=False, **_ONE),
    "sps": _sp(labels="soft", reweight=False, **_ONE),
    "sp-reweight": _sp(labels="hard", reweight=True, **_ONE),
    "sps-reweight": _sp(labels="soft", reweight=True, **_ONE),
    "students": _sp(labels="soft", reweight=True, teachers=False),
    "teachers": _sp(labels="soft", reweight=True, student_consistency="none"),
    "selfpu": _sp(),
    "selfpu-swa": _sp(teacher_average="uniform", teacher_bn="recompute"),
    "published-code": _sp(labels="entropy", student_consistency="per_batch",
                          teacher_average="uniform", meta_sign_flip=True),
    # Full Self-PU (or nnPU) with one risk setting changed each.
    "selfpu-band": _sp(rest_risk="band"),
    "selfpu-mean-one": _sp(reweight_risk="mean-one"),
    "selfpu-positive-share": {**_sp(), "positive_share": 0.125},
    "selfpu-meta-running": _sp(meta_bn="running"),
    "nnpu-positive-share": {"method": "nnpu", "positive_share": 0.125},
}

PRESET_DESCRIPTIONS: dict[str, str] = {
    "naive": "naive PN: unlabelled treated as negative",
    "upu": "uPU: unbiased PU risk",
    "nnpu": "nnPU: non-negative PU risk (Kiryo et al. 2017)",
    "vpu": "VPU: variational PU loss with MixUp, no class prior (Chen et al. 2020)",
    "vpu-paper-optimiser": "VPU with its paper's optimiser: Adam at 3e-5, betas (0.5, 0.99), "
                           "the rate halved every 20 epochs",
    "sp-fixed": "L_SP, fixed size: trusted set of full size from the first selection",
    "sp-no-replacement": "L_SP without replacement: selected examples never leave",
    "sp": "L_SP: self-paced trusted set, hard labels, in-and-out",
    "sps": "L_SPS: self-paced trusted set with soft labels",
    "sp-reweight": "L_SP + self-calibrated reweighting",
    "sps-reweight": "L_SPS + self-calibrated reweighting",
    "students": "L_SPS + reweighting + two students (no teachers)",
    "teachers": "L_SPS + reweighting + two students with mean teachers (no student consistency)",
    "selfpu": "full Self-PU: two students, two mean teachers, per-example hard mining",
    "selfpu-swa": "full Self-PU with teachers as phase-long uniform averages of the students "
                  "whose BatchNorm statistics are recomputed on the training data (SWA)",
    "published-code": "Self-PU as the published code runs it (entropy targets, batch gate, "
                      "uniform teacher average, flipped entropy sign in the meta step)",
    "selfpu-band": "Self-PU whose nnPU correction on D_U minus the trusted set uses only the "
                   "labelled positives inside the trusted set's score band (rest_risk=band)",
    "selfpu-mean-one": "Self-PU whose self-calibration keeps R_n unbiased: nnPU weights of mean "
                       "one, non-negativity decided on the unweighted R_n "
                       "(reweight_risk=mean-one)",
    "selfpu-positive-share": "Self-PU with 1/8 of every batch labelled positives "
                             "(positive_share=0.125)",
    "selfpu-meta-running": "Self-PU whose meta step scores the validation batch with the "
                           "students' running BatchNorm statistics (meta_bn=running)",
    "nnpu-positive-share": "nnPU with 1/8 of every batch labelled positives "
                           "(positive_share=0.125)",
}


def preset_settings(name: str) -> dict[str, Any]:
    """The settings (as a nested dict) of preset ``name``."""
    return cfgmod.preset_table(TRAINING_PRESETS, name)


# The benchmark protocol: what ``adni-pu benchmark`` sets beside the training preset
# (``adni_pu.workflows.benchmark.resolve_config`` applies these by name; docs/selfpu.md,
# "Benchmark protocol"). Each is a default: a settings file or ``--set`` overrides it.
PROTOCOL_PRESETS: dict[str, dict[str, Any]] = {
    # every benchmark evaluates the test split each epoch for the test-selected diagnostic;
    # the 6-layer MLP trains without weight decay
    "mnist-protocol": {"track_test": True, "weight_decay": 0.0},
    # the published code's CIFAR-10 optimiser settings
    "cifar10-protocol": {"track_test": True, "lr": 5e-4, "weight_decay": 5e-3},
    # Self-PU rows (every preset with method = "selfpu") keep the finalist the validation
    # split prefers after the last epoch; the baselines keep their best validation epoch
    "selfpu-final-model": {"selection": "final"},
}

PROTOCOL_DESCRIPTIONS: dict[str, str] = {
    "mnist-protocol": "every MNIST benchmark row",
    "cifar10-protocol": "every CIFAR-10 benchmark row",
    "selfpu-final-model": "benchmark rows whose training preset is Self-PU (method = selfpu)",
}


def protocol_settings(name: str) -> dict[str, Any]:
    """The settings (as a nested dict) of benchmark protocol preset ``name``."""
    return cfgmod.preset_table(PROTOCOL_PRESETS, name)
