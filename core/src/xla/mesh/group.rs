//! A group: devices (global ids, in rank order) that take part in one collective together,
//! as XLA's collectives name them and as a `MeshComm` holds them. The same on every
//! process and every run, a group is known by its devices; this process keeps one
//! `Group` per group it is in: the processes the group spans, its communicators among
//! them, and the room where this process's devices of the group meet.
//!
//! With one device per process (the common case), a group's communicator ranks are its
//! positions, and a collective is one MPI call on the devices' own buffers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use super::room::Room;
use super::seat::Seat;
use crate::xla::devices;
use crate::{Comm, Error, Library, Result, ThreadLevel};

pub struct Group {
    pub devices: Vec<i64>,
    /// The world rank owning each position.
    owners: Vec<i32>,
    /// The processes the group spans, in the order they first appear in it: the ranks of
    /// its communicators.
    processes: Vec<i32>,
    /// The positions this process holds, in order.
    pub local: Vec<usize>,
    /// The tag its communicators are made with (`Tag`).
    tag: i32,
    even: bool,
    comm: Made,
    /// A second communicator among the same processes, for the messages of jaxmpi's
    /// point-to-point ops on a MeshComm: a user's pending send there can never match a
    /// collective's message on `comm`.
    p2p: Made,
    room: Room<Seat>,
}

impl Group {
    fn new(devices: &[i64], me: i32, tag: i32) -> Result<Group> {
        let owners = devices
            .iter()
            .map(|&d| devices::owner(d))
            .collect::<Result<Vec<_>>>()?;
        let mut processes = Vec::new();
        for &p in &owners {
            if !processes.contains(&p) {
                processes.push(p);
            }
        }
        let local: Vec<usize> = (0..owners.len()).filter(|&i| owners[i] == me).collect();
        let held = |p: &i32| owners.iter().filter(|&o| o == p).count();
        let even = processes.iter().all(|p| held(p) == held(&processes[0]));
        Ok(Group {
            devices: devices.to_vec(),
            room: Room::new(local.len()),
            owners,
            processes,
            local,
            tag,
            even,
            comm: Made::new(),
            p2p: Made::new(),
        })
    }

    pub fn size(&self) -> usize {
        self.devices.len()
    }

    /// Every position in a process of its own: then communicator ranks are positions.
    pub fn distinct(&self) -> bool {
        self.processes.len() == self.owners.len()
    }

    pub fn spans_processes(&self) -> bool {
        self.processes.len() > 1
    }

    /// How many processes the group spans: the size of its communicators.
    pub fn processes(&self) -> usize {
        self.processes.len()
    }

    pub fn is_local(&self, position: usize) -> bool {
        self.local.contains(&position)
    }

    /// The rank, in the group's communicators, of the process holding `position`.
    pub fn rank_of(&self, position: usize) -> i32 {
        let owner = self.owners[position];
        self.processes.iter().position(|&p| p == owner).unwrap_or(0) as i32
    }

    /// The positions held by the process of communicator rank `rank`, in order.
    pub fn positions_of(&self, rank: usize) -> impl Iterator<Item = usize> + '_ {
        let owner = self.processes[rank];
        (0..self.owners.len()).filter(move |&p| self.owners[p] == owner)
    }

    /// Each process holds as many positions as every other: then the processes exchange
    /// equal blocks, by MPI's own collectives (known alike on every process: from the
    /// owners, not from this process's count).
    pub fn even(&self) -> bool {
        self.even
    }

    /// The slot of `position` among this process's positions (its place at meetings).
    pub fn slot(&self, position: usize) -> usize {
        self.local.iter().position(|&p| p == position).unwrap_or(0)
    }

    /// The communicator among the group's processes, made at the first call.
    pub fn comm(&self, library: &dyn Library) -> Result<Comm> {
        self.comm
            .get(|| library.comm_create_group(&self.processes, self.tag))
    }

    /// The communicator for point-to-point messages among the group's processes.
    pub fn p2p_comm(&self, library: &dyn Library) -> Result<Comm> {
        self.p2p
            .get(|| library.comm_create_group(&self.processes, self.tag + 1))
    }

    /// Meets this process's other devices of the group for the same call: the last one to
    /// arrive runs `run` on every device's seat (in position order), and each gets its
    /// outcome. A device alone in its process runs it at once.
    pub fn meet(
        &self,
        library: &dyn Library,
        position: usize,
        seat: Seat,
        run: impl FnOnce(&[Seat]) -> Result<()>,
    ) -> Result<()> {
        if self.local.len() == 1 {
            return run(&[seat]);
        }
        if library.thread_level() < ThreadLevel::Multiple {
            return Err(Error::unsupported(
                "comm",
                format!(
                    "{} devices of this process take part in one collective, each calling \
                     MPI from its own thread, which needs MPI_THREAD_MULTIPLE (MPI runs at \
                     {}): let jaxmpi or mpi4py initialize MPI (both ask for it)",
                    self.local.len(),
                    library.thread_level().name()
                ),
            ));
        }
        self.room.meet(self.slot(position), seat, run)
    }
}

/// A communicator made once, at its first use (a group's, by every process of the group:
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
}

/// The tags a collective's groups make their communicators with: MPI_Comm_create_group
/// calls that one process's threads make at once must carry distinct tags, or MPI may
/// pair one group's call with another's. The groups of one collective are made at once
/// (each device's thread makes its own group's), so each gets its own: its index in the
/// collective's list, two apart (its point-to-point communicator takes the odd one),
/// from a base taken from the whole list, which sets apart, by chance only, groups of
/// different collectives made at the same moment by devices at different steps.
#[derive(Clone, Copy)]
pub struct Tag {
    base: u64,
}

/// Pairs of tags: below every library's MPI_TAG_UB (the standard guarantees 32767), with
/// 31,999 kept for the mailbox's communicator of one process.
const PAIRS: u64 = 15_999;

impl Tag {
    /// For the groups of a collective whose devices, as it lists them, are `all`.
    pub fn of_list(all: &[i64]) -> Tag {
        Tag {
            base: fnv(all) % PAIRS,
        }
    }

    /// The tag of the list's `index`-th group (even; its point-to-point one is next).
    pub fn of(&self, index: usize) -> i32 {
        (2 * ((self.base + index as u64) % PAIRS)) as i32
    }
}

fn fnv(values: &[i64]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for v in values {
        for byte in v.to_le_bytes() {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

/// Every group this process has taken part in, by its devices.
fn groups() -> MutexGuard<'static, HashMap<Vec<i64>, Arc<Group>>> {
    static GROUPS: OnceLock<Mutex<HashMap<Vec<i64>, Arc<Group>>>> = OnceLock::new();
    GROUPS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The group of `devices` as this process sees it; `tag` names its communicators where
/// this is the first the process hears of it.
pub fn group(library: &dyn Library, devices: &[i64], tag: i32) -> Result<Arc<Group>> {
    if let Some(group) = groups().get(devices) {
        return Ok(group.clone());
    }
    let me = library.comm_rank(library.world())?;
    let group = Arc::new(Group::new(devices, me, tag)?);
    Ok(groups().entry(devices.to_vec()).or_insert(group).clone())
}
