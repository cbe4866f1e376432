//! SeqLengthWarmup against Composer's golden case (`tests/golden/seq_length_warmup.*`): every
//! `L=..,truncate=..,preserve_eos=..` case of `set_batch_sequence_length` on the padded batch
//! (input_ids, labels, attention_mask), and every row of the schedule table (both settings).

use std::collections::BTreeMap;

use seq_length_warmup::{seq_len_at, set_batch_sequence_length, Schedule, SeqBatch};
use tessera_plugin_api::tch::{Device, Kind, Tensor};
use tessera_plugin_api::testing::golden::{parse_params, Golden};

const CASE: &str = "seq_length_warmup";

fn batch(g: &Golden) -> SeqBatch {
    SeqBatch {
        input: g.tensor("input_ids").copy(),
        target: Some(g.tensor("labels").copy()),
        mask: Some(g.tensor("attention_mask").copy()),
    }
}

#[test]
fn every_set_batch_sequence_length_case_matches_composer() {
    let g = Golden::load(CASE);
    // `L=5,truncate=1,preserve_eos=0/input_ids` -> case -> key -> tensor.
    let mut cases: BTreeMap<String, BTreeMap<String, &Tensor>> = BTreeMap::new();
    for name in g.names_with_role("output") {
        if let Some((case, key)) = name.split_once('/') {
            cases
                .entry(case.to_owned())
                .or_default()
                .insert(key.to_owned(), g.tensor(&name));
        }
    }
    assert!(cases.len() >= 5, "cases: {:?}", cases.keys());
    for (case, want) in &cases {
        let p = parse_params(case);
        let len: i64 = p["L"].parse().expect("L");
        let truncate = p["truncate"] == "1";
        let preserve = p["preserve_eos"] == "1";
        let got = set_batch_sequence_length(batch(&g), len, truncate, preserve).expect(case);
        let target = got.target.expect("labels");
        let mask = got.mask.expect("mask");
        for (key, t) in [
            ("input_ids", &got.input),
            ("labels", &target),
            ("attention_mask", &mask),
        ] {
            let w = want
                .get(key)
                .unwrap_or_else(|| panic!("{case}: no `{key}` in the file"));
            assert_eq!(t.size(), w.size(), "{case}/{key}: shape");
            assert!(t.equal(w), "{case}/{key}:\n got {t}\nwant {w}");
        }
        eprintln!("{case}: input_ids, labels, attention_mask exact");
    }
}

#[test]
fn the_schedule_table_matches_composer() {
    let g = Golden::load(CASE);
    let table = g.tensor("schedule_table");
    let rows = table.size()[0];
    let mut settings = std::collections::BTreeSet::new();
    for r in 0..rows {
        let v: Vec<f64> = (0..8).map(|c| table.double_value(&[r, c])).collect();
        let [total, duration, min, max, step, batch, want_len, want_out] = v[..] else {
            panic!("row {r}: {v:?}");
        };
        let s = Schedule {
            duration,
            min_seq_length: min as i64,
            max_seq_length: max as i64,
            step_size: step as i64,
        };
        let len = seq_len_at(batch as u64, total as u64, &s).expect("schedule");
        assert_eq!(len as f64, want_len, "row {r}: {v:?}");
        // Composer's stand-in batch: zeros (2, max_seq_length).
        let input = Tensor::zeros([2, max as i64], (Kind::Int64, Device::Cpu));
        let out = set_batch_sequence_length(
            SeqBatch {
                input,
                target: None,
                mask: None,
            },
            len,
            true,
            false,
        )
        .expect("cut");
        assert_eq!(out.input.size()[1] as f64, want_out, "row {r}: {v:?}");
        settings.insert(format!("{total} {duration} {min} {max} {step}"));
    }
    assert_eq!(settings.len(), 2, "{settings:?}");
    eprintln!("schedule table: {rows} rows exact");
}
