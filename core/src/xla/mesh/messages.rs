//! How a meeting's messages move: the halves the seats (`seat.rs`) bring, or the
//! `Piece`s a collective of `collectives.rs` plans from every seat at once. The last
//! device to arrive moves everything the meeting holds:
//!
//! - a message between two devices of this process is a copy, with no MPI;
//! - a message to or from another process is an MPI message on the group's communicator
//!   among processes. Every process lists those in (from, to) order: MPI delivers the
//!   messages between two processes on one communicator and tag in the order they were
//!   sent, so each receive matches its own send, whatever device of a process sent it.
//!
//! Point to point (`Traffic::PointToPoint`), a send and its receive may come in different
//! meetings (a send, then the receive): between devices of this process, the message
//! waits in this process's mailbox (`mailbox.rs`), copied there at the send (what MPI
//! calls buffering).

use super::group::Group;
use super::mailbox;
use super::seat::{deliver, Half, Seat};
use crate::{Backend, Buf, BufMut, Comm, Dtype, Error, Library, Peer, Request, Result};

/// One whole message of a plan: `bytes` from position `from` to position `to`, at `send`
/// in the sender's memory and `recv` in the receiver's (each known, and used, only where
/// that side is local).
#[derive(Clone, Copy, Debug)]
pub struct Piece {
    pub from: usize,
    pub to: usize,
    pub bytes: usize,
    pub send: usize,
    pub recv: usize,
}

/// The pieces of an exchange among every member that this process sends or receives:
/// `piece(i, j, o)` from member i to member j, for each slice o of `outer`. A process
/// lists O(its members x n) pieces, never n x n; the pieces between two members come in
/// slice order on both sides, which is all `exchange` needs to match them.
pub fn touching(
    group: &Group,
    outer: usize,
    piece: impl Fn(usize, usize, usize) -> Piece,
) -> Vec<Piece> {
    let n = group.size();
    let mut pieces = Vec::with_capacity(2 * group.local.len() * n * outer);
    for &i in &group.local {
        for j in 0..n {
            pieces.extend((0..outer).map(|o| piece(i, j, o)));
        }
    }
    for &j in &group.local {
        for i in (0..n).filter(|&i| !group.is_local(i)) {
            pieces.extend((0..outer).map(|o| piece(i, j, o)));
        }
    }
    pieces
}

/// Moves every piece this process sends or receives, as the halves of the local devices'
/// messages. Every process lists the pieces in the same order, so the pieces between the
/// same two devices match in that order.
pub fn exchange(
    group: &Group,
    library: &dyn Library,
    backend: &dyn Backend,
    pieces: &[Piece],
) -> Result<()> {
    let mut seats = vec![Seat::default(); group.local.len()];
    for piece in pieces.iter().filter(|p| p.bytes > 0) {
        let half = |at| Half {
            from: piece.from,
            to: piece.to,
            at,
            bytes: piece.bytes,
            tag: Some(group.tag(piece.from, piece.to)),
        };
        if group.is_local(piece.from) {
            seats[group.slot(piece.from)].sends.push(half(piece.send));
        }
        if group.is_local(piece.to) {
            seats[group.slot(piece.to)].receives.push(half(piece.recv));
        }
    }
    move_messages(group, library, backend, &seats, Traffic::Collective)
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

/// Moves the messages of every seat of this meeting (this process's devices of `group`,
/// in slot order). Seats that were started leave their messages in flight. The messages
/// to and from other processes are posted first, so that an error here (a message too
/// long for its receive between two devices of this process) leaves no other process
/// waiting for a message it kept back.
pub fn move_messages(
    group: &Group,
    library: &dyn Library,
    backend: &dyn Backend,
    seats: &[Seat],
    traffic: Traffic,
) -> Result<()> {
    let sends: Vec<Half> = seats.iter().flat_map(|p| p.sends.iter().copied()).collect();
    let receives: Vec<Half> = seats
        .iter()
        .flat_map(|p| p.receives.iter().copied())
        .collect();
    let (waited, mut outcome) =
        between_processes(group, backend, seats, &sends, &receives, traffic);
    let copied = within_process(group, library, backend, seats, &sends, &receives, traffic);
    if outcome.is_ok() {
        outcome = copied;
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

/// Between this process's devices: a copy, from this meeting's send, the mailbox, or into
/// a started receive's buffer.
fn within_process(
    group: &Group,
    library: &dyn Library,
    backend: &dyn Backend,
    seats: &[Seat],
    sends: &[Half],
    receives: &[Half],
    traffic: Traffic,
) -> Result<()> {
    let local = |p: usize| group.is_local(p);
    let key = group as *const Group as usize;
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
                let Some(started) = &seats[group.slot(receive.to)].started else {
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
    Ok(())
}

/// Between processes: MPI, receives posted first, each list in (from, to) order. Returns
/// the requests to wait for here (a started seat keeps its own), and whether every one
/// was posted.
fn between_processes(
    group: &Group,
    backend: &dyn Backend,
    seats: &[Seat],
    sends: &[Half],
    receives: &[Half],
    traffic: Traffic,
) -> (Vec<Request>, Result<()>) {
    let local = |p: usize| group.is_local(p);
    let mut sends: Vec<&Half> = sends.iter().filter(|s| !local(s.to)).collect();
    let mut receives: Vec<&Half> = receives.iter().filter(|r| !local(r.from)).collect();
    let mut waited = Vec::new();
    if sends.is_empty() && receives.is_empty() {
        return (waited, Ok(()));
    }
    let comm = match traffic {
        Traffic::Collective => group.comm(),
        Traffic::PointToPoint => group.p2p_comm(),
    };
    let comm = match comm {
        Ok(comm) => comm,
        Err(err) => return (waited, Err(err)),
    };
    sends.sort_by_key(|h| (h.from, h.to));
    receives.sort_by_key(|h| (h.from, h.to));
    let halves = receives
        .iter()
        .map(|r| (*r, true))
        .chain(sends.iter().map(|s| (*s, false)));
    for (half, receive) in halves {
        let device = &seats[group.slot(if receive { half.to } else { half.from })];
        match start(group, backend, comm, half, receive) {
            Ok(request) => match &device.started {
                Some(started) => started
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(request),
                None => waited.push(request),
            },
            Err(err) => return (waited, Err(err)),
        }
    }
    (waited, Ok(()))
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
        // writes until it is waited for (in `move_messages`).
        let buf = unsafe { BufMut::from_raw(half.at as *mut u8, half.bytes, Dtype::U8) };
        let source = Peer::Rank(group.rank_of(half.from));
        // SAFETY: as above.
        unsafe { backend.irecv(comm, buf, source, half.tag) }
    } else {
        // SAFETY: a live operand, unchanged until the wait in `move_messages`.
        let buf = unsafe { Buf::from_raw(half.at as *const u8, half.bytes, Dtype::U8) };
        let dest = Peer::Rank(group.rank_of(half.to));
        // SAFETY: as above.
        unsafe { backend.isend(comm, buf, dest, half.tag.unwrap_or(0)) }
    }
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
