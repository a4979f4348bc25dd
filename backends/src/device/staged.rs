//! `Staged`: a backend decorator for device buffers over an MPI that only takes host memory.
//! Inputs are copied device→host on XLA's stream into pooled pinned buffers, the inner
//! backend runs on the host copies, results are copied host→device on the same stream.
//! allreduce and bcast, whose chunks are independent MPI calls with the same count on every
//! rank, are cut into chunks so that copying chunk k+1 overlaps MPI on chunk k.
//! Point-to-point messages are staged whole: cutting one message into several would change
//! what a receive matches (any source, a larger receive buffer) and the status it reports.

use jaxmpi_core::{
    Backend, Broadcast, Buf, BufMut, Comm, Dtype, Envelope, Input, Partition, PartitionMut, Peer,
    Progress, ReduceOp, Request, Result, Status,
};

use super::{DeviceMemory, PinnedBuffer, PinnedPool};

/// Large enough that per-chunk MPI and event costs vanish next to the copy, small enough
/// that the pipeline fills early (the first chunk's copy is never hidden).
pub const DEFAULT_CHUNK_BYTES: usize = 4 << 20;

pub struct Staged<'a> {
    inner: &'a dyn Backend,
    device: &'a dyn DeviceMemory,
    pool: &'a PinnedPool,
    chunk_bytes: usize,
}

/// A pinned buffer on loan from the pool for one call.
struct Lease<'p> {
    pool: &'p PinnedPool,
    buffer: Option<PinnedBuffer>,
}

impl Lease<'_> {
    fn ptr(&self) -> *mut u8 {
        self.buffer
            .as_ref()
            .map_or(std::ptr::null_mut(), |b| b.ptr())
    }
    fn buf(&self, count: usize, dtype: Dtype) -> Buf<'_> {
        // SAFETY: the lease holds at least count * size bytes (taken for this buffer).
        unsafe { Buf::from_raw(self.ptr(), count, dtype) }
    }
    fn buf_mut(&self, count: usize, dtype: Dtype) -> BufMut<'_> {
        // SAFETY: as `buf`; the lease is used by this call alone.
        unsafe { BufMut::from_raw(self.ptr(), count, dtype) }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            self.pool.give_back(buffer);
        }
    }
}

/// (first element, elements) of each chunk; one empty chunk for an empty buffer, so the
/// MPI call still happens (and validates its arguments) on every rank.
fn chunks(count: usize, per_chunk: usize) -> Vec<(usize, usize)> {
    if count == 0 {
        return vec![(0, 0)];
    }
    (0..count)
        .step_by(per_chunk)
        .map(|start| (start, per_chunk.min(count - start)))
        .collect()
}

impl<'a> Staged<'a> {
    pub fn new(inner: &'a dyn Backend, device: &'a dyn DeviceMemory, pool: &'a PinnedPool) -> Self {
        Staged {
            inner,
            device,
            pool,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
        }
    }

    pub fn with_chunk_bytes(mut self, chunk_bytes: usize) -> Self {
        self.chunk_bytes = chunk_bytes.max(1);
        self
    }

    fn lease(&self, len: usize) -> Result<Lease<'a>> {
        Ok(Lease {
            pool: self.pool,
            buffer: Some(self.pool.take(self.device, len)?),
        })
    }

    /// A host copy of device bytes, queued on the stream.
    fn copy_in(&self, device: *const u8, len: usize) -> Result<Lease<'a>> {
        let lease = self.lease(len)?;
        if len > 0 {
            self.device.copy_to_host_async(lease.ptr(), device, len)?;
        }
        Ok(lease)
    }

    fn copy_out(&self, lease: &Lease, device: *mut u8, len: usize) -> Result<()> {
        if len > 0 {
            self.device.copy_to_device_async(device, lease.ptr(), len)?;
        }
        Ok(())
    }

    fn per_chunk(&self, dtype: Dtype) -> usize {
        (self.chunk_bytes / dtype.size()).max(1)
    }

    /// The whole-buffer path: stage `send` in (and `recv` too when `read_recv`), run `op`
    /// on host copies, stage `recv` out. Synchronizes before MPI reads and before the pinned
    /// buffers go back to the pool.
    fn whole<R>(
        &self,
        send: Option<Buf>,
        recv: BufMut,
        read_recv: bool,
        op: impl FnOnce(Option<Buf>, BufMut) -> Result<R>,
    ) -> Result<R> {
        let send_host = match &send {
            Some(buf) => Some((self.copy_in(buf.ptr(), buf.len_bytes())?, buf)),
            None => None,
        };
        let recv_host = if read_recv {
            self.copy_in(recv.ptr(), recv.len_bytes())?
        } else {
            self.lease(recv.len_bytes())?
        };
        self.device.synchronize()?;
        let result = op(
            send_host.as_ref().map(|(l, b)| l.buf(b.count(), b.dtype())),
            recv_host.buf_mut(recv.count(), recv.dtype()),
        )?;
        self.copy_out(&recv_host, recv.ptr(), recv.len_bytes())?;
        self.device.synchronize()?;
        Ok(result)
    }

    /// An op with an `Input` send side staged whole (`InPlace` reads the receive buffer).
    fn staged_input<R>(
        &self,
        send: Input,
        recv: BufMut,
        op: impl FnOnce(Input, BufMut) -> Result<R>,
    ) -> Result<R> {
        match send {
            Input::Data(buf) => self.whole(Some(buf), recv, false, |s, r| {
                op(Input::Data(s.expect("staged send")), r)
            }),
            Input::InPlace => self.whole(None, recv, true, |_, r| op(Input::InPlace, r)),
        }
    }
}

impl Backend for Staged<'_> {
    fn fill_zeros(&self, dst: BufMut) -> Result<()> {
        super::zero_on_stream(self.device, dst)
    }
    fn barrier(&self, comm: Comm) -> Result<()> {
        self.inner.barrier(comm)
    }

    /// Pipelined: chunk k+1 travels device→host while MPI reduces chunk k, and chunk k
    /// travels back while MPI reduces chunk k+1.
    fn allreduce(&self, comm: Comm, send: Input, recv: BufMut, op: ReduceOp) -> Result<()> {
        let (dtype, size, len) = (recv.dtype(), recv.dtype().size(), recv.len_bytes());
        let (source, send_host) = match send {
            Input::Data(buf) => (buf.ptr(), Some(self.lease(len)?)),
            Input::InPlace => (recv.ptr().cast_const(), None),
        };
        let recv_host = self.lease(len)?;
        let staging = send_host.as_ref().unwrap_or(&recv_host).ptr();
        let pieces = chunks(recv.count(), self.per_chunk(dtype));
        let mut arrived = Vec::with_capacity(pieces.len());
        for &(start, n) in &pieces {
            if n > 0 {
                let at = start * size;
                // SAFETY: every chunk lies inside both buffers of `len` bytes.
                let (host, device) = unsafe { (staging.add(at), source.add(at)) };
                self.device.copy_to_host_async(host, device, n * size)?;
            }
            arrived.push(self.device.mark()?);
        }
        for (&(start, n), &marker) in pieces.iter().zip(&arrived) {
            self.device.wait(marker)?;
            // SAFETY: chunk `start..start + n` of the pinned buffers, each of `len` bytes.
            let (host_in, host_out) = unsafe {
                (
                    Buf::from_raw(staging.add(start * size), n, dtype),
                    BufMut::from_raw(recv_host.ptr().add(start * size), n, dtype),
                )
            };
            let input = match send_host {
                Some(_) => Input::Data(host_in),
                None => Input::InPlace,
            };
            self.inner.allreduce(comm, input, host_out, op)?;
            if n > 0 {
                // SAFETY: chunk of XLA's result buffer and of the pinned buffer.
                let (device, host) = unsafe {
                    (
                        recv.ptr().add(start * size),
                        recv_host.ptr().add(start * size),
                    )
                };
                self.device.copy_to_device_async(device, host, n * size)?;
            }
        }
        self.device.synchronize()
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

    /// Pipelined: the root's chunk k+1 travels device→host while chunk k is broadcast;
    /// elsewhere chunk k travels host→device while chunk k+1 is received.
    fn bcast(&self, comm: Comm, buf: Broadcast, root: i32) -> Result<()> {
        let (dtype, size) = (buf.dtype(), buf.dtype().size());
        let (sent, received) = match &buf {
            Broadcast::Root(b) => (Some(b.ptr()), None),
            Broadcast::Receiver(b) => (None, Some(b.ptr())),
        };
        let host = self.lease(buf.count() * size)?;
        let pieces = chunks(buf.count(), self.per_chunk(dtype));
        let mut arrived = Vec::with_capacity(pieces.len());
        for &(start, n) in &pieces {
            if let Some(device) = sent.filter(|_| n > 0) {
                // SAFETY: a chunk inside both buffers.
                let (h, d) = unsafe { (host.ptr().add(start * size), device.add(start * size)) };
                self.device.copy_to_host_async(h, d, n * size)?;
            }
            arrived.push(self.device.mark()?);
        }
        for (&(start, n), &marker) in pieces.iter().zip(&arrived) {
            self.device.wait(marker)?;
            // SAFETY: chunk of the pinned buffer, which this call alone uses.
            let chunk = unsafe {
                let at = host.ptr().add(start * size);
                match sent {
                    Some(_) => Broadcast::Root(Buf::from_raw(at, n, dtype)),
                    None => Broadcast::Receiver(BufMut::from_raw(at, n, dtype)),
                }
            };
            self.inner.bcast(comm, chunk, root)?;
            if let Some(device) = received.filter(|_| n > 0) {
                // SAFETY: a chunk inside both buffers.
                let (d, h) = unsafe { (device.add(start * size), host.ptr().add(start * size)) };
                self.device.copy_to_device_async(d, h, n * size)?;
            }
        }
        self.device.synchronize()
    }

    fn gather(&self, comm: Comm, send: Buf, recv: BufMut, root: i32) -> Result<()> {
        self.whole(Some(send), recv, false, |s, r| {
            self.inner.gather(comm, s.expect("staged send"), r, root)
        })
    }
    fn allgather(&self, comm: Comm, send: Buf, recv: BufMut) -> Result<()> {
        self.whole(Some(send), recv, false, |s, r| {
            self.inner.allgather(comm, s.expect("staged send"), r)
        })
    }
    fn scatter(&self, comm: Comm, send: Buf, recv: BufMut, root: i32) -> Result<()> {
        self.whole(Some(send), recv, false, |s, r| {
            self.inner.scatter(comm, s.expect("staged send"), r, root)
        })
    }
    fn alltoall(&self, comm: Comm, send: Buf, recv: BufMut) -> Result<()> {
        self.whole(Some(send), recv, false, |s, r| {
            self.inner.alltoall(comm, s.expect("staged send"), r)
        })
    }
    fn gatherv(&self, comm: Comm, send: Buf, recv: PartitionMut, root: i32) -> Result<()> {
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
    fn scatterv(&self, comm: Comm, send: Partition, recv: BufMut, root: i32) -> Result<()> {
        self.whole(Some(send.buf), recv, false, |s, r| {
            let send = Partition {
                buf: s.expect("staged send"),
                blocks: send.blocks,
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
        let host = self.copy_in(buf.ptr(), buf.len_bytes())?;
        self.device.synchronize()?;
        self.inner
            .send(comm, host.buf(buf.count(), buf.dtype()), dest, tag)
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
