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

use std::sync::{Arc, Mutex};

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

/// What one device brings to a meeting; when the op is started, not completed, the
/// requests its messages left in flight come back in `started`, for its own wait.
#[derive(Clone, Debug, Default)]
pub struct Part {
    pub sends: Vec<Half>,
    pub receives: Vec<Half>,
    pub started: Option<Arc<Mutex<Vec<Request>>>>,
}

impl Part {
    /// A part that completes in its meeting (`OnDevices::run` marks a started one).
    pub fn new(sends: Vec<Half>, receives: Vec<Half>) -> Part {
        Part {
            sends,
            receives,
            started: None,
        }
    }
}

/// Which communicator the messages of an op travel on, and whether they may cross
/// meetings.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Traffic {
    /// A collective: every message's two halves are in one meeting (or on two processes).
    Collective,
    /// Sends and receives: a message between this process's devices may wait for its
    /// receive in the mailbox, or a started receive for its send.
    PointToPoint,
}

/// Moves the messages of every part of this meeting (this process's devices of `group`,
/// in slot order). Parts that were started leave their messages in flight.
pub fn move_parts(
    group: &Group,
    library: &dyn Library,
    backend: &dyn Backend,
    parts: &[Part],
    traffic: Traffic,
) -> Result<()> {
    let local = |p: usize| group.is_local(p);
    let owner = |position: usize| &parts[group.slot(position)];
    let mut sends: Vec<Half> = parts.iter().flat_map(|p| p.sends.iter().copied()).collect();
    let mut receives: Vec<Half> = parts
        .iter()
        .flat_map(|p| p.receives.iter().copied())
        .collect();
    let key = group as *const Group as usize;

    // Between this process's devices: a copy, from this meeting's send, the mailbox, or
    // into a started receive's buffer.
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
                deliver(&sends[i], receive)?;
            }
            (None, Traffic::Collective) => return Err(unmatched(receive)),
            (None, Traffic::PointToPoint) => {
                if mailbox::take(key, receive)? {
                    continue;
                }
                let Some(started) = &owner(receive.to).started else {
                    return Err(mailbox::nothing_sent(receive));
                };
                let request = mailbox::await_send(key, receive, library, backend)?;
                started
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(request);
            }
        }
    }
    for (i, send) in sends.iter().enumerate() {
        if local(send.to) && !sent_here[i] {
            match traffic {
                Traffic::PointToPoint => mailbox::put(key, send, library, backend)?,
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
    let mut waited = Vec::new();
    let mut outcome = Ok(());
    let halves = receives
        .iter()
        .map(|r| (r, true))
        .chain(sends.iter().map(|s| (s, false)));
    for (half, receive) in halves {
        let device = owner(if receive { half.to } else { half.from });
        match start(group, backend, comm, half, receive) {
            Ok(request) => match &device.started {
                Some(started) => started
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(request),
                None => waited.push(request),
            },
            Err(err) => {
                outcome = Err(err);
                break;
            }
        }
    }
    // Transfers complete before their buffers are handed back, even after an error (a
    // started op's, at its wait).
    for mut request in waited {
        let done = backend.wait(&mut request);
        if outcome.is_ok() {
            outcome = done.map(|_| ());
        }
    }
    outcome
}

/// A copy from a send of this process to its receive.
fn deliver(send: &Half, receive: &Half) -> Result<()> {
    fits(send.bytes, receive)?;
    // SAFETY: both are live buffers of this process's calls, as long as they say.
    unsafe { std::ptr::copy(send.at as *const u8, receive.at as *mut u8, send.bytes) };
    Ok(())
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

/// Messages between devices of this process that cross meetings: a send whose receive
/// comes later waits here, copied (what MPI calls buffering); a started receive whose
/// send comes later waits here for it, and the send copies straight into its buffer and
/// then completes the receive's request: a message of no bytes from this process to
/// itself on a communicator of its own, so the request is one MPI's waits can complete
/// like any other.
mod mailbox {
    use std::collections::{HashMap, VecDeque};
    use std::sync::{Mutex, MutexGuard, OnceLock};

    use super::{deliver, fits, Half};
    use crate::{Backend, Buf, BufMut, Comm, Dtype, Error, Library, Peer, Request, Result};

    /// (group, from, to, tag).
    type Key = (usize, usize, usize, i32);

    #[derive(Default)]
    struct Boxes {
        letters: HashMap<Key, VecDeque<Vec<u8>>>,
        /// Started receives waiting for their send: (group, the receive, its signal tag).
        awaiting: Vec<(usize, Half, i32)>,
        signals: i32,
    }

    fn boxes() -> MutexGuard<'static, Boxes> {
        static BOXES: OnceLock<Mutex<Boxes>> = OnceLock::new();
        BOXES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// A communicator of this process alone, for the signals.
    fn alone(library: &dyn Library) -> Result<Comm> {
        static ALONE: OnceLock<Comm> = OnceLock::new();
        if let Some(&comm) = ALONE.get() {
            return Ok(comm);
        }
        let me = library.comm_rank(library.world())?;
        let comm = library.comm_create_group(&[me], 31_999)?;
        Ok(*ALONE.get_or_init(|| comm))
    }

    fn matches(receive: &Half, group: usize, key: &Key) -> bool {
        key.0 == group
            && (key.1, key.2) == (receive.from, receive.to)
            && receive.tag.is_none_or(|tag| tag == key.3)
    }

    /// A send whose receive is not in its meeting: into a started receive waiting for it,
    /// else into the mailbox.
    pub fn put(
        group: usize,
        send: &Half,
        library: &dyn Library,
        backend: &dyn Backend,
    ) -> Result<()> {
        let key = (group, send.from, send.to, send.tag.unwrap_or(0));
        let mut boxes = boxes();
        if let Some(i) = boxes
            .awaiting
            .iter()
            .position(|(_, r, _)| matches(r, group, &key))
        {
            let (_, receive, signal) = boxes.awaiting.remove(i);
            drop(boxes);
            deliver(send, &receive)?;
            // SAFETY: no bytes are read.
            let nothing = unsafe { Buf::from_raw(std::ptr::null(), 0, Dtype::U8) };
            return backend.send(alone(library)?, nothing, Peer::Rank(0), signal);
        }
        // SAFETY: a live operand of a call of this meeting, `bytes` long.
        let data = unsafe { std::slice::from_raw_parts(send.at as *const u8, send.bytes) };
        boxes
            .letters
            .entry(key)
            .or_default()
            .push_back(data.to_vec());
        Ok(())
    }

    /// A receive from a send that came before, if one did.
    pub fn take(group: usize, receive: &Half) -> Result<bool> {
        let mut boxes = boxes();
        let key = boxes
            .letters
            .iter()
            .filter(|(k, queue)| matches(receive, group, k) && !queue.is_empty())
            .map(|(k, _)| *k)
            .min_by_key(|k| k.3);
        let Some(data) = key.and_then(|k| boxes.letters.get_mut(&k)?.pop_front()) else {
            return Ok(false);
        };
        drop(boxes);
        fits(data.len(), receive)?;
        // SAFETY: a live result of a call of this meeting, at least `data.len()` long.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), receive.at as *mut u8, data.len()) };
        Ok(true)
    }

    /// A started receive whose send comes later: the request its wait completes.
    pub fn await_send(
        group: usize,
        receive: &Half,
        library: &dyn Library,
        backend: &dyn Backend,
    ) -> Result<Request> {
        let comm = alone(library)?;
        let signal = {
            let mut boxes = boxes();
            boxes.signals = (boxes.signals + 1) % 30_000;
            let signal = boxes.signals;
            boxes.awaiting.push((group, *receive, signal));
            signal
        };
        // SAFETY: a message of no bytes: nothing is ever written.
        let nothing =
            unsafe { BufMut::from_raw(std::ptr::NonNull::<u8>::dangling().as_ptr(), 0, Dtype::U8) };
        // SAFETY: as above.
        let mut request = unsafe { backend.irecv(comm, nothing, Peer::Rank(0), Some(signal)) }?;
        request.receives = None; // its status is no message of the op's
        Ok(request)
    }

    pub fn nothing_sent(receive: &Half) -> Error {
        Error::invalid_argument(
            "recv",
            format!(
                "rank {} receives from rank {} of the same process{}, which sent it nothing \
                 before: on a device communicator, a blocking receive from a device of the \
                 same process comes after the send in program order (or start it: irecv)",
                receive.to,
                receive.from,
                receive
                    .tag
                    .map(|t| format!(" (tag {t})"))
                    .unwrap_or_default(),
            ),
        )
    }
}
