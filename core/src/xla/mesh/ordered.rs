//! Reductions whose every bit is the same in every layout (`JAXMPI_MESH_REDUCTIONS=
//! ordered`): each element is combined by one member, its owner, from every member's
//! operand in rank order, `x0 op (x1 op (... op xn))`, whichever processes the members
//! are in. An all-reduce is a reduce-scatter to the owners of balanced chunks, then an
//! all-gather of the chunks: each member sends and receives about twice its operand,
//! whatever the group's size, in 2 (n - 1) messages.

use super::buffers::{at, copy, seat, Scratch};
use super::group::Group;
use super::messages::{every_pair, exchange, Piece};
use super::seat::{Seat, Span};
use crate::{Backend, Library, ReduceOp, Result};

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

pub fn all_reduce(
    group: &Group,
    library: &dyn Library,
    backend: &dyn Backend,
    seats: &[Seat],
    op: ReduceOp,
) -> Result<()> {
    let n = group.size();
    for k in 0..seats[0].rets.len() {
        let y = seats[0].rets[k];
        let (count, dtype, size) = (y.count, y.dtype, y.dtype.size());
        let width = count.div_ceil(n) * size;
        let mut scratch = Scratch::new(seats.len() * n * width);
        let base = scratch.span(0, 0, dtype).ptr;
        let block = |slot: usize, i: usize| base + (slot * n + i) * width;
        // Chunk j of every member's operand to member j.
        let pieces = every_pair(n, 1, |i, j, _| {
            let (start, len) = chunk(count, n, j);
            Piece {
                from: i,
                to: j,
                bytes: len * size,
                send: at(group, seats, i, |s| s.args[k], start * size),
                recv: match group.is_local(j) {
                    true => block(group.slot(j), i),
                    false => 0,
                },
            }
        });
        exchange(group, library, backend, &pieces)?;
        for &j in &group.local {
            let (start, len) = chunk(count, n, j);
            let into = Span {
                ptr: seat(group, seats, j).rets[k].ptr + start * size,
                count: len,
                dtype,
            };
            let slot = group.slot(j);
            let blocks = |i| Span {
                ptr: block(slot, i),
                count: len,
                dtype,
            };
            fold(backend, n, blocks, &into, op)?;
        }
        // Every owner's chunk to every other member (its own is in place).
        let pieces = every_pair(n, 1, |i, j, _| {
            let (start, len) = chunk(count, n, i);
            Piece {
                from: i,
                to: j,
                bytes: if i == j { 0 } else { len * size },
                send: at(group, seats, i, |s| s.rets[k], start * size),
                recv: at(group, seats, j, |s| s.rets[k], start * size),
            }
        });
        exchange(group, library, backend, &pieces)?;
    }
    Ok(())
}

/// Array `k`'s block j of every slice reduced into member j's result.
pub fn reduce_scatter(
    group: &Group,
    library: &dyn Library,
    backend: &dyn Backend,
    seats: &[Seat],
    k: usize,
    outer: usize,
    op: ReduceOp,
) -> Result<()> {
    let n = group.size();
    let y = seats[0].rets[k];
    let inner = y.bytes() / outer.max(1);
    let mut scratch = Scratch::new(seats.len() * n * y.bytes());
    let base = scratch.span(0, 0, y.dtype).ptr;
    let block = |slot: usize, i: usize| base + (slot * n + i) * y.bytes();
    let pieces = every_pair(n, outer, |i, j, o| Piece {
        from: i,
        to: j,
        bytes: inner,
        send: at(group, seats, i, |s| s.args[k], (o * n + j) * inner),
        recv: match group.is_local(j) {
            true => block(group.slot(j), i) + o * inner,
            false => 0,
        },
    });
    exchange(group, library, backend, &pieces)?;
    for &j in &group.local {
        let slot = group.slot(j);
        let into = seat(group, seats, j).rets[k];
        let blocks = |i| Span {
            ptr: block(slot, i),
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
