//! `Staged`: a backend decorator for GPU buffers over an MPI that only takes host memory.
//! Inputs are copied GPU→host on XLA's stream into pooled pinned buffers, the inner
//! backend runs on the host copies, results are copied host→GPU on the same stream.
//! allreduce and bcast are pipelined in the chunks every rank cuts them into (`chunks`),
//! so that copying chunk k+1 overlaps MPI on chunk k. Point-to-point messages are staged
//! whole: cutting one message into several would change what a receive matches (any
//! source, a larger receive buffer) and the status it reports.
//!
//! A GPU failure (a copy, an event, the stream) does not stop an op: this rank still
//! makes every MPI call of it, so that no other rank is left waiting in a call it never
//! makes, and the failure is returned at the end (the data this rank sent or received is
//! then undefined). Host buffers go back to the pool only once the stream is known to be
//! done with them; after a failure that leaves copies queued, they are kept out of it.
//! Over `unusable::Unusable` (a rank that could not prepare its part of a call) every
//! GPU operation fails: an op then makes its MPI calls on host scratch memory alone.

use std::cell::RefCell;

use jaxmpi_core::{
    Backend, Broadcast, Buf, BufMut, Comm, Dtype, Envelope, Error, Input, Library, Partition,
    PartitionMut, Peer, Progress, ReduceOp, Request, Result, Status,
};

use super::{GpuMemory, Marker, PinnedBuffer, PinnedPool, Stats};
use crate::chunks::{chunks_of, each_chunk, CHUNK_BYTES};

pub struct Staged<'a> {
    /// Asked which rank this is, where a buffer is significant at the root alone.
    library: &'a dyn Library,
    inner: &'a dyn Backend,
    gpu: &'a dyn GpuMemory,
    pool: &'a PinnedPool,
    stats: &'a Stats,
    chunk_bytes: usize,
}

/// The host buffers one op borrows: pinned ones from the pool, or pageable memory where
/// pinning failed (slower copies, same results).
struct Loans<'a> {
    pool: &'a PinnedPool,
    stats: &'a Stats,
    pinned: RefCell<Vec<PinnedBuffer>>,
    pageable: RefCell<Vec<Box<[u8]>>>,
}

impl<'a> Loans<'a> {
    fn host(&self, gpu: &dyn GpuMemory, len: usize) -> *mut u8 {
        match self.pool.take(gpu, len) {
            Ok(buffer) => {
                let ptr = buffer.ptr();
                self.pinned.borrow_mut().push(buffer);
                ptr
            }
            Err(_) => {
                Stats::bump(&self.stats.pageable);
                let mut memory = vec![0u8; len.max(1)].into_boxed_slice();
                let ptr = memory.as_mut_ptr();
                self.pageable.borrow_mut().push(memory);
                ptr
            }
        }
    }

    /// Back to the pool, once the stream has done everything queued on them.
    fn give_back(&self) {
        for buffer in self.pinned.take() {
            self.pool.give_back(buffer);
        }
        self.pageable.take();
    }
}

impl Drop for Loans<'_> {
    fn drop(&mut self) {
        // Still held: the stream could not be waited for, and copies queued on these
        // buffers may still run. Reused or freed they could be written after; leaking them
        // is the safe loss (the GPU is failing anyway).
        let pinned = std::mem::take(self.pinned.get_mut());
        let pageable = std::mem::take(self.pageable.get_mut());
        let withheld = (pinned.len() + pageable.len()) as u64;
        self.stats
            .withheld
            .fetch_add(withheld, std::sync::atomic::Ordering::Relaxed);
        pinned.into_iter().for_each(std::mem::forget);
        pageable.into_iter().for_each(std::mem::forget);
    }
}

/// One op being staged: its host buffers and its first GPU failure.
struct Op<'s> {
    gpu: &'s dyn GpuMemory,
    loans: Loans<'s>,
    failure: RefCell<Option<Error>>,
}

impl Op<'_> {
    /// Keeps the first GPU failure; the op goes on (see the module's note).
    fn note<T>(&self, result: Result<T>) -> Option<T> {
        match result {
            Ok(value) => Some(value),
            Err(err) => {
                self.failure.borrow_mut().get_or_insert(err);
                None
            }
        }
    }

    fn host(&self, len: usize) -> *mut u8 {
        self.loans.host(self.gpu, len)
    }

    /// A host copy of `len` GPU bytes, queued on the stream.
    fn copy_in(&self, gpu: *const u8, len: usize) -> *mut u8 {
        let host = self.host(len);
        if len > 0 {
            self.note(self.gpu.copy_to_host_async(host, gpu, len));
        }
        host
    }

    fn copy_out(&self, host: *const u8, gpu: *mut u8, len: usize) {
        if len > 0 {
            self.note(self.gpu.copy_to_gpu_async(gpu, host, len));
        }
    }

    /// Blocks until the stream has done what was queued (before MPI reads host copies).
    fn synchronize(&self) {
        self.note(self.gpu.synchronize());
    }

    /// Marks the stream after a chunk's copy; waiting on it later waits for that copy.
    fn mark(&self) -> Option<Marker> {
        self.note(self.gpu.mark())
    }

    /// `count` elements at `ptr`, a host buffer of this op's loans.
    fn buf(&self, ptr: *const u8, count: usize, dtype: Dtype) -> Buf<'_> {
        // SAFETY: `ptr` points into a loan of at least count * size bytes, used by this op
        // alone and alive as long as the op (loans are never freed before its end).
        unsafe { Buf::from_raw(ptr, count, dtype) }
    }

    fn buf_mut(&self, ptr: *mut u8, count: usize, dtype: Dtype) -> BufMut<'_> {
        // SAFETY: as for `buf`; each op writes a loan through one buffer at a time.
        unsafe { BufMut::from_raw(ptr, count, dtype) }
    }

    /// Waits for a chunk's copy; a lost marker waits for the whole stream instead.
    fn wait(&self, marker: Option<Marker>) {
        match marker {
            Some(marker) => {
                self.note(self.gpu.wait(marker));
            }
            None => self.synchronize(),
        }
    }
}

/// The send buffer of a rank whose send buffer MPI ignores: null, as the handlers pass
/// where the call has no operand.
fn ignored<'b>(dtype: Dtype) -> Buf<'b> {
    // SAFETY: no elements: nothing is ever read through it.
    unsafe { Buf::from_raw(std::ptr::null(), 0, dtype) }
}

impl<'a> Staged<'a> {
    /// Staging for the ops of `library` on host memory (`Library::backend`).
    pub fn new(
        library: &'a dyn Library,
        gpu: &'a dyn GpuMemory,
        pool: &'a PinnedPool,
        stats: &'a Stats,
    ) -> Self {
        Staged {
            library,
            inner: library.backend(),
            gpu,
            pool,
            stats,
            chunk_bytes: CHUNK_BYTES,
        }
    }

    /// Smaller chunks, so unit tests at one rank pipeline small buffers. Never outside
    /// tests: every rank must cut the same chunks (`chunks`).
    #[cfg(test)]
    pub fn with_chunk_bytes(mut self, chunk_bytes: usize) -> Self {
        self.chunk_bytes = chunk_bytes.max(1);
        self
    }

    /// Runs one staged op: its host buffers go back to the pool once the stream is done;
    /// a GPU failure is returned over the op's own outcome.
    fn run<R>(&self, body: impl FnOnce(&Op) -> Result<R>) -> Result<R> {
        Stats::bump(&self.stats.staged);
        let op = Op {
            gpu: self.gpu,
            loans: Loans {
                pool: self.pool,
                stats: self.stats,
                pinned: RefCell::default(),
                pageable: RefCell::default(),
            },
            failure: RefCell::default(),
        };
        let outcome = body(&op);
        if op.note(self.gpu.synchronize()).is_some() {
            op.loans.give_back();
        }
        match op.failure.into_inner() {
            Some(mut err) => {
                err.message.push_str(
                    "; this rank still made the op's MPI calls (no other rank waits for it), \
                     but the data it sent or received is undefined",
                );
                Err(err)
            }
            None => outcome,
        }
    }

    /// The whole-buffer path: stage `send` in (and `recv` too when `read_recv`), run `call`
    /// on host copies, stage `recv` out.
    fn whole<R>(
        &self,
        send: Option<Buf>,
        recv: BufMut,
        read_recv: bool,
        call: impl FnOnce(Option<Buf>, BufMut) -> Result<R>,
    ) -> Result<R> {
        self.run(|op| {
            let send_host =
                send.map(|b| op.buf(op.copy_in(b.ptr(), b.len_bytes()), b.count(), b.dtype()));
            let (count, dtype, len) = (recv.count(), recv.dtype(), recv.len_bytes());
            let recv_host = if read_recv {
                op.copy_in(recv.ptr(), len)
            } else {
                op.host(len)
            };
            op.synchronize();
            let result = call(send_host, op.buf_mut(recv_host, count, dtype))?;
            op.copy_out(recv_host, recv.ptr(), len);
            Ok(result)
        })
    }

    /// An op with an `Input` send side staged whole (`InPlace` reads the receive buffer).
    fn staged_input<R>(
        &self,
        send: Input,
        recv: BufMut,
        call: impl FnOnce(Input, BufMut) -> Result<R>,
    ) -> Result<R> {
        match send {
            Input::Data(buf) => self.whole(Some(buf), recv, false, |s, r| {
                call(Input::Data(s.expect("staged send")), r)
            }),
            Input::InPlace => self.whole(None, recv, true, |_, r| call(Input::InPlace, r)),
        }
    }

    fn host_backend(&self) -> &dyn Backend {
        self.inner
    }

    fn chunks(&self, count: usize, dtype: Dtype) -> Vec<(usize, usize)> {
        chunks_of(count, dtype.size(), self.chunk_bytes)
    }

    /// Whether this rank is `root` of `comm`. Where MPI cannot say, as at the root: the
    /// buffer is staged for nothing at worst, and the op's own call reports the fault.
    fn at_root(&self, comm: Comm, root: i32) -> bool {
        self.library
            .comm_rank(comm)
            .map_or(true, |rank| rank == root)
    }
}

impl Backend for Staged<'_> {
    fn fill_zeros(&self, dst: BufMut) -> Result<()> {
        super::zero_on_stream(self.gpu, dst)
    }
    fn barrier(&self, comm: Comm) -> Result<()> {
        self.inner.barrier(comm)
    }

    /// Pipelined: chunk k+1 travels GPU→host while MPI reduces chunk k, and chunk k
    /// travels back while MPI reduces chunk k+1.
    fn allreduce(&self, comm: Comm, send: Input, recv: BufMut, op: ReduceOp) -> Result<()> {
        let (dtype, size, len) = (recv.dtype(), recv.dtype().size(), recv.len_bytes());
        let pieces = self.chunks(recv.count(), dtype);
        self.run(|o| {
            let (source, send_host) = match send {
                Input::Data(buf) => (buf.ptr(), Some(o.host(len))),
                Input::InPlace => (recv.ptr().cast_const(), None),
            };
            let recv_host = o.host(len);
            let staging = send_host.unwrap_or(recv_host);
            let arrived: Vec<Option<Marker>> = pieces
                .iter()
                .map(|&(start, n)| {
                    let at = start * size;
                    if n > 0 {
                        let copy = self.gpu.copy_to_host_async(
                            staging.wrapping_add(at),
                            source.wrapping_add(at),
                            n * size,
                        );
                        o.note(copy);
                    }
                    o.mark()
                })
                .collect();
            let mut k = 0;
            each_chunk(&pieces, |start, n| {
                o.wait(arrived[k]);
                k += 1;
                let at = start * size;
                let input = match send_host {
                    Some(_) => Input::Data(o.buf(staging.wrapping_add(at), n, dtype)),
                    None => Input::InPlace,
                };
                let output = o.buf_mut(recv_host.wrapping_add(at), n, dtype);
                Stats::bump(&self.stats.staged_chunks);
                self.inner.allreduce(comm, input, output, op)?;
                o.copy_out(
                    recv_host.wrapping_add(at),
                    recv.ptr().wrapping_add(at),
                    n * size,
                );
                Ok(())
            })
        })
    }

    fn reduce(&self, comm: Comm, send: Input, recv: BufMut, op: ReduceOp, root: i32) -> Result<()> {
        self.staged_input(send, recv, |s, r| self.inner.reduce(comm, s, r, op, root))
    }
    fn scan(&self, comm: Comm, send: Input, recv: BufMut, op: ReduceOp) -> Result<()> {
        self.staged_input(send, recv, |s, r| self.inner.scan(comm, s, r, op))
    }
    fn exscan(&self, comm: Comm, send: Input, recv: BufMut, op: ReduceOp) -> Result<()> {
        // Rank 0's result is "left as it was": read it in so the copy back keeps it.
        let keep = recv.len_bytes() > 0;
        match send {
            Input::Data(buf) => self.whole(Some(buf), recv, keep, |s, r| {
                self.inner
                    .exscan(comm, Input::Data(s.expect("staged send")), r, op)
            }),
            Input::InPlace => self.whole(None, recv, true, |_, r| {
                self.inner.exscan(comm, Input::InPlace, r, op)
            }),
        }
    }
    fn reduce_scatter(&self, comm: Comm, send: Buf, recv: BufMut, op: ReduceOp) -> Result<()> {
        self.whole(Some(send), recv, false, |s, r| {
            self.inner
                .reduce_scatter(comm, s.expect("staged send"), r, op)
        })
    }

    /// Pipelined: the root's chunk k+1 travels GPU→host while chunk k is broadcast;
    /// elsewhere chunk k travels host→GPU while chunk k+1 is received. A buffer `InPlace`
    /// travels both ways: which side this rank is on is MPI's to know, and the root's
    /// price is one copy back of its own message.
    fn bcast(&self, comm: Comm, buf: Broadcast, root: i32) -> Result<()> {
        let (dtype, size) = (buf.dtype(), buf.dtype().size());
        let (sent, received) = match &buf {
            Broadcast::Root(b) => (Some(b.ptr()), None),
            Broadcast::Receiver(b) => (None, Some(b.ptr())),
            Broadcast::InPlace(b) => (Some(b.ptr().cast_const()), Some(b.ptr())),
        };
        let pieces = self.chunks(buf.count(), dtype);
        self.run(|o| {
            let host = o.host(buf.count() * size);
            let arrived: Vec<Option<Marker>> = pieces
                .iter()
                .map(|&(start, n)| {
                    if let Some(gpu) = sent.filter(|_| n > 0) {
                        let at = start * size;
                        let copy = self.gpu.copy_to_host_async(
                            host.wrapping_add(at),
                            gpu.wrapping_add(at),
                            n * size,
                        );
                        o.note(copy);
                    }
                    o.mark()
                })
                .collect();
            let mut k = 0;
            each_chunk(&pieces, |start, n| {
                o.wait(arrived[k]);
                k += 1;
                let at = host.wrapping_add(start * size);
                let chunk = match (sent, received) {
                    (Some(_), Some(_)) => Broadcast::InPlace(o.buf_mut(at, n, dtype)),
                    (Some(_), None) => Broadcast::Root(o.buf(at, n, dtype)),
                    (None, _) => Broadcast::Receiver(o.buf_mut(at, n, dtype)),
                };
                Stats::bump(&self.stats.staged_chunks);
                self.inner.bcast(comm, chunk, root)?;
                if let Some(gpu) = received {
                    o.copy_out(at, gpu.wrapping_add(start * size), n * size);
                }
                Ok(())
            })
        })
    }

    fn gather(&self, comm: Comm, send: Buf, recv: BufMut, root: i32) -> Result<bool> {
        self.whole(Some(send), recv, false, |s, r| {
            self.inner.gather(comm, s.expect("staged send"), r, root)
        })
    }
    fn allgather(&self, comm: Comm, send: Buf, recv: BufMut) -> Result<()> {
        self.whole(Some(send), recv, false, |s, r| {
            self.inner.allgather(comm, s.expect("staged send"), r)
        })
    }
    /// The send table is staged at the root alone: MPI reads it nowhere else, and inside
    /// shard_map every rank passes the root's whole table (size x the received block).
    fn scatter(&self, comm: Comm, send: Buf, recv: BufMut, root: i32) -> Result<()> {
        let dtype = send.dtype();
        let send = self.at_root(comm, root).then_some(send);
        self.whole(send, recv, false, |s, r| {
            self.inner
                .scatter(comm, s.unwrap_or_else(|| ignored(dtype)), r, root)
        })
    }
    fn alltoall(&self, comm: Comm, send: Buf, recv: BufMut) -> Result<()> {
        self.whole(Some(send), recv, false, |s, r| {
            self.inner.alltoall(comm, s.expect("staged send"), r)
        })
    }
    fn gatherv(&self, comm: Comm, send: Buf, recv: PartitionMut, root: i32) -> Result<bool> {
        let blocks = recv.blocks;
        self.whole(Some(send), recv.buf, false, |s, r| {
            let recv = PartitionMut { buf: r, blocks };
            self.inner
                .gatherv(comm, s.expect("staged send"), recv, root)
        })
    }
    fn allgatherv(&self, comm: Comm, send: Buf, recv: PartitionMut) -> Result<()> {
        let blocks = recv.blocks;
        self.whole(Some(send), recv.buf, false, |s, r| {
            let recv = PartitionMut { buf: r, blocks };
            self.inner.allgatherv(comm, s.expect("staged send"), recv)
        })
    }
    /// As `scatter`: the send table is staged at the root alone.
    fn scatterv(&self, comm: Comm, send: Partition, recv: BufMut, root: i32) -> Result<()> {
        let (dtype, blocks) = (send.buf.dtype(), send.blocks);
        let table = self.at_root(comm, root).then_some(send.buf);
        self.whole(table, recv, false, |s, r| {
            let send = Partition {
                buf: s.unwrap_or_else(|| ignored(dtype)),
                blocks,
            };
            self.inner.scatterv(comm, send, r, root)
        })
    }
    fn alltoallv(&self, comm: Comm, send: Partition, recv: PartitionMut) -> Result<()> {
        let blocks = recv.blocks;
        self.whole(Some(send.buf), recv.buf, false, |s, r| {
            let send = Partition {
                buf: s.expect("staged send"),
                blocks: send.blocks,
            };
            let recv = PartitionMut { buf: r, blocks };
            self.inner.alltoallv(comm, send, recv)
        })
    }

    fn send(&self, comm: Comm, buf: Buf, dest: Peer, tag: i32) -> Result<()> {
        self.run(|o| {
            let host = o.copy_in(buf.ptr(), buf.len_bytes());
            o.synchronize();
            self.inner
                .send(comm, o.buf(host, buf.count(), buf.dtype()), dest, tag)
        })
    }
    fn recv(&self, comm: Comm, buf: BufMut, source: Peer, tag: Option<i32>) -> Result<Status> {
        self.whole(None, buf, false, |_, r| {
            self.inner.recv(comm, r, source, tag)
        })
    }
    /// In place, the receive buffer is staged in too: it holds the message to send.
    fn sendrecv(&self, sendbuf: Input, recvbuf: BufMut, envelope: Envelope) -> Result<Status> {
        self.staged_input(sendbuf, recvbuf, |s, r| self.inner.sendrecv(s, r, envelope))
    }
    host_requests_only!();
}

#[cfg(test)]
#[path = "staged_tests.rs"]
mod tests;
