//! plugin-api's time strings (`tessera_plugin_api::Time`, used by methods' settings) and the
//! host's (`tessera::time::Time`, used by `trainer.toml`) are the same grammar: over a grid of
//! numbers, units and wall-clock forms, both accept the same strings with the same value and
//! refuse the same strings with the same message.

use tessera::time::Time as HostTime;
use tessera_plugin_api::{Time, TimeUnit};

/// Number parts: plain, fractional, exponents, underscores, signs, malformed, huge.
const NUMBERS: &[&str] = &[
    "",
    "0",
    "1",
    "2.0",
    "1.5",
    ".5",
    "5.",
    "1e3",
    "1E-1",
    "25e-1",
    "3_0e10",
    "4_000",
    "4__0",
    "_4",
    "4_",
    "+3",
    "-1",
    "-0",
    "-0.5",
    "1e",
    "e5",
    "1.2.3",
    "1e5e5",
    "inf",
    "nan",
    ".",
    "18446744073709551615",
    "18446744073709551616",
    "1e20",
    "1e400",
    "1,000",
    " 7",
];

/// Wall-clock forms and other whole strings.
const WHOLE: &[&str] = &[
    "",
    "   ",
    "5",
    "1h20m40s",
    "90m",
    "45s",
    "2h30s",
    "1H2M3S",
    "20m1h",
    "1h1h",
    "1ms",
    "h",
    "1h2",
    "99999999999999999999h",
    " 7iter ",
    "ep",
    "dur",
];

fn inputs() -> Vec<String> {
    let mut units: Vec<String> = TimeUnit::ALL
        .iter()
        .flat_map(|u| [u.suffix().to_owned(), u.suffix().to_uppercase()])
        .collect();
    units.extend(["xyz", "", " ba", "b"].map(str::to_owned));
    let mut all: Vec<String> = WHOLE.iter().map(|s| s.to_string()).collect();
    for n in NUMBERS {
        for u in &units {
            all.push(format!("{n}{u}"));
        }
    }
    all
}

#[test]
fn plugin_api_and_host_read_time_strings_alike() {
    let (mut accepted, mut refused) = (0, 0);
    for s in inputs() {
        match (Time::parse(&s), HostTime::parse(&s)) {
            (Ok(ours), Ok(host)) => {
                assert_eq!(ours.unit().suffix(), host.unit().suffix(), "{s:?}");
                assert_eq!(ours.count(), host.count(), "{s:?}");
                assert_eq!(ours.fraction(), host.fraction(), "{s:?}");
                assert_eq!(ours.to_string(), host.to_string(), "{s:?}");
                accepted += 1;
            }
            (Err(ours), Err(host)) => {
                assert_eq!(ours.to_string(), host.to_string(), "{s:?}");
                refused += 1;
            }
            (ours, host) => panic!("{s:?}: plugin-api gives {ours:?}, the host {host:?}"),
        }
    }
    // The grid exercises both sides of the grammar.
    assert!(
        accepted > 50 && refused > 50,
        "{accepted} accepted, {refused} refused"
    );
}
