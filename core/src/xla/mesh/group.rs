//! A group: devices (global ids, in rank order) that take part in one collective together,
//! as XLA's collectives name them and as a `MeshComm` holds them. The same on every
//! process and every run, a group is known by who names it (`Kind`) and its devices; this
//! process keeps one `Group` per group it is in: the processes the group spans, its
//! communicators among them (made where `make` says), and the room where this process's
//! devices of the group meet.
//!
//! With one device per process, listed in rank order (the common case), a group's
//! communicator ranks are its positions, and a collective is one MPI call on the
//! devices' own buffers (`aligned`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

pub use super::comm_sets::Kind;
use super::comm_sets::{self, Communicators};
use super::room::Room;
use super::seat::Seat;
use crate::xla::devices;
use crate::{Comm, Error, Library, Result};

pub struct Group {
    pub devices: Vec<i64>,
    /// The communicator rank of the process holding each position.
    ranks: Vec<u32>,
    /// The processes (world ranks) the group spans, ascending: the ranks of its
    /// communicators, which every group over the same devices shares.
    processes: Vec<i32>,
    /// Each communicator rank's positions, in order: rank r's are
    /// `positions[starts[r]..starts[r + 1]]`.
    positions: Vec<usize>,
    starts: Vec<usize>,
    /// Each position's place among its process's positions.
    places: Vec<u32>,
    /// The positions this process holds, in order.
    pub local: Vec<usize>,
    /// Each position's slot among `local`, `NOT_LOCAL` where another process holds it.
    slots: Vec<u32>,
    even: bool,
    aligned: bool,
    comms: Arc<Communicators>,
    kind: Kind,
    /// For a permute, each position's device's place among its process's devices
    /// (`devices::slot`) and the most devices a process holds: its messages' tags.
    tags: Option<(Vec<usize>, usize)>,
    room: Room<Seat>,
}

const NOT_LOCAL: u32 = u32::MAX;

/// A permute's tags name a device pair, `slot x most + slot`, below the 32,768 every
/// library allows: so up to 181 devices a process; past that a permute is a program's
/// group like the others, with a communicator per set of devices.
const MOST_TAGGED: usize = 181;

impl Group {
    /// The group of `devices`, whose owners (world ranks) are `owners`, as process `me`
    /// sees it; its communicators are those of every group over the same devices
    /// (`comm_sets`). O(n log n) for n devices, once: a world group of 16 k devices in
    /// about a millisecond (`planning_bench.rs`).
    pub(super) fn new(
        kind: Kind,
        devices: &[i64],
        owners: &[i32],
        me: i32,
        comms: Arc<Communicators>,
        tags: Option<(Vec<usize>, usize)>,
    ) -> Group {
        // Communicator ranks in the order of world ranks, so that every group over the same
        // devices, in whatever order, shares its communicators.
        let mut processes = owners.to_vec();
        processes.sort_unstable();
        processes.dedup();
        let rank_of_process: HashMap<i32, u32> = (0..processes.len() as u32)
            .map(|r| (processes[r as usize], r))
            .collect();
        let ranks: Vec<u32> = owners.iter().map(|p| rank_of_process[p]).collect();
        let aligned = processes.len() == ranks.len()
            && ranks.iter().enumerate().all(|(p, &r)| r as usize == p);
        let mut starts = vec![0; processes.len() + 1];
        for &r in &ranks {
            starts[r as usize + 1] += 1;
        }
        for r in 0..processes.len() {
            starts[r + 1] += starts[r];
        }
        let mut next = starts.clone();
        let mut positions = vec![0; ranks.len()];
        let mut places = vec![0; ranks.len()];
        for (position, &r) in ranks.iter().enumerate() {
            let r = r as usize;
            positions[next[r]] = position;
            places[position] = (next[r] - starts[r]) as u32;
            next[r] += 1;
        }
        let held = |r: usize| starts[r + 1] - starts[r];
        let even = (0..processes.len()).all(|r| held(r) == held(0));
        let local: Vec<usize> = match rank_of_process.get(&me) {
            Some(&r) => positions[starts[r as usize]..starts[r as usize + 1]].to_vec(),
            None => Vec::new(),
        };
        let mut slots = vec![NOT_LOCAL; ranks.len()];
        for (slot, &p) in local.iter().enumerate() {
            slots[p] = slot as u32;
        }
        Group {
            devices: devices.to_vec(),
            room: Room::new(local.len()),
            ranks,
            processes,
            positions,
            starts,
            places,
            local,
            slots,
            even,
            aligned,
            comms,
            kind,
            tags,
        }
    }

    pub fn size(&self) -> usize {
        self.devices.len()
    }

    /// Every position in a process of its own.
    pub fn distinct(&self) -> bool {
        self.processes.len() == self.ranks.len()
    }

    /// Every position in a process of its own, which is communicator rank `position`
    /// (processes in the order of their world ranks): then a collective is MPI's on the
    /// devices' own buffers. A group whose devices list processes in another order
    /// (a reordered mesh) packs as a process of several devices does.
    pub fn aligned(&self) -> bool {
        self.aligned
    }

    pub fn spans_processes(&self) -> bool {
        self.processes.len() > 1
    }

    /// How many processes the group spans: the size of its communicators.
    pub fn processes(&self) -> usize {
        self.processes.len()
    }

    pub fn is_local(&self, position: usize) -> bool {
        self.slots[position] != NOT_LOCAL
    }

    /// The rank, in the group's communicators, of the process holding `position`.
    pub fn rank_of(&self, position: usize) -> i32 {
        self.ranks[position] as i32
    }

    /// The positions held by the process of communicator rank `rank`, in order.
    pub fn positions_of(&self, rank: usize) -> impl Iterator<Item = usize> + '_ {
        self.positions[self.starts[rank]..self.starts[rank + 1]]
            .iter()
            .copied()
    }

    /// Whether the group's messages go point to point only (a permute's): its
    /// communicator is shared with groups that may run at the same time, which MPI's
    /// collectives cannot tell apart.
    pub fn point_to_point_only(&self) -> bool {
        self.kind == Kind::Permute
    }

    /// The tag of a message from position `from` to position `to`: a permute's names the
    /// two devices among their processes' (each device runs one call at a time, so no
    /// two messages in flight between two processes share a tag); 0 elsewhere, where the
    /// communicator is the group's own.
    pub fn tag(&self, from: usize, to: usize) -> i32 {
        match &self.tags {
            Some((slots, most)) => (slots[from] * most + slots[to]) as i32,
            None => 0,
        }
    }

    /// The place of `position` among its process's positions (`positions_of`).
    pub fn place_in_process(&self, position: usize) -> usize {
        self.places[position] as usize
    }

    /// How many positions the process of communicator rank `rank` holds.
    pub fn held(&self, rank: usize) -> usize {
        self.starts[rank + 1] - self.starts[rank]
    }

    /// How many positions the processes of communicator ranks below `rank` hold.
    pub fn held_before(&self, rank: usize) -> usize {
        self.starts[rank]
    }

    /// Each process holds as many positions as every other: then the processes exchange
    /// equal blocks, by MPI's own collectives (known alike on every process: from the
    /// owners, not from this process's count).
    pub fn even(&self) -> bool {
        self.even
    }

    /// The slot of `position` among this process's positions (its place at meetings).
    pub fn slot(&self, position: usize) -> usize {
        self.slots[position] as usize
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
        let make = |tag| comm_sets::create(library, &self.processes, &self.devices, tag);
        self.comms.comm.get(|| make(tag))?;
        if self.kind == Kind::MeshComm {
            self.comms.p2p.get(|| make(tag + 1))?;
        }
        Ok(())
    }

    /// The communicator among the group's processes.
    pub fn comm(&self) -> Result<Comm> {
        self.comms.comm.made().ok_or_else(|| self.not_made())
    }

    /// The communicator for point-to-point messages among the group's processes.
    pub fn p2p_comm(&self) -> Result<Comm> {
        self.comms.p2p.made().ok_or_else(|| self.not_made())
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
    let owners = devices
        .iter()
        .map(|&d| devices::owner(d))
        .collect::<Result<Vec<_>>>()?;
    let most = devices::most_per_process()?;
    let (made_as, tags) = match kind {
        Kind::Permute if most <= MOST_TAGGED => {
            let slots: Result<Vec<usize>> = devices.iter().map(|&d| devices::slot(d)).collect();
            (Kind::Permute, Some((slots?, most)))
        }
        Kind::Permute => (Kind::Program, None),
        other => (other, None),
    };
    let comms = match made_as {
        Kind::Permute => {
            let processes: Vec<i64> = owners.iter().map(|&p| i64::from(p)).collect();
            comm_sets::of(made_as, &processes)
        }
        _ => comm_sets::of(made_as, devices),
    };
    let group = Group::new(made_as, devices, &owners, me, comms, tags);
    Ok(groups().entry(key).or_insert(Arc::new(group)).clone())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::{Group, Kind};
    use crate::xla::mesh::comm_sets;
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
        let comms = comm_sets::of(Kind::Program, &[0, 1]);
        let group = Group::new(Kind::Program, &[0, 1], &[0, 0], 0, comms, None);
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
