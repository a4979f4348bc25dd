//! A MeshComm's prefix reductions, `scan` and `exscan`: rank r's result is every operand up
//! to r (inclusive) or before r (exclusive) combined in rank order.
//!
//! With one device per process, in the `fast` mode, they are MPI's own `MPI_Scan` and
//! `MPI_Exscan`. Otherwise the prefix runs along the ranks as a chain: each rank combines
//! the prefix before it with its operand, `(x0 op x1) op x2 ...`, and the rank after it
//! takes the result, a copy inside a process and one message between processes. Each rank
//! receives and sends at most one operand's bytes, whatever the group's size, and the
//! bits are the same in every layout (the `ordered` mode's promise); the price is one
//! message's latency per change of process along the ranks, where MPI's own take about
//! log2 of the processes.

use super::buffers::{copy, seat, Scratch};
use super::group::Group;
use super::reductions::{reductions, Reductions};
use super::seat::{Seat, Span};
use crate::{Backend, Input, Peer, ReduceOp, Result};

/// Which prefix a scan gives rank r.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Prefix {
    /// `x0 op ... op xr`.
    Inclusive,
    /// `x0 op ... op x(r-1)`; rank 0's result is left as it is (the op's body sets it).
    Exclusive,
}

/// The chain's messages travel on the group's collective communicator, where nothing else
/// sends point to point while a collective runs.
const CHAIN_TAG: i32 = 0;

pub fn scan(
    group: &Group,
    backend: &dyn Backend,
    seats: &[Seat],
    op: ReduceOp,
    prefix: Prefix,
) -> Result<()> {
    let (x, y) = (seats[0].args[0], seats[0].rets[0]);
    if group.aligned() && group.spans_processes() && reductions()? == Reductions::Fast {
        let send = if x.ptr == y.ptr {
            Input::InPlace
        } else {
            // SAFETY: this device's live operand.
            Input::Data(unsafe { x.buf() })
        };
        let comm = group.comm()?;
        // SAFETY: this device's live result.
        let recv = unsafe { y.buf_mut() };
        return match prefix {
            Prefix::Inclusive => backend.scan(comm, send, recv, op),
            Prefix::Exclusive => backend.exscan(comm, send, recv, op),
        };
    }
    chain(group, backend, seats, op, prefix)
}

/// The prefix along the ranks, this process's positions in rank order: the prefix before
/// a position comes from the position before it (received where another process holds
/// it), and goes on to the next (sent where another process holds it).
fn chain(
    group: &Group,
    backend: &dyn Backend,
    seats: &[Seat],
    op: ReduceOp,
    prefix: Prefix,
) -> Result<()> {
    let n = group.size();
    let like = seats[0].rets[0];
    let mut scratch = Scratch::new(2 * like.bytes());
    // The prefix before the position at hand, and the one through it (exclusive scans keep
    // both aside, as the result takes the first while the second goes on).
    let mut before = scratch.span(0, like.count, like.dtype);
    let mut through = scratch.span(like.bytes(), like.count, like.dtype);
    // Where the prefix through the previous position is, if that position is local.
    let mut previous: Option<Span> = None;
    for &p in &group.local {
        let s = seat(group, seats, p);
        let (x, y) = (s.args[0], s.rets[0]);
        let prior = match (p, previous) {
            (0, _) => None,
            (_, Some(local)) if group.is_local(p - 1) => Some(local),
            _ => {
                let from = Peer::Rank(group.rank_of(p - 1));
                // SAFETY: scratch of this call.
                let buf = unsafe { before.buf_mut() };
                backend.recv(group.comm()?, buf, from, Some(CHAIN_TAG))?;
                Some(before)
            }
        };
        let done = match prefix {
            Prefix::Inclusive => {
                copy(&x, &y);
                if let Some(prior) = prior {
                    // SAFETY: scratch or a result of this meeting, and this device's result.
                    unsafe { backend.reduce_local(prior.buf(), y.buf_mut(), op)? };
                }
                y
            }
            Prefix::Exclusive => {
                // The prefix through p first: in place, `y` is the operand.
                copy(&x, &through);
                if let Some(prior) = prior {
                    // SAFETY: scratch or a result of this meeting, and scratch.
                    unsafe { backend.reduce_local(prior.buf(), through.buf_mut(), op)? };
                    copy(&prior, &y);
                }
                std::mem::swap(&mut before, &mut through);
                before
            }
        };
        if p + 1 < n && !group.is_local(p + 1) {
            let to = Peer::Rank(group.rank_of(p + 1));
            // SAFETY: this meeting's result or scratch, complete.
            backend.send(group.comm()?, unsafe { done.buf() }, to, CHAIN_TAG)?;
        }
        previous = Some(done);
    }
    Ok(())
}
