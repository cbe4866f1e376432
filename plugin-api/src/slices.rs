//! This rank's slices of the model's tensors (plugin-api 1.10), for a method that keeps a copy
//! of the weights (EMA, SWA, Lookahead) under `[distributed] sharding`.
//!
//! Under sharding each rank owns a run of every sharded parameter's elements (in the
//! parameter's memory order) and, under `"full"`, holds only that run between uses. A method
//! whose work is element by element — a running average, an interpolation — does it on this
//! rank's slice ([`Context::parameter_slice`]) and keeps only slices: its copy costs 1/world of
//! the model on each rank, and under `"full"` nothing is gathered for it. Where the whole
//! tensors are needed (the method's checkpointed state) [`Context::gather_slices`] puts them
//! together; [`SliceLayout::cut`] takes this rank's slice of a whole tensor (a restored
//! state). Without sharding — a single process, DDP, or a tensor every rank holds whole (a
//! buffer, a parameter a method updates itself) — the slice is the whole tensor, in its shape,
//! and both calls cost nothing.

use abi_stable::std_types::{RString, RVec};

use crate::abi::{SliceInfo, TensorHandle};
use crate::{host_result, Context, Error};

/// This rank's slice of one of the model's tensors ([`Context::parameter_slice`]).
#[derive(Debug)]
pub struct ParameterSlice {
    /// The slice, sharing the memory this rank keeps of the tensor (writes reach the model):
    /// the whole tensor when not [`sharded`](SliceLayout::sharded), else a 1-D tensor of its
    /// elements `[start, start + len)` in memory order (possibly empty).
    pub tensor: tch::Tensor,
    /// Which part of the whole tensor it is.
    pub layout: SliceLayout,
}

/// Which part of a model tensor a rank's slice is: what a method keeps beside its copy of the
/// slice, to cut a restored whole tensor the same way ([`SliceLayout::cut`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceLayout {
    /// The ranks hold different parts of the tensor; else every rank holds it whole and the
    /// slice is the tensor itself, in its shape.
    pub sharded: bool,
    /// The first element of the whole tensor the slice holds, in its memory order.
    pub start: i64,
    /// The number of elements the slice holds.
    pub len: i64,
    /// The whole tensor's size.
    pub size: Vec<i64>,
    /// The whole tensor's strides (its memory order).
    pub strides: Vec<i64>,
}

impl SliceLayout {
    /// The whole tensor's number of elements.
    pub fn numel(&self) -> i64 {
        self.size.iter().product()
    }

    /// This rank's slice of `whole` (a tensor of the whole tensor's size, in any layout), as a
    /// new tensor shaped as the slice: what to keep of a restored whole copy.
    pub fn cut(&self, whole: &tch::Tensor) -> Result<tch::Tensor, Error> {
        let _no_grad = tch::no_grad_guard();
        if whole.size() != self.size {
            return Err(format!(
                "a tensor of size {:?} is not a whole tensor of size {:?}",
                whole.size(),
                self.size
            )
            .into());
        }
        if !self.sharded {
            let mut out = whole.f_detach()?.f_empty_like()?;
            out.f_copy_(whole)?;
            return Ok(out);
        }
        let laid = tch::Tensor::f_empty_strided(
            &self.size,
            &self.strides,
            (whole.kind(), whole.device()),
        )?;
        laid.shallow_clone().f_copy_(whole)?;
        let flat = laid.f_as_strided([self.numel()], [1], 0)?;
        Ok(flat.f_narrow(0, self.start, self.len)?.f_detach_copy()?)
    }
}

impl ParameterSlice {
    fn from_info(info: SliceInfo) -> ParameterSlice {
        let tensor = info.tensor.into_tensor();
        let size = info.size.into_vec();
        let len = if info.sharded {
            tensor.numel() as i64
        } else {
            size.iter().product()
        };
        ParameterSlice {
            tensor,
            layout: SliceLayout {
                sharded: info.sharded,
                start: info.start,
                len,
                size,
                strides: info.strides.into_vec(),
            },
        }
    }
}

impl Context<'_> {
    // ---- plugin-api 1.10 ----

    /// This rank's slice of the model's tensor `name` ([`ParameterSlice`]), `None` when the
    /// model has none of that name. Under `[distributed] sharding` a sharded parameter's slice
    /// is the run of its elements this rank owns, shared with the memory the rank keeps (under
    /// `"full"` the parameters are not gathered for it); any other tensor, and every tensor
    /// without sharding, comes whole, as [`Context::parameter`] gives it.
    ///
    /// `write`: the method will change the slice (put averaged weights in). The host then
    /// makes the whole parameters agree with every rank's slices once the event is over, so
    /// every rank must ask alike (call it from events every rank receives). Reading only
    /// (`false`) costs nothing.
    ///
    /// A host older than 1.10 has no slices: this then answers the whole tensor from
    /// [`Context::parameter`] (`sharded` false), so a method written against slices runs
    /// unchanged there.
    pub fn parameter_slice(
        &mut self,
        name: &str,
        write: bool,
    ) -> Result<Option<ParameterSlice>, Error> {
        if let Some(f) = self.host.api.parameter_slice() {
            let answer = host_result(f(self.host.ctx, name.into(), write))?;
            return Ok(answer.into_option().map(ParameterSlice::from_info));
        }
        Ok(self.parameter(name)?.map(|t| ParameterSlice {
            layout: SliceLayout {
                sharded: false,
                start: 0,
                len: t.numel() as i64,
                size: t.size(),
                strides: t.stride(),
            },
            tensor: t,
        }))
    }

    /// The whole tensors of `slices` (name, a tensor shaped as this rank's slice of that model
    /// tensor: a slice itself or a method's copy of one, of any floating kind), each of its
    /// whole tensor's size and memory layout: every rank's slices put together. A tensor that
    /// is not sharded comes back as it is (shared, not copied).
    ///
    /// A collective under sharding: every rank must call it at the same point with the same
    /// names in the same order (a method saving its state gathers at the `*_checkpoint` event
    /// that [`Context::checkpoint_pending`] marks). Each rank receives every whole tensor: for
    /// that moment it holds the whole copy. A host older than 1.10 returns the tensors as they
    /// are (it has no slices).
    pub fn gather_slices(
        &mut self,
        slices: &[(String, tch::Tensor)],
    ) -> Result<Vec<tch::Tensor>, Error> {
        let Some(f) = self.host.api.gather_slices() else {
            return Ok(slices.iter().map(|(_, t)| t.shallow_clone()).collect());
        };
        let names: RVec<RString> = slices.iter().map(|(n, _)| n.as_str().into()).collect();
        let tensors: RVec<TensorHandle> = slices
            .iter()
            .map(|(_, t)| TensorHandle::from_tensor(t.shallow_clone()))
            .collect();
        let whole = host_result(f(self.host.ctx, names, tensors))?;
        if whole.len() != slices.len() {
            return Err(format!(
                "gather_slices: the host answered {} tensors for {} slices",
                whole.len(),
                slices.len()
            )
            .into());
        }
        Ok(whole.into_iter().map(TensorHandle::into_tensor).collect())
    }

    /// Whether the host has slices (plugin-api 1.10 or later): in an older one
    /// [`Context::parameter_slice`] answers whole tensors.
    pub fn supports_parameter_slices(&self) -> bool {
        self.host.api.parameter_slice().is_some()
    }
}

/// The whole tensors of a method's copies for the checkpoint that follows, gathered from every
/// rank's slices ([`Context::gather_slices`]): `sets` are (prefix, copies shaped as this rank's
/// slices), and the answer names each `prefix/name`, on rank 0 (`None` on the others, which
/// save nothing). A collective: call it on every rank at the `*_checkpoint` event that
/// [`Context::checkpoint_pending`] announces.
pub fn gather_for_save(
    ctx: &mut Context<'_>,
    sets: &[(&str, &[(String, tch::Tensor)])],
) -> Result<Option<Vec<(String, tch::Tensor)>>, Error> {
    let mut names = Vec::new();
    let mut slices = Vec::new();
    for (prefix, copies) in sets {
        for (name, t) in copies.iter() {
            names.push(format!("{prefix}/{name}"));
            slices.push((name.clone(), t.shallow_clone()));
        }
    }
    let whole = ctx.gather_slices(&slices)?;
    Ok((ctx.ranks().rank == 0).then(|| names.into_iter().zip(whole).collect()))
}

/// What a method keeping named copies of model tensors (SWA's average, Lookahead's slow
/// weights) tracks to keep only slices under sharding: each tensor's [`SliceLayout`] as last
/// read, whether the copies are whole tensors read from a checkpoint (cut at the next read),
/// and, on rank 0 between a `*_checkpoint` event and the save, the copies gathered whole.
#[derive(Debug, Default)]
pub struct SlicedCopies {
    layouts: std::collections::HashMap<String, SliceLayout>,
    whole: bool,
    gathered: Option<Vec<(String, tch::Tensor)>>,
}

impl SlicedCopies {
    /// Notes the layout of the model tensor `name`'s slice, as just read from the host.
    pub fn note(&mut self, name: &str, layout: SliceLayout) {
        self.layouts.insert(name.to_owned(), layout);
    }

    /// The copies now hold whole tensors (restored from a checkpoint), or not.
    pub fn set_whole(&mut self, whole: bool) {
        self.whole = whole;
    }

    /// Cuts whole `copies` (restored from a checkpoint) to this rank's slices by the noted
    /// layouts, once. A copy of another size than its model tensor is an error:
    /// "`{method}: `name` has shape [model] in the model but [copy] in {what}`".
    pub fn cut_whole(
        &mut self,
        copies: &mut [(String, tch::Tensor)],
        method: &str,
        what: &str,
    ) -> Result<(), Error> {
        if !self.whole {
            return Ok(());
        }
        for (name, t) in copies.iter_mut() {
            if let Some(layout) = self.layouts.get(name.as_str()) {
                if t.size() != layout.size {
                    return Err(Error::from(format!(
                        "{method}: `{name}` has shape {:?} in the model but {:?} in {what}",
                        layout.size,
                        t.size()
                    )));
                }
                *t = layout.cut(t)?;
            }
        }
        self.whole = false;
        Ok(())
    }

    /// Whether `copies` hold this rank's slices of sharded tensors.
    pub fn sliced(&self, copies: &[(String, tch::Tensor)]) -> bool {
        !self.whole
            && copies
                .iter()
                .any(|(n, _)| self.layouts.get(n.as_str()).is_some_and(|l| l.sharded))
    }

    /// At a `*_checkpoint` event that announces a checkpoint: `copies` gathered whole under
    /// `prefix` ([`gather_for_save`]) when they are slices (collective).
    pub fn gather(
        &mut self,
        ctx: &mut Context<'_>,
        prefix: &str,
        copies: &[(String, tch::Tensor)],
    ) -> Result<(), Error> {
        if self.sliced(copies) {
            self.gathered = gather_for_save(ctx, &[(prefix, copies)])?;
        }
        Ok(())
    }

    /// Drops what was gathered for the last checkpoint (saved by now).
    pub fn forget_gathered(&mut self) {
        self.gathered = None;
    }

    /// The state's tensors for `copies` (`prefix/name`): the gathered whole ones when the
    /// copies are slices (an error naming `what` when the host saves without the
    /// `*_checkpoint` event), else copies of them.
    pub fn saved(
        &self,
        prefix: &str,
        copies: &[(String, tch::Tensor)],
        what: &str,
    ) -> Result<Vec<(String, tch::Tensor)>, Error> {
        if !self.sliced(copies) {
            let _no_grad = tch::no_grad_guard();
            return copies
                .iter()
                .map(|(name, t)| {
                    let mut out = t.f_detach()?.f_empty_like()?;
                    out.f_copy_(t)?;
                    Ok((format!("{prefix}/{name}"), out))
                })
                .collect();
        }
        let gathered = self.gathered.as_ref().ok_or_else(|| {
            Error::from(format!(
                "{what} sliced over the ranks and not gathered for this checkpoint (that \
                 happens at a `*_checkpoint` event that announces one)"
            ))
        })?;
        Ok(gathered
            .iter()
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(sharded: bool, start: i64, len: i64, size: &[i64], strides: &[i64]) -> SliceLayout {
        SliceLayout {
            sharded,
            start,
            len,
            size: size.to_vec(),
            strides: strides.to_vec(),
        }
    }

    #[test]
    fn a_cut_follows_the_memory_order_of_the_parameter() {
        // A 2x3 matrix stored column-major (strides [1, 2]): memory order 0 3 1 4 2 5.
        let whole = tch::Tensor::arange(6, (tch::Kind::Float, tch::Device::Cpu)).view([2, 3]);
        let l = layout(true, 2, 3, &[2, 3], &[1, 2]);
        let cut = l.cut(&whole).unwrap();
        assert_eq!(Vec::<f32>::try_from(&cut).unwrap(), vec![1.0, 4.0, 2.0]);
        // Row-major: the plain flattening.
        let l = layout(true, 1, 4, &[2, 3], &[3, 1]);
        let cut = l.cut(&whole).unwrap();
        assert_eq!(
            Vec::<f32>::try_from(&cut).unwrap(),
            vec![1.0, 2.0, 3.0, 4.0]
        );
        // An empty slice.
        let l = layout(true, 0, 0, &[2, 3], &[3, 1]);
        assert_eq!(l.cut(&whole).unwrap().numel(), 0);
    }

    #[test]
    fn an_unsharded_cut_is_a_whole_copy_and_a_wrong_size_is_refused() {
        let whole = tch::Tensor::arange(6, (tch::Kind::Float, tch::Device::Cpu)).view([2, 3]);
        let l = layout(false, 0, 6, &[2, 3], &[3, 1]);
        let cut = l.cut(&whole).unwrap();
        assert_eq!(cut.size(), vec![2, 3]);
        assert!(cut.equal(&whole));
        let _ = cut.shallow_clone().fill_(0.0);
        assert_eq!(whole.double_value(&[0, 1]), 1.0, "a copy, not a view");
        let err = l.cut(&whole.view([3, 2])).unwrap_err();
        assert!(
            err.message().contains("not a whole tensor of size [2, 3]"),
            "{err:?}"
        );
    }
}
