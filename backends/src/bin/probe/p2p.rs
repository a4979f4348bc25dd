//! Point to point: send/recv around a ring, sendrecv ring shifts (two buffers, and one
//! replaced in place), MPI_PROC_NULL, and the status each receive reports.

use jaxmpi_core::{Dtype, Envelope, Input, Peer, Status};

use crate::array::Array;
use crate::data::{Data, Pattern};
use crate::report::{Group, Probe};
use crate::{cases, BIG, SOME_DTYPES};

/// Where sendrecv's message arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Landing {
    /// A second buffer (MPI_Sendrecv).
    Apart,
    /// The send buffer itself (MPI_Sendrecv_replace).
    InPlace,
}

/// How the ring's receive names its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Receive {
    /// The left neighbour and its tag, into a buffer of exactly the message's size.
    Exact,
    /// MPI_ANY_SOURCE and MPI_ANY_TAG: the status must still say who sent what.
    Any,
    /// A buffer larger than the message: the status count must be the message's.
    Roomy,
}

/// Tags identify the sender, so a status that reports the wrong tag shows.
fn tag_of(rank: i32) -> i32 {
    100 + rank
}

pub fn full(p: &mut Probe, g: &Group) {
    for (_, dtype, n) in cases(&Dtype::ALL) {
        sendrecv(p, g, dtype, n, Landing::Apart);
    }
    for (_, dtype, n) in cases(&SOME_DTYPES) {
        sendrecv(p, g, dtype, n, Landing::InPlace);
    }
    sendrecv(p, g, Dtype::F32, BIG, Landing::Apart);
    sendrecv(p, g, Dtype::F64, BIG, Landing::InPlace);
    proc_null(p, g);
    // A blocking send to oneself may never complete: rings need a second rank.
    if g.size > 1 {
        for (_, dtype, n) in cases(&SOME_DTYPES) {
            ring(p, g, dtype, n, Receive::Exact);
        }
        ring(p, g, Dtype::C64, 1001, Receive::Any);
        ring(p, g, Dtype::U16, 7, Receive::Roomy);
        // Large enough to leave every library's eager protocol.
        ring(p, g, Dtype::F64, BIG, Receive::Exact);
    }
}

pub fn subset(p: &mut Probe, g: &Group) {
    sendrecv(p, g, Dtype::BF16, 1001, Landing::Apart);
    sendrecv(p, g, Dtype::C128, 1001, Landing::InPlace);
    proc_null(p, g);
    if g.size > 1 {
        ring(p, g, Dtype::I64, 7, Receive::Any);
    }
}

/// Each rank sends to its right neighbour and receives from its left one.
fn ring(p: &mut Probe, g: &Group, dtype: Dtype, n: usize, how: Receive) {
    let label = format!("send/recv ring {dtype} n={n} {how:?} on {}", g.name);
    p.start(&label);
    let data = Data::new(&label, dtype, Pattern::Wide, g.size);
    let (left, right) = g.neighbours();
    let send = data.of_rank(g.rank, n);
    let room = if how == Receive::Roomy { n + 5 } else { n };
    let mut recv = Array::zeroed(dtype, room);
    let mut expected = recv.clone();
    for i in 0..n {
        expected.set(i, data.value(left, i));
    }
    let (source, tag) = match how {
        Receive::Any => (Peer::Any, None),
        _ => (Peer::Rank(left), Some(tag_of(left))),
    };
    let b = p.backend;
    // Even ranks send first and odd ranks receive first: every send meets a posted
    // receive, for rings of any size and messages too large to be sent eagerly.
    let (sent, received) = if g.rank % 2 == 0 {
        let sent = b.send(g.comm, send.buf(), Peer::Rank(right), tag_of(g.rank));
        (sent, b.recv(g.comm, recv.buf_mut(), source, tag))
    } else {
        let received = b.recv(g.comm, recv.buf_mut(), source, tag);
        (
            b.send(g.comm, send.buf(), Peer::Rank(right), tag_of(g.rank)),
            received,
        )
    };
    p.ok(&format!("{label}: send"), sent);
    if let Some(status) = p.ok(&format!("{label}: recv"), received) {
        check_status(p, &label, status, Peer::Rank(left), Some(tag_of(left)), n);
        p.data(&label, &expected, &recv);
    }
}

/// A ring shift in one call: to the right, from the left (oneself on a single rank).
fn sendrecv(p: &mut Probe, g: &Group, dtype: Dtype, n: usize, into: Landing) {
    let label = format!("sendrecv {dtype} n={n} {into:?} on {}", g.name);
    p.start(&label);
    let data = Data::new(&label, dtype, Pattern::Wide, g.size);
    let (left, right) = g.neighbours();
    let mut send = data.of_rank(g.rank, n);
    let mut recv = Array::zeroed(dtype, n);
    let expected = data.of_rank(left, n);
    let tag = Some(tag_of(left));
    let b = p.backend;
    let shift = Envelope {
        comm: g.comm,
        dest: Peer::Rank(right),
        sendtag: tag_of(g.rank),
        source: Peer::Rank(left),
        recvtag: tag,
    };
    let result = match into {
        Landing::Apart => b.sendrecv(Input::Data(send.buf()), recv.buf_mut(), shift),
        Landing::InPlace => {
            let result = b.sendrecv(Input::InPlace, send.buf_mut(), shift);
            recv = send;
            result
        }
    };
    if let Some(status) = p.ok(&label, result) {
        check_status(p, &label, status, Peer::Rank(left), tag, n);
        p.data(&label, &expected, &recv);
    }
}

/// Transfers with MPI_PROC_NULL complete at once, move nothing, and say so in the status.
fn proc_null(p: &mut Probe, g: &Group) {
    let label = format!("PROC_NULL on {}", g.name);
    p.start(&label);
    let data = Data::new(&label, Dtype::I32, Pattern::Wide, g.size);
    let send = data.of_rank(g.rank, 7);
    let b = p.backend;
    p.ok(
        &format!("send to {label}"),
        b.send(g.comm, send.buf(), Peer::Null, 5),
    );
    // Data no rank sends: a receive that wrote anything shows.
    let mut recv = data.of_rank(g.size, 7);
    let untouched = recv.clone();
    let received = b.recv(g.comm, recv.buf_mut(), Peer::Null, Some(5));
    if let Some(status) = p.ok(&format!("recv from {label}"), received) {
        check_status(
            p,
            &format!("recv from {label}"),
            status,
            Peer::Null,
            None,
            0,
        );
        p.data(&format!("recv from {label}"), &untouched, &recv);
    }
    let nowhere = Envelope {
        comm: g.comm,
        dest: Peer::Null,
        sendtag: 5,
        source: Peer::Null,
        recvtag: None,
    };
    let result = b.sendrecv(Input::Data(send.buf()), recv.buf_mut(), nowhere);
    if let Some(status) = p.ok(&format!("sendrecv with {label}"), result) {
        check_status(p, &format!("sendrecv {label}"), status, Peer::Null, None, 0);
    }
    let mut kept = send.clone();
    let result = b.sendrecv(Input::InPlace, kept.buf_mut(), nowhere);
    if let Some(status) = p.ok(&format!("sendrecv_replace with {label}"), result) {
        let what = format!("sendrecv_replace {label}");
        check_status(p, &what, status, Peer::Null, None, 0);
        p.data(&what, &send, &kept);
    }
}

fn check_status(
    p: &mut Probe,
    label: &str,
    status: Status,
    source: Peer,
    tag: Option<i32>,
    count: usize,
) {
    // MPI sets the error field only for multiple-completion calls: it is not checked.
    p.check(
        &format!("{label}: status (source, tag, count)"),
        (source, tag, count),
        (status.source, status.tag, status.count),
    );
}

/// MPI errors that only the library can detect must come back as `Err` on communicators
/// with MPI_ERRORS_RETURN (those the backend created, and world when it initialized MPI),
/// and leave them usable.
pub fn library_errors(p: &mut Probe, g: &Group) {
    let label = format!("on {}", g.name);
    p.start(&format!("library errors {label}"));
    let b = p.backend;
    let bug = &crate::known::INTEL_ABI_ERRORS_RETURN;
    if bug.affects(p.library.info()) {
        return p.known_bug(bug);
    }
    let data = Data::new(&label, Dtype::I16, Pattern::Wide, g.size);
    let send = data.of_rank(g.rank, 7);
    let mut recv = Array::zeroed(Dtype::I16, 7);
    p.refused(
        &format!("send with tag -77 {label}"),
        b.send(g.comm, send.buf(), Peer::Rank(g.rank), -77),
    );
    p.refused(
        &format!("recv with tag -77 {label}"),
        b.recv(g.comm, recv.buf_mut(), Peer::Rank(g.rank), Some(-77)),
    );
    // A 7-element message into a 3-element buffer: MPI_ERR_TRUNCATE at the receiver.
    // Only between two ranks: Open MPI (4.1 and 5.0) misses the truncation when a rank
    // sendrecvs with itself.
    if g.size > 1 {
        let (left, right) = g.neighbours();
        let mut short = Array::zeroed(Dtype::I16, 3);
        let ring = Envelope {
            comm: g.comm,
            dest: Peer::Rank(right),
            sendtag: 9,
            source: Peer::Rank(left),
            recvtag: Some(9),
        };
        let result = b.sendrecv(Input::Data(send.buf()), short.buf_mut(), ring);
        p.refused(&format!("sendrecv into a too small buffer {label}"), result);
    }
    p.ok(&format!("barrier after errors {label}"), b.barrier(g.comm));
}
