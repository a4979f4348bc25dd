//! What a device brings to a meeting of its group: its buffers (`Span`s), for the
//! collectives that plan every device's messages at once, and the halves of the messages
//! it sends and receives, for ops whose messages only each device can name.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

use crate::{Buf, BufMut, Dtype, Error, ReduceOp, Request, Result};

/// One buffer of a device's call: an operand or a result.
#[derive(Clone, Copy, Debug)]
pub struct Span {
    pub ptr: usize,
    pub count: usize,
    pub dtype: Dtype,
}

impl Span {
    pub fn bytes(&self) -> usize {
        self.count * self.dtype.size()
    }

    /// Whether the two share any byte of memory.
    pub fn overlaps(&self, other: &Span) -> bool {
        self.ptr < other.ptr + other.bytes() && other.ptr < self.ptr + self.bytes()
    }

    /// # Safety
    /// The span must be a live buffer of the call that made it, which is still running.
    pub unsafe fn buf<'a>(&self) -> Buf<'a> {
        // SAFETY: forwarded from the caller.
        unsafe { Buf::from_raw(self.ptr as *const u8, self.count, self.dtype) }
    }

    /// # Safety
    /// As `buf`, and nobody else writes it meanwhile.
    pub unsafe fn buf_mut<'a>(&self) -> BufMut<'a> {
        // SAFETY: forwarded from the caller.
        unsafe { BufMut::from_raw(self.ptr as *mut u8, self.count, self.dtype) }
    }
}

/// One side of a message, as the device at that side sees it: `bytes` at `at` in its
/// memory (read by a send, written by a receive). `tag: None` receives any tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Half {
    pub from: usize,
    pub to: usize,
    pub at: usize,
    pub bytes: usize,
    pub tag: Option<i32>,
}

/// A seat's operands or results. Nearly every call has one of each, kept in place: a call
/// then allocates nothing for its seat (an allocation and its free cost a 1-element psum
/// about a tenth of its time); a variadic all-reduce's several arrays are in a Vec.
#[derive(Clone, Debug)]
pub enum Spans {
    One(Span),
    Many(Vec<Span>),
}

impl Default for Spans {
    fn default() -> Spans {
        Spans::Many(Vec::new())
    }
}

impl Deref for Spans {
    type Target = [Span];
    fn deref(&self) -> &[Span] {
        match self {
            Spans::One(span) => std::slice::from_ref(span),
            Spans::Many(spans) => spans,
        }
    }
}

impl DerefMut for Spans {
    fn deref_mut(&mut self) -> &mut [Span] {
        match self {
            Spans::One(span) => std::slice::from_mut(span),
            Spans::Many(spans) => spans,
        }
    }
}

impl From<Span> for Spans {
    fn from(span: Span) -> Spans {
        Spans::One(span)
    }
}

impl From<Vec<Span>> for Spans {
    fn from(spans: Vec<Span>) -> Spans {
        Spans::Many(spans)
    }
}

/// What a seat's call is: its op (the handler's, or the backend method's on a MeshComm)
/// and what else sets it apart (`detail`: the reduction, the root, the layout, a
/// permute's pairs), besides its buffers' types and lengths, which the seat holds. The
/// members of one meeting must bring the same call (`Group::meet`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallKey {
    pub op: &'static str,
    pub detail: u64,
    /// Each member's operand is as long as its own block of the result (an allgatherv's:
    /// the blocks, which the results list alike, say every member's length).
    pub operand_varies: bool,
}

impl CallKey {
    pub const fn new(op: &'static str, detail: u64) -> CallKey {
        CallKey {
            op,
            detail,
            operand_varies: false,
        }
    }

    /// The key of a v-collective, whose operands differ in length between members.
    pub const fn varying(op: &'static str) -> CallKey {
        CallKey {
            operand_varies: true,
            ..CallKey::new(op, 0)
        }
    }

    /// The key of a reduction by `reduce`, with `more` (a root, a layout) beside it.
    pub fn reducing(op: &'static str, reduce: ReduceOp, more: u64) -> CallKey {
        let code = match reduce {
            ReduceOp::User(handle) => handle as u64,
            predefined => ReduceOp::PREDEFINED
                .iter()
                .position(|p| *p == predefined)
                .unwrap_or(0) as u64,
        };
        CallKey::new(op, code ^ more.rotate_left(32))
    }

    /// This key with `more` (a permute's pairs, say) beside what it has.
    pub fn and(self, more: u64) -> CallKey {
        CallKey {
            detail: self.detail ^ more.rotate_left(16),
            ..self
        }
    }

    /// A key for every point-to-point op of a MeshComm: a send of one device may meet a
    /// receive of another (even ranks send, odd ones receive), as their messages, not
    /// their buffers, say what moves.
    pub const POINT_TO_POINT: CallKey = CallKey::new("point to point", 0);
}

/// What one device brings to a meeting. When the op is started, not completed, the
/// requests its messages left in flight come back in `started`, for its own wait.
#[derive(Clone, Debug, Default)]
pub struct Seat {
    pub key: CallKey,
    pub args: Spans,
    pub rets: Spans,
    pub sends: Vec<Half>,
    pub receives: Vec<Half>,
    pub started: Option<Arc<Mutex<Vec<Request>>>>,
}

impl Seat {
    /// A seat of buffers, for a collective that plans the meeting's messages itself.
    pub fn of_buffers(key: CallKey, args: impl Into<Spans>, rets: impl Into<Spans>) -> Seat {
        Seat {
            key,
            args: args.into(),
            rets: rets.into(),
            ..Seat::default()
        }
    }

    /// A seat of messages, which complete in its meeting.
    pub fn of_messages(key: CallKey, sends: Vec<Half>, receives: Vec<Half>) -> Seat {
        Seat {
            key,
            sends,
            receives,
            ..Seat::default()
        }
    }

    /// Whether `other` is the same call: the same key, buffers of the same types and
    /// lengths (the operands' lengths aside where the key says they vary).
    pub fn same_call(&self, other: &Seat) -> bool {
        let shapes = |a: &[Span], b: &[Span], lengths: bool| {
            a.len() == b.len()
                && a.iter()
                    .zip(b)
                    .all(|(x, y)| x.dtype == y.dtype && (!lengths || x.count == y.count))
        };
        self.key == other.key
            && shapes(&self.args, &other.args, !self.key.operand_varies)
            && shapes(&self.rets, &other.rets, true)
    }

    /// The call as an error names it: `op dtype[count], ... -> dtype[count], ...`.
    pub fn described(&self) -> String {
        let list = |spans: &[Span]| {
            spans
                .iter()
                .map(|s| format!("{}[{}]", s.dtype, s.count))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if self.args.is_empty() && self.rets.is_empty() {
            return self.key.op.to_string();
        }
        format!(
            "{} {} -> {}",
            self.key.op,
            list(&self.args),
            list(&self.rets)
        )
    }
}

/// A copy from a send of this process to its receive.
pub(super) fn deliver(send: &Half, receive: &Half) -> Result<()> {
    fits(send.bytes, receive)?;
    // SAFETY: both are live buffers of this process's calls, as long as they say.
    unsafe { std::ptr::copy(send.at as *const u8, receive.at as *mut u8, send.bytes) };
    Ok(())
}

pub(super) fn fits(bytes: usize, receive: &Half) -> Result<()> {
    if bytes > receive.bytes {
        return Err(Error::invalid_argument(
            "message",
            format!(
                "rank {} sent {bytes} bytes to rank {}, which receives at most {} (the \
                 message would be truncated)",
                receive.from, receive.to, receive.bytes
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seat(key: CallKey, operand: usize, result: usize) -> Seat {
        let span = |count| Span {
            ptr: 0,
            count,
            dtype: Dtype::F32,
        };
        Seat::of_buffers(key, span(operand), span(result))
    }

    #[test]
    fn operands_of_other_lengths_are_the_same_call_only_where_the_key_lets_them_vary() {
        let fixed = CallKey::new("allgather", 0);
        assert!(!seat(fixed, 2, 8).same_call(&seat(fixed, 4, 8)));
        let varying = CallKey::varying("allgatherv");
        assert!(seat(varying, 2, 8).same_call(&seat(varying, 4, 8)));
        // The results (every member's blocks) must still agree, and the key itself.
        assert!(!seat(varying, 2, 8).same_call(&seat(varying, 2, 6)));
        assert!(!seat(varying, 2, 8).same_call(&seat(fixed, 2, 8)));
        assert!(
            varying.and(7).operand_varies,
            "a key's detail keeps what varies"
        );
    }
}
