//! A call of one of jaxmpi's ops on a MeshComm (`mesh_comms.rs`): the call's device as a
//! rank, `OnDevices`, which the op's unchanged body is handed as its `Library` and
//! `Backend` (`on_devices.rs`). The collectives run as every collective among devices
//! does (`collectives.rs`), scans along the ranks (`scans.rs`); the ops whose messages
//! only each device can name (point to point, rooted, variable counts) describe this
//! device's part as the halves of the messages it sends and receives (`messages.rs`).

use std::sync::{Arc, Mutex};

use super::group::Group;
use super::messages::{move_messages, Traffic};
use super::place::{placed, Naming};
use super::seat::{CallKey, Half, Seat, Span, Spans};
use crate::{Backend, Dtype, ReduceOp};
use crate::{Comm, Error, Library, LibraryInfo, Peer, Request, Result, ThreadLevel};

/// The `Comm` an op's attributes hold on a MeshComm: never an MPI handle (MPICH's are
/// 32-bit, Open MPI's pointers, the standard ABI's small constants), and never handed to
/// MPI: the call's `OnDevices` ignores it.
pub const ON_DEVICES: Comm = Comm(usize::MAX);

/// A call of an op on a MeshComm: its device's group and rank there.
pub struct OnDevices {
    pub(super) library: &'static dyn Library,
    pub(super) group: Arc<Group>,
    pub(super) rank: usize,
    /// Inside `Backend::start`: where the requests of the messages its point-to-point
    /// ops leave in flight go (collectives complete at their start).
    pub(super) starting: Option<Arc<Mutex<Vec<Request>>>>,
}

impl OnDevices {
    /// The call of `device` on the MeshComm `id`.
    pub fn at(library: &'static dyn Library, id: i64, device: i64) -> Result<OnDevices> {
        let place = placed(library, Naming::MeshComm(id), device)?
            .expect("a MeshComm places each of its devices or refuses it");
        Ok(OnDevices {
            library,
            group: place.group,
            rank: place.position,
            starting: None,
        })
    }

    /// The device at `position` of `group` as a rank of it: for what the devices of one of
    /// XLA's collectives agree on before it (checked mode).
    pub fn in_group(library: &'static dyn Library, group: Arc<Group>, position: usize) -> Self {
        OnDevices {
            library,
            group,
            rank: position,
            starting: None,
        }
    }

    /// This call's rank: its device's place in its group.
    pub fn rank(&self) -> usize {
        self.rank
    }

    pub(super) fn size(&self) -> usize {
        self.group.size()
    }

    /// Moves this device's messages of the op, with the process's other devices of the
    /// group.
    pub(super) fn run(&self, mut seat: Seat, traffic: Traffic) -> Result<()> {
        if traffic == Traffic::PointToPoint {
            seat.started = self.starting.clone();
        }
        let (group, library) = (&*self.group, self.library);
        let host = library.backend();
        group.meet(self.rank, seat, |seats| {
            move_messages(group, library, host, seats, traffic)
        })
    }

    /// Runs a collective of `collectives.rs` (the call `key`) on this device's buffers,
    /// with the process's other devices of the group.
    pub(super) fn collective(
        &self,
        key: CallKey,
        args: impl Into<Spans>,
        rets: impl Into<Spans>,
        run: impl FnOnce(&Group, &dyn Library, &dyn Backend, &[Seat]) -> Result<()>,
    ) -> Result<()> {
        let (group, library) = (&*self.group, self.library);
        let seat = Seat::of_buffers(key, args, rets);
        group.meet(self.rank, seat, |seats| {
            run(group, library, library.backend(), seats)
        })
    }

    pub(super) fn to(&self, to: usize, at: usize, bytes: usize) -> Half {
        Half {
            from: self.rank,
            to,
            at,
            bytes,
            tag: Some(0),
        }
    }

    pub(super) fn from(&self, from: usize, at: usize, bytes: usize) -> Half {
        Half {
            from,
            to: self.rank,
            at,
            bytes,
            tag: Some(0),
        }
    }

    /// A rooted op's root, checked.
    pub(super) fn rank_named(&self, rank: i32, what: &'static str) -> Result<usize> {
        usize::try_from(rank)
            .ok()
            .filter(|&r| r < self.size())
            .ok_or_else(|| {
                Error::invalid_argument(
                    what,
                    format!("= {rank} is no rank of a communicator of {}", self.size()),
                )
            })
    }

    /// A peer as a rank, None for PROC_NULL.
    pub(super) fn peer(&self, peer: Peer, what: &'static str) -> Result<Option<usize>> {
        match peer {
            Peer::Null => Ok(None),
            Peer::Rank(rank) => self.rank_named(rank, what).map(Some),
            Peer::Any => Err(Error::unsupported(
                what,
                "ANY_SOURCE on a MeshComm is not built: name the source rank",
            )),
        }
    }
}

/// A buffer of an op's call as a span of the meeting.
pub(super) fn span(ptr: *const u8, count: usize, dtype: Dtype) -> Span {
    Span {
        ptr: ptr as usize,
        count,
        dtype,
    }
}

impl Library for OnDevices {
    fn info(&self) -> &LibraryInfo {
        self.library.info()
    }
    fn thread_level(&self) -> ThreadLevel {
        self.library.thread_level()
    }
    fn initialized_here(&self) -> bool {
        self.library.initialized_here()
    }
    fn finalize(&self) -> Result<()> {
        self.library.finalize()
    }
    fn finalized(&self) -> bool {
        self.library.finalized()
    }
    fn cuda_aware(&self) -> bool {
        self.library.cuda_aware()
    }
    fn cuda_aware_reason(&self) -> &str {
        self.library.cuda_aware_reason()
    }
    fn cuda_aware_checks_buffers(&self) -> bool {
        self.library.cuda_aware_checks_buffers()
    }
    fn reduces_on_host(&self, dtype: Dtype, op: ReduceOp) -> bool {
        self.library.reduces_on_host(dtype, op)
    }
    fn reduce_in_place_reads_host(&self, root: i32) -> bool {
        self.library.reduce_in_place_reads_host(root)
    }
    fn abort(&self, code: i32) -> ! {
        self.library.abort(code)
    }
    fn return_errors_on(&self, _: Comm) -> Result<Option<usize>> {
        Ok(None) // the group's communicators return errors from the start
    }
    fn restore_errhandler(&self, _: Comm, _: usize) {}
    fn world(&self) -> Comm {
        self.library.world()
    }
    fn check_comm(&self, _: Comm) -> Result<()> {
        Ok(())
    }
    fn comm_rank(&self, _: Comm) -> Result<i32> {
        Ok(self.rank as i32)
    }
    fn comm_size(&self, _: Comm) -> Result<i32> {
        Ok(self.size() as i32)
    }
    fn comm_dup(&self, _: Comm) -> Result<Comm> {
        Err(Error::unsupported("comm", "a MeshComm is not duplicated"))
    }
    fn comm_split(&self, _: Comm, _: Option<i32>, _: i32) -> Result<Option<Comm>> {
        Err(Error::unsupported("comm", "a MeshComm is not split"))
    }
    fn comm_free(&self, _: Comm) -> Result<()> {
        Ok(())
    }
    fn comm_create_group(&self, ranks: &[i32], tag: i32) -> Result<Comm> {
        self.library.comm_create_group(ranks, tag)
    }
    fn node_local_rank(&self, _: Comm) -> Result<(i32, i32)> {
        Err(Error::unsupported("comm", "a MeshComm has no nodes"))
    }
    fn backend(&self) -> &dyn Backend {
        self
    }
}
