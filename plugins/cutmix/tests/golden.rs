//! CutMix against Composer's golden outputs (`tests/golden/cutmix.*`).
//!
//! Everything is read from the JSON and safetensors files: `cutmix_batch` with an explicit box
//! and permutation (square and non-square images, showing that `x` indexes H and `y` W), the
//! `_rand_bbox` table (columns named in its description), the `length = 0.5` run and the
//! `CutMix.apply` run with the boxes and permutations Composer drew. Composer's own draws
//! (numpy, torch) cannot be reproduced; the method's are checked against the invariants.

use cutmix::{
    adjusted_lambda, box_sides, centre_range, cutmix_batch, is_pixel_target, length_lambda,
    mix_losses, mix_targets, paste_target_box, rand_bbox, BBox, CutMix,
};
use serde_json::Value;
use tessera_plugin_api::tch::{Kind, Reduction, Tensor};
use tessera_plugin_api::testing::golden::{assert_close, Golden};
use tessera_plugin_api::testing::{default_settings_json, settings, RandomSource, TestHost};
use tessera_plugin_api::{boxed_method, keys, Context, ErrorKind, Event, Hook, Plugin};

const CASE: &str = "cutmix";

fn result<'a>(g: &'a Golden, name: &str) -> &'a Value {
    let v = &g.json["results"][name];
    assert!(!v.is_null(), "results.{name} is missing");
    v
}

fn bbox_of(v: &Value) -> BBox {
    let [x1, y1, x2, y2]: [i64; 4] =
        serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("bbox {v}: {e}"));
    BBox { x1, y1, x2, y2 }
}

fn cross_entropy(logits: &Tensor, target: &Tensor) -> Tensor {
    logits.cross_entropy_loss::<Tensor>(target, None, Reduction::Mean, -100, 0.0)
}

/// Composer's `soft_cross_entropy` for rows that sum to one.
fn soft_cross_entropy(logits: &Tensor, target: &Tensor) -> Tensor {
    (logits.log_softmax(1, Kind::Float) * target)
        .sum_dim_intlist(1, false, Kind::Float)
        .neg()
        .mean(Kind::Float)
}

/// Checks Composer's invariants for `out = cutmix(input)` with `bbox` and `perm`: outside
/// the box every pixel is unchanged; inside, sample i holds sample perm[i]'s pixels.
fn assert_pasted(what: &str, input: &Tensor, out: &Tensor, bbox: BBox, perm: &Tensor) {
    let size = input.size();
    let inside = Tensor::zeros([size[2], size[3]], (Kind::Bool, input.device()));
    if bbox.area() > 0 {
        let _ = inside
            .narrow(0, bbox.x1, bbox.x2 - bbox.x1)
            .narrow(1, bbox.y1, bbox.y2 - bbox.y1)
            .fill_(1);
    }
    let want = input.index_select(0, perm).where_self(&inside, input);
    assert!(
        out.equal(&want),
        "{what}: not input outside the box and input[perm] inside"
    );
}

#[test]
fn explicit_box_and_permutation_give_composers_outputs() {
    let g = Golden::load(CASE);
    let bbox = bbox_of(&g.json["hyperparameters"]["bbox"]);
    assert_eq!(bbox_of(result(&g, "returned_bbox")), bbox);
    let (x, y, idx) = (g.tensor("input"), g.tensor("target"), g.tensor("indices"));
    let (out, y_perm, lambda) = cutmix_batch(x, y, bbox, idx).unwrap();
    assert!(out.equal(g.tensor("x_cutmix")), "x_cutmix");
    assert_pasted("x_cutmix", x, &out, bbox, idx);
    assert!(y_perm.equal(g.tensor("target_perm")), "target_perm");
    assert_eq!(lambda, result(&g, "adjusted_lambda").as_f64().unwrap());
    // Invariant: the adjusted lambda is the kept share of the image, exactly.
    let s = x.size();
    assert_eq!(lambda, 1.0 - bbox.area() as f64 / (s[2] * s[3]) as f64);

    let logits = g.tensor("logits");
    let c = g.json["hyperparameters"]["num_classes"].as_i64().unwrap();
    assert_eq!(logits.size()[1], c, "the classes are the logits' width");
    let target = mix_targets(logits, y, &y_perm, lambda).unwrap();
    assert_close(
        "mixed_target",
        &target,
        g.tensor("mixed_target"),
        1e-6,
        1e-7,
    );
    assert_close(
        "loss_mixed",
        &soft_cross_entropy(logits, &target),
        g.tensor("loss_mixed"),
        1e-6,
        1e-7,
    );
    // interpolate_loss gives the same loss (cross-entropy is linear in the target).
    let interpolated = mix_losses(
        &cross_entropy(logits, y),
        &cross_entropy(logits, &y_perm),
        lambda,
    )
    .unwrap();
    assert_close(
        "interpolated loss",
        &interpolated,
        g.tensor("loss_mixed"),
        1e-6,
        1e-7,
    );
}

#[test]
fn non_square_images_cut_rows_of_h_and_columns_of_w() {
    let g = Golden::load(CASE);
    let name = "nonsquare/x_cutmix";
    // The description names the box, "bbox (x1,y1,x2,y2): ... swapped between samples".
    let desc = g.entries()[name]["desc"].as_str().expect("desc");
    let inner = desc
        .split_once("bbox (")
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(inner, _)| inner)
        .unwrap_or_else(|| panic!("no bbox in `{desc}`"));
    let bbox = bbox_of(&serde_json::from_str(&format!("[{inner}]")).expect("bbox numbers"));
    assert!(desc.contains("swapped"), "{desc}");
    let x = g.tensor("nonsquare/input");
    let s = x.size();
    assert_eq!(s[0], 2, "two samples swap");
    assert_ne!(s[2], s[3], "not square");
    let swap = Tensor::from_slice(&[1i64, 0]);
    let (out, _, lambda) = cutmix_batch(x, &Tensor::from_slice(&[0i64, 1]), bbox, &swap).unwrap();
    assert!(out.equal(g.tensor(name)), "{name}");
    assert_pasted(name, x, &out, bbox, &swap);
    assert_eq!(
        lambda,
        result(&g, "nonsquare_adjusted_lambda").as_f64().unwrap()
    );
}

#[test]
fn rand_bbox_table() {
    let g = Golden::load(CASE);
    let name = "rand_bbox_table";
    let desc = g.entries()[name]["desc"].as_str().expect("desc");
    let columns: Vec<&str> = desc
        .split_once("rows:")
        .and_then(|(_, rest)| rest.split(" from ").next())
        .expect("the table description names its columns")
        .split(',')
        .map(|c| c.trim().split('(').next().unwrap_or("").trim())
        .collect();
    let col = |n: &str| {
        columns
            .iter()
            .position(|c| *c == n)
            .unwrap_or_else(|| panic!("no `{n}` column in {columns:?}"))
    };
    let rows: Vec<Vec<f64>> = Vec::try_from(g.tensor(name)).expect("float64 table");
    assert!(!rows.is_empty());
    for r in rows {
        let int = |n: &str| {
            let v = r[col(n)];
            assert_eq!(v, v.trunc(), "{n} = {v} is not an integer");
            v as i64
        };
        let got = rand_bbox(int("W"), int("H"), r[col("lambda")], int("cx"), int("cy"));
        let want = BBox {
            x1: int("bbx1"),
            y1: int("bby1"),
            x2: int("bbx2"),
            y2: int("bby2"),
        };
        assert_eq!(got, want, "row {r:?}");
    }
}

#[test]
fn length_box_follows_composers_lambda_quirk() {
    // cutmix_batch(length = 0.5) turns the length into the box's share of the image and passes
    // it to _rand_bbox, which reads it as the share kept. Numpy drew the centre; some centre
    // must give the recorded box, and that box with the case's permutation gives the output.
    let g = Golden::load(CASE);
    let (x, y, idx) = (g.tensor("input"), g.tensor("target"), g.tensor("indices"));
    let s = x.size();
    let (w, h) = (s[2], s[3]);
    let lambda = length_lambda(s[2], s[3], 0.5);
    let want = bbox_of(result(&g, "length0p5_bbox"));
    let (cut_w, cut_h) = box_sides(w, h, lambda);
    assert!(
        cut_w > w / 2,
        "the box side is not length·W but int(W·√(1−λ)) = {cut_w}"
    );
    let (xlo, xhi) = centre_range(w, cut_w, false);
    let (ylo, yhi) = centre_range(h, cut_h, false);
    let found = (xlo..xhi)
        .flat_map(|cx| (ylo..yhi).map(move |cy| (cx, cy)))
        .any(|(cx, cy)| rand_bbox(w, h, lambda, cx, cy) == want);
    assert!(found, "no centre gives {want:?}");
    let (out, _, adjusted) = cutmix_batch(x, y, want, idx).unwrap();
    assert!(
        out.equal(g.tensor("length0p5/x_cutmix")),
        "length0p5/x_cutmix"
    );
    assert_eq!(
        adjusted,
        result(&g, "length0p5_adjusted_lambda").as_f64().unwrap()
    );
}

#[test]
fn recorded_algorithm_draw_gives_composers_outputs() {
    let g = Golden::load(CASE);
    let (x, y, logits) = (g.tensor("input"), g.tensor("target"), g.tensor("logits"));
    let bbox = bbox_of(result(&g, "alg_bbox"));
    let perm = g.tensor("alg/indices");
    let (out, y_perm, lambda) = cutmix_batch(x, y, bbox, perm).unwrap();
    assert!(out.equal(g.tensor("alg/x_cutmix")), "alg/x_cutmix");
    assert_eq!(lambda, result(&g, "alg_adjusted_lambda").as_f64().unwrap());
    let target = mix_targets(logits, y, &y_perm, lambda).unwrap();
    assert_close(
        "alg/mixed_target",
        &target,
        g.tensor("alg/mixed_target"),
        1e-6,
        1e-7,
    );
}

// ------------------------------------------------------------------------------------------
// The method, driven through its events
// ------------------------------------------------------------------------------------------

#[test]
fn hooks_defaults_and_bad_settings() {
    assert_eq!(CutMix::NAME, "cutmix");
    assert_eq!(
        CutMix::hooks(),
        vec![
            Hook::at(Event::BEFORE_FORWARD),
            Hook::at(Event::BEFORE_LOSS),
            Hook::at(Event::BEFORE_BACKWARD)
        ]
    );
    // Composer's defaults: alpha 1, interpolate_loss and uniform_sampling False.
    let defaults: Value =
        serde_json::from_str(&default_settings_json(CutMix::DEFAULT_SETTINGS)).unwrap();
    assert_eq!(
        defaults,
        serde_json::json!({"alpha": 1.0, "interpolate_loss": false, "uniform_sampling": false})
    );
    for (json, fragment) in [
        (r#"{"alpha": -1}"#, "`alpha` must be a finite number >= 0"),
        (r#"{"uniform_sampling": "no"}"#, "uniform_sampling"),
        (r#"{"length": 0.5}"#, "length"),
    ] {
        let err = match boxed_method::<CutMix>(&settings(json)) {
            Ok(_) => panic!("{json} was accepted"),
            Err(e) => e,
        };
        assert_eq!(err.kind(), ErrorKind::CONFIG, "{json}: {err}");
        assert!(err.message().contains(fragment), "{json}: {err}");
    }
}

/// Fires `before_forward` and `before_loss` on the golden batch with a host seeded by `seed`.
fn run_method(g: &Golden, json: &str, seed: u64) -> TestHost {
    let mut m = boxed_method::<CutMix>(&settings(json)).unwrap();
    let mut host = TestHost::new(RandomSource::Seeded(seed))
        .with(keys::INPUT, g.tensor("input"))
        .with(keys::TARGET, g.tensor("target"));
    host.fire(&mut m, Event::BEFORE_FORWARD).unwrap();
    host.tensors
        .insert(keys::OUTPUT.to_owned(), g.tensor("logits").copy());
    host.fire(&mut m, Event::BEFORE_LOSS).unwrap();
    host
}

#[test]
fn method_pastes_its_own_box_and_mixes_targets_by_area() {
    let g = Golden::load(CASE);
    let (x, y, logits) = (g.tensor("input"), g.tensor("target"), g.tensor("logits"));
    let s = x.size();
    for (json, uniform) in [("{}", false), (r#"{"uniform_sampling": true}"#, true)] {
        for seed in 0..20u64 {
            let host = run_method(&g, json, seed);
            // Replay the host's stream in Composer's order: permutation, lambda, cx, cy.
            let mut replay = TestHost::new(RandomSource::Seeded(seed));
            // SAFETY: the handle is used only while `replay` is borrowed here.
            let mut ctx = unsafe { Context::from_host(replay.handle()) };
            let perm = Tensor::from_slice(&ctx.rng_permutation(s[0] as usize));
            let lambda = ctx.rng_beta(1.0, 1.0);
            let (cut_w, cut_h) = box_sides(s[2], s[3], lambda);
            let (xlo, xhi) = centre_range(s[2], cut_w, uniform);
            let (ylo, yhi) = centre_range(s[3], cut_h, uniform);
            let cx = xlo + ctx.rng_below((xhi - xlo) as u64) as i64;
            let cy = ylo + ctx.rng_below((yhi - ylo) as u64) as i64;
            let bbox = rand_bbox(s[2], s[3], lambda, cx, cy);
            let out = host.get(keys::INPUT);
            assert_pasted(&format!("{json} seed {seed}"), x, out, bbox, &perm);
            let adjusted = adjusted_lambda(s[2], s[3], bbox);
            assert_eq!(host.metric("cutmix/lambda"), vec![adjusted]);
            let y_perm = y.index_select(0, &perm);
            let want = mix_targets(logits, y, &y_perm, adjusted).unwrap();
            assert!(host.get(keys::TARGET).equal(&want), "seed {seed}: target");
        }
    }
    // Same seed, same batch; the draws differ between seeds.
    let a = run_method(&g, "{}", 4);
    assert!(run_method(&g, "{}", 4)
        .get(keys::INPUT)
        .equal(a.get(keys::INPUT)));
    let lambdas: Vec<f64> = (0..8)
        .map(|seed| run_method(&g, "{}", seed).metric("cutmix/lambda")[0])
        .collect();
    assert!(lambdas.windows(2).any(|w| w[0] != w[1]), "{lambdas:?}");
}

#[test]
fn alpha_zero_cuts_the_whole_image() {
    // Composer: alpha = 0 gives lambda = 0, a box of the full side around a random centre,
    // clipped; the kept share is what the clipped box leaves.
    let g = Golden::load(CASE);
    let host = run_method(&g, r#"{"alpha": 0}"#, 2);
    let lambda = host.metric("cutmix/lambda")[0];
    let t = host.get(keys::TARGET);
    let own = t.gather(1, &g.tensor("target").unsqueeze(1), false);
    assert!(
        own.ge(lambda - 1e-6).all().int64_value(&[]) == 1,
        "{lambda}"
    );
    assert!(lambda < 1.0, "a box was cut");
}

#[test]
fn pixel_targets_get_the_box_pasted() {
    let x = Tensor::arange(
        2 * 6 * 8,
        (Kind::Float, tessera_plugin_api::tch::Device::Cpu),
    )
    .view([2, 1, 6, 8]);
    let seg = Tensor::arange(
        2 * 6 * 8,
        (Kind::Int64, tessera_plugin_api::tch::Device::Cpu),
    )
    .view([2, 6, 8]);
    assert!(is_pixel_target(&seg, &x));
    assert!(!is_pixel_target(&Tensor::from_slice(&[0i64, 1]), &x));
    let bbox = BBox {
        x1: 1,
        y1: 2,
        x2: 4,
        y2: 7,
    };
    let swap = Tensor::from_slice(&[1i64, 0]);
    let pasted = paste_target_box(&seg, &seg.index_select(0, &swap), bbox).unwrap();
    let (out, _, _) = cutmix_batch(&x, &seg, bbox, &swap).unwrap();
    // The per-pixel target moves exactly as the pixels do.
    assert!(pasted.unsqueeze(1).to_kind(Kind::Float).equal(&out));
    // Through the method, with interpolate_loss refused for such targets.
    let mut m = boxed_method::<CutMix>(&settings(r#"{"interpolate_loss": true}"#)).unwrap();
    let mut host = TestHost::new(RandomSource::Seeded(0))
        .with(keys::INPUT, &x)
        .with(keys::TARGET, &seg);
    host.fire(&mut m, Event::BEFORE_FORWARD).unwrap();
    let err = host.fire(&mut m, Event::BEFORE_BACKWARD).unwrap_err();
    assert!(err.contains("interpolate_loss"), "{err}");
}
