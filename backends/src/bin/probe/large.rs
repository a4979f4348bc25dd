//! `--large`: allreduce, bcast and sendrecv of 2^31 + 13 int8 elements, past what an `int`
//! count can say. This exercises the large-count paths: MPI-4 `_c` functions where the
//! library has them, derived datatypes and segmented reductions where it does not.
//!
//! Buffers are 2 GiB each and at most two are alive per rank. Filling and checking every
//! element would dominate the run, so data has a cheap periodic pattern and results are
//! checked at segment boundaries, around 2^31, and at scattered positions.

use jaxmpi_core::{Broadcast, Dtype, Envelope, Input, Peer, ReduceOp};

use crate::array::{Array, Value};
use crate::report::{Group, Probe};

const COUNT: usize = (1 << 31) + 13;
/// The pattern repeats every 7 elements: 7 divides neither 2^30 (the backend's reduction
/// segment) nor 2^31, so a piece landing at the wrong offset shows.
const PERIOD: usize = 7;

/// Element `i` of rank `rank`'s data: -3..=3, so sums over many ranks fit int8.
fn value(rank: i32, i: usize) -> i8 {
    ((i + 3 * rank as usize) % PERIOD) as i8 - 3
}

/// Fills `array` with `rank`'s data by copying one precomputed stretch over and over.
fn fill(array: &mut Array, rank: i32) {
    let stretch: Vec<u8> = (0..PERIOD << 12).map(|i| value(rank, i) as u8).collect();
    for chunk in array.bytes_mut().chunks_mut(stretch.len()) {
        chunk.copy_from_slice(&stretch[..chunk.len()]);
    }
}

/// Positions where a segmented or chunked transfer could go wrong, plus a spread of others.
fn samples() -> Vec<usize> {
    let mut at = vec![0, 1, COUNT - 1, COUNT - 13, COUNT - 14];
    for edge in [1usize << 30, 1 << 31] {
        at.extend([edge - 1, edge, edge + 1]);
    }
    at.extend((1..64).map(|k| k * (COUNT / 64) + k * 977));
    at
}

fn check_samples(p: &mut Probe, label: &str, got: &Array, expected: impl Fn(usize) -> i8) {
    for i in samples() {
        let want = Value::Int(expected(i).into());
        if got.get(i) != want {
            return p.fail(&format!("{label} [element {i}]"), want, got.get(i));
        }
    }
    p.checks += 1;
}

pub fn run(p: &mut Probe, g: &Group) {
    let b = p.backend;
    let mut send = Array::zeroed(Dtype::I8, COUNT);
    let mut recv = Array::zeroed(Dtype::I8, COUNT);
    fill(&mut send, g.rank);

    let label = format!("large allreduce SUM int8 n={COUNT} on {}", g.name);
    p.start(&label);
    let result = b.allreduce(
        g.comm,
        Input::Data(send.buf()),
        recv.buf_mut(),
        ReduceOp::Sum,
    );
    if p.ok(&label, result).is_some() {
        check_samples(p, &label, &recv, |i| (0..g.size).map(|r| value(r, i)).sum());
    }

    let (left, right) = g.neighbours();
    let label = format!("large sendrecv int8 n={COUNT} on {}", g.name);
    p.start(&label);
    let ring = Envelope {
        comm: g.comm,
        dest: Peer::Rank(right),
        sendtag: 7,
        source: Peer::Rank(left),
        recvtag: Some(7),
    };
    let result = b.sendrecv(Input::Data(send.buf()), recv.buf_mut(), ring);
    if let Some(status) = p.ok(&label, result) {
        p.check(
            &format!("{label}: status (source, count)"),
            (Peer::Rank(left), COUNT),
            (status.source, status.count),
        );
        check_samples(p, &label, &recv, |i| value(left, i));
    }

    // `send` still holds this rank's data: the broadcast must replace it everywhere.
    let root = g.size - 1;
    let label = format!("large bcast int8 n={COUNT} root={root} on {}", g.name);
    p.start(&label);
    let buf = if g.rank == root {
        Broadcast::Root(send.buf())
    } else {
        Broadcast::Receiver(send.buf_mut())
    };
    let result = b.bcast(g.comm, buf, root);
    if p.ok(&label, result).is_some() {
        check_samples(p, &label, &send, |i| value(root, i));
    }
}
