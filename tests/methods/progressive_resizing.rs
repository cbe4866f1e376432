//! The progressive_resizing plugin through the real binary: 8 batches of Fashion-MNIST on
//! ResNet-20 (global pooling, so it accepts any image size). The plugin logs the size it
//! trained at; the host's elapsed fraction (batches done / 8 at `after_dataloader`, Composer's
//! `get_elapsed_duration`) must drive the schedule to exactly the sizes the crate's `Schedule`
//! gives (itself checked against Composer's table in the crate's golden test). Settings
//! errors name the setting; a killed and resumed run equals the straight one bit for bit.
//!
//! Its kill -9 resume and the settings its plugin refuses are rows of the method table
//! (tests/methods/table.rs).

use progressive_resizing::Schedule;
use tessera_tests::*;

const BATCHES: u64 = 8;
const SIDE: i64 = 28;

fn resnet(label: &str, settings: &str) -> TrainerToml {
    let mut toml = TrainerToml::new(label).algorithm("progressive_resizing", settings);
    toml.model = "name = \"resnet20\"\nwidth = 4".to_owned();
    toml.device = Some("cpu".to_owned());
    toml.max_duration = format!("{BATCHES}ba");
    toml
}

#[test]
fn images_grow_on_composers_schedule() {
    for (label, settings, schedule) in [
        (
            "defaults",
            "",
            Schedule {
                initial_scale: 0.5,
                finetune_fraction: 0.2,
                delay_fraction: 0.5,
                size_increment: 4,
            },
        ),
        (
            "crop",
            "mode = \"crop\"\ninitial_scale = 0.3\ndelay_fraction = 0.0\nfinetune_fraction = 0.25\nsize_increment = 8",
            Schedule {
                initial_scale: 0.3,
                finetune_fraction: 0.25,
                delay_fraction: 0.0,
                size_increment: 8,
            },
        ),
    ] {
        let dir = TempDir::new(&format!("pr-{label}"));
        resnet(label, settings).write_to(&dir);
        let out = train(&dir, &[], &[]);
        out.assert_success();
        assert!(
            out.stderr.contains("loaded plugin progressive_resizing"),
            "{}",
            out.dump()
        );
        let lines = read_jsonl(&run_dir(&dir, label).join("metrics.jsonl"));
        let widths = method_metric(&lines, "progressive_resizing/width");
        let heights = method_metric(&lines, "progressive_resizing/height");
        let scales = method_metric(&lines, "progressive_resizing/scale_factor");
        // At batch b's after_dataloader, b batches of 8 are done; the metric is logged at that
        // timestamp.
        let expected: Vec<(u64, f64, f64)> = (0..BATCHES)
            .map(|b| {
                let elapsed = b as f64 / BATCHES as f64;
                let scale = schedule.scale(elapsed);
                let pinned = schedule.pinned_scale(SIDE, elapsed);
                let side = if pinned >= 1.0 {
                    SIDE
                } else if label == "crop" {
                    (pinned * SIDE as f64) as i64
                } else {
                    (SIDE as f64 * pinned).floor() as i64
                };
                (b, side as f64, scale)
            })
            .collect();
        assert_eq!(
            widths,
            expected.iter().map(|e| (e.0, e.1)).collect::<Vec<_>>(),
            "{label}"
        );
        assert_eq!(heights, widths, "{label}: square images stay square");
        assert_eq!(
            scales,
            expected.iter().map(|e| (e.0, e.2)).collect::<Vec<_>>(),
            "{label}"
        );
        // The run really shrank images early and reached full size by the end.
        assert!(widths[0].1 < SIDE as f64, "{label}: {widths:?}");
        assert_eq!(widths[BATCHES as usize - 1].1, SIDE as f64, "{label}: {widths:?}");
        let record = read_json(&run_dir(&dir, label).join("run.json"));
        assert_eq!(record["batches"], BATCHES, "{record:#}");
    }
}
