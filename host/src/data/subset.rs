//! Evaluation subsets that represent the data: a fixed, seeded sample of a source, stratified by
//! class where the labels are known (`train.eval_subset_batches`).
//!
//! Taking the first N batches of an evaluation set measures its first samples only: an image
//! folder lists its files class by class, so they hold the first classes alone. [`choose`]
//! instead picks `count` samples of the whole set: when every label is known, each class gets
//! its share (`count × class size / total`, the remainders going to the largest fractions, ties
//! to the lower class) drawn uniformly within the class; otherwise a uniform sample. The choice
//! depends only on the set's labels (or size), `count` and the seed — never on the number of
//! ranks or loader workers — so every evaluation of a run, and every run of a sweep with the
//! same `eval_subset_seed`, scores the same samples. [`Subset`] and [`TokenSubset`] serve the
//! chosen samples, in ascending index order, as a source of their own.

use std::sync::Arc;

use rand::seq::index::sample;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::source::{RawSample, SampleSource, TokenRows, TokenSource, TokenTargets};
use super::DataError;

/// How a subset was chosen: what the run record says about the evaluated samples.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubsetChoice {
    /// The indices into the evaluation set, ascending.
    pub indices: Vec<u32>,
    /// Samples in the whole evaluation set.
    pub of: usize,
    /// The seed of the draw (`train.eval_subset_seed`).
    pub seed: u64,
    /// Whether each class got its share (every label known); otherwise a uniform sample.
    pub stratified: bool,
}

/// Chooses `count` of `total` samples (all of them when `count >= total`), seeded, stratified
/// by `labels` when given (one per sample); see the module doc.
pub fn choose(
    total: usize,
    count: usize,
    seed: u64,
    labels: Option<&[i64]>,
) -> Result<SubsetChoice, DataError> {
    if u32::try_from(total).is_err() {
        return Err(DataError::Invalid(format!(
            "evaluation subset: {total} samples are more than the 2^32 - 1 supported"
        )));
    }
    let count = count.min(total);
    let labels = match labels {
        Some(l) if l.len() != total => {
            return Err(DataError::Invalid(format!(
                "evaluation subset: {} labels for {total} samples",
                l.len()
            )))
        }
        other => other,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut indices: Vec<u32> = match labels {
        _ if count == total => (0..total as u32).collect(),
        Some(labels) => stratified(labels, count, &mut rng),
        None => sample(&mut rng, total, count)
            .into_iter()
            .map(|i| i as u32)
            .collect(),
    };
    indices.sort_unstable();
    Ok(SubsetChoice {
        indices,
        of: total,
        seed,
        stratified: labels.is_some(),
    })
}

/// Each class's share of `count`, drawn uniformly within the class.
fn stratified(labels: &[i64], count: usize, rng: &mut ChaCha8Rng) -> Vec<u32> {
    // Classes in ascending label order, each with its members in index order.
    let mut classes: std::collections::BTreeMap<i64, Vec<u32>> = Default::default();
    for (i, &label) in labels.iter().enumerate() {
        classes.entry(label).or_default().push(i as u32);
    }
    let total = labels.len() as u128;
    // Largest-remainder apportionment of `count` over the classes by size.
    let mut quotas: Vec<(usize, u128)> = classes
        .values()
        .map(|members| {
            let exact = count as u128 * members.len() as u128;
            ((exact / total) as usize, exact % total)
        })
        .collect();
    let given: usize = quotas.iter().map(|q| q.0).sum();
    let mut by_remainder: Vec<usize> = (0..quotas.len()).collect();
    // Largest remainder first; ties to the lower class (stable sort keeps label order).
    by_remainder.sort_by(|&a, &b| quotas[b].1.cmp(&quotas[a].1));
    for &class in by_remainder.iter().take(count - given) {
        quotas[class].0 += 1;
    }
    let mut chosen = Vec::with_capacity(count);
    for (members, (quota, _)) in classes.values().zip(quotas) {
        chosen.extend(
            sample(rng, members.len(), quota)
                .into_iter()
                .map(|i| members[i]),
        );
    }
    chosen
}

/// The samples `indices` of another source, in that order.
#[derive(Debug)]
pub struct Subset {
    inner: Arc<dyn SampleSource>,
    indices: Arc<Vec<u32>>,
}

impl Subset {
    /// Serves `indices` of `inner`; each must be below its length.
    pub fn new(inner: Arc<dyn SampleSource>, indices: Arc<Vec<u32>>) -> Result<Subset, DataError> {
        check_indices(&indices, inner.len())?;
        Ok(Subset { inner, indices })
    }
}

impl SampleSource for Subset {
    fn len(&self) -> usize {
        self.indices.len()
    }

    fn shape(&self) -> (usize, usize, usize) {
        self.inner.shape()
    }

    fn read(&self, index: usize) -> Result<Option<RawSample<'_>>, DataError> {
        self.inner.read(inner_index(&self.indices, index)?)
    }

    fn label(&self, index: usize) -> Option<i64> {
        self.inner.label(*self.indices.get(index)? as usize)
    }

    fn undecodable(&self, index: usize, error: DataError) -> Result<(), DataError> {
        self.inner
            .undecodable(inner_index(&self.indices, index)?, error)
    }
}

/// The inner source's index of a subset's sample `index`.
fn inner_index(indices: &[u32], index: usize) -> Result<usize, DataError> {
    indices
        .get(index)
        .map(|&i| i as usize)
        .ok_or_else(|| outside(index, indices.len()))
}

/// The sequences `indices` of another token source, in that order.
#[derive(Debug)]
pub struct TokenSubset {
    inner: Arc<dyn TokenSource>,
    indices: Arc<Vec<u32>>,
}

impl TokenSubset {
    /// Serves `indices` of `inner`; each must be below its length.
    pub fn new(
        inner: Arc<dyn TokenSource>,
        indices: Arc<Vec<u32>>,
    ) -> Result<TokenSubset, DataError> {
        check_indices(&indices, inner.len())?;
        Ok(TokenSubset { inner, indices })
    }
}

impl TokenSource for TokenSubset {
    fn len(&self) -> usize {
        self.indices.len()
    }

    fn seq_len(&self) -> usize {
        self.inner.seq_len()
    }

    fn targets(&self) -> TokenTargets {
        self.inner.targets()
    }

    fn padded(&self) -> bool {
        self.inner.padded()
    }

    fn paired(&self) -> bool {
        self.inner.paired()
    }

    fn label(&self, index: usize) -> Option<i64> {
        self.inner.label(*self.indices.get(index)? as usize)
    }

    fn read(&self, index: usize, epoch: u64, rows: &mut TokenRows) -> Result<(), DataError> {
        self.inner
            .read(inner_index(&self.indices, index)?, epoch, rows)
    }
}

fn check_indices(indices: &[u32], len: usize) -> Result<(), DataError> {
    match indices.iter().find(|&&i| i as usize >= len) {
        Some(i) => Err(DataError::Invalid(format!(
            "subset index {i} is outside the {len} samples"
        ))),
        None => Ok(()),
    }
}

fn outside(index: usize, len: usize) -> DataError {
    DataError::Invalid(format!("sample {index} is outside the subset of {len}"))
}

/// The labels of every sample of `source`, when it knows them all without decoding.
pub fn labels_of(source: &dyn SampleSource) -> Option<Vec<i64>> {
    (0..source.len()).map(|i| source.label(i)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::ImageDataset;

    /// A class-sorted set: 10 classes of 30 samples, labels 0,0,...,1,1,...
    fn sorted_labels() -> Vec<i64> {
        (0..300).map(|i| i / 30).collect()
    }

    #[test]
    fn first_batches_of_a_class_sorted_set_hold_one_class_but_the_subset_holds_all() {
        let labels = sorted_labels();
        // What `eval_subset_batches = 1` of 32 evaluated before: the first 32 samples.
        let first: std::collections::BTreeSet<i64> = labels[..32].iter().copied().collect();
        assert_eq!(first.len(), 2);
        let choice = choose(300, 32, 0, Some(&labels)).unwrap();
        assert!(choice.stratified);
        assert_eq!(choice.indices.len(), 32);
        let mut per_class = [0usize; 10];
        for &i in &choice.indices {
            per_class[labels[i as usize] as usize] += 1;
        }
        // 32 of 10 equal classes: 3 each, two classes 4 (the lowest, as remainders tie).
        assert_eq!(per_class, [4, 4, 3, 3, 3, 3, 3, 3, 3, 3]);
        assert!(choice.indices.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn shares_follow_class_sizes() {
        // Class 0: 600 samples, class 1: 300, class 2: 100.
        let labels: Vec<i64> = (0..1000)
            .map(|i| match i {
                0..600 => 0,
                600..900 => 1,
                _ => 2,
            })
            .collect();
        let choice = choose(1000, 101, 7, Some(&labels)).unwrap();
        let count = |c: i64| {
            choice
                .indices
                .iter()
                .filter(|&&i| labels[i as usize] == c)
                .count()
        };
        // Exact shares 60.6, 30.3, 10.1: floors 60, 30, 10; the one left goes to class 0.
        assert_eq!((count(0), count(1), count(2)), (61, 30, 10));
    }

    #[test]
    fn seeded_and_independent_of_anything_else() {
        let labels = sorted_labels();
        let a = choose(300, 50, 3, Some(&labels)).unwrap();
        assert_eq!(a, choose(300, 50, 3, Some(&labels)).unwrap());
        assert_ne!(
            a.indices,
            choose(300, 50, 4, Some(&labels)).unwrap().indices
        );
        let uniform = choose(300, 50, 3, None).unwrap();
        assert!(!uniform.stratified);
        assert_eq!(uniform.indices.len(), 50);
        assert_eq!(uniform, choose(300, 50, 3, None).unwrap());
        let mut dedup = uniform.indices.clone();
        dedup.dedup();
        assert_eq!(dedup.len(), 50);
        // Asking for more than there is takes everything.
        let all = choose(300, 1000, 3, Some(&labels)).unwrap();
        assert_eq!(all.indices, (0..300).collect::<Vec<u32>>());
        let msg = choose(3, 1, 0, Some(&[0, 1])).unwrap_err().to_string();
        assert!(msg.contains("2 labels for 3 samples"), "{msg}");
    }

    #[test]
    fn subset_serves_the_chosen_samples() {
        let set = ImageDataset::new(1, 1, 2, (0..12).collect(), vec![0, 1, 2, 0, 1, 2], 3).unwrap();
        let set: Arc<dyn SampleSource> = Arc::new(set);
        assert_eq!(labels_of(&*set), Some(vec![0, 1, 2, 0, 1, 2]));
        let sub = Subset::new(Arc::clone(&set), Arc::new(vec![1, 4])).unwrap();
        assert_eq!(sub.len(), 2);
        let (data, label) = sub.read(1).unwrap().unwrap();
        let crate::data::SampleData::Pixels(pixels) = data else {
            panic!("a dataset in memory serves pixels");
        };
        assert_eq!((&pixels[..], label), (&[8u8, 9][..], 1));
        assert_eq!(sub.label(0), Some(1));
        assert!(sub.read(2).is_err());
        let msg = Subset::new(set, Arc::new(vec![6])).unwrap_err().to_string();
        assert!(msg.contains("index 6 is outside the 6"), "{msg}");
    }
}
