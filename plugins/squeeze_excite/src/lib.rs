#![doc = include_str!("../README.md")]

use tessera_plugin_api::kit::{default_init, walk, SurgeryModel};
use tessera_plugin_api::tch::{Kind, Tensor};
use tessera_plugin_api::{
    export_plugin, Context, Error, Event, Hook, Inner, Method, ModuleInfo, Plugin, Settings,
    Wrapper,
};

/// The kind of the wrapper in the module tree.
pub const KIND: &str = "squeeze_excite_conv2d";

/// The hidden width of the gate for a convolution with `out_channels` outputs: `latent` itself
/// when it is at least 1, else that fraction of the channels (truncated), as Composer's
/// `int(latent_channels)` / `int(latent_channels * out_channels)`.
pub fn latent_size(latent: f64, out_channels: i64) -> i64 {
    if latent >= 1.0 {
        latent as i64
    } else {
        (latent * out_channels as f64) as i64
    }
}

/// Composer's `SqueezeExcite2d` on a convolution's output `y` `(N, C, H, W)`:
/// `y · σ(W2 · relu(W1 · mean_hw(y)))`, `w1` `(latent, C)` and `w2` `(C, latent)` without bias.
pub fn squeeze_excite(y: &Tensor, w1: &Tensor, w2: &Tensor) -> Result<Tensor, Error> {
    let pooled = y.f_mean_dim(&[2i64, 3][..], false, None::<Kind>)?;
    let hidden = pooled.f_matmul(&w1.f_tr()?)?.f_relu()?;
    let gate = hidden.f_matmul(&w2.f_tr()?)?.f_sigmoid()?;
    let n = gate.size();
    Ok(y.f_mul(&gate.f_view([n[0], n[1], 1, 1])?)?)
}

/// One convolution the surgery changes: its path, output channels and gate width.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The convolution's path.
    pub path: String,
    /// Its output channels.
    pub out_channels: i64,
    /// The gate's hidden width.
    pub latent: i64,
}

/// The convolutions that get a gate: every `conv2d` with `min(in, out) ≥ min_channels`, not
/// already inside a squeeze-excite wrapper (so a second application changes nothing).
pub fn targets(modules: &[ModuleInfo], latent: f64, min_channels: i64) -> Vec<Target> {
    walk::of_kind(modules, "conv2d")
        .filter(|m| !walk::inside_kind(modules, m.path.as_str(), KIND))
        .filter_map(|m| {
            let (cin, cout) = (
                m.attr("in_channels")? as i64,
                m.attr("out_channels")? as i64,
            );
            (cin.min(cout) >= min_channels).then(|| Target {
                path: m.path.as_str().to_owned(),
                out_channels: cout,
                latent: latent_size(latent, cout),
            })
        })
        .collect()
}

struct SeWrapper {
    w1: Tensor,
    w2: Tensor,
    latent: i64,
}

impl Wrapper for SeWrapper {
    fn kind(&self) -> &str {
        KIND
    }

    fn attrs(&self) -> Vec<(String, f64)> {
        vec![("latent_channels".to_owned(), self.latent as f64)]
    }

    fn forward(&self, x: &Tensor, train: bool, inner: &mut Inner<'_>) -> Result<Tensor, Error> {
        let y = inner.forward(x, train)?;
        squeeze_excite(&y, &self.w1, &self.w2)
    }
}

/// The SqueezeExcite method.
pub struct SqueezeExcite {
    latent: f64,
    min_channels: i64,
}

/// The surgery: every convolution of [`targets`] is wrapped (moved below `<path>.conv`) in a
/// gate whose two weights, `se.pool_and_mlp.2.weight` `(latent, C)` and
/// `se.pool_and_mlp.4.weight` `(C, latent)`, get PyTorch's default `Linear` initialisation
/// drawn from the model's stream, in that order, in the conv weight's dtype and device.
/// Returns the convolutions wrapped; a second application wraps none.
pub fn apply_squeeze_excite(
    model: &mut impl SurgeryModel,
    latent: f64,
    min_channels: i64,
) -> Result<Vec<Target>, Error> {
    let modules = model.modules()?;
    let chosen = targets(&modules, latent, min_channels);
    for t in &chosen {
        let info = walk::find(&modules, &t.path).ok_or("the module tree changed during surgery")?;
        let like = model.tensor_of(info, "weight")?;
        if t.latent < 1 {
            return Err(format!(
                "squeeze_excite: `latent_channels` = {latent} gives a gate of width 0 for `{}` ({} channels)",
                t.path, t.out_channels
            )
            .into());
        }
        let options = (like.kind(), like.device());
        let mut uniform = || model.uniform();
        let w1 = default_init(
            &[t.latent, t.out_channels],
            t.out_channels,
            &mut uniform,
            options,
        )?;
        let w2 = default_init(&[t.out_channels, t.latent], t.latent, &mut uniform, options)?;
        let wrapper = SeWrapper {
            w1: w1.shallow_clone(),
            w2: w2.shallow_clone(),
            latent: t.latent,
        };
        model.wrap_module(
            &t.path,
            wrapper,
            Some("conv"),
            vec![
                ("se.pool_and_mlp.2.weight", w1),
                ("se.pool_and_mlp.4.weight", w2),
            ],
        )?;
    }
    Ok(chosen)
}

impl Method for SqueezeExcite {
    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        let chosen = apply_squeeze_excite(ctx, self.latent, self.min_channels)?;
        ctx.log_metric("squeeze_excite/replaced", chosen.len() as f64);
        Ok(())
    }
}

impl Plugin for SqueezeExcite {
    const NAME: &'static str = "squeeze_excite";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "adds a squeeze-and-excitation channel gate after convolutions with enough channels";
    const DEFAULT_SETTINGS: &'static str = "latent_channels = 64\nmin_channels = 128";

    fn hooks() -> Vec<Hook> {
        vec![Hook::at(Event::INIT)]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let latent = settings.f64("latent_channels")?;
        if !(latent > 0.0 && latent.is_finite()) {
            return Err(Error::config(format!(
                "`latent_channels` must be positive (a width >= 1 or a fraction of the channels), got {latent}"
            )));
        }
        let min_channels = settings.u64("min_channels")? as i64;
        Ok(SqueezeExcite {
            latent,
            min_channels,
        })
    }
}

export_plugin!(SqueezeExcite);
