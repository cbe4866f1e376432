//! ColOut against Composer's golden outputs (`tests/golden/colout.*`).
//!
//! Everything is read from the JSON and safetensors files: the input (values encode
//! `(n, c, row, col)`), the `(N, H, W)` target, and per recorded run (`results.runs`) the
//! settings, the row and column indices torch drew, and the outputs. The functional form and
//! the method (fed the same draws) must reproduce them exactly; with the host's RNG the JSON's
//! invariants must hold and a seed must fix the draws.

use std::collections::VecDeque;

use colout::{colout_batch, keep_rows_cols, kept_count, ColOut, ResizeTarget};
use serde_json::Value;
use tessera_plugin_api::tch::{Kind, Tensor};
use tessera_plugin_api::testing::golden::{parse_params, Golden};
use tessera_plugin_api::testing::{
    default_settings_json, settings, settings_for, RandomSource, TestHost,
};
use tessera_plugin_api::{boxed_method, keys, ErrorKind, Event, Hook, Plugin};

const CASE: &str = "colout";

/// One recorded `colout_batch` run.
struct Run {
    key: String,
    p_row: f64,
    p_col: f64,
    kept_rows: Vec<i64>,
    kept_cols: Vec<i64>,
    out_shape: Vec<i64>,
}

fn runs(g: &Golden) -> Vec<Run> {
    let runs = g.json["results"]["runs"].as_array().expect("results.runs");
    assert!(!runs.is_empty(), "no recorded runs");
    runs.iter()
        .map(|r| {
            let field = |name: &str| -> &Value {
                r.get(name)
                    .unwrap_or_else(|| panic!("a run has no `{name}`: {r}"))
            };
            let ints = |name: &str| -> Vec<i64> {
                serde_json::from_value(field(name).clone())
                    .unwrap_or_else(|e| panic!("{name}: {e}"))
            };
            let run = Run {
                key: field("key").as_str().expect("key").to_owned(),
                p_row: field("p_row").as_f64().expect("p_row"),
                p_col: field("p_col").as_f64().expect("p_col"),
                kept_rows: ints("kept_rows"),
                kept_cols: ints("kept_cols"),
                out_shape: ints("out_shape"),
            };
            // The key repeats the settings.
            let params = parse_params(&run.key);
            assert_eq!(
                params["p_row"].parse::<f64>().unwrap(),
                run.p_row,
                "{}",
                run.key
            );
            assert_eq!(
                params["p_col"].parse::<f64>().unwrap(),
                run.p_col,
                "{}",
                run.key
            );
            // The recorded indices are the ones stored as tensors.
            for (name, v) in [("kept_rows", &run.kept_rows), ("kept_cols", &run.kept_cols)] {
                let t = g.tensor(&format!("{name}/{}", run.key));
                assert_eq!(&Vec::<i64>::try_from(t).unwrap(), v, "{name}/{}", run.key);
            }
            run
        })
        .collect()
}

/// The image input and the `(N, H, W)` target.
fn inputs(g: &Golden) -> (&Tensor, &Tensor) {
    let names = g.names_with_role("input");
    assert_eq!(names.len(), 2, "expected input and target, got {names:?}");
    let target = g.tensor("target");
    let input = g.tensor(
        names
            .iter()
            .find(|n| *n != "target")
            .expect("an input besides the target"),
    );
    (input, target)
}

fn hw(t: &Tensor) -> (i64, i64) {
    let s = t.size();
    (s[s.len() - 2], s[s.len() - 1])
}

fn settings_json(p_row: f64, p_col: f64) -> String {
    format!(r#"{{"p_row": {p_row}, "p_col": {p_col}}}"#)
}

#[test]
fn functional_form_reproduces_the_recorded_runs() {
    let g = Golden::load(CASE);
    let (x, y) = inputs(&g);
    let (h, w) = hw(x);
    let runs = runs(&g);
    for name in g.names_with_role("output") {
        assert!(
            runs.iter().any(|r| name.ends_with(&format!("/{}", r.key))),
            "no run recorded for {name}"
        );
    }
    for run in &runs {
        let key = &run.key;
        assert_eq!(
            kept_count(h, run.p_row),
            run.kept_rows.len() as i64,
            "{key}: rows kept"
        );
        assert_eq!(
            kept_count(w, run.p_col),
            run.kept_cols.len() as i64,
            "{key}: cols kept"
        );
        let (out, target) = colout_batch(
            x,
            Some(y),
            &run.kept_rows,
            &run.kept_cols,
            ResizeTarget::Auto,
        )
        .unwrap();
        assert_eq!(out.size(), run.out_shape, "{key}: shape");
        let want = g.tensor(&format!("out/{key}"));
        assert_eq!(out.kind(), want.kind(), "{key}: kind");
        assert!(out.equal(want), "{key}: output differs from Composer's");
        let target = target.expect("a target in, a target out");
        assert!(
            target.equal(g.tensor(&format!("target_out/{key}"))),
            "{key}: target differs from Composer's"
        );
        // Explicit resize_target settings: always gives the same, never leaves it alone.
        let (_, always) = colout_batch(
            x,
            Some(y),
            &run.kept_rows,
            &run.kept_cols,
            ResizeTarget::Always,
        )
        .unwrap();
        assert!(
            always.unwrap().equal(&target),
            "{key}: resize_target = true"
        );
        let (_, never) = colout_batch(
            x,
            Some(y),
            &run.kept_rows,
            &run.kept_cols,
            ResizeTarget::Never,
        )
        .unwrap();
        assert!(never.unwrap().equal(y), "{key}: resize_target = false");
    }
}

/// The values the host's RNG must return so that the method's partial Fisher–Yates shuffle
/// of `0..size` puts `kept` first (any value `v < n` is what `rng_below(n)` returns).
/// Keeping every index needs no draw.
fn shuffle_draws(size: i64, kept: &[i64]) -> Vec<u64> {
    if kept.len() as i64 == size {
        return Vec::new();
    }
    let mut perm: Vec<i64> = (0..size).collect();
    kept.iter()
        .enumerate()
        .map(|(i, k)| {
            let j = perm
                .iter()
                .position(|p| p == k)
                .expect("kept index in range");
            assert!(j >= i);
            perm.swap(i, j);
            (j - i) as u64
        })
        .collect()
}

#[test]
fn method_reproduces_the_runs_from_the_recorded_draws() {
    let g = Golden::load(CASE);
    let (x, y) = inputs(&g);
    let (h, w) = hw(x);
    let defaults: Value =
        serde_json::from_str(&default_settings_json(ColOut::DEFAULT_SETTINGS)).unwrap();
    for run in runs(&g) {
        let json = settings_json(run.p_row, run.p_col);
        let mut configs = vec![json.clone()];
        let value: Value = serde_json::from_str(&json).unwrap();
        if value["p_row"] == defaults["p_row"] && value["p_col"] == defaults["p_col"] {
            configs.push("{}".to_owned());
            configs.push(defaults.to_string());
        }
        for config in configs {
            let what = format!("{} with settings {config}", run.key);
            let mut method = boxed_method::<ColOut>(&settings(&config))
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            // Rows are drawn before columns; the recorded indices in any order give the same
            // sorted result, so the reverse order is scripted to show the sorting.
            let rev = |v: &[i64]| v.iter().rev().copied().collect::<Vec<_>>();
            let draws: VecDeque<u64> = shuffle_draws(h, &rev(&run.kept_rows))
                .into_iter()
                .chain(shuffle_draws(w, &rev(&run.kept_cols)))
                .collect();
            let expected_draws = draws.len();
            let mut host = TestHost::new(RandomSource::Scripted(draws))
                .with(keys::INPUT, x)
                .with(keys::TARGET, y);
            host.fire(&mut method, Event::AFTER_DATALOADER)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(host.overdrawn, 0, "{what}: drew too many numbers");
            assert_eq!(
                host.draws, expected_draws,
                "{what}: one draw per kept index"
            );
            assert!(
                host.get(keys::INPUT)
                    .equal(g.tensor(&format!("out/{}", run.key))),
                "{what}: input"
            );
            assert!(
                host.get(keys::TARGET)
                    .equal(g.tensor(&format!("target_out/{}", run.key))),
                "{what}: target"
            );
        }
    }
}

/// Decodes `(rows, cols)` from an output of the encoded input (`row·100 + col` in the low
/// digits), checking every sample, channel and the target carry the same ones.
fn decode(what: &str, out: &Tensor, target: &Tensor) -> (Vec<i64>, Vec<i64>) {
    let rc = out.to_kind(Kind::Int64).remainder(10000);
    let rows_t = rc.divide_scalar_mode(100, "floor").to_kind(Kind::Int64);
    let cols_t = rc.remainder(100);
    let (n, c, h, w) = out.size4().unwrap();
    let rows: Vec<i64> = Vec::try_from(rows_t.get(0).get(0).select(1, 0)).unwrap();
    let cols: Vec<i64> = Vec::try_from(cols_t.get(0).get(0).get(0)).unwrap();
    let want_rows = Tensor::from_slice(&rows)
        .view([h, 1])
        .expand([n, c, h, w], false);
    let want_cols = Tensor::from_slice(&cols)
        .view([1, w])
        .expand([n, c, h, w], false);
    assert!(
        rows_t.equal(&want_rows),
        "{what}: rows differ across samples or channels"
    );
    assert!(
        cols_t.equal(&want_cols),
        "{what}: cols differ across samples or channels"
    );
    // The high digits still say which sample and channel each value came from.
    let nc = out
        .to_kind(Kind::Int64)
        .divide_scalar_mode(10000, "floor")
        .to_kind(Kind::Int64);
    let want_nc = (Tensor::arange(n, (Kind::Int64, out.device())).view([n, 1, 1, 1]) * 10
        + Tensor::arange(c, (Kind::Int64, out.device())).view([1, c, 1, 1]))
    .expand([n, c, h, w], false);
    assert!(nc.equal(&want_nc), "{what}: samples or channels mixed");
    let want_target =
        (&want_rows.select(1, 0) * 100 + &want_cols.select(1, 0)).to_kind(target.kind());
    assert!(
        target.equal(&want_target),
        "{what}: the target lost other rows/cols"
    );
    (rows, cols)
}

fn strictly_increasing_below(v: &[i64], size: i64) -> bool {
    v.windows(2).all(|p| p[0] < p[1]) && v.iter().all(|&i| (0..size).contains(&i))
}

#[test]
fn invariants_and_same_seed_reproducibility_with_the_hosts_rng() {
    let g = Golden::load(CASE);
    let invariants = g.json["invariants"].as_array().expect("invariants");
    assert!(!invariants.is_empty(), "the JSON lists no invariants");
    let (x, y) = inputs(&g);
    let (h, w) = hw(x);
    let mut grid: Vec<(f64, f64)> = runs(&g).iter().map(|r| (r.p_row, r.p_col)).collect();
    grid.extend([(0.0, 0.0), (0.05, 0.45), (0.8, 0.5), (0.3, 0.0)]);
    for &(p_row, p_col) in &grid {
        let config = settings_json(p_row, p_col);
        let outputs = |seed: u64| -> Vec<(Tensor, Tensor)> {
            let mut method = boxed_method::<ColOut>(&settings(&config)).unwrap();
            let mut host = TestHost::new(RandomSource::Seeded(seed));
            (0..8)
                .map(|_| {
                    host.tensors.insert(keys::INPUT.to_owned(), x.copy());
                    host.tensors.insert(keys::TARGET.to_owned(), y.copy());
                    host.fire(&mut method, Event::AFTER_DATALOADER).unwrap();
                    (host.get(keys::INPUT).copy(), host.get(keys::TARGET).copy())
                })
                .collect()
        };
        let first = outputs(3);
        let mut seen = std::collections::BTreeSet::new();
        for (step, (out, target)) in first.iter().enumerate() {
            let what = format!("{config} step {step}");
            let (n, c) = (x.size()[0], x.size()[1]);
            assert_eq!(
                out.size(),
                [n, c, kept_count(h, p_row), kept_count(w, p_col)],
                "{what}: shape"
            );
            let (rows, cols) = decode(&what, out, target);
            assert!(strictly_increasing_below(&rows, h), "{what}: rows {rows:?}");
            assert!(strictly_increasing_below(&cols, w), "{what}: cols {cols:?}");
            seen.insert((rows, cols));
        }
        // The same seed gives the same batches.
        for ((a, ta), (b, tb)) in first.iter().zip(outputs(3)) {
            assert!(
                a.equal(&b) && ta.equal(&tb),
                "{config}: seed 3 not reproducible"
            );
        }
        // The draws change from batch to batch when anything is dropped.
        if p_row > 0.0 || p_col > 0.0 {
            assert!(
                seen.len() > 1,
                "{config}: the same rows/cols for every batch"
            );
        }
    }
}

#[test]
fn every_row_is_equally_likely_to_be_kept() {
    // 3000 draws of 5 rows out of 10 (p_row = 0.5): each row is kept with probability 1/2.
    let image = Tensor::arange(10 * 4, (Kind::Float, tessera_plugin_api::tch::Device::Cpu))
        .view([1, 1, 10, 4]);
    let mut method = boxed_method::<ColOut>(&settings(r#"{"p_row": 0.5, "p_col": 0.0}"#)).unwrap();
    let mut host = TestHost::new(RandomSource::Seeded(11));
    let trials = 3000;
    let mut kept = [0u32; 10];
    for _ in 0..trials {
        host.tensors.insert(keys::INPUT.to_owned(), image.copy());
        host.fire(&mut method, Event::AFTER_DATALOADER).unwrap();
        let rows: Vec<f32> =
            Vec::try_from(host.get(keys::INPUT).select(3, 0).flatten(0, -1)).unwrap();
        for r in rows {
            kept[(r / 4.0) as usize] += 1;
        }
    }
    // Binomial(3000, 1/2): standard deviation ~27; allow 5 of them.
    for (row, &k) in kept.iter().enumerate() {
        assert!(
            (k as f64 - 1500.0).abs() < 5.0 * 27.4,
            "row {row} kept {k} times: {kept:?}"
        );
    }
}

#[test]
fn class_index_targets_are_left_alone() {
    let g = Golden::load(CASE);
    let (x, _) = inputs(&g);
    let labels = Tensor::from_slice(&[3i64, 7]);
    let mut method = boxed_method::<ColOut>(&settings("{}")).unwrap();
    let mut host = TestHost::new(RandomSource::Seeded(5))
        .with(keys::INPUT, x)
        .with(keys::TARGET, &labels);
    host.fire(&mut method, Event::AFTER_DATALOADER).unwrap();
    assert!(host.get(keys::TARGET).equal(&labels));
    let (h, w) = hw(x);
    assert_eq!(
        hw(host.get(keys::INPUT)),
        (kept_count(h, 0.15), kept_count(w, 0.15))
    );
    // resize_target = false leaves a same-sized target alone too.
    let (_, y) = inputs(&g);
    let mut method = boxed_method::<ColOut>(&settings(r#"{"resize_target": false}"#)).unwrap();
    let mut host = TestHost::new(RandomSource::Seeded(5))
        .with(keys::INPUT, x)
        .with(keys::TARGET, y);
    host.fire(&mut method, Event::AFTER_DATALOADER).unwrap();
    assert!(host.get(keys::TARGET).equal(y));
}

#[test]
fn kept_count_truncates_like_python_int() {
    // int((1 - p) * size) on floats, as Composer computes it.
    assert_eq!(kept_count(10, 0.15), 8); // 8.5
    assert_eq!(kept_count(12, 0.3), 8); // 8.4
    assert_eq!(kept_count(28, 0.15), 23); // 23.8
    assert_eq!(kept_count(28, 0.0), 28);
    assert_eq!(kept_count(1, 0.5), 0);
    // 1 − 0.8 and 1 − 0.9 are just below 0.2 and 0.1 in binary floating point.
    assert_eq!(kept_count(10, 0.8), 1);
    assert_eq!(kept_count(10, 0.9), 0);
}

#[test]
fn hooks_and_name() {
    assert_eq!(ColOut::hooks(), vec![Hook::at(Event::AFTER_DATALOADER)]);
    assert_eq!(ColOut::NAME, "colout");
}

#[test]
fn settings_are_validated() {
    for ok in [
        "{}",
        r#"{"p_row": 0, "p_col": 0.99, "batch": true}"#,
        r#"{"resize_target": "auto"}"#,
        r#"{"resize_target": true}"#,
        r#"{"resize_target": false}"#,
        r#"{"batch": false}"#,
    ] {
        boxed_method::<ColOut>(&settings(ok)).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    for (bad, needle) in [
        (r#"{"p_row": 1}"#, "`p_row` must be in [0, 1)"),
        (r#"{"p_row": -0.1}"#, "`p_row` must be in [0, 1)"),
        (r#"{"p_col": 1.5}"#, "`p_col` must be in [0, 1)"),
        (r#"{"p_col": "a"}"#, "`p_col` must be a number"),
        (
            r#"{"batch": false, "resize_target": true}"#,
            "`resize_target = true` needs `batch = true`",
        ),
        (r#"{"batch": "yes"}"#, "`batch` must be true or false"),
        (
            r#"{"resize_target": "yes"}"#,
            "`resize_target` must be \"auto\", true or false",
        ),
        (r#"{"resize_target": 1}"#, "`resize_target` must be"),
    ] {
        let err = ColOut::create(&settings_for::<ColOut>(bad))
            .err()
            .unwrap_or_else(|| panic!("{bad} was accepted"));
        assert_eq!(err.kind(), ErrorKind::CONFIG, "{bad}: {err}");
        assert!(err.message().contains(needle), "{bad}: {err}");
    }
    let err = boxed_method::<ColOut>(&settings(r#"{"p_rows": 0.3}"#))
        .err()
        .expect("unknown key accepted");
    assert_eq!(err.kind(), ErrorKind::CONFIG);
    assert!(err.message().contains("`p_rows`"), "{err}");
}

#[test]
fn method_rejects_batches_it_cannot_cut() {
    let mut method = boxed_method::<ColOut>(&settings("{}")).unwrap();
    let mut host = TestHost::new(RandomSource::Seeded(1));
    let err = host.fire(&mut method, Event::AFTER_DATALOADER).unwrap_err();
    assert!(err.contains("input"), "{err}");
    let flat = Tensor::zeros([4, 8], (Kind::Float, tessera_plugin_api::tch::Device::Cpu));
    let mut host = TestHost::new(RandomSource::Seeded(1)).with(keys::INPUT, &flat);
    let err = host.fire(&mut method, Event::AFTER_DATALOADER).unwrap_err();
    assert!(err.contains("(N, C, H, W)"), "{err}");
    // One pixel high: int(0.85 · 1) = 0 rows would be kept.
    let thin = Tensor::zeros(
        [2, 1, 1, 8],
        (Kind::Float, tessera_plugin_api::tch::Device::Cpu),
    );
    let mut host = TestHost::new(RandomSource::Seeded(1)).with(keys::INPUT, &thin);
    let err = host.fire(&mut method, Event::AFTER_DATALOADER).unwrap_err();
    assert!(err.contains("keep 0 of 1 rows"), "{err}");
    assert!(keep_rows_cols(&flat.view([32]), &[0], &[0]).is_err());
}

#[test]
fn sample_wise_colout_keeps_its_own_sorted_rows_and_columns_per_image() {
    use tessera_plugin_api::testing::apply_sample_transform;
    use tessera_plugin_api::Sample;

    let method =
        boxed_method::<ColOut>(&settings(r#"{"batch": false, "p_row": 0.3, "p_col": 0.5}"#))
            .unwrap();
    // Values encode (channel, row, column), so the output says which pixels were kept.
    let (c, h, w) = (2usize, 10usize, 8usize);
    let data: Vec<f32> = (0..c * h * w).map(|i| i as f32).collect();
    let sample = Sample {
        channels: c,
        height: h,
        width: w,
        data,
    };
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..20u64 {
        let mut rng = RandomSource::Seeded(seed);
        let out = apply_sample_transform(&method, &sample, &mut rng).unwrap();
        // int((1 - 0.3) * 10) = 7 rows, int((1 - 0.5) * 8) = 4 columns.
        assert_eq!((out.channels, out.height, out.width), (c, 7, 4));
        let rows: Vec<usize> = (0..7).map(|y| (out.at(0, y, 0) as usize / w) % h).collect();
        let cols: Vec<usize> = (0..4).map(|x| out.at(0, 0, x) as usize % w).collect();
        assert!(rows.windows(2).all(|p| p[0] < p[1]), "{rows:?}");
        assert!(cols.windows(2).all(|p| p[0] < p[1]), "{cols:?}");
        for ch in 0..c {
            for (y, &r) in rows.iter().enumerate() {
                for (x, &col) in cols.iter().enumerate() {
                    assert_eq!(out.at(ch, y, x), ((ch * h + r) * w + col) as f32);
                }
            }
        }
        // The same stream gives the same draw.
        let again =
            apply_sample_transform(&method, &sample, &mut RandomSource::Seeded(seed)).unwrap();
        assert_eq!(again, out);
        seen.insert((rows, cols));
    }
    assert!(seen.len() > 10, "draws repeat: {}", seen.len());
}
