//! Where a device stands in one of XLA's collectives (`hlo.rs`): its group, the processes
//! that group spans, the MPI communicator among them, and the meeting of the group's
//! devices that share this process.
//!
//! A group is named by its devices (global ids, in group order), which are the same on
//! every rank and every run: its communicator is made the first time the group meets,
//! by the processes it spans only (MPI_Comm_create_group), in the order their calls reach
//! it, which the module's token makes the same everywhere. With one device per process
//! (the common case), a group's communicator ranks are its positions and the call is one
//! MPI collective on the devices' own buffers. With several devices of a group in one
//! process, they meet (`Group::meet`): the last to arrive does the whole process's part
//! (local copies and reductions, and the MPI calls), then everyone returns.

use std::cell::RefCell;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::device_messages::{move_parts, Half, Part, Traffic};
use super::signature::Devices;
use super::Call;
use crate::xla::devices;
use crate::{Backend, Buf, BufMut, Comm, Dtype, Error, ErrorKind, Library, Result};

/// One device's buffers at a meeting: its operands and results.
#[derive(Clone, Copy, Debug)]
pub struct Span {
    pub ptr: usize,
    pub count: usize,
    pub dtype: Dtype,
}

impl Span {
    pub fn bytes(&self) -> usize {
        self.count * self.dtype.size()
    }

    /// # Safety
    /// The span must be a live buffer of the call that made it, which is still running.
    pub unsafe fn buf<'a>(&self) -> Buf<'a> {
        // SAFETY: forwarded from the caller.
        unsafe { Buf::from_raw(self.ptr as *const u8, self.count, self.dtype) }
    }

    /// # Safety
    /// As `buf`, and nobody else writes it meanwhile.
    pub unsafe fn buf_mut<'a>(&self) -> BufMut<'a> {
        // SAFETY: forwarded from the caller.
        unsafe { BufMut::from_raw(self.ptr as *mut u8, self.count, self.dtype) }
    }
}

/// What a device brings to a meeting.
#[derive(Clone, Debug, Default)]
pub struct Seat {
    pub args: Vec<Span>,
    pub rets: Vec<Span>,
}

pub struct Group {
    pub devices: Vec<i64>,
    /// The world rank owning each position.
    owners: Vec<i32>,
    /// The processes the group spans, in the order they first appear in it: the ranks of
    /// its communicator.
    processes: Vec<i32>,
    /// The positions this process holds, in order.
    pub local: Vec<usize>,
    comm: Mutex<Option<Comm>>,
    /// A second communicator among the same processes, for the messages of jaxmpi's
    /// point-to-point ops on a device communicator (`device_ranks.rs`): a user's pending
    /// send there can never match a collective's message on `comm`.
    p2p: Mutex<Option<Comm>>,
    room: Room<Seat>,
    /// The meetings of jaxmpi's own ops on a device communicator (`device_messages.rs`).
    pub(super) parts: Room<Part>,
}

impl Group {
    fn new(devices: &[i64], me: i32) -> Result<Group> {
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
        Ok(Group {
            devices: devices.to_vec(),
            room: Room::new(local.len()),
            parts: Room::new(local.len()),
            owners,
            processes,
            local,
            comm: Mutex::new(None),
            p2p: Mutex::new(None),
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

    pub fn is_local(&self, position: usize) -> bool {
        self.local.contains(&position)
    }

    /// The rank, in the group's communicator, of the process holding `position`.
    pub fn rank_of(&self, position: usize) -> i32 {
        let owner = self.owners[position];
        self.processes.iter().position(|&p| p == owner).unwrap_or(0) as i32
    }

    /// The slot of `position` among this process's positions (its place at meetings).
    pub fn slot(&self, position: usize) -> usize {
        self.local.iter().position(|&p| p == position).unwrap_or(0)
    }

    /// The communicator among the group's processes, made at the first call.
    pub fn comm(&self, library: &dyn Library) -> Result<Comm> {
        self.made(&self.comm, library, 0)
    }

    /// The communicator for point-to-point messages among the group's processes.
    pub fn p2p_comm(&self, library: &dyn Library) -> Result<Comm> {
        self.made(&self.p2p, library, 16_000)
    }

    fn made(&self, slot: &Mutex<Option<Comm>>, library: &dyn Library, salt: u64) -> Result<Comm> {
        let mut made = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(comm) = *made {
            return Ok(comm);
        }
        // Distinct tags for groups whose communicators different threads of this process
        // may be making at once; the group's devices are the same on every rank.
        let tag = (fnv(&self.devices).wrapping_add(salt) % 32_000) as i32;
        let comm = library.comm_create_group(&self.processes, tag)?;
        *made = Some(comm);
        Ok(comm)
    }

    /// Meets this process's other devices of the group for the same call: the last one to
    /// arrive runs `run` on every device's seat (in position order), and each gets its
    /// outcome.
    pub fn meet(
        &self,
        position: usize,
        seat: Seat,
        run: impl FnOnce(&[Seat]) -> Result<()>,
    ) -> Result<()> {
        self.room.meet(self.slot(position), seat, run)
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

/// The group of `devices` as this process sees it.
pub fn group(library: &dyn Library, devices: &[i64]) -> Result<Arc<Group>> {
    if let Some(group) = groups().get(devices) {
        return Ok(group.clone());
    }
    let me = library.comm_rank(library.world())?;
    let group = Arc::new(Group::new(devices, me)?);
    Ok(groups().entry(devices.to_vec()).or_insert(group).clone())
}

/// How an XLA collective names its devices.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    /// In groups: each group's size, then its devices.
    Groups,
    /// In (source, target) pairs: one group of every device they name.
    Pairs,
}

/// The group of `device` among `flat` devices named the `naming` way, and its position
/// there; None where a pair names no such device.
fn find(naming: Naming, flat: &[i64], device: i64) -> Result<Option<(Vec<i64>, usize)>> {
    match naming {
        Naming::Groups => {
            let mut at = 0;
            while at < flat.len() {
                let len = usize::try_from(flat[at]).unwrap_or(usize::MAX);
                let group = flat
                    .get(at + 1..(at + 1).saturating_add(len))
                    .ok_or_else(|| {
                        Error::invalid_argument("groups", "the attribute is cut short")
                    })?;
                if let Some(position) = group.iter().position(|&d| d == device) {
                    return Ok(Some((group.to_vec(), position)));
                }
                at += 1 + len;
            }
            Err(Error::invalid_argument(
                "groups",
                format!("device {device} is in none of the collective's groups"),
            ))
        }
        Naming::Pairs => {
            let mut named = Vec::new();
            for &d in flat {
                if !named.contains(&d) {
                    named.push(d);
                }
            }
            Ok(named.iter().position(|&d| d == device).map(|p| (named, p)))
        }
    }
}

/// A group found for a call before, by where its attribute lies and the device.
struct Found {
    key: (usize, usize, i64),
    /// The attribute's contents then: the memory may hold another program's since.
    devices: Box<[i64]>,
    place: Option<(Arc<Group>, usize)>,
}

thread_local! {
    static FOUND: RefCell<Vec<Found>> = const { RefCell::new(Vec::new()) };
}

/// How many groups a thread remembers (a program rarely has more than a few).
const REMEMBERED: usize = 64;

/// This call's device's group and position in `devices` (named the `naming` way), or None
/// where a pair names it not. Found once per program and thread: a call after the first
/// compares the attribute with what it held then, and takes no lock.
pub fn placed(
    call: &Call,
    library: &dyn Library,
    devices: &Devices,
    naming: Naming,
) -> Result<Option<(Arc<Group>, usize)>> {
    let device = call.device()?;
    let flat = devices.of(call);
    let (at, len) = devices.key();
    let key = (at, len, device);
    let known = FOUND.with_borrow(|found| {
        found
            .iter()
            .find(|f| f.key == key && *f.devices == *flat)
            .map(|f| f.place.clone())
    });
    if let Some(place) = known {
        return Ok(place);
    }
    let place = match find(naming, flat, device)? {
        Some((members, position)) => Some((group(library, &members)?, position)),
        None => None,
    };
    FOUND.with_borrow_mut(|found| {
        if found.len() == REMEMBERED {
            found.remove(0);
        }
        found.push(Found {
            key,
            devices: flat.into(),
            place: place.clone(),
        });
    });
    Ok(place)
}

/// How long a member waiting for its round yields its core before it sleeps: a round of
/// small messages takes microseconds, and being woken from a condition variable on a busy
/// machine about as many again (a halo exchange of 256 bytes at 2 processes x 2 devices
/// on 2 cores: 48 µs a step sleeping at once, 31 µs yielding first; benches/RESULTS.md).
const YIELDING: Duration = Duration::from_micros(200);

/// Where the devices of one process meet, call after call, each bringing an `S`.
pub(super) struct Room<S> {
    members: usize,
    state: Mutex<RoomState<S>>,
    changed: Condvar,
    /// Rounds completed: they complete in order (a member's next call comes after its
    /// last returned), so a waiter of round n is done once this passes n.
    done: AtomicU64,
}

struct RoomState<S> {
    /// Each member's next call number: the n-th call of every member is the same call.
    next: Vec<u64>,
    rounds: HashMap<u64, Round<S>>,
}

struct Round<S> {
    seats: Vec<Option<S>>,
    arrived: usize,
    outcome: Option<Result<()>>,
    collected: usize,
}

impl<S: Clone + Default> Room<S> {
    fn new(members: usize) -> Room<S> {
        Room {
            members,
            state: Mutex::new(RoomState {
                next: vec![0; members],
                rounds: HashMap::new(),
            }),
            changed: Condvar::new(),
            done: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, RoomState<S>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn meet(
        &self,
        slot: usize,
        seat: S,
        run: impl FnOnce(&[S]) -> Result<()>,
    ) -> Result<()> {
        let members = self.members;
        let mut state = self.lock();
        let number = state.next[slot];
        state.next[slot] += 1;
        let round = state.rounds.entry(number).or_insert_with(|| Round {
            seats: vec![None; members],
            arrived: 0,
            outcome: None,
            collected: 0,
        });
        round.seats[slot] = Some(seat);
        round.arrived += 1;
        if round.arrived == members {
            let seats: Vec<S> = round
                .seats
                .iter_mut()
                .map(|s| s.take().unwrap_or_default())
                .collect();
            drop(state);
            // Everyone else waits for this outcome: a panic must become one.
            let outcome = catch_unwind(AssertUnwindSafe(|| run(&seats))).unwrap_or_else(|_| {
                Err(Error::new(
                    ErrorKind::Unsupported,
                    "collective",
                    "internal error (panic) while the devices of this process met",
                ))
            });
            state = self.lock();
            if let Some(round) = state.rounds.get_mut(&number) {
                round.outcome = Some(outcome);
            }
            self.done.store(number + 1, Ordering::Release);
            self.changed.notify_all();
        } else {
            // A round takes microseconds: yielding the core to the members still to
            // arrive (and to the one that runs it) until it is done costs less than
            // sleeping on the condition variable and being woken.
            drop(state);
            let start = Instant::now();
            while self.done.load(Ordering::Acquire) <= number && start.elapsed() < YIELDING {
                std::thread::yield_now();
            }
            state = self.lock();
        }
        loop {
            let round = state.rounds.get_mut(&number);
            if let Some(outcome) = round.as_ref().and_then(|r| r.outcome.clone()) {
                let round = state.rounds.get_mut(&number).expect("the round just read");
                round.collected += 1;
                if round.collected == members {
                    state.rounds.remove(&number);
                }
                return outcome;
            }
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// One message of a point-to-point plan: `bytes` from position `from` to position `to`,
/// at `send` in the sender's memory and `recv` in the receiver's (each known, and used,
/// only where that side is local).
#[derive(Clone, Copy, Debug)]
pub struct Piece {
    pub from: usize,
    pub to: usize,
    pub bytes: usize,
    pub send: usize,
    pub recv: usize,
}

/// Moves every piece this process sends or receives, as the halves of the local devices'
/// messages (`device_messages::move_parts`: between its own devices a copy, between
/// processes MPI on the group's communicator). Every process lists the pieces in the same
/// order, so the pieces between the same two devices match in that order.
pub fn exchange(
    group: &Group,
    library: &dyn Library,
    backend: &dyn Backend,
    pieces: &[Piece],
) -> Result<()> {
    let mut parts = vec![Part::default(); group.local.len()];
    for piece in pieces.iter().filter(|p| p.bytes > 0) {
        let half = |at| Half {
            from: piece.from,
            to: piece.to,
            at,
            bytes: piece.bytes,
            tag: Some(0),
        };
        if group.is_local(piece.from) {
            parts[group.slot(piece.from)].sends.push(half(piece.send));
        }
        if group.is_local(piece.to) {
            parts[group.slot(piece.to)].receives.push(half(piece.recv));
        }
    }
    move_parts(group, library, backend, &parts, Traffic::Collective)
}
