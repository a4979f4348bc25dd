//! Device communicators: communicators whose ranks are devices (a mesh's, in mesh order;
//! `jaxmpi.MeshComm`), so that jaxmpi's ops run inside a `shard_map` whose processes
//! drive several devices each. Every op of the table runs on one unchanged: its body is
//! handed `OnDevices`, this call's device as a rank, as its `Library` and `Backend`.
//!
//! An op describes this device's part as the halves of the messages it sends and receives
//! (`device_messages.rs` moves them: copies inside a process, MPI between processes). A
//! reduction receives every contributing rank's operand and combines them on the device,
//! in rank order: `x0 op (x1 op (... op xn))`, the same order whatever the layout, so its
//! result is the same, bit for bit, on 4 processes of 1 device, 2 of 2 or 1 of 4.
//!
//! A program carries a device communicator as a negative `comm` id (MPI communicators'
//! ids are positive: `handles.rs`).

use std::cell::RefCell;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use super::device_groups::{self, Group};
use super::device_messages::{move_parts, Half, Part, Traffic};
use super::Call;
use crate::xla::devices;
use crate::{
    Backend, Broadcast, Buf, BufMut, Comm, Dtype, Envelope, Error, Input, Library, LibraryInfo,
    NativeStatus, Partition, PartitionMut, Peer, Progress, ReduceOp, Request, Result, Started,
    Status, ThreadLevel,
};

/// The `Comm` an op's attributes hold on a device communicator: never an MPI handle
/// (MPICH's are 32-bit, Open MPI's pointers, the standard ABI's small constants), and
/// never handed to MPI: the call's `OnDevices` ignores it.
pub const ON_DEVICES: Comm = Comm(usize::MAX);

/// A device communicator: its groups of devices (global ids, in rank order); each device
/// is in one at most (several: one communicator per slice of a mesh, as `Split` gives).
struct DeviceComm {
    groups: Vec<Vec<i64>>,
    /// How many of its devices this process drives.
    local_devices: usize,
}

fn comms() -> MutexGuard<'static, Vec<Arc<DeviceComm>>> {
    static COMMS: Mutex<Vec<Arc<DeviceComm>>> = Mutex::new(Vec::new());
    COMMS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Registers the device communicator of `groups` and returns the id programs carry (the
/// same for the same groups, and in every run that registers them in the same order).
pub fn register(groups: Vec<Vec<i64>>, me: i32) -> Result<i64> {
    let mut seen = std::collections::HashSet::new();
    let mut local_devices = 0;
    for &device in groups.iter().flatten() {
        if !seen.insert(device) {
            return Err(Error::invalid_argument(
                "MeshComm",
                format!("device {device} is a rank of two of its groups"),
            ));
        }
        if devices::owner(device)? == me {
            local_devices += 1;
        }
    }
    if groups.iter().any(Vec::is_empty) {
        return Err(Error::invalid_argument("MeshComm", "a group has no device"));
    }
    let mut comms = comms();
    let index = match comms.iter().position(|c| c.groups == groups) {
        Some(index) => index,
        None => {
            comms.push(Arc::new(DeviceComm {
                groups,
                local_devices,
            }));
            comms.len() - 1
        }
    };
    Ok(-(index as i64) - 1)
}

/// A call of an op on a device communicator: its device's group and rank there.
pub struct OnDevices {
    library: &'static dyn Library,
    group: Arc<Group>,
    rank: usize,
    /// Inside `Backend::start`: where the requests of the messages its point-to-point
    /// ops leave in flight go (collectives complete at their start).
    starting: Option<Arc<Mutex<Vec<Request>>>>,
}

/// (communicator id, device), and that device's group and rank there.
type Placed = ((i64, i64), Arc<Group>, usize);

thread_local! {
    /// Where each device this thread ran was found: once per thread, no lock after.
    static PLACED: RefCell<Vec<Placed>> = const { RefCell::new(Vec::new()) };
}

impl OnDevices {
    /// The call's place on its device communicator, if its `comm` is one.
    pub fn of(call: &Call, library: &'static dyn Library) -> Result<Option<OnDevices>> {
        let Some(id) = call.optional_i64("comm").filter(|&id| id < 0) else {
            return Ok(None);
        };
        let device = call.device()?;
        let known = PLACED.with_borrow(|placed| {
            placed
                .iter()
                .find(|(key, _, _)| *key == (id, device))
                .map(|(_, group, rank)| (group.clone(), *rank))
        });
        let (group, rank) = match known {
            Some(place) => place,
            None => {
                let place = Self::place(library, id, device)?;
                PLACED.with_borrow_mut(|placed| {
                    placed.push(((id, device), place.0.clone(), place.1));
                });
                place
            }
        };
        Ok(Some(OnDevices {
            library,
            group,
            rank,
            starting: None,
        }))
    }

    fn place(library: &dyn Library, id: i64, device: i64) -> Result<(Arc<Group>, usize)> {
        let index = usize::try_from(-(id + 1)).unwrap_or(usize::MAX);
        let comm = comms().get(index).cloned().ok_or_else(|| {
            Error::invalid_argument(
                "comm",
                format!("= {id} names no device communicator this process has made"),
            )
        })?;
        if comm.local_devices > 1 && library.thread_level() < ThreadLevel::Multiple {
            return Err(Error::unsupported(
                "comm",
                format!(
                    "{} devices of this process are ranks of a device communicator, each \
                     calling MPI from its own thread, which needs MPI_THREAD_MULTIPLE (MPI \
                     runs at {}): let jaxmpi or mpi4py initialize MPI (both ask for it)",
                    comm.local_devices,
                    library.thread_level().name()
                ),
            ));
        }
        let (members, rank) = comm
            .groups
            .iter()
            .find_map(|g| g.iter().position(|&d| d == device).map(|r| (g, r)))
            .ok_or_else(|| {
                Error::invalid_argument(
                    "comm",
                    format!(
                        "device {device} runs the op but is no rank of its MeshComm: make \
                         the communicator from the mesh the shard_map runs on"
                    ),
                )
            })?;
        Ok((device_groups::group(library, members)?, rank))
    }

    /// This call's rank: its device's place in its group.
    pub fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.group.size()
    }

    /// Moves this device's part of the op, with the process's other devices of the group.
    fn run(&self, mut part: Part, traffic: Traffic) -> Result<()> {
        if traffic == Traffic::PointToPoint {
            part.started = self.starting.clone();
        }
        let (group, library) = (&*self.group, self.library);
        let host = library.backend();
        if group.local.len() == 1 {
            return move_parts(group, library, host, &[part], traffic);
        }
        let slot = group.slot(self.rank);
        group.parts.meet(slot, part, |parts| {
            move_parts(group, library, host, parts, traffic)
        })
    }

    fn to(&self, to: usize, at: usize, bytes: usize) -> Half {
        Half {
            from: self.rank,
            to,
            at,
            bytes,
            tag: Some(0),
        }
    }

    fn from(&self, from: usize, at: usize, bytes: usize) -> Half {
        Half {
            from,
            to: self.rank,
            at,
            bytes,
            tag: Some(0),
        }
    }

    /// A rooted op's root, checked.
    fn rank_named(&self, rank: i32, what: &'static str) -> Result<usize> {
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
    fn peer(&self, peer: Peer, what: &'static str) -> Result<Option<usize>> {
        match peer {
            Peer::Null => Ok(None),
            Peer::Rank(rank) => self.rank_named(rank, what).map(Some),
            Peer::Any => Err(Error::unsupported(
                what,
                "ANY_SOURCE on a device communicator is not built: name the source rank",
            )),
        }
    }

    /// Every rank's `b` bytes from `from` received into a scratch buffer, block by rank,
    /// each at its rank's place; then `recv = x_first op (... op x_last)` over `ranks`.
    fn reduce_from(
        &self,
        part: Part,
        ranks: Range<usize>,
        recv: &BufMut,
        op: ReduceOp,
        scratch: &Scratch,
    ) -> Result<()> {
        self.run(part, Traffic::Collective)?;
        let (count, dtype, b) = (recv.count(), recv.dtype(), recv.len_bytes());
        let Some(last) = ranks.clone().last() else {
            return Ok(());
        };
        // SAFETY: the scratch holds a block of `b` bytes per rank; `recv` is `b` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(scratch.at(last * b), recv.ptr(), b);
        }
        for j in ranks.rev().skip(1) {
            // SAFETY: block `j` of the scratch, `count` elements of `dtype`; `recv` is
            // this call's own result, written by nobody else now.
            let (x, y) = unsafe {
                (
                    Buf::from_raw(scratch.at(j * b), count, dtype),
                    BufMut::from_raw(recv.ptr(), count, dtype),
                )
            };
            self.library.backend().reduce_local(x, y, op)?;
        }
        Ok(())
    }
}

/// Memory for every rank's contribution to a reduction, aligned for any dtype.
/// Written through its address only (by copies and MPI), hence kept as one.
struct Scratch {
    _memory: Vec<u128>,
    start: *mut u8,
}

impl Scratch {
    fn new(bytes: usize) -> Scratch {
        let mut memory = vec![0u128; bytes.div_ceil(16)];
        let start = memory.as_mut_ptr() as *mut u8;
        Scratch {
            _memory: memory,
            start,
        }
    }

    fn at(&self, offset: usize) -> *mut u8 {
        // SAFETY: offsets stay inside the buffer (callers ask for whole blocks of it).
        unsafe { self.start.add(offset) }
    }
}

/// Where a reduction's operand is: its own buffer, or the result's (in place).
fn input_at(send: &Input, recv: &BufMut) -> usize {
    match send {
        Input::Data(buf) => buf.ptr() as usize,
        Input::InPlace => recv.ptr() as usize,
    }
}

/// A non-null address for messages of no bytes.
fn nowhere() -> usize {
    std::ptr::NonNull::<u128>::dangling().as_ptr() as usize
}

/// A device communicator's ops start their messages through `Backend::start` only (its
/// `send` and `recv`, starting); nothing calls `isend`/`irecv` on it directly.
fn not_direct(what: &'static str) -> Error {
    Error::unsupported(
        what,
        "internal error: a device communicator starts its messages through Backend::start",
    )
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
        Err(Error::unsupported(
            "comm",
            "a device communicator is not duplicated",
        ))
    }
    fn comm_split(&self, _: Comm, _: Option<i32>, _: i32) -> Result<Option<Comm>> {
        Err(Error::unsupported(
            "comm",
            "a device communicator is not split",
        ))
    }
    fn comm_free(&self, _: Comm) -> Result<()> {
        Ok(())
    }
    fn comm_create_group(&self, ranks: &[i32], tag: i32) -> Result<Comm> {
        self.library.comm_create_group(ranks, tag)
    }
    fn node_local_rank(&self, _: Comm) -> Result<(i32, i32)> {
        Err(Error::unsupported(
            "comm",
            "a device communicator has no nodes",
        ))
    }
    fn backend(&self) -> &dyn Backend {
        self
    }
}

impl Backend for OnDevices {
    fn reduce_local(&self, src: Buf, dst: BufMut, op: ReduceOp) -> Result<()> {
        self.library.backend().reduce_local(src, dst, op)
    }

    fn barrier(&self, _: Comm) -> Result<()> {
        let n = self.size();
        let part = Part::new(
            (0..n).map(|q| self.to(q, nowhere(), 0)).collect(),
            (0..n).map(|p| self.from(p, nowhere(), 0)).collect(),
        );
        self.run(part, Traffic::Collective)
    }

    fn allreduce(&self, _: Comm, send: Input, recv: BufMut, op: ReduceOp) -> Result<()> {
        let (n, b, x) = (self.size(), recv.len_bytes(), input_at(&send, &recv));
        let scratch = Scratch::new(n * b);
        let part = Part::new(
            (0..n).map(|q| self.to(q, x, b)).collect(),
            (0..n)
                .map(|p| self.from(p, scratch.at(p * b) as usize, b))
                .collect(),
        );
        self.reduce_from(part, 0..n, &recv, op, &scratch)
    }

    fn reduce(&self, _: Comm, send: Input, recv: BufMut, op: ReduceOp, root: i32) -> Result<()> {
        let root = self.rank_named(root, "root")?;
        let (n, x) = (self.size(), input_at(&send, &recv));
        let b = match &send {
            Input::Data(buf) => buf.len_bytes(),
            Input::InPlace => recv.len_bytes(),
        };
        let at_root = self.rank == root;
        let scratch = Scratch::new(if at_root { n * b } else { 0 });
        let receives = if at_root {
            (0..n)
                .map(|p| self.from(p, scratch.at(p * b) as usize, b))
                .collect()
        } else {
            Vec::new()
        };
        let part = Part::new(vec![self.to(root, x, b)], receives);
        if !at_root {
            return self.run(part, Traffic::Collective);
        }
        self.reduce_from(part, 0..n, &recv, op, &scratch)
    }

    fn scan(&self, _: Comm, send: Input, recv: BufMut, op: ReduceOp) -> Result<()> {
        let (n, me, b, x) = (
            self.size(),
            self.rank,
            recv.len_bytes(),
            input_at(&send, &recv),
        );
        let scratch = Scratch::new(n * b);
        let part = Part::new(
            (me..n).map(|q| self.to(q, x, b)).collect(),
            (0..=me)
                .map(|p| self.from(p, scratch.at(p * b) as usize, b))
                .collect(),
        );
        self.reduce_from(part, 0..me + 1, &recv, op, &scratch)
    }

    fn exscan(&self, _: Comm, send: Input, recv: BufMut, op: ReduceOp) -> Result<()> {
        let (n, me, b, x) = (
            self.size(),
            self.rank,
            recv.len_bytes(),
            input_at(&send, &recv),
        );
        let scratch = Scratch::new(n * b);
        let part = Part::new(
            (me + 1..n).map(|q| self.to(q, x, b)).collect(),
            (0..me)
                .map(|p| self.from(p, scratch.at(p * b) as usize, b))
                .collect(),
        );
        self.reduce_from(part, 0..me, &recv, op, &scratch)
    }

    fn reduce_scatter(&self, _: Comm, send: Buf, recv: BufMut, op: ReduceOp) -> Result<()> {
        let (n, b, x) = (self.size(), recv.len_bytes(), send.ptr() as usize);
        let scratch = Scratch::new(n * b);
        let part = Part::new(
            (0..n).map(|q| self.to(q, x + q * b, b)).collect(),
            (0..n)
                .map(|p| self.from(p, scratch.at(p * b) as usize, b))
                .collect(),
        );
        self.reduce_from(part, 0..n, &recv, op, &scratch)
    }

    /// On a device communicator every rank binds the result, the root's holding its
    /// message already (the result aliases the operand), so the root sends whatever side
    /// its body names.
    fn bcast(&self, _: Comm, buf: Broadcast, root: i32) -> Result<()> {
        let root = self.rank_named(root, "root")?;
        let (at, b) = match &buf {
            Broadcast::Root(buf) => (buf.ptr() as usize, buf.len_bytes()),
            Broadcast::Receiver(buf) => (buf.ptr() as usize, buf.len_bytes()),
        };
        let part = if self.rank == root {
            Part::new(
                (0..self.size())
                    .filter(|&q| q != root)
                    .map(|q| self.to(q, at, b))
                    .collect(),
                Vec::new(),
            )
        } else {
            Part::new(Vec::new(), vec![self.from(root, at, b)])
        };
        self.run(part, Traffic::Collective)
    }

    /// Away from the root, a result bound on a device communicator is zeros.
    fn gather(&self, _: Comm, send: Buf, recv: BufMut, root: i32) -> Result<()> {
        let root = self.rank_named(root, "root")?;
        let b = send.len_bytes();
        let at_root = self.rank == root;
        let part = Part::new(
            vec![self.to(root, send.ptr() as usize, b)],
            if at_root {
                (0..self.size())
                    .map(|p| self.from(p, recv.ptr() as usize + p * b, b))
                    .collect()
            } else {
                Vec::new()
            },
        );
        if !at_root {
            self.fill_zeros(recv)?;
        }
        self.run(part, Traffic::Collective)
    }

    fn allgather(&self, _: Comm, send: Buf, recv: BufMut) -> Result<()> {
        let (n, b) = (self.size(), send.len_bytes());
        let part = Part::new(
            (0..n).map(|q| self.to(q, send.ptr() as usize, b)).collect(),
            (0..n)
                .map(|p| self.from(p, recv.ptr() as usize + p * b, b))
                .collect(),
        );
        self.run(part, Traffic::Collective)
    }

    fn scatter(&self, _: Comm, send: Buf, recv: BufMut, root: i32) -> Result<()> {
        let root = self.rank_named(root, "root")?;
        let b = recv.len_bytes();
        let sends = if self.rank == root {
            (0..self.size())
                .map(|q| self.to(q, send.ptr() as usize + q * b, b))
                .collect()
        } else {
            Vec::new()
        };
        let part = Part::new(sends, vec![self.from(root, recv.ptr() as usize, b)]);
        self.run(part, Traffic::Collective)
    }

    fn alltoall(&self, _: Comm, send: Buf, recv: BufMut) -> Result<()> {
        let n = self.size();
        let b = recv.len_bytes() / n;
        let part = Part::new(
            (0..n)
                .map(|q| self.to(q, send.ptr() as usize + q * b, b))
                .collect(),
            (0..n)
                .map(|p| self.from(p, recv.ptr() as usize + p * b, b))
                .collect(),
        );
        self.run(part, Traffic::Collective)
    }

    fn gatherv(&self, _: Comm, send: Buf, recv: PartitionMut, root: i32) -> Result<()> {
        let root = self.rank_named(root, "root")?;
        let receives = if self.rank == root {
            self.blocks_in(&recv)
        } else {
            Vec::new()
        };
        let part = Part::new(
            vec![self.to(root, send.ptr() as usize, send.len_bytes())],
            receives,
        );
        self.run(part, Traffic::Collective)
    }

    fn allgatherv(&self, _: Comm, send: Buf, recv: PartitionMut) -> Result<()> {
        let part = Part::new(
            (0..self.size())
                .map(|q| self.to(q, send.ptr() as usize, send.len_bytes()))
                .collect(),
            self.blocks_in(&recv),
        );
        self.run(part, Traffic::Collective)
    }

    fn scatterv(&self, _: Comm, send: Partition, recv: BufMut, root: i32) -> Result<()> {
        let root = self.rank_named(root, "root")?;
        let sends = if self.rank == root {
            self.blocks_out(&send)
        } else {
            Vec::new()
        };
        let part = Part::new(
            sends,
            vec![self.from(root, recv.ptr() as usize, recv.len_bytes())],
        );
        self.run(part, Traffic::Collective)
    }

    fn alltoallv(&self, _: Comm, send: Partition, recv: PartitionMut) -> Result<()> {
        let part = Part::new(self.blocks_out(&send), self.blocks_in(&recv));
        self.run(part, Traffic::Collective)
    }

    fn send(&self, _: Comm, buf: Buf, dest: Peer, tag: i32) -> Result<()> {
        let Some(to) = self.peer(dest, "dest")? else {
            return Ok(());
        };
        let part = Part::new(
            vec![Half {
                tag: Some(tag),
                ..self.to(to, buf.ptr() as usize, buf.len_bytes())
            }],
            Vec::new(),
        );
        self.run(part, Traffic::PointToPoint)
    }

    fn recv(&self, _: Comm, buf: BufMut, source: Peer, tag: Option<i32>) -> Result<Status> {
        let Some(from) = self.peer(source, "source")? else {
            return Ok(received(None, None, 0));
        };
        let part = Part::new(
            Vec::new(),
            vec![Half {
                tag,
                ..self.from(from, buf.ptr() as usize, buf.len_bytes())
            }],
        );
        self.run(part, Traffic::PointToPoint)?;
        if self.starting.is_some() {
            return Ok(Status::not_yet());
        }
        Ok(received(Some(from), tag, buf.count()))
    }

    fn sendrecv(&self, sendbuf: Input, recvbuf: BufMut, envelope: Envelope) -> Result<Status> {
        let to = self.peer(envelope.dest, "dest")?;
        let from = self.peer(envelope.source, "source")?;
        // In place, the outgoing message is copied aside before the receive overwrites it.
        let aside: Vec<u8>;
        let (at, bytes) = match &sendbuf {
            Input::Data(buf) => (buf.ptr() as usize, buf.len_bytes()),
            Input::InPlace => {
                // SAFETY: this call's own result, `len_bytes` long.
                aside = unsafe {
                    std::slice::from_raw_parts(recvbuf.ptr(), recvbuf.len_bytes()).to_vec()
                };
                (aside.as_ptr() as usize, aside.len())
            }
        };
        let part = Part::new(
            to.map(|to| Half {
                tag: Some(envelope.sendtag),
                ..self.to(to, at, bytes)
            })
            .into_iter()
            .collect(),
            from.map(|from| Half {
                tag: envelope.recvtag,
                ..self.from(from, recvbuf.ptr() as usize, recvbuf.len_bytes())
            })
            .into_iter()
            .collect(),
        );
        self.run(part, Traffic::PointToPoint)?;
        Ok(received(from, envelope.recvtag, recvbuf.count()))
    }

    unsafe fn isend(&self, _: Comm, _: Buf, _: Peer, _: i32) -> Result<Request> {
        Err(not_direct("isend"))
    }
    unsafe fn irecv(&self, _: Comm, _: BufMut, _: Peer, _: Option<i32>) -> Result<Request> {
        Err(not_direct("irecv"))
    }
    /// Point to point, the messages between processes stay in flight until the wait, and
    /// a receive from a device of this process whose send comes later waits for it there;
    /// a collective completes at its start (as in progress mode `at-start`).
    unsafe fn start(&self, ops: &mut dyn FnMut(&dyn Backend) -> Result<()>) -> Result<Started> {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let starting = OnDevices {
            starting: Some(requests.clone()),
            group: self.group.clone(),
            ..*self
        };
        let outcome = ops(&starting);
        let requests = std::mem::take(&mut *requests.lock().unwrap_or_else(|p| p.into_inner()));
        if let Err(err) = outcome {
            for mut request in requests {
                let _ = self.library.backend().wait(&mut request);
            }
            return Err(err);
        }
        Ok(Started {
            requests,
            keep: Vec::new(),
        })
    }
    // The requests `start` returns are the host library's own.
    fn test(&self, request: &mut Request) -> Result<Progress> {
        self.library.backend().test(request)
    }
    fn wait(&self, request: &mut Request) -> Result<Progress> {
        self.library.backend().wait(request)
    }
    fn abandon(&self, request: Request) -> Result<()> {
        self.library.backend().abandon(request)
    }
}

impl OnDevices {
    /// A v-op's blocks as the messages this rank sends, block q to rank q.
    fn blocks_out(&self, send: &Partition) -> Vec<Half> {
        let size = send.buf.dtype().size();
        let base = send.buf.ptr() as usize;
        (send.blocks.counts.iter().zip(send.blocks.displs))
            .enumerate()
            .map(|(q, (&count, &displ))| self.to(q, base + displ * size, count * size))
            .collect()
    }

    /// A v-op's blocks as the messages this rank receives, block p from rank p.
    fn blocks_in(&self, recv: &PartitionMut) -> Vec<Half> {
        let size = recv.buf.dtype().size();
        let base = recv.buf.ptr() as usize;
        (recv.blocks.counts.iter().zip(recv.blocks.displs))
            .enumerate()
            .map(|(p, (&count, &displ))| self.from(p, base + displ * size, count * size))
            .collect()
    }
}

/// What a receive on a device communicator reports: the rank it named, the tag it asked
/// for, the elements of its buffer (jaxmpi's receives take whole messages).
fn received(from: Option<usize>, tag: Option<i32>, count: usize) -> Status {
    Status {
        source: from.map_or(Peer::Null, |r| Peer::Rank(r as i32)),
        tag,
        error: 0,
        count,
        native: NativeStatus {
            bytes: [0; 32],
            len: 0,
        },
    }
}
