//! How started ops progress on this rank, decided once per process and said by
//! `python -m jaxmpi info`: jaxmpi's progress agent (`agent.rs`), MPI calls alone, or
//! collectives completing at their start, from `JAXMPI_PROGRESS`, MPI's thread level and
//! what Python tells of the node (the cores each rank has, whether every rank shares it).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use crate::{Library, Result, ThreadLevel};

/// `JAXMPI_PROGRESS`: "thread" (the default where MPI allows it) or "none".
pub fn progress_requested() -> Option<String> {
    let value = std::env::var("JAXMPI_PROGRESS").ok()?;
    let value = value.trim().to_ascii_lowercase();
    (!value.is_empty()).then_some(value)
}

/// The CPU cores each rank of this node may use (set once at start-up by Python, which
/// knows the process's CPU set and the ranks sharing the node).
static CORES_PER_RANK: OnceLock<f64> = OnceLock::new();

pub fn set_cores_per_rank(cores: f64) {
    let _ = CORES_PER_RANK.set(cores);
}

/// Whether every rank of the job runs on this host (set once at start-up by Python, which
/// knows the ranks sharing the node).
static ONE_HOST: OnceLock<bool> = OnceLock::new();

pub fn set_one_host(one: bool) {
    let _ = ONE_HOST.set(one);
}

/// How started ops progress, and why: "thread" (jaxmpi's agent completes them while the
/// program computes), "none" (only MPI calls do: starts, waits, other ops), or "at-start"
/// (as "none", but a started collective completes at its start, as its blocking op).
///
/// By default the agent runs only where each rank has a core to spare for it: where ranks
/// fill the cores, its tests take time from the computation it should overlap (measured in
/// benches/RESULTS.md: slower than blocking waits on a 2-core machine at 2 ranks). Without
/// it, where every rank shares this host, nothing moves a collective's data while the
/// program computes (every core computes, and the copies need one), so a started
/// collective costs what its blocking op does plus its non-blocking algorithm's extra
/// steps: "at-start" makes it the blocking op (measured in benches/RESULTS.md, "Gradients
/// reduced during the backward pass"). Point to point starts non-blocking in every mode: a
/// blocking send at its start could wait for a receive its peer starts later.
pub fn progress_mode(library: &dyn Library) -> (&'static str, String) {
    let level = library.thread_level();
    let cores = CORES_PER_RANK.get().copied().unwrap_or(1.0);
    let one_host = ONE_HOST.get().copied().unwrap_or(false);
    let without_thread = |why: String| match one_host {
        true => (
            "at-start",
            format!(
                "{why}; every rank on this host: a started collective completes at its start, \
                 as its blocking op (JAXMPI_PROGRESS=none starts it non-blocking)"
            ),
        ),
        false => ("none", why),
    };
    match progress_requested().as_deref() {
        Some("none") => ("none", "JAXMPI_PROGRESS=none".into()),
        Some("at-start") => ("at-start", "JAXMPI_PROGRESS=at-start".into()),
        _ if level < ThreadLevel::Multiple => without_thread(format!(
            "MPI runs at {}: only MPI_THREAD_MULTIPLE allows a progress thread",
            level.name()
        )),
        Some("thread") => ("thread", "JAXMPI_PROGRESS=thread".into()),
        _ if cores < 2.0 => without_thread(format!(
            "{cores:.1} CPU cores per rank on this node: a progress thread would take time \
             from the rank's own computation (JAXMPI_PROGRESS=thread forces it)"
        )),
        _ => (
            "thread",
            format!("{cores:.1} CPU cores per rank on this node, MPI_THREAD_MULTIPLE"),
        ),
    }
}

/// Whether started collectives complete at their start: unset (decided by `progress_mode`
/// at the first start), no, yes.
static AT_START: AtomicU8 = AtomicU8::new(0);

/// Whether a started collective completes at its start (`progress_mode` "at-start").
pub(super) fn collectives_complete_at_start(library: &dyn Library) -> bool {
    match AT_START.load(Ordering::Relaxed) {
        0 => {
            let at_start = progress_mode(library).0 == "at-start";
            AT_START.store(1 + u8::from(at_start), Ordering::Relaxed);
            at_start
        }
        set => set == 2,
    }
}

/// Whether started collectives complete at their start now (`progress_mode` "at-start",
/// or as set), deciding it if nothing did yet.
pub fn collectives_at_start() -> Result<bool> {
    Ok(collectives_complete_at_start(crate::library()?))
}

/// Makes every later started collective complete at its start, or not, whatever the
/// progress mode says; `None`: as the progress mode says (every rank must do it alike; for
/// tests of both ways).
pub fn set_collectives_at_start(at_start: Option<bool>) {
    AT_START.store(at_start.map_or(0, |on| 1 + u8::from(on)), Ordering::Relaxed);
}
