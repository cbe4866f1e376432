//! The SwiGLU feed-forward block (`LlamaMLP`).

use tch::{TchError, Tensor};

use super::attention::projection;
use super::config::LlamaConfig;
use crate::model::layers::{Attr, Layer};
use crate::model::{tree::join, ParamStore};

/// The SwiGLU feed-forward block (`LlamaMLP`), kind `llama_mlp`:
/// `down_proj(silu(gate_proj(x)) · up_proj(x))`.
#[derive(Debug)]
pub struct LlamaMlp {
    gate_proj: Box<dyn Layer>,
    up_proj: Box<dyn Layer>,
    down_proj: Box<dyn Layer>,
    hidden: i64,
    intermediate: i64,
}

impl LlamaMlp {
    /// The MLP of block `path`.
    pub fn new(store: &mut ParamStore, path: &str, config: &LlamaConfig) -> Result<Self, TchError> {
        let (c, i) = (config.hidden_size as i64, config.intermediate_size as i64);
        let std = config.initializer_range;
        let at = |name| join(path, name);
        Ok(LlamaMlp {
            gate_proj: Box::new(projection(store, &at("gate_proj"), (c, i), false, std)?),
            up_proj: Box::new(projection(store, &at("up_proj"), (c, i), false, std)?),
            down_proj: Box::new(projection(store, &at("down_proj"), (i, c), false, std)?),
            hidden: c,
            intermediate: i,
        })
    }
}

impl Layer for LlamaMlp {
    fn kind(&self) -> &str {
        "llama_mlp"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("hidden_size", Attr::Int(self.hidden)),
            ("intermediate_size", Attr::Int(self.intermediate)),
        ]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("gate_proj", self.gate_proj.as_ref()),
            ("up_proj", self.up_proj.as_ref()),
            ("down_proj", self.down_proj.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "gate_proj" => Some(&mut self.gate_proj),
            "up_proj" => Some(&mut self.up_proj),
            "down_proj" => Some(&mut self.down_proj),
            _ => None,
        }
    }

    fn is_position_wise(&self) -> bool {
        self.children().iter().all(|(_, c)| c.is_position_wise())
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let gate = self.gate_proj.forward(xs, train)?.f_silu()?;
        let up = self.up_proj.forward(xs, train)?;
        self.down_proj.forward(&gate.f_mul(&up)?, train)
    }
}
