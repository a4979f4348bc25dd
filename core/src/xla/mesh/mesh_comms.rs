//! The MeshComms this process made: communicators whose ranks are devices (a mesh's, in
//! mesh order), so that jaxmpi's ops run inside a `shard_map` whose processes drive
//! several devices each. A program carries one as a negative `comm` id (MPI
//! communicators' ids are positive: `frame/handles.rs`), the one place that rule
//! lives in Rust (`is_mesh_comm`).
//!
//! Constructing one is collective over the processes of its devices, as
//! MPI_Comm_create_group is: each makes there the communicators of its groups that span
//! processes, so that every process of a group makes them at the same point of its program,
//! whatever its devices later do.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use super::group::{self, Kind, MESH_COMM_TAG};
use crate::xla::devices;
use crate::{Error, Library, Result, ThreadLevel};

/// A MeshComm's groups of devices (global ids, in rank order); each device is in one at
/// most (several: one communicator per slice of a mesh, as `Split` gives).
type Groups = Arc<Vec<Vec<i64>>>;

fn registered() -> MutexGuard<'static, Vec<Groups>> {
    static REGISTERED: Mutex<Vec<Groups>> = Mutex::new(Vec::new());
    REGISTERED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether a program's `comm` id names a MeshComm.
pub fn is_mesh_comm(id: i64) -> bool {
    id < 0
}

/// Registers the MeshComm of `groups`, makes the communicators among processes of the
/// groups this process is in, and returns the id programs carry (the same for the same
/// groups, and in every run that registers them in the same order).
pub fn register(library: &dyn Library, groups: Vec<Vec<i64>>) -> Result<i64> {
    let mut seen = HashSet::new();
    if let Some(device) = groups.iter().flatten().find(|&&d| !seen.insert(d)) {
        return Err(Error::invalid_argument(
            "MeshComm",
            format!("device {device} is a rank of two of its groups"),
        ));
    }
    if groups.iter().any(Vec::is_empty) {
        return Err(Error::invalid_argument("MeshComm", "a group has no device"));
    }
    // A device of no process of this job is named now, not at the first op.
    for &device in groups.iter().flatten() {
        devices::owner(device)?;
    }
    threads_enough(library, &groups)?;
    // One constructor at a time makes communicators (their tag is one for all), apart
    // from the registry, which device threads read meanwhile.
    static MAKING: Mutex<()> = Mutex::new(());
    let _making = MAKING.lock().unwrap_or_else(|p| p.into_inner());
    for devices in &groups {
        group::group(library, Kind::MeshComm, devices)?.make(library, MESH_COMM_TAG)?;
    }
    let mut registered = registered();
    let index = match registered.iter().position(|g| **g == groups) {
        Some(index) => index,
        None => {
            registered.push(Arc::new(groups));
            registered.len() - 1
        }
    };
    Ok(-(index as i64) - 1)
}

/// Refuses a MeshComm some process of which holds several devices where MPI cannot be
/// called from several threads at once: each device calls MPI from its own thread (and,
/// at one process of several devices, meets its process's others under a monitor that
/// would let one in and refuse the rest). The same verdict on every process, from the
/// devices' owners alone, before any process makes a communicator.
fn threads_enough(library: &dyn Library, groups: &[Vec<i64>]) -> Result<()> {
    let level = library.thread_level();
    if level >= ThreadLevel::Multiple {
        return Ok(());
    }
    let mut held: BTreeMap<i32, usize> = BTreeMap::new();
    for &device in groups.iter().flatten() {
        *held.entry(devices::owner(device)?).or_default() += 1;
    }
    // The first process of the most devices: the same words on every process.
    match held.into_iter().rev().max_by_key(|&(_, n)| n) {
        Some((process, n)) if n > 1 => Err(Error::unsupported(
            "MeshComm",
            format!(
                "{n} devices of process {process} are its ranks, each calling MPI from its \
                 own thread, which needs MPI_THREAD_MULTIPLE (MPI runs at {}): let jaxmpi or \
                 mpi4py initialize MPI (both ask for it)",
                level.name()
            ),
        )),
        _ => Ok(()),
    }
}

/// The groups of the MeshComm `id`.
pub fn groups(id: i64) -> Result<Groups> {
    let index = usize::try_from(-(id + 1)).unwrap_or(usize::MAX);
    registered().get(index).cloned().ok_or_else(|| {
        Error::invalid_argument(
            "comm",
            format!("= {id} names no MeshComm this process has made"),
        )
    })
}
