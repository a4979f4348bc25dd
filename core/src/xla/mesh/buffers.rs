//! What a meeting's collectives do with its buffers: copies, addresses in a seat's
//! buffers, and scratch memory of the process's own.

use super::group::Group;
use super::seat::{Seat, Span};
use crate::Dtype;

/// Copies `from` to `to` unless they are the same memory.
pub fn copy(from: &Span, to: &Span) {
    if from.ptr != to.ptr && from.bytes() > 0 {
        // SAFETY: both are live buffers of calls now running, `bytes` long.
        unsafe { std::ptr::copy(from.ptr as *const u8, to.ptr as *mut u8, from.bytes()) };
    }
}

/// The seat of local `position` (seats come in the order of `group.local`).
pub fn seat<'s>(group: &Group, seats: &'s [Seat], position: usize) -> &'s Seat {
    &seats[group.slot(position)]
}

/// An address inside a seat's buffer, where that position is local (else 0, never used).
pub fn at(
    group: &Group,
    seats: &[Seat],
    position: usize,
    pick: impl Fn(&Seat) -> Span,
    offset: usize,
) -> usize {
    if group.is_local(position) {
        pick(seat(group, seats, position)).ptr + offset
    } else {
        0
    }
}

/// Memory of this process's own, aligned for any element type.
pub struct Scratch(Vec<u128>);

impl Scratch {
    pub fn new(bytes: usize) -> Scratch {
        Scratch(vec![0; bytes.div_ceil(16)])
    }

    /// The scratch as a buffer of `count` elements of `dtype`, starting `offset` bytes in.
    pub fn span(&mut self, offset: usize, count: usize, dtype: Dtype) -> Span {
        debug_assert!(offset + count * dtype.size() <= self.0.len() * 16);
        Span {
            ptr: self.0.as_mut_ptr() as usize + offset,
            count,
            dtype,
        }
    }
}

/// Where each of blocks of `counts` starts when they lie back to back.
pub fn offsets(counts: &[usize]) -> Vec<usize> {
    counts
        .iter()
        .scan(0, |next, &c| Some(std::mem::replace(next, *next + c)))
        .collect()
}

/// Copies `bytes` between buffers of this meeting's calls or scratch.
pub fn move_bytes(from: usize, to: usize, bytes: usize) {
    if bytes > 0 && from != to {
        // SAFETY: callers name live buffers of the meeting's calls or their scratch.
        unsafe { std::ptr::copy(from as *const u8, to as *mut u8, bytes) };
    }
}
