//! The embeddings (Hugging Face's `BertEmbeddings`, path `bert.embeddings`).

use tch::{Kind, TchError, Tensor};

use crate::model::layers::mask::token_type_ids;
use crate::model::layers::Layer;
use crate::model::zoo::transformer::embedding_rows;

/// The embeddings (Hugging Face's `BertEmbeddings`, path `bert.embeddings`), kind
/// `bert_embeddings`.
#[derive(Debug)]
pub struct BertEmbeddings {
    pub(super) word_embeddings: Box<dyn Layer>,
    pub(super) position_embeddings: Box<dyn Layer>,
    pub(super) token_type_embeddings: Box<dyn Layer>,
    pub(super) layer_norm: Box<dyn Layer>,
    pub(super) dropout: Box<dyn Layer>,
}

impl Layer for BertEmbeddings {
    fn kind(&self) -> &str {
        "bert_embeddings"
    }

    fn children(&self) -> Vec<(&str, &dyn Layer)> {
        vec![
            ("word_embeddings", self.word_embeddings.as_ref()),
            ("position_embeddings", self.position_embeddings.as_ref()),
            ("token_type_embeddings", self.token_type_embeddings.as_ref()),
            ("LayerNorm", self.layer_norm.as_ref()),
            ("dropout", self.dropout.as_ref()),
        ]
    }

    fn child_mut(&mut self, name: &str) -> Option<&mut Box<dyn Layer>> {
        match name {
            "word_embeddings" => Some(&mut self.word_embeddings),
            "position_embeddings" => Some(&mut self.position_embeddings),
            "token_type_embeddings" => Some(&mut self.token_type_embeddings),
            "LayerNorm" => Some(&mut self.layer_norm),
            "dropout" => Some(&mut self.dropout),
            _ => None,
        }
    }

    fn forward(&self, ids: &Tensor, train: bool) -> Result<Tensor, TchError> {
        let t = match (ids.kind(), ids.size().as_slice()) {
            (Kind::Int64, &[_, t]) => t,
            (kind, size) => {
                return Err(TchError::Shape(format!(
                    "bert: expected int64 token ids (batch, tokens), got {kind:?} {size:?}"
                )))
            }
        };
        if let Some(rows) = embedding_rows(self.position_embeddings.as_ref()) {
            if t > rows {
                return Err(TchError::Shape(format!(
                    "bert: the input has {t} tokens per sequence, more than the model's \
                     {rows} positions (`[model] n_positions`, the rows of \
                     `bert.embeddings.position_embeddings`)"
                )));
            }
        }
        let positions = Tensor::f_arange(t, (Kind::Int64, ids.device()))?.f_unsqueeze(0)?;
        // The batch's token type ids (sentence pairs), else all 0 (one segment).
        let token_types = match token_type_ids() {
            Some(types) if types.size() == ids.size() => types,
            Some(types) => {
                return Err(TchError::Shape(format!(
                    "bert: the batch's token_type_ids have shape {:?}, but the input ids {:?}",
                    types.size(),
                    ids.size()
                )))
            }
            None => ids.f_zeros_like()?,
        };
        let x = self
            .word_embeddings
            .forward(ids, train)?
            .f_add(&self.token_type_embeddings.forward(&token_types, train)?)?
            .f_add(&self.position_embeddings.forward(&positions, train)?)?;
        let x = self.layer_norm.forward(&x, train)?;
        self.dropout.forward(&x, train)
    }
}
