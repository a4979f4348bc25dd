//! The MPI calls XLA makes itself, for JAX's CPU collectives (`psum`, `all_gather`,
//! `ppermute`, and those XLA inserts into sharded programs), when jaxlib's MPItrampoline
//! forwards them to jaxmpi (XLA's MPI backend, through the plug-in in
//! `jaxmpi_backends::xla_plugin`). They are tracked by the same monitor as jaxmpi's own ops:
//! a `JAXMPI_DEBUG` line each, the `JAXMPI_TIMEOUT` watchdog, and the refusal of concurrent
//! calls below MPI_THREAD_MULTIPLE; and recorded by a profile (`profile/`) as the plug-in's
//! route.

use std::ffi::c_void;
use std::fmt;

use super::handlers::monitor_of;
use super::monitor::Tracked;
use super::profile::{self, Begun, Fields, Kind, Route};
use crate::{Comm, Library, Result};

/// One MPI call of XLA's, as the debug line and the watchdog's report name it.
pub struct XlaCall {
    /// The MPI function XLA called (`MPI_Allreduce`).
    pub function: &'static str,
    pub comm: Comm,
    pub dest: Option<i32>,
    pub source: Option<i32>,
    /// What it sends (or, for a receive, can receive).
    pub bytes: usize,
}

impl XlaCall {
    /// A call without peers (a collective, or a communicator's creation and release).
    pub fn on(function: &'static str, comm: Comm, bytes: usize) -> Self {
        XlaCall {
            function,
            comm,
            dest: None,
            source: None,
            bytes,
        }
    }
}

impl fmt::Display for XlaCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} for XLA (comm {:#x}", self.function, self.comm.0)?;
        if let Some(dest) = self.dest {
            write!(f, ", dest {dest}")?;
        }
        if let Some(source) = self.source {
            write!(f, ", source {source}")?;
        }
        write!(f, ", {} bytes)", self.bytes)
    }
}

/// # Safety
/// `frame` must point to the `XlaCall` of a call still running (the monitor only describes
/// calls in flight).
unsafe fn describe(frame: *const c_void, _name: &'static str) -> String {
    // SAFETY: forwarded from the caller.
    unsafe { &*(frame as *const XlaCall) }.to_string()
}

/// Runs `body`, the whole of `call`, tracked by the process's monitor, and recorded while
/// a profile records.
pub fn track(
    library: &'static dyn Library,
    call: &XlaCall,
    body: impl FnOnce() -> Result<()>,
) -> Result<()> {
    let begun = profile::begin();
    let result = match monitor_of(library) {
        None => body(),
        Some(monitor) => {
            let tracked = Tracked {
                name: call.function,
                frame: call as *const XlaCall as *const c_void,
                describe,
            };
            monitor.run(tracked, body)
        }
    };
    if let Some(begun) = begun {
        record(begun, call, result.is_ok());
    }
    result
}

#[cold]
fn record(begun: Begun, call: &XlaCall, ok: bool) {
    begun.record(&Fields {
        name: call.function,
        site: "",
        route: Route::Plugin,
        kind: Kind::Call,
        bytes: call.bytes as u64,
        group: call.comm.0 as u64,
        comm_id: 0,
        device: -1,
        request: 0,
        waited: 0,
        failed: !ok,
    });
}

/// Shows `line` under `JAXMPI_DEBUG` (and keeps it for the watchdog's report).
pub fn debug_note(library: &'static dyn Library, line: impl FnOnce() -> String) {
    if let Some(monitor) = monitor_of(library).filter(|m| m.debug) {
        monitor.note(format!("jaxmpi: rank {}: {}", monitor.rank, line()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_names_the_mpi_function_comm_peers_and_bytes() {
        let call = XlaCall {
            function: "MPI_Sendrecv",
            comm: Comm(0x8400_0002),
            dest: Some(1),
            source: Some(0),
            bytes: 64,
        };
        assert_eq!(
            call.to_string(),
            "MPI_Sendrecv for XLA (comm 0x84000002, dest 1, source 0, 64 bytes)"
        );
        let call = XlaCall::on("MPI_Allreduce", call.comm, 64);
        assert_eq!(
            call.to_string(),
            "MPI_Allreduce for XLA (comm 0x84000002, 64 bytes)"
        );
    }
}
