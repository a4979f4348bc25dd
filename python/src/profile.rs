//! jaxmpi's own profile from Python (`jaxmpi/_runtime/profile.py`): start and stop the
//! recording (`jaxmpi_core::xla::profile`), measure this rank's clock against rank 0's,
//! read the totals, write this rank's trace. Each call that waits for other ranks or
//! writes a file releases the GIL.

use std::path::PathBuf;

use jaxmpi_core::xla::profile::{self, Alignment, Sync};
use jaxmpi_core::Comm;
use pyo3::exceptions::{PyOSError, PyRuntimeError};
use pyo3::prelude::*;

use crate::on_library;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(profile_start, m)?)?;
    m.add_function(wrap_pyfunction!(profile_stop, m)?)?;
    m.add_function(wrap_pyfunction!(profile_recording, m)?)?;
    m.add_function(wrap_pyfunction!(profile_sync, m)?)?;
    m.add_function(wrap_pyfunction!(profile_totals, m)?)?;
    m.add_function(wrap_pyfunction!(profile_write, m)?)?;
    m.add_function(wrap_pyfunction!(profile_now, m)?)?;
    m.add_function(wrap_pyfunction!(profile_skew, m)?)?;
    Ok(())
}

/// Starts recording every call into `capacity` records (memory set aside now).
#[pyfunction]
fn profile_start(capacity: usize) -> PyResult<()> {
    profile::start(capacity).map_err(PyRuntimeError::new_err)
}

/// Stops recording: (recorded, dropped, capacity, untallied, sites refused), or None if
/// nothing recorded.
#[pyfunction]
fn profile_stop() -> Option<(u64, u64, u64, u64, u64)> {
    profile::stop().map(|s| {
        (
            s.recorded,
            s.dropped,
            s.capacity,
            s.untallied,
            s.sites_refused,
        )
    })
}

#[pyfunction]
fn profile_recording() -> bool {
    profile::recording()
}

/// This rank's clock against rank 0's, measured now over the communicator `handle`
/// (collective; one of the profile's own): (local ns, offset ns, round trip ns, rank 0's
/// clock, rank 0's Unix time in ns).
#[pyfunction]
fn profile_sync(py: Python<'_>, handle: usize) -> PyResult<(u64, i64, u64, u64, u64)> {
    let sync = on_library(py, "profile", |l| {
        profile::sync(l, Comm(handle), profile::ROUNDS)
    })?;
    Ok((
        sync.local_ns,
        sync.offset_ns,
        sync.round_trip_ns,
        sync.reference_ns,
        sync.reference_unix_ns,
    ))
}

/// Total = (op, call site, route, kind, calls, bytes, ns, waited ns, failed).
type Total = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    u64,
    u64,
    u64,
    u64,
    u64,
);

/// The last profile's totals, by op, call site, route and kind.
#[pyfunction]
fn profile_totals() -> Vec<Total> {
    profile::totals()
        .into_iter()
        .map(|t| {
            (
                t.name,
                t.site,
                t.route.name(),
                t.kind.name(),
                t.calls,
                t.bytes,
                t.ns,
                t.waited,
                t.failed,
            )
        })
        .collect()
}

/// (local ns, offset ns): one measurement of the clock.
type Measured = (u64, i64);

/// How a rank's records are placed on rank 0's clock: the profile's origin (rank 0's clock
/// at its start), this rank's offset as measured at the start and, if it was, at the end.
type Placement = (u64, Measured, Option<Measured>);

/// Writes the last profile's records to `path` as a Chrome trace: `pid` (the rank) named
/// `process`, `other_data` (a JSON object) as its `otherData`, times on rank 0's clock as
/// `placement` says. Returns the number of call events.
#[pyfunction]
fn profile_write(
    py: Python<'_>,
    path: PathBuf,
    pid: i64,
    process: &str,
    other_data: &str,
    placement: Placement,
) -> PyResult<usize> {
    let (origin, start, end) = placement;
    let measured = |(local_ns, offset_ns): Measured| Sync {
        local_ns,
        offset_ns,
        ..Sync::default()
    };
    let trace = profile::Trace {
        pid,
        process,
        other_data,
        alignment: Alignment {
            origin_ns: origin,
            start: measured(start),
            end: end.map(measured),
        },
    };
    py.detach(|| profile::write_file(&path, &trace))
        .map_err(|err| PyOSError::new_err(format!("{}: {err}", path.display())))
}

/// The profile's clock now (ns).
#[pyfunction]
fn profile_now() -> u64 {
    profile::now_ns()
}

/// Shifts this process's profile clock by `shift_ns` and makes it run `rate_ppb` ns per
/// second fast: for the tests of the clocks' alignment only.
#[pyfunction]
fn profile_skew(shift_ns: i64, rate_ppb: i64) {
    profile::set_skew(shift_ns, rate_ppb);
}
