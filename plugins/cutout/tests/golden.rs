//! CutOut against Composer's golden outputs (`tests/golden/cutout.*`).
//!
//! Everything is read from the JSON and safetensors files: the `_generate_mask` table (columns
//! named in its description) with its masks, and the seeded `cutout_batch` runs listed in
//! `results.cutout_batch_runs` with the centres numpy drew. Outputs must match exactly.

use std::collections::VecDeque;

use cutout::{centre_range, cutout_batch, cutout_mask, hole_length, zero_hole, CutOut};
use serde_json::Value;
use tessera_plugin_api::tch::{Device, Kind, Tensor};
use tessera_plugin_api::testing::golden::Golden;
use tessera_plugin_api::testing::{default_settings_json, settings, settings_for};
use tessera_plugin_api::testing::{splitmix64, RandomSource, TestHost};
use tessera_plugin_api::{boxed_method, keys, ErrorKind, Event, Hook, Plugin};

const CASE: &str = "cutout";

/// One recorded `cutout_batch` run.
struct Run {
    key: String,
    num_holes: u64,
    length: f64,
    length_px: i64,
    uniform_sampling: bool,
    /// `(x, y)`: x over W, y over H.
    centres: Vec<(i64, i64)>,
    kept_fraction: f64,
}

fn runs(g: &Golden) -> Vec<Run> {
    let runs = g.json["results"]["cutout_batch_runs"]
        .as_array()
        .expect("results.cutout_batch_runs");
    assert!(!runs.is_empty(), "no cutout_batch runs");
    runs.iter()
        .map(|r| {
            let field = |name: &str| -> &Value {
                r.get(name)
                    .unwrap_or_else(|| panic!("a cutout_batch run has no `{name}`: {r}"))
            };
            let key = field("key").as_str().expect("key").to_owned();
            let centres: Vec<(i64, i64)> =
                serde_json::from_value::<Vec<[i64; 2]>>(field("centres_xy").clone())
                    .expect("centres_xy")
                    .into_iter()
                    .map(|[x, y]| (x, y))
                    .collect();
            let run = Run {
                num_holes: field("num_holes").as_u64().expect("num_holes"),
                length: field("length").as_f64().expect("length"),
                length_px: field("length_px").as_i64().expect("length_px"),
                uniform_sampling: field("uniform_sampling")
                    .as_bool()
                    .expect("uniform_sampling"),
                kept_fraction: field("kept_fraction").as_f64().expect("kept_fraction"),
                centres,
                key,
            };
            // The key repeats the settings: out/holes=..,length=..,uniform=..,seed=..
            let params = tessera_plugin_api::testing::golden::parse_params(
                run.key
                    .split_once('/')
                    .unwrap_or_else(|| panic!("run key `{}` has no `/`", run.key))
                    .1,
            );
            assert_eq!(
                params["holes"].parse::<u64>().unwrap(),
                run.num_holes,
                "{}",
                run.key
            );
            assert_eq!(
                params["length"].parse::<f64>().unwrap(),
                run.length,
                "{}",
                run.key
            );
            assert_eq!(
                params["uniform"] == "1",
                run.uniform_sampling,
                "{}",
                run.key
            );
            assert_eq!(run.centres.len() as u64, run.num_holes, "{}", run.key);
            run
        })
        .collect()
}

/// The one tensor whose role is `input`.
fn input(g: &Golden) -> &Tensor {
    let inputs = g.names_with_role("input");
    assert_eq!(inputs.len(), 1, "expected one input tensor, got {inputs:?}");
    g.tensor(&inputs[0])
}

fn hw(t: &Tensor) -> (i64, i64) {
    let s = t.size();
    (s[s.len() - 2], s[s.len() - 1])
}

fn settings_json(num_holes: u64, length: f64, uniform: bool) -> String {
    format!(r#"{{"num_holes": {num_holes}, "length": {length}, "uniform_sampling": {uniform}}}"#)
}

#[test]
fn generate_mask_table_and_masks() {
    let g = Golden::load(CASE);
    let table_name = "generate_mask/table";
    let table = g.tensor(table_name);
    let masks = g.tensor("generate_mask/masks");
    // Column names come from the description: "rows: width, height, x, ... for _generate_mask(..)".
    let desc = g.entries()[table_name]["desc"]
        .as_str()
        .expect("table desc");
    let columns: Vec<&str> = desc
        .split_once("rows:")
        .and_then(|(_, rest)| rest.split(" for ").next())
        .expect("the table description names its columns")
        .split(',')
        .map(str::trim)
        .collect();
    let col = |name: &str| {
        columns
            .iter()
            .position(|c| *c == name)
            .unwrap_or_else(|| panic!("table has no `{name}` column: {columns:?}"))
    };
    let (cw, ch, cx, cy, cl, cz) = (
        col("width"),
        col("height"),
        col("x"),
        col("y"),
        col("length_px"),
        col("zeros_in_mask"),
    );
    let rows: Vec<Vec<i64>> = Vec::try_from(table).expect("int64 table");
    assert_eq!(rows.len() as i64, masks.size()[0], "one mask per table row");
    let (canvas_h, canvas_w) = hw(masks);
    for (i, row) in rows.iter().enumerate() {
        let (w, h, x, y, len, zeros) = (row[cw], row[ch], row[cx], row[cy], row[cl], row[cz]);
        let what = format!("row {i} (w={w}, h={h}, x={x}, y={y}, L={len})");
        assert!(
            h <= canvas_h && w <= canvas_w,
            "{what}: larger than the canvas"
        );
        let ours = cutout_mask(h, w, &[(x, y)], len);
        let mut direct = vec![1.0f32; (h * w) as usize];
        zero_hole(&mut direct, w, h, x, y, len);
        assert_eq!(ours, direct, "{what}: cutout_mask != zero_hole on ones");
        let canvas = masks.get(i as i64);
        let want = canvas.narrow(0, 0, h).narrow(1, 0, w);
        let ours_t = Tensor::from_slice(&ours).view([h, w]);
        assert!(
            ours_t.equal(&want),
            "{what}: mask differs\nours {ours_t}\nwant {want}"
        );
        assert_eq!(
            ours.iter().filter(|&&v| v == 0.0).count() as i64,
            zeros,
            "{what}: zero count"
        );
        // Outside the h x w image the canvas is padding (-1).
        let outside = canvas.ne(-1.0).sum(Kind::Int64).int64_value(&[]);
        assert_eq!(outside, h * w, "{what}: padding outside the image");
    }
}

#[test]
fn cutout_batch_runs_reproduce_composer() {
    let g = Golden::load(CASE);
    let x = input(&g);
    let (h, w) = hw(x);
    let runs = runs(&g);
    // Every recorded output has its run (nothing is silently skipped).
    for name in g.names_with_role("output") {
        if name.starts_with("out/") {
            assert!(
                runs.iter().any(|r| r.key == name),
                "no run recorded for {name}"
            );
        }
    }
    for run in &runs {
        let key = &run.key;
        let len = hole_length(h, w, run.length);
        assert_eq!(len, run.length_px, "{key}: hole length");
        let (ylo, yhi) = centre_range(h, len, run.uniform_sampling);
        let (xlo, xhi) = centre_range(w, len, run.uniform_sampling);
        for &(cx, cy) in &run.centres {
            assert!(
                (ylo..yhi).contains(&cy),
                "{key}: y={cy} outside [{ylo}, {yhi})"
            );
            assert!(
                (xlo..xhi).contains(&cx),
                "{key}: x={cx} outside [{xlo}, {xhi})"
            );
        }
        let out = cutout_batch(x, &run.centres, len).unwrap();
        let want = g.tensor(key);
        assert_eq!(out.kind(), want.kind(), "{key}: kind");
        assert!(out.equal(want), "{key}: output differs from Composer's");
        let kept = out
            .ne(0.0)
            .to_kind(Kind::Double)
            .mean(Kind::Double)
            .double_value(&[]);
        assert!(
            (kept - run.kept_fraction).abs() <= 1e-6,
            "{key}: kept fraction {kept}"
        );
    }
}

/// The values the host's RNG must return so that `rng_below(n)` yields `v` (any `v < n` is
/// returned as is) for Composer's draws: per hole, y then x, each offset by its range's start.
fn scripted_draws(run: &Run, h: i64, w: i64, len: i64) -> VecDeque<u64> {
    let (ylo, _) = centre_range(h, len, run.uniform_sampling);
    let (xlo, _) = centre_range(w, len, run.uniform_sampling);
    run.centres
        .iter()
        .flat_map(|&(x, y)| [(y - ylo) as u64, (x - xlo) as u64])
        .collect()
}

#[test]
fn method_reproduces_the_runs_from_the_recorded_draws() {
    let g = Golden::load(CASE);
    let x = input(&g);
    let (h, w) = hw(x);
    let defaults = default_settings_json(CutOut::DEFAULT_SETTINGS);
    let defaults_value: Value = serde_json::from_str(&defaults).unwrap();
    for run in runs(&g) {
        let len = hole_length(h, w, run.length);
        let json = settings_json(run.num_holes, run.length, run.uniform_sampling);
        let mut configs = vec![json.clone()];
        if serde_json::from_str::<Value>(&json).unwrap() == defaults_value {
            configs.push("{}".to_owned());
            configs.push(defaults.clone());
        }
        for config in configs {
            let what = format!("{} with settings {config}", run.key);
            let mut method = boxed_method::<CutOut>(&settings(&config))
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let draws = scripted_draws(&run, h, w, len);
            let expected_draws = draws.len();
            let mut host = TestHost::new(RandomSource::Scripted(draws))
                .with(keys::INPUT, x)
                .with(keys::TARGET, &Tensor::from_slice(&[0i64]));
            host.fire(&mut method, Event::AFTER_DATALOADER)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(
                host.overdrawn, 0,
                "{what}: drew more than 2 numbers per hole"
            );
            assert_eq!(host.draws, expected_draws, "{what}: draws");
            assert!(
                host.get(keys::INPUT).equal(g.tensor(&run.key)),
                "{what}: output"
            );
            assert!(host.get(keys::TARGET).equal(&Tensor::from_slice(&[0i64])));
        }
    }
}

/// Checks the JSON's invariants for `out = cutout(input)` with holes at `centres` (if known):
/// one 2-D mask shared by all samples and channels, `out = input · mask`, the mask is the union
/// of the clipped boxes `[c − L//2, c + L//2)`, and the kept fraction is at least
/// `1 − holes·(2·(L//2))² / (H·W)`.
fn check_invariants(
    what: &str,
    input: &Tensor,
    out: &Tensor,
    holes: u64,
    len: i64,
    centres: Option<&[(i64, i64)]>,
) {
    let size = input.size();
    let (h, w) = hw(input);
    assert_eq!(out.size(), size, "{what}: shape");
    let flat = out.reshape([-1, h, w]);
    let kept = flat.get(0).ne(0.0);
    for i in 1..flat.size()[0] {
        assert!(
            flat.get(i).ne(0.0).equal(&kept),
            "{what}: the mask differs in image/channel {i}"
        );
    }
    let mask = kept.to_kind(input.kind());
    assert!(out.equal(&(input * &mask)), "{what}: out != input * mask");
    let half = len.div_euclid(2);
    if let Some(centres) = centres {
        // An independent reference: a pixel is cut iff some box covers it.
        let cut = |r: i64, c: i64| {
            centres
                .iter()
                .any(|&(x, y)| r >= y - half && r < y + half && c >= x - half && c < x + half)
        };
        let want: Vec<f32> = (0..h)
            .flat_map(|r| (0..w).map(move |c| (r, c)))
            .map(|(r, c)| if cut(r, c) { 0.0 } else { 1.0 })
            .collect();
        let want = Tensor::from_slice(&want).view([h, w]).to_kind(input.kind());
        assert!(
            mask.equal(&want),
            "{what}: mask is not the union of the boxes"
        );
    } else if holes == 1 {
        // One hole: the cut pixels form one rectangle with sides <= 2·(L//2).
        let cut = kept.logical_not();
        let n = cut.sum(Kind::Int64).int64_value(&[]);
        if n > 0 {
            let rows = cut.any_dim(1, false).sum(Kind::Int64).int64_value(&[]);
            let cols = cut.any_dim(0, false).sum(Kind::Int64).int64_value(&[]);
            assert_eq!(rows * cols, n, "{what}: the hole is not a rectangle");
            assert!(
                rows <= 2 * half && cols <= 2 * half,
                "{what}: hole {rows}x{cols} too big"
            );
        }
    }
    let kept_fraction = kept
        .to_kind(Kind::Double)
        .mean(Kind::Double)
        .double_value(&[]);
    let bound = 1.0 - holes as f64 * ((2 * half) * (2 * half)) as f64 / (h * w) as f64;
    assert!(
        kept_fraction >= bound - 1e-12,
        "{what}: kept {kept_fraction} < {bound}"
    );
}

/// Settings grids for the invariant tests: the recorded runs' settings plus a few more.
fn setting_grid(g: &Golden) -> Vec<(u64, f64, bool)> {
    let mut grid: Vec<(u64, f64, bool)> = runs(g)
        .iter()
        .map(|r| (r.num_holes, r.length, r.uniform_sampling))
        .collect();
    for holes in [0, 1, 3] {
        for length in [0.05, 0.3, 0.75, 0.99] {
            for uniform in [false, true] {
                grid.push((holes, length, uniform));
            }
        }
    }
    grid
}

/// Positive test images (`uniform(0.5, 1.5)`), so zeros mark the mask.
fn images(shape: &[i64], seed: i64) -> Tensor {
    tessera_plugin_api::tch::manual_seed(seed);
    Tensor::rand(shape, (Kind::Float, Device::Cpu)) + 0.5
}

#[test]
fn invariants_hold_for_seeded_centres() {
    let g = Golden::load(CASE);
    let invariants = g.json["invariants"].as_array().expect("invariants");
    assert!(!invariants.is_empty(), "the JSON lists no invariants");
    let golden_shape = input(&g).size();
    let shapes = [
        golden_shape,
        vec![2, 3, 7, 5],
        vec![1, 1, 9, 9],
        vec![4, 3, 32, 32],
    ];
    let mut state = 0x5EED_u64;
    let mut checked = 0;
    for (si, shape) in shapes.iter().enumerate() {
        let x = images(shape, si as i64);
        let (h, w) = hw(&x);
        for &(holes, length, uniform) in &setting_grid(&g) {
            let len = hole_length(h, w, length);
            let (ylo, yhi) = centre_range(h, len, uniform);
            let (xlo, xhi) = centre_range(w, len, uniform);
            for trial in 0..20 {
                let centres: Vec<(i64, i64)> = (0..holes)
                    .map(|_| {
                        let y = ylo + (splitmix64(&mut state) % (yhi - ylo) as u64) as i64;
                        let x = xlo + (splitmix64(&mut state) % (xhi - xlo) as u64) as i64;
                        (x, y)
                    })
                    .collect();
                let what = format!("{shape:?} holes={holes} length={length} uniform={uniform} #{trial} {centres:?}");
                let out = cutout_batch(&x, &centres, len).unwrap();
                check_invariants(&what, &x, &out, holes, len, Some(&centres));
                checked += 1;
            }
        }
    }
    eprintln!("checked {checked} seeded batches");
}

#[test]
fn method_keeps_the_invariants_with_the_hosts_rng() {
    let g = Golden::load(CASE);
    let x = input(&g);
    let (h, w) = hw(x);
    for (i, &(holes, length, uniform)) in setting_grid(&g).iter().enumerate() {
        let len = hole_length(h, w, length);
        let config = settings_json(holes, length, uniform);
        let mut method = boxed_method::<CutOut>(&settings(&config)).unwrap();
        let mut host = TestHost::new(RandomSource::Seeded(i as u64));
        for step in 0..10 {
            host.tensors.insert(keys::INPUT.to_owned(), x.copy());
            let before = host.draws;
            host.fire(&mut method, Event::AFTER_DATALOADER).unwrap();
            // Two uniform draws per hole (rejection makes more astronomically unlikely).
            assert_eq!(host.draws - before, 2 * holes as usize, "{config}: draws");
            let what = format!("{config} step {step}");
            check_invariants(&what, x, host.get(keys::INPUT), holes, len, None);
        }
    }
}

#[test]
fn centre_range_uses_python_floor_division() {
    // Composer: randint(-L // 2, high=size + L // 2) with Python's floor division.
    for size in [1, 7, 12, 16] {
        for len in 0..20i64 {
            let floor_half_neg = (-(len as f64) / 2.0).floor() as i64;
            let floor_half = (len as f64 / 2.0).floor() as i64;
            assert_eq!(
                centre_range(size, len, true),
                (floor_half_neg, size + floor_half)
            );
            assert_eq!(centre_range(size, len, false), (0, size));
        }
    }
}

#[test]
fn hooks_and_name() {
    assert_eq!(CutOut::hooks(), vec![Hook::at(Event::AFTER_DATALOADER)]);
    assert_eq!(CutOut::NAME, "cutout");
}

#[test]
fn settings_are_validated() {
    for ok in [
        "{}",
        r#"{"num_holes": 0}"#,
        r#"{"num_holes": 3, "length": 0.25, "uniform_sampling": true}"#,
        r#"{"length": 0.999}"#,
    ] {
        boxed_method::<CutOut>(&settings(ok)).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    for (bad, needle) in [
        (r#"{"length": 0}"#, "`length` must be in (0, 1)"),
        (r#"{"length": 1}"#, "`length` must be in (0, 1)"),
        (r#"{"length": -0.5}"#, "`length` must be in (0, 1)"),
        (r#"{"length": 1.5}"#, "`length` must be in (0, 1)"),
        (r#"{"length": "half"}"#, "`length` must be a number"),
        (
            r#"{"num_holes": -1}"#,
            "`num_holes` must be a non-negative integer",
        ),
        (
            r#"{"num_holes": 1.5}"#,
            "`num_holes` must be a non-negative integer",
        ),
        (
            r#"{"uniform_sampling": 1}"#,
            "`uniform_sampling` must be true or false",
        ),
    ] {
        let err = CutOut::create(&settings_for::<CutOut>(bad))
            .err()
            .unwrap_or_else(|| panic!("{bad} was accepted"));
        assert_eq!(err.kind(), ErrorKind::CONFIG, "{bad}: {err}");
        assert!(err.message().contains(needle), "{bad}: {err}");
    }
    // `create` reads only the keys it knows; the host-side wrapper then rejects the rest.
    let typo = settings_for::<CutOut>(r#"{"num_hole": 2}"#);
    CutOut::create(&typo).expect("create ignores unknown keys");
    let err = typo.reject_unused().unwrap_err();
    assert!(err.message().contains("`num_hole`"), "{err}");
    let err = boxed_method::<CutOut>(&settings(r#"{"lenght": 0.3}"#))
        .err()
        .expect("unknown key accepted by the wrapper");
    assert_eq!(err.kind(), ErrorKind::CONFIG);
    assert!(err.message().contains("`lenght`"), "{err}");
}

#[test]
fn method_rejects_batches_without_images() {
    let mut method = boxed_method::<CutOut>(&settings("{}")).unwrap();
    let mut host = TestHost::new(RandomSource::Seeded(1));
    let err = host.fire(&mut method, Event::AFTER_DATALOADER).unwrap_err();
    assert!(err.contains("input"), "{err}");
    let mut host = TestHost::new(RandomSource::Seeded(1)).with(keys::INPUT, &images(&[4, 8], 0));
    let err = host.fire(&mut method, Event::AFTER_DATALOADER).unwrap_err();
    assert!(err.contains("(N, C, H, W)"), "{err}");
}
