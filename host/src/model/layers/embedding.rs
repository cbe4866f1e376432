//! A lookup table of vectors (PyTorch `Embedding`).

use tch::{nn::Init, Kind, TchError, Tensor};

use super::{Attr, Layer};
use crate::model::{tree::join, ParamStore};

/// Maps each int64 index of its input (any shape) to a row of `weight`, giving the input's
/// shape plus a last dimension of `embedding_dim`. An index outside `[0, num_embeddings)` is an
/// error naming the layer, not a libtorch assertion.
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

    fn forward(&self, xs: &Tensor, _train: bool) -> Result<Tensor, TchError> {
        if xs.kind() != Kind::Int64 {
            return Err(TchError::Kind(format!(
                "embedding `{}`: indices must be int64, got {:?}",
                self.path,
                xs.kind()
            )));
        }
        if xs.numel() > 0 {
            let (lo, hi) = xs.f_aminmax(None::<i64>, false)?;
            let (lo, hi) = (lo.f_int64_value(&[])?, hi.f_int64_value(&[])?);
            if lo < 0 || hi >= self.num_embeddings {
                let bad = if lo < 0 { lo } else { hi };
                return Err(TchError::Shape(format!(
                    "embedding `{}`: index {bad} is outside [0, {}) (its {} rows)",
                    self.path, self.num_embeddings, self.num_embeddings
                )));
            }
        }
        Tensor::f_embedding(&self.weight, xs, -1, false, false)
    }
}
