//! Test support (feature `replay`): golden images as [`Image`]s, and [`Replay`], a [`Draws`]
//! that hands out the numpy draws a golden trace recorded, checking that each call the code
//! makes (kind and arguments) is the recorded one.

use std::collections::VecDeque;

use serde_json::Value;
use tessera_plugin_api::tch::{Kind, Tensor};

use crate::pillow::Image;
use crate::{Draws, Primitive};

/// A golden (H, W, C) uint8 image tensor as a channel-major [`Image`].
pub fn image(t: &Tensor) -> Image {
    assert_eq!(t.kind(), Kind::Uint8, "a golden image is uint8");
    let size = t.size();
    let chw = t.permute([2, 0, 1]).contiguous().flatten(0, -1);
    Image {
        channels: size[2] as usize,
        height: size[0] as usize,
        width: size[1] as usize,
        data: Vec::<u8>::try_from(&chw).expect("uint8 data"),
    }
}

/// How many bytes of two images of the same shape differ, and by how much at most.
pub fn differences(got: &Image, want: &Image) -> (usize, u8) {
    assert_eq!(
        (got.channels, got.height, got.width),
        (want.channels, want.height, want.width)
    );
    let diffs: Vec<u8> = got
        .data
        .iter()
        .zip(&want.data)
        .filter(|(a, b)| a != b)
        .map(|(a, b)| a.abs_diff(*b))
        .collect();
    (diffs.len(), diffs.into_iter().max().unwrap_or(0))
}

/// Replays numpy calls recorded as `[kind, args, value, ...]`, checking each call the crate
/// makes against the record.
pub struct Replay {
    calls: VecDeque<Value>,
    /// Names of the augmentation set `choice` picks from.
    set: Vec<&'static str>,
    what: String,
}

impl Replay {
    pub fn new(calls: &Value, set: &[Primitive], what: String) -> Replay {
        Replay {
            calls: calls
                .as_array()
                .expect("numpy_calls")
                .iter()
                .cloned()
                .collect(),
            set: set.iter().map(|p| p.name()).collect(),
            what,
        }
    }

    fn next(&mut self, kind: &str) -> Value {
        let call = self
            .calls
            .pop_front()
            .unwrap_or_else(|| panic!("{}: a `{kind}` draw beyond the trace", self.what));
        assert_eq!(call[0], kind, "{}: call {call}", self.what);
        call
    }

    pub fn finish(&self) {
        assert!(
            self.calls.is_empty(),
            "{}: recorded draws left over: {:?}",
            self.what,
            self.calls
        );
    }
}

impl Draws for Replay {
    fn choice(&mut self, n: usize) -> usize {
        let call = self.next("choice");
        assert_eq!(call[1][0], format!("<{n} items>"), "{}", self.what);
        let name = call[2].as_str().expect("choice value");
        self.set
            .iter()
            .position(|p| *p == name)
            .unwrap_or_else(|| panic!("{}: `{name}` is not in the set", self.what))
    }

    fn uniform(&mut self, low: f64, high: f64) -> f64 {
        let call = self.next("uniform");
        assert_eq!(
            (call[1][0].as_f64(), call[1][1].as_f64()),
            (Some(low), Some(high)),
            "{}: uniform's bounds",
            self.what
        );
        call[2].as_f64().expect("uniform value")
    }

    fn uniform_unit(&mut self) -> f64 {
        let call = self.next("uniform");
        assert!(
            call[1][0].is_null() && call[1][1].is_null(),
            "{}: expected uniform() without bounds, the record has {call}",
            self.what
        );
        call[2].as_f64().expect("uniform value")
    }

    fn random(&mut self) -> f64 {
        self.next("random")[2].as_f64().expect("random value")
    }

    fn dirichlet(&mut self, alpha: &[f64]) -> Vec<f64> {
        let call = self.next("dirichlet");
        assert_eq!(
            serde_json::from_value::<Vec<f64>>(call[1][0].clone())
                .ok()
                .as_deref(),
            Some(alpha),
            "{}: dirichlet's parameters",
            self.what
        );
        serde_json::from_value(call[2].clone()).expect("dirichlet value")
    }

    fn beta(&mut self, a: f64, b: f64) -> f64 {
        let call = self.next("beta");
        assert_eq!(
            (call[1][0].as_f64(), call[1][1].as_f64()),
            (Some(a), Some(b)),
            "{}: beta's parameters",
            self.what
        );
        call[2].as_f64().expect("beta value")
    }

    fn randint(&mut self, low: i64, high: i64) -> i64 {
        let call = self.next("randint");
        assert_eq!(
            (call[1][0].as_i64(), call[1][1].as_i64()),
            (Some(low), Some(high)),
            "{}: randint's bounds",
            self.what
        );
        call[2].as_i64().expect("randint value")
    }
}
