//! Tests of checking schedules: names and fields, defaults, serialization, validation, a
//! schedule against a run.

use super::tests::{assert_curve, parse, run, t};
use super::*;

#[test]
fn unknown_fields_names_and_missing_fields_are_rejected() {
    let bad = [
        "name = \"cosine\"\nt_max = \"1dur\"\nwarmup = \"1ep\"",
        "name = \"cosine_with_warmup\"\nt_warmup = \"1ep\"\nalpha_i = 0.0",
        "name = \"step\"\nstep_size = \"1ep\"\nextra = 1",
        "name = \"cosine_annealing\"",
        "name = \"step\"",
        "name = \"cosine_with_warmup\"",
        "name = \"multistep\"",
        "t_max = \"1dur\"",
        "name = \"cosine\"\nt_max = 5",
    ];
    for text in bad {
        assert!(toml::from_str::<Schedule>(text).is_err(), "{text}");
    }
    let msg = toml::from_str::<Schedule>("name = \"cosine\"\nwarmup = \"1ep\"")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(msg.contains("warmup"), "{msg}");
    let msg = toml::from_str::<Schedule>("name = \"cosine\"\nt_max = 5")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(msg.contains("durations are strings with a unit"), "{msg}");
}

#[test]
fn defaults_follow_composer() {
    assert_eq!(
        parse("name = \"cosine_with_warmup\"\nt_warmup = \"0.1dur\"\nalpha_f = 0.0"),
        Schedule::CosineWithWarmup {
            t_warmup: t("0.1dur"),
            t_max: t("1dur"),
            alpha_f: 0.0
        }
    );
    assert_eq!(
        parse("name = \"linear_with_warmup\"\nt_warmup = \"1ep\""),
        Schedule::LinearWithWarmup {
            t_warmup: t("1ep"),
            alpha_i: 1.0,
            alpha_f: 0.0,
            t_max: t("1dur")
        }
    );
    assert_eq!(
        parse("name = \"multistep_with_warmup\"\nt_warmup = \"1ep\"\nmilestones = []"),
        Schedule::MultiStepWithWarmup {
            t_warmup: t("1ep"),
            milestones: vec![],
            gamma: 0.1
        }
    );
    assert_eq!(
        parse("name = \"linear\""),
        Schedule::Linear {
            alpha_i: 1.0,
            alpha_f: 0.0,
            t_max: t("1dur")
        }
    );
}

#[test]
fn serialize_round_trips() {
    let all = [
        Schedule::default(),
        parse("name = \"step\"\nstep_size = \"2ep\""),
        parse("name = \"multistep\"\nmilestones = [\"30ep\", \"0.9dur\"]\ngamma = 0.2"),
        parse("name = \"linear\"\nalpha_f = 0.1"),
        parse("name = \"cosine\""),
        parse("name = \"constant_with_warmup\"\nt_warmup = \"10ba\""),
        parse("name = \"linear_with_warmup\"\nt_warmup = \"10ba\""),
        parse("name = \"cosine_with_warmup\"\nt_warmup = \"0.1dur\""),
        parse("name = \"multistep_with_warmup\"\nt_warmup = \"1ep\"\nmilestones = [\"5ep\"]"),
    ];
    for s in all {
        let text = match toml::to_string(&s) {
            Ok(text) => text,
            Err(e) => panic!("{s:?}: {e}"),
        };
        assert!(text.contains(&format!("name = \"{}\"", s.name())), "{text}");
        assert_eq!(parse(&text), s, "{text}");
    }
}

#[test]
fn validate_rejects_bad_values() {
    let bad = [
        "name = \"step\"\nstep_size = \"1ep\"\ngamma = -0.1",
        "name = \"step\"\nstep_size = \"0ba\"",
        "name = \"step\"\nstep_size = \"30sec\"",
        "name = \"constant\"\nalpha = nan",
        "name = \"constant\"\nalpha = -1.0",
        "name = \"linear\"\nt_max = \"0ba\"",
        "name = \"cosine\"\nt_max = \"0.0dur\"",
        "name = \"linear\"\nalpha_f = inf",
        "name = \"multistep\"\nmilestones = [\"1ep\", \"1h\"]",
        "name = \"cosine_with_warmup\"\nt_warmup = \"0.2dur\"\nt_max = \"0.1dur\"",
        "name = \"linear_with_warmup\"\nt_warmup = \"200ba\"\nt_max = \"100ba\"",
    ];
    for text in bad {
        let s = parse(text);
        assert!(s.validate().is_err(), "{text}");
    }
    let msg = parse("name = \"step\"\nstep_size = \"1ep\"\ngamma = -0.1")
        .validate()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(msg.contains("step") && msg.contains("gamma"), "{msg}");
    let good = [
        "name = \"cosine_with_warmup\"\nt_warmup = \"0.1dur\"",
        "name = \"cosine_with_warmup\"\nt_warmup = \"10ep\"\nt_max = \"0.1dur\"",
        "name = \"constant\"\nt_max = \"0ba\"",
        "name = \"multistep\"\nmilestones = []",
    ];
    for text in good {
        assert_eq!(parse(text).validate(), Ok(()), "{text}");
    }
}

#[test]
fn check_against_a_run() {
    let r = run("1000ba", 100, 32);
    // Warmup in samples, t_max in batches: Composer refuses mixed units.
    let s = parse("name = \"cosine_with_warmup\"\nt_warmup = \"100sp\"");
    assert!(s.check(&r, 1.0).is_err());
    assert!(s.try_multiplier(&Timestamp::default(), &r, 1.0).is_err());
    assert_eq!(s.multiplier(&Timestamp::default(), &r, 1.0), 1.0);
    // t_max shorter than max_duration (Composer checks this for warmup schedules).
    let s = parse("name = \"linear_with_warmup\"\nt_warmup = \"10ba\"\nt_max = \"500ba\"");
    let msg = s
        .check(&r, 1.0)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(msg.contains("shorter than max_duration"), "{msg}");
    let r_ep = run("10ep", 100, 32);
    let s = parse("name = \"cosine_with_warmup\"\nt_warmup = \"1ep\"\nt_max = \"9ep\"");
    assert!(s.check(&r_ep, 1.0).is_err());
    let s = parse("name = \"cosine_with_warmup\"\nt_warmup = \"1ep\"\nt_max = \"10ep\"");
    assert_eq!(s.check(&r_ep, 1.0), Ok(()));
    // Epoch times need a known epoch length.
    let unsized_run = run("1000ba", 0, 32);
    let s = parse("name = \"step\"\nstep_size = \"1ep\"");
    assert!(s.check(&unsized_run, 1.0).is_err());
    // The ratio must be positive; a step that scales to zero is refused.
    let s = parse("name = \"step\"\nstep_size = \"1ba\"");
    assert!(s.check(&r, 0.0).is_err());
    assert!(s.check(&r, 0.5).is_err());
    // After scaling, a fixed warmup may exceed t_max.
    let s = parse("name = \"cosine_with_warmup\"\nt_warmup = \"600ba\"");
    let r_half = match r.scaled(0.5) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(s.check(&r, 1.0), Ok(()));
    assert!(s.check(&r_half, 0.5).is_err());
}

#[test]
fn warmup_equal_to_t_max_holds_the_peak() {
    let r = run("100ba", 10, 32);
    let s = parse("name = \"cosine_with_warmup\"\nt_warmup = \"1dur\"\nt_max = \"1dur\"");
    assert_curve(&s, &r, 1.0, &[(50, 0.5), (100, 1.0), (150, 1.0)]);
    let s = parse("name = \"linear_with_warmup\"\nt_warmup = \"0ba\"\nt_max = \"100ba\"");
    assert_curve(&s, &r, 1.0, &[(0, 1.0), (50, 0.5), (100, 0.0)]);
}
