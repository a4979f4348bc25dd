//! The two traits an MPI library implementation provides, and the process-wide slot holding
//! the one library chosen at run time.
//!
//! `Library` is the library itself: identity, lifetime, error handling and communicators.
//! `Backend` is the ops, one method per jaxmpi op; the library's own `Backend` takes host
//! memory, and GPU decorators (staging, CUDA-aware) wrap it to take GPU memory.
//!
//! Conventions shared by every op:
//! - counts are elements of the buffer's dtype, as `usize`: a backend must handle counts
//!   above 2^31-1 itself (large-count functions or chunking);
//! - ranks are ranks in `comm`; a buffer only significant at the root may be empty elsewhere;
//! - every call returns MPI failures as `Err`, never aborts.

use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::{
    Broadcast, Buf, BufMut, Comm, Dtype, Error, Input, LibraryInfo, Partition, PartitionMut, Peer,
    Progress, ReduceOp, Request, Result, Started, Status, ThreadLevel,
};

pub trait Library: Send + Sync {
    // --- identity and lifetime ---
    fn info(&self) -> &LibraryInfo;
    /// The thread level MPI was initialized with (by us or by whoever did it first).
    fn thread_level(&self) -> ThreadLevel;
    /// Whether this library called `MPI_Init_thread` (and so owns finalization).
    fn initialized_here(&self) -> bool;
    /// Finalizes MPI if this library initialized it and nobody finalized it yet.
    fn finalize(&self) -> Result<()>;
    /// Whether MPI has been finalized in this process, by anyone (MPI_Finalized).
    fn finalized(&self) -> bool;
    /// Whether the library can take GPU (CUDA) pointers directly.
    fn cuda_aware(&self) -> bool;
    /// Why the process passes GPU pointers to MPI or stages them, in words.
    fn cuda_aware_reason(&self) -> &str;
    /// Whether, CUDA-aware, GPU pointers go to MPI only for buffers that legacy CUDA IPC
    /// can share (decided automatically), rather than for every buffer (the user's word).
    fn cuda_aware_checks_buffers(&self) -> bool;
    /// Whether reducing `dtype` with `op` runs host code on the buffers (jaxmpi's own
    /// reductions, user ops): GPU memory must then be staged, CUDA-aware MPI or not.
    fn reduces_on_host(&self, dtype: Dtype, op: ReduceOp) -> bool;
    /// Whether an in-place `reduce` at `root` reads the receive buffer on the host (the
    /// workaround of a library bug), which GPU memory cannot take.
    fn reduce_in_place_reads_host(&self, root: i32) -> bool;
    /// Ends the whole job (MPI_Abort on the world communicator), for a call that can never
    /// finish: the launcher then tears down every rank.
    fn abort(&self, code: i32) -> !;

    // --- error handling (used through `ErrorsReturned`) ---
    /// Makes MPI errors on `comm` come back as codes if its error handler would do
    /// anything else: returns the handler to put back with `restore_errhandler`.
    fn return_errors_on(&self, comm: Comm) -> Result<Option<usize>>;
    fn restore_errhandler(&self, comm: Comm, handler: usize);

    // --- communicators ---
    fn world(&self) -> Comm;
    /// Checks that `comm` is a live intracommunicator handle of this library's family.
    fn check_comm(&self, comm: Comm) -> Result<()>;
    fn comm_rank(&self, comm: Comm) -> Result<i32>;
    fn comm_size(&self, comm: Comm) -> Result<i32>;
    /// Duplicates `comm`; the copy returns errors instead of aborting.
    fn comm_dup(&self, comm: Comm) -> Result<Comm>;
    /// `color: None` is MPI_UNDEFINED: the caller joins no new communicator.
    fn comm_split(&self, comm: Comm, color: Option<i32>, key: i32) -> Result<Option<Comm>>;
    fn comm_free(&self, comm: Comm) -> Result<()>;
    /// A new communicator of the world ranks `ranks`, ranked in that order, which returns
    /// errors. Collective over those ranks only (MPI_Comm_create_group): the others need
    /// not call it. Calls made at once from several threads of one process need distinct
    /// `tag`s.
    fn comm_create_group(&self, ranks: &[i32], tag: i32) -> Result<Comm>;
    /// This rank's (rank, size) among the ranks of `comm` that share its node
    /// (`MPI_COMM_TYPE_SHARED`). Collective over `comm`.
    fn node_local_rank(&self, comm: Comm) -> Result<(i32, i32)>;

    /// The ops on host memory.
    fn backend(&self) -> &dyn Backend;
}

/// MPI errors on a communicator come back as codes while this lives, whatever error handler
/// the user gave it; dropping the last one alive on that communicator, also when the op
/// body panics, puts that handler back. So a user's handler changes only while jaxmpi
/// works on the communicator: a call, or a started request until it completes.
pub struct ErrorsReturned<'a> {
    library: &'a dyn Library,
    comm: Comm,
}

/// Communicators some `ErrorsReturned` holds: how many, and the handler to put back after
/// the last. Counted, because a request completing on the progress agent's thread and an op
/// on another thread may hold the same communicator: neither may put the handler back
/// while the other still needs errors returned.
static RETURNING: Mutex<Vec<(Comm, usize, usize)>> = Mutex::new(Vec::new());

fn returning() -> MutexGuard<'static, Vec<(Comm, usize, usize)>> {
    // Every update is one push, increment or removal: a panic cannot leave one half done.
    RETURNING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<'a> ErrorsReturned<'a> {
    pub fn on(library: &'a dyn Library, comm: Comm) -> Result<Self> {
        let mut held = returning();
        if let Some(entry) = held.iter_mut().find(|(c, _, _)| *c == comm) {
            entry.1 += 1;
        } else if let Some(previous) = library.return_errors_on(comm)? {
            held.push((comm, 1, previous));
        }
        Ok(ErrorsReturned { library, comm })
    }
}

impl Drop for ErrorsReturned<'_> {
    fn drop(&mut self) {
        let mut held = returning();
        let Some(i) = held.iter().position(|(c, _, _)| *c == self.comm) else {
            return; // errors already returned on it before: nothing to put back
        };
        held[i].1 -= 1;
        if held[i].1 == 0 {
            let (comm, _, previous) = held.swap_remove(i);
            self.library.restore_errhandler(comm, previous);
        }
    }
}

/// A sendrecv's envelopes, as MPI calls them: the communicator, where its message goes
/// (`dest`, `sendtag`) and which message its receive matches (`source`, `recvtag`; `None`
/// is MPI_ANY_TAG).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Envelope {
    pub comm: Comm,
    pub dest: Peer,
    pub sendtag: i32,
    pub source: Peer,
    pub recvtag: Option<i32>,
}

pub trait Backend: Send + Sync {
    /// Sets every byte of `dst` to zero (memory an op body fills itself; GPU backends
    /// queue it on their stream).
    fn fill_zeros(&self, dst: BufMut) -> Result<()> {
        if dst.len_bytes() > 0 {
            // SAFETY: `dst` is writable for `len_bytes`, as its constructor promised.
            unsafe { std::ptr::write_bytes(dst.ptr(), 0, dst.len_bytes()) };
        }
        Ok(())
    }

    /// `dst = src op dst`, elementwise, on this process only (MPI_Reduce_local): how the
    /// devices of one process combine their parts before one of them talks to the others.
    fn reduce_local(&self, src: Buf, dst: BufMut, op: ReduceOp) -> Result<()> {
        let _ = (src, dst);
        Err(Error::unsupported(
            "reduce_local",
            format!("{op:?} across the devices of one process is not built for GPU memory"),
        ))
    }

    // --- collectives ---
    fn barrier(&self, comm: Comm) -> Result<()>;
    fn allreduce(&self, comm: Comm, send: Input, recv: BufMut, op: ReduceOp) -> Result<()>;
    /// `recv` is significant at `root` only. `Input::InPlace` is allowed on every rank:
    /// away from the root the input is in `recv` (where MPI_IN_PLACE would be erroneous).
    fn reduce(&self, comm: Comm, send: Input, recv: BufMut, op: ReduceOp, root: i32) -> Result<()>;
    /// Inclusive prefix reduction.
    fn scan(&self, comm: Comm, send: Input, recv: BufMut, op: ReduceOp) -> Result<()>;
    /// Exclusive prefix reduction; `recv` on rank 0 is left as it was.
    fn exscan(&self, comm: Comm, send: Input, recv: BufMut, op: ReduceOp) -> Result<()>;
    /// `send` holds `size` equal blocks; rank i receives the reduction of block i.
    fn reduce_scatter(&self, comm: Comm, send: Buf, recv: BufMut, op: ReduceOp) -> Result<()>;
    /// The root sends its (read-only) buffer; every other rank receives into its own.
    /// `Broadcast::InPlace` leaves telling the two apart to the backend.
    fn bcast(&self, comm: Comm, buf: Broadcast, root: i32) -> Result<()>;
    /// `recv` (at root only) holds `size` blocks of `send.count()` elements. Returns
    /// whether this rank is the root, which the backend learns anyway: a body that binds
    /// the root's result on every rank (inside shard_map) fills it with zeros elsewhere
    /// without asking the communicator again.
    fn gather(&self, comm: Comm, send: Buf, recv: BufMut, root: i32) -> Result<bool>;
    fn allgather(&self, comm: Comm, send: Buf, recv: BufMut) -> Result<()>;
    /// `send` (at root only) holds `size` blocks of `recv.count()` elements.
    fn scatter(&self, comm: Comm, send: Buf, recv: BufMut, root: i32) -> Result<()>;
    fn alltoall(&self, comm: Comm, send: Buf, recv: BufMut) -> Result<()>;

    // --- variable-count collectives: one block per rank, in elements ---
    /// `recv` is significant at `root` only. Returns whether this rank is the root, as
    /// `gather` does.
    fn gatherv(&self, comm: Comm, send: Buf, recv: PartitionMut, root: i32) -> Result<bool>;
    fn allgatherv(&self, comm: Comm, send: Buf, recv: PartitionMut) -> Result<()>;
    /// `send` is significant at `root` only.
    fn scatterv(&self, comm: Comm, send: Partition, recv: BufMut, root: i32) -> Result<()>;
    fn alltoallv(&self, comm: Comm, send: Partition, recv: PartitionMut) -> Result<()>;

    // --- point to point ---
    fn send(&self, comm: Comm, buf: Buf, dest: Peer, tag: i32) -> Result<()>;
    /// `tag: None` is MPI_ANY_TAG.
    fn recv(&self, comm: Comm, buf: BufMut, source: Peer, tag: Option<i32>) -> Result<Status>;
    /// `Input::InPlace` sends the contents of `recvbuf`, which then holds what came from
    /// `source` (kept as it was when `source` is `Peer::Null`); the library copies the
    /// outgoing message aside itself (MPI_Sendrecv_replace).
    fn sendrecv(&self, sendbuf: Input, recvbuf: BufMut, envelope: Envelope) -> Result<Status>;

    // --- non-blocking point to point: start, then `test` until done (or `wait`) ---
    /// Starts sending `buf`.
    ///
    /// # Safety
    /// `buf`'s memory must stay alive and unchanged until the request has completed.
    unsafe fn isend(&self, comm: Comm, buf: Buf, dest: Peer, tag: i32) -> Result<Request>;
    /// Starts receiving into `buf`; `tag: None` is MPI_ANY_TAG.
    ///
    /// # Safety
    /// `buf`'s memory must stay alive, and nobody else may touch it, until the request has
    /// completed.
    unsafe fn irecv(
        &self,
        comm: Comm,
        buf: BufMut,
        source: Peer,
        tag: Option<i32>,
    ) -> Result<Request>;
    /// Runs `ops` (calls of the backend it is given) in starting mode: each MPI call they
    /// make is the non-blocking twin of the blocking one (MPI_Iallreduce for MPI_Allreduce,
    /// MPI_Isend for MPI_Send, ...), and what was started is returned, to `test` or `wait`
    /// request by request. A receive returns `Status::not_yet()`. If `ops` fails, whatever
    /// it had started is waited for before the error returns. Backends that cannot start
    /// ops (GPU memory) refuse.
    ///
    /// # Safety
    /// Every buffer `ops` hands an op must stay alive, and be touched by nobody but MPI,
    /// until the requests have completed.
    unsafe fn start(&self, ops: &mut dyn FnMut(&dyn Backend) -> Result<()>) -> Result<Started> {
        let _ = ops;
        Err(Error::unsupported(
            "non-blocking",
            "starting an op on GPU memory is not built: the buffers would need staging \
             that lives until the wait",
        ))
    }
    /// Completes the request if its transfer is done (MPI_Test); never blocks. A request
    /// that completed, also with an error, must not be tested again.
    fn test(&self, request: &mut Request) -> Result<Progress>;
    /// Blocks until the request completes (MPI_Wait).
    fn wait(&self, request: &mut Request) -> Result<Progress>;
    /// Gives up a request nobody will wait for (at exit): a receive is cancelled, and the
    /// library frees the request once it is done (MPI_Cancel, MPI_Request_free).
    fn abandon(&self, request: Request) -> Result<()>;
}

static LIBRARY: OnceLock<Result<Box<dyn Library>, Error>> = OnceLock::new();

/// Installs the process-wide library by running `select` the first time only; every later
/// call, from any thread, gets the same library (or the same selection error) without
/// locking. A library cannot be replaced: two MPI libraries in one process never work.
pub fn install_library(
    select: impl FnOnce() -> Result<Box<dyn Library>>,
) -> Result<&'static dyn Library> {
    match LIBRARY.get_or_init(select) {
        Ok(library) => Ok(library.as_ref()),
        Err(err) => Err(err.clone()),
    }
}

/// The installed library, for code (such as an XLA handler) that runs after selection.
pub fn library() -> Result<&'static dyn Library> {
    match LIBRARY.get() {
        Some(Ok(library)) => Ok(library.as_ref()),
        Some(Err(err)) => Err(err.clone()),
        None => Err(Error::library(
            "backend",
            "no MPI backend has been selected yet in this process",
        )),
    }
}
