//! The settings: which Muon (`variant`), its hyperparameters, and which parameters it trains.

use tessera_plugin_api::{Error, Settings};

/// Which published Muon the update follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// `torch.optim.Muon` (PyTorch 2.13): Newton–Schulz with fused `addmm`s and the norm clamped
    /// at `eps`; the rate adjusted per shape by [`AdjustLr`].
    Torch,
    /// KellerJordan/Muon `muon.py` (as in modded-nanogpt and airbench94_muon): Newton–Schulz with
    /// `eps` added to the norm; the orthogonalized update scaled by `sqrt(max(1, rows/cols))`.
    Keller,
}

/// `torch.optim.Muon`'s `adjust_lr_fn`: the rate of a `(A, B)` matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdjustLr {
    /// `None` / `"original"`: `lr · sqrt(max(1, A/B))` (Keller Jordan's scaling).
    Original,
    /// `"match_rms_adamw"`: `lr · 0.2 · sqrt(max(A, B))` (Moonshot, arXiv 2502.16982), so that
    /// the update's RMS matches AdamW's and AdamW's rate and weight decay carry over.
    MatchRmsAdamw,
}

impl AdjustLr {
    /// The rate for a `rows × cols` matrix (conv filters flattened to `(out, in·kh·kw)`).
    pub fn adjusted(self, lr: f64, rows: i64, cols: i64) -> f64 {
        let ratio = match self {
            AdjustLr::Original => (rows as f64 / cols as f64).max(1.0).sqrt(),
            AdjustLr::MatchRmsAdamw => 0.2 * (rows.max(cols) as f64).sqrt(),
        };
        lr * ratio
    }
}

/// The coefficients `(a, b, c)` of the quintic Newton–Schulz iteration (Keller Jordan 2024).
pub const NS_COEFFICIENTS: [f64; 3] = [3.4445, -4.7750, 2.0315];

/// The method's resolved settings.
#[derive(Clone, Debug, PartialEq)]
pub struct MuonConfig {
    /// Which published update.
    pub variant: Variant,
    /// Base learning rate; the step's rate is `lr × step_info.lr_factor` (the run's schedule).
    pub lr: f64,
    /// Decoupled weight decay: `W ← W·(1 − lr_t·weight_decay)` before the update.
    pub weight_decay: f64,
    /// β in `m ← lerp(m, g, 1 − β)`.
    pub momentum: f64,
    /// Orthogonalize `lerp(g, m, β)` instead of `m`.
    pub nesterov: bool,
    /// Newton–Schulz iterations.
    pub ns_steps: u64,
    /// `(a, b, c)` of each iteration.
    pub ns_coefficients: [f64; 3],
    /// Guards the Frobenius normalization against a zero matrix.
    pub eps: f64,
    /// `torch` only: how the rate scales with the matrix shape.
    pub adjust_lr: AdjustLr,
    /// Glob patterns over parameter names; when given, they replace the default selection.
    pub include: Vec<String>,
    /// Glob patterns over parameter names removed from the selection.
    pub exclude: Vec<String>,
    /// In a data-parallel run, each rank orthogonalizes its share of the matrices and the
    /// results are gathered (plugin-api 1.9 `all_gather`); off: every rank computes every
    /// matrix.
    pub share_across_ranks: bool,
}

impl MuonConfig {
    /// Reads the settings; defaults follow the chosen variant's reference (`torch`: lr 1e-3,
    /// weight decay 0.1; `keller`: lr 0.02, weight decay 0; both momentum 0.95, Nesterov,
    /// 5 Newton–Schulz steps, eps 1e-7). Every error names its key.
    pub fn from_settings(settings: &Settings) -> Result<MuonConfig, Error> {
        let variant = match settings.str("variant")?.as_str() {
            "torch" => Variant::Torch,
            "keller" => Variant::Keller,
            other => {
                return Err(Error::config(format!(
                    "setting `variant` = {other:?}: expected \"torch\" (torch.optim.Muon) or \"keller\" (KellerJordan/Muon)"
                )))
            }
        };
        let (lr_default, wd_default) = match variant {
            Variant::Torch => (1e-3, 0.1),
            Variant::Keller => (0.02, 0.0),
        };
        let lr = settings.f64_or("lr", lr_default)?;
        let weight_decay = settings.f64_or("weight_decay", wd_default)?;
        let momentum = settings.f64("momentum")?;
        let nesterov = settings.bool("nesterov")?;
        let ns_steps = settings.u64("ns_steps")?;
        let ns_coefficients: Vec<f64> =
            settings.get_or("ns_coefficients", NS_COEFFICIENTS.to_vec())?;
        let eps = settings.f64("eps")?;
        let adjust = settings.get_or::<Option<String>>("adjust_lr", None)?;
        let include: Vec<String> = settings.get_or("include", Vec::new())?;
        let exclude: Vec<String> = settings.get_or("exclude", Vec::new())?;
        let share_across_ranks = settings.bool("share_across_ranks")?;

        let finite_at_least_zero = |key: &str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(Error::config(format!(
                    "setting `{key}` must be a finite number ≥ 0, got {v}"
                )))
            }
        };
        finite_at_least_zero("lr", lr)?;
        finite_at_least_zero("weight_decay", weight_decay)?;
        if !(0.0..1.0).contains(&momentum) {
            return Err(Error::config(format!(
                "setting `momentum` must be in [0, 1), got {momentum}"
            )));
        }
        if !(1..100).contains(&ns_steps) {
            return Err(Error::config(format!(
                "setting `ns_steps` must be in 1..=99, got {ns_steps}"
            )));
        }
        let ns_coefficients: [f64; 3] = match ns_coefficients.as_slice() {
            [a, b, c] if [a, b, c].iter().all(|v| v.is_finite()) => [*a, *b, *c],
            other => {
                return Err(Error::config(format!(
                "setting `ns_coefficients` must be three finite numbers [a, b, c], got {other:?}"
            )))
            }
        };
        if !(eps.is_finite() && eps > 0.0) {
            return Err(Error::config(format!(
                "setting `eps` must be a finite number > 0, got {eps}"
            )));
        }
        let adjust_lr = match (variant, adjust.as_deref()) {
            (_, None) | (Variant::Torch, Some("original")) => AdjustLr::Original,
            (Variant::Torch, Some("match_rms_adamw")) => AdjustLr::MatchRmsAdamw,
            (Variant::Torch, Some(other)) => {
                return Err(Error::config(format!(
                    "setting `adjust_lr` = {other:?}: expected \"original\" or \"match_rms_adamw\""
                )))
            }
            (Variant::Keller, Some(_)) => {
                return Err(Error::config(
                    "setting `adjust_lr` applies to `variant = \"torch\"` only: the keller variant scales the update by sqrt(max(1, rows/cols))",
                ))
            }
        };
        for (key, patterns) in [("include", &include), ("exclude", &exclude)] {
            for p in patterns {
                glob::Pattern::new(p)
                    .map_err(|e| Error::config(format!("setting `{key}`: pattern {p:?}: {e}")))?;
            }
        }
        Ok(MuonConfig {
            variant,
            lr,
            weight_decay,
            momentum,
            nesterov,
            ns_steps,
            ns_coefficients,
            eps,
            adjust_lr,
            include,
            exclude,
            share_across_ranks,
        })
    }

    /// The rate a `rows × cols` matrix is stepped with when the step's base rate is `lr`:
    /// `torch` adjusts it by shape, `keller` scales the update instead (see
    /// [`MuonConfig::update_scale`]).
    pub fn matrix_lr(&self, lr: f64, rows: i64, cols: i64) -> f64 {
        match self.variant {
            Variant::Torch => self.adjust_lr.adjusted(lr, rows, cols),
            Variant::Keller => lr,
        }
    }

    /// The keller variant's factor on the orthogonalized update, `sqrt(max(1, rows/cols))`
    /// (applied in bfloat16, as `muon.py` does); `None` for `torch`.
    pub fn update_scale(&self, rows: i64, cols: i64) -> Option<f64> {
        match self.variant {
            Variant::Torch => None,
            Variant::Keller => Some((rows as f64 / cols as f64).max(1.0).sqrt()),
        }
    }
}
