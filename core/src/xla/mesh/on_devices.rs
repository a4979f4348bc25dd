//! `OnDevices` as the `Backend` an op's body calls: its collectives through
//! `collectives.rs` and `reductions.rs`, like XLA's, its scans along the ranks
//! (`scans.rs`); the rest as the halves of its messages.

use std::sync::{Arc, Mutex};

use super::collectives::{self, AllToAll};
use super::comm::{span, OnDevices};
use super::messages::Traffic;
use super::reductions;
use super::scans::{self, Prefix};
use super::seat::{CallKey, Half, Seat, Span, Spans};
use crate::{
    Backend, Broadcast, Buf, BufMut, Comm, Envelope, Error, Input, NativeStatus, Partition,
    PartitionMut, Peer, Progress, ReduceOp, Request, Result, Started, Status,
};

/// Where a reduction's operand is: its own buffer, or the result's (in place).
fn operand(send: &Input, recv: &BufMut) -> Span {
    match send {
        Input::Data(buf) => span(buf.ptr(), buf.count(), buf.dtype()),
        Input::InPlace => result(recv),
    }
}

fn result(recv: &BufMut) -> Span {
    span(recv.ptr(), recv.count(), recv.dtype())
}

/// A MeshComm's ops start their messages through `Backend::start` only (its `send` and
/// `recv`, starting); nothing calls `isend`/`irecv` on it directly.
fn not_direct(what: &'static str) -> Error {
    Error::unsupported(
        what,
        "internal error: a MeshComm starts its messages through Backend::start",
    )
}

impl Backend for OnDevices {
    fn reduce_local(&self, src: Buf, dst: BufMut, op: ReduceOp) -> Result<()> {
        self.library.backend().reduce_local(src, dst, op)
    }

    fn barrier(&self, _: Comm) -> Result<()> {
        self.collective(
            CallKey::new("barrier", 0),
            Spans::default(),
            Spans::default(),
            |group, _, backend, _| collectives::barrier(group, backend),
        )
    }

    fn allreduce(&self, _: Comm, send: Input, recv: BufMut, op: ReduceOp) -> Result<()> {
        let (x, y) = (operand(&send, &recv), result(&recv));
        let key = CallKey::reducing("allreduce", op, 0);
        self.collective(key, x, y, |group, _, backend, seats| {
            reductions::all_reduce(group, backend, seats, op)
        })
    }

    fn reduce(&self, _: Comm, send: Input, recv: BufMut, op: ReduceOp, root: i32) -> Result<()> {
        let root = self.rank_named(root, "root")?;
        let (x, y) = (operand(&send, &recv), result(&recv));
        let key = CallKey::reducing("reduce", op, root as u64);
        self.collective(key, x, y, |group, _, backend, seats| {
            reductions::reduce(group, backend, seats, op, root)
        })
    }

    fn scan(&self, _: Comm, send: Input, recv: BufMut, op: ReduceOp) -> Result<()> {
        self.prefix(&send, &recv, op, Prefix::Inclusive)
    }

    fn exscan(&self, _: Comm, send: Input, recv: BufMut, op: ReduceOp) -> Result<()> {
        self.prefix(&send, &recv, op, Prefix::Exclusive)
    }

    fn reduce_scatter(&self, _: Comm, send: Buf, recv: BufMut, op: ReduceOp) -> Result<()> {
        let (x, y) = (span(send.ptr(), send.count(), send.dtype()), result(&recv));
        let key = CallKey::reducing("reduce_scatter", op, 0);
        self.collective(key, x, y, |group, _, backend, seats| {
            reductions::reduce_scatter(group, backend, seats, &[1], op)
        })
    }

    /// On a MeshComm every rank binds the result, the root's holding its message already
    /// (the result aliases the operand): every kind of buffer is the result's span.
    fn bcast(&self, _: Comm, buf: Broadcast, root: i32) -> Result<()> {
        let root = self.rank_named(root, "root")?;
        let buffer = match &buf {
            Broadcast::Root(buf) => span(buf.ptr(), buf.count(), buf.dtype()),
            Broadcast::Receiver(buf) | Broadcast::InPlace(buf) => result(buf),
        };
        self.collective(
            CallKey::new("bcast", root as u64),
            Vec::new(),
            vec![buffer],
            |group, _, backend, seats| collectives::bcast(group, backend, seats, root),
        )
    }

    /// Away from the root the body makes the result zeros (`ops::gather`).
    fn gather(&self, _: Comm, send: Buf, recv: BufMut, root: i32) -> Result<bool> {
        let root = self.rank_named(root, "root")?;
        let b = send.len_bytes();
        let at_root = self.rank == root;
        let seat = Seat::of_messages(
            CallKey::new("gather", root as u64),
            vec![self.to(root, send.ptr() as usize, b)],
            if at_root {
                (0..self.size())
                    .map(|p| self.from(p, recv.ptr() as usize + p * b, b))
                    .collect()
            } else {
                Vec::new()
            },
        );
        self.run(seat, Traffic::Collective)?;
        Ok(at_root)
    }

    fn allgather(&self, _: Comm, send: Buf, recv: BufMut) -> Result<()> {
        let (x, y) = (span(send.ptr(), send.count(), send.dtype()), result(&recv));
        let key = CallKey::new("allgather", 0);
        self.collective(key, x, y, |group, library, backend, seats| {
            collectives::all_gather(group, library, backend, seats, &[1])
        })
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
        let receive = vec![self.from(root, recv.ptr() as usize, b)];
        let seat = Seat::of_messages(CallKey::new("scatter", root as u64), sends, receive);
        self.run(seat, Traffic::Collective)
    }

    fn alltoall(&self, _: Comm, send: Buf, recv: BufMut) -> Result<()> {
        let (x, y) = (span(send.ptr(), send.count(), send.dtype()), result(&recv));
        let form = AllToAll::Array { outer: 1 };
        let key = CallKey::new("alltoall", 0);
        self.collective(key, x, y, |group, library, backend, seats| {
            collectives::all_to_all(group, library, backend, seats, form)
        })
    }

    fn gatherv(&self, _: Comm, send: Buf, recv: PartitionMut, root: i32) -> Result<bool> {
        let root = self.rank_named(root, "root")?;
        let at_root = self.rank == root;
        let receives = if at_root {
            self.blocks_in(&recv)
        } else {
            Vec::new()
        };
        let seat = Seat::of_messages(
            CallKey::new("gatherv", root as u64),
            vec![self.to(root, send.ptr() as usize, send.len_bytes())],
            receives,
        );
        self.run(seat, Traffic::Collective)?;
        Ok(at_root)
    }

    fn allgatherv(&self, _: Comm, send: Buf, recv: PartitionMut) -> Result<()> {
        let x = span(send.ptr(), send.count(), send.dtype());
        let (base, dtype) = (recv.buf.ptr() as usize, recv.buf.dtype());
        let blocks = (recv.blocks.counts.iter().zip(recv.blocks.displs))
            .map(|(&count, &displ)| span((base + displ * dtype.size()) as *const u8, count, dtype));
        let rets: Vec<Span> = std::iter::once(result(&recv.buf)).chain(blocks).collect();
        let key = CallKey::varying("allgatherv");
        self.collective(key, x, rets, |group, _, backend, seats| {
            collectives::all_gather_v(group, backend, seats)
        })
    }

    fn scatterv(&self, _: Comm, send: Partition, recv: BufMut, root: i32) -> Result<()> {
        let root = self.rank_named(root, "root")?;
        let sends = if self.rank == root {
            self.blocks_out(&send)
        } else {
            Vec::new()
        };
        let seat = Seat::of_messages(
            CallKey::new("scatterv", root as u64),
            sends,
            vec![self.from(root, recv.ptr() as usize, recv.len_bytes())],
        );
        self.run(seat, Traffic::Collective)
    }

    fn alltoallv(&self, _: Comm, send: Partition, recv: PartitionMut) -> Result<()> {
        let key = CallKey::new("alltoallv", 0);
        let seat = Seat::of_messages(key, self.blocks_out(&send), self.blocks_in(&recv));
        self.run(seat, Traffic::Collective)
    }

    /// A send to PROC_NULL meets too, with nothing to send: the process's other devices
    /// meet it as their call of the same step.
    fn send(&self, _: Comm, buf: Buf, dest: Peer, tag: i32) -> Result<()> {
        let to = self.peer(dest, "dest")?;
        let sends = to
            .map(|to| Half {
                tag: Some(tag),
                ..self.to(to, buf.ptr() as usize, buf.len_bytes())
            })
            .into_iter()
            .collect();
        let seat = Seat::of_messages(CallKey::POINT_TO_POINT, sends, Vec::new());
        self.run(seat, Traffic::PointToPoint)
    }

    /// A receive from PROC_NULL meets too, receiving nothing (as a send to it).
    fn recv(&self, _: Comm, buf: BufMut, source: Peer, tag: Option<i32>) -> Result<Status> {
        let from = self.peer(source, "source")?;
        let receives = from
            .map(|from| Half {
                tag,
                ..self.from(from, buf.ptr() as usize, buf.len_bytes())
            })
            .into_iter()
            .collect();
        let seat = Seat::of_messages(CallKey::POINT_TO_POINT, Vec::new(), receives);
        self.run(seat, Traffic::PointToPoint)?;
        let Some(from) = from else {
            return Ok(received(None, None, 0));
        };
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
        let seat = Seat::of_messages(
            CallKey::POINT_TO_POINT,
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
        self.run(seat, Traffic::PointToPoint)?;
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
    fn prefix(&self, send: &Input, recv: &BufMut, op: ReduceOp, prefix: Prefix) -> Result<()> {
        let (x, y) = (operand(send, recv), result(recv));
        let name = match prefix {
            Prefix::Inclusive => "scan",
            Prefix::Exclusive => "exscan",
        };
        let key = CallKey::reducing(name, op, 0);
        self.collective(key, x, y, |group, _, backend, seats| {
            scans::scan(group, backend, seats, op, prefix)
        })
    }

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

/// What a receive on a MeshComm reports: the rank it named, the tag it asked
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
