//! GyroDropout against Composer's own outputs (`tests/golden/gyro_dropout.*`): given
//! Composer's preselected masks and picks the training outputs are exact; the selection
//! period, the eval identity and the error cases match; Tessera's own draws satisfy the
//! listed invariants and continue bit for bit from a saved state.

use std::sync::{Arc, Mutex};

use gyro_dropout::{gyro_dropout, iter_num, GyroDropout, GyroDropoutModule, LayerState, Schedule};
use tessera_plugin_api::tch::{Kind, Tensor};
use tessera_plugin_api::testing::golden::{assert_close, Golden};
use tessera_plugin_api::testing::{default_settings_json, settings};
use tessera_plugin_api::{boxed_method, Module, Plugin};

const CASE: &str = "gyro_dropout";

fn hp(g: &Golden, key: &str) -> u64 {
    g.json["hyperparameters"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("hyperparameter {key}"))
}

fn schedule(g: &Golden) -> Schedule {
    let (sigma, tau) = (hp(g, "sigma") as i64, hp(g, "tau") as i64);
    let batches = hp(g, "iters_per_epoch") * hp(g, "max_epoch");
    Schedule {
        p: g.json["hyperparameters"]["p"].as_f64().expect("p"),
        sigma,
        tau,
        iter_num: iter_num(batches, sigma, tau).expect("iter_num"),
    }
}

#[test]
fn the_selection_period_is_composers() {
    let g = Golden::load(CASE);
    assert_eq!(
        schedule(&g).iter_num,
        g.json["results"]["iter_num"].as_u64().expect("iter_num")
    );
    // Fewer training batches than sigma: no period (Composer divides by zero).
    assert_eq!(iter_num(255, 256, 16), None);
    assert_eq!(iter_num(256, 256, 16), Some(16));
}

#[test]
fn given_composers_masks_and_picks_the_outputs_are_exact() {
    let g = Golden::load(CASE);
    let s = schedule(&g);
    let inputs = g.tensor("layer/inputs");
    let masks = g.tensor("layer/preselect_masks");
    let picks = g.tensor("layer/pick_idx");
    let steps = inputs.size()[0];
    for t in 0..steps {
        let pick = picks.get(t / s.iter_num as i64);
        let selected = masks.index_select(0, &pick);
        assert!(
            selected.equal(&g.tensor("layer/selected_masks_per_step").get(t)),
            "step {t}"
        );
        let out = gyro_dropout(&inputs.get(t), &selected, s.p).expect("forward");
        assert_close(
            &format!("step {t}"),
            &out,
            &g.tensor("layer/outputs").get(t),
            1e-6,
            0.0,
        );
    }
}

#[test]
fn evaluation_is_the_identity() {
    let g = Golden::load(CASE);
    let module = GyroDropoutModule {
        schedule: schedule(&g),
        state: Arc::new(Mutex::new(LayerState::new(0))),
    };
    let x = g.tensor("layer/inputs").get(0);
    let out = module.forward(&x, false).expect("eval");
    assert!(out.equal(g.tensor("layer/eval_output")));
    assert_eq!(module.state.lock().expect("state").step, 0, "eval counted");
    assert!(module
        .export()
        .expect("export")
        .is_some_and(|t| t.is_empty()));
}

#[test]
fn a_batch_that_is_not_a_multiple_of_tau_is_an_error_naming_both() {
    let x = Tensor::ones([6, 10], (Kind::Float, tessera_plugin_api::tch::Device::Cpu));
    for (rows, n) in [(4, 6), (4, 2)] {
        let selected = Tensor::ones(
            [rows, 10],
            (Kind::Float, tessera_plugin_api::tch::Device::Cpu),
        );
        let e = gyro_dropout(&x.narrow(0, 0, n), &selected, 0.5).expect_err("refused");
        assert!(
            e.to_string().contains(&format!(
                "batch of {n} samples is not a multiple of tau = {rows}"
            )),
            "{e}"
        );
    }
}

/// Tessera's draws: the invariants Composer's RNG can't be compared on, and a layer restored
/// from its saved state continuing exactly as the original.
#[test]
fn own_draws_keep_the_invariants_and_resume_exactly() {
    let g = Golden::load(CASE);
    let s = schedule(&g);
    let inputs = g.tensor("layer/inputs");
    let module = GyroDropoutModule {
        schedule: s,
        state: Arc::new(Mutex::new(LayerState::new(37))),
    };
    let n = inputs.size()[1];
    let block = n / s.tau;
    let mut picks_seen = Vec::new();
    let mut outputs = Vec::new();
    for t in 0..inputs.size()[0] {
        let x = inputs.get(t);
        let out = module.forward(&x, true).expect("train");
        let state = module.state.lock().expect("state");
        picks_seen.push(state.picks.clone());
        assert_eq!(state.picks.len() as i64, s.tau);
        assert!(state.picks.iter().all(|&p| (0..s.sigma).contains(&p)));
        let masks = state.preselected.as_ref().expect("masks");
        assert!(
            masks
                .eq(0.0)
                .logical_or(&masks.eq(1.0))
                .all()
                .int64_value(&[])
                == 1
        );
        // Kept values are x / (1 − p), dropped ones 0; a block of N / tau samples shares a row.
        let ratio = (&out / &x) * (1.0 - s.p);
        assert!(
            ratio
                .eq(0.0)
                .logical_or(&ratio.eq(1.0))
                .all()
                .int64_value(&[])
                == 1
        );
        for b in 0..s.tau {
            let rows = ratio.narrow(0, b * block, block);
            assert!(
                rows.eq_tensor(&rows.get(0).unsqueeze(0))
                    .all()
                    .int64_value(&[])
                    == 1
            );
        }
        if !(t as u64).is_multiple_of(s.iter_num) {
            assert_eq!(
                picks_seen[t as usize],
                picks_seen[t as usize - 1],
                "step {t}"
            );
        }
        outputs.push(out);
    }
    // Save after 5 steps, restore into a fresh layer, and continue: the same outputs.
    let replay = GyroDropoutModule {
        schedule: s,
        state: Arc::new(Mutex::new(LayerState::new(37))),
    };
    for t in 0..5 {
        let _ = replay.forward(&inputs.get(t), true).expect("train");
    }
    let saved = {
        let st = replay.state.lock().expect("state");
        LayerState {
            seed: st.seed,
            word_pos: st.word_pos,
            step: st.step,
            preselected: st.preselected.as_ref().map(Tensor::copy),
            picks: st.picks.clone(),
        }
    };
    let resumed = GyroDropoutModule {
        schedule: s,
        state: Arc::new(Mutex::new(saved)),
    };
    for t in 5..inputs.size()[0] {
        let out = resumed.forward(&inputs.get(t), true).expect("train");
        assert!(out.equal(&outputs[t as usize]), "step {t} after restore");
    }
}

#[test]
fn defaults_are_composers_and_bad_settings_are_named() {
    let g = Golden::load(CASE);
    let defaults = &g.json["hyperparameters"]["algorithm_defaults"];
    let json: serde_json::Value =
        serde_json::from_str(&default_settings_json(GyroDropout::DEFAULT_SETTINGS)).expect("json");
    for key in ["p", "sigma", "tau"] {
        assert_eq!(json[key].as_f64(), defaults[key].as_f64(), "{key}");
    }
    boxed_method::<GyroDropout>(&settings("{}")).expect("defaults");
    for (bad, key) in [
        (r#"{"p": 1.0}"#, "`p`"),
        (r#"{"sigma": 0}"#, "`sigma`"),
        (r#"{"tau": -2}"#, "tau"),
        (r#"{"taus": 2}"#, "taus"),
    ] {
        let e = boxed_method::<GyroDropout>(&settings(bad))
            .err()
            .expect(bad)
            .to_string();
        assert!(e.contains(key), "{bad}: {e}");
    }
}
