//! A lookup table of vectors (PyTorch `Embedding`).

use tch::{nn::Init, Kind, TchError, Tensor};

use super::{Attr, Layer};
use crate::model::{tree::join, ParamStore};

/// Maps each int64 index of its input (any shape) to a row of `weight`, giving the input's
/// shape plus a last dimension of `embedding_dim`.
///
/// The indices are not checked here: a check on the device is a read on the host (the bounds'
/// values), which would make every forward wait for the device. The trainer checks the token
/// ids of every batch on the host, before they are uploaded, against the model's token
/// embedding ([`crate::model::Model::token_rows`]); positions and token types are made in range
/// by the models themselves. An index out of range that reaches this layer anyway gets
/// libtorch's error on the CPU (a device-side assertion on CUDA).
#[derive(Debug)]
pub struct Embedding {
    /// `(num_embeddings, embedding_dim)`.
    weight: Tensor,
    num_embeddings: i64,
    embedding_dim: i64,
    path: String,
}

impl Embedding {
    /// An embedding of `num_embeddings` rows of `embedding_dim` whose weight joins `store` as
    /// `{path}.weight`, drawn from `init`.
    pub fn new(
        store: &mut ParamStore,
        path: &str,
        num_embeddings: i64,
        embedding_dim: i64,
        init: Init,
    ) -> Result<Embedding, TchError> {
        let weight =
            store.parameter(join(path, "weight"), &[num_embeddings, embedding_dim], init)?;
        Ok(Embedding {
            weight,
            num_embeddings,
            embedding_dim,
            path: path.to_owned(),
        })
    }

    /// The table, `(num_embeddings, embedding_dim)` (shared with the store).
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }
}

impl Layer for Embedding {
    fn kind(&self) -> &str {
        "embedding"
    }

    fn attrs(&self) -> Vec<(&str, Attr)> {
        vec![
            ("num_embeddings", Attr::Int(self.num_embeddings)),
            ("embedding_dim", Attr::Int(self.embedding_dim)),
        ]
    }

    fn tensors(&self) -> Vec<(&str, &Tensor)> {
        vec![("weight", &self.weight)]
    }

    fn is_position_wise(&self) -> bool {
        true
    }

    fn forward(&self, xs: &Tensor, _train: bool) -> Result<Tensor, TchError> {
        if xs.kind() != Kind::Int64 {
            return Err(TchError::Kind(format!(
                "embedding `{}`: indices must be int64, got {:?}",
                self.path,
                xs.kind()
            )));
        }
        Tensor::f_embedding(&self.weight, xs, -1, false, false)
    }
}
