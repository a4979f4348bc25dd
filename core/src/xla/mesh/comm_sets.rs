//! The communicators among processes of the device-rank layer, shared and bounded: one
//! (two for a MeshComm) for each set of devices a group spans, whatever order it lists
//! them in, or for a permute each set of processes; made by their members together, kept
//! for the rest of the job, at most `JAXMPI_MAX_COMMUNICATORS` of them a process.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::{BufMut, Comm, Dtype, Error, Input, Library, ReduceOp, Result};

/// Who names a group, and so where its communicators are made (`Group::make`): a program's
/// collectives, in the program's prologue (`make_program_communicators`), or a MeshComm,
/// when it is constructed. The two keep their groups (and communicators, and rooms)
/// apart even over the same devices, so that neither ever waits for the other's making.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Program,
    /// A program's collective-permute (the devices its pairs connect): point-to-point
    /// messages only, on the communicator of its processes, which every permute over
    /// them shares, each message tagged with its two devices (`Group::tag`). A job's
    /// permutes connect any subsets of its devices; they take at most one communicator
    /// per set of processes.
    Permute,
    MeshComm,
}

/// The communicators of every group over one set of devices that one kind names (for a
/// permute, one set of processes): the collectives' and (for a MeshComm) its
/// point-to-point messages'. Groups over the same devices in different orders (reordered
/// meshes) share them: their ranks are the processes in world-rank order, and the
/// collectives on them come in the same order on every member, the program's (each
/// device runs one collective at a time, and every device of the set takes part in each).
pub(super) struct Communicators {
    pub(super) comm: Made,
    pub(super) p2p: Made,
}

/// The communicators of the groups `kind` names over `members` (their devices; a
/// permute's: their processes): those of an earlier group over the same members, or new
/// ones, made later by `Group::make`.
pub(super) fn of(kind: Kind, members: &[i64]) -> Arc<Communicators> {
    type Sets = HashMap<(Kind, Vec<i64>), Arc<Communicators>>;
    static SETS: OnceLock<Mutex<Sets>> = OnceLock::new();
    let mut set = members.to_vec();
    set.sort_unstable();
    set.dedup();
    SETS.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry((kind, set))
        .or_insert_with(|| {
            Arc::new(Communicators {
                comm: Made::new(),
                p2p: Made::new(),
            })
        })
        .clone()
}

/// How many communicators this process has made here.
static MADE: AtomicUsize = AtomicUsize::new(0);

/// How many communicators the device-rank layer holds in this process, of the most it
/// makes (`JAXMPI_MAX_COMMUNICATORS`).
pub fn communicators_held() -> usize {
    MADE.load(Ordering::Relaxed)
}

/// The most communicators a process makes (`JAXMPI_MAX_COMMUNICATORS`): MPICH has 2,048
/// context ids for a process's communicators, and the program's own need some.
fn most() -> Result<usize> {
    static MOST: OnceLock<Result<usize, String>> = OnceLock::new();
    MOST.get_or_init(|| match std::env::var("JAXMPI_MAX_COMMUNICATORS") {
        Err(_) => Ok(1024),
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or(format!("{v:?} is not a whole number above 0")),
    })
    .clone()
    .map_err(|why| Error::invalid_argument("JAXMPI_MAX_COMMUNICATORS", why))
}

/// A communicator among `processes` (world ranks, ascending), for the group of `devices`.
/// Past the most a process may make, every member fails alike: each tells the others
/// whether it is past, on the new communicator, before any keeps it.
pub(super) fn create(
    library: &dyn Library,
    processes: &[i32],
    devices: &[i64],
    tag: i32,
) -> Result<Comm> {
    let most = most()?;
    let comm = library.comm_create_group(processes, tag)?;
    let past = i32::from(MADE.fetch_add(1, Ordering::Relaxed) >= most);
    let mut any_past = past;
    // SAFETY: one i32 of this frame, written by this call only.
    let flag = unsafe { BufMut::from_raw(&mut any_past as *mut i32 as *mut u8, 1, Dtype::I32) };
    let agreed = library
        .backend()
        .allreduce(comm, Input::InPlace, flag, ReduceOp::Max);
    if agreed.is_ok() && any_past == 0 {
        return Ok(comm);
    }
    MADE.fetch_sub(1, Ordering::Relaxed);
    library.comm_free(comm)?;
    agreed?;
    let who = match past {
        1 => "this process",
        _ => "another of these processes",
    };
    Err(Error::library(
        "communicators",
        format!(
            "a communicator among processes {processes:?} (for devices {devices:?}) is \
             needed, and {who} already made the most jaxmpi makes ({most}, \
             JAXMPI_MAX_COMMUNICATORS). Each set of devices a collective or a MeshComm \
             spans over several processes takes one for the rest of the job, as does each \
             set of processes a permute's connected devices span: raise the limit where \
             the MPI library has context ids to spare (MPICH has 2,048 a process), or use \
             fewer distinct meshes"
        ),
    ))
}

/// A communicator made once (a group's, by every process of the group:
/// MPI_Comm_create_group is collective over them). Every call after the first reads it
/// without a lock; of the first ones to come, one makes it under `making`, so it is never
/// made twice.
pub(super) struct Made {
    comm: OnceLock<Comm>,
    making: Mutex<()>,
}

impl Made {
    pub(super) const fn new() -> Made {
        Made {
            comm: OnceLock::new(),
            making: Mutex::new(()),
        }
    }

    pub(super) fn get(&self, make: impl FnOnce() -> Result<Comm>) -> Result<Comm> {
        if let Some(&comm) = self.comm.get() {
            return Ok(comm);
        }
        let _making = self.making.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&comm) = self.comm.get() {
            return Ok(comm);
        }
        let comm = make()?;
        Ok(*self.comm.get_or_init(|| comm))
    }

    pub(super) fn made(&self) -> Option<Comm> {
        self.comm.get().copied()
    }
}
