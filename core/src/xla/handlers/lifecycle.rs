//! The life of one handler call around its op body, the same for every op: attributes
//! decoded as declared, MPI errors made to return on the call's communicator, checked
//! mode's and start verdicts' exchanges before a collective (`checked.rs`,
//! `start_verdict.rs`; a GPU call takes its verdict in the GPU runtime), and the call
//! tracked by the process's monitor (debug lines, watchdog, exclusivity; see
//! `monitor.rs`), whose settings are read once per process. With none of them on, a
//! call pays one atomic load for each.

use std::ffi::c_void;
use std::fmt;
use std::sync::OnceLock;

use super::signature::Signature;
use super::{checked, start_verdict};
use crate::xla::ffi::CallFrame;
use crate::xla::frame::{handles, Attrs, Call, PEER_ANY, PEER_NULL, TAG_ANY};
use crate::xla::mesh::{is_mesh_comm, OnDevices, ON_DEVICES};
use crate::xla::monitor::{self, Monitor, Tracked};
use crate::xla::watchdog;
use crate::{ErrorsReturned, Library, Result, ThreadLevel};

/// Where a call's buffers live: which handler table XLA called it through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Platform {
    Cpu,
    /// GPU memory: the body runs through the GPU runtime (`gpu.rs`).
    Gpu,
}

/// Attributes that say whom a call talks to, in the order they are shown.
const DESCRIBED: [&str; 6] = ["root", "dest", "source", "tag", "sendtag", "recvtag"];

/// One call as a user would name it: its communicator, peers or root, tags and size.
pub struct CallInfo {
    comm: usize,
    /// On a MeshComm: its id, and the call's device and rank there.
    on_devices: Option<(i64, i64, Option<usize>)>,
    attrs: [Option<i64>; DESCRIBED.len()],
    bytes: usize,
    /// The JAX operation an XLA collective came from.
    origin: Option<String>,
}

impl CallInfo {
    pub fn of(call: &Call) -> Self {
        let id = call.optional_i64("comm");
        CallInfo {
            comm: id
                .and_then(|id| handles::resolve(handles::Table::Comm, id))
                .unwrap_or(0),
            on_devices: id.filter(|&id| is_mesh_comm(id)).map(|id| {
                let device = call.device().unwrap_or(-1);
                (-id - 1, device, call.device_rank())
            }),
            // A peer given per rank (on a MeshComm): the call's rank's.
            attrs: DESCRIBED.map(|name| {
                call.optional_i64(name)
                    .or_else(|| call.device_rank().and(call.per_rank_i64(name).ok()))
            }),
            bytes: call.operand_bytes(
                Signature::named(call.name()).is_some_and(|(s, _)| s.operands.len() == 1),
            ),
            origin: call.optional_text("origin").map(str::to_string),
        }
    }
}

impl fmt::Display for CallInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(origin) = &self.origin {
            return write!(f, "from {origin}, {} bytes", self.bytes);
        }
        match self.on_devices {
            Some((comm, device, Some(rank))) => {
                write!(f, "MeshComm {comm}, rank {rank} (device {device})")?
            }
            Some((comm, device, None)) => write!(f, "MeshComm {comm}, device {device}")?,
            None => write!(f, "comm {:#x}", self.comm)?,
        }
        for (name, value) in DESCRIBED.iter().zip(self.attrs) {
            let Some(value) = value else { continue };
            let is_tag = name.ends_with("tag");
            match value {
                v if is_tag && v == i64::from(TAG_ANY) => write!(f, ", {name} ANY_TAG")?,
                v if !is_tag && v == i64::from(PEER_ANY) => write!(f, ", {name} ANY_SOURCE")?,
                v if !is_tag && v == i64::from(PEER_NULL) => write!(f, ", {name} PROC_NULL")?,
                v => write!(f, ", {name} {v}")?,
            }
        }
        write!(f, ", {} bytes", self.bytes)
    }
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
        .and_then(|library| super::on_mesh_comm(&call, library).ok().flatten());
    let call = match on_devices {
        Some(on) => call.on_device_rank(on.rank()),
        None => call,
    };
    format!("{name} ({})", CallInfo::of(&call))
}

/// The process's monitor; absent when nothing is tracked.
static MONITOR: OnceLock<Option<&'static Monitor>> = OnceLock::new();

/// The process's monitor, once the first call has decided whether there is one.
pub(super) fn monitor() -> Option<&'static Monitor> {
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
pub(super) fn run<A: Attrs>(
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
        // XLA's collectives (`hlo.rs`) run on communicators of jaxmpi's own, made to
        // return errors when they are made.
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
        // Point to point, checked mode checks the blocking ones in their bodies (`ops.rs`).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_names_its_comm_peers_tags_and_bytes_as_mpi_does() {
        let mut attrs = [None; DESCRIBED.len()];
        attrs[2] = Some(i64::from(PEER_ANY)); // source
        attrs[3] = Some(i64::from(TAG_ANY)); // tag
        let info = CallInfo {
            comm: 0x4400_0000,
            on_devices: None,
            attrs,
            bytes: 16,
            origin: None,
        };
        assert_eq!(
            info.to_string(),
            "comm 0x44000000, source ANY_SOURCE, tag ANY_TAG, 16 bytes"
        );
        attrs = [
            Some(0),
            Some(i64::from(PEER_NULL)),
            None,
            Some(3),
            None,
            None,
        ];
        let info = CallInfo { attrs, ..info };
        assert_eq!(
            info.to_string(),
            "comm 0x44000000, root 0, dest PROC_NULL, tag 3, 16 bytes"
        );
        let info = CallInfo {
            on_devices: Some((0, 6, Some(3))),
            ..info
        };
        assert_eq!(
            info.to_string(),
            "MeshComm 0, rank 3 (device 6), root 0, dest PROC_NULL, tag 3, 16 bytes"
        );
    }
}
