//! Each collective among devices once, over a meeting's seats (this process's devices of
//! the group, in position order), whichever route reached it: XLA's collectives through
//! the pass (`handlers/hlo.rs`) and jaxmpi's ops on a MeshComm (`on_devices.rs`).
//!
//! Between processes the data moves by MPI's own collectives on the group's communicator:
//! the devices of a process first combine or pack their parts, the processes make one MPI
//! call, then each local device takes its share. So a rank moves what MPI's collective
//! moves for the process, not a message per other device. Where every device is a process
//! of its own, that is the plain MPI collective on the devices' own buffers. Reductions
//! combine in an order that follows the layout; `ordered.rs` has the order that does not.
//!
//! Layouts: per array, `outer` slices lie outside the dimension the collective works
//! along; within a slice, the group's blocks are back to back.

use super::buffers::{at, copy, move_bytes, seat, Scratch};
use super::group::Group;
use super::messages::{exchange, Piece};
use super::ordered;
use super::seat::{Seat, Span};
use crate::{Backend, BufMut, Dtype, Envelope, Error, Input, Library, Peer, ReduceOp, Result};

/// How a MeshComm's and the pass's reductions combine (`JAXMPI_MESH_REDUCTIONS`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Reductions {
    /// Each process combines its devices' parts, then MPI's own reduction runs among the
    /// processes: results follow the layout in their last bits.
    Fast,
    /// Every element is combined by one device in rank order (`ordered.rs`): the same bits
    /// in every layout, for 2 (n - 1) messages a rank (MPI's own: about 2 log2 n at small
    /// sizes).
    Ordered,
}

/// The choice of `JAXMPI_MESH_REDUCTIONS`, read once.
pub fn reductions() -> Result<Reductions> {
    static CHOICE: std::sync::OnceLock<std::result::Result<Reductions, String>> =
        std::sync::OnceLock::new();
    let choice = CHOICE.get_or_init(
        || match std::env::var("JAXMPI_MESH_REDUCTIONS").as_deref() {
            Err(_) | Ok("") | Ok("fast") => Ok(Reductions::Fast),
            Ok("ordered") => Ok(Reductions::Ordered),
            Ok(other) => Err(format!("= {other:?}: use fast (the default) or ordered")),
        },
    );
    choice
        .clone()
        .map_err(|why| Error::invalid_argument("JAXMPI_MESH_REDUCTIONS", why))
}

/// The input of an MPI reduction from `x` into `y`: in place when they are one buffer.
///
/// # Safety
/// Both are live buffers of calls now running.
unsafe fn input<'a>(x: &Span, y: &Span) -> Input<'a> {
    if x.ptr == y.ptr {
        Input::InPlace
    } else {
        // SAFETY: forwarded from the caller.
        Input::Data(unsafe { x.buf() })
    }
}

/// `into = seats' args[k] combined`, starting from `first`'s (so that an operand in place
/// in `into` is read before it is written).
fn combine(
    backend: &dyn Backend,
    seats: &[Seat],
    k: usize,
    first: usize,
    into: &Span,
    op: ReduceOp,
) -> Result<()> {
    copy(&seats[first].args[k], into);
    for (_, other) in seats.iter().enumerate().filter(|(s, _)| *s != first) {
        // SAFETY: live buffers of the meeting devices' calls, and `into`, the combination.
        unsafe { backend.reduce_local(other.args[k].buf(), into.buf_mut(), op)? };
    }
    Ok(())
}

pub fn all_reduce(
    group: &Group,
    library: &dyn Library,
    backend: &dyn Backend,
    seats: &[Seat],
    op: ReduceOp,
) -> Result<()> {
    if reductions()? == Reductions::Ordered {
        return ordered::all_reduce(group, library, backend, seats, op);
    }
    for k in 0..seats[0].rets.len() {
        let (x, y) = (seats[0].args[k], seats[0].rets[k]);
        if seats.len() > 1 {
            combine(backend, seats, k, 0, &y, op)?;
        }
        if group.spans_processes() {
            let send = if seats.len() > 1 {
                Input::InPlace
            } else {
                // SAFETY: live buffers of this device's call.
                unsafe { input(&x, &y) }
            };
            // SAFETY: as above.
            backend.allreduce(group.comm(library)?, send, unsafe { y.buf_mut() }, op)?;
        } else if seats.len() == 1 {
            copy(&x, &y);
        }
        for other in &seats[1..] {
            copy(&y, &other.rets[k]);
        }
    }
    Ok(())
}

/// The result at `root` only; elsewhere the results are left as they are.
pub fn reduce(
    group: &Group,
    library: &dyn Library,
    backend: &dyn Backend,
    seats: &[Seat],
    op: ReduceOp,
    root: usize,
) -> Result<()> {
    let x = seats[0].args[0];
    let mut scratch = Scratch::new(if group.is_local(root) { 0 } else { x.bytes() });
    let (first, into) = if group.is_local(root) {
        (group.slot(root), seat(group, seats, root).rets[0])
    } else {
        (0, scratch.span(0, x.count, x.dtype))
    };
    if reductions()? == Reductions::Ordered {
        // Every local device's result is `into` or scratch, so nothing else is written.
        let mut spare = Scratch::new(x.bytes() * seats.len());
        let seats: Vec<Seat> = (0..seats.len())
            .map(|s| {
                let ret = if group.is_local(root) && s == first {
                    into
                } else {
                    spare.span(s * x.bytes(), x.count, x.dtype)
                };
                Seat::of_buffers(seats[s].args.clone(), vec![ret])
            })
            .collect();
        return ordered::all_reduce(group, library, backend, &seats, op);
    }
    if seats.len() > 1 || !group.spans_processes() {
        combine(backend, seats, 0, first, &into, op)?;
    }
    if !group.spans_processes() {
        return Ok(());
    }
    let comm = group.comm(library)?;
    let root_rank = group.rank_of(root);
    if group.is_local(root) {
        let send = if seats.len() > 1 {
            Input::InPlace
        } else {
            // SAFETY: live buffers of this device's call.
            unsafe { input(&x, &into) }
        };
        // SAFETY: the root's result.
        backend.reduce(comm, send, unsafe { into.buf_mut() }, op, root_rank)
    } else {
        let from = if seats.len() > 1 { into } else { x };
        // SAFETY: the combination (or the one device's operand); nothing is received here.
        let (send, nothing) = unsafe {
            let nowhere = std::ptr::NonNull::<u128>::dangling().as_ptr() as *mut u8;
            (from.buf(), BufMut::from_raw(nowhere, 0, x.dtype))
        };
        backend.reduce(comm, Input::Data(send), nothing, op, root_rank)
    }
}

/// Operand `k`'s blocks reduced over the group, block j of every slice to member j.
pub fn reduce_scatter(
    group: &Group,
    library: &dyn Library,
    backend: &dyn Backend,
    seats: &[Seat],
    outer: &[usize],
    op: ReduceOp,
) -> Result<()> {
    let n = group.size();
    for (k, &outer) in outer.iter().enumerate() {
        let (x, y) = (seats[0].args[k], seats[0].rets[k]);
        if reductions()? == Reductions::Ordered {
            ordered::reduce_scatter(group, library, backend, seats, k, outer, op)?;
            continue;
        }
        if group.distinct() && outer == 1 && group.spans_processes() {
            // SAFETY: live buffers of this device's call.
            let (send, recv) = unsafe { (x.buf(), y.buf_mut()) };
            backend.reduce_scatter(group.comm(library)?, send, recv, op)?;
            continue;
        }
        let inner = y.bytes() / outer.max(1);
        let mut whole = Scratch::new(x.bytes());
        let total = whole.span(0, x.count, x.dtype);
        combine(backend, seats, k, 0, &total, op)?;
        if group.spans_processes() && group.even() {
            // Each process's positions' blocks, back to back in communicator rank order:
            // MPI's reduce-scatter hands each process its share, and only that.
            let share = group.local.len() * outer * inner;
            let mut packed = Scratch::new(x.bytes());
            let packed = packed.span(0, x.count, x.dtype);
            let mut mine = Scratch::new(share);
            let mine = mine.span(0, y.count * group.local.len(), y.dtype);
            let mut next = 0;
            for rank in 0..group.processes() {
                for p in group.positions_of(rank) {
                    for o in 0..outer {
                        move_bytes(total.ptr + (o * n + p) * inner, packed.ptr + next, inner);
                        next += inner;
                    }
                }
            }
            // SAFETY: scratch of this call.
            let (send, recv) = unsafe { (packed.buf(), mine.buf_mut()) };
            backend.reduce_scatter(group.comm(library)?, send, recv, op)?;
            for (slot, s) in seats.iter().enumerate() {
                let from = mine.ptr + slot * outer * inner;
                move_bytes(from, s.rets[k].ptr, outer * inner);
            }
            continue;
        }
        if group.spans_processes() {
            // SAFETY: `whole` is this call's own.
            let buf = unsafe { total.buf_mut() };
            backend.allreduce(group.comm(library)?, Input::InPlace, buf, op)?;
        }
        for &p in &group.local {
            for o in 0..outer {
                let to = seat(group, seats, p).rets[k].ptr + o * inner;
                move_bytes(total.ptr + (o * n + p) * inner, to, inner);
            }
        }
    }
    Ok(())
}

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
        if group.distinct() && outer == 1 && group.spans_processes() {
            // SAFETY: live buffers of this device's call.
            let (send, recv) = unsafe { (x.buf(), y.buf_mut()) };
            backend.allgather(group.comm(library)?, send, recv)?;
            continue;
        }
        let inner = x.bytes() / outer.max(1);
        if group.spans_processes() && group.even() {
            // This process's blocks packed, gathered by MPI among the processes, then
            // unpacked into every local device's result.
            let local = group.local.len();
            let mut mine = Scratch::new(x.bytes() * local);
            let mine = mine.span(0, x.count * local, x.dtype);
            for (slot, s) in seats.iter().enumerate() {
                move_bytes(s.args[k].ptr, mine.ptr + slot * x.bytes(), x.bytes());
            }
            let mut all = Scratch::new(y.bytes());
            let all = all.span(0, y.count, y.dtype);
            // SAFETY: scratch of this call.
            let (send, recv) = unsafe { (mine.buf(), all.buf_mut()) };
            backend.allgather(group.comm(library)?, send, recv)?;
            for rank in 0..group.processes() {
                for (s, i) in group.positions_of(rank).enumerate() {
                    for o in 0..outer {
                        let from = all.ptr + ((rank * local + s) * outer + o) * inner;
                        for seat in seats {
                            move_bytes(from, seat.rets[k].ptr + (o * n + i) * inner, inner);
                        }
                    }
                }
            }
            continue;
        }
        // Member i's slice o lands as block i of every member's slice o.
        let mut pieces = Vec::with_capacity(n * n * outer);
        for i in 0..n {
            for j in 0..n {
                for o in 0..outer {
                    pieces.push(Piece {
                        from: i,
                        to: j,
                        bytes: inner,
                        send: at(group, seats, i, |s| s.args[k], o * inner),
                        recv: at(group, seats, j, |s| s.rets[k], (o * n + i) * inner),
                    });
                }
            }
        }
        exchange(group, library, backend, &pieces)?;
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
    if group.distinct() && outer == 1 && group.spans_processes() {
        if let AllToAll::Array { .. } = form {
            let (x, y) = (seats[0].args[0], seats[0].rets[0]);
            // SAFETY: live buffers of this device's call.
            return backend.alltoall(group.comm(library)?, unsafe { x.buf() }, unsafe {
                y.buf_mut()
            });
        }
    }
    // Packed when there is something to gain: several devices' blocks to one process, or
    // many slices of small blocks; one device's own buffers otherwise go as they are.
    let packs = group.local.len() > 1 || (outer > 1 && block < PACKED_BLOCK);
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
        backend.alltoall(group.comm(library)?, unsafe { out.buf() }, unsafe {
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
    let mut pieces = Vec::with_capacity(n * n * outer);
    for i in 0..n {
        for j in 0..n {
            for o in 0..outer {
                pieces.push(Piece {
                    from: i,
                    to: j,
                    bytes: block,
                    send: if group.is_local(i) {
                        send_at(seat(group, seats, i), j, o)
                    } else {
                        0
                    },
                    recv: if group.is_local(j) {
                        recv_at(seat(group, seats, j), i, o)
                    } else {
                        0
                    },
                });
            }
        }
    }
    exchange(group, library, backend, &pieces)
}

/// Each (source, target) pair's operand to the target's result; a result no pair targets
/// is zeros.
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
    if group.local.len() == 1 && group.distinct() {
        // One MPI call, as jaxmpi.sendrecv makes: to this device's target, from its source.
        let me = group.local[0];
        let (x, y) = (seats[0].args[0], seats[0].rets[0]);
        let target = pairs.iter().find(|p| p.0 == me).map(|p| p.1);
        let source = pairs.iter().find(|p| p.1 == me).map(|p| p.0);
        // Made by every process the pairs name (MPI_Comm_create_group is collective over
        // them), a device that only keeps its own piece included: the others wait in it.
        let comm = group.comm(library)?;
        if target == Some(me) {
            copy(&x, &y); // a pair from itself to itself
            return Ok(());
        }
        let peer = |p: Option<usize>| p.map_or(Peer::Null, |p| Peer::Rank(group.rank_of(p)));
        let envelope = Envelope {
            comm,
            dest: peer(target),
            sendtag: 0,
            source: peer(source),
            recvtag: Some(0),
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
pub fn barrier(group: &Group, library: &dyn Library, backend: &dyn Backend) -> Result<()> {
    if group.spans_processes() {
        backend.barrier(group.comm(library)?)?;
    }
    Ok(())
}

/// The root's buffer to every member's (each seat's `rets[0]`, the root's read).
pub fn bcast(
    group: &Group,
    library: &dyn Library,
    backend: &dyn Backend,
    seats: &[Seat],
    root: usize,
) -> Result<()> {
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
        backend.bcast(group.comm(library)?, buf, group.rank_of(root))?;
    }
    for s in seats {
        copy(&source, &s.rets[0]);
    }
    Ok(())
}
