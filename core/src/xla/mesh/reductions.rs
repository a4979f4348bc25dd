//! Reductions among devices, for both routes (the pass's and a MeshComm's): each process
//! combines its devices' operands, then MPI's own reduction runs among the processes on
//! the group's communicator, and each local device takes its result or share. Results
//! follow the layout in their last bits; `ordered.rs` has the order that does not
//! (`JAXMPI_MESH_REDUCTIONS`).

use super::buffers::{copy, move_bytes, seat, Scratch};
use super::group::Group;
use super::ordered;
use super::seat::{Seat, Span};
use crate::{Backend, BufMut, Error, Input, ReduceOp, Result};

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

impl Reductions {
    pub fn name(self) -> &'static str {
        match self {
            Reductions::Fast => "fast",
            Reductions::Ordered => "ordered",
        }
    }
}

/// The choice of `JAXMPI_MESH_REDUCTIONS`, read once: at import (Python asks here right
/// after the ranks compared it), else at the first reduction among devices.
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
    // `first` last, as `fold` starts from the last; the others in slot order before it.
    let n = seats.len();
    let slot = |i: usize| match i {
        _ if i == n - 1 => first,
        _ if i < first => i,
        _ => i + 1,
    };
    ordered::fold(backend, n, |i| seats[slot(i)].args[k], into, op)
}

pub fn all_reduce(
    group: &Group,
    backend: &dyn Backend,
    seats: &[Seat],
    op: ReduceOp,
) -> Result<()> {
    if reductions()? == Reductions::Ordered {
        return ordered::all_reduce(group, backend, seats, op);
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
            backend.allreduce(group.comm()?, send, unsafe { y.buf_mut() }, op)?;
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
                Seat::of_buffers(seats[s].key, seats[s].args.clone(), vec![ret])
            })
            .collect();
        return ordered::all_reduce(group, backend, &seats, op);
    }
    if seats.len() > 1 || !group.spans_processes() {
        combine(backend, seats, 0, first, &into, op)?;
    }
    if !group.spans_processes() {
        return Ok(());
    }
    let comm = group.comm()?;
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
    backend: &dyn Backend,
    seats: &[Seat],
    outer: &[usize],
    op: ReduceOp,
) -> Result<()> {
    let n = group.size();
    for (k, &outer) in outer.iter().enumerate() {
        let (x, y) = (seats[0].args[k], seats[0].rets[k]);
        if reductions()? == Reductions::Ordered {
            ordered::reduce_scatter(group, backend, seats, k, outer, op)?;
            continue;
        }
        if group.aligned() && outer == 1 && group.spans_processes() {
            // SAFETY: live buffers of this device's call.
            let (send, recv) = unsafe { (x.buf(), y.buf_mut()) };
            backend.reduce_scatter(group.comm()?, send, recv, op)?;
            continue;
        }
        let inner = y.bytes() / outer.max(1);
        let packs = group.spans_processes() && group.even();
        // A device alone in its process packs from its own operand; otherwise the
        // process's combination (which the unpacked route below reduces in place).
        let alone = packs && seats.len() == 1;
        let mut whole = Scratch::new(if alone { 0 } else { x.bytes() });
        let total = if alone {
            x
        } else {
            let total = whole.span(0, x.count, x.dtype);
            combine(backend, seats, k, 0, &total, op)?;
            total
        };
        if packs {
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
            backend.reduce_scatter(group.comm()?, send, recv, op)?;
            for (slot, s) in seats.iter().enumerate() {
                let from = mine.ptr + slot * outer * inner;
                move_bytes(from, s.rets[k].ptr, outer * inner);
            }
            continue;
        }
        if group.spans_processes() {
            // SAFETY: `whole` is this call's own.
            let buf = unsafe { total.buf_mut() };
            backend.allreduce(group.comm()?, Input::InPlace, buf, op)?;
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
