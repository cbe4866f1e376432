//! The host's training loss (`tessera::model::cross_entropy`) against Composer's
//! `soft_cross_entropy` outputs in the `label_smoothing` golden case.
//!
//! Every `loss[_<variant>]/<params>` output is Composer's loss of the logits `logits[_<variant>]`
//! against the smoothed targets `smoothed[_<variant>]/<params>` of the same case: the host's loss
//! is fed those golden targets, so this checks the loss alone, not the smoothing.

use tessera::model::cross_entropy;
use tessera_plugin_api::tch::Tensor;
use tessera_plugin_api::testing::golden::{assert_close, Golden};

const CASE: &str = "label_smoothing";
const RTOL: f64 = 1e-6;
const ATOL: f64 = 1e-7;

/// `loss_kdim/s=0.1` → (`kdim`, `s=0.1`); `loss/s=0` → (None, `s=0`).
fn split_loss_key(key: &str) -> Option<(Option<&str>, &str)> {
    let (head, params) = key.split_once('/')?;
    match head {
        "loss" => Some((None, params)),
        _ => head.strip_prefix("loss_").map(|v| (Some(v), params)),
    }
}

/// The golden input `logits_<variant>`, else `logits`.
fn logits<'g>(g: &'g Golden, variant: Option<&str>) -> &'g Tensor {
    let name = variant
        .map(|v| format!("logits_{v}"))
        .filter(|n| g.tensors.contains_key(n))
        .unwrap_or_else(|| "logits".to_owned());
    assert_eq!(g.role(&name), "input", "{name} should be an input");
    g.tensor(&name)
}

#[test]
fn host_loss_reproduces_composers_soft_cross_entropy() {
    let g = Golden::load(CASE);
    let mut checked = Vec::new();
    for key in g.names_with_role("output") {
        let Some((variant, params)) = split_loss_key(&key) else {
            continue;
        };
        let target_name = match variant {
            Some(v) => format!("smoothed_{v}/{params}"),
            None => format!("smoothed/{params}"),
        };
        let target = g.tensor(&target_name);
        let ours = cross_entropy(logits(&g, variant), target)
            .unwrap_or_else(|e| panic!("{key}: the host loss failed: {e}"));
        assert_close(&key, &ours, g.tensor(&key), RTOL, ATOL);
        checked.push(key);
    }
    eprintln!("checked {checked:?}");
    // Every smoothing value of the case and the (N, C, H, W) variant were checked.
    let values = g.json["hyperparameters"]["smoothing_values"]
        .as_array()
        .expect("hyperparameters.smoothing_values");
    assert!(!values.is_empty());
    assert!(checked.len() > values.len(), "{checked:?}");
    assert!(
        checked.iter().any(|k| k.starts_with("loss_")),
        "{checked:?}"
    );
}

#[test]
fn host_loss_on_index_targets_is_the_unsmoothed_golden_loss() {
    // With smoothing 0 the smoothed target is the one-hot of the index target, so the host's
    // index-target loss must give the same golden value.
    let g = Golden::load(CASE);
    let unsmoothed = g
        .names_with_role("output")
        .into_iter()
        .find(|k| {
            split_loss_key(k).is_some_and(|(variant, params)| {
                variant.is_none()
                    && tessera_plugin_api::testing::golden::parse_params(params)
                        .get("s")
                        .and_then(|s| s.parse::<f64>().ok())
                        == Some(0.0)
            })
        })
        .expect("a `loss/s=0` output");
    let ours = cross_entropy(logits(&g, None), g.tensor("target")).expect("the host loss");
    assert_close(&unsmoothed, &ours, g.tensor(&unsmoothed), RTOL, ATOL);
}
