//! A group: devices (global ids, in rank order) that take part in one collective together,
//! as XLA's collectives name them and as a `MeshComm` holds them. The same on every
//! process and every run, a group is known by who names it (`Kind`) and its devices; this
//! process keeps one `Group` per group it is in: the processes the group spans, its
//! communicators among them (made where `make` says), and the room where this process's
//! devices of the group meet.
//!
//! With one device per process (the common case), a group's communicator ranks are its
//! positions, and a collective is one MPI call on the devices' own buffers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use super::room::Room;
use super::seat::Seat;
use crate::xla::devices;
use crate::{Comm, Error, Library, Result};

pub struct Group {
    pub devices: Vec<i64>,
    /// The world rank owning each position.
    owners: Vec<i32>,
    /// The processes the group spans, in the order they first appear in it: the ranks of
    /// its communicators.
    processes: Vec<i32>,
    /// The positions this process holds, in order.
    pub local: Vec<usize>,
    even: bool,
    comm: Made,
    /// A second communicator among the same processes, for the messages of jaxmpi's
    /// point-to-point ops on a MeshComm: a user's pending send there can never match a
    /// collective's message on `comm`.
    p2p: Made,
    kind: Kind,
    room: Room<Seat>,
}

/// Who names a group, and so where its communicators are made (`make`): a program's
/// collectives, in the program's prologue (`make_program_communicators`), or a MeshComm,
/// when it is constructed. The two keep their groups (and communicators, and rooms)
/// apart even over the same devices, so that neither ever waits for the other's making.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Program,
    MeshComm,
}

impl Group {
    fn new(kind: Kind, devices: &[i64], me: i32) -> Result<Group> {
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
            even,
            comm: Made::new(),
            p2p: Made::new(),
            kind,
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

    /// Makes the group's communicators among its processes (none where it spans one), if
    /// this process is one of them and they are not made yet, with `tag` (and the next
    /// one for a MeshComm's point-to-point communicator). Every process of the group makes
    /// them at the same point of its program (MPI_Comm_create_group is collective over
    /// them), whatever its own part in the collectives that follow: the first run of a
    /// program's prologue, or a MeshComm's construction.
    pub fn make(&self, library: &dyn Library, tag: i32) -> Result<()> {
        if self.local.is_empty() || !self.spans_processes() {
            return Ok(());
        }
        self.comm
            .get(|| library.comm_create_group(&self.processes, tag))?;
        if self.kind == Kind::MeshComm {
            self.p2p
                .get(|| library.comm_create_group(&self.processes, tag + 1))?;
        }
        Ok(())
    }

    /// The communicator among the group's processes.
    pub fn comm(&self) -> Result<Comm> {
        self.comm.made().ok_or_else(|| self.not_made())
    }

    /// The communicator for point-to-point messages among the group's processes.
    pub fn p2p_comm(&self) -> Result<Comm> {
        self.p2p.made().ok_or_else(|| self.not_made())
    }

    fn not_made(&self) -> Error {
        Error::unsupported(
            "comm",
            format!(
                "internal error: the communicator of devices {:?} was not made before their \
                 first collective",
                self.devices
            ),
        )
    }

    /// Meets this process's other devices of the group for the same call: the last one to
    /// arrive runs `run` on every device's seat (in position order), and each gets its
    /// outcome. A device alone in its process runs it at once. Each member's n-th call
    /// must be the same call (`Seat::key`): where the members' paths through the program
    /// differ, every member here fails, naming each one's call.
    pub fn meet(
        &self,
        position: usize,
        seat: Seat,
        run: impl FnOnce(&[Seat]) -> Result<()>,
    ) -> Result<()> {
        if self.local.len() == 1 {
            return run(&[seat]);
        }
        self.room.meet(self.slot(position), seat, |seats| {
            self.same_call(seats)?;
            run(seats)
        })
    }

    /// Fails where the seats of one meeting are not the same call, naming each device's.
    fn same_call(&self, seats: &[Seat]) -> Result<()> {
        if seats.iter().all(|s| s.same_call(&seats[0])) {
            return Ok(());
        }
        let calls: Vec<String> = self
            .local
            .iter()
            .zip(seats)
            .map(|(&p, s)| format!("device {} calls {}", self.devices[p], s.described()))
            .collect();
        Err(Error::invalid_argument(
            "collective",
            format!(
                "the devices of this process in the group of devices {:?} took different \
                 paths through the program: {}. Every member of a group makes the same \
                 collectives in the same order: a collective inside a cond, switch or \
                 while loop whose predicate or trip count differs between the members of \
                 its group cannot be matched",
                self.devices,
                calls.join(", ")
            ),
        ))
    }
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

    fn made(&self) -> Option<Comm> {
        self.comm.get().copied()
    }
}

/// The tags communicators are made with. MPI_Comm_create_group calls that one process's
/// threads make at once must carry distinct tags, or MPI may pair one group's call with
/// another's; the calls that can run at once here are set apart by construction:
/// - a MeshComm's, in its constructor: one constructor at a time in a process
///   (`mesh_comms::register`), so one pair of tags serves them all;
/// - a program's, in its prologue: one after another, each group its index in the
///   program's list past a base hashed from the list (`program_tag`), which sets apart
///   programs whose first runs overlap on disjoint devices of one process;
/// - the mailbox's communicator of one process alone (`MAILBOX_TAG`): no other process
///   takes part, so nothing can be paired with it.
pub const MESH_COMM_TAG: i32 = 1; // its point-to-point communicator's: 2
pub const MAILBOX_TAG: i32 = 31_999;
/// Programs' tags: every one from here to the mailbox's, below every library's
/// MPI_TAG_UB (the standard guarantees 32,767).
const PROGRAM_TAGS: std::ops::Range<u64> = 3..31_999;

/// The tag of the `index`-th group of a program whose groups, listed, are `all`.
pub fn program_tag(all: &[i64], index: usize) -> i32 {
    let span = PROGRAM_TAGS.end - PROGRAM_TAGS.start;
    (PROGRAM_TAGS.start + (fnv(all) + index as u64) % span) as i32
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

type Registry = HashMap<(Kind, Vec<i64>), Arc<Group>>;

/// Every group this process has taken part in, by who names it and its devices.
fn groups() -> MutexGuard<'static, Registry> {
    static GROUPS: OnceLock<Mutex<Registry>> = OnceLock::new();
    GROUPS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The group of `devices` that `kind` names, as this process sees it.
pub fn group(library: &dyn Library, kind: Kind, devices: &[i64]) -> Result<Arc<Group>> {
    let key = (kind, devices.to_vec());
    if let Some(group) = groups().get(&key) {
        return Ok(group.clone());
    }
    let me = library.comm_rank(library.world())?;
    let group = Arc::new(Group::new(kind, devices, me)?);
    Ok(groups().entry(key).or_insert(group).clone())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::{Group, Kind};
    use crate::xla::devices;
    use crate::xla::mesh::seat::{CallKey, Seat, Span};
    use crate::Dtype;

    fn seat(op: &'static str, count: usize) -> Seat {
        let span = Span {
            ptr: 0,
            count,
            dtype: Dtype::F32,
        };
        Seat::of_buffers(CallKey::new(op, 0), span, span)
    }

    /// Two devices of one process meet: `calls` is each one's, round after round.
    fn meet(group: &Group, calls: [&[Seat]; 2]) -> Vec<Vec<Result<(), String>>> {
        let ran = AtomicUsize::new(0);
        let outcomes: Vec<Vec<Result<(), String>>> = std::thread::scope(|scope| {
            let threads: Vec<_> = calls
                .iter()
                .enumerate()
                .map(|(position, seats)| {
                    let ran = &ran;
                    scope.spawn(move || {
                        seats
                            .iter()
                            .map(|s| {
                                group
                                    .meet(position, s.clone(), |_| {
                                        ran.fetch_add(1, Ordering::Relaxed);
                                        Ok(())
                                    })
                                    .map_err(|e| e.to_string())
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let runs = ran.load(Ordering::Relaxed);
        let agreed = outcomes[0].iter().filter(|o| o.is_ok()).count();
        assert_eq!(runs, agreed, "a round ran where its members' calls differ");
        outcomes
    }

    #[test]
    fn members_whose_calls_differ_all_fail_naming_each_call_and_meet_on() {
        devices::set_owners(&[(0, 0), (1, 0), (2, 1)]).unwrap();
        let group = Group::new(Kind::Program, &[0, 1], 0).unwrap();
        let first = [seat("hlo_all_reduce", 4), seat("hlo_all_reduce", 4)];
        let second = [seat("hlo_all_reduce", 4), seat("hlo_all_gather", 4)];
        let third = [seat("hlo_all_reduce", 4), seat("hlo_all_reduce", 2)];
        let calls = [
            &[
                first[0].clone(),
                second[0].clone(),
                third[0].clone(),
                first[0].clone(),
            ][..],
            &[
                first[1].clone(),
                second[1].clone(),
                third[1].clone(),
                first[1].clone(),
            ][..],
        ];
        let outcomes = meet(&group, calls);
        for device in &outcomes {
            assert!(device[0].is_ok() && device[3].is_ok(), "{device:?}");
            for round in &device[1..3] {
                let err = round.as_ref().unwrap_err();
                assert!(err.contains("took different paths"), "{err}");
                assert!(
                    err.contains("device 0 calls hlo_all_reduce float32[4]"),
                    "{err}"
                );
            }
            let err = device[1].as_ref().unwrap_err();
            assert!(
                err.contains("device 1 calls hlo_all_gather float32[4]"),
                "{err}"
            );
            let err = device[2].as_ref().unwrap_err();
            assert!(
                err.contains("device 1 calls hlo_all_reduce float32[2]"),
                "{err}"
            );
        }
    }
}
