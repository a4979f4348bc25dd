//! Each collective among devices that moves data without combining it, once, over a
//! meeting's seats (this process's devices of the group, in position order), whichever
//! route reached it: XLA's collectives through the pass (`handlers/hlo.rs`) and jaxmpi's
//! ops on a MeshComm (`on_devices.rs`); the reductions are in `reductions.rs`.
//!
//! Between processes the data moves by MPI's own collectives on the group's communicator:
//! the devices of a process first combine or pack their parts, the processes make one MPI
//! call, then each local device takes its share. So a rank moves what MPI's collective
//! moves for the process, not a message per other device. Where every device is a process
//! of its own, that is the plain MPI collective on the devices' own buffers.
//!
//! Layouts: per array, `outer` slices lie outside the dimension the collective works
//! along; within a slice, the group's blocks are back to back.

use super::buffers::{at, copy, move_bytes, offsets, seat, Scratch};
use super::group::Group;
use super::messages::{exchange, touching, Piece};
use super::seat::{Seat, Span};
use crate::{Backend, Dtype, Envelope, Error, Input, Library, PartitionMut, Peer, Result};

/// Every member's array `k` (in `outer` slices) to every member, as block i of each slice.
pub fn all_gather(
    group: &Group,
    library: &dyn Library,
    backend: &dyn Backend,
    seats: &[Seat],
    outer: &[usize],
) -> Result<()> {
    let n = group.size();
    for (k, &outer) in outer.iter().enumerate() {
        let (x, y) = (seats[0].args[k], seats[0].rets[k]);
        let by_mpi = group.spans_processes() && !group.point_to_point_only();
        if group.aligned() && outer == 1 && by_mpi {
            // SAFETY: live buffers of this device's call.
            let (send, recv) = unsafe { (x.buf(), y.buf_mut()) };
            backend.allgather(group.comm()?, send, recv)?;
            continue;
        }
        let inner = x.bytes() / outer.max(1);
        if by_mpi {
            // Member i's slice o lands as block i of every member's slice o.
            let land = |seat: &Seat, i: usize, from: usize| {
                for o in 0..outer {
                    move_bytes(
                        from + o * inner,
                        seat.rets[k].ptr + (o * n + i) * inner,
                        inner,
                    );
                }
            };
            share_among_processes(
                group,
                backend,
                seats,
                |_| x.bytes(),
                |s, _| s.args[k].ptr,
                land,
            )?;
            continue;
        }
        // Member i's slice o lands as block i of every member's slice o (all in this
        // process, or a permute's group, checked: `JAXMPI_CHECK`).
        let pieces = touching(group, outer, |i, j, o| Piece {
            from: i,
            to: j,
            bytes: inner,
            send: at(group, seats, i, |s| s.args[k], o * inner),
            recv: at(group, seats, j, |s| s.rets[k], (o * n + i) * inner),
        });
        exchange(group, library, backend, &pieces)?;
    }
    Ok(())
}

/// Every member's operand to every member, as block p of its result, each block as long
/// as its member's operand (a MeshComm's allgatherv): `rets[0]` is a seat's whole result,
/// `rets[1 + p]` its block p. Each process's blocks travel once to each other process,
/// however many devices there take them.
pub fn all_gather_v(group: &Group, backend: &dyn Backend, seats: &[Seat]) -> Result<()> {
    let block = |s: &Seat, p: usize| s.rets[1 + p];
    let x = seats[0].args[0];
    let sent_as = |p: usize| block(&seats[0], p).bytes();
    for (s, &p) in seats.iter().zip(&group.local) {
        if s.args[0].bytes() != sent_as(p) {
            return Err(Error::invalid_argument(
                "allgatherv",
                format!(
                    "rank {p} sends {} bytes, where the counts give it {}",
                    s.args[0].bytes(),
                    sent_as(p)
                ),
            ));
        }
    }
    if !group.spans_processes() {
        for s in seats {
            for (from, &p) in seats.iter().zip(&group.local) {
                copy(&from.args[0], &block(s, p));
            }
        }
        return Ok(());
    }
    if group.aligned() {
        // MPI's own, straight into this device's result.
        let whole = seats[0].rets[0];
        let size = whole.dtype.size();
        let counts: Vec<usize> = seats[0].rets[1..].iter().map(|b| b.count).collect();
        let displs: Vec<usize> = seats[0].rets[1..]
            .iter()
            .map(|b| (b.ptr - whole.ptr) / size)
            .collect();
        // SAFETY: live buffers of this device's call.
        let (send, recv) = unsafe { (x.buf(), whole.buf_mut()) };
        let recv = PartitionMut::new(recv, &counts, &displs);
        return backend.allgatherv(group.comm()?, send, recv);
    }
    let land = |s: &Seat, p: usize, from: usize| move_bytes(from, block(s, p).ptr, sent_as(p));
    share_among_processes(group, backend, seats, sent_as, |s, _| s.args[0].ptr, land)
}

/// Each local device's piece (`len(p)` bytes at `piece(seat, p)`, p its position) to
/// every process of the group, by one of MPI's calls among the processes (MPI_Allgather
/// where every process gives as many bytes, else MPI_Allgatherv): each piece reaches each
/// process once, however many of its devices take it. `land(seat, p, from)` then takes
/// position p's piece, at `from`, into each local seat.
pub(super) fn share_among_processes(
    group: &Group,
    backend: &dyn Backend,
    seats: &[Seat],
    len: impl Fn(usize) -> usize,
    piece: impl Fn(&Seat, usize) -> usize,
    land: impl Fn(&Seat, usize, usize),
) -> Result<()> {
    let counts: Vec<usize> = (0..group.processes())
        .map(|r| group.positions_of(r).map(&len).sum())
        .collect();
    let displs = offsets(&counts);
    let mine: usize = group.local.iter().map(|&p| len(p)).sum();
    let mut packing = Scratch::new(mine);
    let packed = packing.span(0, mine, Dtype::U8);
    let mut next = packed.ptr;
    for (s, &p) in seats.iter().zip(&group.local) {
        move_bytes(piece(s, p), next, len(p));
        next += len(p);
    }
    let total = counts.iter().sum();
    let mut gathering = Scratch::new(total);
    let all = gathering.span(0, total, Dtype::U8);
    // SAFETY: scratch of this call.
    let (send, recv) = unsafe { (packed.buf(), all.buf_mut()) };
    if counts.iter().all(|&c| c == counts[0]) {
        backend.allgather(group.comm()?, send, recv)?;
    } else {
        backend.allgatherv(
            group.comm()?,
            send,
            PartitionMut::new(recv, &counts, &displs),
        )?;
    }
    for (r, &displ) in displs.iter().enumerate() {
        let mut from = all.ptr + displ;
        for p in group.positions_of(r) {
            for s in seats {
                land(s, p, from);
            }
            from += len(p);
        }
    }
    Ok(())
}

/// How an all-to-all's blocks lie: `Array`, one array whose slices hold a block per
/// member; `Arrays`, one array per member (XLA's tuple form).
#[derive(Clone, Copy)]
pub enum AllToAll {
    Array { outer: usize },
    Arrays,
}

/// Blocks of an all-to-all below this size are packed into one MPI call rather than sent
/// as a message each (a message costs microseconds; copying 64 KiB, about as much).
const PACKED_BLOCK: usize = 64 << 10;

/// Member i's block j (of each slice) to member j, as its block i.
pub fn all_to_all(
    group: &Group,
    library: &dyn Library,
    backend: &dyn Backend,
    seats: &[Seat],
    form: AllToAll,
) -> Result<()> {
    let n = group.size();
    let (outer, block) = match form {
        AllToAll::Array { outer } => (outer, seats[0].args[0].bytes() / (outer.max(1) * n)),
        AllToAll::Arrays => (1, seats[0].args.first().map_or(0, Span::bytes)),
    };
    // Where block `to` of slice o of a seat's operand lies, and block `from` of its result.
    let send_at = |s: &Seat, to: usize, o: usize| match form {
        AllToAll::Array { .. } => s.args[0].ptr + (o * n + to) * block,
        AllToAll::Arrays => s.args[to].ptr,
    };
    let recv_at = |s: &Seat, from: usize, o: usize| match form {
        AllToAll::Array { .. } => s.rets[0].ptr + (o * n + from) * block,
        AllToAll::Arrays => s.rets[from].ptr,
    };
    if group.aligned() && outer == 1 && group.spans_processes() {
        if let AllToAll::Array { .. } = form {
            let (x, y) = (seats[0].args[0], seats[0].rets[0]);
            // SAFETY: live buffers of this device's call.
            return backend.alltoall(group.comm()?, unsafe { x.buf() }, unsafe { y.buf_mut() });
        }
    }
    // Packed when there is something to gain: several devices' blocks to one process, or
    // small blocks (many slices of one array, or a tuple's arrays: one MPI call, not a
    // message each); one device's own large blocks otherwise go as they are.
    let packs = !group.aligned() || block < PACKED_BLOCK;
    if group.spans_processes() && group.even() && packs {
        // Blocks packed by destination process, exchanged by MPI's alltoall, unpacked:
        // one MPI call however many slices and devices.
        let (local, procs) = (group.local.len(), group.processes());
        let per_process = local * local * outer * block;
        let mut out = Scratch::new(per_process * procs);
        let mut inn = Scratch::new(per_process * procs);
        let (out, inn) = (
            out.span(0, per_process * procs, Dtype::U8),
            inn.span(0, per_process * procs, Dtype::U8),
        );
        let mut next = 0;
        for rank in 0..procs {
            for seat in seats {
                for j in group.positions_of(rank) {
                    for o in 0..outer {
                        move_bytes(send_at(seat, j, o), out.ptr + next, block);
                        next += block;
                    }
                }
            }
        }
        // SAFETY: scratch of this call.
        backend.alltoall(group.comm()?, unsafe { out.buf() }, unsafe {
            inn.buf_mut()
        })?;
        let mut next = 0;
        for rank in 0..procs {
            for i in group.positions_of(rank) {
                for seat in seats {
                    for o in 0..outer {
                        move_bytes(inn.ptr + next, recv_at(seat, i, o), block);
                        next += block;
                    }
                }
            }
        }
        return Ok(());
    }
    let local = |p: usize, address: &dyn Fn(&Seat) -> usize| match group.is_local(p) {
        true => address(seat(group, seats, p)),
        false => 0,
    };
    let pieces = touching(group, outer, |i, j, o| Piece {
        from: i,
        to: j,
        bytes: block,
        send: local(i, &|s| send_at(s, j, o)),
        recv: local(j, &|s| recv_at(s, i, o)),
    });
    exchange(group, library, backend, &pieces)
}

/// Each (source, target) pair's operand to the target's result; a result no pair targets
/// is zeros. `pairs` are positions of the group (the devices they connect, `connected`): at
/// least every pair this process's devices send or receive.
pub fn permute(
    group: &Group,
    library: &dyn Library,
    backend: &dyn Backend,
    seats: &[Seat],
    pairs: &[(usize, usize)],
) -> Result<()> {
    for &p in &group.local {
        if !pairs.iter().any(|&(_, t)| t == p) {
            // SAFETY: a live result of a meeting call.
            backend.fill_zeros(unsafe { seat(group, seats, p).rets[0].buf_mut() })?;
        }
    }
    if group.local.len() == 1 && group.distinct() && group.spans_processes() {
        // One MPI call, as jaxmpi.sendrecv makes: to this device's target, from its source.
        let me = group.local[0];
        let (x, y) = (seats[0].args[0], seats[0].rets[0]);
        let target = pairs.iter().find(|p| p.0 == me).map(|p| p.1);
        let source = pairs.iter().find(|p| p.1 == me).map(|p| p.0);
        let peer = |p: Option<usize>| p.map_or(Peer::Null, |p| Peer::Rank(group.rank_of(p)));
        let envelope = Envelope {
            comm: group.comm()?,
            dest: peer(target),
            sendtag: target.map_or(0, |t| group.tag(me, t)),
            source: peer(source),
            recvtag: Some(source.map_or(0, |s| group.tag(s, me))),
        };
        // SAFETY: live buffers of this device's call.
        let (send, recv) = unsafe { (x.buf(), y.buf_mut()) };
        return backend
            .sendrecv(Input::Data(send), recv, envelope)
            .map(|_| ());
    }
    let bytes = seats[0].args[0].bytes();
    let pieces: Vec<Piece> = pairs
        .iter()
        .map(|&(from, to)| Piece {
            from,
            to,
            bytes,
            send: at(group, seats, from, |s| s.args[0], 0),
            recv: at(group, seats, to, |s| s.rets[0], 0),
        })
        .collect();
    exchange(group, library, backend, &pieces)
}

/// Nobody leaves before every member has arrived.
pub fn barrier(group: &Group, backend: &dyn Backend) -> Result<()> {
    if group.spans_processes() {
        backend.barrier(group.comm()?)?;
    }
    Ok(())
}

/// The root's buffer to every member's (each seat's `rets[0]`, the root's read).
pub fn bcast(group: &Group, backend: &dyn Backend, seats: &[Seat], root: usize) -> Result<()> {
    let source = if group.is_local(root) {
        seat(group, seats, root).rets[0]
    } else {
        seats[0].rets[0]
    };
    if group.spans_processes() {
        let buf = if group.is_local(root) {
            // SAFETY: the root's live buffer, only read.
            crate::Broadcast::Root(unsafe { source.buf() })
        } else {
            // SAFETY: a live result of this meeting, written by this broadcast only.
            crate::Broadcast::Receiver(unsafe { source.buf_mut() })
        };
        backend.bcast(group.comm()?, buf, group.rank_of(root))?;
    }
    for s in seats {
        copy(&source, &s.rets[0]);
    }
    Ok(())
}
