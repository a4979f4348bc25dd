//! Moving the messages of one op on a device communicator (`device_ranks.rs`), whose ranks
//! are devices, several of them possibly in one process. Each device describes its part
//! of the op as halves of messages: what it sends to which rank, from where, and what it
//! receives from which rank, into where. The group's devices in this process meet; the
//! last to arrive moves everything the meeting holds:
//!
//! - a message between two devices of this process is a copy, with no MPI;
//! - a message to or from another process is an MPI message on the group's communicator
//!   among processes. Every process lists those in (from, to) order: MPI delivers the
//!   messages between two processes on one communicator and tag in the order they were
//!   sent, so each receive matches its own send, whatever device of a process sent it.
//!
//! Point to point (`Traffic::PointToPoint`), a send and its receive may come in different
//! meetings (a send, then the receive): between devices of this process, the message
//! waits in this process's mailbox, copied there at the send (what MPI calls buffering).

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, OnceLock};

use super::device_groups::Group;
use crate::{Backend, Buf, BufMut, Comm, Dtype, Error, Library, Peer, Request, Result};

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

/// What one device brings to a meeting.
#[derive(Clone, Debug, Default)]
pub struct Part {
    pub sends: Vec<Half>,
    pub receives: Vec<Half>,
}

/// Which communicator the messages of an op travel on, and whether they may cross
/// meetings.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Traffic {
    /// A collective: every message's two halves are in one meeting (or on two processes).
    Collective,
    /// Sends and receives: a message between this process's devices may wait for its
    /// receive in the mailbox.
    PointToPoint,
}

/// Moves the messages of every part of this meeting (this process's devices of `group`).
pub fn move_parts(
    group: &Group,
    library: &dyn Library,
    backend: &dyn Backend,
    parts: &[Part],
    traffic: Traffic,
) -> Result<()> {
    let local = |p: usize| group.is_local(p);
    let mut sends: Vec<Half> = parts.iter().flat_map(|p| p.sends.iter().copied()).collect();
    let mut receives: Vec<Half> = parts
        .iter()
        .flat_map(|p| p.receives.iter().copied())
        .collect();
    let mailbox = Mailbox(group as *const Group as usize);

    // Between this process's devices: a copy, from this meeting's send or the mailbox.
    let mut sent_here = vec![false; sends.len()];
    for receive in receives.iter().filter(|r| local(r.from)) {
        let matching = (0..sends.len()).find(|&i| {
            !sent_here[i] && sends[i].from == receive.from && sends[i].to == receive.to && {
                receive.tag.is_none() || receive.tag == sends[i].tag
            }
        });
        match (matching, traffic) {
            (Some(i), _) => {
                sent_here[i] = true;
                let send = sends[i];
                fits(send.bytes, receive)?;
                // SAFETY: both are live buffers of this meeting's calls, as long as said.
                unsafe { std::ptr::copy(send.at as *const u8, receive.at as *mut u8, send.bytes) };
            }
            (None, Traffic::PointToPoint) => mailbox.take(receive)?,
            (None, Traffic::Collective) => return Err(unmatched(receive)),
        }
    }
    for (i, send) in sends.iter().enumerate() {
        if local(send.to) && !sent_here[i] {
            match traffic {
                Traffic::PointToPoint => mailbox.put(send),
                Traffic::Collective => return Err(unmatched(send)),
            }
        }
    }

    // Between processes: MPI, receives posted first, each list in (from, to) order.
    sends.retain(|s| !local(s.to));
    receives.retain(|r| !local(r.from));
    if sends.is_empty() && receives.is_empty() {
        return Ok(());
    }
    let comm = match traffic {
        Traffic::Collective => group.comm(library)?,
        Traffic::PointToPoint => group.p2p_comm(library)?,
    };
    sends.sort_by_key(|h| (h.from, h.to));
    receives.sort_by_key(|h| (h.from, h.to));
    let mut requests = Vec::new();
    let mut outcome = Ok(());
    for (half, receive) in receives
        .iter()
        .map(|r| (r, true))
        .chain(sends.iter().map(|s| (s, false)))
    {
        match start(group, backend, comm, half, receive) {
            Ok(request) => requests.push(request),
            Err(err) => {
                outcome = Err(err);
                break;
            }
        }
    }
    // Started transfers complete before their buffers are handed back, even after an error.
    for mut request in requests {
        let waited = backend.wait(&mut request);
        if outcome.is_ok() {
            outcome = waited.map(|_| ());
        }
    }
    outcome
}

fn start(
    group: &Group,
    backend: &dyn Backend,
    comm: Comm,
    half: &Half,
    receive: bool,
) -> Result<Request> {
    if receive {
        // SAFETY: a live result of a call of this meeting, which only this receive
        // writes until it is waited for (in `move_parts`).
        let buf = unsafe { BufMut::from_raw(half.at as *mut u8, half.bytes, Dtype::U8) };
        let source = Peer::Rank(group.rank_of(half.from));
        // SAFETY: as above.
        unsafe { backend.irecv(comm, buf, source, half.tag) }
    } else {
        // SAFETY: a live operand, unchanged until the wait in `move_parts`.
        let buf = unsafe { Buf::from_raw(half.at as *const u8, half.bytes, Dtype::U8) };
        let dest = Peer::Rank(group.rank_of(half.to));
        // SAFETY: as above.
        unsafe { backend.isend(comm, buf, dest, half.tag.unwrap_or(0)) }
    }
}

fn fits(bytes: usize, receive: &Half) -> Result<()> {
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

fn unmatched(half: &Half) -> Error {
    Error::unsupported(
        "collective",
        format!(
            "internal error: the message from rank {} to rank {} has no other side",
            half.from, half.to
        ),
    )
}

/// Messages between this process's devices of one group that wait for their receive, by
/// (from, to, tag), in the order they were sent.
struct Mailbox(usize);

type Letters = HashMap<(usize, usize, usize, i32), VecDeque<Vec<u8>>>;

fn letters() -> MutexGuard<'static, Letters> {
    static LETTERS: OnceLock<Mutex<Letters>> = OnceLock::new();
    LETTERS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

impl Mailbox {
    fn put(&self, send: &Half) {
        // SAFETY: a live operand of a call of this meeting, `bytes` long.
        let data = unsafe { std::slice::from_raw_parts(send.at as *const u8, send.bytes) };
        let key = (self.0, send.from, send.to, send.tag.unwrap_or(0));
        letters().entry(key).or_default().push_back(data.to_vec());
    }

    fn take(&self, receive: &Half) -> Result<()> {
        let mut letters = letters();
        let key = letters
            .iter()
            .filter(|(k, queue)| {
                k.0 == self.0
                    && (k.1, k.2) == (receive.from, receive.to)
                    && receive.tag.is_none_or(|tag| tag == k.3)
                    && !queue.is_empty()
            })
            .map(|(k, _)| *k)
            .min_by_key(|k| k.3);
        let Some(data) = key.and_then(|k| letters.get_mut(&k)?.pop_front()) else {
            return Err(Error::invalid_argument(
                "recv",
                format!(
                    "rank {} receives from rank {} of the same process{}, which sent it \
                     nothing before: on a device communicator, a receive from a device of \
                     the same process comes after the send in program order",
                    receive.to,
                    receive.from,
                    receive
                        .tag
                        .map(|t| format!(" (tag {t})"))
                        .unwrap_or_default(),
                ),
            ));
        };
        fits(data.len(), receive)?;
        // SAFETY: a live result of a call of this meeting, at least `data.len()` long.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), receive.at as *mut u8, data.len()) };
        Ok(())
    }
}
