//! The masked-LM head (`BertLMPredictionHead`) and its decoder tied to the word embeddings.

use tch::{TchError, Tensor};

use crate::model::layers::{Attr, ExportTree, Exported, Layer};

/// The masked-LM decoder: `x · weightᵀ + bias` with the word embedding's weight and
/// `cls.predictions.bias` (kind `tied_lm_head`, no tensors of its own; exported as
/// `decoder.weight` and `decoder.bias`).
#[derive(Debug)]
pub struct TiedDecoder {
    pub(super) weight: Tensor,
    pub(super) bias: Tensor,
}

impl Layer for TiedDecoder {
    fn kind(&self) -> &str {
        "tied_lm_head"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        let s = self.weight.size();
        vec![
            ("in_features", Attr::Int(s.get(1).copied().unwrap_or(0))),
            ("out_features", Attr::Int(s.first().copied().unwrap_or(0))),
            ("bias", Attr::Bool(true)),
        ]
    }

    fn forward(&self, xs: &Tensor, _train: bool) -> Result<Tensor, TchError> {
        xs.f_linear(&self.weight, Some(&self.bias))
    }

    fn export(&self) -> Result<Exported, TchError> {
        Ok(Exported::Folded(ExportTree {
            tensors: vec![
                ("weight".to_owned(), self.weight.shallow_clone()),
                ("bias".to_owned(), self.bias.shallow_clone()),
            ],
            kept: Vec::new(),
        }))
    }
}

/// Hugging Face's `BertLMPredictionHead` (path `cls.predictions`), kind
/// `bert_lm_prediction_head`: holds `bias`; `decoder(transform(x))`.
#[derive(Debug)]
pub struct BertLmPredictionHead {
    pub(super) bias: Tensor,
    pub(super) transform: Box<dyn Layer>,
    pub(super) decoder: Box<dyn Layer>,
}

impl Layer for BertLmPredictionHead {
    fn kind(&self) -> &str {
        "bert_lm_prediction_head"
    }

    fn tensors(&self) -> Vec<(&str, &Tensor)> {
        vec![("bias", &self.bias)]
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("transform", self.transform.as_ref()),
            ("decoder", self.decoder.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "transform" => Some(&mut self.transform),
            "decoder" => Some(&mut self.decoder),
            _ => None,
        }
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let x = self.transform.forward(xs, train)?;
        self.decoder.forward(&x, train)
    }
}
