//! The `muon` plugin: its update against `torch.optim.Muon` of the installed wheel and against
//! KellerJordan/Muon's definition (`scripts/muon_reference.py`), and through the binary (the
//! CNN and the tiny GPT with the host's AdamW/SGD for the rest, checkpoints, kill -9 and resume,
//! two data-parallel ranks, skipped steps).
//!
//! Its kill -9 resume and the settings its plugin refuses are rows of the method table
//! (tests/methods/table.rs).

use muon::{MatrixGroup, MuonConfig};
use serde_json::{json, Value};
use tessera_plugin_api::tch::{Device, Kind, Tensor};
use tessera_plugin_api::testing::settings_for;
use tessera_tests::dist::{assert_all_succeeded, max_difference, train_ranks};
use tessera_tests::*;

/// Parameter names and shapes of the script's `SHAPES`; the two squares share a group, so the
/// batched path is compared too.
const PARAMS: [(&str, &[i64]); 6] = [
    ("tall", &[12, 5]),
    ("wide", &[5, 12]),
    ("square_a", &[8, 8]),
    ("square_b", &[8, 8]),
    ("conv", &[6, 3, 3, 3]),
    ("conv_tall", &[16, 1, 3, 3]),
];

/// The compared cases: both variants, weight decay, both rate adjustments, Nesterov on and off,
/// a changing rate (the run's schedule as `lr_factor`), 3 Newton–Schulz steps (airbench).
fn cases() -> Vec<Value> {
    let factors = json!([1.0, 0.5, 0.25, 0.8, 1.0]);
    vec![
        json!({"variant": "torch", "lr": 0.02, "weight_decay": 0.1, "momentum": 0.95,
               "nesterov": true, "ns_steps": 5, "adjust_lr": null, "lr_factors": factors}),
        json!({"variant": "torch", "lr": 0.01, "weight_decay": 0.05, "momentum": 0.9,
               "nesterov": true, "ns_steps": 5, "adjust_lr": "match_rms_adamw", "lr_factors": factors}),
        json!({"variant": "torch", "lr": 0.02, "weight_decay": 0.0, "momentum": 0.95,
               "nesterov": false, "ns_steps": 5, "adjust_lr": "original", "lr_factors": factors}),
        json!({"variant": "keller", "lr": 0.02, "weight_decay": 0.01, "momentum": 0.95,
               "nesterov": true, "ns_steps": 5, "adjust_lr": null, "lr_factors": factors}),
        json!({"variant": "keller", "lr": 0.05, "weight_decay": 0.0, "momentum": 0.6,
               "nesterov": false, "ns_steps": 3, "adjust_lr": null, "lr_factors": factors}),
    ]
}

/// The plugin's settings for a case.
fn config_of(case: &Value) -> MuonConfig {
    let mut s = json!({
        "variant": case["variant"], "lr": case["lr"], "weight_decay": case["weight_decay"],
        "momentum": case["momentum"], "nesterov": case["nesterov"], "ns_steps": case["ns_steps"],
    });
    if !case["adjust_lr"].is_null() {
        s["adjust_lr"] = case["adjust_lr"].clone();
    }
    MuonConfig::from_settings(&settings_for::<muon::Muon>(&s.to_string())).unwrap()
}

fn get<'a>(tensors: &'a [(String, Tensor)], name: &str) -> &'a Tensor {
    tensors
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, t)| t)
        .unwrap_or_else(|| panic!("the reference file has no `{name}`"))
}

fn max_abs(t: &Tensor) -> f64 {
    t.abs().max().double_value(&[])
}

/// Runs the plugin's functional form over a case: the parameters after each step, by name.
/// `flag`: step through the masked path with a `found_inf` of 0.
fn plugin_steps(
    case: &Value,
    reference: &[(String, Tensor)],
    flag: bool,
) -> Vec<Vec<(String, Tensor)>> {
    let config = config_of(case);
    let params: Vec<(String, Tensor)> = PARAMS
        .iter()
        .map(|(n, _)| (n.to_string(), get(reference, &format!("init/{n}")).copy()))
        .collect();
    // Grouped as the method groups them: by shape.
    let mut groups: Vec<MatrixGroup> = Vec::new();
    for (n, shape) in PARAMS {
        match groups.iter_mut().find(|g| g.shape == shape) {
            Some(g) => g.names.push(n.to_owned()),
            None => groups.push(
                MatrixGroup::new(vec![n.to_owned()], shape.to_vec(), Kind::Float, Device::Cpu)
                    .unwrap(),
            ),
        }
    }
    let mut groups: Vec<MatrixGroup> = groups
        .into_iter()
        .map(|g| MatrixGroup::new(g.names, g.shape, Kind::Float, Device::Cpu).unwrap())
        .collect();
    let zero = Tensor::zeros([], (Kind::Float, Device::Cpu));
    let mut out = Vec::new();
    for (t, factor) in case["lr_factors"].as_array().unwrap().iter().enumerate() {
        let lr = case["lr"].as_f64().unwrap() * factor.as_f64().unwrap();
        for g in &mut groups {
            let ps: Vec<Tensor> = g
                .names
                .iter()
                .map(|n| get(&params, n).shallow_clone())
                .collect();
            let gs: Vec<Tensor> = g
                .names
                .iter()
                .map(|n| get(reference, &format!("grad/{t}/{n}")).copy())
                .collect();
            g.step(&ps, &gs, &config, lr, flag.then_some(&zero))
                .unwrap();
        }
        out.push(params.iter().map(|(n, p)| (n.clone(), p.copy())).collect());
    }
    out
}

/// Parameters after every step of every case against the references, for both variants.
///
/// Tolerance, per step on the parameters' change `Δ = W_t − W_{t−1}` (the gradients are the
/// script's, so momentum is the same on both sides and differences cannot compound): the
/// references run Newton–Schulz in bfloat16, whose rounding step is 2⁻⁸ of a value, and our
/// batched products (`baddbmm`) can round an element differently from torch's `addmm` or `@`.
/// Measured on this CPU: most steps agree to ~1e-8 (float32 rounding of the final add, the
/// same computation); a few differ where a bfloat16 rounding went the other way inside the
/// iteration, which the next iterations amplify (up to ~1 % of the update here, 3e-5). The
/// same reference with Newton–Schulz in float32 moves the step by 1–3 % of the update: that is
/// how well a bfloat16 Newton–Schulz is defined at all. So each step must lie within twice the
/// reference's own bfloat16-vs-float32 distance, and at least 90 % of all steps must agree to
/// 1e-6 (the same operations, not merely another equally rounded iteration). A wrong formula
/// (a missing rate adjustment, weight decay or Nesterov term, another momentum) moves the step
/// by a large fraction of itself, far beyond either.
#[test]
fn steps_match_torch_optim_muon_and_kellers_definition() {
    if !python_can_import("torch", "Muon against torch.optim.Muon") {
        return;
    }
    let dir = TempDir::new("muon-reference");
    let file = dir.path().join("reference.safetensors");
    let cases = cases();
    let out = python(&[
        "scripts/muon_reference.py",
        file.to_str().unwrap(),
        &Value::Array(cases.clone()).to_string(),
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out.status.success(),
        "the reference script failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reference = Tensor::read_safetensors(&file).unwrap();
    let (mut steps, mut same) = (0, 0);
    for (c, case) in cases.iter().enumerate() {
        let ours = plugin_steps(case, &reference, false);
        let masked = plugin_steps(case, &reference, true);
        for (t, step) in ours.iter().enumerate() {
            for (name, p) in step {
                let key = |tag: &str, t: usize| format!("c{c}/{tag}/{t}/{name}");
                let previous = |tag: &str| {
                    if t == 0 {
                        get(&reference, &format!("init/{name}")).shallow_clone()
                    } else {
                        get(&reference, &key(tag, t - 1)).shallow_clone()
                    }
                };
                let ours_before = if t == 0 {
                    previous("bf16")
                } else {
                    get(&ours[t - 1], name).shallow_clone()
                };
                let ours_delta = p - &ours_before;
                let ref_delta = get(&reference, &key("bf16", t)) - previous("bf16");
                let fp32_delta = get(&reference, &key("fp32", t)) - previous("fp32");
                let diff = max_abs(&(&ours_delta - &ref_delta));
                let update = max_abs(&ref_delta);
                let precision = max_abs(&(&fp32_delta - &ref_delta));
                println!(
                    "case {c} step {t} {name}: |Δours-Δref| {diff:.2e}, |Δref(fp32 NS)-Δref| {precision:.2e}, |Δref| {update:.2e}"
                );
                assert!(
                    diff <= 2.0 * precision,
                    "case {c} ({case}) step {t} `{name}`: our step differs from the reference's by {diff:e}, more than twice the reference's own bfloat16-vs-float32 distance {precision:e} (largest update element {update:e})"
                );
                steps += 1;
                if diff <= 1e-6 {
                    same += 1;
                }
                // The masked path with a zero flag is the same computation.
                let m = get(&masked[t], name);
                assert!(
                    m.equal(p),
                    "case {c} step {t} `{name}`: masked path differs"
                );
            }
        }
    }
    assert!(
        same * 10 >= steps * 9,
        "only {same} of {steps} steps agree with the references to 1e-6"
    );
}

// ---- through the binary ----

/// The CNN on Fashion-MNIST (SGD with momentum for what Muon leaves) with `muon` and
/// `settings`, `batches` batches on the CPU.
fn cnn(run: &str, settings: &str, batches: u32) -> TrainerToml {
    let mut toml = TrainerToml::new(run).algorithm("muon", settings);
    toml.max_duration = format!("{batches}ba");
    toml.device = Some("cpu".to_owned());
    toml
}

/// The tiny GPT (AdamW for what Muon leaves) with `muon` and `settings`.
fn gpt(run: &str, settings: &str, batches: u32) -> TrainerToml {
    let mut toml = TrainerToml::tiny_gpt(run).algorithm("muon", settings);
    toml.max_duration = format!("{batches}ba");
    toml.device = Some("cpu".to_owned());
    toml
}

/// Trains `toml` in `dir` with a checkpoint at the end (and every `every` batches); returns
/// the training losses and the output.
fn train_run(
    dir: &TempDir,
    toml: &TrainerToml,
    every: &str,
    env: &[(&str, &str)],
) -> (Vec<f64>, Output) {
    dir.write(
        "trainer.toml",
        &format!("{}\n[checkpoint]\ninterval = \"{every}\"\n", toml.render()),
    );
    let out = train(dir, &[], env);
    out.assert_success();
    let lines = read_jsonl(&run_dir(dir, &toml.run_name).join("metrics.jsonl"));
    (train_losses(&lines), out)
}

fn checkpoint(dir: &TempDir, run: &str, name: &str) -> tessera::checkpoint::Checkpoint {
    let path = run_dir(dir, run).join("checkpoints").join(name);
    tessera::checkpoint::Checkpoint::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The parameters Muon's state holds momentum for (`method/muon/<name>`), with their momentum.
fn momentum(c: &tessera::checkpoint::Checkpoint) -> Vec<(String, Tensor)> {
    c.tensors
        .iter()
        .filter_map(|(n, t)| {
            n.strip_prefix("method/muon/")
                .map(|n| (n.to_owned(), t.shallow_clone()))
        })
        .filter(|(n, _)| !n.starts_with("__"))
        .collect()
}

/// Muon trains exactly `claimed ∪ left == every ≥2-D model parameter` with `left` the
/// expected ones; the host optimizer's state mentions no claimed parameter but some others; the
/// momentum has each parameter's shape and has moved; the log names the parameters.
fn assert_ownership(c: &tessera::checkpoint::Checkpoint, left: &[&str], out: &Output) {
    let claimed = momentum(c);
    let matrices: Vec<(String, Vec<i64>)> = c
        .tensors
        .iter()
        .filter_map(|(n, t)| n.strip_prefix("model/").map(|n| (n.to_owned(), t.size())))
        .filter(|(_, s)| s.len() >= 2)
        .collect();
    let mut not_claimed: Vec<&str> = matrices
        .iter()
        .filter(|(n, _)| !claimed.iter().any(|(c, _)| c == n))
        .map(|(n, _)| n.as_str())
        .collect();
    not_claimed.sort_unstable();
    let mut expected = left.to_vec();
    expected.sort_unstable();
    assert_eq!(
        not_claimed,
        expected,
        "claimed: {:?}",
        claimed.iter().map(|c| &c.0).collect::<Vec<_>>()
    );
    for (name, m) in &claimed {
        let shape = &matrices
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("{name} is no model matrix"))
            .1;
        assert_eq!(&m.size(), shape, "{name}");
        assert!(
            m.abs().sum(Kind::Double).double_value(&[]) > 0.0,
            "{name}: momentum never moved"
        );
        assert!(
            out.stderr.contains(name.as_str()),
            "the log does not name {name}: {}",
            out.dump()
        );
    }
    let optim: Vec<&str> = c
        .tensors
        .iter()
        .filter_map(|(n, _)| n.strip_prefix("optim/"))
        .collect();
    assert!(!optim.is_empty(), "the host optimizer keeps no state");
    for (name, _) in &claimed {
        assert!(
            !optim.iter().any(|o| o.contains(name.as_str())),
            "the host optimizer keeps state for {name}, which Muon trains: {optim:?}"
        );
    }
    assert!(
        out.stderr
            .contains("parameters are updated by methods: muon"),
        "{}",
        out.dump()
    );
}

/// Mean of the first and of the last `n` losses.
fn first_and_last(losses: &[f64], n: usize) -> (f64, f64) {
    assert!(losses.len() >= 2 * n, "{losses:?}");
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
    (mean(&losses[..n]), mean(&losses[losses.len() - n..]))
}

#[test]
fn the_cnn_trains_with_muon_for_its_matrices_and_sgd_for_the_rest() {
    require_fashion_mnist();
    let dir = TempDir::new("muon-cnn");
    for (run, settings) in [("torch", "lr = 0.02"), ("keller", "variant = \"keller\"")] {
        let (losses, out) = train_run(&dir, &cnn(run, settings, 12), "12ba", &[]);
        let (first, last) = first_and_last(&losses, 3);
        assert!(last < 0.8 * first, "{run}: losses {losses:?}");
        let c = checkpoint(&dir, run, "ep0-ba12.ckpt");
        // The CNN's head is its last linear layer: SGD trains it, Muon every other matrix.
        let heads: Vec<String> = momentum(&c).iter().map(|(n, _)| n.clone()).collect();
        assert!(heads.len() >= 2, "{heads:?}");
        let head = c
            .tensors
            .iter()
            .filter_map(|(n, t)| n.strip_prefix("model/").filter(|_| t.size().len() >= 2))
            .filter(|n| !heads.iter().any(|h| h == n))
            .map(str::to_owned)
            .collect::<Vec<_>>();
        assert_eq!(
            head.len(),
            1,
            "expected only the head left to SGD: {head:?}"
        );
        assert_ownership(&c, &[head[0].as_str()], &out);
    }
}

#[test]
fn the_tiny_gpt_trains_with_muon_for_its_blocks_and_adamw_for_the_rest() {
    let dir = TempDir::new("muon-gpt");
    let (losses, out) = train_run(&dir, &gpt("gpt", "variant = \"keller\"", 20), "20ba", &[]);
    let (first, last) = first_and_last(&losses, 4);
    assert!(last < 0.9 * first, "losses {losses:?}");
    let c = checkpoint(&dir, "gpt", "ep0-ba20.ckpt");
    // Tied head: the embeddings are the only matrices left to AdamW.
    assert_ownership(
        &c,
        &["transformer.wpe.weight", "transformer.wte.weight"],
        &out,
    );
}

#[test]
fn settings_that_select_nothing_are_refused_naming_the_key() {
    // Found at init, against the model's parameters (the settings `create` refuses are in
    // tests/methods/table.rs).
    let dir = TempDir::new("muon-settings");
    for (settings, words) in [
        (
            "exclude = [\"*\"]",
            &["no parameter selected", "exclude"][..],
        ),
        ("include = [\"nothing.*\"]", &["include", "nothing.*"][..]),
    ] {
        gpt("bad", settings, 2).write_to(&dir);
        train(&dir, &[], &[]).assert_failure(words);
    }
}

/// A NaN loss at batch 3 with `nonfinite_loss = "skip"`: the host skips its step and Muon
/// skips its own: the claimed parameters and their momentum are the same bit for bit after
/// batch 3 as after batch 2, and move in the steps around it. Under `amp_fp16` on the CPU, so
/// the flag also carries the loss scaler's verdict.
#[test]
fn a_skipped_step_leaves_the_claimed_parameters_and_momentum_alone() {
    require_fashion_mnist();
    let dir = TempDir::new("muon-skip");
    let mut toml = cnn("skip", "lr = 0.02\nweight_decay = 0.1", 4).algorithm("fake_plugin", "");
    toml.precision = Some("amp_fp16".to_owned());
    dir.write(
        "trainer.toml",
        &format!("{}\n[checkpoint]\ninterval = \"1ba\"\n", toml.render()),
    );
    let out = train(
        &dir,
        &["train.nonfinite_loss=\"skip\""],
        &[("TESSERA_FAKE_NAN_AT_BATCH", "3")],
    );
    out.assert_success();
    let at = |b: u32| checkpoint(&dir, "skip", &format!("ep0-ba{b}.ckpt"));
    let (c1, c2, c3, c4) = (at(1), at(2), at(3), at(4));
    let claimed = momentum(&c2);
    assert!(!claimed.is_empty());
    let model = |c: &tessera::checkpoint::Checkpoint, n: &str| {
        c.tensors
            .iter()
            .find(|(m, _)| m == &format!("model/{n}"))
            .map(|(_, t)| t.shallow_clone())
            .unwrap_or_else(|| panic!("no model/{n}"))
    };
    let mom = |c: &tessera::checkpoint::Checkpoint, n: &str| {
        momentum(c)
            .into_iter()
            .find(|(m, _)| m == n)
            .map(|(_, t)| t)
            .unwrap_or_else(|| panic!("no momentum for {n}"))
    };
    for (name, _) in &claimed {
        assert!(
            model(&c3, name).equal(&model(&c2, name)),
            "{name} moved in the skipped step"
        );
        assert!(
            mom(&c3, name).equal(&mom(&c2, name)),
            "{name}'s momentum moved in the skipped step"
        );
        assert!(
            !model(&c2, name).equal(&model(&c1, name)),
            "{name} did not move at batch 2"
        );
        assert!(
            !model(&c4, name).equal(&model(&c3, name)),
            "{name} did not move at batch 4"
        );
        assert!(
            !mom(&c4, name).equal(&mom(&c3, name)),
            "{name}'s momentum did not move at batch 4"
        );
    }
    let record = read_json(&run_dir(&dir, "skip").join("run.json"));
    assert_eq!(record["skipped_steps"], 1, "{record:#}");
}

/// Two and three ranks share the orthogonalization (plugin-api 1.9 `all_gather`): rank 0
/// (the one that logs) does some of the matrices and not all (the unit tests of `muon::Plan`
/// show every matrix has exactly one rank); the weights and momentum end bit for bit where they
/// end when every rank computes every matrix (`share_across_ranks = false`), which is also
/// what the log says then.
#[test]
fn ranks_share_the_orthogonalization_and_train_as_when_each_does_all() {
    let mut toml = gpt("shared", "lr = 0.02", 6);
    toml.model = toml.model.replace("n_layer = 2", "n_layer = 3");
    let dir = TempDir::new("muon-share");
    dir.write(
        "trainer.toml",
        &format!("{}\n[checkpoint]\ninterval = \"6ba\"\n", toml.render()),
    );
    let share = |out: &Output| -> (usize, usize) {
        let line = out
            .stderr
            .lines()
            .find(|l| l.contains("muon: rank "))
            .unwrap_or_else(|| panic!("no share in the log: {}", out.dump()));
        let words: Vec<&str> = line.split_whitespace().collect();
        let at = words
            .iter()
            .position(|w| *w == "orthogonalizes")
            .expect("the word");
        let n = |w: &str| w.parse::<usize>().unwrap_or_else(|_| panic!("{line}"));
        (n(words[at + 1]), n(words[at + 4]))
    };
    for world in [2, 3] {
        let shared = format!("shared{world}");
        let whole = format!("whole{world}");
        let outputs = train_ranks(&dir, world, &[&format!("run_name={shared}")]);
        assert_all_succeeded(&outputs);
        let (mine, total) = share(&outputs[0]);
        assert_eq!(total, 12, "{}", outputs[0].dump());
        assert!(
            mine > 0 && mine < total,
            "rank 0 of {world} orthogonalizes {mine} of {total}"
        );
        let metrics = read_jsonl(&run_dir(&dir, &shared).join("metrics.jsonl"));
        assert!(
            metrics
                .iter()
                .any(|m| m["name"] == "muon/orthogonalized"
                    && m["value"].as_f64() == Some(mine as f64)),
            "no muon/orthogonalized metric"
        );
        let outputs = train_ranks(
            &dir,
            world,
            &[
                &format!("run_name={whole}"),
                "algorithms.0.share_across_ranks=false",
            ],
        );
        assert_all_succeeded(&outputs);
        assert_eq!(share(&outputs[0]), (total, total), "{}", outputs[0].dump());
        let ckpt = |run: &str| run_dir(&dir, run).join("checkpoints").join("ep0-ba6.ckpt");
        let (diff, name) = max_difference(&ckpt(&shared), &ckpt(&whole), &["model/", "method/"]);
        assert_eq!(diff, 0.0, "{world} ranks: {name} differs");
    }
}
