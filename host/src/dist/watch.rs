//! Hangs: where every rank is, so that a collective that waits past `[distributed] timeout`
//! can say which rank is behind. Each rank publishes its step and its collective sequence number
//! (c10d's count of the collectives it issued) in the store, from a thread of its own, twice a
//! second when they move and every few seconds when not: the training thread only stores two
//! numbers per step. A rank stopped or stuck stops publishing, so its last word grows old.

use std::ffi::{c_char, c_void, CString};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::Group;

extern "C" {
    fn tessera_dist_sequence(group: *mut c_void) -> i64;
    fn tessera_dist_store_has(group: *mut c_void, key: *const c_char) -> i32;
}

fn key(rank: usize) -> String {
    format!("tessera/progress/{rank}")
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Group {
    /// The collectives this rank has issued so far (c10d's sequence number), if known.
    pub fn sequence(&self) -> Option<u64> {
        // SAFETY: the handle is live.
        let n = unsafe { tessera_dist_sequence(self.handle) };
        u64::try_from(n).ok()
    }

    /// Whether the store holds `key` now (without waiting for it).
    fn store_has(&self, key: &str) -> Option<bool> {
        let k = CString::new(key).ok()?;
        // SAFETY: the handle and `k` are live for the call.
        match unsafe { tessera_dist_store_has(self.handle, k.as_ptr()) } {
            1 => Some(true),
            0 => Some(false),
            _ => None,
        }
    }
}

/// One rank's last published position.
#[derive(Debug, Clone, PartialEq)]
pub struct Position {
    /// The rank.
    pub rank: usize,
    /// Its step (batches trained) when it last published.
    pub step: u64,
    /// Its collective sequence number then.
    pub sequence: u64,
    /// How long ago it published, in seconds.
    pub age: f64,
}

impl Position {
    fn parse(rank: usize, text: &str, now: u64) -> Option<Position> {
        let mut it = text.split_whitespace().map(str::parse::<u64>);
        let (step, sequence, at) = (it.next()?.ok()?, it.next()?.ok()?, it.next()?.ok()?);
        Some(Position {
            rank,
            step,
            sequence,
            age: now.saturating_sub(at) as f64 / 1e3,
        })
    }
}

/// The publisher of this rank's position; stops with it.
pub struct Watch {
    group: Arc<Group>,
    step: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watch {
    /// Starts publishing this rank's position in `group`'s store.
    pub fn start(group: Arc<Group>) -> Watch {
        let step = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (group, step, stop) = (Arc::clone(&group), Arc::clone(&step), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("tessera-watch".into())
                .spawn(move || publish(&group, &step, &stop))
                .ok()
        };
        Watch {
            group,
            step,
            stop,
            thread,
        }
    }

    /// The training thread's step now.
    pub fn at_step(&self, step: u64) {
        self.step.store(step, Ordering::Relaxed);
    }

    /// Why a collective waited too long, as far as the ranks' positions tell: which rank is
    /// behind (the one whose last word is oldest, then the lowest step and sequence number),
    /// at which step and sequence number, against this rank's. Reads the store for at most a
    /// few seconds (rank 0 hosts it: when rank 0 is the one stopped, it does not answer).
    pub fn diagnose(&self) -> String {
        let me = self.group.rank;
        let mine = format!(
            "rank {me} waited at step {}, collective #{}",
            self.step.load(Ordering::Relaxed),
            self.group
                .sequence()
                .map_or_else(|| "?".to_owned(), |s| s.to_string())
        );
        let (tx, rx) = mpsc::channel();
        let group = Arc::clone(&self.group);
        let reader = std::thread::Builder::new()
            .name("tessera-diagnose".into())
            .spawn(move || {
                let now = now_ms();
                let positions: Vec<Option<Position>> = (0..group.world)
                    .map(|r| {
                        if group.store_has(&key(r)) != Some(true) {
                            return None;
                        }
                        let bytes = group.store_get(&key(r)).ok()?;
                        Position::parse(r, &String::from_utf8_lossy(&bytes), now)
                    })
                    .collect();
                let _ = tx.send(positions);
            });
        if reader.is_err() {
            return mine;
        }
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(positions) => describe(me, &mine, &positions),
            Err(_) => format!(
                "{mine}; the store on rank 0 did not answer within 5 s, so rank 0 is likely the \
                 one stopped or stuck"
            ),
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The publishing loop: twice a second when the position moved, every 5 s when not.
fn publish(group: &Group, step: &AtomicU64, stop: &AtomicBool) {
    let mut last: Option<(u64, u64)> = None;
    let mut since = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let now = (step.load(Ordering::Relaxed), group.sequence().unwrap_or(0));
        if last != Some(now) || since >= 10 {
            let value = format!("{} {} {}", now.0, now.1, now_ms());
            if group.store_set(&key(group.rank), value.as_bytes()).is_err() {
                return;
            }
            last = Some(now);
            since = 0;
        }
        since += 1;
        for _ in 0..10 {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The report from the ranks' positions (`None`: never published).
fn describe(me: usize, mine: &str, positions: &[Option<Position>]) -> String {
    let others: Vec<&Position> = positions
        .iter()
        .flatten()
        .filter(|p| p.rank != me)
        .collect();
    let silent: Vec<String> = positions
        .iter()
        .enumerate()
        .filter(|(r, p)| *r != me && p.is_none())
        .map(|(r, _)| r.to_string())
        .collect();
    let behind = others.iter().max_by(|a, b| {
        a.age
            .total_cmp(&b.age)
            .then(b.step.cmp(&a.step))
            .then(b.sequence.cmp(&a.sequence))
    });
    let mut text = mine.to_owned();
    if let Some(p) = behind {
        text.push_str(&format!(
            "; rank {} is behind: its last progress, {:.1} s ago, was step {}, collective #{}",
            p.rank, p.age, p.step, p.sequence
        ));
    }
    if !silent.is_empty() {
        text.push_str(&format!(
            "; rank(s) {} never reported a position",
            silent.join(", ")
        ));
    }
    let all: Vec<String> = positions
        .iter()
        .flatten()
        .map(|p| {
            format!(
                "rank {}: step {}, #{}, {:.1} s ago",
                p.rank, p.step, p.sequence, p.age
            )
        })
        .collect();
    if !all.is_empty() {
        text.push_str(&format!(" (last positions: {})", all.join("; ")));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_read_and_the_oldest_is_behind() {
        let now = 100_000;
        let p0 = Position::parse(0, "4 61 99900", now).unwrap();
        assert_eq!((p0.step, p0.sequence), (4, 61));
        assert!((p0.age - 0.1).abs() < 1e-9);
        assert!(Position::parse(1, "garbage", now).is_none());
        let p1 = Position::parse(1, "3 57 88000", now).unwrap();
        let text = describe(0, "rank 0 waited", &[Some(p0), Some(p1), None]);
        assert!(
            text.contains("rank 1 is behind") && text.contains("step 3, collective #57"),
            "{text}"
        );
        assert!(text.contains("rank(s) 2 never reported"), "{text}");
    }
}
