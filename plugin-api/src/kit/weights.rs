//! Copies of the model's weights that a method keeps (EMA's shadow weights, SWA's average,
//! Lookahead's slow weights).

use tch::Tensor;

use crate::Error;

/// A copy of `t` that shares nothing with it and records no gradient: same shape, kind, device
/// and memory layout (a channels-last weight stays channels-last).
pub fn detached_copy(t: &Tensor) -> Result<Tensor, Error> {
    let _no_grad = tch::no_grad_guard();
    let mut out = t.f_detach()?.f_empty_like()?;
    out.f_copy_(t)?;
    Ok(out)
}

/// `dst ← src` in place, without recording a gradient (`dst` may be a model parameter).
pub fn copy_into(dst: &Tensor, src: &Tensor) -> Result<(), Error> {
    let _no_grad = tch::no_grad_guard();
    dst.shallow_clone().f_copy_(src)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::kind::FLOAT_CPU;

    #[test]
    fn a_copy_shares_nothing_and_keeps_the_layout() {
        // NHWC memory seen as NCHW: a channels-last weight.
        let w = Tensor::randn([2, 4, 4, 3], FLOAT_CPU)
            .permute([0, 3, 1, 2])
            .set_requires_grad(true);
        let c = detached_copy(&w).unwrap();
        assert!(!c.requires_grad());
        assert_eq!(c.stride(), w.stride());
        assert!(c.equal(&w));
        copy_into(&c, &Tensor::zeros([2, 3, 4, 4], FLOAT_CPU)).unwrap();
        assert!(!w.equal(&c));
        copy_into(&w, &c).unwrap();
        assert!(w.equal(&c) && w.requires_grad());
    }
}
