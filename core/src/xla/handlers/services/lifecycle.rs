//! The life of one handler call around its op body, the same for every op: attributes
//! decoded as declared, MPI errors made to return on the call's communicator, checked
//! mode's and start verdicts' exchanges before a collective (`checked/`,
//! `start_verdict.rs`; a GPU call takes its verdict in the GPU runtime), and the call
//! tracked by the process's monitor (debug lines, watchdog, exclusivity; see
//! `xla/monitor.rs`), whose settings are read once per process. With none of them on, a
//! call pays one atomic load for each.

use std::ffi::c_void;
use std::sync::OnceLock;

use super::call_info::CallInfo;
use super::{checked, start_verdict};
use crate::xla::ffi::CallFrame;
use crate::xla::frame::{Attrs, Call};
use crate::xla::handlers::signature::Signature;
use crate::xla::mesh::{is_mesh_comm, OnDevices, ON_DEVICES};
use crate::xla::monitor::{self, Monitor, Tracked};
use crate::xla::watchdog;
use crate::{ErrorsReturned, Library, Result, ThreadLevel};

/// Where a call's buffers live: which handler table XLA called it through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Platform {
    Cpu,
    /// GPU memory: the body runs through the GPU runtime (`gpu.rs`).
    Gpu,
}

/// How the monitor describes a call it shows.
///
/// # Safety
/// `frame` must be a live call frame.
unsafe fn describe(frame: *const c_void, name: &'static str) -> String {
    // SAFETY: forwarded from the caller.
    let Ok(call) = (unsafe { Call::new(frame as *mut CallFrame, name) }) else {
        return name.to_string();
    };
    // On a MeshComm, the call's rank there too (found once per thread).
    let on_devices = crate::library()
        .ok()
        .and_then(|library| on_mesh_comm(&call, library).ok().flatten());
    let call = match on_devices {
        Some(on) => call.on_device_rank(on.rank()),
        None => call,
    };
    format!("{name} ({})", CallInfo::of(&call))
}

/// The process's monitor; absent when nothing is tracked.
static MONITOR: OnceLock<Option<&'static Monitor>> = OnceLock::new();

/// The process's monitor, once the first call has decided whether there is one.
pub fn monitor() -> Option<&'static Monitor> {
    MONITOR.get().copied().flatten()
}

/// The process's monitor, deciding on the first call whether there is one (from the
/// environment: `JAXMPI_DEBUG`, `JAXMPI_TIMEOUT`, the thread level).
pub(crate) fn monitor_of(library: &'static dyn Library) -> Option<&'static Monitor> {
    *MONITOR.get_or_init(|| monitor_from_env(library))
}

fn monitor_from_env(library: &'static dyn Library) -> Option<&'static Monitor> {
    let timeout = monitor::timeout_from_env();
    let debug = monitor::debug_from_env();
    let level = library.thread_level();
    let exclusive = (level < ThreadLevel::Multiple).then_some(level);
    if timeout.is_none() && !debug && exclusive.is_none() {
        return None;
    }
    let rank = library.comm_rank(library.world()).unwrap_or(-1);
    // Lives as long as the process, as the watchdog that reads it.
    let monitor: &'static Monitor = Box::leak(Box::new(Monitor::new(
        rank,
        debug,
        exclusive,
        timeout.is_some(),
    )));
    if let Some(timeout) = timeout {
        watchdog::start(monitor, library, timeout);
    }
    Some(monitor)
}

/// Whether the op called `name` is a collective, as its declaration says.
fn is_collective(name: &str) -> bool {
    Signature::named(name).is_some_and(|(s, _)| s.is_collective())
}

/// Runs `body`, the op of `call`, on its decoded attributes, with everything every call
/// needs around it. `on_devices`: the call's device as a rank of its MeshComm,
/// where it runs on one (checked mode compares the calls of its ranks, devices).
/// `platform`: where its buffers live.
pub fn run<A: Attrs>(
    call: &Call,
    library: &'static dyn Library,
    on_devices: Option<&OnDevices>,
    platform: Platform,
    body: impl FnOnce(&A) -> Result<()>,
) -> Result<()> {
    let attrs = A::decode(call)?;
    // A communicator whose handler would abort (the user's choice, or MPI's default where
    // nobody changed it) returns errors for the duration of this call only. The check and
    // the swap are MPI calls too, so they run inside the monitored part: below
    // MPI_THREAD_MULTIPLE they must not overlap another thread's call either.
    let with_errors_returned = || {
        // XLA's collectives (`handlers/hlo.rs`) run on communicators of jaxmpi's own, made
        // to return errors when they are made.
        if let Some(on) = on_devices {
            if checked::enabled() && is_collective(call.name()) {
                checked::collective(call, on, ON_DEVICES)?;
            }
            return body(&attrs);
        }
        let Some(comm) = attrs.comm() else {
            return body(&attrs);
        };
        let _returned = ErrorsReturned::on(library, comm)?;
        // Point to point, checked mode checks the blocking ones in their bodies
        // (`handlers/ops.rs`).
        if checked::enabled() && is_collective(call.name()) {
            checked::collective(call, library, comm)?;
        }
        // A CPU rank can always start its part, but must say so: GPU ranks of the same
        // call wait for every rank's verdict (their runtime takes it, after preparing).
        if start_verdict::enabled() && platform == Platform::Cpu && start_verdict::taken(call) {
            start_verdict::agree(library, comm, None)?;
        }
        body(&attrs)
    };
    match monitor_of(library) {
        None => with_errors_returned(),
        Some(monitor) => {
            let tracked = Tracked {
                name: call.name(),
                frame: call.frame() as *const CallFrame as *const c_void,
                describe,
            };
            monitor.run(tracked, with_errors_returned)
        }
    }
}

/// The call's device as a rank of its MeshComm, if its `comm` is one.
pub fn on_mesh_comm(call: &Call, library: &'static dyn Library) -> Result<Option<OnDevices>> {
    match call.optional_i64("comm") {
        Some(id) if is_mesh_comm(id) => OnDevices::at(library, id, call.device()?).map(Some),
        _ => Ok(None),
    }
}
