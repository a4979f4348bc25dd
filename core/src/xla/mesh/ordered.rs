//! Reductions whose every bit is the same in every layout (`JAXMPI_MESH_REDUCTIONS=
//! ordered`): each element is combined by one member, its owner, from every member's
//! operand in rank order, `x0 op (x1 op (... op xn))`, whichever processes the members
//! are in. An all-reduce is a reduce-scatter to the owners of balanced chunks, then an
//! all-gather of the chunks: each member sends and receives about twice its operand,
//! whatever the group's size. Between processes each step is one of MPI's own
//! collectives (`MPI_Alltoallv`, then `MPI_Allgatherv`), each process's devices' parts
//! packed together: a process's plan is O(its members x processes), its messages MPI's.

use super::buffers::{copy, move_bytes, offsets, seat, Scratch};
use super::collectives::share_among_processes;
use super::group::Group;
use super::seat::{Seat, Span};
use crate::{Backend, Dtype, Partition, PartitionMut, ReduceOp, Result};

/// Member q's chunk of `count` elements: (first element, elements).
fn chunk(count: usize, n: usize, q: usize) -> (usize, usize) {
    let (base, extra) = (count / n, count % n);
    (q * base + q.min(extra), base + usize::from(q < extra))
}

/// `into = blocks(0) op (blocks(1) op (... op blocks(n - 1)))`.
pub(super) fn fold(
    backend: &dyn Backend,
    n: usize,
    blocks: impl Fn(usize) -> Span,
    into: &Span,
    op: ReduceOp,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    copy(&blocks(n - 1), into);
    for i in (0..n - 1).rev() {
        // SAFETY: a block of this meeting's scratch, and a live result of its calls.
        unsafe { backend.reduce_local(blocks(i).buf(), into.buf_mut(), op)? };
    }
    Ok(())
}

/// What member j owns of an operand: byte ranges `(offset, bytes)`, back to back in the
/// blocks it receives.
type Parts<'a> = &'a dyn Fn(usize) -> Vec<(usize, usize)>;

/// Every member's parts to their owners: returns the scratch where local owner `slot`
/// finds member i's part at `at(slot, i)`. Between processes one MPI_Alltoallv: to each
/// process, its members' parts of every local operand; from it, the local owners' parts
/// of its members' operands.
struct ToOwners {
    _scratch: Scratch,
    base: usize,
    displs: Vec<usize>,
    before: Vec<usize>,
    lens: Vec<usize>,
}

impl ToOwners {
    fn at(&self, group: &Group, slot: usize, i: usize) -> usize {
        let r = group.rank_of(i) as usize;
        self.base
            + self.displs[r]
            + self.before[slot] * group.held(r)
            + group.place_in_process(i) * self.lens[slot]
    }
}

fn to_owners(
    group: &Group,
    backend: &dyn Backend,
    seats: &[Seat],
    operand: impl Fn(&Seat) -> Span,
    parts: Parts,
) -> Result<ToOwners> {
    let len = |j: usize| parts(j).iter().map(|p| p.1).sum::<usize>();
    let lens: Vec<usize> = group.local.iter().map(|&j| len(j)).collect();
    let before = offsets(&lens);
    let mine: usize = lens.iter().sum();
    let ranks = group.processes().max(1);
    let local = seats.len();
    let sends: Vec<usize> = (0..ranks)
        .map(|r| local * group.positions_of(r).map(len).sum::<usize>())
        .collect();
    let receives: Vec<usize> = (0..ranks).map(|r| mine * group.held(r)).collect();
    let (send_displs, displs) = (offsets(&sends), offsets(&receives));
    let mut packing = Scratch::new(sends.iter().sum());
    let packed = packing.span(0, sends.iter().sum(), Dtype::U8);
    let mut next = packed.ptr;
    for r in 0..ranks {
        for j in group.positions_of(r) {
            for s in seats {
                for (offset, bytes) in parts(j) {
                    move_bytes(operand(s).ptr + offset, next, bytes);
                    next += bytes;
                }
            }
        }
    }
    if !group.spans_processes() {
        // Sent to itself: what it receives is what it packed, in the same order.
        return Ok(ToOwners {
            base: packed.ptr,
            _scratch: packing,
            displs,
            before,
            lens,
        });
    }
    let total = receives.iter().sum();
    let mut scratch = Scratch::new(total);
    let received = scratch.span(0, total, Dtype::U8);
    // SAFETY: scratch of this call.
    let (send, recv) = unsafe { (packed.buf(), received.buf_mut()) };
    backend.alltoallv(
        group.comm()?,
        Partition::new(send, &sends, &send_displs),
        PartitionMut::new(recv, &receives, &displs),
    )?;
    Ok(ToOwners {
        _scratch: scratch,
        base: received.ptr,
        displs,
        before,
        lens,
    })
}

pub fn all_reduce(
    group: &Group,
    backend: &dyn Backend,
    seats: &[Seat],
    op: ReduceOp,
) -> Result<()> {
    let n = group.size();
    for k in 0..seats[0].rets.len() {
        let y = seats[0].rets[k];
        let (count, dtype, size) = (y.count, y.dtype, y.dtype.size());
        let parts = |j: usize| {
            let (start, len) = chunk(count, n, j);
            vec![(start * size, len * size)]
        };
        // Chunk j of every member's operand to member j, which folds them in rank order.
        let owners = to_owners(group, backend, seats, |s| s.args[k], &parts)?;
        for (slot, &j) in group.local.iter().enumerate() {
            let (start, len) = chunk(count, n, j);
            let into = Span {
                ptr: seats[slot].rets[k].ptr + start * size,
                count: len,
                dtype,
            };
            let blocks = |i| Span {
                ptr: owners.at(group, slot, i),
                count: len,
                dtype,
            };
            fold(backend, n, blocks, &into, op)?;
        }
        // Every owner's chunk to every other member (its own is in place).
        let chunk_bytes = |j: usize| chunk(count, n, j).1 * size;
        let at = |j: usize| chunk(count, n, j).0 * size;
        if !group.spans_processes() {
            for s in seats {
                for (from, &j) in seats.iter().zip(&group.local) {
                    move_bytes(
                        from.rets[k].ptr + at(j),
                        s.rets[k].ptr + at(j),
                        chunk_bytes(j),
                    );
                }
            }
            continue;
        }
        let piece = |s: &Seat, j: usize| s.rets[k].ptr + at(j);
        let land = |s: &Seat, j: usize, from: usize| {
            move_bytes(from, s.rets[k].ptr + at(j), chunk_bytes(j))
        };
        share_among_processes(group, backend, seats, chunk_bytes, piece, land)?;
    }
    Ok(())
}

/// Array `k`'s block j of every slice reduced into member j's result.
pub fn reduce_scatter(
    group: &Group,
    backend: &dyn Backend,
    seats: &[Seat],
    k: usize,
    outer: usize,
    op: ReduceOp,
) -> Result<()> {
    let n = group.size();
    let y = seats[0].rets[k];
    let inner = y.bytes() / outer.max(1);
    let parts = |j: usize| (0..outer).map(|o| ((o * n + j) * inner, inner)).collect();
    let owners = to_owners(group, backend, seats, |s| s.args[k], &parts)?;
    for (slot, &j) in group.local.iter().enumerate() {
        let into = seat(group, seats, j).rets[k];
        let blocks = |i| Span {
            ptr: owners.at(group, slot, i),
            ..into
        };
        fold(backend, n, blocks, &into, op)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::chunk;

    #[test]
    fn chunks_cover_every_element_once() {
        for (count, n) in [(10, 4), (3, 4), (0, 2), (8, 8), (1 << 20, 16)] {
            let mut next = 0;
            for q in 0..n {
                let (start, len) = chunk(count, n, q);
                assert_eq!(start, next);
                next += len;
            }
            assert_eq!(next, count);
        }
    }
}
