//! The position embedding of a model whose positions are rotary: [`ZeroPositions`].

use tessera_plugin_api::kit::OwnTensors;
use tessera_plugin_api::tch::{Device, Kind, Tensor};
use tessera_plugin_api::{Error, Module};

use crate::kinds::ROTARY_ZERO_POSITIONS;

/// `transformer.wpe` after a surgery that moves the positions elsewhere: a zero `weight`
/// `(max_sequence_length, n_embd)` that needs no gradient (a buffer: saved, never trained), so
/// every position embeds to zeros. Rotary's (kind [`ROTARY_ZERO_POSITIONS`]) leaves the
/// positions to the rotation of q and k; ALiBi's (kind `alibi_zero_positions`, made with
/// [`ZeroPositions::with_kind`]) to its attention biases. The kind is what checkpoints and
/// exports record, so each method keeps its own.
#[derive(Debug)]
pub struct ZeroPositions {
    weight: Tensor,
    kind: &'static str,
    /// The method's name in errors ("rotary", "ALiBi").
    method: &'static str,
}

impl ZeroPositions {
    /// Rotary's zeros `(max_sequence_length, n_embd)` with `options`, not requiring a gradient.
    pub fn new(
        max_sequence_length: i64,
        n_embd: i64,
        options: (Kind, Device),
    ) -> Result<ZeroPositions, Error> {
        Self::with_kind(
            ROTARY_ZERO_POSITIONS,
            "rotary",
            max_sequence_length,
            n_embd,
            options,
        )
    }

    /// Zeros `(max_sequence_length, n_embd)` of module kind `kind` for method `method` (named
    /// in errors), with `options`, not requiring a gradient.
    pub fn with_kind(
        kind: &'static str,
        method: &'static str,
        max_sequence_length: i64,
        n_embd: i64,
        options: (Kind, Device),
    ) -> Result<ZeroPositions, Error> {
        Ok(ZeroPositions {
            weight: Tensor::f_zeros([max_sequence_length, n_embd], options)?
                .set_requires_grad(false),
            kind,
            method,
        })
    }

    /// The longest sequence it embeds.
    pub fn max_sequence_length(&self) -> i64 {
        self.weight.size()[0]
    }
}

/// The tensor registered under the module's path: `weight` (a buffer).
impl OwnTensors for ZeroPositions {
    fn tensors(&self) -> Vec<(&'static str, Tensor)> {
        vec![("weight", self.weight.shallow_clone())]
    }
}

impl Module for ZeroPositions {
    fn kind(&self) -> &str {
        self.kind
    }

    fn attrs(&self) -> Vec<(String, f64)> {
        let s = self.weight.size();
        vec![
            ("max_sequence_length".to_owned(), s[0] as f64),
            ("n_embd".to_owned(), s[1] as f64),
        ]
    }

    /// Position ids `(T)` or `(B, T)` to zeros `(..., n_embd)`; more than
    /// `max_sequence_length` positions is an error naming the setting.
    fn forward(&self, input: &Tensor, _train: bool) -> Result<Tensor, Error> {
        let s = self.weight.size();
        let mut shape = input.size();
        let t = shape.last().copied().unwrap_or(1);
        if t > s[0] {
            return Err(format!(
                "a sequence of {t} positions is longer than {}'s max_sequence_length {}",
                self.method, s[0]
            )
            .into());
        }
        shape.push(s[1]);
        Ok(Tensor::f_zeros(
            &shape,
            (self.weight.kind(), self.weight.device()),
        )?)
    }

    /// Folds back into a plain `embedding` whose weight is the zero table `(max_sequence_length,
    /// n_embd)` (after ALiBi: Composer's model after `apply_alibi`).
    fn export(&self) -> Result<Option<Vec<(String, Tensor)>>, Error> {
        Ok(Some(vec![("weight".to_owned(), self.weight.copy())]))
    }
}
