#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

use tessera_plugin_api::abi::ParamInfo;
use tessera_plugin_api::tch::{self, TchError, Tensor};
use tessera_plugin_api::{export_plugin, Context, Error, Event, Hook, Method, Plugin, Settings};

/// airbench's partial identity init of one convolution weight `(out, in, kh, kw)`:
/// `torch.nn.init.dirac_(w[:in])`. The first `min(out, in)` filters become identities (1 at
/// the kernel's centre `(kh / 2, kw / 2)` of their own input channel, 0 elsewhere); the other
/// filters keep their values. In place, without recording a gradient.
pub fn dirac_rows(weight: &Tensor) -> Result<(), TchError> {
    let size = weight.size();
    let [out, cin, kh, kw] = size[..] else {
        return Err(TchError::Shape(format!(
            "dirac init needs a 4-dimensional convolution weight, got shape {size:?}"
        )));
    };
    let rows = out.min(cin);
    tch::no_grad(|| -> Result<(), TchError> {
        let mut head = weight.f_narrow(0, 0, rows)?;
        let _ = head.f_zero_()?;
        for d in 0..rows {
            let _ = head
                .f_get(d)?
                .f_get(d)?
                .f_get(kh / 2)?
                .f_get(kw / 2)?
                .f_fill_(1.0)?;
        }
        Ok(())
    })
}

/// The convolution weights the method initialises among `params`: the named ones when
/// `names` is given (each must be a 4-dimensional parameter), else every 4-dimensional
/// parameter whose name ends in `weight` with a `kernel_size` × `kernel_size` kernel.
pub fn select(
    params: &[ParamInfo],
    names: Option<&[String]>,
    kernel_size: i64,
) -> Result<Vec<String>, Error> {
    let is_conv = |p: &ParamInfo| !p.buffer && p.shape.len() == 4;
    match names {
        Some(names) => names
            .iter()
            .map(
                |name| match params.iter().find(|p| p.name.as_str() == name) {
                    Some(p) if is_conv(p) => Ok(name.clone()),
                    Some(p) => Err(Error::config(format!(
                        "setting `params`: `{name}` has shape {:?}, not a convolution weight \
                     (out, in, kh, kw)",
                        p.shape.as_slice()
                    ))),
                    None => Err(Error::config(format!(
                        "setting `params`: the model has no parameter `{name}`"
                    ))),
                },
            )
            .collect(),
        None => Ok(params
            .iter()
            .filter(|p| is_conv(p) && p.name.as_str().ends_with("weight"))
            .filter(|p| p.shape[2] == kernel_size && p.shape[3] == kernel_size)
            .map(|p| p.name.to_string())
            .collect()),
    }
}

/// The dirac_init method: at `init`, [`dirac_rows`] on the selected convolution weights.
#[derive(Debug, Clone, PartialEq)]
pub struct DiracInit {
    /// The parameters to initialise; `None`: every `kernel_size` × `kernel_size` conv weight.
    pub params: Option<Vec<String>>,
    /// The kernel size of the convolutions chosen when `params` is not given.
    pub kernel_size: i64,
}

impl DiracInit {
    fn init(&self, ctx: &mut Context<'_>) -> Result<(), Error> {
        let names = select(&ctx.parameters()?, self.params.as_deref(), self.kernel_size)?;
        if names.is_empty() {
            return Err(Error::config(format!(
                "the model has no {k}x{k} convolution weight to initialise (set `kernel_size` \
                 or `params`)",
                k = self.kernel_size
            )));
        }
        for name in &names {
            let weight = ctx
                .parameter(name)?
                .ok_or_else(|| format!("the model has no parameter `{name}`"))?;
            dirac_rows(&weight).map_err(|e| format!("`{name}`: {e}"))?;
        }
        ctx.info(&format!(
            "dirac_init: identity-initialised {} convolution(s): {}",
            names.len(),
            names.join(", ")
        ));
        Ok(())
    }
}

impl Method for DiracInit {
    fn on_event(&mut self, event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        if event == Event::INIT {
            self.init(ctx)?;
        }
        Ok(())
    }
}

impl Plugin for DiracInit {
    const NAME: &'static str = "dirac_init";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "identity (Dirac) init of the first min(out, in) filters of every 3x3 convolution (airbench)";
    const DEFAULT_SETTINGS: &'static str = "kernel_size = 3";

    fn hooks() -> Vec<Hook> {
        vec![Hook::at(Event::INIT)]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let kernel_size = settings.u64("kernel_size")?;
        if kernel_size == 0 {
            return Err(Error::config("setting `kernel_size` must be at least 1"));
        }
        let params: Option<Vec<String>> = settings.get_or("params", None)?;
        if params.as_ref().is_some_and(Vec::is_empty) {
            return Err(Error::config(
                "setting `params` names no parameter (leave it out for every conv)",
            ));
        }
        Ok(DiracInit {
            params,
            kernel_size: kernel_size as i64,
        })
    }
}

export_plugin!(DiracInit);
