//! Unit tests of the checkpoint format, parts, folder and retention.

use std::path::{Path, PathBuf};

use rand::RngCore;
use rand_chacha::rand_core::SeedableRng;
use tch::Tensor;

use super::*;
use crate::engine::{MethodRecord, MethodSnapshot};
use crate::optim::schedule::PlateauState;
use crate::optim::{GroupPosition, Position, Snapshot};
use crate::time::Timestamp;

fn sample() -> Checkpoint {
    let parts = Parts {
        run_name: "r".into(),
        config: serde_json::json!({"seed": 1}),
        clock: SavedClock {
            timestamp: Timestamp {
                batch: 7,
                epoch: 1,
                ..Default::default()
            },
            batches_per_epoch: 5,
        },
        model: vec![
            (
                "w".into(),
                Tensor::from_slice(&[1.5f32, -2.0, 3.25]).view([3, 1]),
            ),
            ("n".into(), Tensor::from_slice(&[4i64])),
        ],
        optimizer: Snapshot {
            position: Position {
                algorithm: "sgd".into(),
                lr: 0.1,
                initial_lr: 0.2,
                steps: 7,
                members: vec!["w".into()],
                lr_multiplier: Some(0.5),
                lr_scale: Some(1.0),
                groups: vec![GroupPosition {
                    name: "no_decay".into(),
                    lr_multiplier: 0.5,
                    weight_decay: 0.0,
                    members: vec!["w".into()],
                }],
                plateau: Some(PlateauState {
                    lr: 0.01,
                    best: Some(0.25),
                    num_bad: 2,
                    cooldown_counter: 1,
                    evaluations: 5,
                }),
            },
            tensors: vec![(
                "w.momentum_buffer".into(),
                Tensor::from_slice(&[0.5f32, 0.25, 0.0]).view([3, 1]),
            )],
        },
        methods: vec![MethodRecord {
            name: "x".into(),
            version: "0.1.0".into(),
            settings: serde_json::json!({"a": 1}),
            snapshot: Some(MethodSnapshot {
                format_version: 2,
                bytes: vec![7, 8],
                tensors: vec![
                    ("z".into(), Tensor::from_slice(&[1.0f32])),
                    ("a".into(), Tensor::from_slice(&[2.0f32])),
                ],
            }),
        }],
        disabled_methods: vec!["x".into()],
        rng: rand_chacha::ChaCha8Rng::seed_from_u64(3),
        trainer: TrainerMeta {
            train_seconds: 1.5,
            evals: vec![],
            eval_times: vec![],
            wall_seconds: 2.5,
            last_eval_batch: None,
            running_batches: 2,
            metrics_bytes: 10,
            disabled: vec![],
            skipped_steps: 0,
            grad_scaler: None,
            microbatch_size: None,
            data_nodes: None,
            tokenizer: None,
            trained_samples: 3,
            target_reached: None,
        },
        running_loss: Some(Tensor::from_slice(&[0.75f32])),
        torch_rng: Some(Tensor::from_slice(&[1u8, 2, 3])),
        torch_cuda_rng: Vec::new(),
        world_size: 1,
        ranks: Vec::new(),
    };
    Checkpoint::from_parts(parts).unwrap()
}

/// A data-parallel checkpoint with CUDA generator states: 2 devices on rank 0, 2 on rank 1.
fn with_cuda_states() -> Checkpoint {
    let mut parts = sample().into_parts().unwrap();
    parts.torch_cuda_rng = vec![
        Tensor::from_slice(&[10u8; 16]),
        Tensor::from_slice(&[11u8; 16]),
    ];
    parts.world_size = 2;
    parts.ranks = vec![RankPart {
        rng: rand_chacha::ChaCha8Rng::seed_from_u64(4),
        torch_rng: Tensor::from_slice(&[4u8, 5]),
        torch_cuda_rng: vec![
            Tensor::from_slice(&[20u8; 16]),
            Tensor::from_slice(&[21u8; 16]),
        ],
    }];
    Checkpoint::from_parts(parts).unwrap()
}

#[test]
fn cuda_generator_states_round_trip_in_device_order() {
    let c = with_cuda_states();
    let names: Vec<&str> = c.tensors.iter().map(|(n, _)| n.as_str()).collect();
    for n in [
        "trainer/torch_cuda_rng/0",
        "trainer/torch_cuda_rng/1",
        "rank/1/torch_cuda_rng/0",
        "rank/1/torch_cuda_rng/1",
    ] {
        assert!(names.contains(&n), "{n} in {names:?}");
    }
    let back = Checkpoint::from_bytes(&c.to_bytes().unwrap(), Path::new("x.ckpt"))
        .unwrap()
        .into_parts()
        .unwrap();
    let bytes = |ts: &[Tensor]| -> Vec<Vec<u8>> {
        ts.iter().map(|t| Vec::<u8>::try_from(t).unwrap()).collect()
    };
    assert_eq!(
        bytes(&back.torch_cuda_rng),
        vec![vec![10u8; 16], vec![11u8; 16]]
    );
    assert_eq!(back.ranks.len(), 1);
    assert_eq!(
        bytes(&back.ranks[0].torch_cuda_rng),
        vec![vec![20u8; 16], vec![21u8; 16]]
    );
    assert_eq!(
        Vec::<u8>::try_from(&back.ranks[0].torch_rng).unwrap(),
        vec![4u8, 5]
    );
}

#[test]
fn checkpoints_without_cuda_states_load_and_a_gap_is_an_error() {
    // Written on the CPU or before the CUDA states were saved: none, nothing else changes.
    let parts = sample().into_parts().unwrap();
    assert!(parts.torch_cuda_rng.is_empty());
    assert!(parts.torch_rng.is_some());
    // A state missing in the middle is a damaged checkpoint, not one device fewer.
    let mut c = with_cuda_states();
    c.tensors.retain(|(n, _)| n != "trainer/torch_cuda_rng/0");
    let e = c.into_parts().err().unwrap().to_string();
    assert!(
        e.contains("trainer/torch_cuda_rng/0") && e.contains("missing"),
        "{e}"
    );
    let mut c = with_cuda_states();
    c.tensors.retain(|(n, _)| n != "rank/1/torch_cuda_rng/0");
    let e = c.into_parts().err().unwrap().to_string();
    assert!(e.contains("rank/1/torch_cuda_rng/0"), "{e}");
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-ckpt-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn round_trip_is_exact() {
    let c = sample();
    let bytes = c.to_bytes().unwrap();
    let back = Checkpoint::from_bytes(&bytes, Path::new("x.ckpt")).unwrap();
    assert_eq!(back.meta, c.meta);
    assert_eq!(back.tensors.len(), c.tensors.len());
    for (name, t) in &c.tensors {
        let b = back.tensor(name).unwrap();
        assert_eq!(b.kind(), t.kind());
        assert_eq!(b.size(), t.size());
        assert!(b.equal(t), "{name}");
    }
}

#[test]
fn every_flipped_byte_or_truncation_is_detected() {
    let bytes = sample().to_bytes().unwrap();
    for i in (0..bytes.len()).step_by(7) {
        let mut bad = bytes.clone();
        bad[i] ^= 0x10;
        let r = Checkpoint::from_bytes(&bad, Path::new("x.ckpt"));
        assert!(r.is_err(), "flip at {i} of {} not detected", bytes.len());
    }
    for len in [0, 8, bytes.len() / 2, bytes.len() - 1] {
        let e = Checkpoint::from_bytes(&bytes[..len], Path::new("x.ckpt"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("x.ckpt") && e.contains("corrupt"), "{e}");
    }
}

#[test]
fn parts_round_trip_with_the_rng_mid_stream() {
    let c = sample();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
    for _ in 0..13 {
        rng.next_u32();
    }
    let mut parts = c.into_parts().unwrap();
    parts.rng = rng.clone();
    let again = Checkpoint::from_parts(parts).unwrap();
    let bytes = again.to_bytes().unwrap();
    let parts = Checkpoint::from_bytes(&bytes, Path::new("x.ckpt"))
        .unwrap()
        .into_parts()
        .unwrap();
    let mut back = parts.rng;
    for _ in 0..100 {
        assert_eq!(rng.next_u64(), back.next_u64());
    }
    // Each part comes back under its own names (the model's sorted, as the file stores them;
    // they are restored by name).
    let names: Vec<&str> = parts.model.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["n", "w"]);
    assert_eq!(parts.optimizer.tensors[0].0, "w.momentum_buffer");
    let m = &parts.methods[0];
    assert_eq!(m.name, "x");
    let s = m.snapshot.as_ref().unwrap();
    assert_eq!(s.bytes, [7, 8]);
    assert_eq!(
        s.tensors
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>(),
        ["z", "a"],
        "a method's tensors keep its order, not the file's"
    );
    assert_eq!(parts.disabled_methods, ["x"]);
    assert!(parts.running_loss.is_some());
}

#[test]
fn a_method_tensor_named_like_the_bytes_is_refused() {
    let mut parts = sample().into_parts().unwrap();
    let s = parts.methods[0].snapshot.as_mut().unwrap();
    s.tensors
        .push(("__bytes__".into(), Tensor::from_slice(&[1u8])));
    let e = Checkpoint::from_parts(parts).err().unwrap().to_string();
    assert!(e.contains("reserved"), "{e}");
}

#[test]
fn listing_latest_and_pruning() {
    let dir = temp_dir("list");
    let c = sample();
    for (ep, ba) in [(0, 2), (0, 4), (1, 6)] {
        let t = Timestamp {
            epoch: ep,
            batch: ba,
            ..Default::default()
        };
        let p = dir.join(file_name(&t));
        c.write(&p).unwrap();
        update_latest(&dir, &p).unwrap();
    }
    std::fs::write(dir.join(".tmp-ep9-ba99.ckpt.1"), b"partial").unwrap();
    let names: Vec<String> = list(&dir)
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["ep1-ba6.ckpt", "ep0-ba4.ckpt", "ep0-ba2.ckpt"]);
    assert_eq!(
        std::fs::read_link(dir.join(LATEST)).unwrap(),
        Path::new("ep1-ba6.ckpt")
    );
    // A truncated newest file is skipped in favour of the previous one.
    let newest = dir.join("ep1-ba6.ckpt");
    let bytes = std::fs::read(&newest).unwrap();
    std::fs::write(&newest, &bytes[..bytes.len() / 3]).unwrap();
    let (path, _) = latest_good(&dir).unwrap();
    assert_eq!(path, dir.join("ep0-ba4.ckpt"));
    // keep_best: ranked by the evaluation at each checkpoint's batch (none at batch 6).
    let accuracy = |batch: u64| match batch {
        2 => Some(0.7),
        4 => Some(0.6),
        _ => None,
    };
    assert_eq!(best_of(&dir, 1, true, accuracy), [dir.join("ep0-ba2.ckpt")]);
    assert_eq!(best_of(&dir, 5, false, accuracy).len(), 2);
    assert_eq!(
        best_of(&dir, 1, false, accuracy),
        [dir.join("ep0-ba4.ckpt")]
    );
    // Equal scores: the newer first; NaN is not ranked.
    assert_eq!(
        best_of(&dir, 1, true, |b| (b != 6).then_some(0.5)),
        [dir.join("ep0-ba4.ckpt")]
    );
    assert!(best_of(&dir, 3, true, |_| Some(f64::NAN)).is_empty());
    // keep_last = 1 keeps the current one and what keep_best keeps.
    let kept = [dir.join("ep0-ba2.ckpt")];
    let deleted = prune(&dir, 1, &newest, &kept);
    assert_eq!(deleted, [dir.join("ep0-ba4.ckpt")]);
    assert!(kept[0].exists());
    let deleted = prune(&dir, 1, &newest, &[]);
    assert_eq!(deleted.len(), 1);
    remove_stale_temporaries(&dir);
    assert!(!dir.join(".tmp-ep9-ba99.ckpt.1").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Hostile inputs and the fuzzer's seeds: every file reads or fails naming itself; the
/// seeds (real checkpoints) read.
#[test]
fn fuzz_regressions_and_seed_corpus() {
    let mut checked = 0;
    for (folder, path) in crate::test_support::files_in(&[
        "tests/fuzz_regressions/checkpoint",
        "fuzz/corpus/checkpoint",
    ]) {
        let bytes = std::fs::read(&path).unwrap();
        let seed = folder.ends_with("fuzz/corpus/checkpoint")
            && path.extension().is_some_and(|e| e == "ckpt");
        match Checkpoint::from_bytes(&bytes, &path) {
            Ok(_) => assert!(
                !folder.ends_with("tests/fuzz_regressions/checkpoint"),
                "{path:?} was read"
            ),
            Err(e) => {
                assert!(!seed, "seed {path:?}: {e}");
                let name = path.display().to_string();
                assert!(e.to_string().contains(&name), "{e}");
            }
        }
        checked += 1;
    }
    assert!(checked >= 6, "only {checked} files checked");
}

#[test]
fn names_parse() {
    assert_eq!(parse_file_name("ep3-ba120.ckpt"), Some((3, 120)));
    assert_eq!(parse_file_name("latest.ckpt"), None);
    assert_eq!(parse_file_name("ep3-ba120.ckpt.partial"), None);
}
